"""mTLS, grants and audit: every RPC, over gRPC and over HTTP (Connect JSON), from callers with
no certificate, a certificate of another CA, a valid certificate without a grant, a non-admin
identity on admin RPCs, and a granted client. Each refusal must be the right code and appear in
the audit log; nothing may be refused for a granted client. Certificates are made here with the
openssl command line (two CAs); the server re-reads its certificate when the file changes."""
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import unittest

import grpc
from google.protobuf import json_format

import harness
from harness import pb


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


class Pki:
    """Two CAs (trusted, other) and leaf certificates, in a temp folder."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pki-", dir=harness._WORK)
        for ca in ("ca", "other-ca"):
            openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", ca + ".key", "-out", ca + ".crt", "-days", "2",
                    "-subj", "/CN=%s" % ca, "-addext", "basicConstraints=critical,CA:TRUE",
                    "-addext", "keyUsage=critical,keyCertSign", cwd=self.dir)

    def path(self, name):
        return os.path.join(self.dir, name)

    def leaf(self, name, cn, ca="ca", san=None, server=False):
        ext = os.path.join(self.dir, name + ".ext")
        with open(ext, "w") as f:
            f.write("basicConstraints=CA:FALSE\n")
            f.write("extendedKeyUsage=%s\n" % ("serverAuth" if server else "clientAuth"))
            if san:
                f.write("subjectAltName=%s\n" % san)
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=%s" % cn,
                cwd=self.dir)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
                "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", ext,
                cwd=self.dir)
        return self.path(name + ".crt"), self.path(name + ".key")

    def read(self, name):
        with open(self.path(name), "rb") as f:
            return f.read()


POLICY = {
    "admins": ["admin"],
    "grants": [
        {"client": "app-a", "keys": ["a-*"], "operations": ["*"]},
        {"client": "spiffe://offload/app-b", "keys": ["b-*"], "operations": ["aead.*"]},
    ],
}

# (service stub attribute, method, admin?) for every RPC of offload.v1.
RPCS = [
    ("keys", "CreateKey", True), ("keys", "ImportKey", True), ("keys", "RotateKey", True),
    ("keys", "DeleteKey", True), ("keys", "GetKey", False), ("keys", "ListKeys", False),
    ("ed", "Sign", False), ("ed", "BatchSign", False), ("ed", "Verify", False),
    ("ed", "BatchVerify", False), ("x", "Derive", False), ("x", "BatchDerive", False),
    ("box", "Seal", False), ("box", "BatchSeal", False), ("box", "Open", False),
    ("box", "BatchOpen", False), ("aead", "Seal", False), ("aead", "BatchSeal", False),
    ("aead", "Open", False), ("aead", "BatchOpen", False),
]
SERVICES = {"keys": "KeyService", "ed": "Ed25519Service", "x": "X25519Service",
            "box": "BoxService", "aead": "AeadService"}
# Verify of caller-supplied public keys is open to every authenticated client (open_verify).
OPEN_TO_ALL = {("ed", "Verify"), ("ed", "BatchVerify")}


class MtlsTest(harness.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.pki = pki = Pki()
        cls.server_cert, cls.server_key = pki.leaf("server", "offload", san="IP:127.0.0.1,DNS:localhost",
                                                   server=True)
        cls.ids = {
            "admin": pki.leaf("admin", "admin"),
            "app-a": pki.leaf("app-a", "ignored-cn", san="DNS:app-a"),
            "app-b": pki.leaf("app-b", "app-b", san="URI:spiffe://offload/app-b"),
            "app-c": pki.leaf("app-c", "app-c"),  # valid, no grant at all
            "intruder": pki.leaf("intruder", "app-a", ca="other-ca", san="DNS:app-a"),
        }
        # The server certificate is copied so that the test can replace it (reload).
        cls.live_cert = pki.path("live.crt")
        cls.live_key = pki.path("live.key")
        shutil.copy(cls.server_cert, cls.live_cert)
        shutil.copy(cls.server_key, cls.live_key)
        cls.policy = pki.path("policy.json")
        with open(cls.policy, "w") as f:
            json.dump(POLICY, f)
        cls.audit = pki.path("audit.jsonl")
        cls.server = MtlsServer("mtls", cls, args=[
            "--tls_cert_file=" + cls.live_cert, "--tls_key_file=" + cls.live_key,
            "--tls_client_ca_file=" + pki.path("ca.crt"), "--policy_file=" + cls.policy,
            "--audit_log_file=" + cls.audit,
            # Under the harness's 15 s stop timeout even if a refused handshake lingers.
            "--drain_timeout=5s"])
        cls.servers = [cls.server]
        cls.server.start()
        cls.http_port = int(cls.server.flag_value("http_address").rsplit(":", 1)[1])
        cls.make_keys_and_requests()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    # -- clients -----------------------------------------------------------------------------

    @classmethod
    def channel(cls, who):
        root = cls.pki.read("ca.crt")
        if who is None:
            creds = grpc.ssl_channel_credentials(root_certificates=root)
        else:
            cert, key = cls.ids[who]
            with open(cert, "rb") as c, open(key, "rb") as k:
                creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=k.read(),
                                                     certificate_chain=c.read())
        return grpc.secure_channel(cls.server.address, creds, options=[
            ("grpc.ssl_target_name_override", "localhost"), ("grpc.enable_http_proxy", 0)]
            + harness.FAST_RECONNECT)

    @classmethod
    def stubs(cls, who):
        return cls.server.stubs_on(cls.channel(who))

    @classmethod
    def ssl_context(cls, who):
        ctx = ssl.create_default_context(cafile=cls.pki.path("ca.crt"))
        if who is not None:
            ctx.load_cert_chain(*cls.ids[who])
        return ctx

    @classmethod
    def http_call(cls, who, service, method, request):
        """POSTs a Connect JSON request; returns (HTTP status, parsed body) or raises ssl errors."""
        conn = http.client.HTTPSConnection("127.0.0.1", cls.http_port, timeout=10,
                                           context=cls.ssl_context(who))
        try:
            body = json_format.MessageToJson(request).encode()
            conn.request("POST", "/offload.v1.%s/%s" % (SERVICES[service], method), body=body,
                         headers={"Content-Type": "application/json", "Host": "localhost"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"{}")
        finally:
            conn.close()

    # -- fixtures: keys (made by the admin) and one valid request per RPC ---------------------

    @classmethod
    def make_keys_and_requests(cls):
        admin = cls.stubs("admin")
        app = cls.stubs("app-a")
        K = pb.keys
        for key_id, t in (("a-ed", K.KEY_TYPE_ED25519), ("a-x", K.KEY_TYPE_X25519),
                          ("a-aead", K.KEY_TYPE_CHACHA20_POLY1305)):
            admin.keys.CreateKey(K.CreateKeyRequest(key_id=key_id, type=t), timeout=10)
        peer = admin.keys.GetKey(K.GetKeyRequest(key_id="a-x"), timeout=10).versions[0].public_key
        signed = app.ed.Sign(pb.ed.SignRequest(key_id="a-ed", message=b"m"), timeout=10)
        box = app.box.Seal(pb.box.BoxSealRequest(key_id="a-x", peer_public_key=peer,
                                                 plaintext=b"p"), timeout=10)
        env = app.aead.Seal(pb.aead.AeadSealRequest(key_id="a-aead", plaintext=b"p"),
                            timeout=10).envelope
        verify = pb.ed.VerifyRequest(public_key=signed.public_key, message=b"m",
                                     signature=signed.signature)
        derive = pb.x.DeriveRequest(key_id="a-x", peer_public_key=peer)
        sign = pb.ed.SignRequest(key_id="a-ed", message=b"m")
        bseal = pb.box.BoxSealRequest(key_id="a-x", peer_public_key=peer, plaintext=b"p")
        bopen = pb.box.BoxOpenRequest(key_id="a-x", peer_public_key=peer, nonce=box.nonce,
                                      ciphertext=box.ciphertext)
        aseal = pb.aead.AeadSealRequest(key_id="a-aead", plaintext=b"p")
        aopen = pb.aead.AeadOpenRequest(key_id="a-aead", envelope=env)
        cls.requests = {
            # Admin calls make and remove their own keys, so that each may run several times.
            ("keys", "CreateKey"): lambda: K.CreateKeyRequest(
                key_id="a-new-%d" % time.monotonic_ns(), type=K.KEY_TYPE_X25519),
            ("keys", "ImportKey"): lambda: K.ImportKeyRequest(
                key_id="a-imp-%d" % time.monotonic_ns(), type=K.KEY_TYPE_CHACHA20_POLY1305,
                secret=os.urandom(32)),
            ("keys", "RotateKey"): lambda: K.RotateKeyRequest(key_id="a-aead"),
            ("keys", "DeleteKey"): cls.disposable_key,
            ("keys", "GetKey"): lambda: K.GetKeyRequest(key_id="a-ed"),
            ("keys", "ListKeys"): lambda: K.ListKeysRequest(),
            ("ed", "Sign"): lambda: sign,
            ("ed", "BatchSign"): lambda: pb.ed.BatchSignRequest(items=[sign, sign]),
            ("ed", "Verify"): lambda: verify,
            ("ed", "BatchVerify"): lambda: pb.ed.BatchVerifyRequest(items=[verify]),
            ("x", "Derive"): lambda: derive,
            ("x", "BatchDerive"): lambda: pb.x.BatchDeriveRequest(items=[derive]),
            ("box", "Seal"): lambda: bseal,
            ("box", "BatchSeal"): lambda: pb.box.BatchBoxSealRequest(items=[bseal]),
            ("box", "Open"): lambda: bopen,
            ("box", "BatchOpen"): lambda: pb.box.BatchBoxOpenRequest(items=[bopen]),
            ("aead", "Seal"): lambda: aseal,
            ("aead", "BatchSeal"): lambda: pb.aead.BatchAeadSealRequest(items=[aseal]),
            ("aead", "Open"): lambda: aopen,
            ("aead", "BatchOpen"): lambda: pb.aead.BatchAeadOpenRequest(items=[aopen]),
        }
        cls.admin = admin

    @classmethod
    def disposable_key(cls):
        key_id = "a-del-%d" % time.monotonic_ns()
        cls.admin.keys.CreateKey(pb.keys.CreateKeyRequest(key_id=key_id,
                                                          type=pb.keys.KEY_TYPE_X25519), timeout=10)
        return pb.keys.DeleteKeyRequest(key_id=key_id)

    def audit_lines(self):
        with open(self.audit) as f:
            return [json.loads(line) for line in f if line.strip()]

    def call(self, stubs, service, method):
        return getattr(getattr(stubs, service), method)(self.requests[(service, method)](),
                                                        timeout=10)

    # -- the matrix, over gRPC ----------------------------------------------------------------

    def test_grpc_matrix(self):
        nocert, intruder = self.stubs(None), self.stubs("intruder")
        app_a, app_c, admin = self.stubs("app-a"), self.stubs("app-c"), self.stubs("admin")
        for service, method, is_admin in RPCS:
            path = "/offload.v1.%s/%s" % (SERVICES[service], method)
            with self.subTest(rpc=path):
                self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, self.call, nocert, service,
                                    method)
                # Another CA: the handshake itself is refused (no call reaches a handler).
                self.assertRpcError(grpc.StatusCode.UNAVAILABLE, self.call, intruder, service,
                                    method)
                if (service, method) not in OPEN_TO_ALL:
                    self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, self.call, app_c,
                                        service, method)
                if is_admin:
                    self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, self.call, app_a,
                                        service, method, contains="not an admin")
                    self.call(admin, service, method)
                else:
                    response = self.call(app_a, service, method)
                    for result in getattr(response, "results", []):
                        self.assertEqual(result.status.code, 0, result.status.message)
                    if method == "Verify":
                        self.assertTrue(response.valid)
        lines = self.audit_lines()
        for service, method, is_admin in RPCS:
            path = "/offload.v1.%s/%s" % (SERVICES[service], method)
            events = {(l["event"], l.get("transport")) for l in lines if l.get("method") == path}
            self.assertIn(("unauthenticated", "grpc"), events, path)
            if (service, method) not in OPEN_TO_ALL or is_admin:
                self.assertIn(("permission_denied", "grpc"), events, path)
        refused = [l for l in lines if l["event"] == "tls_handshake_refused" and
                   l["transport"] == "grpc"]
        self.assertTrue(refused, "no refused handshake audited")
        self.assertEqual(refused[0]["claimed_identity"], "app-a")
        created = [l for l in lines if l["event"] == "key_create" and l["identity"] == "admin"]
        self.assertTrue(any(l["key_id"].startswith("a-new-") for l in created), created)
        self.assertTrue(any(l["event"] == "key_delete" for l in lines))
        # Denials are counted in metrics.
        metrics = self.server.metrics_text()
        for reason in ("unauthenticated", "permission_denied", "handshake_refused"):
            value = [l for l in metrics.splitlines()
                     if l.startswith('offload_auth_denied_total{reason="%s"}' % reason)]
            self.assertTrue(value and float(value[0].split()[-1]) > 0, reason)

    def test_grant_by_uri_san_is_limited_to_its_keys(self):
        app_b = self.stubs("app-b")
        self.admin.keys.CreateKey(pb.keys.CreateKeyRequest(
            key_id="b-aead", type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305), timeout=10)
        env = app_b.aead.Seal(pb.aead.AeadSealRequest(key_id="b-aead", plaintext=b"x"),
                              timeout=10).envelope
        self.assertEqual(app_b.aead.Open(pb.aead.AeadOpenRequest(key_id="b-aead", envelope=env),
                                         timeout=10).plaintext, b"x")
        # A batch naming one key that is not granted is refused whole.
        self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, app_b.aead.BatchSeal,
                            pb.aead.BatchAeadSealRequest(items=[
                                pb.aead.AeadSealRequest(key_id="b-aead", plaintext=b"x"),
                                pb.aead.AeadSealRequest(key_id="a-aead", plaintext=b"x")]),
                            timeout=10, contains="a-aead")
        self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, app_b.x.Derive,
                            pb.x.DeriveRequest(key_id="b-x", peer_public_key=b"\x09" * 32),
                            timeout=10)

    # -- the matrix, over HTTP (Connect JSON) -------------------------------------------------

    def test_http_matrix(self):
        for service, method, is_admin in RPCS:
            path = "/offload.v1.%s/%s" % (SERVICES[service], method)
            request = self.requests[(service, method)]
            with self.subTest(rpc=path):
                status, body = self.http_call(None, service, method, request())
                self.assertEqual((status, body.get("code")), (401, "unauthenticated"), body)
                with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
                    self.http_call("intruder", service, method, request())
                if (service, method) not in OPEN_TO_ALL:
                    status, body = self.http_call("app-c", service, method, request())
                    self.assertEqual((status, body.get("code")), (403, "permission_denied"), body)
                if is_admin:
                    status, body = self.http_call("app-a", service, method, request())
                    self.assertEqual(status, 403, body)
                    status, body = self.http_call("admin", service, method, request())
                    self.assertEqual(status, 200, body)
                else:
                    status, body = self.http_call("app-a", service, method, request())
                    self.assertEqual(status, 200, body)
                    for result in body.get("results", []):
                        self.assertNotIn("code", result.get("status", {}), result)
        lines = self.audit_lines()
        for service, method, _ in RPCS:
            path = "/offload.v1.%s/%s" % (SERVICES[service], method)
            self.assertIn(("unauthenticated", "connect"),
                          {(l["event"], l.get("transport")) for l in lines
                           if l.get("method") == path}, path)
        self.assertTrue(any(l["event"] == "tls_handshake_refused" and l["transport"] == "http"
                            for l in lines))

    # -- certificate rotation without a restart ------------------------------------------------

    def served_certificate(self, port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            ctx = self.ssl_context("app-a")
            ctx.set_alpn_protocols(["h2", "http/1.1"])
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                return tls.getpeercert(binary_form=True)

    def test_server_certificate_is_reloaded_when_the_files_change(self):
        grpc_port = int(self.server.address.rsplit(":", 1)[1])
        before = {p: self.served_certificate(p) for p in (grpc_port, self.http_port)}
        new_cert, new_key = self.pki.leaf("server2", "offload-2", san="IP:127.0.0.1,DNS:localhost",
                                          server=True)
        # Replace both files atomically, key first (as a secret-mounting tool would).
        for src, dst in ((new_key, self.live_key), (new_cert, self.live_cert)):
            shutil.copy(src, dst + ".tmp")
            os.replace(dst + ".tmp", dst)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            after = {p: self.served_certificate(p) for p in before}
            if all(after[p] != before[p] for p in before):
                break
            time.sleep(0.25)
        for p in before:
            self.assertNotEqual(after[p], before[p], "port %d still serves the old certificate" % p)
        # Calls keep working on the new certificate.
        self.assertEqual(len(self.stubs("app-a").keys.ListKeys(pb.keys.ListKeysRequest(),
                                                               timeout=10).keys) > 0, True)


class MtlsServer(harness.Server):
    """A harness Server whose own channel (health checks, stop) uses TLS as the admin."""

    def __init__(self, name, test_class, args):
        super().__init__(name, args=args)
        self.test_class = test_class

    def new_channel(self):
        return self.test_class.channel("admin")

    def flag_value(self, flag):
        for arg in self.command_line:
            if arg.startswith("--%s=" % flag):
                return arg.split("=", 1)[1]
        raise KeyError(flag)

    def command(self):
        self.command_line = super().command()
        return self.command_line

    def metrics_text(self):
        import urllib.request
        url = "http://%s/metrics" % self.flag_value("metrics_address")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        return opener.open(url, timeout=5).read().decode()


if __name__ == "__main__":
    unittest.main()
