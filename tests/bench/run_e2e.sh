#!/usr/bin/env bash
# End-to-end load figures: starts an offload_server on a free 127.0.0.1 port (temp data dir,
# random OFFLOAD_KEK), runs offload_load workloads against it, stops it, prints a markdown table.
#
#   tests/bench/run_e2e.sh                       # build build-bench (Release) and run everything
#   tests/bench/run_e2e.sh --build_dir build-bench --duration 5
#   tests/bench/run_e2e.sh --build_dir build-bench --only memo   # BatchVerify(64) warm vs cold
#   tests/bench/run_e2e.sh --build_dir build-bench --smoke       # ctest bench-smoke: 2 s runs
#
# The load generator runs on the same machine as the server and takes CPU from it: items/s is
# a loopback figure, server CPU per item (from /proc/<pid>/stat) is the steadier one. Nothing is
# asserted about timing; --smoke only requires that each run completed items with zero errors,
# every answer recomputed with libsodium (offload_load --check).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build_dir=""
duration=5
warmup=1
smoke=0
only=all
memo_off=1
server_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build_dir) build_dir="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --smoke) smoke=1; shift ;;
    --only) only="$2"; shift 2 ;;           # all | memo | open
    --no_memo_off) memo_off=0; shift ;;     # skip the --memo=false baseline server
    --server_arg) server_args+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

if [[ -z "$build_dir" ]]; then
  build_dir="$root/build-bench"
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build_dir" --target offload_server offload_load >/dev/null
fi
server_bin="$build_dir/bin/offload_server"
load_bin="$build_dir/bin/offload_load"
for b in "$server_bin" "$load_bin"; do
  [[ -x "$b" ]] || { echo "missing $b (build the offload_server and offload_load targets)" >&2; exit 2; }
done

work="$(mktemp -d /tmp/offload-bench-XXXXXX)"
server_pid=""
stop_server() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=""
}
cleanup() { stop_server; rm -rf "$work"; }
trap cleanup EXIT

port=""
# start_server NAME [extra flags...]: a fresh data dir per server.
start_server() {
  local name="$1"; shift
  local dir="$work/$name"
  mkdir -p "$dir"
  # gRPC on a port the server picks (read from its log), HTTP and metrics off (nothing here uses
  # them): no port can collide with another test's.
  local extra=(--http_address= --metrics_address=)
  OFFLOAD_KEK="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" \
    "$server_bin" --grpc_address=127.0.0.1:0 --data_dir="$dir" "${extra[@]}" \
    "${server_args[@]}" "$@" >"$dir/server.log" 2>&1 &
  server_pid=$!
  local give_up=$((SECONDS + 60))  # an ASan server on a busy machine
  while ((SECONDS < give_up)); do
    if grep -q '"server_started"' "$dir/server.log" 2>/dev/null; then break; fi
    kill -0 "$server_pid" 2>/dev/null || { cat "$dir/server.log" >&2; exit 1; }
    sleep 0.1
  done
  port="$(grep -o '"grpc_port":[0-9]*' "$dir/server.log" | head -1 | cut -d: -f2)"
  [[ -n "$port" ]] || { echo "server did not start" >&2; cat "$dir/server.log" >&2; exit 1; }
}

rows=()
failed=0
# run LABEL [offload_load flags...]: one workload, its summary on stderr, its row kept.
run() {
  local label="$1"; shift
  local out
  if out="$("$load_bin" --server="127.0.0.1:$port" --server_pid="$server_pid" \
              --duration="$duration" --warmup="$warmup" --label="$label" "$@" 2>&1)"; then :; else
    failed=1
    echo "FAILED: $label" >&2
  fi
  sed 's/^/  /' <<<"$out" | grep -v '^  |' >&2
  rows+=("$(tail -1 <<<"$out")")
}

items_per_s() {  # items/s column of the row whose label is $1
  local r
  for r in "${rows[@]}"; do
    if [[ "$(cut -d'|' -f2 <<<"$r" | sed 's/^ *//;s/ *$//')" == "$1" ]]; then
      cut -d'|' -f3 <<<"$r" | tr -d ' '
      return
    fi
  done
}

