#!/usr/bin/env bash
# A/B runs of one server binary under offload_load, one line per workload (tests/bench/README.md,
# "Changes of 2026-11-30"). Starts the server on free loopback ports with a temp data dir, runs
# each workload against it, prints items/s, server and generator CPU per item, p50/p99, errors.
#
#   tests/bench/ab.sh <offload_server> <offload_load> <seconds> "<offload_load flags>" ...
#   SERVER_ARGS="--memo=false" tests/bench/ab.sh build-bench/bin/offload_server \
#       build-bench/bin/offload_load 4 "--workload=batch_verify --batch=64 --mode=warm"
#
# Alternate two binaries (before, after, before, after) to see a change through the noise.
set -u
if [[ $# -lt 4 ]]; then sed -n '2,9p' "$0"; exit 2; fi
server="$1"; load="$2"; seconds="$3"; shift 3
work="$(mktemp -d /tmp/offload-ab-XXXXXX)"
free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
port="$(free_port)"
# shellcheck disable=SC2086  # SERVER_ARGS is a list of flags
"$server" --grpc_address="127.0.0.1:$port" --http_address="127.0.0.1:$(free_port)" \
  --metrics_address="127.0.0.1:$(free_port)" --data_dir="$work" ${SERVER_ARGS:-} >"$work/log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
for flags in "$@"; do
  # shellcheck disable=SC2086  # one string of flags per workload
  out="$("$load" --server="127.0.0.1:$port" --server_pid="$pid" --duration="$seconds" --warmup=1 \
    $flags 2>&1)"
  echo "$flags | $(grep -o '[0-9]* items/s' <<<"$out" | head -1)" \
    "| $(grep -o 'server CPU [0-9.]* us/item' <<<"$out" | head -1)" \
    "| $(grep -o 'load generator CPU [0-9.]* us/item' <<<"$out" | head -1)" \
    "| $(grep -o 'p50 [0-9.]* ms, p99 [0-9.]* ms' <<<"$out" | head -1)" \
    "| $(grep -o 'errors [0-9]*' <<<"$out" | head -1)"
done
