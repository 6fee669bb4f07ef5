#!/usr/bin/env bash
# Runs on a lent GPU machine, from the repository root, with gpu_bundle.tar.xz carried beside it
# (scripts/gpu_bundle.sh makes it; docs/gpu.md "the bundle" has the whole recipe).
# Each stage fits the device tool's 10-minute command limit; logs and summary.txt go to $OUT.
#   scripts/gpu_run.sh tests   cuda_tests (every op against the CPU), gpu_training_tests
#                              (50-step runs against the CPU, CUDA graphs, checkpoints), nccl_tests
#   scripts/gpu_run.sh bench   GPT-2-small dense and its MoD twin, bf16: step time, tokens/s and
#                              MFU, eager and as a CUDA graph; then sampling tokens/s, dense vs MoD,
#                              each beside PyTorch's twin decoding (pytorch_decode.py)
#   scripts/gpu_run.sh fusions each fusion's own gain: the graphed MoD step with one
#                              train.fusions switch off at a time (compare with bench's graph run)
#   scripts/gpu_run.sh profile where a step's device time goes: modtrain's kernel table
#                              (train.profile_steps) for both models, then PyTorch's (torch.profiler)
#   scripts/gpu_run.sh multirank  several ranks on the one GPU without MPI (the bundle has none):
#                              nccl_tests at 2 and 4 ranks, then tiny_mod dp2, tp2 and dp2 as a
#                              CUDA graph against one rank, losses to 1e-5, and dp2's step-10
#                              checkpoint resumed on one rank; each rank its own NCCL_HOSTID,
#                              over loopback
#   scripts/gpu_run.sh recompute  tiny_dense and tiny_mod in bf16, FULL and SELECTIVE against NONE
#                              with each fusion off in turn (which fusion a replay disagrees with)
#   scripts/gpu_run.sh overlap GPT-2-small MoD at dp2 on the one GPU, profiled, 25 MB buckets
#                              against one bucket (no overlap): the collectives' share under
#                              backward's kernels and the step time of each
#   scripts/gpu_run.sh grid    the isoFLOP grid configs/grids/gpu_one on the Linux corpus:
#                              unpack linux_corpus.jsonl.xz (scripts/gpu_corpus.sh; carried
#                              beside the bundle), prep it on every core with the committed
#                              tokenizer, plan at GRID_FLOPS FLOP/s, train the points that fit
#                              GRID_SECONDS (default 330) in plan order (GRID_POINTS: an extended
#                              regex of point names, e.g. '^b1e15_'; GRID_SPEC: another
#                              spec on the same corpus), collect; results.csv,
#                              plan.csv and the plots come back in $OUT/grid.tar.gz
#   scripts/gpu_run.sh all     tests and bench in one call (device time is scarce; a start costs
#                              minutes)
#   scripts/gpu_run.sh pytorch bench's PyTorch runs alone: its decoding's self-check on the GPU
#                              (batch 4 against batch 1, greedy, f64, eager and compiled), the
#                              decoding runs, then the training step
#   scripts/gpu_run.sh pytorch_train  bench's PyTorch training step alone (after
#                              SKIP_PYTORCH=1 bench in the same call, for the same-call ratios)
#   scripts/gpu_run.sh pytorch_sample  the decoding self-check and runs alone (with
#                              SKIP_PYTORCH=1 all, a fresh machine's two calls)
#   scripts/gpu_run.sh eager   bench's eager runs alone: with GPU_BUNDLE, an older build's figures
#                              on the same machine (a before-and-after in one call)
#   scripts/gpu_run.sh modtrain ARGS...   the bundle's modtrain, for a one-off measurement
#   scripts/gpu_run.sh bin NAME ARGS...   any of the bundle's programs (cuda_tests "cuda: rope*")
# SKIP_PYTORCH=1 leaves PyTorch's runs out of bench and profile; PYTORCH_COMPILE=1 adds
# torch.compile to its training step (its decoding always runs eager and compiled).
# GPU_BUNDLE=other.tar.xz runs another bundle (say, main's before a change), its entries named
# with the prefix TAG. GPU_UNTIL=epoch-seconds is the call's deadline: each command's limit is cut
# to the time left, and one with under MIN_SECONDS (20) left is skipped and said so, so stages
# can be queued in order of worth and the call still returns its logs.
# Every command runs under `timeout` (its LIMIT seconds), so one hang costs one entry, not the
# call. The device tool brings back at most 8 files, so the logs go into one archive,
# $OUT/logs.tar.gz, rewritten after every command (a call cut off still returns what ran).
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: scripts/gpu_run.sh tests|bench|profile|multirank|grid|all|eager|pytorch|pytorch_sample|modtrain ARGS...|bin NAME ARGS...}
out=${OUT:-$PWD/out}
mkdir -p "$out"
summary="$out/summary.txt"

