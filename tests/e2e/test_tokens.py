"""Bearer tokens minted by an independent implementation (PyJWT, Debian's python3-jwt, with
python3-cryptography): EdDSA, ES256 and RS256 tokens against a server started with --jwks_file,
--require_identity and a grants policy.

  valid     a token works over gRPC, Connect (JSON, HTTP/1.1 and HTTP/2) and gRPC-Web, on both
            ports; grants apply to token identities (a key outside the grant: PERMISSION_DENIED;
            key lifecycle for admins only)
  refused   expired, not yet valid, wrong aud, wrong iss, unknown kid, alg none, HS256 signed with
            the public key as secret, a flipped signature bit, a token over --max_token_bytes,
            a 1 MiB token, no token, another scheme: UNAUTHENTICATED / 401, audited with the
            reason, never with the token
  memo      a repeated token costs one signature check (offload_token_checks_total)
  GET       a Connect GET of Verify made with a token (or on a server that needs an identity)
            is answered `Cache-Control: private`, never `public`; an anonymous caller's, where
            anonymous calls are served, stays `public, max-age=31536000, immutable`; Vary names
            Authorization
  reload    a token whose JWKS key is removed from the file is refused, without a restart
  skipped   a JWKS with one unusable key (PyJWT 2.6's own EC key whose coordinate lost its
            leading zero byte, 1 key in 128) loads the others: their tokens verify, the broken
            key's tokens are refused unknown_kid, the key is counted and logged as skipped
"""
import base64
import hashlib
import hmac
import json
import os
import re
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

import grpc
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

import harness
from harness import pb

ISSUER = "https://id.test.example"
AUDIENCE = "crypto-offload"
POLICY = {
    "admins": ["ops-admin"],
    "grants": [{"client": "app-a", "keys": ["a-*"], "operations": ["ed25519.*", "keys.get"]}],
}


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def full_length_p256_key():
    """A P-256 key whose x and y both take 32 bytes: PyJWT 2.6's to_jwk writes a coordinate under
    2^248 short (about 1 key in 128), and the server skips such a key (add_short_ec tests that)."""
    while True:
        key = ec.generate_private_key(ec.SECP256R1())
        nums = key.public_key().public_numbers()
        if nums.x >= 2 ** 248 and nums.y >= 2 ** 248:
            return key


class Keys:
    """An Ed25519, a P-256 and an RSA-2048 signing key, each with its kid."""

    def __init__(self):
        self.private = {
            "ed": ed25519.Ed25519PrivateKey.generate(),
            "ec": full_length_p256_key(),
            "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        }
        self.alg = {"ed": "EdDSA", "ec": "ES256", "rsa": "RS256"}
        self.to_jwk = {"ed": OKPAlgorithm.to_jwk, "ec": ECAlgorithm.to_jwk,
                       "rsa": RSAAlgorithm.to_jwk}

    def jwk(self, name):
        j = json.loads(self.to_jwk[name](self.private[name].public_key()))
        j["kid"] = name
        j["use"] = "sig"
        return j

    def jwks(self, names=("ed", "ec", "rsa")):
        return {"keys": [self.jwk(n) for n in names]}

    def add_short_ec(self):
        """A P-256 key "ec-short" whose x or y is under 2^248, so that PyJWT 2.6's to_jwk writes
        that coordinate in 31 bytes (RFC 7518 wants 32): about 1 key in 128."""
        while True:
            key = ec.generate_private_key(ec.SECP256R1())
            nums = key.public_key().public_numbers()
            if nums.x < 2 ** 248 or nums.y < 2 ** 248:
                break
        self.private["ec-short"] = key
        self.alg["ec-short"] = "ES256"
        self.to_jwk["ec-short"] = ECAlgorithm.to_jwk
        j = self.jwk("ec-short")
        short = [c for c in ("x", "y") if len(base64.urlsafe_b64decode(j[c] + "==")) < 32]
        if not short:  # a PyJWT that pads: strip the zero byte as 2.6 does
            c = "x" if nums.x < 2 ** 248 else "y"
            j[c] = b64(base64.urlsafe_b64decode(j[c] + "==")[1:])
        return j

    def public_pem(self, name):
        return self.private[name].public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def token(self, name="ed", sub="app-a", kid=None, lifetime=600, **claims):
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + lifetime}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, self.private[name], algorithm=self.alg[name],
                          headers={"kid": kid or name})


