"""No key material, plaintext, message, signature or shared key in metrics, logs or errors.

Runs offload_server with --log_requests_sample_rate=1 (every call logged), imports keys whose
secrets the test knows (Ed25519 seed, X25519 secret, two AEAD keys), sends long distinctive
messages and plaintexts through every operation of every service, failures included (bad
lengths, wrong key types, unknown keys, tampered signatures and ciphertexts, a mismatched 64-byte
Ed25519 secret), then searches the scraped /metrics text, the server's whole stdout/stderr log and
every error message the client received for each of those values: raw, hex (both cases), base64
(standard and URL-safe, at every byte alignment), and their 16-byte prefixes. Key ids may be
logged; they must not be metric labels.

    OFFLOAD_SERVER=build-obs/bin/offload_server /usr/bin/python3 -m unittest -v \\
        tests/integration/test_no_secrets.py
"""

import base64
import hashlib
import os
import struct
import unittest

import nacl.bindings
import nacl.public
import nacl.signing

from obs_support import harness, pb, scrape

T = 60


def distinctive(label, n=32):
    """n bytes no other test or run produces: SHA-512 chains over a label."""
    out, block = b"", label.encode()
    while len(out) < n:
        block = hashlib.sha512(block).digest()
        out += block
    return out[:n]


def forms(value):
    """Every textual form in which `value` (bytes) could leak, with a name for each."""
    out = {"raw": value, "raw prefix": value[:16],
           "hex": value.hex().encode(), "HEX": value.hex().upper().encode(),
           "hex prefix": value[:16].hex().encode()}
    for shift in range(3):
        part = value[shift:]
        for name, enc in (("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)):
            text = enc(part).rstrip(b"=")
            text = text[:len(text) - 4]  # the last characters depend on what follows
            if len(text) >= 16:
                out["%s@%d" % (name, shift)] = text
    return out


class NoSecretsTest(harness.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.metrics_address = "127.0.0.1:%d" % harness.free_port()
        cls.server = harness.Server("secrets", args=[
            "--metrics_address=" + cls.metrics_address, "--log_requests_sample_rate=1"])
        cls.servers = [cls.server]
        cls.server.start()
        cls.needles = {}       # name -> bytes that must not appear
        cls.key_ids = []       # may be logged, must not be metric labels
        cls.errors = []        # error texts the client received
        cls.calls = 0
        try:
            cls.drive()
            cls.metrics_text = scrape(cls.metrics_address)
        finally:
            cls.server.stop()
        with open(cls.server.log_path, "rb") as f:
            cls.log = f.read()

    # ---- traffic --------------------------------------------------------------------------------

    @classmethod
    def secret(cls, name, n=32):
        value = distinctive("offload no-secrets test: " + name, n)
        cls.needles[name] = value
        return value

    @classmethod
    def text(cls, name, n=160):
        """A long distinctive printable string (as bytes)."""
        value = (b"zq-" + name.encode() + b"-" +
                 base64.b32encode(distinctive("text " + name, n)).lower())[:n]
        cls.needles[name] = value
        return value

    @classmethod
    def call(cls, fn, request):
        cls.calls += 1
        return fn(request, timeout=T)

    @classmethod
    def expect_error(cls, fn, request):
        cls.calls += 1
        err = harness.rpc_error(fn, request, timeout=T)
        assert err is not None, "expected %s to fail" % type(request).__name__
        cls.errors.append("%s %s" % (err.code(), err.details()))
        return err

    @classmethod
    def items(cls, response):
        for r in response.results:
            if r.status.code != harness.OK:
                cls.errors.append(r.status.message)
        return response.results

    @classmethod
    def drive(cls):
        s, K = cls.server, pb.keys
        ed_id, x_id, xc_id, gcm_id = ("zq-keyid-ed25519", "zq-keyid-x25519", "zq-keyid-xchacha",
                                      "zq-keyid-aesgcm")
        cls.key_ids += [ed_id, x_id, xc_id, gcm_id]

        # --- KeyService, successes and failures that carry secrets in the request.
        ed_seed, x_secret = cls.secret("ed25519 seed"), cls.secret("x25519 secret")
        xc_key, gcm_key = cls.secret("xchacha20 key"), cls.secret("aes-256-gcm key")
        ed = cls.call(s.keys.ImportKey, K.ImportKeyRequest(key_id=ed_id, type=K.KEY_TYPE_ED25519,
                                                           secret=ed_seed))
        xk = cls.call(s.keys.ImportKey, K.ImportKeyRequest(key_id=x_id, type=K.KEY_TYPE_X25519,
                                                           secret=x_secret))
        xc = cls.call(s.keys.ImportKey, K.ImportKeyRequest(
            key_id=xc_id, type=K.KEY_TYPE_XCHACHA20_POLY1305, secret=xc_key))
        cls.call(s.keys.ImportKey, K.ImportKeyRequest(key_id=gcm_id, type=K.KEY_TYPE_AES256_GCM,
                                                      secret=gcm_key))
        cls.expect_error(s.keys.ImportKey, K.ImportKeyRequest(
            key_id="zq-keyid-short", type=K.KEY_TYPE_AES256_GCM,
            secret=cls.secret("short aead key", 31)))
        bad_pair = cls.secret("mismatched seed") + cls.secret("mismatched public half")
        cls.expect_error(s.keys.ImportKey, K.ImportKeyRequest(key_id="zq-keyid-pair",
                                                      type=K.KEY_TYPE_ED25519, secret=bad_pair))
        cls.expect_error(s.keys.ImportKey, K.ImportKeyRequest(key_id=ed_id, type=K.KEY_TYPE_ED25519,
                                                      secret=cls.secret("duplicate seed")))
        cls.call(s.keys.CreateKey, K.CreateKeyRequest(key_id="zq-keyid-created",
                                                      type=K.KEY_TYPE_ED25519))
        cls.call(s.keys.GetKey, K.GetKeyRequest(key_id=ed_id))
        cls.call(s.keys.ListKeys, K.ListKeysRequest())
        cls.expect_error(s.keys.GetKey, K.GetKeyRequest(key_id="zq-keyid-missing"))

        # --- Ed25519.
        msg = cls.text("message one")
        sig = cls.call(s.ed.Sign, pb.ed.SignRequest(key_id=ed_id, message=msg)).signature
        cls.needles["signature one"] = sig
        batch_msgs = [cls.text("batch message %d" % i) for i in range(3)]
        results = cls.items(cls.call(s.ed.BatchSign, pb.ed.BatchSignRequest(items=[
            pb.ed.SignRequest(key_id=ed_id, message=m) for m in batch_msgs] + [
            pb.ed.SignRequest(key_id="zq-keyid-missing", message=cls.text("unsigned"))])))
        for i, r in enumerate(results[:3]):
            cls.needles["batch signature %d" % i] = r.response.signature
        cls.expect_error(s.ed.Sign, pb.ed.SignRequest(key_id=x_id, message=cls.text("wrong type")))
        pk = ed.versions[-1].public_key
        cls.call(s.ed.Verify, pb.ed.VerifyRequest(public_key=pk, message=msg, signature=sig))
        bad_sig = bytes([sig[0] ^ 1]) + sig[1:]
        cls.call(s.ed.Verify, pb.ed.VerifyRequest(public_key=pk, message=msg, signature=bad_sig))
        cls.expect_error(s.ed.Verify, pb.ed.VerifyRequest(public_key=pk[:31], message=msg, signature=sig))
        cls.items(cls.call(s.ed.BatchVerify, pb.ed.BatchVerifyRequest(items=[
            pb.ed.VerifyRequest(public_key=pk, message=msg, signature=sig),
            pb.ed.VerifyRequest(public_key=pk, message=cls.text("forged"), signature=sig),
            pb.ed.VerifyRequest(public_key=pk, message=msg, signature=sig[:63])])))

        # --- X25519.
        peer = nacl.public.PrivateKey(cls.secret("peer secret"))
        peer_pk = peer.public_key.encode()
        shared = cls.call(s.x.Derive, pb.x.DeriveRequest(key_id=x_id, peer_public_key=peer_pk))
        cls.needles["shared key"] = shared.shared_key
        cls.needles["expected shared key"] = nacl.bindings.crypto_scalarmult(
            x_secret, peer_pk)
        cls.needles["box key"] = nacl.bindings.crypto_box_beforenm(peer_pk, x_secret)
        cls.items(cls.call(s.x.BatchDerive, pb.x.BatchDeriveRequest(items=[
            pb.x.DeriveRequest(key_id=x_id, peer_public_key=peer_pk),
            pb.x.DeriveRequest(key_id=x_id, peer_public_key=bytes(32)),     # zero shared secret
            pb.x.DeriveRequest(key_id=x_id, peer_public_key=peer_pk[:31]),
            pb.x.DeriveRequest(key_id=ed_id, peer_public_key=peer_pk)])))
        cls.expect_error(s.x.Derive, pb.x.DeriveRequest(key_id=x_id, key_version=99,
                                                peer_public_key=peer_pk))

        # --- Box.
        box_pt = cls.text("box plaintext")
        sealed = cls.call(s.box.Seal, pb.box.BoxSealRequest(key_id=x_id, peer_public_key=peer_pk,
                                                            plaintext=box_pt))
        cls.call(s.box.Open, pb.box.BoxOpenRequest(key_id=x_id, peer_public_key=peer_pk,
                                                   nonce=sealed.nonce,
                                                   ciphertext=sealed.ciphertext))
        tampered = bytes([sealed.ciphertext[0] ^ 1]) + sealed.ciphertext[1:]
        cls.expect_error(s.box.Open, pb.box.BoxOpenRequest(key_id=x_id, peer_public_key=peer_pk,
                                                   nonce=sealed.nonce, ciphertext=tampered))
        # A box the peer made (PyNaCl), opened by the server.
        peer_nonce = distinctive("box nonce", 24)
        peer_pt = cls.text("peer box plaintext")
        peer_ct = nacl.bindings.crypto_box(peer_pt, peer_nonce, xk.versions[-1].public_key,
                                           peer.encode())
        cls.call(s.box.Open, pb.box.BoxOpenRequest(key_id=x_id, peer_public_key=peer_pk,
                                                   nonce=peer_nonce, ciphertext=peer_ct))
        box_batch = [cls.text("box batch plaintext %d" % i) for i in range(2)]
        seals = cls.items(cls.call(s.box.BatchSeal, pb.box.BatchBoxSealRequest(items=[
            pb.box.BoxSealRequest(key_id=x_id, peer_public_key=peer_pk, plaintext=p)
            for p in box_batch] + [pb.box.BoxSealRequest(key_id=xc_id, peer_public_key=peer_pk,
                                                         plaintext=cls.text("box wrong key"))])))
        cls.items(cls.call(s.box.BatchOpen, pb.box.BatchBoxOpenRequest(items=[
            pb.box.BoxOpenRequest(key_id=x_id, peer_public_key=peer_pk, nonce=r.response.nonce,
                                  ciphertext=r.response.ciphertext) for r in seals[:2]] + [
            pb.box.BoxOpenRequest(key_id=x_id, peer_public_key=peer_pk, nonce=sealed.nonce,
                                  ciphertext=tampered)])))

        # --- AEAD.
        aad = cls.text("associated data", 64)
        pt = cls.text("aead plaintext", 200)
        binary_pt = cls.secret("binary plaintext", 48)
        env = cls.call(s.aead.Seal, pb.aead.AeadSealRequest(key_id=xc_id, plaintext=pt,
                                                            associated_data=aad)).envelope
        cls.call(s.aead.Open, pb.aead.AeadOpenRequest(key_id=xc_id, envelope=env,
                                                      associated_data=aad))
        cls.expect_error(s.aead.Open, pb.aead.AeadOpenRequest(key_id=xc_id, envelope=env,
                                                      associated_data=b"other"))
        cls.expect_error(s.aead.Open, pb.aead.AeadOpenRequest(key_id=xc_id, envelope=env[:20]))
        # Sealed here with the imported key: the server opens what it never saw.
        nonce = distinctive("aead nonce", 24)
        local = (b"\x01" + struct.pack(">I", xc.current_version) + nonce +
                 nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(
                     binary_pt, aad, nonce, xc_key))
        cls.call(s.aead.Open, pb.aead.AeadOpenRequest(key_id=xc_id, envelope=local,
                                                      associated_data=aad))
        gcm_pt = cls.text("gcm plaintext")
        seals = cls.items(cls.call(s.aead.BatchSeal, pb.aead.BatchAeadSealRequest(items=[
            pb.aead.AeadSealRequest(key_id=gcm_id, plaintext=gcm_pt),
            pb.aead.AeadSealRequest(key_id=x_id, plaintext=cls.text("aead wrong type"))])))
        gcm_env = seals[0].response.envelope
        cls.items(cls.call(s.aead.BatchOpen, pb.aead.BatchAeadOpenRequest(items=[
            pb.aead.AeadOpenRequest(key_id=gcm_id, envelope=gcm_env),
            pb.aead.AeadOpenRequest(key_id=gcm_id, envelope=gcm_env[:-1] + b"\x00"),
            pb.aead.AeadOpenRequest(key_id="zq-keyid-missing", envelope=env)])))

        # --- Rotation and deletion (key lifecycle), then use of the old version.
        cls.call(s.keys.RotateKey, K.RotateKeyRequest(key_id=xc_id))
        cls.call(s.aead.Open, pb.aead.AeadOpenRequest(key_id=xc_id, envelope=local,
                                                      associated_data=aad))
        cls.call(s.keys.DeleteKey, K.DeleteKeyRequest(key_id=gcm_id))
        cls.expect_error(s.aead.Open, pb.aead.AeadOpenRequest(key_id=gcm_id, envelope=gcm_env))

    # ---- checks ---------------------------------------------------------------------------------

    def leaks(self, haystack):
        return ["%s (%s)" % (name, form) for name, value in self.needles.items()
                for form, text in forms(value).items() if text in haystack]

    def assert_absent(self, haystack, where):
        self.assertEqual(self.leaks(haystack), [], "found in %s" % where)

    def test_every_call_was_logged(self):
        requests = self.log.count(b'"event":"request"')
        print("  %d calls made, %d request log lines, %d log bytes, %d metrics bytes"
              % (self.calls, requests, len(self.log), len(self.metrics_text)))
        self.assertGreaterEqual(requests, self.calls)

    def test_log_has_no_secrets(self):
        self.assertGreater(len(self.needles), 20)
        self.assert_absent(self.log, "the server's log")

    def test_metrics_have_no_secrets(self):
        self.assert_absent(self.metrics_text, "/metrics")

    def test_metrics_have_no_key_ids(self):
        for key_id in self.key_ids:
            self.assertNotIn(key_id.encode(), self.metrics_text)
        self.assertNotIn(b"zq-", self.metrics_text)

    def test_error_messages_have_no_secrets(self):
        self.assertGreater(len(self.errors), 10)
        self.assert_absent("\n".join(self.errors).encode(), "error messages sent to the client")

    def test_the_search_would_find_a_leak(self):
        # Each value, embedded in a longer byte string at every alignment and encoded as a
        # careless log line would, is found.
        for name, value in self.needles.items():
            for prefix in (b"", b"\x00", b"\x00\x01"):
                data = prefix + value + b"tail"
                for enc in (bytes.hex, lambda b: b.hex().upper(), base64.b64encode,
                            base64.urlsafe_b64encode):
                    line = b'{"event":"oops","v":"' + bytes(enc(data), "ascii") \
                        if isinstance(enc(data), str) else b'{"v":"' + enc(data)
                    with self.subTest(needle=name, prefix=len(prefix)):
                        self.assertTrue(self.leaks(line), line)


if __name__ == "__main__":
    unittest.main()
