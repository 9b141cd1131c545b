# Shared by tests/load/soak.sh and tests/load/overload.sh (sourced, not run): finding the
# binaries, starting and stopping a real offload_server on free loopback ports with a temporary
# data dir and a random key-encryption key, reading its /metrics, parsing the generator's lines.
# Expects: set -euo pipefail, and $root (the repository root) set by the caller.

# ensure_build DIR: configures DIR as a Release build if it is not one yet and builds the server
# and the generator. Refuses a build folder of another type: figures are for Release only.
ensure_build() {
  local dir="$1"
  if [[ ! -f "$dir/CMakeCache.txt" ]]; then
    local launcher=()
    if command -v ccache >/dev/null; then
      launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    fi
    cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
  fi
  local type
  type="$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$dir/CMakeCache.txt")"
  local sanitizer
  sanitizer="$(sed -n 's/^OFFLOAD_SANITIZER:[A-Z]*=//p' "$dir/CMakeCache.txt")"
  if [[ "$type" != Release || -n "$sanitizer" ]]; then
    echo "$dir is a '$type' build (sanitizer '$sanitizer'): load figures need a plain Release build" >&2
    exit 2
  fi
  cmake --build "$dir" --target offload_server offload_mixed_load >/dev/null
}

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

server_pid=""
server_cpus="${server_cpus:-}"
grpc_port=""
metrics_port=""
server_log=""

# start_server DIR [server flags...]: a server with its data in DIR (created), gRPC on a free
# port (the server picks it: --grpc_address=127.0.0.1:0), metrics on a free port, HTTP off; at
# nice level $server_nice (default 0), on the cores $server_cpus if set (taskset -c, else all).
# $server_pid is the server itself (taskset and nice exec it). The metrics port is free when
# picked, not reserved: if another process takes it first ("cannot listen on"), a fresh one is
# tried, 3 times in all.
start_server() {
  local dir="$1"; shift
  mkdir -p "$dir"
  server_log="$dir/server.log"
  local kek attempt
  kek="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
  for attempt in 1 2 3; do
    metrics_port="$(free_port)"
    OFFLOAD_KEK="$kek" \
      ${server_cpus:+taskset -c "$server_cpus"} nice -n "${server_nice:-0}" "$server_bin" --grpc_address=127.0.0.1:0 --http_address= \
      --metrics_address="127.0.0.1:$metrics_port" --data_dir="$dir" "$@" >"$server_log" 2>&1 &
    server_pid=$!
    for _ in $(seq 600); do  # 60 s
      if grep -q '"server_started"' "$server_log" 2>/dev/null; then break; fi
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.1
    done
    grep -q '"server_started"' "$server_log" 2>/dev/null && break
    if kill -0 "$server_pid" 2>/dev/null || ! grep -q "cannot listen on" "$server_log" || ((attempt == 3)); then
      cat "$server_log" >&2; echo "server did not start" >&2; exit 1
    fi
    wait "$server_pid" 2>/dev/null || true
    echo "start_server: metrics port $metrics_port was taken, trying another" >&2
  done
  grpc_port="$(grep -o '"grpc_port":[0-9]*' "$server_log" | head -1 | cut -d: -f2)"
  [[ -n "$grpc_port" ]] || { cat "$server_log" >&2; echo "server did not start" >&2; exit 1; }
}

stop_server() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  [[ -z "$server_pid" ]] || wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

# metrics_lines REGEX: the server's /metrics lines matching REGEX (empty if unreachable).
metrics_lines() {
  /usr/bin/python3 - "$metrics_port" "$1" <<'PY' || true
import re, sys, urllib.request
port, pattern = sys.argv[1], re.compile(sys.argv[2])
try:
    text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=5).read().decode()
except OSError:
    sys.exit(0)
for line in text.splitlines():
    if not line.startswith("#") and pattern.search(line):
        print(line)
PY
}

# field NAME LINE: the value of NAME=value in a generator line.
field() {
  tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p" | head -1
}
