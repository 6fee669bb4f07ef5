#!/usr/bin/env bash
# Builds the libFuzzer targets (build-fuzz/, clang, MOD_FUZZ=ON) and runs each for SECONDS
# (default 600), starting from tests/fuzz/corpus/<target>/ with tests/fuzz/dict/<target>.dict
# where there is one. Prints per target: executions, exec/s, coverage, corpus, findings.
# Findings (crash-*, leak-*, timeout-*, oom-*) go to build-fuzz/artifacts/<target>/; exits 1 if
# any target found one, 77 when clang++ or libFuzzer is missing (CTest: skipped).
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   JOBS=2 runs that many targets at once.
set -u
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
jobs=${JOBS:-2}
root=$PWD
build=${MOD_FUZZ_BUILD:-$root/build-fuzz}
if ! command -v clang++ >/dev/null ||
   ! ls "$(clang++ -print-resource-dir 2>/dev/null)"/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "fuzz.sh: clang++ with libFuzzer not found (scripts/install_deps.sh installs clang, libclang-rt-14-dev): skipped"
  exit 77
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(config grid_spec tokenizer hf_tokenizer token_shard
  checkpoint_meta checkpoint_shard safetensors metrics_csv tb_events dataset_manifest prep_state
  text_source)
mkdir -p "$build"
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DMOD_FUZZ=ON -DMOD_USE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 2; }
ninja -C "$build" -j"${BUILD_JOBS:-2}" $(printf 'fuzz_%s ' "${targets[@]}") >"$build/build.log" 2>&1 ||
  { tail -50 "$build/build.log"; exit 2; }

max_len() {  # per format: big enough for the seeds, long runs and deep nesting; fast enough
  case $1 in
    tokenizer|hf_tokenizer) echo 262144 ;;  # their entries encode the input: long runs matter
    config|safetensors) echo 262144 ;;      # runs of 100,000 spaces or digits (issue 43)
    grid_spec) echo 1100000 ;;  # a label of a million characters once overflowed std::regex
    token_shard|checkpoint_shard|tb_events|dataset_manifest|text_source) echo 65536 ;;
    *) echo 8192 ;;
  esac
}

run_one() {
  local t=$1 work=$build/work/$1 art=$build/artifacts/$1/
  mkdir -p "$work" "$art"
  cp -n "$root/tests/fuzz/corpus/$t/"* "$work/" 2>/dev/null
  local dict=()
  [ -f "$root/tests/fuzz/dict/$t.dict" ] && dict=(-dict="$root/tests/fuzz/dict/$t.dict")
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/tests/fuzz/fuzz_$t" "$work" "${dict[@]}" -max_total_time="$seconds" \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -max_len="$(max_len "$t")" \
    -artifact_prefix="$art" -print_final_stats=1 >"$build/$t.log" 2>&1
}

for t in "${targets[@]}"; do rm -rf "$build/artifacts/$t"; done  # this run's findings only
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait

status=0
printf '%-18s %8s %12s %10s %8s %8s %s\n' target seconds executions exec/s cov corpus findings
for t in "${targets[@]}"; do
  log=$build/$t.log
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  corpus=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  found=$(ls "$build/artifacts/$t/" 2>/dev/null | tr '\n' ' ')
  printf '%-18s %8s %12s %10s %8s %8s %s\n' "$t" "$seconds" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "${corpus:-?}" "${found:-none}"
  if [ -z "$execs" ]; then  # did not start (a bad dictionary, a missing binary)
    status=1
    echo "$t: did not run:"; head -3 "$log"
  fi
  if [ -n "$found" ] || grep -q 'ERROR: libFuzzer\|ERROR: AddressSanitizer\|runtime error:' "$log"; then
    status=1
    grep -m3 'ERROR\|runtime error\|SUMMARY' "$log"
  fi
done
exit $status
