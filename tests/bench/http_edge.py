#!/usr/bin/python3
"""The HTTP edge against the gRPC path, on one server in one run (issue 13's benchmark).

    tests/bench/http_edge.py [--server build/bin/offload_server] [--calls 20000] [--idle 10000]

Prints, for one server process (and two fresh ones for memory):
  0. memory per idle connection: a fresh server's resident set before and after --idle HTTP/1.1
     keep-alive connections (each made one call), and on another fresh server as many idle
     HTTP/2 connections (preface and SETTINGS exchanged);
  1. latency: 200 sequential Connect Verify calls over one keep-alive HTTP/1.1 connection
     (Python http.client) against 200 sequential gRPC Verify calls on one channel (grpcio): p50,
     p90, and the p50 difference;
  2. server CPU per call (utime + stime of the server from /proc/<pid>/stat, over a fixed number
     of calls) under h2load: Connect Verify over HTTP/1.1 (`h2load --h1 -c 8`), Connect Verify over
     HTTP/2 (`h2load -c 8 -m 8`), against gRPC Verify (`h2load -c 8 -m 1`, and `-m 8` for the
     HTTP/2 row); and a 55,000-byte AEAD Open memo hit over Connect (HTTP/1.1 and HTTP/2) against
     the same over gRPC.
Every call's answer is checked (h2load's status counts; Python clients parse the responses).
Needs h2load (Debian's nghttp2-client) and Debian's python3-grpcio (run with /usr/bin/python3).
A benchmark, not a test: nothing is asserted about speed; the ratios are printed.
"""

import argparse
import http.client
import os
import re
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))

import grpc  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


from bench_server import free_port  # noqa: E402,F401  (engine_ab and others import it from here)


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def grpc_frame(message):
    return b"\x00" + len(message).to_bytes(4, "big") + message


def h2load(args, calls):
    """Runs h2load; returns (succeeded 2xx, elapsed seconds). Raises if any request failed."""
    run = subprocess.run(["h2load", "-n", str(calls)] + args, capture_output=True, text=True)
    out = run.stdout + run.stderr
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                  r"(\d+) failed, (\d+) errored", out)
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if run.returncode != 0 or not m or not codes or int(m.group(4)) != calls or \
            int(codes.group(1)) != calls:
        raise RuntimeError("h2load %s:\n%s" % (" ".join(args), out))
    # h2load prints the time in us, ms or s: a smoke run on a fast machine can take under 1 ms.
    took = re.search(r"finished in ([\d.]+)(us|ms|s)\b", out)
    if not took:
        raise RuntimeError("h2load %s: no elapsed time in:\n%s" % (" ".join(args), out))
    seconds = float(took.group(1)) / {"us": 1e6, "ms": 1e3, "s": 1}[took.group(2)]
    return calls, seconds


def cpu_per_call(pid, args, calls, warmup=2000):
    h2load(args, warmup)
    before = cpu_seconds(pid)
    _, seconds = h2load(args, calls)
    used = cpu_seconds(pid) - before
    return used / calls * 1e6, calls / seconds


