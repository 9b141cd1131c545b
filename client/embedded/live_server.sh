# shellcheck shell=bash
# live_server.sh - sourced by the live tests (run_live_test.sh, run_tls_live_test.sh): start
# offload_server on free loopback ports and stop it.
#
#   start_server SERVER DATA_DIR LOG [FLAG...]  starts SERVER with --grpc_address, --http_address,
#                                               --metrics_address on fresh loopback ports, the data
#                                               dir and the extra FLAGs, its output in LOG; waits
#                                               for its server_started line. Sets SERVER_PID, GRPC,
#                                               HTTP, METRICS. The caller exports OFFLOAD_KEK.
#   stop_server                                 SIGTERM; the server must exit 0.
#   kill_server                                 SIGKILL (for the EXIT trap).
# Both return non-zero (and print the log's tail) on failure.
SERVER_PID=

free_port() {
  # below the kernel's ephemeral range (tests/loopback_ports.py)
  PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../tests" && pwd)" \
    /usr/bin/python3 -c 'from loopback_ports import free_port; print(free_port())'
}

# The ports are free when picked, not reserved: a test running beside this one may take one
# first, and the server then exits with "cannot listen on". Then: fresh ports, 3 tries in all.
start_server() {
  local server=$1 data=$2 log=$3 attempt give_up ready=0
  shift 3
  for attempt in 1 2 3; do
    GRPC=$(free_port); HTTP=$(free_port); METRICS=$(free_port)
    "$server" --grpc_address="127.0.0.1:$GRPC" --http_address="127.0.0.1:$HTTP" \
      --metrics_address="127.0.0.1:$METRICS" --data_dir="$data" "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    give_up=$((SECONDS + 60))  # an ASan server on a busy machine
    while ((SECONDS < give_up)); do
      # Its own server_started line (logged once every port listens): on a port taken by
      # another test's server, that one would answer a probe.
      if grep -q '"server_started"' "$log" && (exec 3<>"/dev/tcp/127.0.0.1/$HTTP") 2>/dev/null; then
        ready=1; break
      fi
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.1
    done
    ((ready)) && return 0
    kill_server
    grep -q "cannot listen on" "$log" || break
    echo "attempt $attempt: a port was taken ($(grep -o 'cannot listen on [^"]*' "$log")), trying fresh ports"
  done
  echo "FAIL: server did not come up on gRPC $GRPC / HTTP $HTTP"; cat "$log"
  return 1
}

stop_server() {
  local rc
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID"; rc=$?
  SERVER_PID=
  if [[ $rc -ne 0 ]]; then echo "FAIL: server exit $rc after SIGTERM"; return 1; fi
  echo "ok: server exit 0 after SIGTERM"
}

kill_server() {
  if [[ -n $SERVER_PID ]]; then kill -9 "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
  SERVER_PID=
}
