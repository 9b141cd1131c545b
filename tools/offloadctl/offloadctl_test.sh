#!/usr/bin/env bash
# offloadctl's command-line contract.
#   offloadctl_test.sh OFFLOADCTL                 help, usage errors (exit 64), unreachable server (2)
#   offloadctl_test.sh OFFLOADCTL OFFLOAD_SERVER  the same, then the README tour against a server
#                                                 started on a free port with a temporary data dir
#   offloadctl_test.sh OFFLOADCTL OFFLOAD_SERVER http
#                                                 the tour over the server's HTTP port, which
#                                                 speaks gRPC on our own engine (issue 24)
#   offloadctl_test.sh OFFLOADCTL OFFLOAD_SERVER grpc|http mtls
#                                                 the tour over mTLS (certificates made here with
#                                                 the openssl command line; the client's identity
#                                                 is the policy's admin), and refusals: no TLS, a
#                                                 wrong CA, an unchecked name, no client
#                                                 certificate, mismatched files
#   offloadctl_test.sh OFFLOADCTL OFFLOAD_SERVER grpc|http token [PYTHON]
#                                                 the tour with a bearer token (minted by PyJWT:
#                                                 PYTHON, default /usr/bin/python3) against a
#                                                 plain-text server that requires one, and
#                                                 refusals: none, expired, no grant; the tokens
#                                                 never appear in offloadctl's output
# Every variable offloadctl reads (OFFLOAD_TLS_*, OFFLOAD_TOKEN*) is cleared first.
set -u
CTL=${1:?usage: offloadctl_test.sh OFFLOADCTL [OFFLOAD_SERVER [grpc|http [plain|mtls|token]]]}
SERVER_BIN=${2:-}
PORT_KIND=${3:-grpc}
AUTH=${4:-plain}
PYTHON=${5:-/usr/bin/python3}
unset OFFLOAD_TLS_CA_FILE OFFLOAD_TLS_CERT_FILE OFFLOAD_TLS_KEY_FILE OFFLOAD_TLS_SERVER_NAME \
  OFFLOAD_TOKEN OFFLOAD_TOKEN_FILE
