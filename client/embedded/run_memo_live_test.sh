#!/usr/bin/env bash
# The embedded client's derive memo and box on the device against a live offload_server:
#   run_memo_live_test.sh OFFLOAD_SERVER OFFLOADCTL EMBEDDED_MEMO_TEST EMBEDDED_MEMO_NOHEAP_TEST
# Starts the server on free loopback ports (gRPC, HTTP/Connect, metrics) with a temporary data
# dir, runs both test binaries (the second with the heap forbidden during client calls), each on
# keys of its own that it makes and changes with offloadctl, counting the server's calls on its
# /metrics; then stops the server with SIGTERM and expects exit 0.
# Exits 77 (ctest: skipped) when the server has no --http_address flag (no Connect gateway).
set -u
SERVER=${1:?usage: run_memo_live_test.sh OFFLOAD_SERVER OFFLOADCTL EMBEDDED_MEMO_TEST EMBEDDED_MEMO_NOHEAP_TEST}
CTL=${2:?}; TEST=${3:?}; NOHEAP=${4:?}
source "$(dirname "$0")/live_server.sh"
TMP=$(mktemp -d)
trap 'kill_server; rm -rf "$TMP"' EXIT

if ! "$SERVER" --helpfull 2>&1 | grep -q -- "http_address"; then
  echo "SKIP: $SERVER has no --http_address flag (the Connect gateway, service/http, is not built in)"
  exit 77
fi

mkdir -p "$TMP/data"
OFFLOAD_KEK=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export OFFLOAD_KEK
start_server "$SERVER" "$TMP/data" "$TMP/server.log" || exit 1
echo "server: gRPC $GRPC, HTTP $HTTP, metrics $METRICS"

failures=0
"$TEST" "$HTTP" "$METRICS" "$GRPC" "$CTL" memo || failures=$((failures + 1))
"$NOHEAP" "$HTTP" "$METRICS" "$GRPC" "$CTL" noheap || failures=$((failures + 1))

stop_server || failures=$((failures + 1))
if [[ $failures -ne 0 ]]; then
  echo "server log (tail):"; tail -30 "$TMP/server.log"
fi
exit $((failures == 0 ? 0 : 1))
