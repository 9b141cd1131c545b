#!/usr/bin/env bash
# offloadctl's command-line contract.
#   offloadctl_test.sh OFFLOADCTL                 help, usage errors (exit 64), unreachable server (2)
#   offloadctl_test.sh OFFLOADCTL OFFLOAD_SERVER  the same, then the README tour against a server
#                                                 started on a free port with a temporary data dir
#   offloadctl_test.sh OFFLOADCTL OFFLOAD_SERVER http
#                                                 the tour over the server's HTTP port, which
#                                                 speaks gRPC on our own engine (issue 24)
set -u
CTL=${1:?usage: offloadctl_test.sh OFFLOADCTL [OFFLOAD_SERVER [grpc|http]]}
SERVER_BIN=${2:-}
PORT_KIND=${3:-grpc}
failures=0
TMP=$(mktemp -d)
SERVER_PID=
cleanup() {
  if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

# expect CODE STDERR_SUBSTRING -- ARGS...: runs the CLI, checks exit code and stderr.
expect() {
  local want=$1 pattern=$2
  shift 3
  "$CTL" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
  local got=$?
  if [[ $got -ne $want ]] || ! grep -qF -- "$pattern" "$TMP/err"; then
    echo "FAIL: offloadctl $* -> exit $got (want $want), stderr:"; sed 's/^/  /' "$TMP/err"
    failures=$((failures + 1))
  else
    echo "ok: offloadctl $* -> $got"
  fi
}

# --- without a server ----------------------------------------------------------------------
"$CTL" help >"$TMP/help" || { echo "FAIL: help exit $?"; failures=$((failures + 1)); }
for cmd in "keys create" "keys import" "keys list" "keys get" "keys rotate" "keys delete" \
           sign verify derive box-seal box-open seal open; do
  grep -q "^  $cmd" "$TMP/help" || { echo "FAIL: help lacks '$cmd'"; failures=$((failures + 1)); }
done
"$CTL" >/dev/null || { echo "FAIL: no args should print usage and exit 0"; failures=$((failures + 1)); }
"$CTL" --help | grep -q "subcommands:" || { echo "FAIL: --help"; failures=$((failures + 1)); }

expect 64 "error: INVALID_ARGUMENT: unknown subcommand 'frob'" -- frob
expect 64 "expected 'keys create|import|list|get|rotate|delete'" -- keys destroy x
expect 64 "unknown flag --mesage" -- sign k --mesage=hi
expect 64 "bad value 'soon' for flag --timeout" -- --timeout=soon keys list
expect 64 "flag --peer_hex does not apply to 'sign'" -- sign k --peer_hex=00 --message=x
expect 64 "'keys get' expects ID, got 0" -- keys get
expect 64 "missing --type" -- keys create k
expect 64 "--type: expected ed25519" -- keys create k --type=rsa
expect 64 "--public_key_hex: expected hex digits, got 'g'" -- verify --public_key_hex=0g \
  --signature_hex=00 --message=x
expect 64 "--signature_hex: expected an even number of hex digits, got 3" -- verify \
  --public_key_hex=00 --signature_hex=abc --message=x
expect 64 "expected at most one of --message, --message_hex, --message_file" -- sign k \
  --message=a --message_hex=61
expect 64 "missing secret: give one of --secret_hex, --secret_file" -- keys import k --type=x25519
expect 64 "cannot open" -- open k --envelope_file="$TMP/nope"
# Port 1 on loopback has no listener: the channel fails, which is an RPC error.
expect 2 "error: UNAVAILABLE:" -- --server=127.0.0.1:1 --timeout=3s keys list

# --- against a live server -------------------------------------------------------------------
if [[ -n $SERVER_BIN ]]; then
  # Ports the server picks (read from its log), metrics off: nothing here can collide with
  # another test's ports. The tour goes to the gRPC port, or to the HTTP port (gRPC on the engine).
  mkdir -p "$TMP/data"
  http=
  [[ $PORT_KIND == http ]] && http=127.0.0.1:0
  OFFLOAD_KEK=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n') \
    "$SERVER_BIN" --grpc_address=127.0.0.1:0 --http_address="$http" --metrics_address= \
    --data_dir="$TMP/data" >"$TMP/server.log" 2>&1 &
  SERVER_PID=$!
  port=
  for _ in $(seq 600); do  # 60 s: an ASan server on a busy machine
    grep -q '"event":"server_started"' "$TMP/server.log" 2>/dev/null || { sleep 0.1; continue; }
    port=$(grep -o "\"${PORT_KIND}_port\":[0-9]*" "$TMP/server.log" | head -1 | cut -d: -f2)
    [[ -n $port ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $port ]]; then
    echo "FAIL: the server did not start"; cat "$TMP/server.log"; exit 1
  fi
  S=(--server=127.0.0.1:$port --timeout=30s)
  field() { sed -n "s/^$1: //p" "$TMP/out"; }
  run() {  # run ARGS...: must exit 0
    "$CTL" "${S[@]}" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    local rc=$?
    if [[ $rc -ne 0 ]]; then
      echo "FAIL: offloadctl $* -> $rc"; sed 's/^/  /' "$TMP/err"; failures=$((failures + 1))
    else
      echo "ok: offloadctl $*"
    fi
  }
  check() {  # check DESCRIPTION CONDITION...
    local what=$1; shift
    if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
  }

  run keys create --type=ed25519 signer
  run sign signer --message=hello
  SIG=$(field signature); PK=$(field public_key)
  check "signature is 64 bytes" test ${#SIG} -eq 128
  run verify --public_key_hex="$PK" --signature_hex="$SIG" --message=hello
  check "verify prints valid" grep -qx valid "$TMP/out"
  "$CTL" "${S[@]}" verify --public_key_hex="$PK" --signature_hex="$SIG" --message=hellO \
    >"$TMP/out" 2>&1
  check "tampered message: exit 1, invalid" test $? -eq 1 -a "$(cat "$TMP/out")" = invalid
  printf 'hello' | "$CTL" "${S[@]}" verify --public_key_hex="$PK" --signature_hex="$SIG" \
    >"$TMP/out" 2>&1
  check "message from stdin" test "$(cat "$TMP/out")" = valid

  run keys create --type=x25519 alice
  run keys create --type=x25519 bob
  run keys get alice; A_PK=$(sed -n 's/.*public_key: //p' "$TMP/out")
  run keys get bob; B_PK=$(sed -n 's/.*public_key: //p' "$TMP/out")
  run derive alice --peer_hex="$B_PK"; AB=$(field shared_key)
  run derive bob --peer_hex="$A_PK"; BA=$(field shared_key)
  check "X25519 agrees both ways" test -n "$AB" -a "$AB" = "$BA"
  run derive bob --peer_hex="$A_PK"
  # The memo is the server's business (tests/e2e); here only report what the CLI printed.
  echo "note: repeated derive printed memo_hit: $(field memo_hit)"
  run box-seal alice --peer_hex="$B_PK" --message='hi bob'
  N=$(field nonce); C=$(field ciphertext)
  run box-open bob --peer_hex="$A_PK" --nonce_hex="$N" --ciphertext_hex="$C"
  check "box round trip" test "$(cat "$TMP/out")" = 'hi bob'
  expect 2 "error: INVALID_ARGUMENT:" -- "${S[@]}" box-open bob --peer_hex="$A_PK" \
    --nonce_hex="$N" --ciphertext_hex="00$C"

  for type in chacha20-poly1305 xchacha20-poly1305 aes256-gcm; do
    run keys create --type=$type vault-$type
    run seal vault-$type --aad=user:42 --message='secret note'
    ENV=$(field envelope)
    run open vault-$type --aad=user:42 --envelope_hex="$ENV"
    check "$type round trip" test "$(cat "$TMP/out")" = 'secret note'
    expect 2 "error: INVALID_ARGUMENT:" -- "${S[@]}" open vault-$type --aad=user:43 \
      --envelope_hex="$ENV"
  done
  run keys rotate vault-aes256-gcm
  check "rotate makes version 2 current" grep -q "current_version: 2" "$TMP/out"
  run open vault-aes256-gcm --aad=user:42 --envelope_hex="$ENV"
  check "old envelope opens after rotate" test "$(cat "$TMP/out")" = 'secret note'
  run --json keys get signer
  check "--json prints the message" grep -q '"key_id":"signer"' "$TMP/out"
  run keys list
  check "list shows 6 keys" test "$(wc -l <"$TMP/out")" -eq 6
  run keys delete signer
  expect 2 "error: NOT_FOUND:" -- "${S[@]}" keys get signer
fi

if [[ $failures -ne 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo "all passed"