failures=0
TMP=$(mktemp -d)
SERVER_PID=
cleanup() {
  if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
# Everything offloadctl printed, for the check that no token ever shows.
: >"$TMP/all"
record() { cat "$TMP/out" "$TMP/err" >>"$TMP/all" 2>/dev/null; }

# expect CODE STDERR_SUBSTRING [VAR=VALUE...] -- ARGS...: runs the CLI (with those variables in
# its environment), checks exit code and stderr.
expect() {
  local want=$1 pattern=$2
  shift 2
  local env=()
  while [[ $1 != -- ]]; do env+=("$1"); shift; done
  shift
  env "${env[@]}" "$CTL" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
  local got=$?
  record
  if [[ $got -ne $want ]] || { [[ -n $pattern ]] && ! grep -qF -- "$pattern" "$TMP/err"; }; then
    show "FAIL: ${env[*]:+${env[*]} }offloadctl $* -> exit $got (want $want), stderr:"
    sed 's/^/  /' "$TMP/err"
    failures=$((failures + 1))
  else
    show "ok: ${env[*]:+${env[*]} }offloadctl $* -> $got"
  fi
}
show() { echo "$*" | sed 's/eyJ[A-Za-z0-9_.-]*/<JWT>/g'; }  # this log shows no token either
check_hidden() {  # check_hidden TEXT: TEXT is nowhere in what offloadctl printed so far
  if grep -qF -- "$1" "$TMP/all"; then
    echo "FAIL: a token appeared in offloadctl's output"; failures=$((failures + 1))
  else
    echo "ok: the token never appeared in offloadctl's output"
  fi
}

# --- without a server ----------------------------------------------------------------------
"$CTL" help >"$TMP/help" || { echo "FAIL: help exit $?"; failures=$((failures + 1)); }
for cmd in "keys create" "keys import" "keys list" "keys get" "keys rotate" "keys delete" \
           "keys cancel-deletion" "keys disable" "keys enable" "keys disable-version" \
           "keys enable-version" "keys destroy-version" "keys restore-version" \
           "keys min-decryption-version" sign verify derive box-seal box-open seal open rewrap; do
  grep -q "^  $cmd" "$TMP/help" || { echo "FAIL: help lacks '$cmd'"; failures=$((failures + 1)); }
done
"$CTL" >/dev/null || { echo "FAIL: no args should print usage and exit 0"; failures=$((failures + 1)); }
"$CTL" --help | grep -q "subcommands:" || { echo "FAIL: --help"; failures=$((failures + 1)); }

expect 64 "error: INVALID_ARGUMENT: unknown subcommand 'frob'" -- frob
expect 64 "expected 'keys create|import|list|get|rotate|delete|cancel-deletion|disable|enable|" \
  -- keys destroy x
expect 64 "'keys disable-version' expects ID V, got 1" -- keys disable-version k
expect 64 "V: expected a key version number >= 1, got 'x'" -- --server=127.0.0.1:1 \
  keys disable-version k x
expect 64 "V: expected a key version number >= 1, got '0'" -- --server=127.0.0.1:1 \
  keys destroy-version k 0
expect 64 "--wait: expected a duration >= 0, got -1s" -- --server=127.0.0.1:1 keys delete k \
  --wait=-1s
expect 64 "flag --wait does not apply to 'keys disable'" -- keys disable k --wait=1h
expect 64 "expected at most one of --envelope_hex, --envelope_file, --envelopes_file, got 2" -- \
  --server=127.0.0.1:1 rewrap k --envelope_hex=00 --envelopes_file="$TMP/nope"
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
# TLS files and tokens are read before anything is sent: a bad one is a usage error, and the
# message names the flag or the variable it came from, never the token.
expect 64 "tls_ca_file: cannot read '$TMP/none.crt'" -- --server=127.0.0.1:1 \
  --tls_ca_file="$TMP/none.crt" keys list
expect 64 "tls_ca_file: cannot read '$TMP/none.crt'" OFFLOAD_TLS_CA_FILE="$TMP/none.crt" -- \
  --server=127.0.0.1:1 keys list
echo 'not a certificate' >"$TMP/junk.pem"
expect 64 "tls_ca_file: expected PEM certificates" -- --server=127.0.0.1:1 \
  --tls_ca_file="$TMP/junk.pem" keys list
expect 64 "--token_file: cannot open '$TMP/none.jwt'" -- --server=127.0.0.1:1 \
  --token_file="$TMP/none.jwt" keys list
expect 64 "OFFLOAD_TOKEN_FILE: cannot open '$TMP/none.jwt'" OFFLOAD_TOKEN_FILE="$TMP/none.jwt" -- \
  --server=127.0.0.1:1 keys list
printf '\n  \n' >"$TMP/blank.jwt"
expect 64 "--token_file: '$TMP/blank.jwt' holds no token" -- --server=127.0.0.1:1 \
  --token_file="$TMP/blank.jwt" keys list
expect 64 "expected at most one of --token, --token_file, got 2" -- --server=127.0.0.1:1 \
  --token=abc --token_file="$TMP/blank.jwt" keys list
expect 64 "expected at most one of OFFLOAD_TOKEN, OFFLOAD_TOKEN_FILE, got 2" OFFLOAD_TOKEN=abc \
  OFFLOAD_TOKEN_FILE="$TMP/blank.jwt" -- --server=127.0.0.1:1 keys list
expect 64 "--token: expected visible ASCII characters, got byte 0x20 at position 6" -- \
  --server=127.0.0.1:1 --token="secret words" keys list
check_hidden "secret words"
# A flag wins over its variable: a bad OFFLOAD_TOKEN_FILE is not read when --token is given.
expect 2 "error: UNAVAILABLE:" OFFLOAD_TOKEN_FILE="$TMP/none.jwt" -- --server=127.0.0.1:1 \
  --timeout=3s --token=abc keys list

# --- against a live server -------------------------------------------------------------------
if [[ -n $SERVER_BIN ]]; then
  # Ports the server picks (read from its log), metrics off: nothing here can collide with
  # another test's ports. The tour goes to the gRPC port, or to the HTTP port (gRPC on the engine).
  mkdir -p "$TMP/data"
  http=
  [[ $PORT_KIND == http ]] && http=127.0.0.1:0
  SERVER_FLAGS=()
  CLIENT_FLAGS=()
  P=$TMP/pki
  mkdir -p "$P"
  if [[ $AUTH == mtls ]]; then
    # Two CAs; the server's certificate names localhost only; the client's identity is its
    # URI SAN, the policy's admin (with every key).
    ssl() { openssl "$@" 2>"$P/openssl.err" || { cat "$P/openssl.err"; exit 1; }; }
    for ca in ca other-ca; do
      ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$P/$ca.key" \
        -out "$P/$ca.crt" -days 2 -subj "/CN=$ca" -addext basicConstraints=critical,CA:TRUE \
        -addext keyUsage=critical,keyCertSign
    done
    leaf() {  # leaf NAME EXTENDED_KEY_USAGE SUBJECT_ALT_NAME
      printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=%s\nsubjectAltName=%s\n' "$2" "$3" \
        >"$P/$1.ext"
      ssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$P/$1.key" \
        -out "$P/$1.csr" -subj "/CN=$1"
      ssl x509 -req -in "$P/$1.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial \
        -out "$P/$1.crt" -days 2 -extfile "$P/$1.ext"
    }
    leaf server serverAuth DNS:localhost
    leaf client clientAuth URI:spiffe://offload/ops-admin
    echo '{"admins": ["spiffe://offload/ops-admin"], "grants": [{"client":
      "spiffe://offload/ops-admin", "keys": ["*"], "operations": ["*"]}]}' >"$P/policy.json"
    SERVER_FLAGS=(--tls_cert_file="$P/server.crt" --tls_key_file="$P/server.key"
                  --tls_client_ca_file="$P/ca.crt" --policy_file="$P/policy.json")
    CLIENT_FLAGS=(--tls_ca_file="$P/ca.crt" --tls_cert_file="$P/client.crt"
                  --tls_key_file="$P/client.key" --tls_server_name=localhost)
  elif [[ $AUTH == token ]]; then
    # An Ed25519 JWKS, and tokens of ops-admin (the policy's admin, with every key), of app-a
    # (no grant), and an expired one of ops-admin.
    (cd "$P" && "$PYTHON" - <<'PY'
import base64, json, time
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

key = ed25519.Ed25519PrivateKey.generate()
x = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
with open("jwks.json", "w") as f:
    json.dump({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1",
                         "x": base64.urlsafe_b64encode(x).rstrip(b"=").decode()}]}, f)
