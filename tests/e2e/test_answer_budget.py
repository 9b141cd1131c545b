"""Answers nobody reads are bounded per connection (issue 33, point 2).

On each port (a server of its own each, so that one run's memory is not the next one's), 16 raw
HTTP/2 connections from 127.0.0.2 grant the server no receive window (SETTINGS_INITIAL_WINDOW_SIZE
0) and ask, keeping to the server's flow control for their request bodies, for AEAD Opens of
55 KB plaintexts: every envelope distinct and sealed here (an imported key, libsodium's
ChaCha20-Poly1305 through python3-nacl), so that every Open is a fresh one computed by a worker
and no answer shares a memo buffer with another. No answer can be sent, so they wait in memory,
where before this budget a gRPC connection held up to 256 of them (14 MiB each, 223 MiB for 16).

Asserted, never a time:
  - each connection got answers queued until its answer budget was spent
    (--http_connection_answer_budget_bytes, 4 MiB by default: at most budget / 55 KB answers, plus
    the one that passed it and those the workers were computing), and its further calls were
    refused RESOURCE_EXHAUSTED with a retry delay (gRPC grpc-status 8 and
    grpc-status-details-bin, Connect 429 and Retry-After), never REFUSED_STREAM;
  - the server's peak RSS (VmHWM, reset before the run) grew by at most 16 x the answer budget
    plus ALLOWANCE: the admitted requests' 55 KB envelopes (one client: at most
    --max_client_inflight, 256, calls in flight), the open memo (bounded here to 1 MiB for the
    key), request bodies on their way, allocator slack;
  - the budgets' bytes go back to zero once the connections close, and the server serves on.
A third case sends all its HEADERS before the bodies, asking for memo hits (answered at once,
with no worker to look at the budget): the calls whose bodies complete past the budget are refused
too.
RSS says nothing under a sanitizer: there only the answers and counts are checked.
"""

import os
import re
import struct
import sys
import threading
import time
import unittest
import urllib.request

import nacl.bindings

import harness
from harness import SANITIZED, pb
import test_http2_abuse as raw
import test_http2_abuse_grpc as raw_grpc

CONNECTIONS = 16
ANSWER = 55000
# Requests per connection: more than a 4 MiB budget's worth of answers (76), within the HTTP
# port's stream limit (--http2_max_concurrent_streams, 100: these streams all stay open, their
# answers unsent), as a client keeping to SETTINGS_MAX_CONCURRENT_STREAMS does.
STREAMS = 100
WORKERS = 2
ANSWER_BUDGET = 4 << 20  # the default of --http_connection_answer_budget_bytes
ALLOWANCE = 40 << 20
OPEN = "/offload.v1.AeadService/Open"


def vm_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s" % field)


def metric(address, name):
    text = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        "http://%s/metrics" % address, timeout=10).read().decode()
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


