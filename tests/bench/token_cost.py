#!/usr/bin/python3
"""What a bearer token costs the server (issue 25's benchmark).

    tests/bench/token_cost.py [--server build/bin/offload_server] [--calls 200000] [--rounds 5]
                              [--first_use 2000]

One offload_server (libsodium backend, admission unbounded, tokens on: --jwks_file with an
Ed25519, a P-256 and an RSA-2048 key; no --require_identity, so a call without a token is served
anonymously) and one fixed Connect Verify request in application/proto (a verify-memo hit after
the first call). Tokens are minted by PyJWT (Debian's python3-jwt).

  remembered   In each round, h2load sends --calls Verify calls without an identity and as many
               with `authorization: Bearer <an EdDSA token>` (remembered after its first use),
               over HTTP/2 (`-c 8 -m 8`) and over HTTP/1.1 keep-alive (`--h1 -c 8`); the order
               alternates by round. The figure is the server's CPU time (utime + stime of
               /proc/<pid>/stat) per call; the row's result is the difference of the medians.
  first use    For each algorithm, --first_use calls each with a token never seen before (a new
               `jti`), then as many with one remembered token, from one Python HTTP/1.1
               keep-alive connection; the difference of the server CPU per call is what a first
               use adds. offload_token_checks_total{result="signature_checked"} must grow by
               exactly one per new token (printed; the script fails otherwise).
Nothing else is asserted (a benchmark, not a test). `--smoke` runs a few calls once (ctest
bench.token_cost_smoke), to check that the script works.
"""

import argparse
import base64
import http.client
import json
import os
import re
import secrets
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import jwt  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa  # noqa: E402
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm  # noqa: E402

from engine_ab import field  # noqa: E402
from bench_server import OffloadServer  # noqa: E402
from http_edge import cpu_seconds, h2load  # noqa: E402

ISSUER = "https://id.bench.example"
AUDIENCE = "crypto-offload"
ALGS = {"EdDSA": (lambda: ed25519.Ed25519PrivateKey.generate(), OKPAlgorithm),
        "ES256": (lambda: ec.generate_private_key(ec.SECP256R1()), ECAlgorithm),
        "RS256": (lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
                  RSAAlgorithm)}


def full_length_coordinates(jwk):
    """`jwk` with an EC key's x and y at their full 32 bytes (RFC 7518 6.2.1.2): PyJWT 2.6 writes
    a coordinate under 2^248 short (about 1 key in 128), and the server skips such a key."""
    if jwk.get("kty") == "EC":
        for c in ("x", "y"):
            raw = base64.urlsafe_b64decode(jwk[c] + "=" * (-len(jwk[c]) % 4))
            jwk[c] = base64.urlsafe_b64encode(raw.rjust(32, b"\0")).rstrip(b"=").decode()
    return jwk


class Server(OffloadServer):
    """offload_server with tokens on; `prefix` runs it under another program (valgrind)."""

    def __init__(self, binary, work, prefix=(), extra=(), ready_seconds=30):
        self.keys = {alg: make() for alg, (make, _) in ALGS.items()}
        jwks = {"keys": []}
        for alg, (_, algorithm) in ALGS.items():
            j = full_length_coordinates(json.loads(algorithm.to_jwk(self.keys[alg].public_key())))
            j["kid"] = alg
            jwks["keys"].append(j)
        path = os.path.join(work, "jwks.json")
        with open(path, "w") as f:
            json.dump(jwks, f)
        super().__init__(
            binary, os.path.join(work, "data"), prefix=prefix, ready_seconds=ready_seconds,
            flags=["--backend=libsodium", "--max_client_inflight=0", "--max_queued_items=0",
                   "--jwks_file=" + path, "--token_issuer=" + ISSUER,
                   "--token_audience=" + AUDIENCE] + list(extra))

    def token(self, alg="EdDSA", jti=None):
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "bench-client",
                  "exp": int(time.time()) + 3600, "jti": jti or secrets.token_hex(8)}
        return jwt.encode(claims, self.keys[alg], algorithm=alg, headers={"kid": alg})

    def call(self, path, body, content_type="application/json", token=None):
        return super().call(path, body, content_type,
                            {"authorization": "Bearer " + token} if token else None)

    def signature_checks(self):
        m = re.search(r'^offload_token_checks_total\{result="signature_checked"\} (\S+)$',
                      self.scrape(), re.M)
        return float(m.group(1))


