#!/usr/bin/python3
"""The HTTP engine against a baseline build, in one run (issue 23's benchmark).

    tests/bench/engine_ab.py --baseline_server /tmp/baseline/build/bin/offload_server \\
        [--server build/bin/offload_server] [--calls 100000] [--rounds 5] [--idle 10000]

Two servers run side by side (the same flags, file key store in temporary folders, admission
unbounded so that nothing is refused: `--max_client_inflight=0 --max_queued_items=0`, the
libsodium backend), each with an Ed25519 and an XChaCha20-Poly1305 key made over its own Connect
port. For each row, in each round, h2load (Debian's nghttp2-client) sends the same number of
calls to one server and then the other (the order alternates by round); the figure is the
server's CPU time (utime + stime from /proc/<pid>/stat) divided by the calls. Rows:
  - Connect Verify (application/proto; a memo hit after the first call) over HTTP/1.1 keep-alive,
    `h2load --h1 -c 8`, and over HTTP/2, `h2load -c 8 -m 8`;
  - Connect AEAD Open of a 55,000-byte plaintext (a memo hit: Seal recorded it), the same two ways
    (a tenth of --calls).
Every call must answer 2xx (h2load's counts), and one answer of each kind is checked by hand first
(valid signature; the plaintext back). Then, on a fresh process of each server and each kind:
memory per idle connection, RSS before and after --idle HTTP/1.1 keep-alive connections (one
/healthz call each) and as many idle HTTP/2 connections (preface and SETTINGS exchanged).
It prints each row's per-round figures, their medians, and the ratio of the medians; nothing is
asserted (a benchmark, not a test). `--smoke` runs a few calls and connections once, against the
same binary twice, to check that the script itself works (ctest bench.engine_ab_smoke).
"""

import argparse
import base64
import os
import re
import resource
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_server import OffloadServer  # noqa: E402
from http_edge import cpu_seconds, h2load, rss_kib  # noqa: E402


def field(number, payload):
    """A length-delimited protobuf field."""
    n = len(payload)
    size = b""
    while True:
        b = n & 0x7F
        n >>= 7
        size += bytes([b | (0x80 if n else 0)])
        if not n:
            break
    return bytes([number << 3 | 2]) + size + payload


class Server(OffloadServer):
    """One offload_server process on free loopback ports, admission unbounded, no /metrics."""

    def __init__(self, binary, extra=()):
        self.data = tempfile.mkdtemp(prefix="engine-ab-")
        super().__init__(binary, self.data, metrics=False,
                         flags=["--backend=libsodium", "--max_client_inflight=0",
                                "--max_queued_items=0"] + list(extra))


def prepare(server, work, name):
    """Keys, and the request bodies of the rows (files in `work`), checked once by hand."""
    server.json("/offload.v1.KeyService/CreateKey", {"keyId": "signer", "type": "KEY_TYPE_ED25519"})
    server.json("/offload.v1.KeyService/CreateKey",
                {"keyId": "blobs", "type": "KEY_TYPE_XCHACHA20_POLY1305"})
    message = b"engine a/b"
    signed = server.json("/offload.v1.Ed25519Service/Sign",
                         {"keyId": "signer", "message": base64.b64encode(message).decode()})
    verify = (field(1, base64.b64decode(signed["publicKey"])) + field(2, message)
              + field(3, base64.b64decode(signed["signature"])))
    plaintext = os.urandom(55000)
    sealed = server.json("/offload.v1.AeadService/Seal",
                         {"keyId": "blobs", "plaintext": base64.b64encode(plaintext).decode()})
    open_ = field(1, b"blobs") + field(2, base64.b64decode(sealed["envelope"]))
    files = {}
    for kind, body in (("verify", verify), ("open", open_)):
        files[kind] = os.path.join(work, "%s-%s.bin" % (name, kind))
        with open(files[kind], "wb") as f:
            f.write(body)
    # VerifyResponse: field 1 (valid) true. AeadOpenResponse: field 1 the plaintext.
    answer = server.call("/offload.v1.Ed25519Service/Verify", verify, "application/proto")
    if not answer.startswith(b"\x08\x01"):
        raise RuntimeError("%s: Verify did not answer valid: %r" % (name, answer[:16]))
    answer = server.call("/offload.v1.AeadService/Open", open_, "application/proto")
    if plaintext not in answer:
        raise RuntimeError("%s: Open did not answer the plaintext" % name)
    return files