def curl(url, body, headers, http2):
    """One POST with curl (HTTP/1.1, or HTTP/2 with prior knowledge); (status, headers, body)."""
    with tempfile.NamedTemporaryFile(dir=harness._WORK) as f, \
            tempfile.NamedTemporaryFile("w", dir=harness._WORK) as h:
        f.write(body)
        f.flush()
        h.write("".join("%s: %s\n" % kv for kv in headers.items()))  # a 1 MiB one too
        h.flush()
        cmd = ["curl", "-sS", "--noproxy", "*", "-o", "-", "-D", "/dev/stderr",
               "--data-binary", "@" + f.name, "-H", "@" + h.name, url]
        cmd.append("--http2-prior-knowledge" if http2 else "--http1.1")
        r = subprocess.run(cmd, capture_output=True, timeout=30)
    head = r.stderr.decode(errors="replace")
    if r.returncode != 0:
        raise RuntimeError("curl failed (%d): %s" % (r.returncode, head[-300:]))
    statuses = re.findall(r"^HTTP/[\d.]+ (\d+)", head, re.M)
    fields = {}
    for line in head.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip().lower()] = v.strip()
    return int(statuses[-1]), fields, r.stdout


class TokenServer(harness.Server):
    pass


def verify_get(port, token):
    """A Connect GET of Ed25519Service/Verify (a real signature) with curl, HTTP/1.1; (status,
    headers, body)."""
    key = ed25519.Ed25519PrivateKey.generate()
    pk = key.public_key().public_bytes(serialization.Encoding.Raw,
                                       serialization.PublicFormat.Raw)
    msg = b"cache me?"
    req = pb.ed.VerifyRequest(public_key=pk, signature=key.sign(msg), message=msg)
    url = ("http://127.0.0.1:%d/offload.v1.Ed25519Service/Verify?connect=v1&encoding=proto"
           "&base64=1&message=%s" % (port, b64(req.SerializeToString())))
    cmd = ["curl", "-sS", "--noproxy", "*", "--http1.1", "-o", "-", "-D", "/dev/stderr", url]
    if token is not None:
        cmd += ["-H", "authorization: Bearer " + token]
    r = subprocess.run(cmd, capture_output=True, timeout=30)
    head = r.stderr.decode(errors="replace")
    if r.returncode != 0:
        raise RuntimeError("curl failed (%d): %s" % (r.returncode, head[-300:]))
    fields = {}
    for line in head.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip().lower()] = v.strip()
    return int(re.findall(r"^HTTP/[\d.]+ (\d+)", head, re.M)[-1]), fields, r.stdout


