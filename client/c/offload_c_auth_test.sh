#!/usr/bin/env bash
# offload_c_auth_test.sh OFFLOAD_C_TEST OFFLOAD_SERVER [PYTHON]
#
# Makes the credentials of offload_c_test's TLS, mTLS and token runs in a temporary folder, then
# runs `OFFLOAD_C_TEST OFFLOAD_SERVER --auth FOLDER` (which starts its servers with them):
#   ca.crt/.key, other-ca.crt/.key  two CAs (openssl command line, P-256)
#   server.crt/.key                 the servers' certificate: DNS:localhost only, from ca
#   client.crt/.key                 identity spiffe://offload/c-admin (URI SAN), from ca
#   other-client.crt/.key           the same identity from other-ca (a server trusting ca refuses it)
#   jwks.json                       the Ed25519 key (kid k1) that signs the tokens below
#   token-admin, token-admin2       tokens of c-admin (two different ones: a refresh)
#   token-app                       a token of c-app, which the policy grants nothing
#   token-expired                   c-admin's, expired an hour ago
#   policy.json                     admins and all keys for both c-admin identities
# Tokens are minted by PyJWT (Debian's python3-jwt, with python3-cryptography): PYTHON defaults to
# /usr/bin/python3, whose packages those are. Issuer and audience are offload_c_test.c's.
set -eu
C_TEST=${1:?usage: offload_c_auth_test.sh OFFLOAD_C_TEST OFFLOAD_SERVER [PYTHON]}
SERVER=${2:?usage: offload_c_auth_test.sh OFFLOAD_C_TEST OFFLOAD_SERVER [PYTHON]}
PYTHON=${3:-/usr/bin/python3}
C_TEST=$(readlink -f "$C_TEST")
SERVER=$(readlink -f "$SERVER")
DIR=$(mktemp -d /tmp/offload-c-auth-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR"

ssl() { openssl "$@" 2>openssl.err || { cat openssl.err >&2; exit 1; }; }
for ca in ca other-ca; do
  ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $ca.key -out $ca.crt \
    -days 2 -subj "/CN=$ca" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign
done
# leaf NAME CA EXTENDED_KEY_USAGE SUBJECT_ALT_NAME
leaf() {
  printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=%s\nsubjectAltName=%s\n' "$3" "$4" >$1.ext
  ssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $1.key -out $1.csr \
    -subj "/CN=$1"
  ssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial -out $1.crt -days 2 \
    -extfile $1.ext
}
leaf server ca serverAuth DNS:localhost
leaf client ca clientAuth URI:spiffe://offload/c-admin
leaf other-client other-ca clientAuth URI:spiffe://offload/c-admin

cat >policy.json <<'EOF'
{"admins": ["spiffe://offload/c-admin", "c-admin"],
 "grants": [{"client": "spiffe://offload/c-admin", "keys": ["*"], "operations": ["*"]},
            {"client": "c-admin", "keys": ["*"], "operations": ["*"]}]}
EOF

"$PYTHON" - <<'EOF'
import base64, json, time
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

ISSUER, AUDIENCE = "https://id.offload-c-test.example", "crypto-offload"
key = ed25519.Ed25519PrivateKey.generate()
x = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
with open("jwks.json", "w") as f:
    json.dump({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1",
                         "x": base64.urlsafe_b64encode(x).rstrip(b"=").decode()}]}, f)
now = int(time.time())

def token(name, sub, **claims):
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 600}
    body.update(claims)
    with open(name, "w") as f:
        f.write(jwt.encode(body, key, algorithm="EdDSA", headers={"kid": "k1"}))

token("token-admin", "c-admin")
token("token-admin2", "c-admin", jti="second")
token("token-app", "c-app")
token("token-expired", "c-admin", iat=now - 7200, exp=now - 3600)
EOF

"$C_TEST" "$SERVER" --auth "$DIR"
