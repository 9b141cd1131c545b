#!/usr/bin/env bash
# Soak: a real Release offload_server on free loopback ports under a fixed, sustainable mixed load
# (tests/load/offload_mixed_load: Verify, Derive and Open single calls, 80% warm inputs, 1% bad
# inputs) for --minutes; then checks
#   - zero unexpected outcomes (wrong answers, wrong error codes, memo hits for fresh inputs,
#     DEADLINE_EXCEEDED, any other error),
#   - under 1% of calls shed (RESOURCE_EXHAUSTED) or skipped: else the rate was not sustainable,
#   - server RSS growth from the end of warm-up to the end of the load under --max_rss_growth
#     (5%) or under --max_rss_growth_mib (4 MiB), whichever is larger: a 27 MiB server's arenas
#     and thread caches settle by a MiB or two without any leak, while a leak of even 20 bytes
#     per call adds 4 MiB over 200,000 calls.
# Warm-up is the first --warmup_fraction (20%) of the run. The server runs with small memo bounds
# (verify 128 KiB, derive 256 KiB, open 512 KiB) so that the fresh inputs fill every memo to its
# bound inside the warm-up (the memo bytes are printed at the warm-up point and near the end):
# after it, a growing RSS is a leak, not a cache filling up. The generator keeps at most
# --max_inflight (64) calls out, as a client with a concurrency limit would: on a shared machine
# the server can stall for a second or more, and an open loop would then pile up a thousand
# concurrent calls whose memory the allocator keeps afterwards - an RSS step that is not a leak.
# Calls due while 64 are out are skipped, counted, and fail the run past 1%.
#
# --calls N is the bounded-count form the test command runs (ctest soak.smoke): a closed loop of
# --inflight (16) calls until N calls were sent, with no rate and no deadline that a busy machine
# could miss (60 s deadlines); warm-up is the first --warmup_fraction of the calls, and smaller
# memo bounds (verify 64 KiB, derive 128 KiB, open 256 KiB) are full by then. It fails on any
# unexpected outcome, on any call shed (RESOURCE_EXHAUSTED: 16 calls in flight are under every
# bound) and on RSS growth; it never looks at a rate or a latency.
#
#   tests/load/soak.sh --minutes 30                  # builds ./build (Release) if needed
#   tests/load/soak.sh --calls 60000 --build_dir build   # what ctest's soak.smoke runs
#   tests/load/soak.sh --minutes 30 --rate 2000 --server_arg=--workers=2
#
# Exit status: 0 if every check passed, 1 otherwise, 2 for bad arguments or no Release build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=tests/load/lib.sh
source "$here/lib.sh"

minutes=30
rate=1000
build_dir=""
warmup_fraction=0.2
max_rss_growth=0.05
max_rss_growth_mib=4
report_every=10
max_inflight=64
calls=0
inflight=16
server_args=()
load_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --build_dir) build_dir="$2"; shift 2 ;;
    --warmup_fraction) warmup_fraction="$2"; shift 2 ;;
    --max_rss_growth) max_rss_growth="$2"; shift 2 ;;
    --max_rss_growth_mib) max_rss_growth_mib="$2"; shift 2 ;;
    --report_every) report_every="$2"; shift 2 ;;
    --max_inflight) max_inflight="$2"; shift 2 ;;
    --calls) calls="$2"; shift 2 ;;
    --inflight) inflight="$2"; shift 2 ;;
    --server_arg=*) server_args+=("${1#--server_arg=}"); shift ;;
    --server_arg) server_args+=("$2"); shift 2 ;;
    --load_arg=*) load_args+=("${1#--load_arg=}"); shift ;;
    --load_arg) load_args+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[[ -n "$build_dir" ]] || build_dir="$root/build"
ensure_build "$build_dir"
server_bin="$build_dir/bin/offload_server"
load_bin="$build_dir/bin/offload_mixed_load"

work="$(mktemp -d /tmp/offload-soak-XXXXXX)"
load_pid=""
cleanup() {
  if [[ -n "$load_pid" ]]; then kill -INT "$load_pid" 2>/dev/null || true; wait "$load_pid" 2>/dev/null || true; fi
  stop_server
  rm -rf "$work"
}
trap cleanup EXIT

seconds="$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')"
warm_at="$(awk -v s="$seconds" -v f="$warmup_fraction" 'BEGIN { printf "%.0f", s * f }')"
echo "soak: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
if (( calls > 0 )); then
  echo "soak: $calls calls, closed loop of $inflight; warm-up = first $warmup_fraction of them; server $server_bin"
  memo_bounds=(--memo_verify_bytes=65536 --memo_derive_bytes=131072
               --memo_open_bytes_per_key=262144 --memo_open_bytes_total=524288)
  load_mode=(--mode=closed --inflight="$inflight" --calls="$calls" --duration=0
             --deadline_ms=60000)
