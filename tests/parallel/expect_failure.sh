#!/usr/bin/env bash
# expect_failure.sh <max_seconds> <regex> <command...>: runs a command that must fail, i.e. exit
# non-zero within max_seconds with output (stdout and stderr) matching the extended regex. Used
# by the CTest entries that end an MPI job on purpose (timeouts, dead ranks, MPI errors).
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 <max_seconds> <regex> <command...>" >&2
  exit 2
fi
max_seconds=$1
regex=$2
shift 2
command="$*"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
now_ms() { echo $(($(date +%s%N) / 1000000)); }
start_ms=$(now_ms)
# A backstop for a real hang; the elapsed-time check below is the limit that matters.
timeout --kill-after=5 $((max_seconds + 30)) "$@" >"$log" 2>&1
rc=$?
elapsed_ms=$(($(now_ms) - start_ms))
elapsed="$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))"

fail() {
  echo "expect_failure: $1" >&2
  echo "---- output of: $command ----" >&2
  cat "$log" >&2
  exit 1
}
[ "$rc" -ne 0 ] || fail "the command exited 0; it should have failed"
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the command hung (killed after $elapsed s)"
[ "$elapsed_ms" -le $((max_seconds * 1000)) ] ||
  fail "the command took $elapsed s, more than $max_seconds s"
grep -Eq -- "$regex" "$log" || fail "the output does not match /$regex/"
echo "expect_failure: exit $rc after $elapsed s; the output matches /$regex/"
