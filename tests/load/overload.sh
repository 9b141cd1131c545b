#!/usr/bin/env bash
# Overload: what a real Release offload_server does when offered 4x what it can serve.
#   1. capacity: closed loop (--inflight calls outstanding) for --capacity_seconds; the accepted
#      calls/s and ok items/s of that run are "normal";
#   2. overload: open loop at --factor (4) x capacity calls/s for --seconds (30), whatever the
#      answers; prints accepted throughput, the RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED shares,
#      p99 of accepted calls, server RSS (peak VmHWM and the highest 1 s sample);
#   3. recovery: the offered load stops (its calls still out) and a closed-loop probe with the same
#      --inflight measures how long until its throughput is back to --recovery_fraction (80%) of
#      normal, in 1 s windows.
# With --pause_seconds S, the server is stopped (SIGSTOP) for S seconds --pause_at seconds into the
# overload phase and then continued (SIGCONT), as a long stall (a noisy neighbour, a debugger)
# would: the offered load keeps coming meanwhile. With --rss_bound_mib M the run fails if the
# server's peak RSS (VmHWM) reached M MiB: memory must stay bounded whatever the server's pace.
# Traffic (tests/load/offload_mixed_load): BatchVerify/BatchDerive/BatchOpen calls of --batch (32)
# items, 20% warm (memo hits), the rest fresh from a pool bigger than the server's (small) memo
# bounds (misses), 1% bad items. Batches of mostly misses let one generator on the same machine
# offer 4x what the server computes: the generator spends a few us per item, the server tens.
# --cpus split (the default on 2 or more cores): the server runs on the first half of the cores
# and the generator on the other half (taskset), as a server and its remote callers each have
# their own CPU: the callers cannot take the server's CPU, nor the server theirs, and capacity is
# what the server does on its half. --cpus shared: both on all cores, the server at nice
# --server_nice (10) so that the generator gets the CPU it needs to keep offering the load; there
# the generator competes with the server for the same cores (see tests/load/README.md, "Memory
# while the server stalls", for what that does to gRPC 1.51). Nothing is asserted but
# correctness (every answer is checked, any unexpected outcome fails the run: exit 1) and, with
# --rss_bound_mib, the server's peak RSS.
#
#   tests/load/overload.sh                                  # builds ./build (Release) if needed
#   tests/load/overload.sh --build_dir build --seconds 30 --factor 4
#   tests/load/overload.sh --server_arg=--max_queued_items=4096 --server_arg=--max_client_inflight=64
#   tests/load/overload.sh --sized --pause_at 10 --pause_seconds 1.5 --rss_bound_mib 64   # the stall run
#   tests/load/overload.sh --cpus shared --sized --pause_seconds 1.5 --rss_bound_mib 64     # same cores
#
# --sized is the configuration sized for a 2-core machine whose bound tests/load/README.md
# states: --max_queued_items=2048 --max_client_inflight=32 --grpc_max_concurrent_streams=32
# --http_memory_budget_bytes=16777216 (16 MiB of request bodies and unsent answers per port, all
# connections together) --max_message_bytes=8388608.
#
# Timing figures depend on the machine and on what else runs on it: they are printed, never
# asserted.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=tests/load/lib.sh
source "$here/lib.sh"

build_dir=""
factor=4
seconds=30
capacity_seconds=15
recovery_seconds=30
cpus=""
server_nice=""
senders=2
recovery_fraction=0.8
inflight=16
batch=32
warm_fraction=0.2
fresh_pool=30000
deadline_ms=2000
pause_at=10
pause_seconds=0
rss_bound_mib=0
server_args=()
load_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build_dir) build_dir="$2"; shift 2 ;;
    --factor) factor="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --capacity_seconds) capacity_seconds="$2"; shift 2 ;;
    --recovery_seconds) recovery_seconds="$2"; shift 2 ;;
    --recovery_fraction) recovery_fraction="$2"; shift 2 ;;
    --inflight) inflight="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --warm_fraction) warm_fraction="$2"; shift 2 ;;
    --fresh_pool) fresh_pool="$2"; shift 2 ;;
    --deadline_ms) deadline_ms="$2"; shift 2 ;;
    --cpus) cpus="$2"; shift 2 ;;
    --server_nice) server_nice="$2"; shift 2 ;;
    --senders) senders="$2"; shift 2 ;;
    --pause_at) pause_at="$2"; shift 2 ;;
    --pause_seconds) pause_seconds="$2"; shift 2 ;;
    --rss_bound_mib) rss_bound_mib="$2"; shift 2 ;;
    --sized) server_args+=(--max_queued_items=2048 --max_client_inflight=32
                           --grpc_max_concurrent_streams=32 --http_memory_budget_bytes=16777216
                           --max_message_bytes=8388608)
             shift ;;
    --server_arg=*) server_args+=("${1#--server_arg=}"); shift ;;
    --server_arg) server_args+=("$2"); shift 2 ;;
    --load_arg=*) load_args+=("${1#--load_arg=}"); shift ;;
    --load_arg) load_args+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,41p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[[ -n "$build_dir" ]] || build_dir="$root/build"
