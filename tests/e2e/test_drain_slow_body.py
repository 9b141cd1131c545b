"""A client sending a body very slowly does not hold a drain (issue 33, point 8).

The rule (README, "Security and overload"): a request whose body is still arriving 2 s into the
drain (httpd::Server::kDrainBodyGrace; at most --http_read_timeout, at most half the drain) is
answered UNAVAILABLE with a retry delay, unread and never run - so it may be sent again
elsewhere - and the drain goes on without it. Requests whose bodies are whole are run and
answered as before.

Here, with --drain_timeout=60s: a gRPC request on the gRPC port and a Connect POST over HTTP/1.1
on the HTTP port each send part of their body and then a byte every 0.3 s (progress: the read
timeout never cuts them), while a 1024-item BatchVerify is in flight. SIGTERM. Asserted: the
BatchVerify completes OK; the slow gRPC request gets grpc-status 14 with
grpc-status-details-bin, the slow Connect request 503 with Retry-After and Connect's
"unavailable" error JSON carrying a RetryInfo; both are counted (http_abuse drain_body_late);
the server exits 0 with "drain": "calls_done" in well under the drain timeout.
"""

import json
import os
import socket
import struct
import threading
import time
import unittest

import grpc
import nacl.signing

import harness
from harness import pb
import test_http2_abuse as raw
import test_http2_abuse_grpc as raw_grpc

DRAIN_TIMEOUT = 60
DRAIN_LIMIT = 15.0  # seconds: the 2 s grace and the BatchVerify, far from the 60 s timeout


class Dribbler(threading.Thread):
    """Calls `send(b"x")` every 0.3 s until `stop` is set or a send fails."""

    def __init__(self, send):
        super().__init__(daemon=True)
        self.send, self.stop = send, threading.Event()

    def run(self):
        while not self.stop.wait(0.3):
            try:
                if self.send(b"x") is False:
                    return
            except OSError:
                return


class DrainSlowBodyTest(harness.ServerTestCase):

    def test_a_slow_body_is_refused_at_the_drains_deadline_and_does_not_hold_it(self):
        server = harness.Server("drain-slow-body", args=["--drain_timeout=%ds" % DRAIN_TIMEOUT])
        self.servers = [server]
        server.start()
        self.addCleanup(server.kill)
        grpc_port = int(server.address.rsplit(":", 1)[1])
        http_port = int(server.flag_value("http_address").rsplit(":", 1)[1])
        key = nacl.signing.SigningKey.generate()
        items = []
        for _ in range(1024):
            msg = os.urandom(64)
            items.append(pb.ed.VerifyRequest(public_key=bytes(key.verify_key), message=msg,
                                             signature=key.sign(msg + b"x").signature))
        request = pb.ed.BatchVerifyRequest(items=items).SerializeToString()

        # The slow gRPC request: HEADERS, then part of its message (no END_STREAM).
        h2 = raw_grpc.GrpcAttacker(grpc_port)
        body = h2.message(request)
        h2.send(raw.frame(raw.HEADERS, raw.END_HEADERS, 1,
                          h2.header_block("/offload.v1.Ed25519Service/BatchVerify")) +
                raw.frame(raw.DATA, 0, 1, body[:1000]))
        h2_reader = threading.Thread(target=h2.read, kwargs={"timeout": 60}, daemon=True)
        h2_reader.start()
        h2_dribble = Dribbler(lambda b: h2.send(raw.frame(raw.DATA, 0, 1, b)))
        # The slow Connect request over HTTP/1.1.
        h1 = socket.create_connection(("127.0.0.1", http_port), timeout=60)
        h1.sendall(("POST /offload.v1.Ed25519Service/BatchVerify HTTP/1.1\r\nHost: x\r\n"
                    "Content-Type: application/proto\r\nContent-Length: %d\r\n\r\n"
                    % len(request)).encode() + request[:1000])
        h1_dribble = Dribbler(h1.sendall)
        h2_dribble.start()
        h1_dribble.start()
        time.sleep(0.5)  # both heads are in: their requests were accepted before the drain

        batch = server.ed.BatchVerify.future(pb.ed.BatchVerifyRequest.FromString(request),
                                             timeout=120)
        time.sleep(0.05)
        t0 = time.monotonic()
        rc, took = server.terminate(timeout=DRAIN_TIMEOUT + 30)
        answer = h1.recv(65536)
        h2_reader.join(30)
        h1_dribble.stop.set()
        h2_dribble.stop.set()

        results = batch.result().results  # in flight at SIGTERM: answered
        self.assertEqual(len(results), 1024)
        self.assertFalse(any(r.valid for r in results))

        head, _, text = answer.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        fields = dict(l.lower().split(": ", 1) for l in lines[1:])
        print("\n  SIGTERM: exit %s after %.2f s; HTTP/1.1: %s retry-after %s %s; HTTP/2 "
              "(gRPC port): %s" % (rc, took, lines[0], fields.get("retry-after"),
                                   text[:200].decode(errors="replace"),
                                   h2.answer_headers.get(1)))
        self.assertEqual(lines[0], "HTTP/1.1 503 Service Unavailable")
        self.assertIn("retry-after", fields)
        error = json.loads(text[:int(fields["content-length"])])
        self.assertEqual(error["code"], "unavailable")
        self.assertIn("draining", error["message"])
        self.assertEqual(error["details"][0]["type"], "google.rpc.RetryInfo")
        grpc_answer = h2.answer_headers.get(1, {})
        self.assertEqual(grpc_answer.get("grpc-status"), "14", grpc_answer)
        self.assertIn("grpc-status-details-bin", grpc_answer)

        self.assertEqual(rc, 0)
        self.assertLess(took, DRAIN_LIMIT)
        log = [json.loads(l) for l in server.log_lines() if l.startswith("{")]
        stopped = [l for l in log if l.get("event") == "server_stopped"]
        self.assertEqual(len(stopped), 1)
        self.assertEqual(stopped[0]["drain"], "calls_done")
        self.assertLess(stopped[0]["drain_seconds"], DRAIN_LIMIT)
        late = {l["address"] for l in log
                if l.get("event") == "http_abuse" and l.get("reason") == "drain_body_late"}
        self.assertEqual(late, {server.address, server.flag_value("http_address")})


if __name__ == "__main__":
    unittest.main()
