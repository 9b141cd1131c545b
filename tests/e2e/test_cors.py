"""CORS on the HTTP port, driven by curl (over HTTP/1.1 and HTTP/2 with prior knowledge).

With --http_cors_origins, a listed origin's preflight gets 204 and Access-Control-Allow-* headers;
a foreign origin's preflight is refused (403) with no Access-Control-Allow-* header, and its
actual requests get none either. Without the flag there are no CORS headers anywhere and every
preflight is refused. The browser side of the same rules is tests/e2e/web (headless Chromium).
"""

import shutil
import subprocess
import unittest

from harness import Server, ServerTestCase

ALLOWED = "https://app.example.com"
FOREIGN = ("https://evil.example.com", "https://app.example.com.evil.com", "http://app.example.com",
           "null")
DELETE = "/offload.v1.KeyService/DeleteKey"


def curl(port, path, method="GET", headers=(), body=None, http2=False):
    """(status, {lower-case header: value}) of one request made by curl."""
    cmd = ["curl", "-s", "-i", "--max-time", "10", "-X", method,
           "--http2-prior-knowledge" if http2 else "--http1.1"]
    for h in headers:
        cmd += ["-H", h]
    if body is not None:
        cmd += ["--data-binary", body]
    cmd.append("http://127.0.0.1:%d%s" % (port, path))
    out = subprocess.run(cmd, capture_output=True, check=True).stdout.decode("latin-1")
    head = out.split("\r\n\r\n", 1)[0].split("\r\n")
    status = int(head[0].split()[1])
    fields = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        fields.setdefault(name.strip().lower(), value.strip())
    return status, fields


def preflight(port, origin, http2=False):
    return curl(port, DELETE, "OPTIONS", [
        "Origin: " + origin, "Access-Control-Request-Method: POST",
        "Access-Control-Request-Headers: content-type,connect-protocol-version"], http2=http2)


@unittest.skipUnless(shutil.which("curl"), "needs curl (scripts/install-deps.sh installs it)")
class CorsTest(ServerTestCase):
    def start(self, *args):
        server = Server("cors", args=list(args)).start()
        self.addCleanup(server.stop)
        return server.bound_port("http_address")

    def assertNoAllowHeaders(self, fields, what):
        allow = sorted(k for k in fields if k.startswith("access-control-allow"))
        self.assertEqual(allow, [], what)

    def test_listed_origin_only(self):
        port = self.start("--http_cors_origins=%s,http://127.0.0.1:5173" % ALLOWED)
        for http2 in (False, True):
            what = "HTTP/2" if http2 else "HTTP/1.1"
            status, fields = preflight(port, ALLOWED, http2)
            self.assertEqual(status, 204, what)
            self.assertEqual(fields.get("access-control-allow-origin"), ALLOWED, what)
            self.assertIn("POST", fields.get("access-control-allow-methods", ""), what)
            for header in ("connect-protocol-version", "connect-timeout-ms", "x-grpc-web",
                           "x-user-agent", "grpc-timeout"):
                self.assertIn(header, fields.get("access-control-allow-headers", ""), what)
            for origin in FOREIGN:
                status, fields = preflight(port, origin, http2)
                self.assertEqual(status, 403, "%s %s" % (what, origin))
                self.assertNoAllowHeaders(fields, "%s %s" % (what, origin))
            # Actual calls: the listed origin can read the answer (and grpc-status); others not.
            status, fields = curl(port, "/offload.v1.KeyService/ListKeys", "POST",
                                  ["Origin: " + ALLOWED, "Content-Type: application/json"], "{}",
                                  http2=http2)
            self.assertEqual(status, 200, what)
            self.assertEqual(fields.get("access-control-allow-origin"), ALLOWED, what)
            self.assertIn("grpc-status", fields.get("access-control-expose-headers", ""), what)
            status, fields = curl(port, "/offload.v1.KeyService/ListKeys", "POST",
                                  ["Origin: " + FOREIGN[0], "Content-Type: application/json"],
                                  "{}", http2=http2)
            self.assertEqual(status, 200, what)
            self.assertNoAllowHeaders(fields, what)

    def test_one_origin_flag_still_works(self):
        port = self.start("--http_cors_origin=" + ALLOWED)
        self.assertEqual(preflight(port, ALLOWED)[0], 204)
        self.assertEqual(preflight(port, FOREIGN[0])[0], 403)

    def test_no_list_no_cors_headers(self):
        port = self.start()
        status, fields = preflight(port, ALLOWED)
        self.assertEqual(status, 403)
        self.assertNoAllowHeaders(fields, "preflight")
        status, fields = curl(port, "/healthz", headers=["Origin: " + ALLOWED])
        self.assertEqual(status, 200)
        self.assertEqual([k for k in fields if k.startswith("access-control")], [])

    def test_wildcards_and_paths_are_refused_at_start(self):
        binary = Server("cors-bad").binary
        for bad in ("*", "https://app.example.com/", "app.example.com"):
            # Refused by the flag check, before anything listens or touches a key store.
            run = subprocess.run(
                [binary, "--http_cors_origins=" + bad, "--data_dir=/nonexistent/cors-test",
                 "--grpc_address=127.0.0.1:0", "--http_address=127.0.0.1:0",
                 "--metrics_address="],
                capture_output=True, text=True, timeout=30)
            self.assertNotEqual(run.returncode, 0, bad)
            self.assertIn("http_cors_origins", run.stderr, bad)


if __name__ == "__main__":
    unittest.main()