print_table() {
  echo "| workload | items/s | calls/s | p50 ms | p99 ms | p999 ms | memo hit | errors | server CPU us/item |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); $(uptime | sed 's/^ *//')" >&2
echo "server: $server_bin; load: $load_bin; duration ${duration}s, warm-up ${warmup}s" >&2

if [[ $smoke == 1 ]]; then
  start_server smoke
  # --check: every answer recomputed with libsodium (invalid signatures among the verify items).
  run "BatchVerify(8) warm" --workload=batch_verify --batch=8 --mode=warm --inflight=4 --check
  run "BatchDerive(8) cold" --workload=batch_derive --batch=8 --mode=cold --inflight=4 --check
  stop_server
  print_table
  exit $failed
fi

start_server memo-on
if [[ "$only" == all || "$only" == memo ]]; then
run "BatchVerify(64) cold" --workload=batch_verify --batch=64 --mode=cold
run "BatchVerify(64) warm" --workload=batch_verify --batch=64 --mode=warm --warm_set=64
fi
if [[ "$only" == all ]]; then
  run "Verify cold" --workload=verify --mode=cold --cold_items=60000
  run "Verify warm" --workload=verify --mode=warm
  for b in 1 8 256; do
    run "BatchVerify($b) cold" --workload=batch_verify --batch=$b --mode=cold
    run "BatchVerify($b) warm" --workload=batch_verify --batch=$b --mode=warm --warm_set=$((b > 64 ? b : 64))
  done
  run "Derive cold" --workload=derive --mode=cold
  run "Derive warm" --workload=derive --mode=warm
  run "BatchDerive(64) cold" --workload=batch_derive --batch=64 --mode=cold
  run "BatchDerive(64) warm" --workload=batch_derive --batch=64 --mode=warm
fi
if [[ "$only" == all || "$only" == open ]]; then
  # Warm sets: 64 envelopes of 1 KB; 16 of 55 KB (1.8 MB). 64 of 55 KB (7.2 MB) is below the
  # 8 MB per-key bound but above what its 4 shards of 2 MB hold for an uneven hash split: it
  # shows how a hot set near the bound thrashes.
  for size in 1024 56320; do
    warm_set=$((size > 4096 ? 16 : 64))
    run "Open $size B cold" --workload=open --size=$size --mode=cold
    run "Open $size B warm($warm_set)" --workload=open --size=$size --mode=warm --warm_set=$warm_set
    run "BatchOpen(16) $size B cold" --workload=batch_open --batch=16 --size=$size --mode=cold
    run "BatchOpen(16) $size B warm($warm_set)" --workload=batch_open --batch=16 --size=$size \
        --mode=warm --warm_set=$warm_set
  done
  run "Open 56320 B warm(64)" --workload=open --size=56320 --mode=warm --warm_set=64
fi
stop_server

if [[ $memo_off == 1 ]]; then
  start_server memo-off --memo=false
  if [[ "$only" == all || "$only" == memo ]]; then
    run "BatchVerify(64) memo off" --workload=batch_verify --batch=64 --mode=warm --warm_set=64
  fi
  if [[ "$only" == all ]]; then
    run "BatchDerive(64) memo off" --workload=batch_derive --batch=64 --mode=warm
  fi
  if [[ "$only" == all || "$only" == open ]]; then
    run "Open 1024 B memo off" --workload=open --size=1024 --mode=warm
    run "Open 56320 B memo off" --workload=open --size=56320 --mode=warm --warm_set=16
  fi
  stop_server
fi

print_table
cold="$(items_per_s "BatchVerify(64) cold")"
warm="$(items_per_s "BatchVerify(64) warm")"
if [[ -n "$cold" && -n "$warm" && "$cold" != 0 ]]; then
  echo
  echo "BatchVerify(64): 64 repeated items $warm items/s vs 64 fresh items $cold items/s:" \
       "ratio $(awk -v w="$warm" -v c="$cold" 'BEGIN { printf "%.1fx", w / c }')"
fi
exit $failed
