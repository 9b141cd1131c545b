"""Identities forwarded by a trusted ingress: a real nginx (Debian's) terminates TLS, checks the
client certificate, and passes it to the server in `ssl-client-cert` ($ssl_client_escaped_cert),
over HTTP/1.1 (proxy_pass) and gRPC (grpc_pass). The server trusts 127.0.0.1 (nginx) only, with
--require_identity and a grants policy.

  through nginx   the certificate's identity is the caller's: granted calls work, others are
                  PERMISSION_DENIED, key lifecycle for the admin only - on Connect and on gRPC
  around nginx    a caller on 127.0.0.2 that writes the header itself (a valid admin certificate)
                  is ignored: UNAUTHENTICATED, counted in offload_forwarded_identity_ignored_total
                  and logged
"""
import http.client
import json
import os
import ssl
import unittest
import urllib.parse
import urllib.request

import grpc
from google.protobuf import json_format

import harness
from harness import pb
from test_mtls import Pki

POLICY = {
    "admins": ["admin"],
    "grants": [{"client": "app-a", "keys": ["a-*"], "operations": ["ed25519.*"]}],
}
NGINX_CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
{user}
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  ssl_certificate {pki}/nginx.crt;
  ssl_certificate_key {pki}/nginx.key;
  ssl_client_certificate {pki}/ca.crt;
  ssl_verify_client on;
  server {{
    listen 127.0.0.1:{https_port} ssl;
    location / {{
      proxy_pass http://{http_upstream};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header ssl-client-cert $ssl_client_escaped_cert;
    }}
  }}
  server {{
    listen 127.0.0.1:{grpcs_port} ssl http2;
    location / {{
      grpc_pass grpc://{grpc_upstream};
      grpc_set_header ssl-client-cert $ssl_client_escaped_cert;
    }}
  }}
}}
"""


class ForwardedIdentityTest(harness.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(harness.NGINX, os.X_OK):
            raise unittest.SkipTest("no nginx at %s" % harness.NGINX)
        cls.pki = pki = Pki()
        pki.leaf("nginx", "nginx", san="IP:127.0.0.1,DNS:localhost", server=True)
        cls.ids = {name: pki.leaf(name, name) for name in ("admin", "app-a", "app-z")}
        policy = pki.path("policy.json")
        with open(policy, "w") as f:
            json.dump(POLICY, f)
        cls.audit = pki.path("audit.jsonl")
        cls.server = harness.Server("forwarded", args=[
            "--trusted_proxies=127.0.0.1/32", "--forwarded_identity_header=ssl-client-cert",
            "--require_identity", "--policy_file=" + policy, "--audit_log_file=" + cls.audit])
        cls.servers = [cls.server]
        cls.server.start()
        cls.http_address = cls.server.flag_value("http_address")
        cls.https_port, cls.grpcs_port = harness.free_port(), harness.free_port()
        cls.nginx = harness.Nginx(NGINX_CONF, pki=pki.dir, https_port=cls.https_port,
                                  grpcs_port=cls.grpcs_port, http_upstream=cls.http_address,
                                  grpc_upstream=cls.server.address).start(cls.https_port)
        cls.addClassCleanup(cls.nginx.close)
        admin = cls.grpc_stubs("admin")
        for key_id in ("a-ed", "b-ed"):
            admin.keys.CreateKey(pb.keys.CreateKeyRequest(key_id=key_id,
                                                          type=pb.keys.KEY_TYPE_ED25519),
                                 timeout=10)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    @classmethod
    def grpc_stubs(cls, who):
        cert, key = cls.ids[who]
        with open(cert, "rb") as c, open(key, "rb") as k:
            creds = grpc.ssl_channel_credentials(root_certificates=cls.pki.read("ca.crt"),
                                                 private_key=k.read(), certificate_chain=c.read())
        channel = grpc.secure_channel("127.0.0.1:%d" % cls.grpcs_port, creds, options=[
            ("grpc.ssl_target_name_override", "localhost"), ("grpc.enable_http_proxy", 0)])
        return cls.server.stubs_on(channel)

    def via_nginx(self, who, method, request):
        """A Connect JSON call through nginx with `who`'s certificate: (status, body)."""
        ctx = ssl.create_default_context(cafile=self.pki.path("ca.crt"))
        ctx.load_cert_chain(*self.ids[who])
        conn = http.client.HTTPSConnection("127.0.0.1", self.https_port, timeout=10,
                                           context=ctx)
        return self.post(conn, method, request, {"Host": "localhost"})

    def direct(self, method, request, headers, source="127.0.0.2"):
        host, port = self.http_address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, 0))
        return self.post(conn, method, request, headers)

    @staticmethod
    def post(conn, method, request, headers):
        try:
            conn.request("POST", "/offload.v1.%s" % method,
                         body=json_format.MessageToJson(request).encode(),
                         headers=dict(headers, **{"Content-Type": "application/json"}))
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"{}")
        finally:
            conn.close()

    def sign(self, key_id):
        return pb.ed.SignRequest(key_id=key_id, message=b"m")

    def test_identity_from_nginx_is_the_callers(self):
        self.assertEqual(self.via_nginx("app-a", "Ed25519Service/Sign", self.sign("a-ed"))[0], 200)
        status, body = self.via_nginx("app-a", "Ed25519Service/Sign", self.sign("b-ed"))
        self.assertEqual((status, body.get("code")), (403, "permission_denied"))
        self.assertEqual(self.via_nginx("app-z", "Ed25519Service/Sign", self.sign("a-ed"))[0], 403)
        create = pb.keys.CreateKeyRequest(key_id="a-x", type=pb.keys.KEY_TYPE_X25519)
        self.assertEqual(self.via_nginx("app-a", "KeyService/CreateKey", create)[0], 403)
        self.assertEqual(self.via_nginx("admin", "KeyService/CreateKey", create)[0], 200)
        with open(self.audit) as f:
            audit = [json.loads(line) for line in f]
        self.assertTrue(any(a["event"] == "key_create" and a["identity"] == "admin" and
                            a["identity_source"] == "forwarded" for a in audit), audit)

    def test_identity_from_nginx_over_grpc(self):
        app = self.grpc_stubs("app-a")
        self.assertTrue(app.ed.Sign(self.sign("a-ed"), timeout=10).signature)
        self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, app.ed.Sign, self.sign("b-ed"),
                            timeout=10)

    def test_the_header_from_anyone_else_is_ignored(self):
        with open(self.ids["admin"][0]) as f:
            forged = urllib.parse.quote(f.read(), safe="")
        before = self.ignored()
        status, body = self.direct("Ed25519Service/Sign", self.sign("a-ed"),
                                   {"ssl-client-cert": forged})
        self.assertEqual((status, body.get("code")), (401, "unauthenticated"))
        create = pb.keys.CreateKeyRequest(key_id="a-forged", type=pb.keys.KEY_TYPE_X25519)
        self.assertEqual(self.direct("KeyService/CreateKey", create,
                                     {"ssl-client-cert": forged})[0], 401)
        self.assertEqual(self.ignored(), before + 2)
        self.assertIn(b"forwarded_identity_ignored", self.server._read_log())
        # From the trusted address, no header and no certificate: no identity either.
        self.assertEqual(self.direct("Ed25519Service/Sign", self.sign("a-ed"), {},
                                     source="127.0.0.1")[0], 401)

    def ignored(self):
        url = "http://%s/metrics" % self.server.flag_value("metrics_address")
        for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
            if line.startswith("offload_forwarded_identity_ignored_total"):
                return float(line.split()[-1])
        self.fail("offload_forwarded_identity_ignored_total not exported")


if __name__ == "__main__":
    unittest.main()
