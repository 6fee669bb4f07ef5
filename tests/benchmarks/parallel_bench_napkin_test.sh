#!/usr/bin/env bash
# parallel_bench --napkin-only --fabric: the predicted step-time table and its columns, an option
# overriding a preset's number, and the errors for a bad preset or an option without one.
#   parallel_bench_napkin_test.sh PARALLEL_BENCH SOURCE_DIR
set -euo pipefail
bench=$1
src=$2
small="$src/configs/recipes/gpt2_small_dense.textproto"
fail() { echo "FAIL: $*"; exit 1; }

out=$("$bench" --napkin-only --fabric ib-400g --layouts dp64,dp8+zero1 --config "$small")
echo "$out"
grep -qE '^layout +overlap +step ms +compute ms +comm ms +exposed ms +tok/s/GPU$' <<<"$out" ||
  fail "no step-time table header"
for layout in dp64 dp8\\+zero1; do
  for overlap in no yes; do
    grep -qE "^$layout +$overlap +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]{2} +[0-9]+$" \
      <<<"$out" || fail "no row for $layout overlap $overlap"
  done
done
grep -qF 'ib-400g: dp busbw 40 GB/s, tp busbw 360 GB/s, latency 30 us (dp) / 10 us (tp) per collective; 989 TFLOP/s x MFU 0.40 = 395.6 TFLOP/s per rank' \
  <<<"$out" || fail "the assumptions are not stated"
grep -qE '^    time: compute 12\.51 ms .* 13 gradient buckets of parallel.bucket_mb 25 MiB' \
  <<<"$out" || fail "no time line for dp64"

# An option overrides the preset's number; bucket_mb comes from the config.
out=$("$bench" --napkin-only --fabric nvlink-h100 --dp-busbw 450 --mfu 0.5 --layouts dp8 \
  --config "$small" --set parallel.bucket_mb=100)
grep -qF 'nvlink-h100: dp busbw 450 GB/s, tp busbw 360 GB/s' <<<"$out" || fail "--dp-busbw ignored"
grep -qF 'x MFU 0.50 = 494.5 TFLOP/s' <<<"$out" || fail "--mfu ignored"
grep -qF '4 gradient buckets of parallel.bucket_mb 100 MiB' <<<"$out" || fail "bucket_mb ignored"

# Without --fabric the bytes only, as before.
out=$("$bench" --napkin-only --layouts dp8 --config "$small")
grep -q 'predicted' <<<"$out" && fail "a prediction without --fabric"

# Pipeline layouts: each rank's blocks and bytes, the simulated bubble, and a table beside the
# flat layouts with the training state a GPU holds.
out=$("$bench" --napkin-only --fabric ib-400g --layouts dp8,dp4xpp2,dp2xpp4+v2 --config "$small")
echo "$out"
grep -qE '^dp4xpp2 +1f1b, 8 micro-batches; per step, the most a pipeline rank sends: dp [0-9.]+ MB, tp 0.000 MB, p2p [0-9.]+ MB$' \
  <<<"$out" || fail "no bytes line for dp4xpp2"
grep -qE '^    rank 1: blocks [0-9]+-11; ' <<<"$out" || fail "no rank line for dp4xpp2's last stage"
grep -qE '^dp2xpp4\+v2 +interleaved-1f1b, 8 micro-batches' <<<"$out" || fail "no interleaved layout"
grep -qE '^    bubble: 0\.[0-9]{4} simulated with these stages and [0-9.]+ ms a transfer \(equal stages, free transfers: \(pp-1\)/\(v m\+pp-1\) = 0\.1111\)$' \
  <<<"$out" || fail "no bubble line for pp 2 at m 8"
grep -qE '^layout +overlap +step ms +busy ms +bubble +exposed ms +tok/s/GPU +state GB/GPU$' <<<"$out" ||
  fail "no pipeline table header"
for layout in dp8 dp4xpp2 dp2xpp4\\+v2; do
  for overlap in no yes; do
    grep -qE "^$layout +$overlap +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]{2} +(-|0\.[0-9]{4}) +[0-9]+\.[0-9]{2} +[0-9]+ +[0-9]+\.[0-9]$" \
      <<<"$out" || fail "no pipeline table row for $layout overlap $overlap"
  done
done

# Sequence parallelism under pp: each tp rank sends its [B/dp, T/tp, D] part between stages,
# half of plain tp's p2p bytes at tp 2, and sums its stages' partial gradients once a step.
out=$("$bench" --napkin-only --fabric ib-400g --layouts dp2xtp2xpp2,dp2xtp2xpp2+sp --config "$small")
grep -qE '^dp2xtp2xpp2 +1f1b, .* p2p 805\.306 MB$' <<<"$out" || fail "plain tp's p2p bytes"
grep -qE '^dp2xtp2xpp2\+sp +1f1b, .* p2p 402\.653 MB$' <<<"$out" || fail "SP's p2p bytes are not 1/tp"
grep -qE '^    rank 1: .*; sequence-partial gradients over tp [0-9.]+ ms$' <<<"$out" ||
  fail "no partial-gradient time for dp2xtp2xpp2+sp"

# Errors name the problem and exit 2.
expect_error() {
  local want=$1
  shift
  set +e
  err=$("$bench" "$@" 2>&1)
  rc=$?
  set -e
  [[ $rc == 2 ]] || fail "exit $rc, not 2, for: $*"
  grep -qF -- "$want" <<<"$err" || fail "for $*: expected '$want', got: $err"
}
expect_error "--fabric 'ethernet': expected one of nvlink-h100, ib-400g" \
  --napkin-only --fabric ethernet --config "$small"
expect_error "add --fabric nvlink-h100 or ib-400g" --napkin-only --dp-busbw 40 --config "$small"
expect_error "--mfu 1.5: expected (0, 1]" --napkin-only --fabric ib-400g --mfu 1.5 --config "$small"
expect_error "--fabric goes with --napkin-only" --fabric ib-400g --config "$small"
# A pipeline layout cannot be measured (the training run is dp x tp): refused by name.
set +e
err=$("$bench" --layouts pp2 --config "$small" 2>&1)
rc=$?
set -e
[[ $rc != 0 ]] && grep -qF "layout pp2: pipeline layouts are predicted only (--napkin-only)" <<<"$err" ||
  fail "a pipeline layout measured (exit $rc): $err"
echo "parallel_bench napkin CLI: ok"
