#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (README.md) and fails on any crash, leak, timeout,
# out-of-memory or invariant failure.
#
#   tests/fuzz/run_fuzz.sh <seconds-per-target> <build dir> [target...]   # all targets by default
#   tests/fuzz/run_fuzz.sh --seeds-only <build dir>        # only (re)write the seed corpora
#   tests/fuzz/run_fuzz.sh --no-seeds <seconds> <build dir> [target...]  # seeds already written
#
# Seeds: <build>/fuzz/seeds/<target>, written by offload_fuzz_seeds from ../shared/testvectors,
# plus the hand-written tests/fuzz/seeds/<target>. New inputs accumulate in
# <build>/fuzz/corpus/<target> (kept between runs), crash inputs in <build>/fuzz/artifacts/<target>,
# each run's output in <build>/fuzz/logs/<target>.log. FUZZ_JOBS targets run at once (default 2,
# one per core), under nice. Prints per target: seconds, execs, execs/s, cov, ft, corpus (inputs /
# bytes libFuzzer holds at the end), result.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
targets_all=(keys ed25519 x25519 box aead aead_envelope key_store http)

seeds=1
seeds_only=0
case "${1:-}" in
  --seeds-only) seeds_only=1; shift ;;
  --no-seeds) seeds=0; shift ;;
esac
if [ "$seeds_only" = 1 ]; then
  build=${1:?usage: run_fuzz.sh --seeds-only <build dir>}
  seconds=0
  shift
else
  seconds=${1:?usage: run_fuzz.sh <seconds-per-target> <build dir> [target...]}
  build=${2:?usage: run_fuzz.sh <seconds-per-target> <build dir> [target...]}
  shift 2
fi
build=$(cd "$build" && pwd)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${targets_all[@]}")
jobs=${FUZZ_JOBS:-2}
bin=$build/bin
work=$build/fuzz

# Scratch folders of the targets' key stores: tmpfs when there is one (fsync is cheap there).
scratch_base=/dev/shm
[ -w "$scratch_base" ] || scratch_base=${TMPDIR:-/tmp}
scratch=$(mktemp -d "$scratch_base/offload-fuzz-run.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export OFFLOAD_FUZZ_TMPDIR=$scratch
# Standalone runs get these; under tests/sanitizers/run_sanitizer_ctest.sh its options (report
# files it checks) are kept.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ "$seeds" = 1 ]; then
  rm -rf "$work/seeds"
  mkdir -p "$work/seeds"
  "$bin/offload_fuzz_seeds" "$work/seeds" >"$work/seeds.log" 2>&1 || {
    cat "$work/seeds.log" >&2
    echo "run_fuzz: offload_fuzz_seeds failed" >&2
    exit 1
  }
  echo "run_fuzz: seeds: $(grep -E ' seeds$' "$work/seeds.log" | paste -sd ',')" >&2
fi
[ "$seeds_only" = 1 ] && exit 0

run_one() {
  local t=$1
  local corpus=$work/corpus/$t artifacts=$work/artifacts/$t log=$work/logs/$t.log
  rm -rf "$artifacts"
  mkdir -p "$corpus" "$artifacts" "$work/logs" "$scratch/$t"
  local dirs=("$corpus")
  [ -d "$work/seeds/$t" ] && dirs+=("$work/seeds/$t")
  [ -d "$here/seeds/$t" ] && dirs+=("$here/seeds/$t")
  local start end rc=0
  start=$(date +%s)
  OFFLOAD_FUZZ_TMPDIR=$scratch/$t nice -n 10 "$bin/${t}_fuzzer" \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=3072 -max_len=8192 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  end=$(date +%s)
  echo "$rc $((end - start))" >"$work/logs/$t.result"
}

echo "run_fuzz: ${#targets[@]} target(s), ${seconds} s each, $jobs at a time" >&2
running=0
for t in "${targets[@]}"; do
  if [ ! -x "$bin/${t}_fuzzer" ]; then
    echo "run_fuzz: $bin/${t}_fuzzer missing (build target offload_fuzz_targets)" >&2
    exit 1
  fi
  rm -f "$work/logs/$t.result"
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

failed=0
printf '%-14s %6s %10s %8s %6s %7s %12s %s\n' target seconds execs exec/s cov ft corpus result
for t in "${targets[@]}"; do
  log=$work/logs/$t.log
  read -r rc took <"$work/logs/$t.result" || { rc=99; took=0; }
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
  cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
  ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
  corpus=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p')
  crashes=$(find "$work/artifacts/$t" -type f | wc -l)
  result=ok
  if [ "$rc" != 0 ] || [ "$crashes" != 0 ]; then
    result="FAILED (exit $rc, $crashes artifact(s) in $work/artifacts/$t, log $log)"
    failed=1
  fi
  printf '%-14s %6s %10s %8s %6s %7s %12s %s\n' "$t" "$took" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" "${corpus:-?}" "$result"
done
if [ "$failed" != 0 ]; then
  for t in "${targets[@]}"; do
    read -r rc _ <"$work/logs/$t.result" || rc=99
    if [ "$rc" != 0 ]; then
      echo "==== $t: last lines of $work/logs/$t.log" >&2
      tail -40 "$work/logs/$t.log" >&2
    fi
  done
  exit 1
fi
