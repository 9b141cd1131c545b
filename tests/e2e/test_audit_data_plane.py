"""The data-plane audit and fail-closed auditing (issue 26).

- --audit_data_plane=all: every Sign, Derive, Box and AEAD call (single and batch, gRPC and
  Connect, memo hits answered on the event loop included) leaves one "data_plane" line naming the
  method, the key id and the version used, never a payload; the HMAC chain over the file checks
  with `offloadctl audit verify`, and an edited data-plane line is named.
- --audit_data_plane=0.5: about half of 400 calls are audited (loose bounds).
- --audit_fail_closed: with the audit file unwritable (its path, a symlink, swapped to /dev/full:
  writes fail with ENOSPC, also for root), calls are refused UNAVAILABLE on gRPC and Connect; once
  the path names the file again they succeed, and the chain checks across the gap.
- Refusals under --audit_fail_closed (issue 33) are held as every audited answer is: an
  UNAUTHENTICATED answer arrives after its `unauthenticated` line is in the file, and while the
  file is unwritable the refusal is UNAVAILABLE ("audit log unwritable") instead.
- Key lifecycle lines name an anonymous caller as data-plane lines do: `anonymous`, source `none`.
"""
import base64
import json
import os
import re
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import grpc

import harness
from harness import pb

K = pb.keys


def verify(audit, key):
    r = subprocess.run([os.environ["OFFLOAD_CTL"], "audit", "verify", "--key_file=" + key, audit],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f.read().splitlines() if line]


def data_plane(path):
    return [line for line in read_lines(path) if line.get("event") == "data_plane"]