class TokensTest(harness.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.keys = Keys()
        cls.dir = tempfile.mkdtemp(prefix="tokens-", dir=harness._WORK)
        cls.jwks = os.path.join(cls.dir, "jwks.json")
        cls.write_jwks(("ed", "ec", "rsa"))
        policy = os.path.join(cls.dir, "policy.json")
        with open(policy, "w") as f:
            json.dump(POLICY, f)
        cls.audit = os.path.join(cls.dir, "audit.jsonl")
        cls.server = TokenServer("tokens", args=[
            "--jwks_file=" + cls.jwks, "--token_issuer=" + ISSUER,
            "--token_audience=" + AUDIENCE, "--policy_file=" + policy,
            "--audit_log_file=" + cls.audit, "--require_identity", "--max_token_bytes=4096",
            "--key_deletion_wait=0"])  # the grants test deletes and re-creates a key id
        cls.servers = [cls.server]
        cls.server.start()
        cls.ports = {
            "grpc": int(cls.server.address.rsplit(":", 1)[1]),
            "http": int(cls.server.flag_value("http_address").rsplit(":", 1)[1]),
        }
        cls.metrics_url = "http://%s/metrics" % cls.server.flag_value("metrics_address")
        admin = cls.server.stubs_on(cls.server.channel)
        md = cls.md(cls.keys.token("ec", sub="ops-admin"))
        for key_id in ("a-ed", "b-ed"):
            admin.keys.CreateKey(pb.keys.CreateKeyRequest(key_id=key_id,
                                                          type=pb.keys.KEY_TYPE_ED25519),
                                 metadata=md, timeout=10)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    @classmethod
    def write_jwks(cls, names):
        tmp = cls.jwks + ".tmp"
        with open(tmp, "w") as f:
            json.dump(cls.keys.jwks(names), f)
        os.replace(tmp, cls.jwks)

    @staticmethod
    def md(token):
        return [("authorization", "Bearer " + token)]

    # -- calls -------------------------------------------------------------------------------

    def grpc_sign(self, port, token, key_id="a-ed", scheme="Bearer"):
        """Sign over native gRPC on `port`; the status code."""
        channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        try:
            stub = pb.ed_grpc.Ed25519ServiceStub(channel)
            md = [] if token is None else [("authorization", "%s %s" % (scheme, token))]
            try:
                stub.Sign(pb.ed.SignRequest(key_id=key_id, message=b"m"), metadata=md, timeout=10)
                return grpc.StatusCode.OK
            except grpc.RpcError as e:
                return e.code()
        finally:
            channel.close()

    def connect_sign(self, port, token, key_id="a-ed", http2=True):
        """Sign over Connect JSON; (HTTP status, Connect error code or None)."""
        headers = {"content-type": "application/json"}
        if token is not None:
            headers["authorization"] = "Bearer " + token
        status, _, body = curl("http://127.0.0.1:%d/offload.v1.Ed25519Service/Sign" % port,
                               json.dumps({"keyId": key_id, "message": "bQ=="}).encode(),
                               headers, http2)
        return status, (json.loads(body).get("code") if status != 200 else None)

    def grpc_web_sign(self, port, token, key_id="a-ed"):
        """Sign over gRPC-Web (binary); the grpc-status it ends with."""
        msg = pb.ed.SignRequest(key_id=key_id, message=b"m").SerializeToString()
        frame = b"\x00" + len(msg).to_bytes(4, "big") + msg
        headers = {"content-type": "application/grpc-web+proto", "x-grpc-web": "1"}
        if token is not None:
            headers["authorization"] = "Bearer " + token
        status, fields, body = curl(
            "http://127.0.0.1:%d/offload.v1.Ed25519Service/Sign" % port, frame, headers, True)
        self.assertEqual(status, 200)
        if "grpc-status" in fields:  # Trailers-Only
            return int(fields["grpc-status"])
        i = 0
        while i < len(body):
            flag, n = body[i], int.from_bytes(body[i + 1:i + 5], "big")
            if flag & 0x80:
                m = re.search(rb"grpc-status:\s*(\d+)", body[i + 5:i + 5 + n])
                return int(m.group(1))
            i += 5 + n
        self.fail("no grpc-status in the gRPC-Web answer")

    def metric(self, name, **labels):
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name):
                continue
            m = re.match(r'^%s(?:\{([^}]*)\})? (\S+)$' % re.escape(name), line)
            if m and all(('%s="%s"' % kv) in (m.group(1) or "") for kv in labels.items()):
                total += float(m.group(2))
        return total

    def audit_lines(self):
        with open(self.audit) as f:
            return [json.loads(line) for line in f if line.strip()]

    # -- tests -------------------------------------------------------------------------------

    def test_a_valid_token_works_on_every_protocol_and_port(self):
        for name in ("ed", "ec", "rsa"):
            token = self.keys.token(name)
            for port_name, port in self.ports.items():
                with self.subTest(alg=name, port=port_name):
                    self.assertEqual(self.grpc_sign(port, token), grpc.StatusCode.OK)
                    self.assertEqual(self.connect_sign(port, token, http2=True), (200, None))
                    if port_name == "http":  # the gRPC port answers HTTP/1.1 with 505
                        self.assertEqual(self.connect_sign(port, token, http2=False), (200, None))
                    self.assertEqual(self.grpc_web_sign(port, token), 0)

    def test_grants_apply_to_token_identities(self):
        app = self.keys.token("ed", sub="app-a")
        other = self.keys.token("ed", sub="app-z")  # valid, no grant
        grpc_port, http_port = self.ports["grpc"], self.ports["http"]
        self.assertEqual(self.grpc_sign(grpc_port, app, key_id="b-ed"),
                         grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(self.connect_sign(http_port, app, key_id="b-ed"),
                         (403, "permission_denied"))
        self.assertEqual(self.grpc_web_sign(http_port, app, key_id="b-ed"), 7)
        self.assertEqual(self.grpc_sign(grpc_port, other), grpc.StatusCode.PERMISSION_DENIED)
        # Key lifecycle: the admin only.
        channel = grpc.insecure_channel(self.server.address)
        stub = pb.keys_grpc.KeyServiceStub(channel)
        req = pb.keys.CreateKeyRequest(key_id="a-new", type=pb.keys.KEY_TYPE_ED25519)
        with self.assertRaises(grpc.RpcError) as e:
            stub.CreateKey(req, metadata=self.md(app), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
        info = stub.GetKey(pb.keys.GetKeyRequest(key_id="a-ed"), metadata=self.md(app), timeout=10)
        self.assertEqual(info.key_id, "a-ed")
        admin = self.keys.token("rsa", sub="ops-admin")
        stub.DeleteKey(pb.keys.DeleteKeyRequest(key_id="b-ed"), metadata=self.md(admin),
                       timeout=10)
        stub.CreateKey(pb.keys.CreateKeyRequest(key_id="b-ed", type=pb.keys.KEY_TYPE_ED25519),
                       metadata=self.md(admin), timeout=10)
        channel.close()
        lifecycle = [a for a in self.audit_lines() if a["event"] == "key_delete"]
        self.assertTrue(any(a["identity"] == "ops-admin" and a["identity_source"] == "token"
                            for a in lifecycle), lifecycle)

    def test_bad_tokens_are_refused_and_audited(self):
        k = self.keys
        now = int(time.time())
        header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rsa"}).encode())
        claims = b64(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "sub": "ops-admin",
                                 "exp": now + 600}).encode())
        # Algorithm confusion: HS256 keyed with the RSA public key's PEM, which anyone has.
        confused_sig = hmac.new(k.public_pem("rsa"), (header + "." + claims).encode(),
                                hashlib.sha256).digest()
        good = k.token("ec")
        flipped = good[:-6] + ("A" if good[-6] != "A" else "B") + good[-5:]
        cases = [
            ("expired", k.token("ed", lifetime=-3600)),
            ("not_yet_valid", k.token("ed", nbf=now + 3600)),
            ("audience", k.token("ed", aud="someone-else")),
            ("issuer", k.token("ed", iss="https://evil.example")),
            ("unknown_kid", k.token("ed", kid="retired-2019")),
            ("algorithm", jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "ops-admin",
                                      "exp": now + 600}, None, algorithm="none",
                                     headers={"kid": "ed"})),
            ("algorithm", header + "." + claims + "." + b64(confused_sig)),  # HS256 confusion
            ("signature", flipped),
            ("too_large", k.token("rsa", pad="x" * 5000)),
        ]
        before = {r: self.metric("offload_token_refused_total", reason=r) for r, _ in cases}
        for reason, token in cases:
            with self.subTest(reason=reason, token=token[:24]):
                self.assertEqual(self.grpc_sign(self.ports["grpc"], token),
                                 grpc.StatusCode.UNAUTHENTICATED)
                self.assertEqual(self.connect_sign(self.ports["http"], token),
                                 (401, "unauthenticated"))
                self.assertEqual(self.grpc_web_sign(self.ports["http"], token), 16)
        for reason in before:
            n = sum(1 for r, _ in cases if r == reason)
            self.assertEqual(self.metric("offload_token_refused_total", reason=reason),
                             before[reason] + 3 * n, reason)
        # RFC 6750: a refused token is answered with how to authenticate.
        status, fields, _ = curl("http://127.0.0.1:%d/offload.v1.Ed25519Service/Sign"
                                 % self.ports["http"], b"{}",
                                 {"content-type": "application/json",
                                  "authorization": "Bearer " + flipped}, False)
        self.assertEqual((status, fields.get("www-authenticate")),
                         (401, 'Bearer error="invalid_token"'))
        # No token, another scheme: refused (require_identity), audited.
        self.assertEqual(self.grpc_sign(self.ports["grpc"], None), grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(self.grpc_sign(self.ports["grpc"], "dXNlcjpwYXNz", scheme="Basic"),
                         grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(self.connect_sign(self.ports["http"], None), (401, "unauthenticated"))
        # A 1 MiB token is over the 16 KiB header bound: refused by the engine before any token
        # code runs (431), counted as abuse, and audited as a refused request.
        abuse = self.metric("offload_http_abuse_total", reason="header_too_large")
        huge = "e" * (1 << 20)
        self.assertNotEqual(self.grpc_sign(self.ports["grpc"], huge), grpc.StatusCode.OK)
        with socket.create_connection(("127.0.0.1", self.ports["http"]), timeout=10) as c:
            try:
                c.sendall(("POST /offload.v1.Ed25519Service/Sign HTTP/1.1\r\nHost: x\r\n"
                           "Content-Type: application/json\r\nContent-Length: 2\r\n"
                           "Authorization: Bearer %s\r\n\r\n{}" % huge).encode())
            except (BrokenPipeError, ConnectionResetError):
                pass  # answered and closed before the whole header was read
            self.assertRegex(c.recv(4096), rb"^HTTP/1.1 431 ")
        time.sleep(0.2)
        refused = [a for a in self.audit_lines() if a["event"] == "request_refused"]
        self.assertTrue(any("http_max_header_bytes" in a["reason"] for a in refused), refused)
        # At least the HTTP/1.1 one (grpcio may refuse to send 1 MiB of metadata itself).
        self.assertGreaterEqual(
            self.metric("offload_http_abuse_total", reason="header_too_large"), abuse + 1)
        self.assertEqual(self.grpc_sign(self.ports["grpc"], good), grpc.StatusCode.OK)
        # Audited with the reason; no token (nor any part of one) in the audit trail or the log.
        time.sleep(0.2)
        reasons = [a["reason"] for a in self.audit_lines() if a["event"] == "unauthenticated"]
        for reason in before:
            self.assertTrue(any(r.startswith("token %s:" % reason) for r in reasons),
                            (reason, reasons))
        self.assertTrue(any("bearer token is required" in r for r in reasons), reasons)
        self.assertTrue(any("Bearer" in r for r in reasons), reasons)
        with open(self.audit, "rb") as f:
            audit = f.read()
        log = self.server._read_log()
        for token in [t for _, t in cases] + [good]:
            for part in token.split(".")[1:]:
                if len(part) >= 16:
                    self.assertNotIn(part.encode(), audit)
                    self.assertNotIn(part.encode(), log)

    def test_a_repeated_token_costs_one_signature_check(self):
        token = self.keys.token("rsa", sub="app-a", jti="memo-%d" % time.monotonic_ns())
        checks = self.metric("offload_token_checks_total", result="signature_checked")
        remembered = self.metric("offload_token_checks_total", result="remembered")
        for _ in range(10):
            self.assertEqual(self.grpc_sign(self.ports["grpc"], token), grpc.StatusCode.OK)
            self.assertEqual(self.connect_sign(self.ports["http"], token), (200, None))
        self.assertEqual(self.metric("offload_token_checks_total", result="signature_checked"),
                         checks + 1)
        self.assertGreaterEqual(self.metric("offload_token_checks_total", result="remembered"),
                                remembered + 19)

    def test_z_a_jwks_with_one_broken_key_loads_the_others(self):
        broken = self.keys.add_short_ec()
        skipped = self.metric("offload_token_jwks_keys_skipped_total")
        try:
            tmp = self.jwks + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"keys": [broken] + self.keys.jwks(("ed", "ec", "rsa"))["keys"]}, f)
            os.replace(tmp, self.jwks)
            # The reload is seen by its count (the watcher looks once a second).
            deadline = time.monotonic() + 15
            while (self.metric("offload_token_jwks_keys_skipped_total") == skipped
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            self.assertEqual(self.metric("offload_token_jwks_keys_skipped_total"), skipped + 1)
            # The file's other keys verify; tokens never seen before, so each is checked by
            # signature against the reloaded keys.
            for name in ("ed", "ec", "rsa"):
                token = self.keys.token(name, sub="app-a", jti="skip-%s" % name)
                self.assertEqual(self.grpc_sign(self.ports["grpc"], token), grpc.StatusCode.OK,
                                 name)
                self.assertEqual(self.connect_sign(self.ports["http"], token), (200, None), name)
            # The broken key's own tokens are refused (its key was skipped, not half-loaded).
            refused = self.metric("offload_token_refused_total", reason="unknown_kid")
            token = self.keys.token("ec-short", sub="app-a")
            self.assertEqual(self.grpc_sign(self.ports["grpc"], token),
                             grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(self.metric("offload_token_refused_total", reason="unknown_kid"),
                             refused + 1)
            log = self.server._read_log().decode(errors="replace")
            warnings = [json.loads(l) for l in log.splitlines()
                        if '"jwks_key_skipped"' in l and l.startswith("{")]
            self.assertTrue([w for w in warnings if w.get("kid") == "ec-short"], warnings)
            self.assertNotIn("jwks_reload_failed", log)
        finally:
            self.write_jwks(("ed", "ec", "rsa"))

    def test_a_token_get_is_private(self):
        # --require_identity: the token's answer is for its caller only; no token: 401, no-store.
        status, fields, body = verify_get(self.ports["http"], self.keys.token("ed"))
        self.assertEqual(status, 200, body)
        self.assertTrue(pb.ed.VerifyResponse.FromString(body).valid)
        self.assertEqual(fields.get("cache-control"), "private, max-age=31536000, immutable")
        self.assertIn("Authorization", fields.get("vary", ""))
        status, fields, _ = verify_get(self.ports["http"], None)
        self.assertEqual(status, 401)
        self.assertEqual(fields.get("cache-control"), "no-store")

    def test_zz_a_removed_key_is_refused_without_restart(self):
        token = self.keys.token("rsa", sub="app-a", jti="reload")
        self.assertEqual(self.grpc_sign(self.ports["grpc"], token), grpc.StatusCode.OK)
        try:
            self.write_jwks(("ed", "ec"))
            deadline = time.monotonic() + 15
            code = grpc.StatusCode.OK
            while code == grpc.StatusCode.OK and time.monotonic() < deadline:
                time.sleep(0.2)
                code = self.grpc_sign(self.ports["grpc"], token)
            self.assertEqual(code, grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(self.connect_sign(self.ports["http"], token),
                             (401, "unauthenticated"))
            # The keys still listed keep working.
            self.assertEqual(self.grpc_sign(self.ports["grpc"], self.keys.token("ec")),
                             grpc.StatusCode.OK)
            self.assertIn(b"jwks_reloaded", self.server._read_log())
        finally:
            self.write_jwks(("ed", "ec", "rsa"))


class OptionalTokenGetTest(harness.ServerTestCase):
    """Tokens without --require_identity or a policy: anonymous calls are served."""

    @classmethod
    def setUpClass(cls):
        cls.keys = Keys()
        cls.dir = tempfile.mkdtemp(prefix="tokens-get-", dir=harness._WORK)
        jwks = os.path.join(cls.dir, "jwks.json")
        with open(jwks, "w") as f:
            json.dump(cls.keys.jwks(("ed",)), f)
        cls.server = TokenServer("tokens-get", args=[
            "--jwks_file=" + jwks, "--token_issuer=" + ISSUER, "--token_audience=" + AUDIENCE])
        cls.servers = [cls.server]
        cls.server.start()
        cls.port = int(cls.server.flag_value("http_address").rsplit(":", 1)[1])

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_anonymous_get_is_public_token_get_is_private(self):
        status, fields, body = verify_get(self.port, None)
        self.assertEqual(status, 200, body)
        self.assertEqual(fields.get("cache-control"), "public, max-age=31536000, immutable")
        self.assertIn("Authorization", fields.get("vary", ""))
        status, fields, body = verify_get(self.port, self.keys.token("ed"))
        self.assertEqual(status, 200, body)
        self.assertTrue(pb.ed.VerifyResponse.FromString(body).valid)
        self.assertEqual(fields.get("cache-control"), "private, max-age=31536000, immutable")
        self.assertIn("Authorization", fields.get("vary", ""))


if __name__ == "__main__":
    unittest.main()
