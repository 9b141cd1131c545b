"""Overload protection against a real server: a bounded queue answers RESOURCE_EXHAUSTED at once
for the excess, a per-client concurrency limit holds, calls whose deadline passed while queued
are dropped unrun, every refusal is counted in /metrics, and the server answers normally when the
flood is over. Counts and codes are asserted, never timings (the figures are in tests/load)."""
import os
import time
import re
import unittest
import urllib.request

import grpc
import nacl.signing

import harness
from harness import pb


def bad_signatures(n, size=64):
    """Well-formed signatures over another message: each costs a full verification and is never
    memoised (only valid results are)."""
    key = nacl.signing.SigningKey.generate()
    items = []
    for i in range(n):
        msg = os.urandom(size)
        sig = key.sign(msg + b"x").signature
        items.append(pb.ed.VerifyRequest(public_key=bytes(key.verify_key), message=msg,
                                         signature=sig))
    return items


def metric(server, name, labels):
    url = "http://%s/metrics" % server.metrics_address
    text = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5).read()
    pattern = re.escape(name) + r"\{" + re.escape(labels) + r"\} (\S+)"
    m = re.search(pattern, text.decode())
    return float(m.group(1)) if m else None


class OverloadServer(harness.Server):
    def command(self):
        cmd = super().command()
        self.metrics_address = [a for a in cmd if a.startswith("--metrics_address=")][0].split("=", 1)[1]
        return cmd


def codes_of(futures):
    out = {}
    for f in futures:
        try:
            f.result()
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                out.setdefault("messages", set()).add(e.details().split(":")[0])
        out[code] = out.get(code, 0) + 1
    return out


class OverloadTest(harness.ServerTestCase):
    def start(self, *args):
        server = OverloadServer("overload", args=["--workers=1"] + list(args))
        self.servers = [server]
        server.start()
        self.addCleanup(server.stop)
        return server

    def test_queue_bound_refuses_the_excess_at_once_and_counts_it(self):
        # One worker, room for one 1024-item batch (tens of ms of verification each): of calls
        # sent together, the first is admitted and those arriving while it runs are refused.
        server = self.start("--max_queued_items=1024", "--max_batch_items=1024",
                            "--max_client_inflight=0")
        batch = pb.ed.BatchVerifyRequest(items=bad_signatures(1024))
        futures = [server.ed.BatchVerify.future(batch, timeout=120) for _ in range(12)]
        codes = codes_of(futures)
        self.assertGreater(codes.get(grpc.StatusCode.OK, 0), 0, codes)
        refused = codes.get(grpc.StatusCode.RESOURCE_EXHAUSTED, 0)
        self.assertGreater(refused, 0, codes)
        self.assertEqual(codes.get(grpc.StatusCode.OK, 0) + refused, 12, codes)
        self.assertEqual(codes["messages"], {"server overloaded"})
        self.assertEqual(metric(server, "offload_dropped_total", 'reason="queue_full"'), refused)
        queued = re.search(r"^offload_queued_items (\S+)$", urllib.request.build_opener(
            urllib.request.ProxyHandler({})).open("http://%s/metrics" % server.metrics_address,
                                                  timeout=5).read().decode(), re.M)
        self.assertEqual(float(queued.group(1)), 0.0)  # every ticket given back
        # The flood is over: a call is answered normally.
        self.assertEqual(len(server.ed.BatchVerify(batch, timeout=60).results), 1024)

    def test_per_client_concurrency_limit(self):
        server = self.start("--max_client_inflight=2", "--max_queued_items=0")
        server.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="s", type=pb.keys.KEY_TYPE_ED25519),
                              timeout=10)
        batch = pb.ed.BatchSignRequest(items=[pb.ed.SignRequest(key_id="s", message=b"m%d" % i)
                                              for i in range(1000)])
        futures = [server.ed.BatchSign.future(batch, timeout=120) for _ in range(12)]
        codes = codes_of(futures)
        self.assertGreater(codes.get(grpc.StatusCode.OK, 0), 0, codes)
        self.assertGreater(codes.get(grpc.StatusCode.RESOURCE_EXHAUSTED, 0), 0, codes)
        self.assertEqual(codes["messages"], {"client over its concurrency limit"})
        self.assertEqual(metric(server, "offload_dropped_total", 'reason="client_limit"'),
                         codes[grpc.StatusCode.RESOURCE_EXHAUSTED])

    def test_calls_whose_deadline_passed_in_the_queue_are_dropped_unrun(self):
        server = self.start("--max_queued_items=0", "--max_client_inflight=0",
                            "--max_batch_items=1024")
        before = metric(server, "offload_crypto_operations_total", 'op="ed25519_verify"') or 0
        small_items = bad_signatures(30)
        big = server.ed.BatchVerify.future(pb.ed.BatchVerifyRequest(items=bad_signatures(1024)),
                                           timeout=60)
        # Send the small calls only once the big batch holds the one worker (its 1024 items are
        # admitted: tens of ms of verification), so that they wait behind it.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                "http://%s/metrics" % server.metrics_address, timeout=5).read().decode()
            m = re.search(r"^offload_queued_items (\S+)$", text, re.M)
            if m and float(m.group(1)) >= 1024:
                break
            time.sleep(0.002)
        small = [server.ed.Verify.future(item, timeout=0.02) for item in small_items]
        codes = codes_of(small)
        self.assertEqual(len(big.result().results), 1024)
        self.assertGreater(codes.get(grpc.StatusCode.DEADLINE_EXCEEDED, 0), 0, codes)
        # Server side: the calls found expired when a worker reached them were not computed.
        dropped = 0
        for _ in range(50):
            dropped = metric(server, "offload_dropped_total", 'reason="deadline"')
            if dropped:
                break
            time.sleep(0.1)
        self.assertGreater(dropped, 0)
        ran = metric(server, "offload_crypto_operations_total", 'op="ed25519_verify"') - before
        self.assertLessEqual(ran, 1024 + 30 - dropped)


if __name__ == "__main__":
    unittest.main()
