// The Slurm job-array script of a grid (`modtrain grid submit`): one array task per runnable
// point, in array_index order. Self-contained: every path in it is absolute, the point names and
// step counts are written into it, and a task whose run directory already holds
// model.safetensors at the point's final step exits 0 at once, so the same script can be
// submitted again to finish whatever is left. Each task runs
//   srun modtrain train --config OUT/points/NAME.textproto --run-dir OUT/runs/NAME --resume auto
// SIGUSR1 arrives slurm.signal_lead_s before the time limit; the trainer checkpoints and exits
// 75, and the task requeues itself (scontrol requeue) to continue in a fresh allocation. That
// protocol is not retyped here: the script sources OUT/modtrain_job.sh, a copy of
// cluster/modtrain_job.sh (job_protocol_script()) that `grid submit` writes beside it.
#pragma once

#include <string>
#include <vector>

#include "configs/grid.pb.h"
#include "grid/expand.h"

namespace mod::grid {

struct SbatchPaths {
  std::string out_dir;   // absolute: points/, runs/, logs/ live here
  std::string work_dir;  // absolute: the directory tasks cd into (relative data.dir resolves here)
  std::string modtrain;  // absolute path of the program on the compute nodes
  std::string spec;      // the spec file, for the script's comment
};

// points: the runnable points (array_index 0..n-1 in order). Throws when there are none.
std::string sbatch_script(const modtrain::GridSpec& spec, const std::vector<const GridPoint*>& points,
                          const SbatchPaths& paths);

// The text of cluster/modtrain_job.sh as built into this program, for OUT/<kJobProtocolFile>.
const char* job_protocol_script();
inline constexpr const char* kJobProtocolFile = "modtrain_job.sh";

// The --array value: "0-7" or "0-7%4" with slurm.max_concurrent = 4.
std::string array_range(int points, int max_concurrent);

}  // namespace mod::grid
