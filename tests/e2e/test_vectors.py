"""Every shared test vector through the gRPC API of a real server, once per crypto backend.

Three servers run: the default (--backend unset, i.e. auto), --backend=libsodium and
--backend=openssl. Each one gets the same cases: Ed25519 (Wycheproof, RFC 8032, speccheck),
X25519 (Wycheproof, RFC 7748), the NaCl box known answer, and the Wycheproof AEAD files.

    OFFLOAD_SERVER=build/bin/offload_server /usr/bin/python3 -m unittest -v tests/e2e/test_vectors.py
Set OFFLOAD_E2E_SLOW=1 to add the RFC 7748 1,000-iteration X25519 test.
"""

import base64
import os
import struct
import unittest

import grpc

from harness import (INVALID_ARGUMENT, OK, Server, ServerTestCase, h, load_json, pb)

SLOW = os.environ.get("OFFLOAD_E2E_SLOW") == "1"
TIMEOUT = 120


def say(backend, text):
    print("[%s] %s" % (backend, text), flush=True)


def _rotl(v, c):
    return ((v << c) & 0xffffffff) | (v >> (32 - c))


def hsalsa20(key, nonce16=bytes(16)):
    """HSalsa20 (the core behind crypto_box_beforenm), used to check BOX_BEFORENM of zero secrets."""
    k = struct.unpack("<8I", key)
    n = struct.unpack("<4I", nonce16)
    x = [0x61707865, k[0], k[1], k[2], k[3], 0x3320646e, n[0], n[1], n[2], n[3],
         0x79622d32, k[4], k[5], k[6], k[7], 0x6b206574]

    def qr(a, b, c, d):
        x[b] ^= _rotl((x[a] + x[d]) & 0xffffffff, 7)
        x[c] ^= _rotl((x[b] + x[a]) & 0xffffffff, 9)
        x[d] ^= _rotl((x[c] + x[b]) & 0xffffffff, 13)
        x[a] ^= _rotl((x[d] + x[c]) & 0xffffffff, 18)

    for _ in range(10):
        qr(0, 4, 8, 12); qr(5, 9, 13, 1); qr(10, 14, 2, 6); qr(15, 3, 7, 11)
        qr(0, 1, 2, 3); qr(5, 6, 7, 4); qr(10, 11, 8, 9); qr(15, 12, 13, 14)
    return struct.pack("<8I", *(x[i] for i in (0, 5, 10, 15, 6, 7, 8, 9)))


