// Result gathering (see results.h).
#include "grid/results.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <tuple>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/util/atomic_file.h"
#include "train/inference.h"

namespace mod::grid {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c == '\n' ? ' ' : c);
  return out + "\"";
}

double SeedGroup::mean() const {
  return std::accumulate(losses.begin(), losses.end(), 0.0) / static_cast<double>(losses.size());
}
double SeedGroup::min() const { return *std::min_element(losses.begin(), losses.end()); }
double SeedGroup::max() const { return *std::max_element(losses.begin(), losses.end()); }
std::optional<double> SeedGroup::causal_mean() const {
  if (causal_losses.empty() || causal_losses.size() != losses.size()) return std::nullopt;
  return std::accumulate(causal_losses.begin(), causal_losses.end(), 0.0) /
         static_cast<double>(causal_losses.size());
}

std::vector<SeedGroup> group_by_seed(const std::vector<PointResult>& results) {
  std::map<std::tuple<int, int, int>, SeedGroup> groups;  // (budget, shape, variant): spec order
  for (const auto& r : results) {
    const GridPoint& p = *r.point;
    SeedGroup& g = groups[{p.budget_index, p.shape_index, p.variant_index}];
    if (!g.point) g.point = &p;
    g.results.push_back(&r);
    if (!r.val_loss) continue;
    g.losses.push_back(*r.val_loss);
    if (r.causal_val_loss) g.causal_losses.push_back(*r.causal_val_loss);
  }
  std::vector<SeedGroup> out;
  for (auto& [key, g] : groups)
    if (!g.losses.empty()) out.push_back(std::move(g));
  return out;
}

std::vector<PointResult> collect_results(const std::vector<GridPoint>& points,
                                         const std::string& runs_dir, int eval_batches) {
  std::vector<PointResult> out;
  for (const GridPoint& p : points) {
    PointResult r;
    r.point = &p;
    if (p.skipped()) {
      r.status = "skipped";
      r.note = p.skip_reason;
      out.push_back(std::move(r));
      continue;
    }
    const std::string dir = runs_dir + "/" + p.name;
    r.state = inspect_run(dir, p.steps, p.tokens_per_step);
    r.status = status_name(r.state.status);
    if (r.state.status == RunStatus::Finished) {
      if (r.state.final_val_loss) {
        r.val_loss = r.state.final_val_loss;
        r.causal_val_loss = r.state.final_val_loss_causal;
        r.note = "val_loss of metrics.csv at step " + std::to_string(p.steps);
      } else {
        try {
          const auto e = train::evaluate_weights(dir + "/model.safetensors", "", eval_batches, 0);
          r.val_loss = e.top_c_loss;
          r.causal_val_loss = e.causal_loss;
          r.note = "evaluated model.safetensors (metrics.csv has no val_loss at the final step)";
        } catch (const std::exception& e) {
          r.status = "failed";
          r.note = std::string("cannot evaluate model.safetensors: ") + e.what();
        }
      }
    } else if (r.state.status == RunStatus::Partial) {
      r.note = r.state.details();
    } else {
      r.note = "no run in " + dir;
    }
    out.push_back(std::move(r));
  }
  return out;
}

void write_results_csv(const std::string& path, const std::vector<PointResult>& results) {
  std::ostringstream f;
  f << "point,budget,shape,variant,seed,routed,parameters,non_embedding_parameters,"
       "forward_flops_per_token,training_flops_per_token,steps,tokens,flops,final_val_loss,"
       "final_val_loss_causal,status,train_seconds,note\n";
  char buf[512];
  for (const auto& r : results) {
    const GridPoint& p = *r.point;
    std::snprintf(buf, sizeof buf, "%s,%s,%s,%s,%llu,%d,%lld,%lld,%.6g,%.6g,%lld,%lld,%.6g,",
                  p.name.c_str(), p.budget_label.c_str(), p.shape.c_str(), p.variant.c_str(),
                  static_cast<unsigned long long>(p.seed), p.routed ? 1 : 0, static_cast<long long>(p.flops.parameters),
                  static_cast<long long>(p.flops.non_embedding_parameters),
                  p.flops.forward_per_token, p.flops.training_per_token,
                  static_cast<long long>(p.steps), static_cast<long long>(p.tokens()),
                  p.flops_spent);
    f << buf;
    for (const auto& loss : {r.val_loss, r.causal_val_loss}) {
      if (loss) {
        std::snprintf(buf, sizeof buf, "%.6f", *loss);
        f << buf;
      }
      f << ",";
    }
    std::snprintf(buf, sizeof buf, "%s,%.1f,", csv_field(r.status).c_str(), r.state.train_seconds);
    f << buf << csv_field(r.note) << "\n";
  }
  util::replace_file(path, f.str());
}

}  // namespace mod::grid
