#!/usr/bin/env bash
# Smoke test of the benchmark peer (ctest bench.peer_smoke): starts server.js in each
# configuration (key objects cached, keys parsed per call) on a free 127.0.0.1 port and runs
# offload_load --check against it for under a second per workload. --check recomputes every answer
# with libsodium (verify items include invalid signatures, X25519 results are compared with the
# shared secret, plaintexts byte for byte), so a peer that skipped the real work would fail.
# Nothing about timing is checked.
#
#   tests/bench/peer/smoke.sh <path to offload_load> [node]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
load="${1:?usage: smoke.sh <offload_load> [node]}"
node="${2:-node}"
[[ -d "$here/node_modules/@grpc/grpc-js" ]] || {
  echo "no $here/node_modules: run npm ci there (scripts/install-deps.sh does)" >&2; exit 2; }

work="$(mktemp -d /tmp/offload-peer-smoke-XXXXXX)"
peer_pid=""
stop_peer() {
  if [[ -n "$peer_pid" ]] && kill -0 "$peer_pid" 2>/dev/null; then
    kill -TERM "$peer_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$peer_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$peer_pid" 2>/dev/null || true
  fi
  wait "$peer_pid" 2>/dev/null || true
  peer_pid=""
}
trap 'stop_peer; rm -rf "$work"' EXIT

failed=0
passed=0
for mode in cached parse; do
  "$node" "$here/server.js" --mode="$mode" --address=127.0.0.1:0 >"$work/$mode.log" 2>&1 &
  peer_pid=$!
  port=""
  give_up=$((SECONDS + 60))  # Node and grpc-js load slowly on a busy machine (10 s once was not enough)
  while ((SECONDS < give_up)); do
    port="$(grep -o '"grpc_port":[0-9]*' "$work/$mode.log" 2>/dev/null | cut -d: -f2 || true)"
    [[ -n "$port" ]] && break
    kill -0 "$peer_pid" 2>/dev/null || break
    sleep 0.1
  done
  [[ -n "$port" ]] || { echo "peer ($mode) did not start:" >&2; cat "$work/$mode.log" >&2; exit 1; }
  echo "peer ($mode) on 127.0.0.1:$port: $(head -1 "$work/$mode.log")"
  while read -r name flags; do
    # shellcheck disable=SC2086
    if out="$("$load" --server="127.0.0.1:$port" --server_pid="$peer_pid" --check \
                --warmup=0.2 --duration=0.6 --cold_items=4000 --open_pool=64 --inflight=4 \
                --label="$mode $name" $flags 2>&1)"; then
      passed=$((passed + 1)); echo "ok   $mode $name"
    else
      failed=$((failed + 1)); echo "FAIL $mode $name"
    fi
    sed 's/^/     /' <<<"$out"
  done <<'EOF'
verify              --workload=verify --mode=cold
batch_verify(8)     --workload=batch_verify --batch=8 --mode=cold
derive              --workload=derive --mode=cold
batch_derive(8)     --workload=batch_derive --batch=8 --mode=cold
open_1k             --workload=open --aead=chacha20 --size=1024 --mode=cold
batch_open(4)_55k   --workload=batch_open --batch=4 --aead=chacha20 --size=56320 --mode=cold
EOF
  stop_peer
done
echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
