"""Offline checks of the deployment files (deploy/, docker-compose.yml, .dockerignore).

Run by ctest (label `deploy`) with Debian's /usr/bin/python3; each class is one ctest test:
  NginxTest       nginx -t on deploy/nginx/nginx.conf and deploy/k8s/nginx.conf rendered to
                  loopback, then the compose config run by a real nginx in front of three gRPC and
                  three HTTP backends: one key -> one replica, keys spread, keyless calls spread,
                  and when a replica stops only its keys move. The Kubernetes config run in front
                  of TLS backends, its clients speaking TLS to it (plaintext refused): it passes
                  the authorization header and checks the backends' certificate.
  ComposeTest     `docker-compose config` (Debian's docker-compose 1.29) accepts docker-compose.yml,
                  and the resolved file has what the deployment relies on.
  DockerfileTest  deploy/docker/Dockerfile builds the targets scripts/serve.sh (and the README)
                  build, its configure line configures this tree, the runtime stage holds exactly
                  the runtime packages of the libraries the binaries load, no compiler, non-root.
  FlagsTest       the server accepts every flag the compose file and the Kubernetes ConfigMap pass.
  K8sTest         validate_k8s.mjs on deploy/k8s passes, and fails on a broken copy.
No Docker engine or Kubernetes cluster is used: neither can run here.
"""

import http.client
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.abspath(os.environ.get("OFFLOAD_SOURCE_DIR",
                                      os.path.join(os.path.dirname(__file__), "..", "..")))
HERE = os.path.dirname(os.path.abspath(__file__))


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def tool(env_name, default):
    path = os.environ.get(env_name) or shutil.which(default) or ""
    if not path:
        raise unittest.SkipTest(f"{default} not found (set {env_name})")
    return path


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loopback_ports import free_port  # noqa: E402  (below the ephemeral range)


def wait_port(port, deadline_s=10):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {deadline_s} s")


# ---------------------------------------------------------------------------------------------
# nginx
# The replicas' --max_message_bytes (its default), and the largest request body they accept for
# it: http::MaxBody (service/http/rpc_codec.cc), a gRPC-Web text body - base64 of the message and
# its 5-byte frame header, plus 4 KiB for line breaks. The routers must pass both.
MAX_MESSAGE_BYTES = 16 << 20
MAX_BODY_BYTES = (MAX_MESSAGE_BYTES + 5 + 2) // 3 * 4 + 4096


# Where deploy/k8s/nginx.yaml mounts ca.crt of the offload-tls Secret: the CA the Kubernetes router
# checks the replicas' certificates against (grpcs:// and https:// upstreams).
K8S_UPSTREAM_CA = "/etc/nginx/offload-tls/ca.crt"
# Where it mounts the router's own certificate and key (the kubernetes.io/tls Secret
# offload-router-tls), which it presents to clients on both ports; and a name that certificate
# carries (deploy/README.md).
K8S_ROUTER_CERT = "/etc/nginx/router-tls/tls.crt"
K8S_ROUTER_KEY = "/etc/nginx/router-tls/tls.key"
K8S_ROUTER_NAME = "offload-nginx.crypto-offload.svc"


