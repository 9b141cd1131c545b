#!/usr/bin/python3
"""What the data-plane audit costs the server (issue 26's --audit_data_plane).

    tests/bench/audit_cost.py [--server build/bin/offload_server] [--calls 100000] [--rounds 5]

Three offload_server processes side by side (libsodium backend, admission unbounded, each with
--audit_log_file and --audit_chain_key_file), which differ only in --audit_data_plane: off, 0.01
and all. Two fixed Connect requests in application/proto over HTTP/2 (h2load -c 8 -m 8):
Ed25519 Sign (no memo: a signature per call) and AEAD Open of a 1 KiB envelope (an open-memo hit
answered on the event loop: the cheapest audited call). In each round every server gets --calls
calls of each request, in an order that rotates by round. The figure is the server's CPU time
(utime + stime of /proc/<pid>/stat, the audit writer thread included) per call; the table gives
the medians and their difference from `off`. The audit file of `all` must hold one line per call
(printed, and the script fails otherwise: a count, never a time). Nothing else is asserted (a
benchmark, not a test). `--smoke` runs a few calls
once (ctest bench.audit_cost_smoke), to check that the script works.
"""

import argparse
import base64
import os
import secrets
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from engine_ab import field  # noqa: E402
from bench_server import OffloadServer  # noqa: E402
from http_edge import cpu_seconds, h2load  # noqa: E402

MODES = ("off", "0.01", "all")


class Server(OffloadServer):
    """offload_server with a chained audit file and --audit_data_plane=`mode`."""

    def __init__(self, binary, work, mode):
        self.dir = os.path.join(work, mode)
        os.makedirs(self.dir)
        self.audit = os.path.join(self.dir, "audit.jsonl")
        chain_key = os.path.join(self.dir, "chain.key")
        with open(chain_key, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        os.chmod(chain_key, 0o600)
        super().__init__(
            binary, os.path.join(self.dir, "data"),
            flags=["--backend=libsodium", "--max_client_inflight=0", "--max_queued_items=0",
                   "--audit_log_file=" + self.audit, "--audit_chain_key_file=" + chain_key,
                   "--audit_data_plane=" + mode],
            name="offload_server (%s)" % mode)

    def audit_lines(self, event):
        with open(self.audit) as f:
            return sum(1 for line in f if '"event":"%s"' % event in line.replace(" ", ""))


def request_bodies(server, work):
    """{name: (path, proto body file)}; the keys are created on `server` with fixed secrets, so
    that the same bodies work on every server."""
    seed = base64.b64encode(bytes(range(32))).decode()
    server.json("/offload.v1.KeyService/ImportKey",
                {"keyId": "signer", "type": "KEY_TYPE_ED25519", "secret": seed})
    server.json("/offload.v1.KeyService/ImportKey",
                {"keyId": "blobs", "type": "KEY_TYPE_XCHACHA20_POLY1305", "secret": seed})
    sealed = server.json("/offload.v1.AeadService/Seal",
                         {"keyId": "blobs", "plaintext": base64.b64encode(b"r" * 1024).decode()})
    bodies = {
        "Ed25519 Sign": ("/offload.v1.Ed25519Service/Sign",
                         field(1, b"signer") + field(2, b"audit cost")),
        "AEAD Open 1 KiB (memo hit)": ("/offload.v1.AeadService/Open",
                                       field(1, b"blobs") +
                                       field(2, base64.b64decode(sealed["envelope"]))),
    }
    out = {}
    for i, (name, (path, body)) in enumerate(bodies.items()):
        body_file = os.path.join(work, "body-%d.bin" % i)
        with open(body_file, "wb") as f:
            f.write(body)
        out[name] = (path, body_file)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=os.path.join(REPO, "build/bin/offload_server"))
    p.add_argument("--calls", type=int, default=100000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    if a.smoke:
        a.calls, a.rounds = 300, 1
    work = tempfile.mkdtemp(prefix="audit-cost-")
    servers = {mode: Server(a.server, work, mode) for mode in MODES}
    try:
        bodies = None
        for server in servers.values():
            b = request_bodies(server, work)
            bodies = bodies or b
        print("# Data-plane audit: server CPU per Connect call over HTTP/2, %d cores, load %.2f"
              % (os.cpu_count(), os.getloadavg()[0]))
        print("\n%d calls per request and server, %d rounds (h2load -c 8 -m 8)"
              % (a.calls, a.rounds))
        print("\n| request | " + " | ".join("--audit_data_plane=%s (us/call)" % m for m in MODES)
              + " | all - off |")
        print("|---|" + "---|" * (len(MODES) + 1))
        audited_calls = 0
        for name, (path, body_file) in bodies.items():
            per = {m: [] for m in MODES}
            for r in range(a.rounds):
                order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
                for mode in order:
                    s = servers[mode]
                    cmd = ["-c", "8", "-m", "8", "-d", body_file,
                           "-H", "content-type: application/proto", s.url(path)]
                    h2load(cmd, max(50, a.calls // 20))  # warm-up
                    before = cpu_seconds(s.proc.pid)
                    h2load(cmd, a.calls)
                    per[mode].append((cpu_seconds(s.proc.pid) - before) / a.calls * 1e6)
                audited_calls += max(50, a.calls // 20) + a.calls
            med = {m: statistics.median(v) for m, v in per.items()}
            print("| %s | %s | %+.2f |" % (
                name, " | ".join("%.2f (%s)" % (med[m], ", ".join("%.2f" % x for x in per[m]))
                                 for m in MODES), med["all"] - med["off"]))
        time.sleep(1.5)  # the writer thread's last batch
        lines = {m: servers[m].audit_lines("data_plane") for m in MODES}
        print("\naudit lines (data_plane): all %d for %d calls made after set-up (+1: the set-up "
              "Seal), 0.01 %d, off %d" % (lines["all"], audited_calls, lines["0.01"], lines["off"]))
        if lines["all"] != audited_calls + 1 or lines["off"] != 0:
            sys.exit("audit_cost: expected one data_plane line per call with all, none with off")
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
