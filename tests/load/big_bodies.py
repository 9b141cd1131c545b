#!/usr/bin/python3
"""Memory under many large requests at once: N BatchVerify calls of K x 1 MiB messages (invalid
signatures, so every item is verified and none is remembered) over C gRPC connections
(python3-grpcio), against a real offload_server; prints the answers by code and, sampled every
50 ms from /metrics and /proc, the highest request bytes the gRPC port held
(offload_http_buffered_bytes), the highest bytes of admitted requests waiting or running
(offload_queued_bytes) and the server's peak RSS (VmHWM). Nothing is asserted: figures for
tests/load/README.md ("Many large requests at once").

    /usr/bin/python3 tests/load/big_bodies.py --build_dir build --calls 400 --items 15 \\
        --connections 64 [-- extra server flags]
"""
import argparse
import os
import re
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build_dir", default="build")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--items", type=int, default=15)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("server_flags", nargs="*")
    args = ap.parse_args()
    os.environ.setdefault("OFFLOAD_SERVER",
                          os.path.join(os.path.abspath(args.build_dir), "bin", "offload_server"))
    import grpc
    import harness
    from harness import pb

    server = harness.Server("big-bodies", args=args.server_flags)
    server.start()
    pid = server.proc.pid
    metrics = "http://%s/metrics" % server.flag_value("metrics_address")
    peak = {}
    done = threading.Event()

    def status(field):
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def sample():
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not done.is_set():
            try:
                text = opener.open(metrics, timeout=2).read().decode()
            except OSError:
                time.sleep(0.05)
                continue
            for name in ('offload_http_buffered_bytes{port="grpc"}', "offload_queued_bytes"):
                m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
                if m:
                    peak[name] = max(peak.get(name, 0), float(m.group(1)))
            time.sleep(0.05)

    try:
        request = pb.ed.BatchVerifyRequest(items=[
            pb.ed.VerifyRequest(public_key=os.urandom(32), signature=os.urandom(64),
                                message=os.urandom(1 << 20)) for _ in range(args.items)])
        options = [("grpc.max_send_message_length", 64 << 20),
                   ("grpc.max_receive_message_length", 64 << 20),
                   ("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
        channels = [grpc.insecure_channel(server.address, options=options)
                    for _ in range(args.connections)]
        stubs = [pb.ed_grpc.Ed25519ServiceStub(c) for c in channels]
        threading.Thread(target=sample, daemon=True).start()
        start = time.monotonic()
        futures = [stubs[i % len(stubs)].BatchVerify.future(request, timeout=300)
                   for i in range(args.calls)]
        codes = {}
        for f in futures:
            try:
                f.result()
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
            codes[code] = codes.get(code, 0) + 1
        seconds = time.monotonic() - start
        done.set()
        mib = lambda b: "%.0f MiB" % (b / 2**20)
        print("%d calls of %d x 1 MiB over %d connections, %.1f s: %s" % (
            args.calls, args.items, args.connections, seconds, codes))
        print("peak: gRPC port buffered %s, queued requests %s, server VmHWM %s" % (
            mib(peak.get('offload_http_buffered_bytes{port="grpc"}', 0)),
            mib(peak.get("offload_queued_bytes", 0)), mib(status("VmHWM"))))
    finally:
        done.set()
        server.stop()


if __name__ == "__main__":
    main()
