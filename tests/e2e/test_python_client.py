"""A third-party client (python3-grpcio, stubs generated from proto/) drives every service.

Round trips, key rotation and deletion, ListKeys/GetKey, the default batch limit, and - when
python3-nacl is installed - cross-checks against PyNaCl: Ed25519 signatures, X25519 and box keys,
and boxes sealed by one side and opened by the other.

    OFFLOAD_SERVER=build/bin/offload_server /usr/bin/python3 -m unittest -v tests/e2e/test_python_client.py
"""

import json
import os
import struct
import time
import unittest

import grpc

from harness import INVALID_ARGUMENT, NOT_FOUND, OK, Server, ServerTestCase, pb

try:
    import nacl.bindings
    import nacl.public
    import nacl.signing
    HAVE_NACL = True
except ImportError:  # python3-nacl is optional
    HAVE_NACL = False

T = 60
AEAD_TYPES = {
    "chacha": (pb.keys.KEY_TYPE_CHACHA20_POLY1305, 12),
    "xchacha": (pb.keys.KEY_TYPE_XCHACHA20_POLY1305, 24),
    "aesgcm": (pb.keys.KEY_TYPE_AES256_GCM, 12),
}


def summary(info):
    """KeyInfo as plain values (so that an absent and an empty `options` compare equal)."""
    return (info.key_id, info.type, info.current_version,
            [(v.version, v.public_key, v.created_unix_seconds) for v in info.versions],
            info.options.allow_zero_shared_secret)