def make_certs(tmp, names):
    """A throwaway CA, `tmp`/ca.crt, and per name a server certificate for that DNS name signed by
    it: [(key PEM path, certificate PEM path)], made with the openssl command."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)

    ca_key, ca = os.path.join(tmp, "ca.key"), os.path.join(tmp, "ca.crt")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "1",
            "-subj", "/CN=offload test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign")
    out = []
    for i, name in enumerate(names):
        key, csr, crt, ext = (os.path.join(tmp, f"server-{i}.{x}") for x in ("key", "csr", "crt", "ext"))
        with open(ext, "w") as f:
            f.write(f"subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth\n")
        openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                "-days", "1", "-extfile", ext, "-out", crt)
        out.append((key, crt))
    return out


def render_nginx(conf, grpc_upstreams, http_upstreams, grpc_listen, http_listen, tmp,
                 upstream_ca=None, router_cert=None):
    """The config with its upstreams, listeners and writable paths on loopback / in `tmp`, and
    the Kubernetes config's upstream CA at `upstream_ca` and its own certificate at `router_cert`
    (key PEM path, certificate PEM path). Every replacement must happen exactly as often as the
    config is known to need it."""
    def sub(pattern, repl, text, count_wanted):
        text, n = re.subn(pattern, repl, text)
        if n != count_wanted:
            raise AssertionError(f"nginx.conf: {pattern!r} matched {n} times, want {count_wanted}")
        return text

    if "offload-headless:" in conf:          # deploy/k8s/nginx.conf: one name, every pod
        conf = sub(r"server offload-headless:50051", f"server 127.0.0.1:{grpc_upstreams[0]}", conf, 1)
        conf = sub(r"server offload-headless:8080", f"server 127.0.0.1:{http_upstreams[0]}", conf, 1)
        conf = conf.replace("/tmp/", tmp + "/")
        conf = sub(r"_ssl_trusted_certificate " + re.escape(K8S_UPSTREAM_CA) + ";",
                   f"_ssl_trusted_certificate {upstream_ca};", conf, 2)
        conf = sub(r"\bssl_certificate " + re.escape(K8S_ROUTER_CERT) + ";",
                   f"ssl_certificate {router_cert[1]};", conf, 1)
        conf = sub(r"\bssl_certificate_key " + re.escape(K8S_ROUTER_KEY) + ";",
                   f"ssl_certificate_key {router_cert[0]};", conf, 1)
        tls = " ssl"                          # the Kubernetes router: TLS to clients
    else:                                     # deploy/nginx/nginx.conf: offload-1..3
        for i in range(3):
            conf = sub(rf"server offload-{i + 1}:50051", f"server 127.0.0.1:{grpc_upstreams[i]}", conf, 1)
            conf = sub(rf"server offload-{i + 1}:8080", f"server 127.0.0.1:{http_upstreams[i]}", conf, 1)
        paths = "".join(f"\n    {k}_temp_path {tmp}/{k};"
                        for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        conf = sub(r"\nhttp \{", "\nhttp {" + paths, conf, 1)
        tls = ""
    conf = sub(rf"listen 50051{tls} http2;", f"listen 127.0.0.1:{grpc_listen}{tls} http2;", conf, 1)
    conf = sub(rf"listen 8080{tls};", f"listen 127.0.0.1:{http_listen}{tls};", conf, 1)
    return conf


def normalized(conf):
    """Directives without comments, paths, upstream servers and TLS: what both configs must share.
    The Kubernetes router talks TLS to the replicas (grpcs://, https:// and the grpc_ssl_* /
    proxy_ssl_* lines that check their certificate) and to its clients (`ssl` on the listen lines,
    the ssl_* lines of its certificate); compose's router and replicas are plain."""
    out = []
    for line in conf.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or re.match(r"(pid |\w+_temp_path |server offload-|grpc_ssl_|proxy_ssl_|ssl_)", line):
            continue
        line = re.sub(r"^(listen \S+) ssl\b", r"\1", line)
        out.append(re.sub(r"^(grpc_pass grpc|proxy_pass http)s://", r"\1://", line))
    return out


class HttpBackend:
    """Answers its name, or at /auth the request's Authorization header; TLS with `tls` (key
    path, certificate path). `calls`: how many /auth requests arrived."""
    def __init__(self, name, tls=None):
        self.calls = 0
        lock = threading.Lock()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if self.path == "/auth":
                    with lock:
                        backend.calls += 1
                body = (self.headers.get("Authorization", "") if self.path == "/auth" else name).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls:
            import ssl
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls[1], tls[0])
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class GrpcBackend:
    """offload.test.Echo/Who answers its name, /Auth the call's authorization metadata; TLS with
    `tls` (key path, certificate path). `calls`: how many /Auth calls arrived."""
    def __init__(self, name, tls=None):
        import grpc
        self.calls = 0
        lock = threading.Lock()

        def auth(request, context):
            with lock:
                self.calls += 1
            return dict(context.invocation_metadata()).get("authorization", "").encode()

        handler = grpc.method_handlers_generic_handler(
            "offload.test.Echo",
            {"Who": grpc.unary_unary_rpc_method_handler(lambda request, context: name.encode()),
             "Auth": grpc.unary_unary_rpc_method_handler(auth)})
        # As a replica, it takes messages of up to --max_message_bytes (grpcio's default is 4 MiB).
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                                  options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        self.server.add_generic_rpc_handlers((handler,))
        if tls:
            pem = []
            for path in tls:
                with open(path, "rb") as f:
                    pem.append(f.read())
            self.port = self.server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([tuple(pem)]))
        else:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self):
        self.server.stop(0).wait(5)


