"""The published HTTP/2 denial-of-service patterns against the front door, from a raw-frame client.

Each pattern is driven from 127.0.0.2 (one connection, then several) while a legitimate caller on
127.0.0.1 keeps making Connect calls, and each asserts outcomes, never a time:
  - the server stays up and the legitimate calls are all answered, correctly;
  - the server's RSS grows by no more than its stated memory budget (plus a fixed allowance for
    allocator slack), and the bytes its budgets hold go back to zero once the attacker leaves;
  - the abusive connection is closed (GOAWAY or a reset), or its frames cost no crypto work;
  - the defence that acted is counted in offload_http_abuse_total{reason}.
Patterns: Rapid Reset (CVE-2023-44487), MadeYouReset (CVE-2025-8671), CONTINUATION without
END_HEADERS (CVE-2024-27316 class), PING and SETTINGS floods (CVE-2019-9512/9515), a zero receive
window with large answers (CVE-2019-9517), and empty DATA frames (CVE-2019-9518).

Frames are packed by hand (struct) so that any sequence can be sent, headers encoded with Debian's
python3-hpack, frames read back with python3-hyperframe. `PORT_KIND` picks the port ("http"
here; test_http2_abuse_grpc.py runs the same cases on the gRPC port served by the engine, with gRPC
requests): the hooks `server_args`, `connection_budget`, `memory_budget`, `attacker` and `legit`
are what a port changes.
"""

import http.client
import json
import os
import socket
import struct
import threading
import time
import unittest

import hpack
from hyperframe.frame import Frame, GoAwayFrame, RstStreamFrame

from harness import SANITIZED, Server, ServerTestCase, pb

ATTACKER = "127.0.0.2"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
CANCEL, PROTOCOL_ERROR, REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x8, 0x1, 0x7, 0xB

# The server's budgets in this test (flags in Http2Abuse.server_args); README states the defaults.
CONNECTION_BUDGET = 1 << 20  # --http_connection_budget_bytes
ANSWER_BUDGET = 1 << 20      # --http_connection_answer_budget_bytes
MEMORY_BUDGET = 16 << 20     # --http_memory_budget_bytes
# RSS may grow by the budget plus this much: allocator arenas and caches, request parsing,
# thread stacks touched for the first time. The zero-window attack below would hold about
# 16 x 100 x 55 KB = 88 MB without a budget.
RSS_SLACK = 24 << 20

VERIFY = "/offload.v1.Ed25519Service/Verify"
OPEN = "/offload.v1.AeadService/Open"


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def settings(**values):
    ids = {"header_table_size": 1, "enable_push": 2, "max_concurrent_streams": 3,
           "initial_window_size": 4, "max_frame_size": 5, "max_header_list_size": 6}
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", ids[k], v) for k, v in values.items()))