def idle_memory(server, count):
    """Resident set per idle connection, each kind on its own fresh server process."""
    print("\n## Memory per idle connection (%d connections, a fresh server for each kind)" % count)
    print("| kind | RSS before KiB | RSS after KiB | per connection |")
    print("| --- | ---: | ---: | ---: |")
    for kind in ("HTTP/1.1 keep-alive, one call each", "HTTP/2 (h2c), SETTINGS exchanged"):
        http_port = free_port()
        data = tempfile.mkdtemp(prefix="http-edge-idle-")
        proc = subprocess.Popen(
            [server, "--grpc_address=127.0.0.1:%d" % free_port(),
             "--http_address=127.0.0.1:%d" % http_port, "--metrics_address=",
             "--data_dir=" + data, "--http_max_connections=%d" % (count + 100)],
            stderr=subprocess.DEVNULL, env=dict(os.environ, OFFLOAD_KEK=secrets.token_hex(32)))
        try:
            for _ in range(300):
                try:
                    with socket.create_connection(("127.0.0.1", http_port)) as s:
                        s.sendall(b"GET /readyz HTTP/1.0\r\n\r\n")
                        if b" 200 " in s.recv(4096):
                            break
                except OSError:
                    pass
                time.sleep(0.1)
            time.sleep(0.5)
            before = rss_kib(proc.pid)
            socks = []
            for _ in range(count):
                s = socket.create_connection(("127.0.0.1", http_port))
                socks.append(s)
                if kind.startswith("HTTP/1.1"):
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    got = b""
                    while not got.endswith(b"ok\n"):
                        got += s.recv(4096)
                else:
                    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                    s.recv(4096)  # the server's SETTINGS
                    s.sendall(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")  # SETTINGS ack
            time.sleep(1.0)
            after = rss_kib(proc.pid)
            print("| %s | %d | %d | %.2f KiB |" % (kind, before, after, (after - before) / count))
            for s in socks:
                s.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=os.path.join(REPO, "build", "bin", "offload_server"))
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3, help="h2load rounds per row (median)")
    args = ap.parse_args()
    os.environ.setdefault("OFFLOAD_SERVER", args.server)
    from harness import pb  # noqa: E402  (stubs generated from proto/)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.idle > 0:
        idle_memory(args.server, args.idle)
    data = tempfile.mkdtemp(prefix="http-edge-")
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    cmd = [args.server, "--grpc_address=127.0.0.1:%d" % grpc_port,
           "--http_address=127.0.0.1:%d" % http_port,
           "--metrics_address=127.0.0.1:%d" % metrics_port, "--data_dir=" + data,
           "--max_client_inflight=0", "--max_queued_items=0"]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, OFFLOAD_KEK=secrets.token_hex(32)))
    try:
        channel = grpc.insecure_channel("127.0.0.1:%d" % grpc_port)
        grpc.channel_ready_future(channel).result(timeout=30)
        keys = pb.keys_grpc.KeyServiceStub(channel)
        ed = pb.ed_grpc.Ed25519ServiceStub(channel)
        aead = pb.aead_grpc.AeadServiceStub(channel)
        for _ in range(100):
            try:
                keys.ListKeys(pb.keys.ListKeysRequest(), timeout=1)
                break
            except grpc.RpcError:
                time.sleep(0.1)
        keys.CreateKey(pb.keys.CreateKeyRequest(key_id="signer", type=pb.keys.KEY_TYPE_ED25519))
        keys.CreateKey(pb.keys.CreateKeyRequest(key_id="blobs",
                                                type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305))
        message = secrets.token_bytes(64)
        signed = ed.Sign(pb.ed.SignRequest(key_id="signer", message=message))
        verify = pb.ed.VerifyRequest(public_key=signed.public_key, message=message,
                                     signature=signed.signature)
        verify_bytes = verify.SerializeToString()
        sealed = aead.Seal(pb.aead.AeadSealRequest(key_id="blobs",
                                                   plaintext=secrets.token_bytes(55000)))
        open_bytes = pb.aead.AeadOpenRequest(key_id="blobs",
                                             envelope=sealed.envelope).SerializeToString()
        pid = proc.pid
        print("# server %s, pid %d; load average %s" % (args.server, pid,
                                                      open("/proc/loadavg").read().split()[:3]))

        # 2. Sequential latency.
        conn = http.client.HTTPConnection("127.0.0.1", http_port)
        connect_ms, grpc_ms = [], []
        for i in range(220):
            t0 = time.perf_counter()
            conn.request("POST", "/offload.v1.Ed25519Service/Verify", body=verify_bytes,
                         headers={"Content-Type": "application/proto"})
            r = conn.getresponse()
            body = r.read()
            took = (time.perf_counter() - t0) * 1000
            assert r.status == 200 and pb.ed.VerifyResponse.FromString(body).valid
            t0 = time.perf_counter()
            assert ed.Verify(verify).valid
            took_grpc = (time.perf_counter() - t0) * 1000
            if i >= 20:  # warm-up
                connect_ms.append(took)
                grpc_ms.append(took_grpc)
        conn.close()
        q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))]
        print("\n## 200 sequential Verify calls, one connection")
        print("| path | p50 ms | p90 ms | max ms |")
        print("| --- | ---: | ---: | ---: |")
        for name, xs in (("Connect, HTTP/1.1 keep-alive (http.client)", connect_ms),
                         ("gRPC, one channel (grpcio)", grpc_ms)):
            print("| %s | %.3f | %.3f | %.3f |" % (name, statistics.median(xs), q(xs, 0.9), max(xs)))
        print("p50 difference Connect - gRPC: %+.3f ms (target: within 0.5 ms)"
              % (statistics.median(connect_ms) - statistics.median(grpc_ms)))

        # 3. Server CPU per call under h2load.
        tmp = tempfile.mkdtemp(prefix="h2load-")
        files = {}
        for name, blob in (("verify.bin", verify_bytes), ("verify.grpc", grpc_frame(verify_bytes)),
                           ("open.bin", open_bytes), ("open.grpc", grpc_frame(open_bytes))):
            files[name] = os.path.join(tmp, name)
            with open(files[name], "wb") as f:
                f.write(blob)
        http_url = "http://127.0.0.1:%d" % http_port
        grpc_url = "http://127.0.0.1:%d" % grpc_port
        connect_h = ["-H", "content-type: application/proto"]
        grpc_h = ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        # (HTTP label, h2load flags, gRPC label, h2load flags): one keep-alive HTTP/1.1 request
        # per connection at a time against gRPC's one stream each; then 8 streams each.
        modes = [("Connect HTTP/1.1, h2load --h1 -c 8", ["--h1", "-c", "8"],
                  "gRPC, h2load -c 8 -m 1", ["-c", "8", "-m", "1"]),
                 ("Connect HTTP/2, h2load -c 8 -m 8", ["-c", "8", "-m", "8"],
                  "gRPC, h2load -c 8 -m 8", ["-c", "8", "-m", "8"])]
        # (call, path, body files' stem, the issue's limit in each mode)
        calls = [("Verify", "/offload.v1.Ed25519Service/Verify", "verify", (1.3, 1.2)),
                 ("Open 55,000 B memo hit", "/offload.v1.AeadService/Open", "open", (1.3, 1.3))]
        rows = [(name, http_label,
                 http_flags + ["-d", files[stem + ".bin"]] + connect_h + [http_url + path],
                 grpc_label,
                 grpc_flags + ["-d", files[stem + ".grpc"]] + grpc_h + [grpc_url + path],
                 limits[i])
                for name, path, stem, limits in calls
                for i, (http_label, http_flags, grpc_label, grpc_flags) in enumerate(modes)]
        print("\n## Server CPU per call (h2load, %d calls per round, median of %d rounds, "
              "rounds interleaved)" % (args.calls, args.rounds))
        print("| call | HTTP load | us/call | calls/s | gRPC load | us/call | calls/s | ratio | target |")
        print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
        for what, hname, hargs, gname, gargs, target in rows:
            hs, gs = [], []
            for _ in range(args.rounds):
                hs.append(cpu_per_call(pid, hargs, args.calls))
                gs.append(cpu_per_call(pid, gargs, args.calls))
            h_us = statistics.median(x[0] for x in hs)
            g_us = statistics.median(x[0] for x in gs)
            print("| %s | %s | %.1f | %.0f | %s | %.1f | %.0f | %.2f | <= %.1f |" % (
                what, hname, h_us, statistics.median(x[1] for x in hs), gname, g_us,
                statistics.median(x[1] for x in gs), h_us / g_us, target))
            sys.stdout.flush()

        print("\n# load average after: %s" % open("/proc/loadavg").read().split()[:3])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