class NginxTest(unittest.TestCase):
    def setUp(self):
        self.nginx = tool("OFFLOAD_NGINX", "nginx")
        self.tmp = tempfile.mkdtemp(prefix="offload-nginx-")
        os.chmod(self.tmp, 0o755)   # nginx workers run as `nobody` when the test runs as root
        self.procs = []
        self.backends = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for b in self.backends:
            try:
                b.stop()
            except Exception:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def check_config(self, rel, *ports, tmp=None, upstream_ca=None, router_cert=None):
        """nginx -t on `rel` rendered into `tmp` (default the test's folder); the Kubernetes
        config's upstream CA is `upstream_ca` and its own certificate `router_cert` (key path,
        certificate path), by default a throwaway CA and a certificate it signed for the router.
        Returns the command that runs it."""
        tmp = tmp or self.tmp
        conf = read(rel)
        if K8S_UPSTREAM_CA in conf and (upstream_ca is None or router_cert is None):
            self.assertTrue(upstream_ca is None and router_cert is None, "give both or neither")
            (router_cert,) = make_certs(tmp, [K8S_ROUTER_NAME])
            upstream_ca = os.path.join(tmp, "ca.crt")
        conf = render_nginx(conf, *ports, tmp, upstream_ca, router_cert)
        path = os.path.join(tmp, os.path.basename(rel).replace(".conf", "") + "-test.conf")
        with open(path, "w") as f:
            f.write(conf)
        args = [self.nginx, "-p", tmp + "/", "-c", path, "-e", "stderr"]
        pid = "" if re.search(r"^pid ", conf, re.M) else f"pid {tmp}/nginx.pid;"
        r = subprocess.run(args + (["-g", pid] if pid else []) + ["-t"], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(r.returncode, 0, f"nginx -t {rel}:\n{r.stderr}")
        self.assertIn("test is successful", r.stderr)
        return args + ["-g", f"daemon off; {pid}"]

    def test_configs_and_key_routing(self):
        import grpc
        # The Kubernetes router is the compose one with other upstreams and paths, and TLS to the
        # replicas and to its clients (what normalized() leaves out).
        self.assertEqual(normalized(read("deploy/nginx/nginx.conf")), normalized(read("deploy/k8s/nginx.conf")),
                         "deploy/k8s/nginx.conf drifted from deploy/nginx/nginx.conf")
        for directive in ("grpc_pass grpcs://", "proxy_pass https://", "grpc_ssl_verify on;",
                          "proxy_ssl_verify on;", "listen 50051 ssl http2;", "listen 8080 ssl;",
                          f"ssl_certificate {K8S_ROUTER_CERT};", f"ssl_certificate_key {K8S_ROUTER_KEY};"):
            self.assertIn(directive, read("deploy/k8s/nginx.conf"))
        names = ["replica-1", "replica-2", "replica-3"]
        grpc_backends = [GrpcBackend(n) for n in names]
        http_backends = [HttpBackend(n) for n in names]
        self.backends += grpc_backends + http_backends
        grpc_ports = [b.port for b in grpc_backends]
        http_ports = [b.port for b in http_backends]

        self.check_config("deploy/k8s/nginx.conf", grpc_ports, http_ports, free_port(), free_port())
        grpc_listen, http_listen = free_port(), free_port()
        args = self.check_config("deploy/nginx/nginx.conf", grpc_ports, http_ports, grpc_listen, http_listen)
        log = open(os.path.join(self.tmp, "nginx.log"), "w")
        self.addCleanup(log.close)
        self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log))
        wait_port(grpc_listen)
        wait_port(http_listen)

        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_listen}")
        self.addCleanup(channel.close)
        who = channel.unary_unary("/offload.test.Echo/Who")

        # The largest bodies a replica accepts pass the router (never nginx's 413): a gRPC
        # message of --max_message_bytes, and a gRPC-Web text body of one.
        self.assertIn(who(b"m" * MAX_MESSAGE_BYTES, timeout=60).decode(), names)
        req = urllib.request.Request(f"http://127.0.0.1:{http_listen}/offload.v1.AeadService/Seal",
                                     data=b"A" * MAX_BODY_BYTES, method="POST",
                                     headers={"Content-Type": "application/grpc-web-text"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            self.assertIn(resp.read().decode(), names)

        def via_grpc(key=None):
            md = [("x-offload-key", key)] if key is not None else []
            return who(b"", metadata=md, timeout=10).decode()

        def via_http(key=None):
            req = urllib.request.Request(f"http://127.0.0.1:{http_listen}/offload.v1.AeadService/Seal",
                                         data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})
            if key is not None:
                req.add_header("x-offload-key", key)
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.read().decode()

        keys = [f"tenant-{i}/key-{i * 7919 % 1000}" for i in range(30)]
        for proto, call in (("grpc", via_grpc), ("http", via_http)):
            with self.subTest(proto=proto):
                placement = {}
                for k in keys:
                    seen = {call(k) for _ in range(3)}
                    self.assertEqual(len(seen), 1, f"{proto}: key {k} reached {seen}")
                    placement[k] = seen.pop()
                used = set(placement.values())
                self.assertGreaterEqual(len(used), 2, f"{proto}: 30 keys all on {used}")
                keyless = {call() for _ in range(30)}
                self.assertGreaterEqual(len(keyless), 2, f"{proto}: keyless calls all on {keyless}")
                counts = {n: list(placement.values()).count(n) for n in names}
                print(f"{proto}: 30 keys per replica {counts}; keyless calls reached {sorted(keyless)}")

                # Stop the replica holding the most keys: its keys move, no other key does.
                gone = max(counts, key=counts.get)
                backend = (grpc_backends if proto == "grpc" else http_backends)[names.index(gone)]
                backend.stop()
                self.backends.remove(backend)
                for k in keys:
                    now = call(k)
                    self.assertNotEqual(now, gone, f"{proto}: key {k} still routed to the stopped replica")
                    if placement[k] != gone:
                        self.assertEqual(now, placement[k], f"{proto}: key {k} moved without cause")

    def test_k8s_router_tls_to_replicas(self):
        # deploy/k8s/nginx.conf run by a real nginx in front of TLS backends, its clients speaking
        # TLS to it and checking its certificate against the throwaway CA: calls pass with their
        # authorization header (token callers work through the router, and the token is never in
        # clear on either hop); gRPC gets h2 by ALPN on the gRPC port, Connect / gRPC-Web HTTP/1.1
        # on the HTTP port; plaintext to either port is refused; a backend whose certificate does
        # not carry the configured name is refused (nginx checks it).
        import grpc
        import ssl
        conf = read("deploy/k8s/nginx.conf")
        names = set(re.findall(r"^\s*(?:grpc|proxy)_ssl_name (\S+);", conf, re.M))
        self.assertEqual(len(names), 1, f"want one grpc_ssl_name / proxy_ssl_name, got {names}")
        (good, wrong, router) = make_certs(self.tmp, [names.pop(), "not-the-replica.invalid", K8S_ROUTER_NAME])
        ca = os.path.join(self.tmp, "ca.crt")
        with open(ca, "rb") as f:
            ca_pem = f.read()
        client_tls = ssl.create_default_context(cafile=ca)   # verifies the chain and the name
        token = "Bearer eyJhbGciOiJFZERTQSJ9.e30.c2ln"

        def tls_session(port, alpn):
            """A verified TLS connection to the router as K8S_ROUTER_NAME: the ALPN protocol."""
            ctx = ssl.create_default_context(cafile=ca)
            ctx.set_alpn_protocols(alpn)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                with ctx.wrap_socket(raw, server_hostname=K8S_ROUTER_NAME) as conn:
                    return conn.selected_alpn_protocol()

        def https_post(port, path, headers):
            """POST over TLS to the router, verified as K8S_ROUTER_NAME: (status, body)."""
            conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=client_tls)
            raw = socket.create_connection(("127.0.0.1", port), timeout=10)
            conn.sock = client_tls.wrap_socket(raw, server_hostname=K8S_ROUTER_NAME)
            try:
                conn.request("POST", path, body=b"{}", headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read().decode()
            finally:
                conn.close()

        for cert, want_ok in ((good, True), (wrong, False)):
            with self.subTest(certificate="right name" if want_ok else "wrong name"):
                tmp = tempfile.mkdtemp(prefix="k8s-", dir=self.tmp)
                os.chmod(tmp, 0o755)
                gb, hb = GrpcBackend("replica", tls=cert), HttpBackend("replica", tls=cert)
                self.backends += [gb, hb]
                grpc_listen, http_listen = free_port(), free_port()
                args = self.check_config("deploy/k8s/nginx.conf", [gb.port], [hb.port], grpc_listen,
                                         http_listen, tmp=tmp, upstream_ca=ca, router_cert=router)
                log = open(os.path.join(tmp, "nginx.log"), "w")
                self.addCleanup(log.close)
                self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log))
                wait_port(grpc_listen)
                wait_port(http_listen)
                channel = grpc.secure_channel(
                    f"127.0.0.1:{grpc_listen}", grpc.ssl_channel_credentials(root_certificates=ca_pem),
                    options=[("grpc.ssl_target_name_override", K8S_ROUTER_NAME)])
                self.addCleanup(channel.close)
                auth = channel.unary_unary("/offload.test.Echo/Auth")
                headers = {"Authorization": token, "Content-Type": "application/json"}
                if want_ok:
                    self.assertEqual(auth(b"", metadata=[("authorization", token)], timeout=10).decode(), token)
                    self.assertEqual(https_post(http_listen, "/auth", headers), (200, token))
                    # Protocols: h2 by ALPN for gRPC; HTTP/1.1 on the Connect / gRPC-Web port.
                    self.assertEqual(tls_session(grpc_listen, ["h2"]), "h2")
                    self.assertEqual(tls_session(http_listen, ["h2", "http/1.1"]), "http/1.1")
                    # Plaintext is refused on both ports: nothing reaches a backend.
                    plain = grpc.insecure_channel(f"127.0.0.1:{grpc_listen}")
                    self.addCleanup(plain.close)
                    with self.assertRaises(grpc.RpcError) as e:
                        plain.unary_unary("/offload.test.Echo/Auth")(
                            b"", metadata=[("authorization", token)], timeout=10)
                    self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
                    req = urllib.request.Request(f"http://127.0.0.1:{http_listen}/auth", data=b"{}",
                                                 method="POST", headers=headers)
                    with self.assertRaises(urllib.error.HTTPError) as e:
                        urllib.request.urlopen(req, timeout=10)
                    self.assertEqual(e.exception.code, 400)
                    self.assertIn("plain HTTP request was sent to HTTPS port", e.exception.read().decode())
                    # A client that does not trust the router's CA does not get through.
                    with self.assertRaises(ssl.SSLCertVerificationError):
                        with socket.create_connection(("127.0.0.1", http_listen), timeout=10) as raw:
                            ssl.create_default_context().wrap_socket(raw, server_hostname=K8S_ROUTER_NAME)
                else:
                    with self.assertRaises(grpc.RpcError) as e:
                        auth(b"", metadata=[("authorization", token)], timeout=10)
                    self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
                    self.assertEqual(https_post(http_listen, "/auth", headers)[0], 502)
                    with open(os.path.join(tmp, "nginx.log")) as f:
                        self.assertIn("upstream SSL certificate does not match", f.read())
                self.assertEqual(gb.calls + hb.calls, 2 if want_ok else 0,
                                 "backend calls: one gRPC and one HTTPS call over TLS, nothing else")