class Attacker:
    """One raw HTTP/2 connection from ATTACKER to 127.0.0.1:port."""

    def __init__(self, port, **initial_settings):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((ATTACKER, 0))
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        self.encoder = hpack.Encoder()
        self.closed = False
        self.goaway = None       # error code of the server's GOAWAY, if one came
        self.resets = {}         # stream id -> error code of the server's RST_STREAM
        self.answers = set()     # streams the server answered (HEADERS)
        self.answer_headers = {}  # stream id -> the first HEADERS' fields, decoded
        self.decoder = hpack.Decoder()
        self.data_bytes = 0
        self.window = 65535      # the connection window the server has given us
        self._buf = b""
        self.send(PREFACE + settings(**initial_settings))

    def send(self, data):
        """False once the server has closed the connection (or stopped reading it for good)."""
        if self.closed:
            return False
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError, socket.timeout, OSError):
            self.closed = True
            return False

    def send_all(self, frames, chunk=32768):
        """Sends the byte strings `frames` yields, gathered into writes of about `chunk` bytes,
        until the server closes the connection."""
        batch = b""
        for f in frames:
            batch += f
            if len(batch) >= chunk:
                if not self.send(batch):
                    return
                batch = b""
        self.send(batch)

    def header_block(self, path, content_type="application/proto", extra=()):
        return self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                    (":authority", "127.0.0.1"), ("content-type", content_type)]
                                   + list(extra))

    def message(self, body):
        """The request body that carries the message `body` (Connect: the message itself)."""
        return body

    def request(self, stream, path, body, end=True):
        """HEADERS then DATA (END_STREAM when `end`) carrying the message `body`, in frames of at
        most 16 KiB."""
        out = frame(HEADERS, END_HEADERS, stream, self.header_block(path))
        body = self.message(body)
        pieces = [body[i:i + 16384] for i in range(0, len(body), 16384)] or [b""]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            out += frame(DATA, END_STREAM if (end and last) else 0, stream, piece)
        return out

    def request_within_window(self, stream, path, body, patience=3.0):
        """Sends a request once the server's connection window has room for its body (a client
        that keeps to flow control). False if the window stayed shut for `patience` seconds."""
        deadline = time.monotonic() + patience
        size = len(self.message(body))
        while self.window < size:
            if self.closed or time.monotonic() > deadline:
                return False
            self.read(until_closed=False, timeout=0.2)
        self.window -= size
        return self.send(self.request(stream, path, body))

    def read(self, until_closed=True, timeout=30.0):
        """Reads frames until the server closes (or for `timeout` if not `until_closed`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.05, min(1.0, deadline - time.monotonic())))
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                if not until_closed:
                    continue
                continue
            except (ConnectionResetError, OSError):
                self.closed = True
                return
            if not chunk:
                self.closed = True
                return
            self._buf += chunk
            self._parse()
        return

    def _parse(self):
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            if len(self._buf) < 9 + length:
                return
            f, _ = Frame.parse_frame_header(memoryview(self._buf[:9]))
            f.parse_body(memoryview(self._buf[9:9 + length]))
            self._buf = self._buf[9 + length:]
            if isinstance(f, GoAwayFrame):
                self.goaway = f.error_code
            elif isinstance(f, RstStreamFrame):
                self.resets[f.stream_id] = f.error_code
            elif f.type == HEADERS:
                self.answers.add(f.stream_id)
                # Decoded in order (the HPACK table is the connection's); the server's header
                # blocks fit one frame.
                fields = dict((k.decode() if isinstance(k, bytes) else k,
                               v.decode() if isinstance(v, bytes) else v)
                              for k, v in self.decoder.decode(bytes(f.data)))
                self.answer_headers.setdefault(f.stream_id, fields)
            elif f.type == DATA:
                self.data_bytes += length
            elif f.type == WINDOW_UPDATE and f.stream_id == 0:
                self.window += f.window_increment

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Legit(threading.Thread):
    """Connect calls from 127.0.0.1 over a kept-alive HTTP/1.1 connection until stopped; every
    answer is checked."""

    def __init__(self, port, request):
        super().__init__(daemon=True)
        self.port, self.body = port, request
        self.stop = threading.Event()
        self.ok = 0
        self.failures = []

    def run(self):
        conn = None
        while not self.stop.is_set() or self.ok == 0:
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30,
                                                      source_address=("127.0.0.1", 0))
                conn.request("POST", VERIFY, body=self.body,
                             headers={"Content-Type": "application/proto"})
                r = conn.getresponse()
                data = r.read()
                answer = pb.ed.VerifyResponse.FromString(data) if r.status == 200 else None
                if answer is None or not answer.valid:
                    self.failures.append("status %d: %r" % (r.status, data[:200]))
                else:
                    self.ok += 1
            except Exception as e:  # noqa: BLE001 - every failure is reported
                self.failures.append(repr(e))
                conn = None
            if len(self.failures) > 20:
                return


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def scrape(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    values = {}
    for line in data.decode().split("\r\n\r\n", 1)[1].splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def abuse(metrics, reason, port="http"):
    return metrics.get('offload_http_abuse_total{port="%s",reason="%s"}' % (port, reason), 0)


class Http2Abuse(ServerTestCase):
    # The port under attack: its address flag is --<PORT_KIND>_address, its metrics carry
    # port="<PORT_KIND>".
    PORT_KIND = "http"

    # -- what a port changes (overridden for the gRPC port) --------------------------------------

    @classmethod
    def server_args(cls):
        return ["--http_connection_budget_bytes=%d" % CONNECTION_BUDGET,
                "--http_connection_answer_budget_bytes=%d" % ANSWER_BUDGET,
                "--http_memory_budget_bytes=%d" % MEMORY_BUDGET]

    @classmethod
    def flag(cls, name):
        return int(cls.server.flag_value(name))

    def connection_budget(self):
        """Request bytes one connection to the attacked port may hold, from the server's flags."""
        return self.flag("http_connection_budget_bytes")

    def answer_budget(self):
        """Unsent answer bytes one connection may hold (both ports alike), from the flags."""
        return self.flag("http_connection_answer_budget_bytes")

    def refused_over_budget(self, fields):
        """Whether an answer's headers are the port's protocol's budget refusal: Connect's 429
        (resource_exhausted) here, with Retry-After."""
        return fields.get(":status") == "429" and "retry-after" in fields

    def memory_budget(self):
        """Bytes all connections to the attacked port may hold together (each port's engine has
        its own), from the server's flags."""
        return self.flag("http_memory_budget_bytes")

    def attacker(self):
        return Attacker(self.port())

    def legit(self):
        """The legitimate caller (a started thread is joined by attack())."""
        return Legit(self.http_port, self.legit_body)

    # ---------------------------------------------------------------------------------------------

    @classmethod
    def setUpClass(cls):
        cls.server = Server("http2-abuse-" + cls.PORT_KIND, backend="libsodium",
                            args=cls.server_args()).start()
        cls.servers = [cls.server]
        port_of = lambda flag: int(cls.server.flag_value(flag).rsplit(":", 1)[1])
        cls.http_port = port_of("http_address")
        cls.attacked_port = port_of(cls.PORT_KIND + "_address")
        cls.metrics_port = port_of("metrics_address")
        keys = cls.server.keys
        keys.CreateKey(pb.keys.CreateKeyRequest(key_id="signer", type=pb.keys.KEY_TYPE_ED25519))
        keys.CreateKey(pb.keys.CreateKeyRequest(key_id="blobs",
                                                type=pb.keys.KEY_TYPE_CHACHA20_POLY1305))
        signed = cls.server.ed.Sign(pb.ed.SignRequest(key_id="signer", message=b"legit"))
        cls.public_key = signed.public_key
        cls.legit_body = pb.ed.VerifyRequest(public_key=signed.public_key, message=b"legit",
                                             signature=signed.signature).SerializeToString()
        # Fresh verifies (each a curve operation if run): one signature, many messages would be
        # invalid; valid ones need signing, so the attacker's requests use one valid triple per
        # stream id modulo a few hundred, and the memo is off for them by being distinct.
        cls.signed = []
        for i in range(64):
            m = b"attack %d" % i
            s = cls.server.ed.Sign(pb.ed.SignRequest(key_id="signer", message=m))
            cls.signed.append(pb.ed.VerifyRequest(public_key=s.public_key, message=m,
                                                  signature=s.signature).SerializeToString())
        cls.open_answer_bytes = 55000
        sealed = cls.server.aead.Seal(pb.aead.AeadSealRequest(
            key_id="blobs", plaintext=os.urandom(cls.open_answer_bytes)))
        cls.open_body = pb.aead.AeadOpenRequest(key_id="blobs",
                                                envelope=sealed.envelope).SerializeToString()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def port(self):
        return self.attacked_port

    def bogus_verify(self, i):
        # A well-formed Verify whose answer is "invalid": never memoized, so each one run costs
        # a signature check.
        return pb.ed.VerifyRequest(public_key=self.public_key, message=b"x%d" % i,
                                   signature=b"\x01" * 64).SerializeToString()

    def attack(self, name, connections, drive, budget=None, expect_reasons=(),
               expect_closed=True, max_verifies=None, max_opens=None):
        """Runs `drive(attacker, index)` on `connections` attackers while a legitimate caller
        calls, then checks the outcomes listed in the module docstring. `budget` (RSS growth
        allowed, besides RSS_SLACK) is the port's memory budget unless given."""
        if budget is None:
            budget = self.memory_budget()
        port = self.PORT_KIND
        pid = self.server.proc.pid
        before = scrape(self.metrics_port)
        rss_before = rss_bytes(pid)
        legit = self.legit()
        legit.start()
        attackers = [self.attacker() for _ in range(connections)]
        threads = [threading.Thread(target=drive, args=(a, i), daemon=True)
                   for i, a in enumerate(attackers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        rss_peak = rss_bytes(pid)
        legit.stop.set()
        legit.join(60)
        during = scrape(self.metrics_port)
        for a in attackers:
            a.close()
        # Once the attackers are gone, nothing they sent is held.
        held = None
        for _ in range(100):
            held = scrape(self.metrics_port).get('offload_http_buffered_bytes{port="%s"}' % port)
            if held == 0:
                break
            time.sleep(0.1)
        after = scrape(self.metrics_port)
        grown = rss_peak - rss_before
        ops = lambda op: (during['offload_crypto_operations_total{op="%s"}' % op]
                          - before['offload_crypto_operations_total{op="%s"}' % op])
        verifies, opens = ops("ed25519_verify"), ops("aead_open")
        counted = {r: abuse(after, r, port) - abuse(before, r, port) for r in (
            "premature_resets", "reset_rate", "continuations", "control_flood", "settings",
            "no_progress", "protocol_error", "stream_refused", "read_paused", "send_timeout",
            "too_many_pings", "answers_unread")}
        print("%s port, %s x%d: RSS %+.1f MiB (budget %.0f MiB), legit calls %d ok, %d failed, "
              "verifies run %d, closed %d/%d, GOAWAY %s, defences %s"
              % (port, name, connections, grown / 2**20, budget / 2**20, legit.ok,
                 len(legit.failures),
                 verifies, sum(a.closed for a in attackers), connections,
                 sorted({a.goaway for a in attackers if a.goaway is not None}),
                 {k: int(v) for k, v in counted.items() if v}), flush=True)
        self.assertIsNone(self.server.proc.poll(), "the server died")
        self.assertEqual(legit.failures, [], "legitimate calls failed during " + name)
        self.assertGreater(legit.ok, 0)
        self.assertEqual(held, 0, "budget bytes still held after the attackers left")
        if not SANITIZED:
            self.assertLess(grown, budget + RSS_SLACK, "RSS grew past the budget: " + name)
        if expect_closed:
            self.assertTrue(all(a.closed for a in attackers),
                            "an abusive connection was left open: " + name)
        if expect_reasons:
            self.assertGreater(sum(counted[r] for r in expect_reasons), 0,
                               "no defence counted among %s" % (expect_reasons,))
            # ...and logged by the attacked port's engine (at most a line per reason per second,
            # so at least one).
            logged = set()
            address = self.server.flag_value(port + "_address")
            for text in self.server.log_lines():
                try:
                    line = json.loads(text)
                except ValueError:
                    continue
                if line.get("event") == "http_abuse" and line.get("address") == address:
                    logged.add(line.get("reason"))
            self.assertTrue(logged & set(expect_reasons),
                            "no http_abuse log line for %s (logged: %s)" % (expect_reasons, logged))
        if max_verifies is not None:
            self.assertLessEqual(verifies, max_verifies, "work was done for reset streams")
        if max_opens is not None:
            self.assertLessEqual(opens, max_opens, "the attack cost decryptions")
        self.assertEqual(self.server.health_status(), 1)  # SERVING
        return attackers, counted

    # -- the patterns ---------------------------------------------------------------------------

    def test_rapid_reset(self):
        def drive(a, index):
            # HEADERS + DATA (a Verify that would cost a signature check) + RST_STREAM, again and
            # again, never waiting: the stream count never reaches the concurrency limit.
            a.send_all(a.request(stream, VERIFY, self.bogus_verify(stream))
                       + frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL))
                       for stream in range(1, 2 * 20000, 2))
            a.read()

        for connections in (1, 4):
            # A request and its reset in one read: the stream is gone before the request would
            # be handed over, and no signature is checked for it (not even on the loop, where a
            # single Verify runs). A few may straddle two reads (their reset in the second),
            # and the legitimate caller's first Verify is one.
            attackers, _ = self.attack("rapid reset", connections, drive,
                                       expect_reasons=("premature_resets", "reset_rate"),
                                       max_verifies=10 * connections + 1)
            # Closed by our premature-reset rule (ENHANCE_YOUR_CALM) or nghttp2's reset rate
            # limit (INTERNAL_ERROR).
            self.assertTrue(all(a.goaway in (ENHANCE_YOUR_CALM, 0x2) for a in attackers),
                            [a.goaway for a in attackers])

    def test_made_you_reset(self):
        def drive(a, index):
            # A whole request, then a frame that makes the server reset the stream itself (a
            # WINDOW_UPDATE that overflows the stream's window: a stream error, FLOW_CONTROL_ERROR),
            # for stream after stream.
            a.send_all(a.request(stream, VERIFY, self.bogus_verify(stream))
                       + frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", 0x7FFFFFFF))
                       for stream in range(1, 2 * 5000, 2))
            a.read()

        for connections in (1, 4):
            # As for Rapid Reset: the stream our reset ended in the read that brought its
            # request is never handed over.
            attackers, counted = self.attack("MadeYouReset", connections, drive,
                                             expect_reasons=("premature_resets",),
                                             max_verifies=10 * connections + 1)
            self.assertTrue(all(a.goaway == ENHANCE_YOUR_CALM for a in attackers),
                            [a.goaway for a in attackers])

    def test_continuation_flood(self):
        def drive(a, index):
            filler = a.encoder.encode([("x-filler", "y" * 100)])
            a.send_all([frame(HEADERS, 0, 1, a.header_block(VERIFY))]  # no END_HEADERS
                       + [frame(CONTINUATION, 0, 1, filler)] * 20000, chunk=65536)
            a.read()

        for connections in (1, 4):
            self.attack("CONTINUATION flood", connections, drive,
                        expect_reasons=("continuations", "protocol_error"))

    def test_ping_flood_unread(self):
        def drive(a, index):
            # PINGs whose ACKs are never read: the server's outbound queue must not grow.
            payload = frame(PING, 0, 0, b"12345678") * 2000
            for _ in range(200):
                if not a.send(payload):
                    break
            a.read()

        for connections in (1, 4):
            self.attack("PING flood", connections, drive,
                        expect_reasons=("control_flood", "no_progress", "too_many_pings"))

    def test_settings_flood(self):
        def drive(a, index):
            payload = settings(initial_window_size=65535, max_frame_size=16384) * 2000
            for _ in range(100):
                if not a.send(payload):
                    break
            a.read()

        # Frames of two entries each: within --http2_max_settings, so `settings` is not the
        # reason (test_settings_too_many_entries has it).
        for connections in (1, 4):
            self.attack("SETTINGS flood", connections, drive,
                        expect_reasons=("control_flood", "no_progress"))

    def test_settings_too_many_entries(self):
        def drive(a, index):
            # One SETTINGS frame of 33 entries, one more than --http2_max_settings (32).
            a.send(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65535) * 33))
            a.read()

        for connections in (1, 4):
            attackers, counted = self.attack("SETTINGS of 33 entries", connections, drive,
                                             expect_reasons=("settings",))
            # nghttp2 sends the GOAWAY; each connection is counted once, as `settings` only.
            self.assertTrue(all(a.goaway == ENHANCE_YOUR_CALM for a in attackers),
                            [a.goaway for a in attackers])
            self.assertEqual(counted["settings"], connections)
            self.assertEqual(counted["protocol_error"], 0)

    def test_empty_data_frames(self):
        def drive(a, index):
            # An open stream (no END_STREAM), then DATA frames without a byte or an end.
            a.send(frame(HEADERS, END_HEADERS, 1, a.header_block(VERIFY)))
            payload = frame(DATA, 0, 1) * 5000
            for _ in range(400):
                if not a.send(payload):
                    break
            a.read()

        for connections in (1, 4):
            attackers, _ = self.attack("empty DATA frames", connections, drive,
                                       expect_reasons=("no_progress",))
            self.assertTrue(all(a.goaway == ENHANCE_YOUR_CALM for a in attackers))

    def test_zero_window_large_answers(self):
        streams = 300
        # More answers than one connection's answer budget holds, so that the budget must refuse
        # some.
        self.assertGreater(streams * self.open_answer_bytes, self.answer_budget())
        refused = {}

        def drive(a, index):
            # A receive window of 0: the server can send no DATA. 55 KB answers (AEAD Open memo
            # hits) are requested on every stream the server allows, and more, keeping to the
            # server's flow control for the request bodies.
            a.send(settings(initial_window_size=0))
            for stream in range(1, 2 * streams, 2):
                if not a.request_within_window(stream, OPEN, self.open_body):
                    break
            a.read(until_closed=False, timeout=3.0)
            # Refused in the protocol's terms (RESOURCE_EXHAUSTED with a retry delay), not with
            # REFUSED_STREAM (which nghttp2 still sends for the streams this client opens past
            # SETTINGS_MAX_CONCURRENT_STREAMS: refusals whose answers cannot be sent either keep
            # their streams open).
            refused[index] = sum(1 for fields in a.answer_headers.values()
                                 if self.refused_over_budget(fields))

        for connections in (1, 16):
            refused.clear()
            # The connections stay (their answers wait on their windows, within the budget), and
            # their opens cost no decryption: memo hits, answered from the memo's buffer.
            attackers, counted = self.attack("zero window, 55 KB answers", connections, drive,
                                             expect_closed=False, max_opens=0,
                                             expect_reasons=("answers_unread",))
            # Each connection got at most its answer budget's worth of answers queued (and one
            # more: the answer that passed it); the rest refused.
            self.assertGreater(sum(refused.values()), 0)
            self.assertTrue(all(a.data_bytes == 0 for a in attackers))
            for a in attackers:
                answered = [sid for sid, fields in a.answer_headers.items()
                            if not self.refused_over_budget(fields)]
                self.assertLessEqual(len(answered) - 1,
                                     self.answer_budget() // self.open_answer_bytes, answered)


if __name__ == "__main__":
    unittest.main()