tarball=${GPU_BUNDLE:-gpu_bundle.tar.xz}
tag=${TAG:-}
bundle_root=/tmp/$(basename "$tarball" .tar.xz)
bundle=$bundle_root/gpu_bundle
[ -d "$bundle" ] || { mkdir -p "$bundle_root" && tar -xJf "$tarball" -C "$bundle_root"; } || {
  echo "gpu_run: $tarball missing or unreadable (carry it: scripts/gpu_bundle.sh)" >&2
  exit 1
}
# CUDA's libraries: the toolkit's, else those of Python's nvidia packages.
cuda_libs=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib 2>/dev/null | paste -sd:)
py_libs=$(python3 scripts/gpu_run_helpers.py libdirs 2>/dev/null)
export LD_LIBRARY_PATH="$bundle/lib:$cuda_libs:$py_libs:${LD_LIBRARY_PATH:-}"
export MOD_SOURCE_DIR=$PWD PYTHONUNBUFFERED=1
modtrain="$bundle/bin/modtrain"

logs=/tmp/gpu_run_logs
mkdir -p "$logs"
archive() { tar -C "$logs" -czf "$out/logs.tar.gz" . ; }

run() {  # run NAME command...: output to $logs/TAG+NAME.log, exit status to the summary
  local name=$tag$1
  shift
  local t0=$SECONDS limit=${LIMIT:-150}
  if [ -n "${GPU_UNTIL:-}" ]; then  # the call's deadline: a command that cannot fit is left out
    local left=$((GPU_UNTIL - $(date +%s)))
    if [ "$left" -lt "${MIN_SECONDS:-20}" ]; then
      printf '%-32s left out (%ds to the deadline)\n' "$name" "$left" | tee -a "$summary"
      return 0
    fi
    [ "$left" -ge "$limit" ] || limit=$left
  fi
  timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  printf '%-32s rc %-3d %4ds\n' "$name" "$rc" $((SECONDS - t0)) | tee -a "$summary"
  [ $rc -eq 0 ] || tail -15 "$logs/$name.log"
  archive
  return 0
}

