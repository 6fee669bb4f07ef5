#!/usr/bin/env bash
# Runs on a lent GPU machine, from the repository root, with gpu_bundle.tar.xz carried beside it
# (scripts/gpu_bundle.sh makes it; docs/gpu.md "the bundle" has the whole recipe).
# Each stage fits the device tool's 10-minute command limit; logs and summary.txt go to $OUT.
#   scripts/gpu_run.sh tests   cuda_tests (every op against the CPU), gpu_training_tests
#                              (50-step runs against the CPU, CUDA graphs, checkpoints), nccl_tests
#   scripts/gpu_run.sh bench   GPT-2-small dense and its MoD twin, bf16: step time, tokens/s and
#                              MFU, eager and as a CUDA graph; then sampling tokens/s, dense vs MoD
#   scripts/gpu_run.sh profile where a step's device time goes: modtrain's kernel table
#                              (train.profile_steps) for both models, then PyTorch's (torch.profiler)
#   scripts/gpu_run.sh multirank  several ranks on the one GPU without MPI (the bundle has none):
#                              nccl_tests at 2 and 4 ranks, then tiny_mod dp2 and tp2 against one
#                              rank, losses to 1e-5; each rank its own NCCL_HOSTID, over loopback
#   scripts/gpu_run.sh all     tests and bench in one call (device time is scarce; a start costs
#                              minutes)
#   scripts/gpu_run.sh pytorch bench's PyTorch runs alone
#   scripts/gpu_run.sh eager   bench's eager runs alone: with GPU_BUNDLE, an older build's figures
#                              on the same machine (a before-and-after in one call)
#   scripts/gpu_run.sh modtrain ARGS...   the bundle's modtrain, for a one-off measurement
#   scripts/gpu_run.sh bin NAME ARGS...   any of the bundle's programs (cuda_tests "cuda: rope*")
# SKIP_PYTORCH=1 leaves PyTorch's runs out of bench and profile; PYTORCH_COMPILE=1 adds
# torch.compile to them. GPU_BUNDLE=other.tar.xz runs another bundle (say, main's before a
# change), its entries named with the prefix TAG.
# Every command runs under `timeout` (its LIMIT seconds), so one hang costs one entry, not the
# call. The device tool brings back at most 8 files, so the logs go into one archive,
# $OUT/logs.tar.gz, rewritten after every command (a call cut off still returns what ran).
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: scripts/gpu_run.sh tests|bench|profile|multirank|all|eager|pytorch|modtrain ARGS...|bin NAME ARGS...}
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
  local t0=$SECONDS
  timeout -k 10 "${LIMIT:-150}" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  printf '%-32s rc %-3d %4ds\n' "$name" "$rc" $((SECONDS - t0)) | tee -a "$summary"
  [ $rc -eq 0 ] || tail -15 "$logs/$name.log"
  archive
  return 0
}

probe() {  # what the machine is, and whether every library the binaries need resolves
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader |
    tee -a "$summary"
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
multirank() {
  local n ranks=(scripts/launch_local_ranks.sh 2 --nccl-hostids --)
  for n in 2 4; do
    LIMIT=120 run "nccl_tests_np$n" scripts/launch_local_ranks.sh "$n" --nccl-hostids -- \
      "$bundle/bin/nccl_tests"
  done
  local tiny=(train --config configs/recipes/tiny_mod.textproto --data "$bundle/data/kjv"
    --set train.device=CUDA --set train.steps=20 --set train.log_every=1 --set train.eval_every=0)
  LIMIT=120 run multirank_tiny_1gpu "$modtrain" "${tiny[@]}" --run-dir "/tmp/runs/${tag}mr_1gpu"
  LIMIT=150 run multirank_tiny_dp2 "${ranks[@]}" "$modtrain" "${tiny[@]}" \
    --run-dir "/tmp/runs/${tag}mr_dp2" --set parallel.dp=2 --set parallel.tp=1
  LIMIT=150 run multirank_tiny_tp2 "${ranks[@]}" "$modtrain" "${tiny[@]}" \
    --run-dir "/tmp/runs/${tag}mr_tp2" --set parallel.dp=1 --set parallel.tp=2
  python3 scripts/gpu_run_helpers.py same_losses "/tmp/runs/${tag}mr_1gpu" \
    "/tmp/runs/${tag}mr_dp2" "/tmp/runs/${tag}mr_tp2" 2>&1 | tee -a "$summary"
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

probe
case $stage in
  tests) tests ;;
  bench) bench ;;
  profile) profile ;;
  multirank) multirank ;;
  all) tests; bench ;;
  eager) eager ;;
  pytorch) pytorch_bench ;;
  modtrain) shift; "$modtrain" "$@" ;;  # one ad-hoc command with the bundle's libraries
  bin) shift; name=$1; shift; "$bundle/bin/$name" "$@" ;;
  *)
    echo "gpu_run: unknown stage '$stage' (tests, bench, profile, multirank, all, eager, pytorch, modtrain ARGS... or bin NAME ARGS...)" >&2
    exit 2
    ;;
esac
archive
