"""Bad input over gRPC: wrong sizes, unknown and malformed key ids, wrong key types, batch limits,
oversized messages and malformed AEAD envelopes. The server must answer each with the code the
proto promises, keep the other batch items working, and still be SERVING at the end.

The server runs with --max_batch_items=64 and --max_message_bytes=8 MiB so the limits are cheap
to reach.

    OFFLOAD_SERVER=build/bin/offload_server /usr/bin/python3 -m unittest -v tests/e2e/test_bad_input.py
"""

import os
import re
import struct
import unittest
import urllib.error
import urllib.request

import grpc

from harness import (FAILED_PRECONDITION, INVALID_ARGUMENT, NOT_FOUND, OK, Server,
                     ServerTestCase, pb)

T = 60
MAX_ITEMS = 64
MAX_MESSAGE = 8 * 1024 * 1024
IA = grpc.StatusCode.INVALID_ARGUMENT

BAD_IDS = ["", "A", "Key", "-lead", ".lead", "_lead", "a" * 65, "a/b", "a b", "a:b", "caf\u00e9",
           "a\x00b", "a\nb", "../etc"]
GOOD_EDGE_IDS = ["0", "a" * 64, "z.9_-x", "9-"]


def size_msg(field, want, got):
    return (field, "expected %d bytes, got %d" % (want, got))


