#!/usr/bin/env bash
# Runs ctest in a sanitizer build folder and fails if any process wrote a sanitizer report.
# Usage: tests/sanitizers/run_sanitizer_ctest.sh <build dir> [ctest arguments...]
#
# Every process the tests start (unit tests, offloadctl, the servers that tests/e2e launches)
# inherits these options and writes any ASan/UBSan/LSan/TSan report to <build dir>/sanitizer-logs
# instead of a stderr that a test may not look at. So a report fails the run even when the
# process that made it was killed, or its exit code was not checked.
set -euo pipefail
build=${1:?usage: run_sanitizer_ctest.sh <build dir> [ctest arguments...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
logs=$(cd "$build" && pwd)/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"

export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1"
# Tests in a thread build set their own TSAN_OPTIONS (tests/sanitizers/CMakeLists.txt); this is
# for anything else the run starts.
export TSAN_OPTIONS="log_path=$logs/tsan:exitcode=66:second_deadlock_stack=1"

status=0
ctest --test-dir "$build" --output-on-failure "$@" || status=$?

reports=$(find "$logs" -type f | sort)
if [ -n "$reports" ]; then
  for f in $reports; do
    echo "==== sanitizer report: $f" >&2
    cat "$f" >&2
  done
  echo "run_sanitizer_ctest: $(echo "$reports" | wc -l) sanitizer report(s) in $logs" >&2
  status=1
fi
exit $status