# The cores this script may use (its affinity, which a container's cpuset limits), in order.
read -r -a allowed <<<"$(/usr/bin/python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
ncpu=${#allowed[@]}
if [[ -z "$cpus" ]]; then
  if (( ncpu >= 2 )); then cpus=split; else cpus=shared; fi
fi
load_pin=()
case "$cpus" in
  split)
    (( ncpu >= 2 )) || { echo "--cpus split needs 2 or more cores ($ncpu here)" >&2; exit 2; }
    half=$(( ncpu / 2 ))
    server_cpus="$(IFS=,; echo "${allowed[*]:0:half}")"
    load_pin=(taskset -c "$(IFS=,; echo "${allowed[*]:half}")")
    server_nice="${server_nice:-0}" ;;
  shared) server_nice="${server_nice:-10}" ;;
  *) echo "--cpus: split or shared, not '$cpus'" >&2; exit 2 ;;
esac
ensure_build "$build_dir"
server_bin="$build_dir/bin/offload_server"
load_bin="$build_dir/bin/offload_mixed_load"

work="$(mktemp -d /tmp/offload-overload-XXXXXX)"
load_pid=""
cleanup() {
  if [[ -n "$load_pid" ]]; then kill -INT "$load_pid" 2>/dev/null || true; wait "$load_pid" 2>/dev/null || true; fi
  if [[ -n "$server_pid" ]]; then kill -CONT "$server_pid" 2>/dev/null || true; fi
  stop_server
  rm -rf "$work"
}
trap cleanup EXIT

echo "overload: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
# Small memo bounds: the fresh pool (3 x $fresh_pool items) cycles through them and misses.
start_server "$work/server" --memo_verify_bytes=1048576 --memo_derive_bytes=1048576 \
  --memo_open_bytes_per_key=1048576 "${server_args[@]}"
echo "overload: server pid $server_pid (nice $server_nice, cpus ${server_cpus:-all}; generator cpus ${load_pin[2]:-all}), gRPC 127.0.0.1:$grpc_port; server flags: ${server_args[*]:-(defaults)}"

common=(--server="127.0.0.1:$grpc_port" --server_pid="$server_pid" --batch="$batch"
        --warm_fraction="$warm_fraction" --fresh_pool="$fresh_pool" --deadline_ms="$deadline_ms"
        "${load_args[@]}")
failed=0

echo "overload: 1. capacity: closed loop, $inflight calls of $batch items in flight, ${capacity_seconds} s"
if ! "${load_pin[@]}" "$load_bin" "${common[@]}" --mode=closed --inflight="$inflight" \
     --duration="$capacity_seconds" --warmup=3 --report_every=5 >"$work/capacity.out"; then
  failed=1
fi
sed 's/^/  /' "$work/capacity.out"
cap="$(grep '^summary ' "$work/capacity.out" || true)"
cap_calls="$(field calls_per_s "$cap")"
cap_items="$(field ok_per_s "$cap")"
if [[ -z "$cap_calls" ]] || ! awk -v c="$cap_calls" 'BEGIN { exit !(c > 0) }'; then
  echo "overload: no capacity measured" >&2
  exit 1
fi
rate="$(awk -v c="$cap_calls" -v f="$factor" 'BEGIN { printf "%.0f", c * f }')"

