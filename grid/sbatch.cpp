// The job-array script (see sbatch.h).
#include "grid/sbatch.h"

#include <sstream>
#include <stdexcept>

namespace mod::grid {

namespace {
// 'text' for the shell: safe for any path.
std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
}  // namespace

std::string array_range(int points, int max_concurrent) {
  std::string r = "0-";  // appends: GCC 12 warns falsely (-Wrestrict) on "0-" + to_string(...)
  r += std::to_string(points - 1);
  if (max_concurrent > 0) {
    r += '%';
    r += std::to_string(max_concurrent);
  }
  return r;
}

std::string sbatch_script(const modtrain::GridSpec& spec, const std::vector<const GridPoint*>& points,
                          const SbatchPaths& paths) {
  if (points.empty()) throw std::invalid_argument("grid " + spec.name() + ": no runnable points to submit");
  const auto& s = spec.slurm();
  std::ostringstream o;
  o << "#!/bin/bash\n"
    << "# isoFLOP grid \"" << spec.name() << "\": " << points.size()
    << " points, one Slurm array task each (task i trains points[i] below).\n"
    << "# Written by `modtrain grid submit --spec " << paths.spec << "`. Submitting it again\n"
    << "# finishes what is left: finished points exit at once, partial ones resume from their\n"
    << "# latest checkpoint. SIGUSR1 " << s.signal_lead_s()
    << " s before the time limit makes the trainer checkpoint and exit 75;\n"
    << "# the task then requeues itself.\n";
  auto opt = [&](const std::string& line) { o << "#SBATCH " << line << "\n"; };
  opt("--job-name=grid-" + spec.name());
  opt("--array=" + array_range(static_cast<int>(points.size()), s.max_concurrent()));
  opt("--nodes=" + std::to_string(s.nodes()));
  opt("--ntasks=" + std::to_string(s.ntasks()));
  opt("--cpus-per-task=" + std::to_string(s.cpus_per_task()));
  if (s.gpus_per_task() > 0) opt("--gpus-per-task=" + std::to_string(s.gpus_per_task()));
  opt("--time=" + s.time_limit());
  if (!s.partition().empty()) opt("--partition=" + s.partition());
  if (!s.account().empty()) opt("--account=" + s.account());
  if (!s.qos().empty()) opt("--qos=" + s.qos());
  if (!s.mem().empty()) opt("--mem=" + s.mem());
  opt("--requeue");
  opt("--open-mode=append");
  opt("--signal=USR1@" + std::to_string(s.signal_lead_s()));
  opt("--output=" + paths.out_dir + "/logs/task_%a.out");
  opt("--error=" + paths.out_dir + "/logs/task_%a.err");
  for (const auto& extra : s.extra_sbatch()) opt(extra);

  o << "\nset -uo pipefail\n"
    << "cd " << sh_quote(paths.work_dir) << " || exit 1\n"
    << "out=" << sh_quote(paths.out_dir) << "\n"
    << "modtrain=" << sh_quote(paths.modtrain) << "\n"
    << "points=(";
  for (size_t i = 0; i < points.size(); ++i) o << (i % 4 == 0 ? "\n  " : " ") << points[i]->name;
  o << "\n)\nsteps=(";
  for (size_t i = 0; i < points.size(); ++i) o << (i % 8 == 0 ? "\n  " : " ") << points[i]->steps;
  o << "\n)\n"
    << "i=${SLURM_ARRAY_TASK_ID:?run this script with sbatch: it is a job array}\n"
    << "name=${points[$i]}\n"
    << "run=\"$out/runs/$name\"\n"
    << "echo \"grid " << spec.name()
    << ": task $i = point $name (${steps[$i]} steps) on $(hostname) at $(date -Is)\"\n"
    << "\n"
    << "# The step in the JSON header of a modtrain weights file (8-byte little-endian length first).\n"
    << "weights_step() {\n"
    << "  [ -f \"$1\" ] || return 0\n"
    << "  local len\n"
    << "  len=$(od -An -t u8 -N 8 \"$1\" | tr -d ' ')\n"
    << "  head -c $((8 + len)) \"$1\" | tail -c \"$len\" | grep -ao '\"step\":\"[0-9]*\"' | tr -dc 0-9\n"
    << "}\n"
    << "if [ \"$(weights_step \"$run/model.safetensors\")\" = \"${steps[$i]}\" ]; then\n"
    << "  echo \"point $name is finished ($run/model.safetensors at step ${steps[$i]}): nothing to do\"\n"
    << "  exit 0\n"
    << "fi\n"
    << "if [ \"$(cat \"$run/checkpoints/latest\" 2> /dev/null)\" = \"$(printf 'step_%08d' \"${steps[$i]}\")\" ]; then\n"
    << "  echo \"point $name has its final checkpoint but no model.safetensors: exporting it\"\n"
    << "  exec \"$modtrain\" export --checkpoint \"$run\" --format safetensors --out \"$run/model.safetensors\"\n"
    << "fi\n";
  if (s.setup_size() > 0) {
    o << "\n";
    for (const auto& line : s.setup()) o << line << "\n";
  }
  // The trainer stops gracefully on USR1 or TERM (checkpoint, exit 75). This shell survives
  // both and passes a USR1 that reaches it (--signal=B:..., scancel --batch) on to the step.
  o << "\nexport OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}\n"
    << "trap 'echo \"got USR1: passing it to the training step\"; [ -n \"${step:-}\" ] && kill -USR1 \"$step\" 2> /dev/null' USR1\n"
    << "trap 'echo \"got TERM: the training step checkpoints and stops\"' TERM\n"
    << "srun" << (s.srun_args().empty() ? "" : " " + s.srun_args())
    << " \"$modtrain\" train --config \"$out/points/$name.textproto\" --run-dir \"$run\" --resume auto &\n"
    << R"(step=$!
while :; do  # a trap interrupts `wait` with a status > 128: wait on while the step runs
  rc=0
  wait "$step" || rc=$?
  [ "$rc" -gt 128 ] || break
  kill -0 "$step" 2> /dev/null && continue
  again=0
  wait "$step" 2> /dev/null || again=$?
  [ "$again" -ne 127 ] && rc=$again
  break
done
trap - USR1 TERM
if [ "$rc" -eq 75 ]; then
  # Stopped after a checkpoint. Requeue while still RUNNING (USR1 before the time limit, a
  # manual signal, preemption with grace time); a job Slurm requeued, cancelled or timed out
  # is left alone: submit this script again to resume it.
  state=$(scontrol show job "$SLURM_JOB_ID" 2> /dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p' | head -n 1)
  if [ "$state" = RUNNING ] && scontrol requeue "$SLURM_JOB_ID"; then
    echo "point $name stopped after a checkpoint (exit 75): task $i requeued"
    exit 0
  fi
  echo "point $name stopped after a checkpoint (exit 75); job state ${state:-unknown}: not requeued"
fi
exit "$rc"
)";
  return o.str();
}

}  // namespace mod::grid
