#!/usr/bin/env bash
# The embedded client over TLS (the mbedTLS transport) against a live offload_server that wants
# an identity on every call:
#   run_tls_live_test.sh OFFLOAD_SERVER OFFLOADCTL EMBEDDED_TLS_TEST EMBEDDED_TLS_NOHEAP_TEST
# 1. openssl makes a throwaway CA, a server certificate (IP:127.0.0.1, DNS:localhost), a client
#    certificate, and a second CA with a client certificate of its own (the wrong ones);
# 2. PyJWT (Debian's, /usr/bin/python3) makes an Ed25519 JWKS, a token signed by its key and
#    one signed by a key the JWKS does not hold;
# 3. a plaintext server creates the X25519 keys (offloadctl speaks plaintext gRPC only);
# 4. on the same data, TLS + --jwks_file + --require_identity: the round trips with the token
#    (ordinary, then with the heap forbidden during each call on the open connection); without
#    a token, or with the foreign one: unauthenticated; the foreign token and a token provider
#    that gives the good one: asked once, the call retried once; the wrong CA, or a server name the
#    certificate does not carry: the handshake fails verification;
# 5. the same with mTLS (--tls_client_ca_file) and a one-second idle timeout: a client
#    certificate alone is an identity; no certificate: unauthenticated; the other CA's
#    certificate: the handshake fails; a connection the server closed while idle is replaced.
# Each server stops on SIGTERM and must exit 0. Exits 77 (ctest: skipped) when the server has
# no TLS or token flags, or openssl or PyJWT is missing.
set -u
SERVER=${1:?usage: run_tls_live_test.sh OFFLOAD_SERVER OFFLOADCTL EMBEDDED_TLS_TEST EMBEDDED_TLS_NOHEAP_TEST}
CTL=${2:?}; TEST=${3:?}; NOHEAP=${4:?}
PY=/usr/bin/python3  # Debian's, with python3-jwt and python3-cryptography
source "$(dirname "$0")/live_server.sh"
TMP=$(mktemp -d)
trap 'kill_server; rm -rf "$TMP"' EXIT

if ! "$SERVER" --helpfull 2>&1 | grep -q -- "require_identity"; then
  echo "SKIP: $SERVER has no --require_identity flag (no bearer tokens yet)"; exit 77
fi
if ! command -v openssl >/dev/null || ! "$PY" -c 'import jwt, cryptography' 2>/dev/null; then
  echo "SKIP: needs openssl and $PY with PyJWT and cryptography (python3-jwt)"; exit 77
fi

# --- certificates: P-256 keys (mbedTLS 2.28 has no Ed25519 certificates) --------------------
C=$TMP/certs
mkdir -p "$C"
make_ca() {  # NAME
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -keyout "$C/$1.key" -out "$C/$1.pem" -subj "/CN=offload test $1" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
make_cert() {  # NAME CA SUBJECT EXTENSIONS
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$C/$1.key" \
    -out "$C/$1.csr" -subj "$3" &&
  printf '%s\n' "$4" >"$C/$1.ext" &&
  openssl x509 -req -in "$C/$1.csr" -CA "$C/$2.pem" -CAkey "$C/$2.key" -CAcreateserial \
    -days 2 -out "$C/$1.pem" -extfile "$C/$1.ext"
}
{
  make_ca ca && make_ca other-ca &&
  make_cert server ca /CN=localhost "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth" &&
  make_cert client ca /CN=device-2 "subjectAltName=DNS:device-2
extendedKeyUsage=clientAuth" &&
  make_cert other-client other-ca /CN=device-3 "subjectAltName=DNS:device-3
extendedKeyUsage=clientAuth"
} >"$TMP/openssl.log" 2>&1 || { echo "FAIL: openssl"; cat "$TMP/openssl.log"; exit 1; }

# --- a JWKS and tokens ------------------------------------------------------------------------
ISS=https://id.offload.test
AUD=crypto-offload
"$PY" - "$TMP" "$ISS" "$AUD" <<'PYEOF' || { echo "FAIL: minting tokens"; exit 1; }
import base64, json, sys, time
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

out, iss, aud = sys.argv[1:4]
key, foreign = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
x = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
jwks = {"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1",
                  "x": base64.urlsafe_b64encode(x).rstrip(b"=").decode()}]}