echo "overload: 2. ${factor}x capacity: open loop, $rate calls/s for ${seconds} s; 3. recovery probe ${recovery_seconds} s"
"${load_pin[@]}" "$load_bin" "${common[@]}" --mode=open --rate="$rate" --duration="$seconds" \
  --report_every=2 --deadline_exceeded_ok --max_outstanding=1000000 --senders="$senders" \
  --recovery_seconds="$recovery_seconds" --recovery_inflight="$inflight" \
  --normal_ok_per_s="$cap_items" --recovery_fraction="$recovery_fraction" \
  >"$work/overload.out" &
load_pid=$!
paused=""
if awk -v p="$pause_seconds" 'BEGIN { exit !(p > 0) }'; then
  # The generator's first interval line comes 2 s after its load starts (priming done).
  while kill -0 "$load_pid" 2>/dev/null && ! grep -q '^interval ' "$work/overload.out"; do
    sleep 0.1
  done
  sleep "$(awk -v a="$pause_at" 'BEGIN { print (a > 2) ? a - 2 : 0 }')"
  if kill -0 "$load_pid" 2>/dev/null; then
    rss_before_pause="$(awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$server_pid/status")"
    kill -STOP "$server_pid"
    sleep "$pause_seconds"
    kill -CONT "$server_pid"
    paused="${pause_seconds} s at ${pause_at} s into the overload (server RSS ${rss_before_pause} MiB before)"
    echo "overload: server paused (SIGSTOP) for $paused"
  fi
fi
wait "$load_pid" || failed=1
load_pid=""
sed 's/^/  /' "$work/overload.out"
over="$(grep '^summary ' "$work/overload.out" || true)"
echo "overload: server counters after the run (calls by code; drops, where the server counts them):"
metrics_lines '^offload_dropped_total|^offload_http_abuse_total|^offload_requests_total\{.*code="(RESOURCE_EXHAUSTED|DEADLINE_EXCEEDED|CANCELLED)"' |
  awk '$2 != 0 { print "  " $1 " " $2 }' | sort
rec="$(grep '^recovery ' "$work/overload.out" || true)"
hwm="$(field server_hwm_mib "$over")"
stop_server

echo
echo "| figure | value |"
echo "| --- | ---: |"
echo "| capacity (closed loop, $inflight x $batch items in flight) | $cap_calls calls/s, $cap_items items/s, p99 $(field p99_ms "$cap") ms |"
echo "| offered (${factor}x capacity) | $rate calls/s asked, $(field sent_per_s "$over") calls/s sent |"
echo "| accepted during overload | $(field calls_per_s "$over") calls/s, $(field ok_per_s "$over") ok items/s |"
echo "| RESOURCE_EXHAUSTED share (items) | $(field exhausted_share "$over") (p99 of those answers $(field exhausted_p99_ms "$over") ms) |"
echo "| DEADLINE_EXCEEDED share (items) | $(field deadline_share "$over") (deadline ${deadline_ms} ms) |"
echo "| p50 / p99 of accepted calls | $(field p50_ms "$over") / $(field p99_ms "$over") ms |"
echo "| server RSS: start, highest 1 s sample, peak (VmHWM) | $(field rss_start_mib "$over") / $(field rss_max_mib "$over") / $hwm MiB |"
echo "| calls outstanding when the load stopped | $(field backlog_at_stop "$rec") |"
recovered="$(field recovered_after_s "$rec")"
[[ "$recovered" == never ]] && recovered="not within ${recovery_seconds}"
echo "| back to ${recovery_fraction} x normal after the load stopped | $recovered s |"
echo "| unexpected outcomes | $(field unexpected "$cap") + $(field unexpected "$over") |"
[[ -z "$paused" ]] || echo "| server paused (SIGSTOP / SIGCONT) | $paused |"
if awk -v b="$rss_bound_mib" 'BEGIN { exit !(b > 0) }'; then
  if [[ -z "$hwm" ]] || awk -v h="$hwm" -v b="$rss_bound_mib" 'BEGIN { exit !(h >= b) }'; then
    echo "overload: FAIL: server peak RSS (VmHWM) ${hwm:-unknown} MiB, bound $rss_bound_mib MiB" >&2
    failed=1
  else
    echo "overload: server peak RSS (VmHWM) $hwm MiB < bound $rss_bound_mib MiB"
  fi
fi
exit $failed