# ---------------------------------------------------------------------------------------------
# docker-compose


class ComposeTest(unittest.TestCase):
    def test_config(self):
        import yaml
        compose = tool("OFFLOAD_DOCKER_COMPOSE", "docker-compose")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OFFLOAD_", "COMPOSE_", "DOCKER_"))}
        cmd = [compose, "--project-directory", ROOT, "-f", os.path.join(ROOT, "docker-compose.yml"), "config"]
        r = subprocess.run(cmd + ["-q"], capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(r.returncode, 0, f"docker-compose config -q:\n{r.stderr}")
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=True)
        cfg = yaml.safe_load(r.stdout)
        services = cfg["services"]
        for name in ("nginx", "postgres", "prometheus", "grafana"):
            self.assertIn(name, services)
        replicas = sorted(s for s in services if re.fullmatch(r"offload-\d+", s))
        self.assertEqual(replicas, ["offload-1", "offload-2", "offload-3"])

        drain = None
        for name in replicas:
            svc = services[name]
            cmdline = svc["command"]
            self.assertIn("--keystore=postgres", cmdline, name)
            self.assertIn("--kek_file=/run/secrets/offload_kek", cmdline, name)
            self.assertIn("OFFLOAD_POSTGRES_DSN", svc["environment"], name)
            self.assertNotIn("password", svc["environment"]["OFFLOAD_POSTGRES_DSN"].lower(), name)
            self.assertEqual({s["source"] for s in svc["secrets"]}, {"offload_kek", "postgres_password"})
            self.assertTrue(svc.get("read_only"), f"{name}: root filesystem not read-only")
            self.assertIn("ALL", svc.get("cap_drop", []), name)
            drain = next(int(a.split("=")[1].rstrip("s")) for a in cmdline if a.startswith("--drain_timeout="))
            grace = svc["stop_grace_period"]
            self.assertGreater(int(grace.rstrip("s")), drain, f"{name}: stop_grace_period {grace} <= drain")
        # No secret value in the file: nothing that looks like a key (32+ hex) or a password.
        text = read("docker-compose.yml")
        self.assertIsNone(re.search(r"\b[0-9a-fA-F]{32,}\b", text), "a hex key in docker-compose.yml")
        self.assertNotIn("POSTGRES_PASSWORD:", text)
        for name, sec in cfg["secrets"].items():
            self.assertTrue(sec["file"].startswith(os.path.join(ROOT, "deploy/secrets/")), sec)
        self.assertIn("deploy/secrets/", read(".dockerignore"))
        # Every bind-mounted repository file exists (a typo would mount an empty folder).
        mounted = set()
        for name, svc in services.items():
            for v in svc.get("volumes", []):
                src = v["source"] if isinstance(v, dict) else v.split(":")[0]
                if src.startswith(ROOT):
                    self.assertTrue(os.path.exists(src), f"{name}: {src} does not exist")
                    mounted.add(os.path.relpath(src, ROOT))
        self.assertIn("deploy/nginx/nginx.conf", mounted)
        self.assertIn("deploy/grafana/dashboards", mounted)
        self.assertIn("deploy/grafana/provisioning/dashboards/offload.yml", mounted)
        # The nginx upstreams are the replica services; Prometheus scrapes each of them.
        nginx_conf = read("deploy/nginx/nginx.conf")
        prom = read("deploy/prometheus/prometheus-compose.yml")
        for name in replicas:
            self.assertIn(f"server {name}:50051", nginx_conf)
            self.assertIn(f"server {name}:8080", nginx_conf)
            self.assertIn(f'"{name}:9464"', prom)
        promtool = shutil.which("promtool")
        if promtool:
            r = subprocess.run([promtool, "check", "config", "prometheus-compose.yml"],
                               cwd=os.path.join(ROOT, "deploy/prometheus"), capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


# ---------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_stages(text):
    """[(stage name, [(instruction, argument text)])] with continuation lines joined."""
    text = re.sub(r"^\s*#.*\n", "", text, flags=re.M)
    text = re.sub(r"\\\n", " ", text)
    stages = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        instr, _, arg = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", arg.strip(), re.I)
            stages.append((m.group(2) or m.group(1), m.group(1), []))
        else:
            stages[-1][2].append((instr, arg.strip()))
    return stages


def build_targets(shell_text):
    """Targets of every `cmake --build ... --target a b` in a shell text."""
    targets = set()
    for m in re.finditer(r"cmake --build\s[^\n]*?--target\s+([^\n&;|]+)", shell_text):
        for tok in m.group(1).split():
            if tok.startswith("-") or tok == "\\":
                break
            targets.add(tok)
    return targets


def apt_packages(run_text):
    pkgs = set()
    for m in re.finditer(r"apt-get install ([^&]+)", run_text):
        pkgs |= {t for t in m.group(1).split() if not t.startswith("-")}
    return pkgs


class DockerfileTest(unittest.TestCase):
    def setUp(self):
        self.dockerfile = read("deploy/docker/Dockerfile")
        self.stages = dockerfile_stages(self.dockerfile)
        self.assertEqual(len(self.stages), 2, "want a builder and a runtime stage")
        (self.builder_name, self.builder_base, self.builder), (_, self.runtime_base, self.runtime) = self.stages
        self.builder_run = " && ".join(a for i, a in self.builder if i == "RUN")
        self.runtime_run = " && ".join(a for i, a in self.runtime if i == "RUN")

    def expected_targets(self):
        serve = build_targets(read("scripts/serve.sh"))
        self.assertTrue(serve, "no `cmake --build ... --target` in scripts/serve.sh")
        return serve | build_targets(read("README.md"))

    def test_same_targets_as_serve_and_readme(self):
        self.assertEqual(self.builder_base, "debian:12")
        self.assertEqual(self.runtime_base, "debian:12-slim")
        targets = self.expected_targets()
        self.assertEqual(build_targets(self.builder_run), targets)
        copies = " ".join(a for i, a in self.runtime if i == "COPY" and f"--from={self.builder_name}" in a)
        for t in targets:
            self.assertIn(f"build/bin/{t}", copies, f"runtime stage does not copy {t}")

    def test_builder_configure_line_configures_this_tree(self):
        # The builder's configure command, run here against this tree in a scratch folder; then
        # ninja's dry run of its targets: a flag or target the tree no longer has fails here.
        m = re.search(r"(cmake -S \. -B build [^&]+)", self.builder_run)
        self.assertIsNotNone(m, "no `cmake -S . -B build ...` in the builder stage")
        argv = shlex.split(m.group(1))
        self.assertIn("-DCMAKE_BUILD_TYPE=Release", argv)
        with tempfile.TemporaryDirectory(prefix="offload-docker-cfg-") as tmp:
            argv[argv.index("-S") + 1] = ROOT
            argv[argv.index("-B") + 1] = tmp
            r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            ninja = shutil.which("ninja") or "ninja"
            r = subprocess.run([ninja, "-C", tmp, "-n"] + sorted(self.expected_targets()),
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])

    def test_builder_has_the_build_packages(self):
        # Every -dev package scripts/install-deps.sh installs, but those of tests and benchmarks.
        deps = read("scripts/install-deps.sh")
        m = re.search(r"packages=\((.*?)\n\)", deps, re.S)
        listed = {t for line in m.group(1).splitlines()
                  for t in line.split("#", 1)[0].split()}
        # libclang-rt-14-dev: the sanitizer and libFuzzer runtimes of the test build (clang ASan).
        test_only = {"libgtest-dev", "libgmock-dev", "libbenchmark-dev", "libclang-rt-14-dev"}
        wanted = {p for p in listed if p.endswith("-dev")} - test_only
        wanted |= {"build-essential", "cmake", "ninja-build", "pkg-config", "protobuf-compiler",
                   "protobuf-compiler-grpc"}
        missing = wanted - apt_packages(self.builder_run)
        self.assertFalse(missing, f"builder stage lacks {sorted(missing)}")

    def test_runtime_has_exactly_the_runtime_libraries(self):
        # The Debian packages of the shared libraries the built binaries load (DT_NEEDED), less
        # those every debian:12-slim has, must be the runtime stage's package list.
        binaries = [os.environ.get("OFFLOAD_SERVER"), os.environ.get("OFFLOAD_CTL")]
        if not all(binaries):
            self.skipTest("OFFLOAD_SERVER / OFFLOAD_CTL not set (ctest sets them)")
        needed = set()
        for b in binaries:
            out = subprocess.run(["objdump", "-p", b], capture_output=True, text=True, check=True).stdout
            needed |= set(re.findall(r"^\s*NEEDED\s+(\S+)", out, re.M))
        paths = {}
        for b in binaries:
            out = subprocess.run(["ldd", b], capture_output=True, text=True, check=True).stdout
            for name, path in re.findall(r"^\s*(\S+) => (/\S+)", out, re.M):
                paths[name] = path
        # dpkg knows a file by the path its package ships (/lib or /usr/lib: usrmerge); one
        # `dpkg -S` over every candidate path (each call reads the whole database).
        # Any shared library of the project's own would come from the build tree, not from a
        # package: the Dockerfile must then copy it where the RUNPATH looks.
        build_root = os.path.realpath(os.path.join(os.path.dirname(binaries[0]), ".."))
        own = {lib for lib in needed
               if lib in paths and os.path.realpath(paths[lib]).startswith(build_root + os.sep)}
        for lib in sorted(own):
            rel = os.path.relpath(os.path.dirname(os.path.realpath(paths[lib])), build_root)
            self.assertIn(f"/src/build/{rel}/", self.dockerfile,
                          f"{lib} is built by the project ({rel}) but the Dockerfile does not copy it")
        needed -= own
        candidates = {}
        for lib in sorted(needed):
            self.assertIn(lib, paths, f"ldd does not resolve {lib}")
            for p in {paths[lib], os.path.realpath(paths[lib])}:
                for cand in (p, re.sub(r"^/usr/lib/", "/lib/", p), re.sub(r"^/lib/", "/usr/lib/", p)):
                    candidates[cand] = lib
        out = subprocess.run(["dpkg", "-S"] + sorted(candidates), capture_output=True, text=True).stdout
        owners = {}
        for line in out.splitlines():
            pkg, _, path = line.partition(": ")
            if path in candidates:
                owners[candidates[path]] = pkg.split(":")[0]
        unowned = sorted(set(needed) - set(owners))
        self.assertFalse(unowned, f"no Debian package owns {unowned}")
        packages = set(owners.values())
        base = {"libc6", "libgcc-s1", "libstdc++6"}   # in debian:12-slim (required by apt)
        runtime = apt_packages(self.runtime_run)
        self.assertEqual(runtime, packages - base,
                         f"runtime stage packages {sorted(runtime)} != the binaries' "
                         f"{sorted(packages - base)}")

    def test_healthcheck_against_a_real_server(self):
        # The image's HEALTHCHECK command (bash /dev/tcp, GET /readyz), its port moved to a free
        # one, against a real server: healthy once ready, unhealthy once the server is gone.
        server = os.environ.get("OFFLOAD_SERVER")
        if not server:
            self.skipTest("OFFLOAD_SERVER not set (ctest sets it)")
        hc = [a for i, a in self.runtime if i == "HEALTHCHECK"]
        self.assertEqual(len(hc), 1)
        import json
        argv = json.loads(re.search(r"CMD (\[.*\])", hc[0]).group(1))
        self.assertIn("/dev/tcp/127.0.0.1/8080", argv[-1])
        self.assertIn("/readyz", argv[-1])
        port = free_port()
        argv[-1] = argv[-1].replace("/dev/tcp/127.0.0.1/8080", f"/dev/tcp/127.0.0.1/{port}")

        def healthy():
            return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0

        with tempfile.TemporaryDirectory(prefix="offload-hc-") as tmp:
            env = dict(os.environ, OFFLOAD_KEK=os.urandom(32).hex())
            proc = subprocess.Popen([server, "--grpc_address=127.0.0.1:0",
                                     f"--http_address=127.0.0.1:{port}", "--metrics_address=",
                                     f"--data_dir={tmp}", "--backend=libsodium", "--workers=1",
                                     "--drain_timeout=1s"],
                                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                end = time.monotonic() + 60
                while not healthy():
                    self.assertIsNone(proc.poll(), "server exited")
                    self.assertLess(time.monotonic(), end, "HEALTHCHECK never passed")
                    time.sleep(0.2)
            finally:
                proc.send_signal(signal.SIGTERM)
                self.assertEqual(proc.wait(30), 0)
            self.assertFalse(healthy(), "HEALTHCHECK passes with no server")

    def test_runtime_stage_is_minimal_and_unprivileged(self):
        runtime = apt_packages(self.runtime_run)
        for bad in ("build-essential", "gcc", "g++", "cpp", "cmake", "clang", "ninja-build", "make"):
            self.assertNotIn(bad, runtime)
        self.assertFalse([p for p in runtime if p.endswith("-dev")], "headers in the runtime stage")
        self.assertIn("--no-install-recommends", self.runtime_run)
        self.assertIn("rm -rf /var/lib/apt/lists/*", self.runtime_run)
        users = [a for i, a in self.runtime if i == "USER"]
        self.assertTrue(users, "no USER in the runtime stage")
        self.assertNotIn(users[-1].split(":")[0], ("root", "0"))
        instrs = {i for i, _ in self.runtime}
        self.assertTrue({"HEALTHCHECK", "EXPOSE", "ENTRYPOINT"} <= instrs)
        exposed = " ".join(a for i, a in self.runtime if i == "EXPOSE").split()
        self.assertEqual(sorted(exposed), ["50051", "8080", "9464"])
        # The build context leaves out build trees, secrets and key stores.
        ignore = read(".dockerignore").split()
        for p in (".git", "data/", "deploy/secrets/", "**/node_modules"):
            self.assertIn(p, ignore)


# ---------------------------------------------------------------------------------------------
# Server flags


class FlagsTest(unittest.TestCase):
    def check(self, flags, what):
        server = os.environ.get("OFFLOAD_SERVER")
        if not server:
            self.skipTest("OFFLOAD_SERVER not set (ctest sets it)")
        with tempfile.NamedTemporaryFile("w", suffix=".flags") as f:
            f.write(flags)
            f.flush()
            # absl parses every flag (names and values) before --version prints and exits 0.
            r = subprocess.run([server, f"--flagfile={f.name}", "--version"], capture_output=True,
                               text=True, timeout=30)
        self.assertEqual(r.returncode, 0, f"{what}: offload_server rejects a flag:\n{r.stderr}")

    def test_compose_command(self):
        import yaml
        cfg = yaml.safe_load(read("docker-compose.yml"))
        self.check("\n".join(cfg["x-offload"]["command"]) + "\n", "docker-compose.yml")

    def test_dockerfile_cmd(self):
        import yaml
        dockerfile = read("deploy/docker/Dockerfile")
        cmd = re.search(r'^CMD (\[.*?\])\s*$', re.sub(r"\\\n", " ", dockerfile), re.M)
        self.check("\n".join(yaml.safe_load(cmd.group(1))) + "\n", "Dockerfile CMD")

    def test_k8s_flagfile(self):
        self.check(read("deploy/k8s/offload.flags"), "deploy/k8s/offload.flags")


# ---------------------------------------------------------------------------------------------
# Kubernetes


class K8sTest(unittest.TestCase):
    def run_validator(self, root):
        node = tool("OFFLOAD_NODE", "node")
        kubectl = tool("OFFLOAD_KUBECTL", "kubectl")
        env = dict(os.environ, OFFLOAD_KUBECTL=kubectl)
        return subprocess.run([node, os.path.join(HERE, "validate_k8s.mjs"), root], cwd=HERE,
                              capture_output=True, text=True, env=env, timeout=300)

    def test_manifests_validate(self):
        r = self.run_validator(ROOT)
        print(r.stdout + r.stderr)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_validator_rejects_broken_manifests(self):
        # The same files with one fault of each kind the validator looks for.
        with tempfile.TemporaryDirectory(prefix="offload-k8s-bad-") as tmp:
            dst = os.path.join(tmp, "deploy", "k8s")
            shutil.copytree(os.path.join(ROOT, "deploy", "k8s"), dst)

            def edit(name, old, new):
                p = os.path.join(dst, name)
                with open(p) as f:
                    text = f.read()
                self.assertIn(old, text, name)
                with open(p, "w") as f:
                    f.write(text.replace(old, new, 1))

            edit("offload.yaml", "          readinessProbe:", "          readinesProbe:")  # unknown field
            edit("scaling.yaml", "  maxUnavailable: 1", "  maxUnavailable: [1]")         # wrong type
            edit("servicemonitor.yaml", "port: metrics", "port: metricz")                # dangling port
            edit("offload.flags", "--drain_timeout=20s", "--drain_timeout=40s")          # grace too short
            edit("offload.flags", "\n--require_identity\n", "\n#--require_identity\n")      # anonymous calls
            edit("offload.yaml", "              scheme: HTTPS\n", "")                      # plain HTTP probe
            edit("offload.yaml", "            name: offload-auth\n",                      # policy not mounted
                 "            name: offload-auth\n            items: [{key: jwks.json, path: jwks.json}]\n")
            edit("nginx.conf", "grpc_pass grpcs://", "grpc_pass grpc://")                # cleartext upstream
            edit("nginx.conf", "listen 8080 ssl;", "listen 8080;")                      # cleartext to clients
            edit("nginx.conf", "listen 50051 ssl http2;", "listen 50051 ssl;")           # no ALPN h2
            edit("nginx.yaml", "            secretName: offload-router-tls\n",           # router cert optional
                 "            secretName: offload-router-tls\n            optional: true\n")
            edit("nginx.yaml", "              scheme: HTTPS\n", "")                      # plain HTTP probe
            r = self.run_validator(tmp)
            out = r.stdout + r.stderr
            self.assertNotEqual(r.returncode, 0, out)
            for want in ("'\"readinesProbe\"' does not exist", "PodDisruptionBudget/offload: schema",
                         "port metricz not on the selected Service", "terminationGracePeriodSeconds 30",
                         "--require_identity is not on", "startup probe scheme is HTTP, want HTTPS",
                         "--policy_file: /etc/offload/auth/policy.json: volume auth projects no policy.json",
                         "grpc_pass grpc://, want grpcs://",
                         "listen 8080 is not ssl", "listen 50051 ssl has no http2",
                         "ssl_certificate: /etc/nginx/router-tls/tls.crt: volume router-tls is optional",
                         "offload-nginx: readiness probe scheme is HTTP, want HTTPS"):
                self.assertIn(want, out)


if __name__ == "__main__":
    unittest.main()
