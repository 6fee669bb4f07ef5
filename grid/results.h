// Gathering a grid's outcome (`modtrain grid collect`): each point's state and final validation
// losses (top-C routing as trained; causal routing as sampled, for routed models), from its run
// directory's metrics.csv (val_loss and val_loss_causal at the final step) or, when that is
// missing (train.eval_every 0), by evaluating its model.safetensors on the validation split.
// Missing and unfinished points are results too, with their status; nothing here is fatal.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "grid/expand.h"
#include "grid/run_state.h"

namespace mod::grid {

struct PointResult {
  const GridPoint* point = nullptr;
  RunState state;
  std::optional<double> val_loss;         // finished points only; top-C routing for MoD
  std::optional<double> causal_val_loss;  // finished routed points: causal (sampling) routing
  std::string status;  // "finished", "partial", "not started", "skipped" or "failed"
  std::string note;    // the skip reason, what is missing, or where the loss came from
};

// The points of one (budget, shape, variant) over its seeds (one point without extra_seeds):
// what collect ranks and plots. Losses are the mean over the seeds that finished.
struct SeedGroup {
  const GridPoint* point = nullptr;         // the base seed's point: its name, shape and sizes
  std::vector<const PointResult*> results;  // every point of the group, in seed order
  std::vector<double> losses, causal_losses;  // of the finished points, in seed order
  double mean() const;                       // of losses (top-C); needs one
  double min() const, max() const;
  std::optional<double> causal_mean() const;  // of causal_losses, when every finished point has one
};
// Groups with at least one finished point, in spec order.
std::vector<SeedGroup> group_by_seed(const std::vector<PointResult>& results);

// runs_dir/<point name> is each point's run directory. eval_batches: validation batches when a
// finished point's loss must be computed (0: the point's train.eval_batches).
std::vector<PointResult> collect_results(const std::vector<GridPoint>& points,
                                         const std::string& runs_dir, int eval_batches);

// point,budget,shape,variant,seed,routed,parameters,non_embedding_parameters,forward_flops_per_token,
// training_flops_per_token,steps,tokens,flops,final_val_loss,final_val_loss_causal,status,
// train_seconds,note
void write_results_csv(const std::string& path, const std::vector<PointResult>& results);

// A text field for a CSV cell: quoted when it holds a comma, quote or newline.
std::string csv_field(const std::string& s);

}  // namespace mod::grid