now = int(time.time())
for name, sub, iat, exp in (("admin.jwt", "ops-admin", now, now + 600),
                            ("app.jwt", "app-a", now, now + 600),
                            ("expired.jwt", "ops-admin", now - 7200, now - 3600)):
    body = {"iss": "https://id.offloadctl-test.example", "aud": "crypto-offload", "sub": sub,
            "iat": iat, "exp": exp}
    with open(name, "w") as f:
        f.write(jwt.encode(body, key, algorithm="EdDSA", headers={"kid": "k1"}) + "\n")
PY
    ) || { echo "FAIL: minting tokens with $PYTHON"; exit 1; }
    echo '{"admins": ["ops-admin"], "grants": [{"client": "ops-admin", "keys": ["*"],
      "operations": ["*"]}]}' >"$P/policy.json"
    SERVER_FLAGS=(--jwks_file="$P/jwks.json" --token_issuer=https://id.offloadctl-test.example
                  --token_audience=crypto-offload --require_identity
                  --policy_file="$P/policy.json")
    CLIENT_FLAGS=(--token_file="$P/admin.jwt")
  fi
  OFFLOAD_KEK=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n') \
    "$SERVER_BIN" --grpc_address=127.0.0.1:0 --http_address="$http" --metrics_address= \
    --data_dir="$TMP/data" --key_deletion_wait=2s "${SERVER_FLAGS[@]}" >"$TMP/server.log" 2>&1 &
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
  ADDRESS=127.0.0.1:$port
  S=(--server=$ADDRESS --timeout=30s "${CLIENT_FLAGS[@]}")
  field() { sed -n "s/^$1: //p" "$TMP/out"; }
  run() {  # run ARGS...: must exit 0
    "$CTL" "${S[@]}" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    local rc=$?
    record
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
  record
  printf 'hello' | "$CTL" "${S[@]}" verify --public_key_hex="$PK" --signature_hex="$SIG" \
    >"$TMP/out" 2>&1
  check "message from stdin" test "$(cat "$TMP/out")" = valid
  record

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

  # The key lifecycle. The server waits 2 s (--key_deletion_wait=2s) before it wipes a key or a
  # version, so the tour sees a real destruction; a request may ask for longer, not shorter.
  run keys disable signer
  check "disable: state disabled" grep -qx "state: disabled" "$TMP/out"
  expect 2 "error: FAILED_PRECONDITION:" -- "${S[@]}" sign signer --message=hello
  run keys enable signer
  check "enable: state enabled" grep -qx "state: enabled" "$TMP/out"
  run sign signer --message=hello
  check "enabled again: signs" test "$(field signature)" = "$SIG"
  expect 2 "error: INVALID_ARGUMENT:" -- "${S[@]}" keys delete signer --wait=1s
  run keys delete signer --wait=1h
  check "delete: pending" grep -qx "pending_deletion: signer" "$TMP/out"
  check "delete: says when" grep -q "^deletion: 20..-..-..T..:..:..Z (in 1h" "$TMP/out"
  check "delete: says how to keep it" \
    grep -qx "to keep it: offloadctl keys cancel-deletion signer" "$TMP/out"
  run keys get signer
  check "get: pending-deletion" grep -qx "state: pending-deletion" "$TMP/out"
  check "get: deletion time" grep -q "^deletion: 20" "$TMP/out"
  run keys list
  check "list: pending-deletion" grep -q "^signer .*state=pending-deletion  deletion=20" "$TMP/out"
  expect 2 "error: FAILED_PRECONDITION:" -- "${S[@]}" sign signer --message=hello
  expect 2 "error: FAILED_PRECONDITION:" -- "${S[@]}" keys delete signer
  run keys cancel-deletion signer
  check "cancel-deletion: enabled" grep -qx "state: enabled" "$TMP/out"
  run sign signer --message=hello
  check "cancelled: signs as before" test "$(field signature)" = "$SIG"

  # Versions and Rewrap on the rotated AEAD key: $ENV was sealed under version 1.
  V=vault-aes256-gcm
  run rewrap $V --aad=user:42 --envelope_hex="$ENV"
  NEW=$(field envelope)
  check "rewrap: version 2 from 1" test "$(field key_version)/$(field previous_key_version)" = 2/1
  run open $V --aad=user:42 --envelope_hex="$NEW"
  check "rewrapped envelope opens to the plaintext" test "$(cat "$TMP/out")" = 'secret note'
  expect 2 "error: INVALID_ARGUMENT:" -- "${S[@]}" rewrap $V --aad=user:43 --envelope_hex="$ENV"
  printf '%s\n\n%s\n00\n' "$ENV" "$NEW" >"$TMP/envelopes"
  expect 2 "1 of 3 envelope(s) not rewrapped" -- "${S[@]}" rewrap $V --aad=user:42 \
    --envelopes_file="$TMP/envelopes"
  check "batch rewrap: a line per envelope" test "$(wc -l <"$TMP/out")" -eq 3
  check "batch rewrap: the bad one says why" grep -q "^error: INVALID_ARGUMENT:" "$TMP/out"
  B1=$(sed -n 1p "$TMP/out")
  run open $V --aad=user:42 --envelope_hex="$B1"
  check "batch-rewrapped envelope opens" test "$(cat "$TMP/out")" = 'secret note'
  expect 2 "error: FAILED_PRECONDITION:" -- "${S[@]}" keys disable-version $V 2
  run keys disable-version $V 1
  check "disable-version: disabled" grep -q "^version: 1 .* state: disabled" "$TMP/out"
  expect 2 "error: FAILED_PRECONDITION:" -- "${S[@]}" open $V --aad=user:42 --envelope_hex="$ENV"
  run open $V --aad=user:42 --envelope_hex="$NEW"
  check "current version still opens" test "$(cat "$TMP/out")" = 'secret note'
  run keys enable-version $V 1
  run open $V --aad=user:42 --envelope_hex="$ENV"
  check "enable-version: opens again" test "$(cat "$TMP/out")" = 'secret note'
  run keys min-decryption-version $V 2
  check "min-decryption-version shown" grep -qx "min_decryption_version: 2" "$TMP/out"
  expect 2 "below its min_decryption_version" -- "${S[@]}" open $V --aad=user:42 \
    --envelope_hex="$ENV"
  run open $V --aad=user:42 --envelope_hex="$NEW"
  check "above the minimum: opens" test "$(cat "$TMP/out")" = 'secret note'
  run keys list
  check "list: min_decryption_version" grep -q "^$V .*min_decryption_version=2" "$TMP/out"
  run keys min-decryption-version $V 1
  run keys disable-version $V 1
  run keys destroy-version $V 1
  check "destroy-version: scheduled" \
    grep -q "^version: 1 .* state: destroy-scheduled  destroy: 20" "$TMP/out"
  run keys list
  check "list: version states" grep -q "^$V .*version_states=1:destroy-scheduled" "$TMP/out"
  run keys restore-version $V 1
  check "restore-version: disabled" grep -q "^version: 1 .* state: disabled" "$TMP/out"
  run keys destroy-version $V 1
  # Wiped about 2 s later (the server's reaper runs every second).
  destroyed=
  for _ in $(seq 30); do
    "$CTL" "${S[@]}" keys get $V >"$TMP/out" 2>"$TMP/err" </dev/null
    record
    grep -q "^version: 1 .* state: destroyed  destroyed: 20" "$TMP/out" && { destroyed=1; break; }
    sleep 0.5
  done
  check "destroy-version: destroyed after the wait" test -n "$destroyed"
  expect 2 "error: FAILED_PRECONDITION:" -- "${S[@]}" keys restore-version $V 1
  expect 2 "error: FAILED_PRECONDITION:" -- "${S[@]}" keys enable-version $V 1
  run open $V --aad=user:42 --envelope_hex="$NEW"
  check "version 2 untouched" test "$(cat "$TMP/out")" = 'secret note'

  # A deletion carried out: gone after the wait, and the id is free again.
  run keys delete signer
  gone=
  for _ in $(seq 30); do
    "$CTL" "${S[@]}" keys get signer >"$TMP/out" 2>"$TMP/err" </dev/null
    [[ $? -eq 2 ]] && grep -q "error: NOT_FOUND:" "$TMP/err" && { gone=1; break; }
    sleep 0.5
  done
  record
  check "delete: gone after the wait" test -n "$gone"
  run keys create --type=ed25519 signer

  A=(--server=$ADDRESS --timeout=30s)
  if [[ $AUTH == mtls ]]; then
    # The same files from the environment; a flag wins over its variable.
    expect 0 "" OFFLOAD_TLS_CA_FILE="$P/ca.crt" OFFLOAD_TLS_CERT_FILE="$P/client.crt" \
      OFFLOAD_TLS_KEY_FILE="$P/client.key" OFFLOAD_TLS_SERVER_NAME=localhost -- "${A[@]}" keys list
    expect 0 "" OFFLOAD_TLS_CA_FILE="$P/other-ca.crt" OFFLOAD_TLS_SERVER_NAME=127.0.0.1 -- \
      "${S[@]}" keys list
    # Refusals. Plain text to a TLS port: no answer. A CA that did not sign the server's
    # certificate, or no name to check but an address: the handshake fails, and says why.
    expect 2 "error: UNAVAILABLE:" -- "${A[@]}" --timeout=5s keys list
    expect 2 "certificate verify failed" -- "${A[@]}" --tls_ca_file="$P/other-ca.crt" \
      --tls_cert_file="$P/client.crt" --tls_key_file="$P/client.key" --tls_server_name=localhost \
      keys list
    expect 2 "Peer name 127.0.0.1 is not in peer certificate" -- "${A[@]}" \
      --tls_ca_file="$P/ca.crt" --tls_cert_file="$P/client.crt" --tls_key_file="$P/client.key" \
      keys list
    # TLS without a client certificate: the server wants one.
    expect 2 "error: UNAUTHENTICATED:" -- "${A[@]}" --tls_ca_file="$P/ca.crt" \
      --tls_server_name=localhost keys list
    # Files that do not go together are a usage error, found before anything is sent.
    expect 64 "tls_key_file, tls_key_pem: expected the private key" -- "${A[@]}" \
      --tls_ca_file="$P/ca.crt" --tls_cert_file="$P/client.crt" keys list
    expect 64 "tls_key_file: expected the private key of the certificate in tls_cert_file" -- \
      "${A[@]}" --tls_ca_file="$P/ca.crt" --tls_cert_file="$P/client.crt" \
      --tls_key_file="$P/server.key" keys list
  elif [[ $AUTH == token ]]; then
    ADMIN=$(tr -d '\n' <"$P/admin.jwt")
    # The token from the environment, as a file or as itself; a flag wins over its variable.
    expect 0 "" OFFLOAD_TOKEN_FILE="$P/admin.jwt" -- "${A[@]}" keys list
    expect 0 "" OFFLOAD_TOKEN="$ADMIN" -- "${A[@]}" keys list
    expect 0 "" OFFLOAD_TOKEN="not-a-valid-token" -- "${A[@]}" --token_file="$P/admin.jwt" keys list
    expect 0 "" OFFLOAD_TOKEN_FILE="$P/expired.jwt" -- "${A[@]}" --token="$ADMIN" keys list
    # Refusals: no token, an expired one, a forged one, one whose identity has no grant.
    expect 2 "error: UNAUTHENTICATED:" -- "${A[@]}" keys list
    expect 2 "error: UNAUTHENTICATED:" -- "${A[@]}" --token_file="$P/expired.jwt" keys list
    expect 2 "error: UNAUTHENTICATED:" OFFLOAD_TOKEN="not-a-valid-token" -- "${A[@]}" keys list
    expect 2 "error: PERMISSION_DENIED:" -- "${A[@]}" --token_file="$P/app.jwt" keys create \
      --type=ed25519 app-key
    expect 2 "error: PERMISSION_DENIED:" -- "${A[@]}" --token_file="$P/app.jwt" seal \
      vault-aes256-gcm --message=x
    for t in admin app expired; do check_hidden "$(tr -d '\n' <"$P/$t.jwt")"; done
    check_hidden "not-a-valid-token"
  fi
fi

if [[ $failures -ne 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo "all passed"