class AnswerBudgetTest(harness.ServerTestCase):

    def run_port(self, kind):
        server = harness.Server("answer-budget-" + kind, backend="libsodium", args=[
            "--workers=%d" % WORKERS, "--memo_open_bytes_per_key=1048576"])
        self.servers = [server]
        server.start()
        self.addCleanup(server.stop)
        secret = os.urandom(32)
        info = server.keys.ImportKey(pb.keys.ImportKeyRequest(
            key_id="blobs", type=pb.keys.KEY_TYPE_CHACHA20_POLY1305, secret=secret), timeout=30)
        version = info.current_version

        def envelope():
            # proto/offload/v1/aead.proto: 0x01, key version (4 bytes, big-endian), nonce, then
            # ciphertext and tag.
            nonce = os.urandom(12)
            sealed = nacl.bindings.crypto_aead_chacha20poly1305_ietf_encrypt(
                os.urandom(ANSWER), None, nonce, secret)
            return b"\x01" + struct.pack(">I", version) + nonce + sealed

        # The sealing is checked once, through the server.
        one = envelope()
        self.assertEqual(len(server.aead.Open(pb.aead.AeadOpenRequest(
            key_id="blobs", envelope=one), timeout=30).plaintext), ANSWER)

        address = server.flag_value(kind + "_address")
        port = int(address.rsplit(":", 1)[1])
        metrics_address = server.flag_value("metrics_address")
        attacker_class = raw_grpc.GrpcAttacker if kind == "grpc" else raw.Attacker
        if kind == "grpc":
            refused_answer = lambda f: f.get("grpc-status") == "8" and \
                "grpc-status-details-bin" in f
        else:
            refused_answer = lambda f: f.get(":status") == "429" and "retry-after" in f

        pid = server.proc.pid
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")  # VmHWM from here on
        rss_before = vm_kib(pid, "VmRSS")
        attackers = [attacker_class(port, initial_window_size=0) for _ in range(CONNECTIONS)]

        def drive(a):
            for stream in range(1, 2 * STREAMS, 2):
                body = pb.aead.AeadOpenRequest(key_id="blobs", envelope=envelope())
                if not a.request_within_window(stream, OPEN, body.SerializeToString()):
                    break
            a.read(until_closed=False, timeout=3.0)

        threads = [threading.Thread(target=drive, args=(a,), daemon=True) for a in attackers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        time.sleep(1.0)  # the workers' last answers reach the loops
        hwm = vm_kib(pid, "VmHWM")
        held = metric(metrics_address, 'offload_http_buffered_bytes{port="%s"}' % kind)
        grown = (hwm - rss_before) * 1024
        answered = [sum(1 for fields in a.answer_headers.values() if not refused_answer(fields))
                    for a in attackers]
        refused = [sum(1 for fields in a.answer_headers.values() if refused_answer(fields))
                   for a in attackers]
        print("\n  %s port: %d zero-window connections x %d Opens of %d bytes: answers queued %s, "
              "refused %s; RSS %+.1f MiB at peak (bound %.0f MiB = %d x %.0f MiB + %.0f MiB); "
              "budgets held %.1f MiB" % (
                  kind, CONNECTIONS, STREAMS, ANSWER, answered, refused, grown / 2**20,
                  (CONNECTIONS * ANSWER_BUDGET + ALLOWANCE) / 2**20, CONNECTIONS,
                  ANSWER_BUDGET / 2**20, ALLOWANCE / 2**20, (held or 0) / 2**20),
              file=sys.stderr)
        for a, n_answered, n_refused in zip(attackers, answered, refused):
            self.assertEqual(a.data_bytes, 0)
            self.assertLessEqual(n_answered, ANSWER_BUDGET // ANSWER + 1 + WORKERS)
            self.assertGreater(n_refused, 0, "no refusal on a connection past its budget")
            self.assertFalse([c for c in a.resets.values() if c == raw.REFUSED_STREAM])
        if not SANITIZED:
            self.assertLess(grown, CONNECTIONS * ANSWER_BUDGET + ALLOWANCE)
        for a in attackers:
            a.close()
        for _ in range(100):
            held = metric(metrics_address, 'offload_http_buffered_bytes{port="%s"}' % kind)
            if held == 0:
                break
            time.sleep(0.1)
        self.assertEqual(held, 0, "budget bytes still held after the connections closed")
        self.assertEqual(len(server.aead.Open(pb.aead.AeadOpenRequest(
            key_id="blobs", envelope=one), timeout=30).plaintext), ANSWER)

    def test_grpc_port(self):
        self.run_port("grpc")

    def test_headers_first_memo_hits(self):
        """A client that sends the HEADERS of all its streams first (each request taken while
        nothing was queued), then the bodies, of Opens the memo answers at once (no worker looks
        at the budget for a memo hit): its calls past the answer budget are refused all the same."""
        server = harness.Server("answer-budget-headers-first", backend="libsodium",
                                args=["--workers=%d" % WORKERS])
        self.servers = [server]
        server.start()
        self.addCleanup(server.stop)
        server.keys.CreateKey(pb.keys.CreateKeyRequest(
            key_id="blobs", type=pb.keys.KEY_TYPE_CHACHA20_POLY1305), timeout=30)
        sealed = server.aead.Seal(pb.aead.AeadSealRequest(key_id="blobs",
                                                          plaintext=os.urandom(ANSWER)))
        # Opened once: in the memo from here on.
        server.aead.Open(pb.aead.AeadOpenRequest(key_id="blobs", envelope=sealed.envelope),
                         timeout=30)
        request = pb.aead.AeadOpenRequest(key_id="blobs",
                                          envelope=sealed.envelope).SerializeToString()
        for kind in ("grpc", "http"):
            port = int(server.flag_value(kind + "_address").rsplit(":", 1)[1])
            a = (raw_grpc.GrpcAttacker if kind == "grpc" else raw.Attacker)(
                port, initial_window_size=0)
            streams = list(range(1, 2 * STREAMS, 2))
            a.send(b"".join(raw.frame(raw.HEADERS, raw.END_HEADERS, s, a.header_block(OPEN))
                            for s in streams))
            body = a.message(request)
            for s in streams:
                deadline = time.monotonic() + 30
                while a.window < len(body) and not a.closed and time.monotonic() < deadline:
                    a.read(until_closed=False, timeout=0.2)
                a.window -= len(body)
                a.send(b"".join(
                    raw.frame(raw.DATA, raw.END_STREAM if i + 16384 >= len(body) else 0, s,
                              body[i:i + 16384])
                    for i in range(0, len(body), 16384)))
            # Every stream answered or refused (HEADERS: the answers' own, or Trailers-Only).
            deadline = time.monotonic() + 30
            while len(a.answer_headers) < STREAMS and not a.closed and time.monotonic() < deadline:
                a.read(until_closed=False, timeout=0.2)
            if kind == "grpc":
                refused = lambda f: f.get("grpc-status") == "8" and "grpc-status-details-bin" in f
            else:
                refused = lambda f: f.get(":status") == "429" and "retry-after" in f
            answered = sum(1 for f in a.answer_headers.values() if not refused(f))
            n_refused = sum(1 for f in a.answer_headers.values() if refused(f))
            print("\n  %s port, HEADERS first, %d memo-hit Opens: %d answers queued, %d refused"
                  % (kind, STREAMS, answered, n_refused), file=sys.stderr)
            self.assertFalse(a.closed)
            self.assertEqual(answered + n_refused, STREAMS)
            self.assertEqual(a.data_bytes, 0)
            # The budget's worth and the answer that passed it (no worker computes a memo hit).
            self.assertLessEqual(answered, ANSWER_BUDGET // ANSWER + 1)
            self.assertGreater(n_refused, 0)
            a.close()

    def test_http_port(self):
        self.run_port("http")


if __name__ == "__main__":
    unittest.main()
