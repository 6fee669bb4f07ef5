#!/usr/bin/env bash
# The sbatch scripts of cluster/ against a real Slurm: a one-node cluster on localhost started
# by scripts/slurm_test_cluster.sh (and always stopped on the way out). Scenarios:
#   jobs     train_single_node.sbatch with 1 rank and with 2 ranks (srun), train_multi_node.sbatch
#            with 2 ranks under mpirun, and modtrain started in a 2-task batch script without srun
#            (a world of one): each job COMPLETED, metrics.csv and model.safetensors written,
#            the loss fell;
#   requeue  a job stopped by `scancel --signal=USR1` checkpoints, exits 75, requeues itself and
#            resumes, and ends byte-identical to an uninterrupted run without Slurm; a 2-rank job
#            stopped through its batch shell (`scancel --batch`) does the same;
#   preempt  a 2-rank job preempted by a job of a higher partition, with grace time (it
#            requeues itself) and without (Slurm requeues it), resumes and finishes;
#   grid     tests/grid/tiny_grid.textproto (its smaller budget) as a job array: `modtrain grid
#            submit`, every array task COMPLETED (its step run by mod_run_step of the
#            modtrain_job.sh copy beside grid.sbatch), `modtrain grid collect` writes results.csv.
# Exits 77 (skip) only when the cluster cannot start: Slurm or munge missing, or daemons that
# fail; the reason and the daemons' logs are printed. Uses only installed binaries.
# Usage: slurm_test.sh MODTRAIN SOURCE_DIR {jobs|requeue|preempt|grid}
set -euo pipefail
modtrain=$(realpath "$1")
src=$(realpath "$2")
scenario=$3
work=$(mktemp -d)
chmod 755 "$work"
cluster=$src/scripts/slurm_test_cluster.sh
# A cluster of our own, apart from one started by hand with the defaults.
export MOD_SLURM_DIR=/tmp/modtrain-slurm-ctest MOD_SLURM_PORT=26837
cleanup() {
  "$cluster" stop > /dev/null 2>&1 || true
  [ -n "${MOD_SLURM_TEST_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
t0=$SECONDS
note() { echo "slurm_test[$scenario] +$((SECONDS - t0))s: $*"; }
fail() {  # the message, then the daemons' last words
  echo "slurm_test[$scenario]: FAIL: $*" >&2
  local f
  for f in "$MOD_SLURM_DIR"/log/slurmctld.log "$MOD_SLURM_DIR"/log/slurmd.log; do
    [ -f "$f" ] && { echo "--- last lines of $f" >&2; tail -n 15 "$f" >&2; }
  done
  exit 1
}

if ! out=$("$cluster" start 2>&1); then
  echo "$out"
  echo "slurm_test[$scenario]: SKIP: the Slurm test cluster did not start (see above)"
  exit 77
fi
eval "$("$cluster" env)"  # SLURM_CONF for sbatch, scontrol, ...
note "cluster up"

# Jobs run as root here; modtrain is started from the source tree's cluster/ scripts.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MOD_COLLECTIVE_TIMEOUT_S=60
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo  # loopback only
export MOD_REPO=$src MOD_MODTRAIN=$modtrain MOD_CONFIG=$src/configs/recipes/tiny_mod.textproto
unset MOD_TP MOD_LAUNCHER MOD_RUN_DIR
mkdir -p "$work/logs"
cat "$src"/core/*.cpp "$src"/core/*.h "$src"/docs/*.md > "$work/corpus.txt"
"$modtrain" prep --input "$work/corpus.txt" --out "$work/data" --val-fraction 0.1 > /dev/null
small=(--data "$work/data" --set model.d_model=64 --set model.n_heads=2 --set model.d_ff=128
  --set model.n_layers=2 --set model.seq_len=64 --set optimizer.warmup_steps=5)
# The test node: partition `test`, no GPUs, one core per rank; --time well above the USR1 lead.
node=(--partition=test --gpus-per-node=0 --cpus-per-task=1 --time=30 --chdir="$work")

submit() {  # submit SBATCH_OPTIONS... -- SCRIPT ARGS...: prints the job id
  local opts=()
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  sbatch --parsable "${node[@]}" "${opts[@]}" "$@" | cut -d';' -f1
}
job_field() { scontrol show job "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
wait_done() {  # wait_done JOB SECONDS: waits for a final state (not a requeue) and prints it
  local deadline=$((SECONDS + $2)) state=""
  while [ $SECONDS -lt "$deadline" ]; do
    state=$(job_field "$1" JobState)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
        echo "$state"
        return 0
        ;;
    esac
    sleep 0.3
  done
  echo "still ${state:-unknown} after $2 s"
}
log_of() { echo "$work/logs/$1-$2.out"; }  # log_of JOB_NAME JOB_ID
expect_completed() {  # expect_completed NAME JOB SECONDS
  local state
  state=$(wait_done "$2" "$3")
  [ "$state" = COMPLETED ] \
    || fail "$1 (job $2): $state, expected COMPLETED: $(tail -n 30 "$(log_of "$1" "$2")")"
}
expect_learned() {  # expect_learned NAME RUN_DIR STEPS
  [ -s "$2/model.safetensors" ] || fail "$1: no model.safetensors in $2"
  local rows first last
  rows=$(($(wc -l < "$2/metrics.csv") - 1))
  [ "$rows" -eq "$3" ] || fail "$1: metrics.csv has $rows rows, expected $3"
  first=$(awk -F, 'NR==2 {print $2}' "$2/metrics.csv")
  last=$(awk -F, 'END {print $2}' "$2/metrics.csv")
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || fail "$1: loss $first -> $last"
}
# Polls until metrics.csv of RUN_DIR has more than ROWS rows (the run is well under way).
wait_rows() {  # wait_rows RUN_DIR ROWS SECONDS
  local deadline=$((SECONDS + $3))
  until [ -f "$1/metrics.csv" ] && [ "$(wc -l < "$1/metrics.csv")" -gt "$2" ]; do
    [ $SECONDS -lt "$deadline" ] || fail "$1: fewer than $2 steps after $3 s"
    sleep 0.1
  done
}

scenario_jobs() {
  local steps=30 one two mpi direct
  local short=("${small[@]}" --set "train.steps=$steps" --set train.eval_every=15
    --set optimizer.lr=3e-3)
  # All four at once; Slurm runs them as the two cores allow.
  one=$(MOD_RUN_DIR=$work/one submit --job-name=one --ntasks-per-node=1 \
    -- "$src/cluster/train_single_node.sbatch" "${short[@]}")
  two=$(MOD_RUN_DIR=$work/two MOD_TP=1 submit --job-name=two --ntasks-per-node=2 \
    -- "$src/cluster/train_single_node.sbatch" "${short[@]}")
  mpi=$(MOD_RUN_DIR=$work/mpi MOD_TP=2 MOD_LAUNCHER=mpirun submit --job-name=mpi --nodes=1 \
    --ntasks-per-node=2 -- "$src/cluster/train_multi_node.sbatch" "${short[@]}")
  # modtrain in a batch script of 2 tasks, without srun: one process, not rank 0 of 2.
  direct=$(submit --job-name=direct --ntasks=2 --output="$work/logs/direct-%j.out" \
    -- --wrap "$(printf '%q ' "$modtrain" train --config "$MOD_CONFIG" --run-dir "$work/direct" \
      "${short[@]}")")
  note "submitted jobs $one (1 rank), $two (2 ranks, srun), $mpi (2 ranks, mpirun)," \
    "$direct (no srun)"

  expect_completed one "$one" 60
  expect_learned "1 rank" "$work/one" $steps
  expect_completed two "$two" 60
  expect_learned "2 ranks under srun" "$work/two" $steps
  grep -q "2 processes (Slurm) = dp 2 x tp 1" "$(log_of two "$two")" \
    || fail "2 ranks under srun: no 'dp 2 x tp 1' layout line: $(tail -n 30 "$(log_of two "$two")")"
  expect_completed mpi "$mpi" 60
  expect_learned "2 ranks under mpirun" "$work/mpi" $steps
  grep -q "2 processes (Open MPI) = dp 1 x tp 2" "$(log_of mpi "$mpi")" \
    || fail "2 ranks under mpirun: no 'dp 1 x tp 2' line: $(tail -n 30 "$(log_of mpi "$mpi")")"
  expect_completed direct "$direct" 60
  expect_learned "no srun" "$work/direct" $steps
  if grep -q "parallel:" "$(log_of direct "$direct")"; then
    fail "modtrain started without srun in a 2-task job joined a world:" \
      "$(tail -n 30 "$(log_of direct "$direct")")"
  fi
  note "all four jobs COMPLETED and learned"
}

# A job of RANKS ranks is interrupted (HOW below) once it has logged 20 steps; it must
# checkpoint, exit 75, be requeued (by itself, or by Slurm after a preemption without grace
# time), resume from that checkpoint and finish. Sets stopped_at (the checkpoint's step).
#   steps    `scancel --signal=USR1`: USR1 to the ranks, as `--signal=USR1@lead` sends it
#   batch    `scancel --batch --signal=USR1`: to the batch shell, whose trap passes it on
#   preempt  a 2-CPU job in partition `urgent` preempts it: SIGTERM, GraceTime 30 s
#   preempt0 the same with GraceTime 0: Slurm requeues the job itself, KillWait (5 s) to stop
stop_and_resume() {  # stop_and_resume NAME RANKS HOW STEPS
  local name=$1 ranks=$2 how=$3 steps=$4 job log state urgent requeued_by=itself
  job=$(MOD_RUN_DIR=$work/$name MOD_TP=1 submit --job-name="$name" --ntasks-per-node="$ranks" \
    -- "$src/cluster/train_single_node.sbatch" "${long[@]}" --set train.steps="$steps")
  log=$(log_of "$name" "$job")
  wait_rows "$work/$name" 20 90
  case $how in
    steps) scancel --signal=USR1 "$job" ;;
    batch) scancel --batch --signal=USR1 "$job" ;;
    preempt | preempt0)
      if [ "$how" = preempt0 ]; then
        scontrol update PartitionName=test GraceTime=0
        requeued_by=Slurm
      fi
      urgent=$(sbatch --parsable --partition=urgent --ntasks=2 --chdir="$work" \
        --output="$work/logs/urgent-%j.out" --wrap "sleep 1")
      ;;
  esac
  note "$name: $how, job $job at step $(($(wc -l < "$work/$name/metrics.csv") - 1))"
  state=$(wait_done "$job" 120)
  [ "$how" = preempt0 ] && scontrol update PartitionName=test GraceTime=30
  [ "$state" = COMPLETED ] || fail "$name (job $job): $state, expected COMPLETED after a requeue"
  [ "$(job_field "$job" Restarts)" = 1 ] \
    || fail "$name: Restarts=$(job_field "$job" Restarts), expected 1"
  if [ -n "${urgent:-}" ]; then
    [ "$(wait_done "$urgent" 30)" = COMPLETED ] || fail "$name: the preempting job did not run"
  fi
  grep -q "stopping after step" "$log" || fail "$name: the ranks did not stop: $(tail -n 30 "$log")"
  grep -q "exited with status 75" "$log" \
    || fail "$name: the step did not exit 75: $(tail -n 30 "$log")"
  if [ $requeued_by = itself ]; then
    grep -q "requeuing" "$log" || fail "$name: the job did not requeue itself: $(tail -n 30 "$log")"
  else
    grep -q "not requeued from here" "$log" || fail "$name: requeued twice? $(tail -n 30 "$log")"
  fi
  stopped_at=$(sed -n 's/^stopping after step \([0-9]*\).*/\1/p' "$log" | head -n 1)
  [ "$stopped_at" -lt "$steps" ] || fail "$name: stopped at $stopped_at of $steps: nothing tested"
  grep -q "resumed from .*step_0*$stopped_at:" "$log" \
    || fail "$name: the requeued run did not resume from step $stopped_at: $(tail -n 30 "$log")"
  [ "$(cat "$work/$name/checkpoints/latest")" = "$(printf 'step_%08d' "$steps")" ] \
    || fail "$name: the requeued run did not finish"
  note "$name: stopped at step $stopped_at, requeued by $requeued_by, resumed and finished"
}

scenario_requeue() {
  local steps=1500 whole_pid
  long=("${small[@]}" --set train.eval_every=500 --set checkpoint.every_steps=500)
  # The uninterrupted run, without Slurm, on the core the job does not use; the job's
  # OMP_NUM_THREADS is 1, and the thread count decides the float sums.
  OMP_NUM_THREADS=1 "$modtrain" train --config "$MOD_CONFIG" --run-dir "$work/whole" \
    "${long[@]}" --set train.steps=$steps --set parallel.tp=1 --set parallel.dp=1 \
    > "$work/whole.log" 2>&1 &
  whole_pid=$!
  stop_and_resume usr1 1 steps $steps
  wait "$whole_pid" || fail "the uninterrupted run failed: $(tail -n 30 "$work/whole.log")"
  losses() { cut -d, -f1,2 "$work/$1/metrics.csv"; }
  cmp -s <(losses whole) <(losses usr1) \
    || fail "losses differ from the uninterrupted run: $(diff <(losses whole) <(losses usr1) | head)"
  cmp -s "$work/whole/model.safetensors" "$work/usr1/model.safetensors" \
    || fail "model.safetensors differs from the uninterrupted run's"
  note "the requeued run's weights and losses equal the uninterrupted run's"
  stop_and_resume batch 2 batch 400
}

scenario_preempt() {
  long=("${small[@]}" --set train.eval_every=500 --set checkpoint.every_steps=500)
  stop_and_resume grace 2 preempt 400
  stop_and_resume nograce 2 preempt0 400
}

# tests/grid/tiny_grid.textproto as a job array, cut to its smaller budget (4 points) at one
# core per task, in partition `test`: `grid submit`, every array task COMPLETED, `grid collect`.
scenario_grid() {
  local spec=$work/tiny_grid.textproto out=$work/grid job states deadline
  "$modtrain" grid --help > /dev/null 2>&1 || fail "\`modtrain grid\` is not in this build"
  sed -e 's/^budgets: .*/budgets: [2e10]/' -e 's/partition: .*/partition: "test"/' \
    -e 's/cpus_per_task: .*/cpus_per_task: 1/' "$src/tests/grid/tiny_grid.textproto" > "$spec"
  (cd "$work" && "$modtrain" grid submit --spec "$spec" --out "$out" --data "$work/data") \
    > "$work/grid_submit.log" 2>&1 || fail "grid submit: $(cat "$work/grid_submit.log")"
  job=$(sed -n 's/.*Submitted batch job \([0-9]*\).*/\1/p' "$work/grid_submit.log" | head -n 1)
  [ -n "$job" ] || fail "grid submit printed no job id: $(cat "$work/grid_submit.log")"
  note "grid: array job $job submitted"
  deadline=$((SECONDS + 150))
  while [ -n "$(squeue -h -j "$job" 2> /dev/null)" ]; do
    [ $SECONDS -lt "$deadline" ] || fail "the grid's array $job did not finish in 150 s"
    sleep 0.5
  done
  states=$(scontrol show job "$job" | grep -o 'JobState=[A-Z_]*' | sort | uniq -c)
  { [ "$(grep -c . <<< "$states")" -eq 1 ] && grep -q " 4 JobState=COMPLETED" <<< "$states"; } \
    || fail "array $job: expected 4 tasks COMPLETED: $states $(tail -n 20 "$out"/logs/task_*.out)"
  # Each task ran its step through cluster/modtrain_job.sh (the copy grid submit wrote).
  [ "$(grep -l "modtrain_job: .*the training step exited with status 0" "$out"/logs/task_*.out \
    | wc -l)" -eq 4 ] || fail "not every task ran mod_run_step: $(tail -n 20 "$out"/logs/task_*.out)"
  (cd "$work" && "$modtrain" grid collect --spec "$spec" --out "$out" --data "$work/data") \
    > "$work/grid_collect.log" 2>&1 || fail "grid collect: $(cat "$work/grid_collect.log")"
  [ "$(wc -l < "$out/results.csv")" -eq 5 ] || fail "results.csv: $(cat "$out/results.csv")"
  note "grid: 4 array tasks COMPLETED, results.csv collected"
}

case $scenario in
  jobs) scenario_jobs ;;
  requeue) scenario_requeue ;;
  preempt) scenario_preempt ;;
  grid) scenario_grid ;;
  *) fail "unknown scenario '$scenario' (jobs, requeue, preempt, grid)" ;;
esac
echo "slurm_test[$scenario]: all checks passed in $((SECONDS - t0)) s"
