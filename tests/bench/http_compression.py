#!/usr/bin/python3
"""What HTTP response compression costs the server: a 55 KB AEAD Open memo hit over Connect.

Starts offload_server(s) on free 127.0.0.1 ports (temporary data dir, random OFFLOAD_KEK), seals
two 55,000-byte plaintexts through the gateway (Seal records them in the open memo, so every Open
is a memo hit): random bytes (incompressible, like ciphertext or keys) and JSON-like records
(compressible). Then, in each round and for each server, h2load (nghttp2-client) sends a fixed
number of Connect POSTs of each Open, without and with `Accept-Encoding: gzip`:

    h2load --h1 -c 4 -n CALLS -d open.bin -H 'content-type: application/proto' \\
        [-H 'accept-encoding: gzip'] http://127.0.0.1:PORT/offload.v1.AeadService/Open

and reads the server's utime+stime from /proc/<pid>/stat before and after: server CPU per call.
Prints per-variant medians and spreads over the rounds, the with/without ratio per round (both
variants measured back to back in the same round), response sizes (the compression ratio), and
the load average (the machine is shared). Nothing is asserted: figures go to tests/bench/README.md.

    /usr/bin/python3 tests/bench/http_compression.py --build_dir build --rounds 5
    /usr/bin/python3 tests/bench/http_compression.py --build_dir build --level 6 \\
        --baseline_server /path/to/an/older/offload_server --baseline_calls 2000
"""

import argparse
import base64
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_server import OffloadServer  # noqa: E402

SIZE = 55000
OPEN = "/offload.v1.AeadService/Open"


def json_like(n, seed=1):
    rng = random.Random(seed)
    out, i = [], 0
    size = 1
    while size < n:
        rec = json.dumps({"id": i, "name": "user-%d" % rng.randrange(100000),
                          "email": "user%d@example.com" % i, "active": rng.random() < 0.5,
                          "score": rng.randrange(1000), "tags": rng.sample(
                              ["alpha", "beta", "gamma", "delta", "omega", "pro", "free"], 2)},
                         separators=(",", ":"))
        out.append(rec)
        size += len(rec) + 1
        i += 1
    return ("[" + ",".join(out) + "]").encode()[:n]


def varint(n):
    b = bytearray()
    while True:
        if n < 0x80:
            b.append(n)
            return bytes(b)
        b.append((n & 0x7F) | 0x80)
        n >>= 7


def open_request(key_id, envelope):
    """offload.v1.AeadOpenRequest{key_id = 1, envelope = 2} in protobuf's wire format."""
    k = key_id.encode()
    return b"\x0a" + varint(len(k)) + k + b"\x12" + varint(len(envelope)) + envelope


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3): utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg():
    with open("/proc/loadavg") as f:
        return " / ".join(f.read().split()[:3])


