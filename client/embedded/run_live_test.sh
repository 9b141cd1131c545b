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
TMP=$(mktemp -d)
SERVER_PID=
cleanup() {
  if [[ -n $SERVER_PID ]]; then kill -9 "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

if ! "$SERVER" --helpfull 2>&1 | grep -q -- "http_address"; then
  echo "SKIP: $SERVER has no --http_address flag (the Connect gateway, service/http, is not built in)"
  exit 77
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# The ports are free when picked, not reserved: a test running beside this one may take one
# first, and the server then exits with "cannot listen on". Then: fresh ports, 3 tries in all.
mkdir -p "$TMP/data"
KEK=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
ready=0
for attempt in 1 2 3; do
  GRPC=$(free_port); HTTP=$(free_port); METRICS=$(free_port)
  OFFLOAD_KEK=$KEK "$SERVER" --grpc_address=127.0.0.1:$GRPC --http_address=127.0.0.1:$HTTP \
    --metrics_address=127.0.0.1:$METRICS --data_dir="$TMP/data" >"$TMP/server.log" 2>&1 &
  SERVER_PID=$!
  S=(--server=127.0.0.1:$GRPC --timeout=30s)
  give_up=$((SECONDS + 60))  # an ASan server on a busy machine
  while ((SECONDS < give_up)); do
    # Its own server_started line first: on a port taken by another test's server, that one
    # would answer the probes.
    if grep -q '"server_started"' "$TMP/server.log" &&
       "$CTL" "${S[@]}" --timeout=2s keys list >/dev/null 2>&1 &&
       (exec 3<>/dev/tcp/127.0.0.1/$HTTP) 2>/dev/null; then
      ready=1; break
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  ((ready)) && break
  kill -9 "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=
  grep -q "cannot listen on" "$TMP/server.log" || break
  echo "attempt $attempt: a port was taken ($(grep -o 'cannot listen on [^"]*' "$TMP/server.log")), trying fresh ports"
done
if [[ $ready -ne 1 ]]; then
  echo "FAIL: server did not come up on gRPC $GRPC / HTTP $HTTP"; cat "$TMP/server.log"; exit 1
fi

"$CTL" "${S[@]}" keys create --type=x25519 dev1 >/dev/null || { echo "FAIL: keys create"; exit 1; }
"$CTL" "${S[@]}" keys get dev1 >"$TMP/key" || { echo "FAIL: keys get"; exit 1; }
PK=$(sed -n 's/.*public_key: *\([0-9a-f]\{64\}\).*/\1/p' "$TMP/key" | head -1)
if [[ ${#PK} -ne 64 ]]; then echo "FAIL: no public key in:"; cat "$TMP/key"; exit 1; fi
echo "server: gRPC $GRPC, HTTP $HTTP; key dev1 public $PK"

failures=0
# The ordinary build first, then the no-heap one on a fresh key so its first derive is a miss.
"$TEST" "$HTTP" dev1 "$PK" || failures=$((failures + 1))
"$CTL" "${S[@]}" keys create --type=x25519 dev2 >/dev/null || { echo "FAIL: keys create dev2"; exit 1; }
PK2=$("$CTL" "${S[@]}" keys get dev2 | sed -n 's/.*public_key: *\([0-9a-f]\{64\}\).*/\1/p' | head -1)
"$NOHEAP" "$HTTP" dev2 "$PK2" || failures=$((failures + 1))

kill -TERM "$SERVER_PID"
wait "$SERVER_PID"; rc=$?
SERVER_PID=
if [[ $rc -ne 0 ]]; then
  echo "FAIL: server exit $rc after SIGTERM"; tail -20 "$TMP/server.log"; failures=$((failures + 1))
else
  echo "ok: server exit 0 after SIGTERM"
fi
if [[ $failures -ne 0 ]]; then
  echo "server log (tail):"; tail -30 "$TMP/server.log"
fi
exit $((failures == 0 ? 0 : 1))