def verify_body(server):
    server.call("/offload.v1.KeyService/CreateKey",
                json.dumps({"keyId": "signer", "type": "KEY_TYPE_ED25519"}).encode())
    message = b"token cost"
    signed = json.loads(server.call("/offload.v1.Ed25519Service/Sign", json.dumps(
        {"keyId": "signer", "message": base64.b64encode(message).decode()}).encode()))
    body = (field(1, base64.b64decode(signed["publicKey"])) + field(2, message)
            + field(3, base64.b64decode(signed["signature"])))
    if not server.call("/offload.v1.Ed25519Service/Verify", body, "application/proto",
                       server.token()).startswith(b"\x08\x01"):
        raise RuntimeError("Verify with a token did not answer valid")
    return body


def remembered_rows(server, body_file, token, calls, rounds):
    rows = {}
    for title, args in (("HTTP/2 (h2load -c 8 -m 8)", ["-c", "8", "-m", "8"]),
                        ("HTTP/1.1 keep-alive (h2load --h1 -c 8)", ["--h1", "-c", "8"])):
        per = {"no identity": [], "remembered EdDSA token": []}
        variants = {"no identity": [],
                    "remembered EdDSA token": ["-H", "authorization: Bearer " + token]}
        for r in range(rounds):
            order = list(variants) if r % 2 == 0 else list(variants)[::-1]
            for name in order:
                cmd = args + ["-d", body_file, "-H", "content-type: application/proto"] + \
                    variants[name] + [server.url("/offload.v1.Ed25519Service/Verify")]
                h2load(cmd, max(50, calls // 20))  # warm-up
                before = cpu_seconds(server.proc.pid)
                h2load(cmd, calls)
                per[name].append((cpu_seconds(server.proc.pid) - before) / calls * 1e6)
        rows[title] = per
    return rows


def first_use(server, body, alg, n):
    """(us per call with new tokens, us per call with one remembered token, checks added)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=30)
    tokens = [server.token(alg) for _ in range(n)]
    same = server.token(alg)

    def run(token_list):
        before = cpu_seconds(server.proc.pid)
        for t in token_list:
            conn.request("POST", "/offload.v1.Ed25519Service/Verify", body=body,
                         headers={"content-type": "application/proto",
                                  "authorization": "Bearer " + t})
            r = conn.getresponse()
            if r.status != 200 or not r.read().startswith(b"\x08\x01"):
                raise RuntimeError("%s: Verify did not answer valid (HTTP %d)" % (alg, r.status))
        return (cpu_seconds(server.proc.pid) - before) / len(token_list) * 1e6

    run([same] * min(n, 200))  # warm-up; `same` is remembered from here on
    checks = server.signature_checks()
    fresh = run(tokens)
    added = server.signature_checks() - checks
    remembered = run([same] * n)
    conn.close()
    return fresh, remembered, added


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=os.path.join(REPO, "build/bin/offload_server"))
    p.add_argument("--calls", type=int, default=200000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--first_use", type=int, default=2000)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    if a.smoke:
        a.calls, a.rounds, a.first_use = 400, 1, 40
    work = tempfile.mkdtemp(prefix="token-cost-")
    server = Server(a.server, work)
    try:
        body = verify_body(server)
        body_file = os.path.join(work, "verify.bin")
        with open(body_file, "wb") as f:
            f.write(body)
        load = os.getloadavg()[0]
        print("# Bearer tokens: server CPU per Connect Verify (memo hit), %d cores, load %.2f"
              % (os.cpu_count(), load))
        print("\n## Remembered token against no identity (%d calls per variant, %d rounds)"
              % (a.calls, a.rounds))
        print("| transport | no identity (us/call, rounds) | remembered token (us/call, rounds) "
              "| medians | token adds |")
        print("| --- | --- | --- | ---: | ---: |")
        token = server.token("EdDSA")
        for title, per in remembered_rows(server, body_file, token, a.calls, a.rounds).items():
            base = statistics.median(per["no identity"])
            tok = statistics.median(per["remembered EdDSA token"])
            print("| %s | %s | %s | %.2f -> %.2f | %+.2f us |" % (
                title, " ".join("%.2f" % x for x in per["no identity"]),
                " ".join("%.2f" % x for x in per["remembered EdDSA token"]), base, tok,
                tok - base))
        print("\n## First use of a token (%d new tokens per algorithm, one HTTP/1.1 connection)"
              % a.first_use)
        print("| alg | new tokens (us/call) | remembered token (us/call) | first use adds "
              "| signature checks added |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for alg in ALGS:
            fresh, remembered, added = first_use(server, body, alg, a.first_use)
            print("| %s | %.1f | %.1f | %+.1f us | %d (one per new token: %s) |" % (
                alg, fresh, remembered, fresh - remembered, added,
                "yes" if added == a.first_use else "NO"))
            if added != a.first_use:
                raise SystemExit("%s: %d signature checks for %d new tokens" %
                                 (alg, added, a.first_use))
        print("\nload average at the end: %.2f" % os.getloadavg()[0])
    finally:
        server.stop()


if __name__ == "__main__":
    main()