with open(out + "/jwks.json", "w") as f:
    json.dump(jwks, f)
claims = {"iss": iss, "aud": aud, "sub": "device-1", "exp": int(time.time()) + 600}
for name, signer in (("token", key), ("foreign.token", foreign)):
    with open(out + "/" + name, "w") as f:
        f.write(jwt.encode(claims, signer, algorithm="EdDSA", headers={"kid": "k1"}))
PYEOF

# --- keys, made on a plaintext server ---------------------------------------------------------
mkdir -p "$TMP/data"
OFFLOAD_KEK=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export OFFLOAD_KEK
start_server "$SERVER" "$TMP/data" "$TMP/plain.log" || exit 1
S=(--server="127.0.0.1:$GRPC" --timeout=30s)
declare -A PK
for k in dev1 dev2; do
  "$CTL" "${S[@]}" keys create --type=x25519 "$k" >/dev/null || { echo "FAIL: keys create $k"; exit 1; }
  PK[$k]=$("$CTL" "${S[@]}" keys get "$k" | sed -n 's/.*public_key: *\([0-9a-f]\{64\}\).*/\1/p' | head -1)
  if [[ ${#PK[$k]} -ne 64 ]]; then echo "FAIL: no public key for $k"; exit 1; fi
done
stop_server || exit 1

failures=0
run() {  # the test binary and its arguments; counts a failure
  "$@" || { failures=$((failures + 1)); echo "FAILED: ${*##*/}"; }
}
AUTH=(--tls_cert_file="$C/server.pem" --tls_key_file="$C/server.key" --jwks_file="$TMP/jwks.json"
      --token_issuer="$ISS" --token_audience="$AUD" --require_identity)
TRUST=(--ca="$C/ca.pem" --server-name=localhost)

# --- TLS, tokens, an identity required ---------------------------------------------------------
start_server "$SERVER" "$TMP/data" "$TMP/tls.log" "${AUTH[@]}" || exit 1
echo "server: TLS on HTTP $HTTP, tokens required"
run "$TEST" "${TRUST[@]}" --token="$TMP/token" "$HTTP" suite dev1 "${PK[dev1]}"
run "$NOHEAP" "${TRUST[@]}" --token="$TMP/token" "$HTTP" suite dev2 "${PK[dev2]}"
run "$TEST" "${TRUST[@]}" "$HTTP" expect unauthenticated
run "$TEST" "${TRUST[@]}" --token="$TMP/foreign.token" "$HTTP" expect unauthenticated
# The token provider: asked once on UNAUTHENTICATED, the call retried once.
run "$TEST" "${TRUST[@]}" --token="$TMP/foreign.token" "$HTTP" refresh "$TMP/token"
run "$TEST" --ca="$C/other-ca.pem" --server-name=localhost --token="$TMP/token" "$HTTP" \
  expect transport verify
run "$TEST" --ca="$C/ca.pem" --server-name=offload.example --token="$TMP/token" "$HTTP" \
  expect transport verify
stop_server || failures=$((failures + 1))
[[ $failures -eq 0 ]] || { echo "server log (tail):"; tail -30 "$TMP/tls.log"; }

# --- TLS with client certificates (mTLS) ---------------------------------------------------
before=$failures
start_server "$SERVER" "$TMP/data" "$TMP/mtls.log" "${AUTH[@]}" --tls_client_ca_file="$C/ca.pem" \
  --http_idle_timeout=1s || exit 1
echo "server: mTLS on HTTP $HTTP, idle timeout 1s"
run "$TEST" "${TRUST[@]}" --cert="$C/client.pem" --key="$C/client.key" "$HTTP" expect ok
run "$TEST" "${TRUST[@]}" "$HTTP" expect unauthenticated
run "$TEST" "${TRUST[@]}" --cert="$C/other-client.pem" --key="$C/other-client.key" "$HTTP" \
  expect transport handshake
run "$TEST" "${TRUST[@]}" --cert="$C/client.pem" --key="$C/client.key" "$HTTP" idle
stop_server || failures=$((failures + 1))
[[ $failures -eq $before ]] || { echo "server log (tail):"; tail -30 "$TMP/mtls.log"; }

echo "$failures failed"
exit $((failures == 0 ? 0 : 1))