probe() {  # what the machine is, and whether every library the binaries need resolves
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,clocks.sm,power.limit \
    --format=csv,noheader | tee -a "$summary"
  local missing
  missing=$(ldd "$bundle"/bin/* | grep "not found" | sort -u)
  [ -z "$missing" ] || { echo "gpu_run: unresolved libraries:"; echo "$missing"; } | tee -a "$summary"
}

tests() {
  LIMIT=120 run cuda_tests "$bundle/bin/cuda_tests"
  LIMIT=300 run gpu_training_tests "$bundle/bin/gpu_training_tests"
  LIMIT=30 run nccl_tests "$bundle/bin/nccl_tests"
}

# Ranks meet through the TCP rendezvous (scripts/launch_local_ranks.sh); with a NCCL_HOSTID
# each, NCCL takes them for separate nodes and joins them over sockets on lo, sharing the GPU.
# The layouts' logic (tp2, dp2, ZeRO-1, MoDE ep2, eager and graphed, a dp2 checkpoint resumed on
# one GPU) runs in CI on the emulator's NCCL stand-in (ctest -L cuda_emulated), so this stage
# keeps what only the real library shows: nccl_tests on NVIDIA's NCCL at 2 and 4 ranks, and one
# graphed dp2 run (real collectives captured in a real graph) against the one-GPU run.
multirank() {
  local n ranks=(scripts/launch_local_ranks.sh 2 --nccl-hostids --)
  for n in 2 4; do
    LIMIT=120 run "nccl_tests_np$n" scripts/launch_local_ranks.sh "$n" --nccl-hostids -- \
      "$bundle/bin/nccl_tests"
  done
  local tiny=(train --config configs/recipes/tiny_mod.textproto --data "$bundle/data/kjv"
    --set train.device=CUDA --set train.steps=20 --set train.log_every=1 --set train.eval_every=0
    --set train.cuda_graph=false)
  LIMIT=120 run multirank_tiny_1gpu "$modtrain" "${tiny[@]}" --run-dir "/tmp/runs/${tag}mr_1gpu"
  LIMIT=150 run multirank_tiny_dp2_graph "${ranks[@]}" "$modtrain" "${tiny[@]}" \
    --run-dir "/tmp/runs/${tag}mr_dp2_graph" --set parallel.dp=2 --set parallel.tp=1 \
    --set train.cuda_graph=true
  python3 scripts/gpu_run_helpers.py same_losses "/tmp/runs/${tag}mr_1gpu" \
    "/tmp/runs/${tag}mr_dp2_graph" 2>&1 | tee -a "$summary"
}

# Recomputation against NONE: tiny_dense and tiny_mod, bf16, eager, 20 steps; a FULL or SELECTIVE
# run off NONE by more than 1e-5 fails the line ("ok" lines are runs that track NONE). Each
# fusion's replay, eager and graphed, runs in CI on the emulator (cuda_emulated:gpu_training:
# recompute and the fusion cases), so only the default set runs here; OFF="add_norm classifier
# ..." adds the runs with one fusion off at a time.
recompute() {
  local recipe off mode dirs
  for recipe in tiny_dense tiny_mod; do
    for off in none ${OFF:-}; do
      dirs=()
      for mode in NONE FULL SELECTIVE; do
        local name="recompute_${recipe}_${mode}_no_$off" sets=()
        [ "$off" = none ] || sets=(--set "train.fusions.$off=false")
        LIMIT=60 run "$name" "$modtrain" train --config "configs/recipes/$recipe.textproto" \
          --data "$bundle/data/kjv" --run-dir "/tmp/runs/$tag$name" --set train.device=CUDA \
          --set train.precision=BF16 --set train.steps=20 --set train.eval_every=0 \
          --set train.log_every=1 --set train.cuda_graph=false --set train.recompute=$mode \
          "${sets[@]}"
        dirs+=("/tmp/runs/$tag$name")
      done
      python3 scripts/gpu_run_helpers.py same_losses "${dirs[@]}" 2>&1 | tee -a "$summary"
    done
  done
}

# Gradients reduced while backward runs, seen in the kernel profile: GPT-2-small MoD at dp2 on the
# one GPU (8 x 1024 tokens a rank), 25 MB buckets against one bucket at the end (no overlap);
# rank 0's table says what share of the collectives ran under other kernels. Both ranks share
# the GPU and a loopback socket: a function check, not a bandwidth figure.
overlap() {
  local mb ranks=(scripts/launch_local_ranks.sh 2 --nccl-hostids --)
  for mb in 25 65536; do
    LIMIT=150 run "overlap_dp2_bucket$mb" "${ranks[@]}" "$modtrain" train \
      --config configs/recipes/gpt2_small_mod.textproto --data "$bundle/data/kjv_bpe8k" \
      --run-dir "/tmp/runs/${tag}overlap_$mb" --set train.device=CUDA --set train.precision=BF16 \
      --set parallel.dp=2 --set parallel.tp=1 --set parallel.bucket_mb="$mb" \
      --set train.batch_size=8 --set train.grad_accum=1 --set train.steps=8 \
      --set train.eval_every=0 --set train.log_every=1 --set train.profile_from=4 \
      --set train.profile_steps=3
    { echo "overlap_dp2_bucket$mb:"; grep -hE "^kernel profile|collectives \(nccl" \
      "$logs/${tag}overlap_dp2_bucket$mb.log"; } | tee -a "$summary"
    python3 scripts/gpu_run_helpers.py median "${tag}overlap_dp2_bucket$mb" \
      "$logs/${tag}overlap_dp2_bucket$mb.log" | tee -a "$summary"
  done
}

# train_run NAME MODEL GRAPH RECOMPUTE STEPS [--set ...]: one GPT-2-small run, 64 x 1024 tokens
# a step
train_run() {
  local name=$1 model=$2 graph=$3 recompute=$4 steps=$5
  shift 5
  LIMIT=75 run "$name" "$modtrain" train --config "configs/recipes/$model.textproto" \
    --run-dir "/tmp/runs/$tag$name" --data "$bundle/data/kjv_bpe8k" --set train.device=CUDA \
    --set train.precision=BF16 --set train.steps="$steps" --set train.grad_accum=1 \
    --set train.eval_every=0 --set train.log_every=1 --set train.cuda_graph="$graph" \
    --set train.recompute="$recompute" "$@"
  python3 scripts/gpu_run_helpers.py median "$tag$name" "$logs/$tag$name.log" | tee -a "$summary"
  grep -h "^peak memory" "$logs/$tag$name.log" | sed "s/^/  /" | tee -a "$summary"
}

# modtrain sample on the GPU, 500 new tokens at temperature 1 (no top-k or top-p filter), batch 1
# and 64 (copies of one prompt), the step captured as a CUDA graph; then batch 1 without the graph.
sample_run() {
  local model=$1 batch extra
  for batch in 1 64 1_eager; do
    extra=()
    [ "$batch" != 1_eager ] || extra=(--no-cuda-graph)
    LIMIT=45 run "sample_${model}_b$batch" "$modtrain" sample \
      --checkpoint "/tmp/runs/${tag}train_${model}/model.safetensors" --tokenizer "$bundle/data/kjv_bpe8k/tokenizer.txt" --device CUDA --max-new-tokens 500 \
      --prompt "And God said" --batch "${batch%_eager}" --temperature 1 --top-p 1 "${extra[@]}"
    grep -o '\[[0-9]* tokens in [^,]*, [0-9.]* tokens/s[^;\]]*' "$logs/${tag}sample_${model}_b$batch.log" |
      sed "s/^/  sample_${model}_b$batch: /" | tee -a "$summary"
  done
}

# PyTorch's twin decoding the same recipe (benchmarks/pytorch/pytorch_decode.py) as sample_run
# does: batch 1 and 64, 500 new tokens at temperature 1, f32 weights and caches (modtrain sample
# reads the f32 masters); eager, and a static cache under torch.compile(mode="reduce-overhead"),
# warm-up untimed. The twin builds its own random-init model (it cannot read modtrain's
# checkpoint), its predictors calibrated to admit model.mod.capacity, as train_bench does.
pytorch_sample_run() {
  local model=$1 batch name
  for batch in 1 64; do
    name=${tag}pytorch_sample_${model}_b$batch
    LIMIT=150 run "pytorch_sample_${model}_b$batch" python3 benchmarks/pytorch/pytorch_decode.py \
      --config "configs/recipes/$model.textproto" --models "${model#gpt2_small_}" --device cuda \
      --batch "$batch" --new-tokens 500 --reps 3
    grep -E "^  (dense|MoD) |skipping cudagraphs" "$logs/$name.log" | sed "s/^ */  $name: /" |
      tee -a "$summary"  # Inductor's "skipping cudagraphs": the compiled step ran without them
  done
}

# The twin's decoding on the GPU against itself before its figures are read: tiny_mod, greedy,
# f64, batch 4 (copies of one prompt, and four prompts) against batch 1, eager, static and
# compiled with CUDA graphs; "self-check: N passed, M failed" goes to the summary.
pytorch_sample_check() {
  LIMIT=150 run pytorch_sample_check python3 benchmarks/pytorch/pytorch_decode.py --self-check \
    --config configs/recipes/tiny_mod.textproto --models mod --device cuda --batch 4
  grep -hE "^self-check|failed:|MISMATCH" "$logs/${tag}pytorch_sample_check.log" | tee -a "$summary"
}

pytorch_sample_runs() {
  pytorch_sample_run gpt2_small_dense
  pytorch_sample_run gpt2_small_mod
}

eager() {
  local model
  for model in gpt2_small_dense gpt2_small_mod; do
    train_run "train_${model}" "$model" false NONE "${STEPS:-20}"
  done
}

bench() {
  local steps=${STEPS:-20} model
  for model in gpt2_small_dense gpt2_small_mod; do
    train_run "train_${model}" "$model" false NONE "$steps"
    train_run "train_${model}_graph" "$model" true NONE "$steps"
    train_run "train_${model}_full" "$model" false FULL 10
    sample_run "$model"
    [ -n "${SKIP_PYTORCH:-}" ] || pytorch_sample_run "$model"
  done
  [ -z "${SKIP_PYTORCH:-}" ] || return 0
  pytorch_bench
}

# PyTorch's twin of the MoD model and its dense twin, same shapes, with and without
# torch.utils.checkpoint (python3 there is the one with PyTorch).
pytorch_bench() {
  local limit=100
  [ -z "${PYTORCH_COMPILE:-}" ] || limit=220  # torch.compile takes about a minute a model
  LIMIT=$limit run pytorch_gpu python3 benchmarks/pytorch/pytorch_gpu.py \
    --config configs/recipes/gpt2_small_mod.textproto --set train.batch_size=64 --steps 10 \
    ${PYTORCH_COMPILE:+--compile}
  grep -E "^PyTorch|^  (dense|MoD)" "$logs/pytorch_gpu.log" | tee -a "$summary"
}

# Each fusion's own gain: bench's graphed MoD step with one train.fusions switch off at a time.
fusions() {
  local steps=${STEPS:-20} f
  for f in optimizer_weight_copies classifier add_norm gelu_mlp router_scores routed_scatter; do
    train_run "train_gpt2_small_mod_graph_no_$f" gpt2_small_mod true NONE "$steps" \
      --set "train.fusions.$f=false"
  done
}

profile() {
  local model
  for model in gpt2_small_dense gpt2_small_mod; do
    train_run "profile_$model" "$model" false NONE 6 --set train.profile_from=3 \
      --set train.profile_steps=3
    sed -n '/^kernel profile/,/^the host a step/p' "$logs/${tag}profile_$model.log" | head -38 |
      tee -a "$summary"
    cp "/tmp/runs/${tag}profile_$model/kernel_profile.csv" "$logs/${tag}profile_$model.csv" 2>/dev/null
  done
  archive
  [ -z "${SKIP_PYTORCH:-}" ] || return 0
  local limit=120
  [ -z "${PYTORCH_COMPILE:-}" ] || limit=300
  LIMIT=$limit run pytorch_profile python3 benchmarks/pytorch/pytorch_gpu.py \
    --config configs/recipes/gpt2_small_mod.textproto --set train.batch_size=64 --profile 3 \
    ${PYTORCH_COMPILE:+--compile}
  grep -A21 "^PyTorch profile" "$logs/pytorch_profile.log" | tee -a "$summary"
}

# The grid stage. Points run one at a time, each as `grid run --point P` under `timeout` with the
# time left, so the last one stops at a checkpoint (exit 75) instead of overrunning; a point
# starts only when its predicted time fits the time left: GRID_OVERHEAD seconds (default 10:
# start-up, CUDA graph capture, final evaluation, saving) + plan.csv's est_seconds at GRID_FLOPS
# x k, where k (from 1) is what the points so far took beyond their overhead per estimated second.
grid() {
  local corpus=${GRID_CORPUS:-linux_corpus.jsonl.xz} spec=${GRID_SPEC:-configs/grids/gpu_one.textproto}
  local data=/tmp/grid_data/linux_bpe16k gout=/tmp/grid_gpu_one
  local budget=${GRID_SECONDS:-330} flops=${GRID_FLOPS:-1.5e14}
  local grid_opts=(--spec "$spec" --data "$data" --out "$gout")
  [ -f "$corpus" ] || { echo "gpu_run: $corpus missing (carry it: scripts/gpu_corpus.sh)" | tee -a "$summary"; return 0; }
  mkdir -p /tmp/grid_corpus "$gout"
  [ -s /tmp/grid_corpus/linux.jsonl ] || LIMIT=60 run grid_unpack \
    sh -c "xz -T0 -dc '$corpus' > /tmp/grid_corpus/linux.jsonl.tmp && mv /tmp/grid_corpus/linux.jsonl.tmp /tmp/grid_corpus/linux.jsonl"
  LIMIT=300 run grid_prep "$modtrain" prep --input /tmp/grid_corpus/linux.jsonl \
    --tokenizer configs/corpora/linux_bpe16k.json --val-fraction 0.005 --out "$data"
  grep -E "^prep|^  (train|val):" "$logs/${tag}grid_prep.log" | tee -a "$summary"
  LIMIT=60 run grid_plan "$modtrain" grid plan "${grid_opts[@]}" --flops-per-second "$flops" \
    --device-memory-gb 80
  grep -E "^warning|^total" "$logs/${tag}grid_plan.log" | tee -a "$summary"
  local t0=$SECONDS spent_est=0 spent_real=0 overhead=${GRID_OVERHEAD:-10} point est left scaled rc
  while IFS=, read -r point est; do
    [[ $point =~ ${GRID_POINTS:-.} ]] || continue
    left=$((budget - (SECONDS - t0)))
    scaled=$(awk -v e="$est" -v r="$spent_real" -v s="$spent_est" -v o="$overhead" 'BEGIN {
      k = s > 0 ? r / s : 1; if (k < 0.5) k = 0.5; printf "%d", o + e * k + 1 }')
    if [ "$scaled" -gt "$left" ]; then
      echo "grid: $point left out (about ${scaled}s, ${left}s left)" >> "$logs/${tag}grid_points.txt"
      continue
    fi
    local p0=$SECONDS
    timeout -k 20 "$left" "$modtrain" grid run "${grid_opts[@]}" --point "$point" \
      < /dev/null >> "$logs/${tag}grid_run.log" 2>&1
    rc=$?
    printf 'grid: %-26s rc %-3d %4ds (estimated %ss)\n' "$point" "$rc" $((SECONDS - p0)) "$est" |
      tee -a "$logs/${tag}grid_points.txt"
    spent_est=$(awk -v a="$spent_est" -v b="$est" 'BEGIN { print a + b }')
    spent_real=$((spent_real + SECONDS - p0 > overhead ? spent_real + SECONDS - p0 - overhead : spent_real))
    archive
  done < <(awk -F, 'NR > 1 && $NF == "" && $(NF - 1) == "runnable" {
      for (i = 1; i <= NF; ++i) if (h[i] == "est_seconds") print $1 "," $i
    } NR == 1 { for (i = 1; i <= NF; ++i) h[i] = $i }' "$gout/plan.csv")
  grep -c " rc 0 " "$logs/${tag}grid_points.txt" | sed 's/^/grid points trained: /' | tee -a "$summary"
  LIMIT=120 run grid_collect "$modtrain" grid collect "${grid_opts[@]}"
  sed -n '/^seed spread\|^lowest loss/,$p' "$logs/${tag}grid_collect.log" | tee -a "$summary"
  local keep=() f
  for f in plan.csv results.csv isoflop.png loss_vs_flops_per_token.png plots; do
    [ ! -e "$gout/$f" ] || keep+=("$f")
  done
  tar -C "$gout" -czf "$out/grid.tar.gz" "${keep[@]}"
}

probe
case $stage in
  tests) tests ;;
  bench) bench ;;
  profile) profile ;;
  fusions) fusions ;;
  overlap) overlap ;;
  multirank) multirank ;;
  recompute) recompute ;;
  grid) grid ;;
  all) tests; bench ;;
  eager) eager ;;
  pytorch) pytorch_sample_check; pytorch_sample_runs; pytorch_bench ;;
  pytorch_train) pytorch_bench ;;
  pytorch_sample) pytorch_sample_check; pytorch_sample_runs ;;
  modtrain) shift; "$modtrain" "$@" ;;  # one ad-hoc command with the bundle's libraries
  bin) shift; name=$1; shift; "$bundle/bin/$name" "$@" ;;
  *)
    echo "gpu_run: unknown stage '$stage' (tests, bench, fusions, profile, multirank, recompute, overlap, grid, all, eager, pytorch, pytorch_train, pytorch_sample, modtrain ARGS... or bin NAME ARGS...)" >&2
    exit 2
    ;;
esac
archive