class BadInputTest(ServerTestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = Server("badinput", args=["--max_batch_items=%d" % MAX_ITEMS,
                                              "--max_message_bytes=%d" % MAX_MESSAGE])
        cls.servers = [cls.server]
        cls.server.start()
        s = cls.server
        cls.keys, cls.ed, cls.x, cls.box, cls.aead = s.keys, s.ed, s.x, s.box, s.aead
        mk = lambda i, t: s.keys.CreateKey(pb.keys.CreateKeyRequest(key_id=i, type=t), timeout=T)
        cls.ed_info = mk("bad-ed", pb.keys.KEY_TYPE_ED25519)
        cls.x_info = mk("bad-x", pb.keys.KEY_TYPE_X25519)
        cls.peer_info = mk("bad-peer", pb.keys.KEY_TYPE_X25519)
        mk("bad-chacha", pb.keys.KEY_TYPE_CHACHA20_POLY1305)
        mk("bad-xchacha", pb.keys.KEY_TYPE_XCHACHA20_POLY1305)
        mk("bad-gcm", pb.keys.KEY_TYPE_AES256_GCM)
        cls.ed_pk = cls.ed_info.versions[0].public_key
        cls.x_pk = cls.x_info.versions[0].public_key
        cls.peer_pk = cls.peer_info.versions[0].public_key
        cls.sig = s.ed.Sign(pb.ed.SignRequest(key_id="bad-ed", message=b"msg"), timeout=T).signature

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def good_verify(self):
        return pb.ed.VerifyRequest(public_key=self.ed_pk, message=b"msg", signature=self.sig)

    # -- sizes ----------------------------------------------------------------------------

    def test_verify_sizes(self):
        bad = []
        for n in (0, 1, 31, 33, 64):
            bad.append((pb.ed.VerifyRequest(public_key=self.ed_pk[:n] if n <= 32 else self.ed_pk + bytes(n - 32),
                                            message=b"msg", signature=self.sig),
                        size_msg("public_key", 32, n)))
        for n in (0, 32, 63, 65, 128):
            sig = self.sig[:n] if n <= 64 else self.sig + bytes(n - 64)
            bad.append((pb.ed.VerifyRequest(public_key=self.ed_pk, message=b"msg", signature=sig),
                        size_msg("signature", 64, n)))
        for req, parts in bad:
            self.assertRpcError(IA, self.ed.Verify, req, timeout=T, contains=parts)
        items = []
        for req, _ in bad:
            items += [self.good_verify(), req]
        resp = self.ed.BatchVerify(pb.ed.BatchVerifyRequest(items=items), timeout=T)
        self.assertEqual(len(resp.results), len(items))
        for i, r in enumerate(resp.results):
            if i % 2 == 0:
                self.assertItem(r, OK, what="good item %d" % i)
                self.assertTrue(r.valid, "good item %d" % i)
            else:
                self.assertItem(r, INVALID_ARGUMENT, contains=bad[i // 2][1], what="bad item %d" % i)
                self.assertFalse(r.valid)

    def test_import_sizes(self):
        cases = [(pb.keys.KEY_TYPE_ED25519, n) for n in (0, 31, 33, 63, 65)]
        cases += [(pb.keys.KEY_TYPE_X25519, n) for n in (0, 31, 33, 64)]
        cases += [(t, n) for t in (pb.keys.KEY_TYPE_CHACHA20_POLY1305,
                                   pb.keys.KEY_TYPE_XCHACHA20_POLY1305,
                                   pb.keys.KEY_TYPE_AES256_GCM) for n in (0, 16, 24, 31, 33, 64)]
        for i, (t, n) in enumerate(cases):
            self.assertRpcError(IA, self.keys.ImportKey, pb.keys.ImportKeyRequest(
                key_id="imp-size-%d" % i, type=t, secret=os.urandom(n)), timeout=T, contains="secret")
        # 64-byte Ed25519 secret whose public half does not match the seed.
        seed = os.urandom(32)
        self.assertRpcError(IA, self.keys.ImportKey, pb.keys.ImportKeyRequest(
            key_id="imp-mismatch", type=pb.keys.KEY_TYPE_ED25519, secret=seed + self.ed_pk), timeout=T)
        for key_id in ["imp-size-%d" % i for i in range(len(cases))] + ["imp-mismatch"]:
            self.assertRpcError(grpc.StatusCode.NOT_FOUND, self.keys.GetKey,
                                pb.keys.GetKeyRequest(key_id=key_id), timeout=T)
        # Type unspecified / unknown.
        for t in (pb.keys.KEY_TYPE_UNSPECIFIED, 99):
            self.assertRpcError(IA, self.keys.CreateKey, pb.keys.CreateKeyRequest(
                key_id="imp-type-%d" % t, type=t), timeout=T)
            self.assertRpcError(IA, self.keys.ImportKey, pb.keys.ImportKeyRequest(
                key_id="imp-type-%d" % t, type=t, secret=bytes(32)), timeout=T)

    def test_derive_sizes(self):
        bad = [(n, size_msg("peer_public_key", 32, n)) for n in (0, 1, 31, 33, 64)]
        for n, parts in bad:
            self.assertRpcError(IA, self.x.Derive, pb.x.DeriveRequest(
                key_id="bad-x", peer_public_key=os.urandom(n)), timeout=T, contains=parts)
        good = pb.x.DeriveRequest(key_id="bad-x", peer_public_key=self.peer_pk)
        want = self.x.Derive(good, timeout=T).shared_key
        items = [good]
        for n, _ in bad:
            items += [pb.x.DeriveRequest(key_id="bad-x", peer_public_key=os.urandom(n)), good]
        resp = self.x.BatchDerive(pb.x.BatchDeriveRequest(items=items), timeout=T)
        for i, r in enumerate(resp.results):
            if i % 2 == 0:
                self.assertItem(r, OK, what="good item %d" % i)
                self.assertEqual(r.response.shared_key, want)
            else:
                self.assertItem(r, INVALID_ARGUMENT, contains=bad[i // 2][1], what="item %d" % i)

    def test_box_sizes(self):
        seal = lambda **kw: pb.box.BoxSealRequest(**dict(
            dict(key_id="bad-x", peer_public_key=self.peer_pk, plaintext=b"p"), **kw))
        for n in (0, 31, 33):
            self.assertRpcError(IA, self.box.Seal, seal(peer_public_key=bytes(n)), timeout=T,
                                contains=size_msg("peer_public_key", 32, n))
        for n in (1, 12, 23, 25):
            self.assertRpcError(IA, self.box.Seal, seal(nonce=bytes(n)), timeout=T,
                                contains=size_msg("nonce", 24, n))
        good = self.box.Seal(seal(), timeout=T)
        open_ = lambda **kw: pb.box.BoxOpenRequest(**dict(
            dict(key_id="bad-peer", peer_public_key=self.x_pk, nonce=good.nonce,
                 ciphertext=good.ciphertext), **kw))
        self.assertEqual(self.box.Open(open_(), timeout=T).plaintext, b"p")
        bad = []
        for n in (0, 12, 23, 25):
            bad.append((open_(nonce=bytes(n)), size_msg("nonce", 24, n)))
        for n in (0, 31, 33):
            bad.append((open_(peer_public_key=bytes(n)), size_msg("peer_public_key", 32, n)))
        for n in (0, 1, 15):
            bad.append((open_(ciphertext=good.ciphertext[:n]), ("ciphertext",)))
        for req, parts in bad:
            self.assertRpcError(IA, self.box.Open, req, timeout=T, contains=parts)
        items = [open_()]
        for req, _ in bad:
            items += [req, open_()]
        resp = self.box.BatchOpen(pb.box.BatchBoxOpenRequest(items=items), timeout=T)
        for i, r in enumerate(resp.results):
            if i % 2 == 0:
                self.assertItem(r, OK, what="good item %d" % i)
                self.assertEqual(r.response.plaintext, b"p")
            else:
                self.assertItem(r, INVALID_ARGUMENT, contains=bad[i // 2][1], what="item %d" % i)
        resp = self.box.BatchSeal(pb.box.BatchBoxSealRequest(items=[
            seal(), seal(nonce=bytes(23)), seal(peer_public_key=bytes(31)), seal()]), timeout=T)
        self.assertEqual([r.status.code for r in resp.results], [OK, INVALID_ARGUMENT,
                                                                 INVALID_ARGUMENT, OK])

    # -- key ids and types ----------------------------------------------------------------

    def test_unknown_key_ids(self):
        nf = grpc.StatusCode.NOT_FOUND
        calls = [
            (self.ed.Sign, pb.ed.SignRequest(key_id="nope", message=b"m")),
            (self.x.Derive, pb.x.DeriveRequest(key_id="nope", peer_public_key=self.peer_pk)),
            (self.box.Seal, pb.box.BoxSealRequest(key_id="nope", peer_public_key=self.peer_pk)),
            (self.box.Open, pb.box.BoxOpenRequest(key_id="nope", peer_public_key=self.peer_pk,
                                                  nonce=bytes(24), ciphertext=bytes(32))),
            (self.aead.Seal, pb.aead.AeadSealRequest(key_id="nope", plaintext=b"p")),
            (self.aead.Open, pb.aead.AeadOpenRequest(key_id="nope",
                                                     envelope=b"\x01" + bytes(4 + 12 + 16))),
            (self.keys.GetKey, pb.keys.GetKeyRequest(key_id="nope")),
            (self.keys.RotateKey, pb.keys.RotateKeyRequest(key_id="nope")),
            (self.keys.DeleteKey, pb.keys.DeleteKeyRequest(key_id="nope")),
        ]
        for fn, req in calls:
            self.assertRpcError(nf, fn, req, timeout=T)
        r = self.ed.BatchSign(pb.ed.BatchSignRequest(items=[
            pb.ed.SignRequest(key_id="bad-ed", message=b"m"),
            pb.ed.SignRequest(key_id="nope", message=b"m"),
            pb.ed.SignRequest(key_id="bad-ed", message=b"m")]), timeout=T)
        self.assertEqual([x.status.code for x in r.results], [OK, NOT_FOUND, OK])
        self.assertEqual(len(r.results[2].response.signature), 64)
        r = self.x.BatchDerive(pb.x.BatchDeriveRequest(items=[
            pb.x.DeriveRequest(key_id="nope", peer_public_key=self.peer_pk),
            pb.x.DeriveRequest(key_id="bad-x", peer_public_key=self.peer_pk)]), timeout=T)
        self.assertEqual([x.status.code for x in r.results], [NOT_FOUND, OK])
        r = self.aead.BatchSeal(pb.aead.BatchAeadSealRequest(items=[
            pb.aead.AeadSealRequest(key_id="nope"), pb.aead.AeadSealRequest(key_id="bad-gcm")]),
            timeout=T)
        self.assertEqual([x.status.code for x in r.results], [NOT_FOUND, OK])
        # Unknown key version for Derive and Box.Open: the proto does not pin the code; either
        # NOT_FOUND or INVALID_ARGUMENT is a refusal, anything else is not.
        for fn, req in ((self.x.Derive, pb.x.DeriveRequest(
                            key_id="bad-x", key_version=9, peer_public_key=self.peer_pk)),
                        (self.box.Open, pb.box.BoxOpenRequest(
                            key_id="bad-x", key_version=9, peer_public_key=self.peer_pk,
                            nonce=bytes(24), ciphertext=bytes(32)))):
            err = rpc_error_of(fn, req)
            self.assertIsNotNone(err, "unknown key version accepted")
            self.assertIn(err.code(), (nf, IA), err.details())

    def test_wrong_key_type(self):
        fp = grpc.StatusCode.FAILED_PRECONDITION
        chacha_env = self.aead.Seal(pb.aead.AeadSealRequest(key_id="bad-chacha", plaintext=b"p"),
                                    timeout=T).envelope
        calls = [
            (self.ed.Sign, pb.ed.SignRequest(key_id="bad-x", message=b"m")),
            (self.ed.Sign, pb.ed.SignRequest(key_id="bad-gcm", message=b"m")),
            (self.x.Derive, pb.x.DeriveRequest(key_id="bad-ed", peer_public_key=self.peer_pk)),
            (self.x.Derive, pb.x.DeriveRequest(key_id="bad-chacha", peer_public_key=self.peer_pk)),
            (self.box.Seal, pb.box.BoxSealRequest(key_id="bad-ed", peer_public_key=self.peer_pk)),
            (self.box.Open, pb.box.BoxOpenRequest(key_id="bad-gcm", peer_public_key=self.peer_pk,
                                                  nonce=bytes(24), ciphertext=bytes(32))),
            (self.aead.Seal, pb.aead.AeadSealRequest(key_id="bad-ed", plaintext=b"p")),
            (self.aead.Seal, pb.aead.AeadSealRequest(key_id="bad-x", plaintext=b"p")),
            (self.aead.Open, pb.aead.AeadOpenRequest(key_id="bad-x", envelope=chacha_env)),
        ]
        for fn, req in calls:
            self.assertRpcError(fp, fn, req, timeout=T)
        r = self.ed.BatchSign(pb.ed.BatchSignRequest(items=[
            pb.ed.SignRequest(key_id="bad-x", message=b"m"),
            pb.ed.SignRequest(key_id="bad-ed", message=b"m")]), timeout=T)
        self.assertEqual([x.status.code for x in r.results], [FAILED_PRECONDITION, OK])
        r = self.aead.BatchOpen(pb.aead.BatchAeadOpenRequest(items=[
            pb.aead.AeadOpenRequest(key_id="bad-ed", envelope=chacha_env),
            pb.aead.AeadOpenRequest(key_id="bad-chacha", envelope=chacha_env)]), timeout=T)
        self.assertEqual([x.status.code for x in r.results], [FAILED_PRECONDITION, OK])
        self.assertEqual(r.results[1].response.plaintext, b"p")

    def test_bad_key_ids(self):
        for key_id in BAD_IDS:
            with self.subTest(key_id=key_id):
                for fn, req in (
                        (self.keys.CreateKey, pb.keys.CreateKeyRequest(
                            key_id=key_id, type=pb.keys.KEY_TYPE_ED25519)),
                        (self.keys.ImportKey, pb.keys.ImportKeyRequest(
                            key_id=key_id, type=pb.keys.KEY_TYPE_ED25519, secret=bytes(32))),
                        (self.keys.GetKey, pb.keys.GetKeyRequest(key_id=key_id)),
                        (self.keys.RotateKey, pb.keys.RotateKeyRequest(key_id=key_id)),
                        (self.keys.DeleteKey, pb.keys.DeleteKeyRequest(key_id=key_id)),
                        (self.ed.Sign, pb.ed.SignRequest(key_id=key_id, message=b"m")),
                        (self.aead.Seal, pb.aead.AeadSealRequest(key_id=key_id))):
                    self.assertRpcError(IA, fn, req, timeout=T)
        r = self.ed.BatchSign(pb.ed.BatchSignRequest(items=[
            pb.ed.SignRequest(key_id="Bad", message=b"m"),
            pb.ed.SignRequest(key_id="bad-ed", message=b"m")]), timeout=T)
        self.assertEqual([x.status.code for x in r.results], [INVALID_ARGUMENT, OK])
        listed = [k.key_id for k in self.keys.ListKeys(pb.keys.ListKeysRequest(), timeout=T).keys]
        self.assertFalse(set(BAD_IDS) & set(listed))
        for key_id in GOOD_EDGE_IDS:
            info = self.keys.CreateKey(pb.keys.CreateKeyRequest(
                key_id=key_id, type=pb.keys.KEY_TYPE_ED25519), timeout=T)
            self.assertEqual(info.key_id, key_id)

    # -- whole-call limits ----------------------------------------------------------------

    def test_empty_and_oversized_batches(self):
        good = {
            "BatchSign": (self.ed.BatchSign, pb.ed.BatchSignRequest,
                          pb.ed.SignRequest(key_id="bad-ed", message=b"m")),
            "BatchVerify": (self.ed.BatchVerify, pb.ed.BatchVerifyRequest, self.good_verify()),
            "BatchDerive": (self.x.BatchDerive, pb.x.BatchDeriveRequest,
                            pb.x.DeriveRequest(key_id="bad-x", peer_public_key=self.peer_pk)),
            "Box.BatchSeal": (self.box.BatchSeal, pb.box.BatchBoxSealRequest,
                              pb.box.BoxSealRequest(key_id="bad-x", peer_public_key=self.peer_pk)),
            "Box.BatchOpen": (self.box.BatchOpen, pb.box.BatchBoxOpenRequest,
                              pb.box.BoxOpenRequest(key_id="bad-x", peer_public_key=self.peer_pk,
                                                    nonce=bytes(24), ciphertext=bytes(16))),
            "Aead.BatchSeal": (self.aead.BatchSeal, pb.aead.BatchAeadSealRequest,
                               pb.aead.AeadSealRequest(key_id="bad-gcm", plaintext=b"p")),
            "Aead.BatchOpen": (self.aead.BatchOpen, pb.aead.BatchAeadOpenRequest,
                               pb.aead.AeadOpenRequest(key_id="bad-gcm", envelope=b"")),
        }
        for name, (fn, batch, item) in good.items():
            with self.subTest(rpc=name):
                self.assertRpcError(IA, fn, batch(), timeout=T)
                self.assertRpcError(IA, fn, batch(items=[item] * (MAX_ITEMS + 1)), timeout=T)
                self.assertRpcError(IA, fn, batch(items=[item] * (MAX_ITEMS * 20)), timeout=T)
                resp = fn(batch(items=[item] * MAX_ITEMS), timeout=T)
                self.assertEqual(len(resp.results), MAX_ITEMS)

    def test_message_over_limit(self):
        big = os.urandom(MAX_MESSAGE + 1024)
        self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, self.ed.Sign,
                            pb.ed.SignRequest(key_id="bad-ed", message=big), timeout=T)
        self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, self.aead.Seal,
                            pb.aead.AeadSealRequest(key_id="bad-gcm", plaintext=big), timeout=T)
        # Just under the limit works.
        ok = self.ed.Sign(pb.ed.SignRequest(key_id="bad-ed", message=big[:MAX_MESSAGE - 4096]),
                          timeout=T)
        self.assertEqual(len(ok.signature), 64)

    # -- AEAD envelopes -------------------------------------------------------------------

    def test_malformed_envelopes(self):
        for key_id, n in (("bad-chacha", 12), ("bad-xchacha", 24), ("bad-gcm", 12)):
            with self.subTest(key=key_id):
                pt = b"attack at dawn"
                env = self.aead.Seal(pb.aead.AeadSealRequest(key_id=key_id, plaintext=pt,
                                                             associated_data=b"ad"), timeout=T).envelope
                self.assertEqual(len(env), 5 + n + len(pt) + 16)
                open_ = lambda e: pb.aead.AeadOpenRequest(key_id=key_id, envelope=e,
                                                          associated_data=b"ad")
                bad = {
                    "empty": b"",
                    "1 byte": b"\x01",
                    "header only": env[:5],
                    "header+nonce": env[:5 + n],
                    "one short of minimum": env[:5 + n + 15],
                    "minimum length, garbage tag": env[:5 + n] + bytes(16),
                    "truncated by one": env[:-1],
                    "extra byte": env + b"\x00",
                    "version 0x00": b"\x00" + env[1:],
                    "version 0x02": b"\x02" + env[1:],
                    "version 0xff": b"\xff" + env[1:],
                    "tampered tag": env[:-1] + bytes([env[-1] ^ 0x80]),
                    "tampered ciphertext": env[:5 + n] + bytes([env[5 + n] ^ 1]) + env[6 + n:],
                    "tampered nonce": env[:5] + bytes([env[5] ^ 1]) + env[6:],
                }
                for what, e in bad.items():
                    err = self.assertRpcError(IA, self.aead.Open, open_(e), timeout=T)
                    if what.startswith("tampered") or what.startswith("minimum"):
                        self.assertIn("authentication failed", err.details(), what)
                # Unknown key versions (none exists but 1): 0, 2, 2^32-1.
                for v in (0, 2, 0xffffffff):
                    e = env[:1] + struct.pack(">I", v) + env[5:]
                    err = self._open_error(open_(e))
                    self.assertIn(err.code(), (grpc.StatusCode.INVALID_ARGUMENT,
                                               grpc.StatusCode.NOT_FOUND),
                                  "key version %d: %s %s" % (v, err.code(), err.details()))
                # Each bad envelope as a batch item between good ones.
                items = [open_(env)]
                for e in bad.values():
                    items += [open_(e), open_(env)]
                r = self.aead.BatchOpen(pb.aead.BatchAeadOpenRequest(items=items), timeout=T)
                for i, res in enumerate(r.results):
                    if i % 2 == 0:
                        self.assertItem(res, OK, what="good item %d" % i)
                        self.assertEqual(res.response.plaintext, pt)
                    else:
                        self.assertItem(res, INVALID_ARGUMENT, what=list(bad)[i // 2])
                # The good envelope still opens (no failure was cached as success or vice versa).
                self.assertEqual(self.aead.Open(open_(env), timeout=T).plaintext, pt)

    def test_malformed_envelope_is_refused_whatever_the_key_id(self):
        # aead.proto: what the envelope shows alone (shorter than any algorithm's 33 bytes,
        # another format version) is INVALID_ARGUMENT before the key is looked up: an unknown
        # key id or one of another type does not turn it into NOT_FOUND or FAILED_PRECONDITION.
        env = self.aead.Seal(pb.aead.AeadSealRequest(key_id="bad-chacha", plaintext=b"p"),
                             timeout=T).envelope
        shapes = {"empty": b"", "1 byte": b"\x01", "32 bytes": b"\x01" * 32,
                  "format 2": b"\x02" + env[1:]}
        for key_id in ("no-such-key", "bad-ed", "bad-chacha"):
            for what, e in shapes.items():
                with self.subTest(key=key_id, envelope=what):
                    err = self.assertRpcError(IA, self.aead.Open,
                                              pb.aead.AeadOpenRequest(key_id=key_id, envelope=e),
                                              timeout=T)
                    self.assertIn("envelope: ", err.details())
                    self.assertRpcError(IA, self.aead.Rewrap,
                                        pb.aead.AeadRewrapRequest(key_id=key_id, envelope=e),
                                        timeout=T)
            r = self.aead.BatchOpen(pb.aead.BatchAeadOpenRequest(items=[
                pb.aead.AeadOpenRequest(key_id=key_id, envelope=e) for e in shapes.values()]),
                timeout=T)
            for res in r.results:
                self.assertItem(res, INVALID_ARGUMENT, what=key_id)
        # A well-formed envelope still needs its key.
        self.assertRpcError(grpc.StatusCode.NOT_FOUND, self.aead.Open,
                            pb.aead.AeadOpenRequest(key_id="no-such-key", envelope=env), timeout=T)

    def test_json_errors_never_repeat_a_secret(self):
        # A Connect JSON ImportKey whose secret the parser refuses: protobuf's error quotes the
        # value (here a PEM private key) or a snippet of the input. Neither the caller's answer,
        # nor the log, nor the audit line may carry it; the audit line names the peer.
        marker = "MC4CAQAwBQYDK2VwBCIEIKEYMATERIALNEVERLOGGED"
        bodies = [
            '{"keyId":"imp-json","type":"KEY_TYPE_ED25519","secret":"-----BEGIN PRIVATE KEY-----'
            '\\n%s\\n-----END PRIVATE KEY-----"}' % marker,
            '{"keyId":"imp-json","secret":%s}' % marker,
            '{"keyId":"imp-json","secret":"%s" "x"}' % marker,
            '{"keyId":"imp-json","secret":"%s' % marker,
        ]
        url = "http://%s/offload.v1.KeyService/ImportKey" % self.server.flag_value("http_address")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for body in bodies:
            with self.subTest(body=body[:40]):
                req = urllib.request.Request(url, data=body.encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
                try:
                    opener.open(req, timeout=T)
                    self.fail("a malformed ImportKey was accepted")
                except urllib.error.HTTPError as e:
                    self.assertEqual(e.code, 400)
                    answer = e.read().decode()
                self.assertIn('"invalid_argument"', answer)
                self.assertIn("invalid JSON", answer)
                self.assertNotIn(marker, answer)
        lines = [l for l in self.server.log_lines() if '"method":"ImportKey"' in l]
        self.assertGreaterEqual(len(lines), len(bodies))
        for line in self.server.log_lines():
            self.assertNotIn(marker, line)
        for line in lines:
            self.assertRegex(line, r'"peer":"ipv4:127\.0\.0\.1:\d+"')

    def _open_error(self, req):
        try:
            self.aead.Open(req, timeout=T)
        except grpc.RpcError as e:
            return e
        self.fail("Open of an envelope with an unknown key version succeeded")

    def aead_opens(self):
        """How many AEAD decryptions the server has run (offload_crypto_operations_total)."""
        text = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            "http://%s/metrics" % self.server.flag_value("metrics_address"), timeout=10).read()
        m = re.search(r'^offload_crypto_operations_total\{op="aead_open"\} (\S+)$',
                      text.decode(), re.M)
        self.assertIsNotNone(m, "no aead_open counter in /metrics")
        return float(m.group(1))

    def test_large_garbage_envelope_rejected_without_decrypting(self):
        # A malformed envelope of any size is refused on its header alone: the 4 MB bodies are
        # never decrypted (the server's count of AEAD decryptions does not move). Counted, not
        # timed: a time bound would measure the machine.
        size = 4 * 1024 * 1024
        blobs = {
            "random, version 0x02": b"\x02" + os.urandom(size - 1),
            "zeros": bytes(size),
            "valid version, unknown key version": b"\x01" + struct.pack(">I", 77) + os.urandom(size - 5),
        }
        before = self.aead_opens()
        for what, blob in blobs.items():
            for key_id in ("bad-chacha", "bad-xchacha", "bad-gcm"):
                err = rpc_error_of(self.aead.Open, pb.aead.AeadOpenRequest(key_id=key_id, envelope=blob))
                self.assertIsNotNone(err, what)
                self.assertIn(err.code(), (IA, grpc.StatusCode.NOT_FOUND), "%s: %s" % (what, err.details()))
                if what != "valid version, unknown key version":
                    self.assertEqual(err.code(), IA, what)
        self.assertEqual(self.aead_opens() - before, 0, "a malformed envelope was decrypted")
        # With a valid header, a 4 MB body that does not authenticate is refused too, after the
        # one decryption that finds its tag wrong.
        env = self.aead.Seal(pb.aead.AeadSealRequest(key_id="bad-gcm", plaintext=b"x"), timeout=T).envelope
        blob = env[:17] + os.urandom(size)
        before = self.aead_opens()
        self.assertRpcError(IA, self.aead.Open, pb.aead.AeadOpenRequest(key_id="bad-gcm", envelope=blob),
                            timeout=T, contains="authentication failed")
        self.assertEqual(self.aead_opens() - before, 1)

    # -- and afterwards -------------------------------------------------------------------

    def test_zz_still_serving(self):
        """Runs last (alphabetical order): the server took all of the above and still answers."""
        self.assertEqual(self.server.health_status(), pb.health.HealthCheckResponse.SERVING)
        sig = self.ed.Sign(pb.ed.SignRequest(key_id="bad-ed", message=b"after"), timeout=T)
        self.assertTrue(self.ed.Verify(pb.ed.VerifyRequest(
            public_key=self.ed_pk, message=b"after", signature=sig.signature), timeout=T).valid)
        env = self.aead.Seal(pb.aead.AeadSealRequest(key_id="bad-xchacha", plaintext=b"ok"), timeout=T)
        self.assertEqual(self.aead.Open(pb.aead.AeadOpenRequest(
            key_id="bad-xchacha", envelope=env.envelope), timeout=T).plaintext, b"ok")
        self.assertIsNone(self.server.proc.poll(), "server process still running")


def rpc_error_of(fn, req):
    try:
        fn(req, timeout=T)
    except grpc.RpcError as e:
        return e
    return None


if __name__ == "__main__":
    unittest.main(verbosity=2)