def wait_for(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def repoint(link, target):
    """Points the symlink `link` at `target` atomically (a rename over it)."""
    tmp = link + ".new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def connect(server, service, method, request, response_type):
    """A Connect unary call in binary proto over HTTP/1.1: (HTTP status, message or error JSON)."""
    port = int(server.flag_value("http_address").rsplit(":", 1)[1])
    req = urllib.request.Request(
        "http://127.0.0.1:%d/offload.v1.%s/%s" % (port, service, method),
        data=request.SerializeToString(), headers={"content-type": "application/proto"},
        method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, response_type.FromString(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


def metric(server, name):
    port = int(server.flag_value("metrics_address").rsplit(":", 1)[1])
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


class AuditDataPlaneTest(harness.ServerTestCase):
    def setUp(self):
        if not os.environ.get("OFFLOAD_CTL"):
            self.skipTest("OFFLOAD_CTL (the offloadctl binary) is not set")
        self.work = tempfile.mkdtemp(prefix="audit-dp-", dir=harness._WORK)
        self.key = os.path.join(self.work, "key")
        with open(self.key, "wb") as f:
            f.write(os.urandom(32))
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is None:
                s.stop()

    def start(self, name, audit, *flags):
        server = harness.Server(name, args=["--audit_log_file=" + audit,
                                            "--audit_chain_key_file=" + self.key] + list(flags))
        self.servers.append(server)
        server.start()
        return server

    def test_every_key_using_call_is_audited_and_chained(self):
        audit = os.path.join(self.work, "audit.jsonl")
        server = self.start("dp-all", audit, "--audit_data_plane=all")
        server.keys.CreateKey(K.CreateKeyRequest(key_id="s", type=K.KEY_TYPE_ED25519), timeout=10)
        server.keys.CreateKey(K.CreateKeyRequest(key_id="x", type=K.KEY_TYPE_X25519), timeout=10)
        peer = server.keys.CreateKey(K.CreateKeyRequest(key_id="peer", type=K.KEY_TYPE_X25519),
                                     timeout=10).versions[0].public_key
        server.keys.CreateKey(K.CreateKeyRequest(key_id="a", type=K.KEY_TYPE_XCHACHA20_POLY1305),
                              timeout=10)
        server.keys.RotateKey(K.RotateKeyRequest(key_id="a"), timeout=10)  # version 2 seals

        secret = b"plaintext-never-audited"
        server.ed.Sign(pb.ed.SignRequest(key_id="s", message=secret), timeout=10)
        server.ed.BatchSign(pb.ed.BatchSignRequest(items=[
            pb.ed.SignRequest(key_id="s", message=b"1"), pb.ed.SignRequest(key_id="s", message=b"2"),
            pb.ed.SignRequest(key_id="nope", message=b"3")]), timeout=10)
        server.ed.Verify(pb.ed.VerifyRequest(public_key=b"\0" * 32, message=b"m",
                                             signature=b"\0" * 64), timeout=10)  # no key: no line
        server.x.Derive(pb.x.DeriveRequest(key_id="x", peer_public_key=peer), timeout=10)
        hit = server.x.Derive(pb.x.DeriveRequest(key_id="x", peer_public_key=peer), timeout=10)
        self.assertTrue(hit.memo_hit)  # answered on the event loop
        sealed = server.box.Seal(pb.box.BoxSealRequest(key_id="x", peer_public_key=peer,
                                                       plaintext=secret), timeout=10)
        # The box sealed by "x" for "peer" opens with "peer" and x's public key.
        x_pub = server.keys.GetKey(K.GetKeyRequest(key_id="x"), timeout=10).versions[0].public_key
        server.box.Open(pb.box.BoxOpenRequest(key_id="peer", peer_public_key=x_pub,
                                              nonce=sealed.nonce, ciphertext=sealed.ciphertext),
                        timeout=10)
        env = server.aead.Seal(pb.aead.AeadSealRequest(key_id="a", plaintext=secret),
                               timeout=10).envelope
        opened = server.aead.Open(pb.aead.AeadOpenRequest(key_id="a", envelope=env), timeout=10)
        self.assertTrue(opened.memo_hit)  # Seal recorded it: an echo is a memo hit
        # Connect, binary proto: the memo hit is answered from the memo's buffer on the loop.
        status, answer = connect(server, "AeadService", "Open",
                                 pb.aead.AeadOpenRequest(key_id="a", envelope=env),
                                 pb.aead.AeadOpenResponse)
        self.assertEqual(status, 200, answer)
        self.assertTrue(answer.memo_hit)
        self.assertRpcError(grpc.StatusCode.NOT_FOUND, server.ed.Sign,
                            pb.ed.SignRequest(key_id="missing", message=b"m"), timeout=10)

        want = 10  # Sign, BatchSign, Derive x2, Box Seal, Box Open, AEAD Seal, Open x2, Sign
        lines = wait_for(lambda: len(data_plane(audit)) >= want and data_plane(audit),
                         what="%d data_plane lines" % want)
        self.assertEqual(len(lines), want, lines)
        by = lambda method: [l for l in lines if l["method"].endswith(method)]
        sign = by("Ed25519Service/Sign")
        self.assertEqual([(l["key_id"], l.get("version"), l["code"]) for l in sign],
                         [("s", 1, "OK"), ("missing", None, "NOT_FOUND")])
        self.assertEqual(sign[0]["identity"], "anonymous")
        self.assertEqual(sign[0]["identity_source"], "none")
        created = [l for l in read_lines(audit) if l.get("event") == "key_create"]
        self.assertEqual(len(created), 4)
        self.assertEqual({(l["identity"], l["identity_source"]) for l in created},
                         {("anonymous", "none")})
        self.assertEqual(sign[0]["transport"], "grpc")
        self.assertTrue(sign[0]["peer"].startswith("ipv4:127.0.0.1:"), sign[0])
        (batch,) = by("BatchSign")
        self.assertEqual(batch["items"], 3)
        self.assertEqual(batch["failed_items"], 1)
        self.assertEqual(batch["keys"], [{"key_id": "s", "version": 1}, {"key_id": "nope"}])
        derive = by("X25519Service/Derive")
        self.assertEqual([(l["key_id"], l["version"], l["memo_hit"]) for l in derive],
                         [("x", 1, False), ("x", 1, True)])
        self.assertEqual([(l["key_id"], l.get("version")) for l in by("BoxService/Seal")],
                         [("x", 1)])
        self.assertEqual([l["key_id"] for l in by("BoxService/Open")], ["peer"])
        self.assertEqual([(l["key_id"], l["version"]) for l in by("AeadService/Seal")],
                         [("a", 2)])
        opens = by("AeadService/Open")
        self.assertEqual([(l["key_id"], l["version"], l["memo_hit"], l["transport"])
                          for l in opens],
                         [("a", 2, True, "grpc"), ("a", 2, True, "connect")])
        with open(audit) as f:
            text = f.read()
        for payload in (secret, env, sealed.ciphertext, peer):
            for form in (payload.hex(), base64.b64encode(payload).decode()):
                self.assertNotIn(form, text)
        self.assertNotIn("plaintext-never-audited", text)
        self.assertIsNotNone(metric(server, "offload_audit_data_plane_lines_total"))
        self.assertGreaterEqual(metric(server, "offload_audit_data_plane_lines_total"), want)

        server.stop()
        code, out = verify(audit, self.key)
        self.assertEqual(code, 0, out)
        with open(audit) as f:
            raw = f.read().splitlines()
        i = next(n for n, l in enumerate(raw) if '"event":"data_plane"' in l and '"key_id":"x"' in l)
        raw[i] = raw[i].replace('"key_id":"x"', '"key_id":"y"')
        edited = os.path.join(self.work, "edited.jsonl")
        with open(edited, "w") as f:
            f.write("\n".join(raw) + "\n")
        code, out = verify(edited, self.key)
        self.assertEqual(code, 1, out)
        self.assertIn("broken: line %d " % (i + 1), out)

    def test_a_sampled_fraction(self):
        audit = os.path.join(self.work, "sampled.jsonl")
        server = self.start("dp-half", audit, "--audit_data_plane=0.5")
        server.keys.CreateKey(K.CreateKeyRequest(key_id="s", type=K.KEY_TYPE_ED25519), timeout=10)
        for i in range(400):
            server.ed.Sign(pb.ed.SignRequest(key_id="s", message=b"%d" % i), timeout=10)
        server.stop()
        n = len(data_plane(audit))
        self.assertGreater(n, 100, n)
        self.assertLess(n, 300, n)
        self.assertEqual(verify(audit, self.key)[0], 0)

    def test_fail_closed_refuses_while_unwritable_and_recovers(self):
        if not os.access("/dev/full", os.W_OK):
            self.skipTest("no writable /dev/full")
        real = os.path.join(self.work, "real.jsonl")
        open(real, "w").close()
        link = os.path.join(self.work, "audit.jsonl")
        repoint(link, real)
        server = self.start("dp-closed", link, "--audit_data_plane=all", "--audit_fail_closed")
        server.keys.CreateKey(K.CreateKeyRequest(key_id="s", type=K.KEY_TYPE_ED25519), timeout=10)
        sign = lambda: server.ed.Sign(pb.ed.SignRequest(key_id="s", message=b"m"), timeout=10)
        connect_sign = lambda: connect(server, "Ed25519Service", "Sign",
                                       pb.ed.SignRequest(key_id="s", message=b"m"),
                                       pb.ed.SignResponse)
        sign()
        self.assertEqual(connect_sign()[0], 200)
        self.assertEqual(metric(server, "offload_audit_log_writable"), 1)

        repoint(link, "/dev/full")  # every write now fails with ENOSPC

        def refused():
            try:
                sign()
                return False
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())
                return e.details()
        details = wait_for(refused, what="UNAVAILABLE over gRPC")
        self.assertIn("audit log unwritable", details)
        status, error = connect_sign()
        self.assertEqual(status, 503, error)
        self.assertEqual(error["code"], "unavailable")
        self.assertIn("audit log unwritable", error["message"])
        self.assertRpcError(grpc.StatusCode.UNAVAILABLE, server.keys.CreateKey,
                            K.CreateKeyRequest(key_id="t", type=K.KEY_TYPE_ED25519), timeout=10)
        # Verify uses no key: not audited, still served.
        server.ed.Verify(pb.ed.VerifyRequest(public_key=b"\0" * 32, message=b"m",
                                             signature=b"\0" * 64), timeout=10)
        self.assertEqual(metric(server, "offload_audit_log_writable"), 0)
        self.assertGreaterEqual(metric(server, "offload_audit_refused_total"), 2)
        self.assertGreaterEqual(metric(server, "offload_audit_write_failures_total"), 1)

        repoint(link, real)  # writable again: the next probe (within a second) recovers

        def served():
            try:
                sign()
                return True
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())
                return False
        wait_for(served, what="Sign served again")
        self.assertEqual(connect_sign()[0], 200)
        server.keys.CreateKey(K.CreateKeyRequest(key_id="t", type=K.KEY_TYPE_ED25519), timeout=10)
        server.stop()

        lines = read_lines(real)
        events = [l["event"] for l in lines]
        self.assertIn("audit_log_recovered", events)
        recovered = events.index("audit_log_recovered")
        # Before the gap: ours, and those served until the writer saw the path change (its
        # check runs once a second).
        self.assertGreaterEqual(events[:recovered].count("data_plane"), 2)
        self.assertGreaterEqual(events[recovered:].count("data_plane"), 2)  # after it
        self.assertIn("key_create", events[recovered:])
        code, out = verify(real, self.key)
        self.assertEqual(code, 0, out)  # the chain goes on across the gap

    def test_fail_closed_holds_refusals_until_their_line_is_written(self):
        if not os.access("/dev/full", os.W_OK):
            self.skipTest("no writable /dev/full")
        real = os.path.join(self.work, "refusals.jsonl")
        open(real, "w").close()
        link = os.path.join(self.work, "refusals-link.jsonl")
        repoint(link, real)
        # --require_identity, identities only from a proxy at 127.0.0.2: every call from here
        # (127.0.0.1) is anonymous and refused.
        server = self.start("dp-refusals", link, "--audit_fail_closed", "--require_identity",
                            "--forwarded_identity_header=x-ssl-client-s-dn",
                            "--trusted_proxies=127.0.0.2/32")
        sign = lambda: server.ed.Sign(pb.ed.SignRequest(key_id="s", message=b"m"), timeout=10)
        connect_sign = lambda: connect(server, "Ed25519Service", "Sign",
                                       pb.ed.SignRequest(key_id="s", message=b"m"),
                                       pb.ed.SignResponse)
        refused_lines = lambda: [l for l in read_lines(real) if l["event"] == "unauthenticated"]
        # Each refusal is answered only once its line is in the file: read at once, no waiting.
        for i in range(20):
            self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, sign)
            self.assertEqual(len(refused_lines()), 2 * i + 1)
            status, error = connect_sign()
            self.assertEqual((status, error["code"]), (401, "unauthenticated"), error)
            self.assertEqual(len(refused_lines()), 2 * i + 2)

        repoint(link, "/dev/full")

        def unavailable():
            try:
                sign()
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    return e.details()
                self.assertEqual(e.code(), grpc.StatusCode.UNAUTHENTICATED, e.details())
            return False
        self.assertIn("audit log unwritable", wait_for(unavailable, what="held refusal"))
        status, error = connect_sign()
        self.assertEqual((status, error["code"]), (503, "unavailable"), error)
        self.assertGreaterEqual(metric(server, "offload_audit_refused_total"), 2)

        repoint(link, real)
        wait_for(lambda: not unavailable(), what="refusals answered again")
        before = len(refused_lines())
        self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, sign)
        self.assertEqual(len(refused_lines()), before + 1)
        server.stop()
        self.assertEqual(verify(real, self.key)[0], 0)


if __name__ == "__main__":
    unittest.main()