class PythonClientTest(ServerTestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = Server("pyclient", args=["--key_deletion_wait=0"])  # DeleteKey at once: the tests re-create ids
        cls.servers = [cls.server]
        cls.server.start()
        s = cls.server
        cls.keys, cls.ed, cls.x, cls.box, cls.aead = s.keys, s.ed, s.x, s.box, s.aead

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def create(self, key_id, key_type, allow_zero=False):
        req = pb.keys.CreateKeyRequest(key_id=key_id, type=key_type)
        req.options.allow_zero_shared_secret = allow_zero
        info = self.keys.CreateKey(req, timeout=T)
        self.assertEqual(info.key_id, key_id)
        self.assertEqual(info.type, key_type)
        self.assertEqual(info.current_version, 1)
        self.assertEqual(len(info.versions), 1)
        self.assertEqual(info.versions[0].version, 1)
        self.assertLess(abs(info.versions[0].created_unix_seconds - time.time()), 300)
        return info

    # -- Ed25519 --------------------------------------------------------------------------

    def test_sign_and_batch_verify(self):
        info = self.create("py-ed", pb.keys.KEY_TYPE_ED25519)
        pk = info.versions[0].public_key
        self.assertEqual(len(pk), 32)
        messages = [b"", b"hello", os.urandom(1000), os.urandom(100000)]
        sigs = []
        for m in messages:
            r = self.ed.Sign(pb.ed.SignRequest(key_id="py-ed", message=m), timeout=T)
            self.assertEqual(len(r.signature), 64)
            self.assertEqual(r.key_version, 1)
            self.assertEqual(r.public_key, pk)
            again = self.ed.Sign(pb.ed.SignRequest(key_id="py-ed", message=m), timeout=T)
            self.assertEqual(again.signature, r.signature, "Ed25519 signing is deterministic")
            sigs.append(r.signature)
            if HAVE_NACL:
                nacl.signing.VerifyKey(pk).verify(m, r.signature)  # raises if invalid

        bs = self.ed.BatchSign(pb.ed.BatchSignRequest(items=[
            pb.ed.SignRequest(key_id="py-ed", message=m) for m in messages]), timeout=T)
        self.assertEqual([r.status.code for r in bs.results], [OK] * len(messages))
        self.assertEqual([r.response.signature for r in bs.results], sigs)

        items, want = [], []
        for m, s in zip(messages, sigs):
            items.append(pb.ed.VerifyRequest(public_key=pk, message=m, signature=s))
            want.append(True)
            items.append(pb.ed.VerifyRequest(public_key=pk, message=m + b"!", signature=s))
            want.append(False)
            flipped = bytearray(s)
            flipped[5] ^= 0x10
            items.append(pb.ed.VerifyRequest(public_key=pk, message=m, signature=bytes(flipped)))
            want.append(False)
        for round_ in range(2):
            r = self.ed.BatchVerify(pb.ed.BatchVerifyRequest(items=items), timeout=T)
            self.assertEqual([x.status.code for x in r.results], [OK] * len(items))
            self.assertEqual([x.valid for x in r.results], want, "round %d" % round_)
            self.assertFalse(any(x.memo_hit for x, w in zip(r.results, want) if not w),
                             "an invalid signature was served from the memo")
        one = self.ed.Verify(items[0], timeout=T)
        self.assertTrue(one.valid)

        if HAVE_NACL:
            # A signature made by PyNaCl verifies on the server, and the same seed imported gives
            # the same signature.
            sk = nacl.signing.SigningKey.generate()
            m = b"signed by pynacl"
            sig = sk.sign(m).signature
            r = self.ed.Verify(pb.ed.VerifyRequest(public_key=bytes(sk.verify_key), message=m,
                                                   signature=sig), timeout=T)
            self.assertTrue(r.valid)
            self.keys.ImportKey(pb.keys.ImportKeyRequest(
                key_id="py-ed-nacl", type=pb.keys.KEY_TYPE_ED25519, secret=bytes(sk)), timeout=T)
            r = self.ed.Sign(pb.ed.SignRequest(key_id="py-ed-nacl", message=m), timeout=T)
            self.assertEqual(r.signature, sig)
            self.assertEqual(r.public_key, bytes(sk.verify_key))
            # libsodium's 64-byte secret key form (seed || public key).
            self.keys.ImportKey(pb.keys.ImportKeyRequest(
                key_id="py-ed-nacl64", type=pb.keys.KEY_TYPE_ED25519,
                secret=bytes(sk) + bytes(sk.verify_key)), timeout=T)
            r = self.ed.Sign(pb.ed.SignRequest(key_id="py-ed-nacl64", message=m), timeout=T)
            self.assertEqual(r.signature, sig)

    def test_ed25519_rotation(self):
        v1 = self.create("py-ed-rot", pb.keys.KEY_TYPE_ED25519).versions[0].public_key
        s1 = self.ed.Sign(pb.ed.SignRequest(key_id="py-ed-rot", message=b"m"), timeout=T)
        info = self.keys.RotateKey(pb.keys.RotateKeyRequest(key_id="py-ed-rot"), timeout=T)
        self.assertEqual(info.current_version, 2)
        self.assertEqual([v.version for v in info.versions], [1, 2])
        self.assertEqual(info.versions[0].public_key, v1)
        v2 = info.versions[1].public_key
        self.assertNotEqual(v1, v2)
        s2 = self.ed.Sign(pb.ed.SignRequest(key_id="py-ed-rot", message=b"m"), timeout=T)
        self.assertEqual(s2.key_version, 2)
        self.assertEqual(s2.public_key, v2)
        for pk, sig in ((v1, s1.signature), (v2, s2.signature)):
            self.assertTrue(self.ed.Verify(pb.ed.VerifyRequest(
                public_key=pk, message=b"m", signature=sig), timeout=T).valid)
        self.assertFalse(self.ed.Verify(pb.ed.VerifyRequest(
            public_key=v2, message=b"m", signature=s1.signature), timeout=T).valid)

    # -- X25519 ---------------------------------------------------------------------------

    def test_derive(self):
        a = self.create("py-x-a", pb.keys.KEY_TYPE_X25519).versions[0].public_key
        b = self.create("py-x-b", pb.keys.KEY_TYPE_X25519).versions[0].public_key
        ab = self.x.Derive(pb.x.DeriveRequest(key_id="py-x-a", peer_public_key=b), timeout=T)
        ba = self.x.Derive(pb.x.DeriveRequest(key_id="py-x-b", peer_public_key=a), timeout=T)
        self.assertEqual(len(ab.shared_key), 32)
        self.assertEqual(ab.shared_key, ba.shared_key)
        self.assertEqual(ab.key_version, 1)
        again = self.x.Derive(pb.x.DeriveRequest(key_id="py-x-a", peer_public_key=b), timeout=T)
        self.assertEqual(again.shared_key, ab.shared_key)
        box_ab = self.x.Derive(pb.x.DeriveRequest(key_id="py-x-a", peer_public_key=b,
                                                  output=pb.x.DERIVE_OUTPUT_BOX_BEFORENM), timeout=T)
        self.assertNotEqual(box_ab.shared_key, ab.shared_key)
        batch = self.x.BatchDerive(pb.x.BatchDeriveRequest(items=[
            pb.x.DeriveRequest(key_id="py-x-a", peer_public_key=b),
            pb.x.DeriveRequest(key_id="py-x-b", peer_public_key=a, output=pb.x.DERIVE_OUTPUT_RAW),
            pb.x.DeriveRequest(key_id="py-x-b", peer_public_key=a,
                               output=pb.x.DERIVE_OUTPUT_BOX_BEFORENM),
        ]), timeout=T)
        self.assertEqual([r.status.code for r in batch.results], [OK, OK, OK])
        self.assertEqual([r.response.shared_key for r in batch.results],
                         [ab.shared_key, ab.shared_key, box_ab.shared_key])
        if HAVE_NACL:
            mine = nacl.public.PrivateKey.generate()
            got = self.x.Derive(pb.x.DeriveRequest(key_id="py-x-a",
                                                   peer_public_key=bytes(mine.public_key)), timeout=T)
            self.assertEqual(got.shared_key, nacl.bindings.crypto_scalarmult(bytes(mine), a))
            got = self.x.Derive(pb.x.DeriveRequest(key_id="py-x-a",
                                                   peer_public_key=bytes(mine.public_key),
                                                   output=pb.x.DERIVE_OUTPUT_BOX_BEFORENM), timeout=T)
            self.assertEqual(got.shared_key,
                             nacl.public.Box(mine, nacl.public.PublicKey(a)).shared_key())

    def test_x25519_rotation(self):
        self.create("py-x-rot", pb.keys.KEY_TYPE_X25519)
        peer = self.create("py-x-peer", pb.keys.KEY_TYPE_X25519).versions[0].public_key
        d1 = self.x.Derive(pb.x.DeriveRequest(key_id="py-x-rot", peer_public_key=peer), timeout=T)
        info = self.keys.RotateKey(pb.keys.RotateKeyRequest(key_id="py-x-rot"), timeout=T)
        self.assertEqual(info.current_version, 2)
        d2 = self.x.Derive(pb.x.DeriveRequest(key_id="py-x-rot", peer_public_key=peer), timeout=T)
        self.assertEqual(d2.key_version, 2)
        self.assertNotEqual(d2.shared_key, d1.shared_key, "derive memo must not outlive a rotation")
        old = self.x.Derive(pb.x.DeriveRequest(key_id="py-x-rot", key_version=1,
                                               peer_public_key=peer), timeout=T)
        self.assertEqual(old.key_version, 1)
        self.assertEqual(old.shared_key, d1.shared_key)
        # The peer side agrees with each version's public key.
        for v, want in ((0, d1.shared_key), (1, d2.shared_key)):
            pk = info.versions[v].public_key
            got = self.x.Derive(pb.x.DeriveRequest(key_id="py-x-peer", peer_public_key=pk), timeout=T)
            self.assertEqual(got.shared_key, want)

    # -- Box ------------------------------------------------------------------------------

    def test_box_round_trip(self):
        a = self.create("py-box-a", pb.keys.KEY_TYPE_X25519).versions[0].public_key
        b = self.create("py-box-b", pb.keys.KEY_TYPE_X25519).versions[0].public_key
        for pt in (b"", b"x", os.urandom(4096)):
            sealed = self.box.Seal(pb.box.BoxSealRequest(key_id="py-box-a", peer_public_key=b,
                                                         plaintext=pt), timeout=T)
            self.assertEqual(len(sealed.nonce), 24)
            self.assertEqual(len(sealed.ciphertext), 16 + len(pt))
            self.assertEqual(sealed.key_version, 1)
            opened = self.box.Open(pb.box.BoxOpenRequest(key_id="py-box-b", peer_public_key=a,
                                                         nonce=sealed.nonce,
                                                         ciphertext=sealed.ciphertext), timeout=T)
            self.assertEqual(opened.plaintext, pt)
        n1 = self.box.Seal(pb.box.BoxSealRequest(key_id="py-box-a", peer_public_key=b,
                                                 plaintext=b"same"), timeout=T)
        n2 = self.box.Seal(pb.box.BoxSealRequest(key_id="py-box-a", peer_public_key=b,
                                                 plaintext=b"same"), timeout=T)
        self.assertNotEqual(n1.nonce, n2.nonce, "service-picked nonces must be random")
        bs = self.box.BatchSeal(pb.box.BatchBoxSealRequest(items=[
            pb.box.BoxSealRequest(key_id="py-box-a", peer_public_key=b, plaintext=b"p%d" % i)
            for i in range(10)]), timeout=T)
        self.assertEqual([r.status.code for r in bs.results], [OK] * 10)
        bo = self.box.BatchOpen(pb.box.BatchBoxOpenRequest(items=[
            pb.box.BoxOpenRequest(key_id="py-box-b", peer_public_key=a, nonce=r.response.nonce,
                                  ciphertext=r.response.ciphertext) for r in bs.results]), timeout=T)
        self.assertEqual([r.status.code for r in bo.results], [OK] * 10)
        self.assertEqual([r.response.plaintext for r in bo.results], [b"p%d" % i for i in range(10)])
        # Box.Open after rotation with the old version.
        self.keys.RotateKey(pb.keys.RotateKeyRequest(key_id="py-box-b"), timeout=T)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.box.Open, pb.box.BoxOpenRequest(
            key_id="py-box-b", peer_public_key=a, nonce=n1.nonce, ciphertext=n1.ciphertext),
            timeout=T, contains="authentication failed")
        old = self.box.Open(pb.box.BoxOpenRequest(key_id="py-box-b", key_version=1, peer_public_key=a,
                                                  nonce=n1.nonce, ciphertext=n1.ciphertext), timeout=T)
        self.assertEqual(old.plaintext, b"same")

    @unittest.skipUnless(HAVE_NACL, "python3-nacl not installed")
    def test_box_interop_with_pynacl(self):
        srv = self.create("py-box-nacl", pb.keys.KEY_TYPE_X25519).versions[0].public_key
        mine = nacl.public.PrivateKey.generate()
        local = nacl.public.Box(mine, nacl.public.PublicKey(srv))
        for pt in (b"", b"from the server", os.urandom(3000)):
            # Server seals, PyNaCl opens.
            sealed = self.box.Seal(pb.box.BoxSealRequest(
                key_id="py-box-nacl", peer_public_key=bytes(mine.public_key), plaintext=pt), timeout=T)
            self.assertEqual(local.decrypt(sealed.ciphertext, sealed.nonce), pt)
            # PyNaCl seals, server opens.
            nonce = os.urandom(24)
            ct = local.encrypt(pt, nonce).ciphertext
            opened = self.box.Open(pb.box.BoxOpenRequest(
                key_id="py-box-nacl", peer_public_key=bytes(mine.public_key), nonce=nonce,
                ciphertext=ct), timeout=T)
            self.assertEqual(opened.plaintext, pt)
            # A caller-chosen nonce gives exactly PyNaCl's ciphertext.
            same = self.box.Seal(pb.box.BoxSealRequest(
                key_id="py-box-nacl", peer_public_key=bytes(mine.public_key), nonce=nonce,
                plaintext=pt), timeout=T)
            self.assertEqual(same.ciphertext, ct)
            self.assertEqual(same.nonce, nonce)

    # -- AEAD -----------------------------------------------------------------------------

    def test_aead_round_trip_rotation_delete(self):
        for name, (key_type, nonce_len) in AEAD_TYPES.items():
            with self.subTest(alg=name):
                key_id = "py-aead-" + name
                info = self.create(key_id, key_type)
                self.assertEqual(info.versions[0].public_key, b"")
                pt, aad = os.urandom(777), b"header"
                s1 = self.aead.Seal(pb.aead.AeadSealRequest(key_id=key_id, plaintext=pt,
                                                            associated_data=aad), timeout=T)
                env1 = s1.envelope
                self.assertEqual(s1.key_version, 1)
                self.assertEqual(len(env1), 5 + nonce_len + len(pt) + 16)
                self.assertEqual(env1[0], 1)
                self.assertEqual(struct.unpack(">I", env1[1:5])[0], 1)
                again = self.aead.Seal(pb.aead.AeadSealRequest(key_id=key_id, plaintext=pt,
                                                               associated_data=aad), timeout=T)
                self.assertNotEqual(again.envelope[5:5 + nonce_len], env1[5:5 + nonce_len],
                                    "random nonces")
                o = self.aead.Open(pb.aead.AeadOpenRequest(key_id=key_id, envelope=env1,
                                                           associated_data=aad), timeout=T)
                self.assertEqual(o.plaintext, pt)
                self.assertEqual(o.key_version, 1)
                self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.aead.Open,
                                    pb.aead.AeadOpenRequest(key_id=key_id, envelope=env1,
                                                            associated_data=b"other"),
                                    timeout=T, contains="authentication failed")
                empty = self.aead.Seal(pb.aead.AeadSealRequest(key_id=key_id), timeout=T)
                self.assertEqual(len(empty.envelope), 5 + nonce_len + 16)
                self.assertEqual(self.aead.Open(pb.aead.AeadOpenRequest(
                    key_id=key_id, envelope=empty.envelope), timeout=T).plaintext, b"")

                # Rotation: v1 envelopes still open, new ones carry v2.
                rot = self.keys.RotateKey(pb.keys.RotateKeyRequest(key_id=key_id), timeout=T)
                self.assertEqual(rot.current_version, 2)
                self.assertEqual([v.version for v in rot.versions], [1, 2])
                s2 = self.aead.Seal(pb.aead.AeadSealRequest(key_id=key_id, plaintext=pt,
                                                            associated_data=aad), timeout=T)
                self.assertEqual(s2.key_version, 2)
                self.assertEqual(struct.unpack(">I", s2.envelope[1:5])[0], 2)
                batch = self.aead.BatchOpen(pb.aead.BatchAeadOpenRequest(items=[
                    pb.aead.AeadOpenRequest(key_id=key_id, envelope=env1, associated_data=aad),
                    pb.aead.AeadOpenRequest(key_id=key_id, envelope=s2.envelope, associated_data=aad),
                    pb.aead.AeadOpenRequest(key_id=key_id, envelope=s2.envelope, associated_data=b""),
                ]), timeout=T)
                self.assertEqual([r.status.code for r in batch.results], [OK, OK, INVALID_ARGUMENT])
                self.assertEqual([r.response.key_version for r in batch.results[:2]], [1, 2])
                self.assertEqual(batch.results[0].response.plaintext, pt)
                self.assertEqual(batch.results[1].response.plaintext, pt)
                # The v2 envelope relabelled as v1 must not open (the version picks the key).
                relabelled = s2.envelope[:1] + struct.pack(">I", 1) + s2.envelope[5:]
                self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.aead.Open,
                                    pb.aead.AeadOpenRequest(key_id=key_id, envelope=relabelled,
                                                            associated_data=aad), timeout=T)

                bseal = self.aead.BatchSeal(pb.aead.BatchAeadSealRequest(items=[
                    pb.aead.AeadSealRequest(key_id=key_id, plaintext=b"%d" % i) for i in range(5)]),
                    timeout=T)
                self.assertEqual([r.status.code for r in bseal.results], [OK] * 5)
                self.assertTrue(all(r.response.key_version == 2 for r in bseal.results))

                # Delete: everything about the key is NOT_FOUND.
                self.keys.DeleteKey(pb.keys.DeleteKeyRequest(key_id=key_id), timeout=T)
                for call, req in (
                        (self.aead.Open, pb.aead.AeadOpenRequest(key_id=key_id, envelope=env1,
                                                                 associated_data=aad)),
                        (self.aead.Seal, pb.aead.AeadSealRequest(key_id=key_id, plaintext=pt)),
                        (self.keys.GetKey, pb.keys.GetKeyRequest(key_id=key_id)),
                        (self.keys.RotateKey, pb.keys.RotateKeyRequest(key_id=key_id)),
                        (self.keys.DeleteKey, pb.keys.DeleteKeyRequest(key_id=key_id))):
                    self.assertRpcError(grpc.StatusCode.NOT_FOUND, call, req, timeout=T)
                batch = self.aead.BatchOpen(pb.aead.BatchAeadOpenRequest(items=[
                    pb.aead.AeadOpenRequest(key_id=key_id, envelope=env1, associated_data=aad)]),
                    timeout=T)
                self.assertEqual(batch.results[0].status.code, NOT_FOUND)
                listed = self.keys.ListKeys(pb.keys.ListKeysRequest(), timeout=T)
                self.assertNotIn(key_id, [k.key_id for k in listed.keys])

                # Same id again: a new key, and the old envelope (whose plaintext the open memo
                # had seen) must not open under it.
                self.create(key_id, key_type)
                self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.aead.Open,
                                    pb.aead.AeadOpenRequest(key_id=key_id, envelope=env1,
                                                            associated_data=aad), timeout=T)

    def test_aead_wrong_key_type(self):
        self.create("py-aead-ed", pb.keys.KEY_TYPE_ED25519)
        self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, self.aead.Seal,
                            pb.aead.AeadSealRequest(key_id="py-aead-ed", plaintext=b"p"), timeout=T)

    # -- key management -------------------------------------------------------------------

    def test_list_and_get_keys(self):
        made = {}
        for i, key_type in enumerate([pb.keys.KEY_TYPE_ED25519, pb.keys.KEY_TYPE_X25519,
                                      pb.keys.KEY_TYPE_CHACHA20_POLY1305,
                                      pb.keys.KEY_TYPE_XCHACHA20_POLY1305,
                                      pb.keys.KEY_TYPE_AES256_GCM]):
            key_id = "py-list.%d_k-%d" % (i, key_type)
            made[key_id] = self.create(key_id, key_type, allow_zero=(key_type == pb.keys.KEY_TYPE_X25519))
        self.assertRpcError(grpc.StatusCode.ALREADY_EXISTS, self.keys.CreateKey,
                            pb.keys.CreateKeyRequest(key_id="py-list.0_k-1",
                                                     type=pb.keys.KEY_TYPE_ED25519), timeout=T)
        self.assertRpcError(grpc.StatusCode.ALREADY_EXISTS, self.keys.ImportKey,
                            pb.keys.ImportKeyRequest(key_id="py-list.0_k-1",
                                                     type=pb.keys.KEY_TYPE_ED25519,
                                                     secret=bytes(32)), timeout=T)
        listed = {k.key_id: k for k in self.keys.ListKeys(pb.keys.ListKeysRequest(), timeout=T).keys}
        for key_id, info in made.items():
            self.assertIn(key_id, listed)
            self.assertEqual(summary(listed[key_id]), summary(info), "ListKeys entry equals CreateKey's answer")
            got = self.keys.GetKey(pb.keys.GetKeyRequest(key_id=key_id), timeout=T)
            self.assertEqual(summary(got), summary(info), "GetKey equals CreateKey's answer")
            want_pk = 32 if info.type in (pb.keys.KEY_TYPE_ED25519, pb.keys.KEY_TYPE_X25519) else 0
            self.assertEqual(len(got.versions[0].public_key), want_pk)
        x_id = "py-list.1_k-2"
        self.assertTrue(listed[x_id].options.allow_zero_shared_secret)
        self.assertFalse(listed["py-list.0_k-1"].options.allow_zero_shared_secret)
        self.assertEqual(len(listed), len(set(listed)), "no duplicate ids")
        rot = self.keys.RotateKey(pb.keys.RotateKeyRequest(key_id=x_id), timeout=T)
        self.assertTrue(rot.options.allow_zero_shared_secret, "options survive rotation")
        self.assertEqual(summary(self.keys.GetKey(pb.keys.GetKeyRequest(key_id=x_id), timeout=T)),
                         summary(rot))
        self.keys.DeleteKey(pb.keys.DeleteKeyRequest(key_id=x_id), timeout=T)
        listed = [k.key_id for k in self.keys.ListKeys(pb.keys.ListKeysRequest(), timeout=T).keys]
        self.assertNotIn(x_id, listed)
        self.assertIn("py-list.0_k-1", listed)

    def test_default_batch_limit(self):
        info = self.create("py-limit", pb.keys.KEY_TYPE_ED25519)
        sig = self.ed.Sign(pb.ed.SignRequest(key_id="py-limit", message=b"m"), timeout=T).signature
        item = pb.ed.VerifyRequest(public_key=info.versions[0].public_key, message=b"m", signature=sig)
        ok = self.ed.BatchVerify(pb.ed.BatchVerifyRequest(items=[item] * 1024), timeout=T)
        self.assertEqual(len(ok.results), 1024)
        self.assertTrue(all(r.status.code == OK and r.valid for r in ok.results))
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.ed.BatchVerify,
                            pb.ed.BatchVerifyRequest(items=[item] * 1025), timeout=T)

    def test_zz_logs_are_json_lines(self):
        """Runs last: the server's stderr so far is JSON lines (one object per line)."""
        lines = [l for l in self.server.log_lines()[1:] if l.strip()]  # [0] is our command line
        self.assertTrue(lines, "the server logged nothing")
        for line in lines:
            try:
                self.assertIsInstance(json.loads(line), dict, line)
            except ValueError:
                self.fail("not a JSON line on the server's stderr: %r" % line[:200])


if __name__ == "__main__":
    unittest.main(verbosity=2)