else
  echo "soak: ${minutes} min at ${rate} calls/s, at most $max_inflight in flight; warm-up = first ${warm_at} s; server $server_bin"
  memo_bounds=(--memo_verify_bytes=131072 --memo_derive_bytes=262144
               --memo_open_bytes_per_key=524288 --memo_open_bytes_total=1048576)
  load_mode=(--mode=open --rate="$rate" --duration="$seconds" --max_outstanding="$max_inflight")
fi

start_server "$work/server" "${memo_bounds[@]}" "${server_args[@]}"
echo "soak: server pid $server_pid, gRPC 127.0.0.1:$grpc_port, metrics 127.0.0.1:$metrics_port"

"$load_bin" --server="127.0.0.1:$grpc_port" --server_pid="$server_pid" "${load_mode[@]}" \
  --report_every="$report_every" \
  --rss_warmup_fraction="$warmup_fraction" "${load_args[@]}" >"$work/load.out" 2>"$work/load.err" &
load_pid=$!
tail -n +1 -f "$work/load.out" --pid="$load_pid" &
tail_pid=$!

memo_line() {  # memo bytes / capacity per cache, one line
  metrics_lines '^offload_memo_(bytes|capacity_bytes)\{' |
    sed -E 's/^offload_memo_([a-z_]+)\{[^}]*cache="([a-z]+)"[^}]*\} ([0-9.e+]+)/\2.\1=\3/' |
    sort | tr '\n' ' '
}
# The memo at the warm-up point and 3 s before the end (the generator deletes its keys, and so
# their memo entries, when it ends). Its clock starts after priming, a second or so after ours.
sleep_while_loading() {  # SECONDS: false if the generator ended first
  local end=$(( SECONDS + $1 ))
  while (( SECONDS < end )); do
    kill -0 "$load_pid" 2>/dev/null || return 1
    sleep 1
  done
}
if (( calls > 0 )); then
  # The generator prints "warm calls=..." at its warm-up point.
  while kill -0 "$load_pid" 2>/dev/null && ! grep -q '^warm ' "$work/load.out"; do sleep 0.2; done
  if grep -q '^warm ' "$work/load.out"; then echo "soak: memo at warm-up: $(memo_line)"; fi
elif sleep_while_loading "$warm_at"; then
  echo "soak: memo at warm-up: $(memo_line)"
  if (( seconds - warm_at > 6 )) && sleep_while_loading $(( seconds - warm_at - 3 )); then
    echo "soak: memo near the end: $(memo_line)"
  fi
fi

load_status=0
wait "$load_pid" || load_status=$?
load_pid=""
wait "$tail_pid" 2>/dev/null || true
cat "$work/load.err" >&2

summary="$(grep '^summary ' "$work/load.out" || true)"
if [[ -z "$summary" ]]; then
  echo "soak: FAIL: the generator printed no summary (exit $load_status)" >&2
  exit 1
fi
unexpected="$(field unexpected "$summary")"
exhausted_share="$(field exhausted_share "$summary")"
skipped="$(field skipped "$summary")"
sent="$(field sent "$summary")"
skipped_share="$(awk -v k="$skipped" -v s="$sent" 'BEGIN { printf "%.4f", (k + s > 0) ? k / (k + s) : 0 }')"
rss_warm="$(field rss_warm_mib "$summary")"
rss_end="$(field rss_end_mib "$summary")"
growth="$(field rss_growth_after_warmup "$summary")"
failed=0
if [[ "$load_status" != 0 || "$unexpected" != 0 ]]; then
  echo "soak: FAIL: $unexpected unexpected outcomes (generator exit $load_status)" >&2
  failed=1
fi
if (( calls > 0 )); then
  # A closed loop of $inflight calls is under every bound: a shed call is a bug, not load.
  if [[ "$(field exhausted "$summary")" != 0 ]]; then
    echo "soak: FAIL: $(field exhausted "$summary") calls shed (RESOURCE_EXHAUSTED) with $inflight in flight" >&2
    failed=1
  fi
elif awk -v s="$exhausted_share" -v k="$skipped_share" 'BEGIN { exit !(s >= 0.01 || k >= 0.01) }'; then
  echo "soak: FAIL: $exhausted_share of calls shed (RESOURCE_EXHAUSTED), $skipped_share skipped: ${rate} calls/s is not sustainable here" >&2
  failed=1
fi
if awk -v g="$growth" -v m="$max_rss_growth" -v w="$rss_warm" -v e="$rss_end" \
       -v mib="$max_rss_growth_mib" 'BEGIN { exit !(g >= m && e - w > mib) }'; then
  echo "soak: FAIL: server RSS grew $growth after warm-up ($rss_warm MiB -> $rss_end MiB), bound $max_rss_growth or $max_rss_growth_mib MiB" >&2
  failed=1
fi
echo "soak: ok_per_s=$(field ok_per_s "$summary") p50_ms=$(field p50_ms "$summary") p99_ms=$(field p99_ms "$summary") unexpected=$unexpected exhausted_share=$exhausted_share skipped_share=$skipped_share rss_after_warmup_mib=$rss_warm rss_end_mib=$rss_end rss_growth=$growth"
if [[ $failed == 0 ]]; then echo "soak: PASS"; fi
exit $failed