class VectorTests:
    """The cases; mixed into one TestCase per backend below."""

    BACKEND = None  # None: no --backend flag (the default, auto)

    @classmethod
    def setUpClass(cls):
        cls.name = cls.BACKEND or "auto"
        cls.server = Server("vectors-" + cls.name, backend=cls.BACKEND)
        cls.servers = [cls.server]
        cls.imported_secrets = []
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def say(self, text):
        say(self.name, text)

    # -- helpers --------------------------------------------------------------------------

    def import_key(self, key_id, key_type, secret, allow_zero=False):
        req = pb.keys.ImportKeyRequest(key_id=key_id, type=key_type, secret=secret)
        if allow_zero:
            req.options.allow_zero_shared_secret = True
        self.imported_secrets.append(secret)
        info = self.server.keys.ImportKey(req, timeout=TIMEOUT)
        self.assertEqual(info.key_id, key_id)
        self.assertEqual(info.type, key_type)
        self.assertEqual(info.current_version, 1)
        self.assertEqual([v.version for v in info.versions], [1])
        return info

    def check_no_problems(self, problems, total, what):
        shown = "\n  ".join(problems[:40])
        self.assertEqual(len(problems), 0, "%s: %d of %d cases wrong:\n  %s"
                         % (what, len(problems), total, shown))

    # -- Ed25519 --------------------------------------------------------------------------

    def test_ed25519_wycheproof(self):
        data = load_json("wycheproof", "ed25519_test.json")
        cases = []
        for g in data["testGroups"]:
            pk = h(g["publicKey"]["pk"])
            for t in g["tests"]:
                cases.append((t["tcId"], pk, h(t["msg"]), h(t["sig"]), t["result"]))
        self.assertEqual(len(cases), data["numberOfTests"])
        self.assertTrue(all(c[4] in ("valid", "invalid") for c in cases))

        def expect(case, code, valid, message, path):
            tc, pk, msg, sig, result = case
            if len(pk) != 32 or len(sig) != 64:
                field, want, got = (("public_key", 32, len(pk)) if len(pk) != 32
                                    else ("signature", 64, len(sig)))
                if code != INVALID_ARGUMENT:
                    return "tcId %d (%s, %s %d bytes): expected INVALID_ARGUMENT, got code %s valid=%s" % (
                        tc, path, field, got, code, valid)
                if field not in message or "expected %d bytes, got %d" % (want, got) not in message:
                    return "tcId %d (%s): message %r lacks %r / 'expected %d bytes, got %d'" % (
                        tc, path, message, field, want, got)
                return None
            if code != OK:
                return "tcId %d (%s): expected OK, got code %s (%s)" % (tc, path, code, message)
            if valid != (result == "valid"):
                return "tcId %d (%s): label %s, server said valid=%s" % (tc, path, result, valid)
            return None

        problems = []
        req = pb.ed.BatchVerifyRequest(items=[
            pb.ed.VerifyRequest(public_key=pk, message=m, signature=s) for _, pk, m, s, _ in cases])
        memo_hits = []
        for path in ("BatchVerify", "BatchVerify repeat"):
            resp = self.server.ed.BatchVerify(req, timeout=TIMEOUT)
            self.assertEqual(len(resp.results), len(cases), path)
            memo_hits.append(sum(r.memo_hit for r in resp.results))
            for case, r in zip(cases, resp.results):
                p = expect(case, r.status.code, r.valid, r.status.message, path)
                if p:
                    problems.append(p)
                if case[4] != "valid" and r.memo_hit:
                    problems.append("tcId %d (%s): memo_hit on a signature that is not valid"
                                    % (case[0], path))
        for case in cases:
            tc, pk, msg, sig, result = case
            try:
                resp = self.server.ed.Verify(
                    pb.ed.VerifyRequest(public_key=pk, message=msg, signature=sig), timeout=TIMEOUT)
                p = expect(case, OK, resp.valid, "", "Verify")
            except grpc.RpcError as e:
                code = e.code().value[0]
                p = expect(case, code, None, e.details() or "", "Verify")
            if p:
                problems.append(p)
        n_valid = sum(c[4] == "valid" for c in cases)
        n_size = sum(len(c[3]) != 64 for c in cases)
        self.say("ed25519_test.json: %d cases x (BatchVerify, BatchVerify repeat, Verify): %d valid, "
                 "%d invalid of which %d wrong-size signatures; memo hits first/repeat batch: %d/%d"
                 % (len(cases), n_valid, len(cases) - n_valid, n_size, memo_hits[0], memo_hits[1]))
        self.check_no_problems(problems, len(cases), "ed25519 Wycheproof")

    def test_ed25519_rfc8032(self):
        tests = load_json("rfc_vectors.json")["ed25519"]["tests"]
        for i, t in enumerate(tests):
            with self.subTest(name=t["name"]):
                seed, pk, msg, sig = h(t["secret_key"]), h(t["public_key"]), h(t["message"]), h(t["signature"])
                self.assertEqual(len(msg), t["message_length"])
                for form, secret in (("seed", seed), ("seed||pk", seed + pk)):
                    key_id = "ed-rfc-%d-%s" % (i, "32" if form == "seed" else "64")
                    info = self.import_key(key_id, pb.keys.KEY_TYPE_ED25519, secret)
                    self.assertEqual(info.versions[0].public_key, pk, "public key from %s" % form)
                    resp = self.server.ed.Sign(pb.ed.SignRequest(key_id=key_id, message=msg),
                                               timeout=TIMEOUT)
                    self.assertEqual(resp.signature.hex(), sig.hex(), "Sign with %s" % form)
                    self.assertEqual(resp.key_version, 1)
                    self.assertEqual(resp.public_key, pk)
                ok = self.server.ed.Verify(pb.ed.VerifyRequest(public_key=pk, message=msg, signature=sig),
                                           timeout=TIMEOUT)
                self.assertTrue(ok.valid)
                bad_r = bytes([sig[0] ^ 1]) + sig[1:]
                bad_s = sig[:40] + bytes([sig[40] ^ 1]) + sig[41:]
                bad_m = msg + b"x"
                batch = self.server.ed.BatchVerify(pb.ed.BatchVerifyRequest(items=[
                    pb.ed.VerifyRequest(public_key=pk, message=msg, signature=sig),
                    pb.ed.VerifyRequest(public_key=pk, message=msg, signature=bad_r),
                    pb.ed.VerifyRequest(public_key=pk, message=msg, signature=bad_s),
                    pb.ed.VerifyRequest(public_key=pk, message=bad_m, signature=sig),
                ]), timeout=TIMEOUT)
                self.assertEqual([(r.status.code, r.valid) for r in batch.results],
                                 [(0, True), (0, False), (0, False), (0, False)])
        self.say("rfc_vectors.json ed25519: %d vectors (import seed and seed||pk, Sign exact, Verify, "
                 "3 tampered)" % len(tests))

    def test_ed25519_speccheck(self):
        cases = load_json("ed25519_speccheck_cases.json")
        self.assertEqual(len(cases), 12)
        items = [pb.ed.VerifyRequest(public_key=h(c["pub_key"]), message=h(c["message"]),
                                     signature=h(c["signature"])) for c in cases]
        expected = [i == 3 for i in range(len(cases))]
        answers = {}
        answers["Verify"] = [self.server.ed.Verify(it, timeout=TIMEOUT).valid for it in items]
        for path in ("BatchVerify", "BatchVerify repeat"):
            resp = self.server.ed.BatchVerify(pb.ed.BatchVerifyRequest(items=items), timeout=TIMEOUT)
            self.assertTrue(all(r.status.code == OK for r in resp.results),
                            [(r.status.code, r.status.message) for r in resp.results])
            answers[path] = [r.valid for r in resp.results]
        answers["Verify after batches"] = [self.server.ed.Verify(it, timeout=TIMEOUT).valid
                                           for it in items]
        # Each case alone in a batch too, and reversed order, so no path depends on neighbours.
        answers["BatchVerify reversed"] = [r.valid for r in reversed(self.server.ed.BatchVerify(
            pb.ed.BatchVerifyRequest(items=list(reversed(items))), timeout=TIMEOUT).results)]
        for path, got in answers.items():
            accepted = [i for i, v in enumerate(got) if v]
            self.assertEqual(got, expected, "%s accepted cases %s; policy accepts only case 3"
                             % (path, accepted))
        self.say("ed25519_speccheck_cases.json: 12 cases x %d paths, only case 3 accepted"
                 % len(answers))

    # -- X25519 ---------------------------------------------------------------------------

    def test_x25519_wycheproof(self):
        data = load_json("wycheproof", "x25519_test.json")
        cases = [t for g in data["testGroups"] for t in g["tests"]]
        self.assertEqual(len(cases), data["numberOfTests"])
        zero = bytes(32)
        key_of = {}
        for t in cases:
            if t["private"] not in key_of:
                key_of[t["private"]] = "xw-%d" % len(key_of)
                self.import_key(key_of[t["private"]], pb.keys.KEY_TYPE_X25519, h(t["private"]))

        def expect(t, code, shared, message, path):
            want = h(t["shared"])
            if want == zero:
                # Only 'acceptable' ZeroSharedSecret cases have an all-zero output; refused by default.
                if t["result"] != "acceptable" or "ZeroSharedSecret" not in t["flags"]:
                    return "tcId %d: unexpected zero-output case %s" % (t["tcId"], t["result"])
                if code != INVALID_ARGUMENT or "small-order" not in message:
                    return ("tcId %d (%s, ZeroSharedSecret): expected INVALID_ARGUMENT "
                            "'small-order peer public key', got code %s %r shared=%s"
                            % (t["tcId"], path, code, message, shared.hex() if shared else None))
                return None
            if code != OK:
                return "tcId %d (%s, %s %s): expected OK, got code %s (%s)" % (
                    t["tcId"], path, t["result"], t["flags"], code, message)
            if shared != want:
                return "tcId %d (%s, %s %s): shared %s, expected %s" % (
                    t["tcId"], path, t["result"], t["flags"], shared.hex(), want.hex())
            return None

        problems = []
        items = [pb.x.DeriveRequest(key_id=key_of[t["private"]], peer_public_key=h(t["public"]),
                                    output=pb.x.DERIVE_OUTPUT_RAW) for t in cases]
        for path in ("BatchDerive", "BatchDerive repeat"):
            resp = self.server.x.BatchDerive(pb.x.BatchDeriveRequest(items=items), timeout=TIMEOUT)
            self.assertEqual(len(resp.results), len(cases))
            for t, r in zip(cases, resp.results):
                p = expect(t, r.status.code, r.response.shared_key, r.status.message, path)
                if not p and r.status.code == OK and r.response.key_version != 1:
                    p = "tcId %d: key_version %d" % (t["tcId"], r.response.key_version)
                if p:
                    problems.append(p)
        for t, item in zip(cases, items):
            # Output left UNSPECIFIED on the single path: it must mean RAW.
            single = pb.x.DeriveRequest(key_id=item.key_id, peer_public_key=item.peer_public_key)
            try:
                r = self.server.x.Derive(single, timeout=TIMEOUT)
                p = expect(t, OK, r.shared_key, "", "Derive")
            except grpc.RpcError as e:
                p = expect(t, e.code().value[0], None, e.details() or "", "Derive")
            if p:
                problems.append(p)

        # The compatibility option: the same private keys imported with allow_zero_shared_secret.
        zero_cases = [t for t in cases if h(t["shared"]) == zero]
        compat_of = {}
        for t in zero_cases:
            if t["private"] not in compat_of:
                compat_of[t["private"]] = "xwz-%d" % len(compat_of)
                info = self.import_key(compat_of[t["private"]], pb.keys.KEY_TYPE_X25519,
                                       h(t["private"]), allow_zero=True)
                self.assertTrue(info.options.allow_zero_shared_secret)
        zero_box_key = hsalsa20(zero)
        for t in zero_cases:
            for output, want in ((pb.x.DERIVE_OUTPUT_RAW, zero),
                                 (pb.x.DERIVE_OUTPUT_BOX_BEFORENM, zero_box_key)):
                req = pb.x.DeriveRequest(key_id=compat_of[t["private"]],
                                         peer_public_key=h(t["public"]), output=output)
                try:
                    got = self.server.x.Derive(req, timeout=TIMEOUT).shared_key
                    if got != want:
                        problems.append("tcId %d allow_zero output %d: got %s, expected %s"
                                        % (t["tcId"], output, got.hex(), want.hex()))
                except grpc.RpcError as e:
                    problems.append("tcId %d allow_zero output %d: %s %s"
                                    % (t["tcId"], output, e.code(), e.details()))
        resp = self.server.x.BatchDerive(pb.x.BatchDeriveRequest(items=[
            pb.x.DeriveRequest(key_id=compat_of[t["private"]], peer_public_key=h(t["public"]))
            for t in zero_cases]), timeout=TIMEOUT)
        for t, r in zip(zero_cases, resp.results):
            if r.status.code != OK or r.response.shared_key != zero:
                problems.append("tcId %d allow_zero BatchDerive: code %d %r shared %s" % (
                    t["tcId"], r.status.code, r.status.message, r.response.shared_key.hex()))

        counts = {}
        for t in cases:
            counts[t["result"]] = counts.get(t["result"], 0) + 1
        self.say("x25519_test.json: %d cases (%s) x (BatchDerive, repeat, Derive) with %d imported "
                 "keys; %d ZeroSharedSecret refused by default and returning zeros (RAW and "
                 "BOX_BEFORENM) with allow_zero_shared_secret"
                 % (len(cases), ", ".join("%d %s" % (v, k) for k, v in sorted(counts.items())),
                    len(key_of), len(zero_cases)))
        self.check_no_problems(problems, len(cases), "x25519 Wycheproof")

    def test_x25519_rfc7748(self):
        x = load_json("rfc_vectors.json")["x25519"]
        for i, t in enumerate(x["scalar_mult"]["tests"]):
            with self.subTest(name=t["name"]):
                key_id = "x-rfc-%d" % i
                self.import_key(key_id, pb.keys.KEY_TYPE_X25519, h(t["scalar"]))
                got = self.server.x.Derive(pb.x.DeriveRequest(
                    key_id=key_id, peer_public_key=h(t["u_coordinate"]),
                    output=pb.x.DERIVE_OUTPUT_RAW), timeout=TIMEOUT)
                self.assertEqual(got.shared_key.hex(), t["output"])
                self.assertEqual(got.key_version, 1)

        it = x["iterated"]
        want = {r["iterations"]: r["k"] for r in it["results"]}
        limit = 1000 if SLOW else 1
        k, u = h(it["initial_k"]), h(it["initial_u"])
        for n in range(1, limit + 1):
            key_id = "x-iter-%d" % n
            self.import_key(key_id, pb.keys.KEY_TYPE_X25519, k)
            r = self.server.x.Derive(pb.x.DeriveRequest(key_id=key_id, peer_public_key=u),
                                     timeout=TIMEOUT).shared_key
            self.server.keys.DeleteKey(pb.keys.DeleteKeyRequest(key_id=key_id), timeout=TIMEOUT)
            k, u = r, k
            if n in want:
                self.assertEqual(k.hex(), want[n], "iterated X25519 after %d iterations" % n)

        dh = x["diffie_hellman"]
        alice = self.import_key("x-rfc-alice", pb.keys.KEY_TYPE_X25519, h(dh["alice_private"]))
        bob = self.import_key("x-rfc-bob", pb.keys.KEY_TYPE_X25519, h(dh["bob_private"]))
        self.assertEqual(alice.versions[0].public_key.hex(), dh["alice_public"])
        self.assertEqual(bob.versions[0].public_key.hex(), dh["bob_public"])
        for key_id, peer in (("x-rfc-alice", dh["bob_public"]), ("x-rfc-bob", dh["alice_public"])):
            got = self.server.x.Derive(pb.x.DeriveRequest(key_id=key_id, peer_public_key=h(peer)),
                                       timeout=TIMEOUT)
            self.assertEqual(got.shared_key.hex(), dh["shared_secret"], key_id)
            # key_version 1 named explicitly gives the same answer.
            got = self.server.x.Derive(pb.x.DeriveRequest(key_id=key_id, key_version=1,
                                                          peer_public_key=h(peer)), timeout=TIMEOUT)
            self.assertEqual(got.shared_key.hex(), dh["shared_secret"], key_id)
        self.say("rfc_vectors.json x25519: %d scalar_mult, iterated up to %d, Alice/Bob DH both ways"
                 % (len(x["scalar_mult"]["tests"]), limit))

    # -- NaCl box -------------------------------------------------------------------------

    def test_nacl_box(self):
        data = load_json("nacl_box_vectors.json")
        self.assertEqual(hsalsa20(h(data["tests"][0]["x25519_shared_secret"])).hex(),
                         data["tests"][0]["beforenm_shared_key"], "self-check of hsalsa20()")
        for i, t in enumerate(data["tests"]):
            with self.subTest(name=t["name"]):
                a, b = "box-alice-%d" % i, "box-bob-%d" % i
                ai = self.import_key(a, pb.keys.KEY_TYPE_X25519, h(t["alice_secret_key"]))
                bi = self.import_key(b, pb.keys.KEY_TYPE_X25519, h(t["bob_secret_key"]))
                self.assertEqual(ai.versions[0].public_key.hex(), t["alice_public_key"])
                self.assertEqual(bi.versions[0].public_key.hex(), t["bob_public_key"])
                for me, peer in ((b, t["alice_public_key"]), (a, t["bob_public_key"])):
                    d = self.server.x.Derive(pb.x.DeriveRequest(
                        key_id=me, peer_public_key=h(peer), output=pb.x.DERIVE_OUTPUT_BOX_BEFORENM),
                        timeout=TIMEOUT)
                    self.assertEqual(d.shared_key.hex(), t["beforenm_shared_key"], me)
                    d = self.server.x.Derive(pb.x.DeriveRequest(
                        key_id=me, peer_public_key=h(peer), output=pb.x.DERIVE_OUTPUT_RAW),
                        timeout=TIMEOUT)
                    self.assertEqual(d.shared_key.hex(), t["x25519_shared_secret"], me)
                seal = pb.box.BoxSealRequest(key_id=a, peer_public_key=h(t["bob_public_key"]),
                                             nonce=h(t["nonce"]), plaintext=h(t["plaintext"]))
                sealed = self.server.box.Seal(seal, timeout=TIMEOUT)
                self.assertEqual(sealed.ciphertext.hex(), t["ciphertext_combined"])
                self.assertEqual(sealed.ciphertext[:16].hex(), t["mac"])
                self.assertEqual(sealed.nonce.hex(), t["nonce"])
                self.assertEqual(sealed.key_version, 1)
                batch = self.server.box.BatchSeal(pb.box.BatchBoxSealRequest(items=[seal]),
                                                  timeout=TIMEOUT)
                self.assertEqual(batch.results[0].status.code, OK)
                self.assertEqual(batch.results[0].response.ciphertext.hex(), t["ciphertext_combined"])

                opens = [pb.box.BoxOpenRequest(key_id=b, peer_public_key=h(t["alice_public_key"]),
                                               nonce=h(t["nonce"]), ciphertext=h(t["ciphertext_combined"])),
                         # Alice can open what she sent (the box key is symmetric).
                         pb.box.BoxOpenRequest(key_id=a, key_version=1,
                                               peer_public_key=h(t["bob_public_key"]),
                                               nonce=h(t["nonce"]), ciphertext=h(t["ciphertext_combined"]))]
                for req in opens:
                    got = self.server.box.Open(req, timeout=TIMEOUT)
                    self.assertEqual(got.plaintext.hex(), t["plaintext"], req.key_id)
                tampered = bytearray(h(t["ciphertext_combined"]))
                tampered[-1] ^= 1
                bad = pb.box.BoxOpenRequest(key_id=b, peer_public_key=h(t["alice_public_key"]),
                                            nonce=h(t["nonce"]), ciphertext=bytes(tampered))
                self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.server.box.Open, bad,
                                    timeout=TIMEOUT, contains="authentication failed")
                batch = self.server.box.BatchOpen(pb.box.BatchBoxOpenRequest(items=opens + [bad]),
                                                  timeout=TIMEOUT)
                self.assertEqual([r.status.code for r in batch.results], [OK, OK, INVALID_ARGUMENT])
                self.assertEqual(batch.results[0].response.plaintext.hex(), t["plaintext"])
                self.assertEqual(batch.results[1].response.plaintext.hex(), t["plaintext"])
        self.say("nacl_box_vectors.json: %d vector(s): beforenm and raw both ways, Seal/BatchSeal "
                 "exact, Open/BatchOpen by both parties, tampered refused" % len(data["tests"]))

    # -- AEAD -----------------------------------------------------------------------------

    def run_aead_file(self, filename, key_type, nonce_len, iv_bits_supported):
        data = load_json("wycheproof", filename)
        skipped = {}
        cases = []  # (test, key id, envelope)
        key_of = {}
        for g in data["testGroups"]:
            for t in g["tests"]:
                reason = None
                if g["keySize"] != 256:
                    reason = "keySize %d" % g["keySize"]
                elif g["tagSize"] != 128:
                    reason = "tagSize %d" % g["tagSize"]
                elif iv_bits_supported is not None and g["ivSize"] != iv_bits_supported:
                    reason = "ivSize %d" % g["ivSize"]
                elif t["result"] not in ("valid", "invalid"):
                    reason = "result %s" % t["result"]
                if reason:
                    skipped[reason] = skipped.get(reason, 0) + 1
                    continue
                if t["key"] not in key_of:
                    key_id = "%s-%d" % (filename.split("_test")[0].replace("_", "-"), len(key_of))
                    info = self.import_key(key_id, key_type, h(t["key"]))
                    self.assertEqual(info.versions[0].public_key, b"", "AEAD keys have no public key")
                    key_of[t["key"]] = (key_id, info.current_version)
                key_id, version = key_of[t["key"]]
                envelope = (b"\x01" + struct.pack(">I", version) + h(t["iv"]) + h(t["ct"])
                            + h(t["tag"]))
                cases.append((t, key_id, envelope))
        total = sum(len(g["tests"]) for g in data["testGroups"])
        self.assertEqual(total, data["numberOfTests"])

        def expect(t, code, plaintext, version, message, path):
            if t["result"] == "valid":
                if code != OK:
                    return "tcId %d (%s, valid %s): code %s (%s)" % (t["tcId"], path, t["flags"],
                                                                   code, message)
                if plaintext != h(t["msg"]):
                    return "tcId %d (%s): wrong plaintext" % (t["tcId"], path)
                if version != 1:
                    return "tcId %d (%s): key_version %s" % (t["tcId"], path, version)
                return None
            if code != INVALID_ARGUMENT:
                return "tcId %d (%s, invalid %s): expected INVALID_ARGUMENT, got code %s" % (
                    t["tcId"], path, t["flags"], code)
            return None

        problems = []
        items = [pb.aead.AeadOpenRequest(key_id=k, envelope=e, associated_data=h(t["aad"]))
                 for t, k, e in cases]
        for path in ("BatchOpen", "BatchOpen repeat"):
            for start in range(0, len(items), 200):
                chunk = items[start:start + 200]
                resp = self.server.aead.BatchOpen(pb.aead.BatchAeadOpenRequest(items=chunk),
                                                  timeout=TIMEOUT)
                self.assertEqual(len(resp.results), len(chunk))
                for (t, _, _), r in zip(cases[start:start + 200], resp.results):
                    p = expect(t, r.status.code, r.response.plaintext, r.response.key_version,
                               r.status.message, path)
                    if p:
                        problems.append(p)
                    if t["result"] != "valid" and r.response.memo_hit:
                        problems.append("tcId %d (%s): memo_hit on a failed open" % (t["tcId"], path))
        singles = 0
        for i, ((t, _, _), item) in enumerate(zip(cases, items)):
            if i % 3 and "InvalidNonceSize" not in t["flags"] and t["result"] == "valid":
                continue
            singles += 1
            try:
                r = self.server.aead.Open(item, timeout=TIMEOUT)
                p = expect(t, OK, r.plaintext, r.key_version, "", "Open")
            except grpc.RpcError as e:
                p = expect(t, e.code().value[0], None, None, e.details(), "Open")
            if p:
                problems.append(p)

        n_valid = sum(t["result"] == "valid" for t, _, _ in cases)
        n_nonce = sum("InvalidNonceSize" in t["flags"] for t, _, _ in cases)
        self.say("%s: %d of %d cases run (%d valid, %d invalid, of which %d InvalidNonceSize expected "
                 "INVALID_ARGUMENT by envelope layout) via BatchOpen x2 and %d single Opens, %d keys; "
                 "skipped %d (%s)"
                 % (filename, len(cases), total, n_valid, len(cases) - n_valid, n_nonce, singles,
                    len(key_of), sum(skipped.values()),
                    ", ".join("%s: %d" % kv for kv in sorted(skipped.items())) or "none"))
        self.check_no_problems(problems, len(cases), filename)
        return len(cases)

    def test_aead_chacha20_poly1305(self):
        self.run_aead_file("chacha20_poly1305_test.json", pb.keys.KEY_TYPE_CHACHA20_POLY1305, 12, None)

    def test_aead_xchacha20_poly1305(self):
        self.run_aead_file("xchacha20_poly1305_test.json", pb.keys.KEY_TYPE_XCHACHA20_POLY1305, 24,
                           None)

    def test_aead_aes_gcm(self):
        n = self.run_aead_file("aes_gcm_test.json", pb.keys.KEY_TYPE_AES256_GCM, 12, 96)
        self.assertEqual(n, 66)

    def test_zz_no_secret_in_log(self):
        """Runs last: no imported secret appears in the server's log, in hex or base64."""
        log = "\n".join(self.server.log_lines()[1:])  # [0] is our command line (no secrets)
        leaks = []
        for secret in self.imported_secrets:
            if len(set(secret)) < 8:  # low-entropy test keys could match by accident
                continue
            for form in (secret.hex(), secret.hex().upper(), base64.b64encode(secret).decode()[:40]):
                if form in log:
                    leaks.append(form)
        self.say("server log: %d lines checked for %d imported secrets"
                 % (log.count("\n") + 1, len(self.imported_secrets)))
        self.assertEqual(leaks, [], "secrets found in the server log")

    def test_zz_secrets_encrypted_at_rest(self):
        """Runs last: no imported secret is stored in clear (raw or hex) under --data_dir."""
        blobs = {}
        for root, _, files in os.walk(self.server.data_dir):
            for f in files:
                with open(os.path.join(root, f), "rb") as fh:
                    blobs[os.path.relpath(os.path.join(root, f), self.server.data_dir)] = fh.read()
        self.assertTrue(blobs, "nothing stored under --data_dir")
        found = []
        for secret in self.imported_secrets:
            if len(set(secret)) < 8:
                continue
            for name, data in blobs.items():
                if secret in data or secret.hex().encode() in data.lower():
                    found.append("%s in %s" % (secret.hex()[:16], name))
        self.say("data_dir: %d file(s), %d bytes checked for %d imported secrets"
                 % (len(blobs), sum(map(len, blobs.values())), len(self.imported_secrets)))
        self.assertEqual(found, [], "secrets stored in clear")


class AutoBackend(VectorTests, ServerTestCase):
    BACKEND = None


class LibsodiumBackend(VectorTests, ServerTestCase):
    BACKEND = "libsodium"


class OpensslBackend(VectorTests, ServerTestCase):
    BACKEND = "openssl"


if __name__ == "__main__":
    unittest.main(verbosity=2)