ROWS = [
    ("Verify, HTTP/1.1 keep-alive (h2load --h1 -c 8)", "verify", ["--h1", "-c", "8"], 1),
    ("Verify, HTTP/2 (h2load -c 8 -m 8)", "verify", ["-c", "8", "-m", "8"], 1),
    ("Open 55,000 B memo hit, HTTP/1.1 (--h1 -c 8)", "open", ["--h1", "-c", "8"], 10),
    ("Open 55,000 B memo hit, HTTP/2 (-c 8 -m 8)", "open", ["-c", "8", "-m", "8"], 10),
]
PATHS = {"verify": "/offload.v1.Ed25519Service/Verify", "open": "/offload.v1.AeadService/Open"}


def cpu_rows(servers, files, calls, rounds):
    results = {(row[0], name): [] for row in ROWS for name in servers}
    for r in range(rounds):
        order = list(servers) if r % 2 == 0 else list(servers)[::-1]
        for title, kind, args, divisor in ROWS:
            n = max(100, calls // divisor)
            for name in order:
                server = servers[name]
                cmd = args + ["-d", files[name][kind], "-H", "content-type: application/proto",
                              server.url(PATHS[kind])]
                h2load(cmd, max(50, n // 20))  # warm-up
                before = cpu_seconds(server.proc.pid)
                h2load(cmd, n)
                results[(title, name)].append((cpu_seconds(server.proc.pid) - before) / n * 1e6)
    return results


def idle_memory(binary, count, http2):
    server = Server(binary, ["--http_max_connections=%d" % (count + 100),
                             "--http_idle_timeout=600s"])
    try:
        time.sleep(0.5)
        before = rss_kib(server.proc.pid)
        socks = []
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", server.http))
            socks.append(s)
            if http2:
                s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                s.recv(4096)  # the server's SETTINGS
                s.sendall(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")  # SETTINGS ack
            else:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                got = b""
                while not got.endswith(b"ok\n"):
                    got += s.recv(4096)
        time.sleep(2.5)  # past a second of quiet: connections have given back what they can
        after = rss_kib(server.proc.pid)
        for s in socks:
            s.close()
        return before, after
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=os.path.join(REPO, "build", "bin", "offload_server"))
    ap.add_argument("--baseline_server", help="the baseline build (default: --server itself)")
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.calls, args.rounds, args.idle = 400, 1, 50
    baseline = args.baseline_server or args.server
    want = args.idle * 2 + 2000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, want)), hard))

    print("# Engine A/B: %s (baseline) against %s" % (baseline, args.server))
    print("load average at start: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    work = tempfile.mkdtemp(prefix="engine-ab-bodies-")
    servers = {"baseline": Server(baseline), "engine": Server(args.server)}
    try:
        files = {name: prepare(s, work, name) for name, s in servers.items()}
        results = cpu_rows(servers, files, args.calls, args.rounds)
    finally:
        for s in servers.values():
            s.stop()
    print("\n## Server CPU per call (µs), %d rounds alternated, --calls %d" % (args.rounds,
                                                                               args.calls))
    print("| row | baseline rounds | engine rounds | baseline median | engine median | ratio |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for title, _, _, _ in ROWS:
        a, b = results[(title, "baseline")], results[(title, "engine")]
        ma, mb = statistics.median(a), statistics.median(b)
        print("| %s | %s | %s | %.1f | %.1f | %.2fx |"
              % (title, " ".join("%.1f" % x for x in a), " ".join("%.1f" % x for x in b),
                 ma, mb, mb / ma if ma else float("nan")))
    print("\n## Memory per idle connection (%d connections, a fresh server for each)" % args.idle)
    print("| server | kind | RSS before KiB | RSS after KiB | per connection |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, binary in (("baseline", baseline), ("engine", args.server)):
        for http2 in (False, True):
            before, after = idle_memory(binary, args.idle, http2)
            print("| %s | %s | %d | %d | %.2f KiB |"
                  % (name, "HTTP/2 (h2c), SETTINGS exchanged" if http2
                     else "HTTP/1.1 keep-alive, one call each", before, after,
                     (after - before) / args.idle))
    print("\nload average at end: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))


if __name__ == "__main__":
    main()
