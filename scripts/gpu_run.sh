#!/usr/bin/env bash
# Runs on a lent GPU machine, from the repository root, with gpu_bundle.tar.xz carried beside it
# (scripts/gpu_bundle.sh makes it; docs/gpu.md "On a lent GPU machine" has the whole recipe).
# Each stage fits the device tool's 10-minute command limit; logs and summary.txt go to $OUT.
#   scripts/gpu_run.sh tests   cuda_tests (every op against the CPU), gpu_training_tests
#                              (50-step runs against the CPU, CUDA graphs, checkpoints), nccl_tests
#   scripts/gpu_run.sh bench   GPT-2-small dense and its MoD twin, bf16: step time, tokens/s and
#                              MFU, eager and as a CUDA graph; then sampling tokens/s, dense vs MoD
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: scripts/gpu_run.sh tests|bench}
out=${OUT:-$PWD/out}
mkdir -p "$out"
summary="$out/summary.txt"

bundle=/tmp/gpu_bundle
[ -d "$bundle" ] || tar -xJf gpu_bundle.tar.xz -C /tmp || {
  echo "gpu_run: gpu_bundle.tar.xz missing or unreadable (carry it: scripts/gpu_bundle.sh)" >&2
  exit 1
}
# CUDA's libraries: the toolkit's, else those of Python's nvidia packages.
cuda_libs=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib 2>/dev/null | paste -sd:)
py_libs=$(python3 scripts/gpu_run_helpers.py libdirs 2>/dev/null)
export LD_LIBRARY_PATH="$bundle/lib:$cuda_libs:$py_libs:${LD_LIBRARY_PATH:-}"
export MOD_SOURCE_DIR=$PWD
modtrain="$bundle/bin/modtrain"

run() {  # run NAME command...: output to $out/NAME.log, exit status to the summary
  local name=$1
  shift
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  printf '%-28s rc %-3d %4ds\n' "$name" "$rc" $((SECONDS - t0)) | tee -a "$summary"
  [ $rc -eq 0 ] || tail -20 "$out/$name.log"
  return 0
}

case $stage in
  tests)
    nvidia-smi > "$out/nvidia-smi.txt" 2>&1
    "$modtrain" --version > /dev/null 2>&1 || true
    run cuda_tests "$bundle/bin/cuda_tests"
    run gpu_training_tests "$bundle/bin/gpu_training_tests"
    run nccl_tests "$bundle/bin/nccl_tests"
    ;;
  bench)
    steps=${STEPS:-30}
    for model in gpt2_small_dense gpt2_small_mod; do
      for graph in false true; do
        name="train_${model}_graph_${graph}"
        run "$name" "$modtrain" train --config "configs/recipes/$model.textproto" \
          --run-dir "/tmp/runs/$name" --data "$bundle/data" --set train.device=CUDA \
          --set train.precision=BF16 --set train.steps="$steps" --set train.eval_every=0 \
          --set train.log_every=1 --set train.cuda_graph="$graph"
        python3 scripts/gpu_run_helpers.py median "$name" "$out/$name.log" | tee -a "$summary"
      done
      run "sample_$model" "$modtrain" sample --checkpoint "/tmp/runs/train_${model}_graph_false/model.safetensors" \
        --tokenizer "$bundle/data/tokenizer.txt" --device CUDA --max-new-tokens 500 --prompt "And God said"
      grep -o '\[[0-9]* tokens in [^,]*, [0-9.]* tokens/s' "$out/sample_$model.log" | sed "s/^/  sample_$model: /" | tee -a "$summary"
    done
    ;;
  *)
    echo "gpu_run: unknown stage '$stage' (tests or bench)" >&2
    exit 2
    ;;
esac
