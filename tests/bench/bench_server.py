"""One offload_server for a benchmark: started on free loopback ports with its own data folder
and a fresh key-encryption key, ready once GET /readyz answers 200, stopped with SIGTERM. The
benchmark scripts of this folder (audit_cost.py, engine_ab.py, http_compression.py, token_cost.py)
share it, so that each says only what it changes: its flags.

    server = OffloadServer(binary, data_dir, flags=["--backend=libsodium"])
    server.json("/offload.v1.KeyService/CreateKey", {"keyId": "k", "type": "KEY_TYPE_ED25519"})
    ...
    server.stop()
"""
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loopback_ports import free_port  # noqa: E402  (below the ephemeral range)


class OffloadServer:
    """offload_server on free loopback ports (gRPC, HTTP and, unless `metrics` is false,
    /metrics), its keys in `data_dir`, with `flags` after its own; `prefix` runs it under
    another program (valgrind). Its stderr goes to `log` (a file object; default: nowhere).
    Raises RuntimeError when it exits or is not ready within `ready_seconds`."""

    def __init__(self, binary, data_dir, flags=(), prefix=(), metrics=True, log=None,
                 ready_seconds=30, name=None):
        self.name = name or os.path.basename(binary)
        self.http = free_port()
        self.metrics = free_port() if metrics else None
        args = list(prefix) + [
            binary, "--grpc_address=127.0.0.1:%d" % free_port(),
            "--http_address=127.0.0.1:%d" % self.http,
            "--metrics_address=" + ("127.0.0.1:%d" % self.metrics if metrics else ""),
            "--data_dir=" + data_dir] + list(flags)
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=log or subprocess.DEVNULL,
            env=dict(os.environ, OFFLOAD_KEK=secrets.token_hex(32)))
        deadline = time.time() + ready_seconds
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited (%d) before it was ready" %
                                   (self.name, self.proc.returncode))
            try:
                with urllib.request.urlopen(self.url("/readyz"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:  # not listening yet, or 503 until the keys are loaded
                pass
            if time.time() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("%s did not become ready in %d s" % (self.name, ready_seconds))
            time.sleep(0.1)

    @property
    def pid(self):
        return self.proc.pid

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.http, path)

    def call(self, path, body, content_type="application/json", headers=None):
        """The body of a POST to the HTTP port (raises on an HTTP error)."""
        req = urllib.request.Request(self.url(path), data=body,
                                     headers=dict({"content-type": content_type}, **(headers or {})))
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read()

    def json(self, path, obj):
        """A Connect JSON call: `obj` in, the decoded answer out."""
        return json.loads(self.call(path, json.dumps(obj).encode()))

    def scrape(self):
        """The /metrics text."""
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics,
                                    timeout=10) as r:
            return r.read().decode()

    def stop(self, timeout=60):
        """SIGTERM, then the exit (SIGKILL after `timeout` seconds)."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