class Server(OffloadServer):
    def __init__(self, name, binary, flags, work):
        self.dir = tempfile.mkdtemp(dir=work)
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        try:
            super().__init__(binary, self.dir, flags=flags, log=self.log, ready_seconds=60,
                             name=name)
        except RuntimeError as e:
            sys.exit("%s; log in %s" % (e, self.log.name))

    def connect_json(self, path, message):
        req = urllib.request.Request(self.url(path), data=json.dumps(message).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def post(self, path, body, headers):
        req = urllib.request.Request(self.url(path), data=body,
                                     headers=dict({"Content-Type": "application/proto"}, **headers))
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Encoding"), r.read()

    def stop(self):
        super().stop(timeout=30)
        self.log.close()


def h2load(args, url, body_file, accept_gzip, calls, clients):
    cmd = [args.h2load, "--h1", "-c", str(clients), "-n", str(calls), "-d", body_file,
           "-H", "content-type: application/proto"]
    if accept_gzip:
        cmd += ["-H", "accept-encoding: gzip"]
    out = subprocess.run(cmd + [url + OPEN], capture_output=True, text=True, check=True).stdout
    ok = re.search(r"requests: .* (\d+) succeeded, (\d+) failed", out)
    codes = re.search(r"status codes: (\d+) 2xx", out)
    data = re.search(r"traffic: .*\((\d+)\) data", out)
    if not ok or int(ok.group(1)) != calls or int(codes.group(1)) != calls:
        sys.exit("h2load: not every call succeeded:\n" + out)
    return int(data.group(1)) / calls


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build_dir", default="build")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20000, help="calls per variant and round")
    p.add_argument("--clients", type=int, default=4, help="h2load connections (-c)")
    p.add_argument("--level", type=int, action="append", default=[],
                   help="also a server at this --http_compression_level (repeatable)")
    p.add_argument("--baseline_server", help="an older offload_server binary to measure too")
    p.add_argument("--baseline_calls", type=int, default=2000)
    p.add_argument("--h2load", default=shutil.which("h2load") or "/usr/bin/h2load")
    args = p.parse_args()
    binary = os.path.join(args.build_dir, "bin", "offload_server")
    for b in [binary, args.h2load] + ([args.baseline_server] if args.baseline_server else []):
        if not os.access(b, os.X_OK):
            sys.exit("missing %s (build offload_server; apt-get install nghttp2-client)" % b)

    work = tempfile.mkdtemp(prefix="offload-http-compression-")
    specs = [("this tree, level 1 (default)", binary, [], args.calls)]
    for level in args.level:
        specs.append(("this tree, level %d" % level, binary,
                      ["--http_compression_level=%d" % level], args.calls))
    if args.baseline_server:
        specs.append(("baseline %s" % args.baseline_server, args.baseline_server, [],
                      args.baseline_calls))
    servers = []
    try:
        plaintexts = {"random": os.urandom(SIZE), "json-like": json_like(SIZE)}
        bodies = {}  # (server, kind) -> file
        sizes = {}   # (server, kind, gzip) -> (content-encoding, bytes)
        for name, b, flags, calls in specs:
            s = Server(name, b, flags, work)
            s.calls = calls
            servers.append(s)
            s.connect_json("/offload.v1.KeyService/CreateKey",
                           {"keyId": "bench", "type": "KEY_TYPE_XCHACHA20_POLY1305"})
            for kind, plaintext in plaintexts.items():
                sealed = s.connect_json("/offload.v1.AeadService/Seal", {
                    "keyId": "bench", "plaintext": base64.b64encode(plaintext).decode()})
                body = open_request("bench", base64.b64decode(sealed["envelope"]))
                path = os.path.join(work, "%d-%s.bin" % (len(servers), kind))
                with open(path, "wb") as f:
                    f.write(body)
                bodies[(s, kind)] = path
                for gz in (False, True):
                    status, enc, data = s.post(OPEN, body, {"Accept-Encoding": "gzip"} if gz else {})
                    assert status == 200, status
                    sizes[(s, kind, gz)] = (enc or "identity", len(data))
                # Warm-up: connections, allocator, memo.
                for gz in (False, True):
                    h2load(args, s.url(""), path, gz, min(1000, s.calls), args.clients)

        variants = [(k, gz) for k in plaintexts for gz in (False, True)]
        cpu = {}  # (server, kind, gz) -> [us per call, one per round]
        loads = []
        print("rounds: %d; h2load --h1 -c %d; load average at start %s" % (
            args.rounds, args.clients, loadavg()), flush=True)
        for r in range(args.rounds):
            loads.append(loadavg())
            for s in servers:
                for kind, gz in variants:
                    before = cpu_seconds(s.proc.pid)
                    h2load(args, s.url(""), bodies[(s, kind)], gz, s.calls, args.clients)
                    us = (cpu_seconds(s.proc.pid) - before) / s.calls * 1e6
                    cpu.setdefault((s, kind, gz), []).append(us)
            print("round %d done, load average %s" % (r + 1, loadavg()), flush=True)
        loads.append(loadavg())

        print()
        print("Load average (1 / 5 / 15 min) at each round's start and at the end: " +
              "; ".join(loads))
        print()
        print("| server | plaintext | Accept-Encoding | response | server CPU us/call, median "
              "| min - max | calls/round |")
        print("| --- | --- | --- | --- | ---: | ---: | ---: |")
        for s in servers:
            for kind, gz in variants:
                v = cpu[(s, kind, gz)]
                enc, n = sizes[(s, kind, gz)]
                print("| %s | %s 55,000 B | %s | %s, %d B | %.1f | %.1f - %.1f | %d |" % (
                    s.name, kind, "gzip" if gz else "(none)", enc, n, statistics.median(v),
                    min(v), max(v), s.calls))
        print()
        print("| server | plaintext | with gzip / without (per round) | median | compression "
              "ratio (body with / without) |")
        print("| --- | --- | --- | ---: | ---: |")
        for s in servers:
            for kind in plaintexts:
                ratios = [a / b for a, b in zip(cpu[(s, kind, True)], cpu[(s, kind, False)])]
                ratio = sizes[(s, kind, True)][1] / sizes[(s, kind, False)][1]
                print("| %s | %s | %s | %.2fx | %.3f |" % (
                    s.name, kind, ", ".join("%.2f" % x for x in ratios),
                    statistics.median(ratios), ratio))
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
