#!/usr/bin/env bash
# The embedded client against a live offload_server:
#   run_live_test.sh OFFLOAD_SERVER OFFLOADCTL EMBEDDED_TEST EMBEDDED_NOHEAP_TEST
# Starts the server on free loopback ports (gRPC, HTTP/Connect, metrics) with a temporary data dir,
# creates an X25519 key with offloadctl, runs both test binaries (the second with the heap
# forbidden during client calls), then stops the server with SIGTERM and expects exit 0.
# Exits 77 (ctest: skipped) when the server has no --http_address flag (no Connect gateway yet).
set -u
SERVER=${1:?usage: run_live_test.sh OFFLOAD_SERVER OFFLOADCTL EMBEDDED_TEST EMBEDDED_NOHEAP_TEST}
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
S=(--server="127.0.0.1:$GRPC" --timeout=30s)

public_key() {
  "$CTL" "${S[@]}" keys get "$1" | sed -n 's/.*public_key: *\([0-9a-f]\{64\}\).*/\1/p' | head -1
}
"$CTL" "${S[@]}" keys create --type=x25519 dev1 >/dev/null || { echo "FAIL: keys create"; exit 1; }
PK=$(public_key dev1)
if [[ ${#PK} -ne 64 ]]; then echo "FAIL: no public key for dev1"; "$CTL" "${S[@]}" keys get dev1; exit 1; fi
echo "server: gRPC $GRPC, HTTP $HTTP; key dev1 public $PK"

failures=0
# The ordinary build first, then the no-heap one on a fresh key so its first derive is a miss.
"$TEST" "$HTTP" dev1 "$PK" || failures=$((failures + 1))
"$CTL" "${S[@]}" keys create --type=x25519 dev2 >/dev/null || { echo "FAIL: keys create dev2"; exit 1; }
"$NOHEAP" "$HTTP" dev2 "$(public_key dev2)" || failures=$((failures + 1))

stop_server || failures=$((failures + 1))
if [[ $failures -ne 0 ]]; then
  echo "server log (tail):"; tail -30 "$TMP/server.log"
fi
exit $((failures == 0 ? 0 : 1))
