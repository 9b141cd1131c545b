"""Crash recovery: a key mutation the server acknowledged survives SIGKILL.

Each round starts the server on the same data folder and key-encryption key, checks everything
acknowledged so far, then lets several client threads create (and sometimes rotate or delete)
keys until the server is SIGKILLed at a random moment. After each restart:
  - every acknowledged key is listed by ListKeys and GetKey, with every acknowledged version and
    its original public key; acknowledged deletions stay deleted;
  - the key material is the same: Ed25519 signatures made before the crash are reproduced exactly,
    X25519 derivations give the same secret, AEAD envelopes sealed before the crash open;
  - keys whose creation was in flight at the kill may or may not exist, but if they do, they work;
  - no other key appears.

    OFFLOAD_SERVER=build/bin/offload_server /usr/bin/python3 -m unittest -v tests/e2e/test_crash_recovery.py
OFFLOAD_E2E_SEED (default 20240607) fixes the random choices; OFFLOAD_E2E_CRASH_ROUNDS (default 5).
"""

import os
import random
import threading
import time
import unittest

import grpc

import harness
from harness import Server, ServerTestCase, pb

SEED = int(os.environ.get("OFFLOAD_E2E_SEED", "20240607"))
ROUNDS = int(os.environ.get("OFFLOAD_E2E_CRASH_ROUNDS", "5"))
THREADS = 6
T = 10

ED, X = pb.keys.KEY_TYPE_ED25519, pb.keys.KEY_TYPE_X25519
AEAD = (pb.keys.KEY_TYPE_CHACHA20_POLY1305, pb.keys.KEY_TYPE_XCHACHA20_POLY1305,
        pb.keys.KEY_TYPE_AES256_GCM)
TYPES = (ED, X) + AEAD


def summary(info):
    return (info.key_id, info.type, info.current_version,
            [(v.version, v.public_key, v.created_unix_seconds) for v in info.versions],
            info.options.allow_zero_shared_secret)


class Record:
    """What the client knows about one key from acknowledged calls."""

    def __init__(self, key_id, key_type):
        self.key_id = key_id
        self.type = key_type
        self.versions = {}      # acknowledged version -> public key
        self.proofs = []        # (kind, version, data...) made with the key before a crash
        self.deleted = False    # DeleteKey acknowledged
        self.uncertain = False  # a rotate/delete was in flight at the kill

    def adopt(self, info):
        """Takes the server's view after a restart (it was checked against ours first)."""
        self.versions = {v.version: v.public_key for v in info.versions}
        self.uncertain = False


class CrashRecoveryTest(ServerTestCase):

    def setUp(self):
        print("crash recovery: OFFLOAD_E2E_SEED=%d rounds=%d threads=%d" % (SEED, ROUNDS, THREADS),
              flush=True)
        self.rng = random.Random(SEED)
        kek = "%064x" % self.rng.getrandbits(256)
        self.server = Server("crash", kek_hex=kek, args=["--key_deletion_wait=0"])
        self.servers = [self.server]
        self.records = {}       # key id -> Record (acknowledged creations)
        self.attempted = set()  # every id a CreateKey was sent for
        self.lock = threading.Lock()

    def tearDown(self):
        self.server.kill()

    # -- writers --------------------------------------------------------------------------

    def writer(self, t, round_, stop, acks):
        rng = random.Random(SEED * 1000 + round_ * 100 + t)
        s = self.server
        stubs = s.stubs_on(s.channel)
        mine = []
        n = 0
        try:
            while not stop.is_set():
                roll = rng.random()
                live = [r for r in mine if not r.deleted]
                if roll < 0.15 and live:
                    rec = rng.choice(live)
                    rec.uncertain = True
                    info = stubs.keys.RotateKey(pb.keys.RotateKeyRequest(key_id=rec.key_id), timeout=T)
                    with self.lock:
                        for v in info.versions:
                            if v.version in rec.versions:
                                assert rec.versions[v.version] == v.public_key
                        rec.versions[info.current_version] = info.versions[-1].public_key
                        rec.uncertain = False
                        acks[0] += 1
                    self.prove(stubs, rec)
                    continue
                if roll < 0.22 and live:
                    rec = rng.choice(live)
                    rec.uncertain = True
                    stubs.keys.DeleteKey(pb.keys.DeleteKeyRequest(key_id=rec.key_id), timeout=T)
                    with self.lock:
                        rec.deleted = True
                        rec.uncertain = False
                        acks[0] += 1
                    continue
                key_id = "r%d-t%d-%d" % (round_, t, n)
                n += 1
                key_type = rng.choice(TYPES)
                with self.lock:
                    self.attempted.add(key_id)
                info = stubs.keys.CreateKey(pb.keys.CreateKeyRequest(key_id=key_id, type=key_type),
                                            timeout=T)
                rec = Record(key_id, key_type)
                rec.versions[1] = info.versions[0].public_key
                with self.lock:
                    self.records[key_id] = rec
                    acks[0] += 1
                mine.append(rec)
                self.prove(stubs, rec)
        except grpc.RpcError as e:
            # The kill: the call fails as the connection drops (or as the channel is closed).
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                                grpc.StatusCode.DEADLINE_EXCEEDED):
                self.writer_errors.append("thread %d: %s %s" % (t, e.code(), e.details()))
        except ValueError as e:
            if "closed channel" not in str(e):  # a call started after kill() closed the channel
                self.writer_errors.append("thread %d: %r" % (t, e))
        except Exception as e:  # an assertion about an answer
            self.writer_errors.append("thread %d: %r" % (t, e))

    def prove(self, stubs, rec):
        """Uses the key once and remembers the result, to check the material after restart."""
        version = max(rec.versions)
        msg = b"proof %s v%d" % (rec.key_id.encode(), version)
        if rec.type == ED:
            sig = stubs.ed.Sign(pb.ed.SignRequest(key_id=rec.key_id, message=msg), timeout=T)
            assert sig.key_version == version, (sig.key_version, version)
            rec.proofs.append(("sig", version, msg, sig.signature))
        elif rec.type == X:
            d = stubs.x.Derive(pb.x.DeriveRequest(key_id=rec.key_id, peer_public_key=self.anchor_pk),
                               timeout=T)
            assert d.key_version == version
            rec.proofs.append(("derive", version, d.shared_key))
        else:
            env = stubs.aead.Seal(pb.aead.AeadSealRequest(key_id=rec.key_id, plaintext=msg,
                                                          associated_data=b"ad"), timeout=T)
            assert env.key_version == version
            rec.proofs.append(("envelope", version, msg, env.envelope))

    # -- checks after a restart -----------------------------------------------------------

    def check_works(self, s, rec, info):
        key_id = rec.key_id
        current = info.current_version
        pks = {v.version: v.public_key for v in info.versions}
        for proof in rec.proofs:
            kind, version = proof[0], proof[1]
            if kind == "sig":
                _, _, msg, sig = proof
                if version == current:
                    again = s.ed.Sign(pb.ed.SignRequest(key_id=key_id, message=msg), timeout=T)
                    self.assertEqual(again.signature, sig, "%s: signature changed after restart" % key_id)
                self.assertTrue(s.ed.Verify(pb.ed.VerifyRequest(
                    public_key=pks[version], message=msg, signature=sig), timeout=T).valid, key_id)
            elif kind == "derive":
                _, _, shared = proof
                d = s.x.Derive(pb.x.DeriveRequest(key_id=key_id, key_version=version,
                                                  peer_public_key=self.anchor_pk), timeout=T)
                self.assertEqual(d.shared_key, shared, "%s v%d: derive changed after restart"
                                 % (key_id, version))
            else:
                _, _, msg, env = proof
                o = s.aead.Open(pb.aead.AeadOpenRequest(key_id=key_id, envelope=env,
                                                        associated_data=b"ad"), timeout=T)
                self.assertEqual(o.plaintext, msg, key_id)
                self.assertEqual(o.key_version, version)
        # And a fresh use of the current version.
        if rec.type == ED:
            sig = s.ed.Sign(pb.ed.SignRequest(key_id=key_id, message=b"fresh"), timeout=T)
            self.assertEqual(sig.public_key, pks[current])
            self.assertTrue(s.ed.Verify(pb.ed.VerifyRequest(
                public_key=pks[current], message=b"fresh", signature=sig.signature), timeout=T).valid)
        elif rec.type == X:
            mine = s.x.Derive(pb.x.DeriveRequest(key_id=key_id, peer_public_key=self.anchor_pk),
                              timeout=T).shared_key
            theirs = s.x.Derive(pb.x.DeriveRequest(key_id="anchor", peer_public_key=pks[current]),
                                timeout=T).shared_key
            self.assertEqual(mine, theirs, key_id)
        else:
            env = s.aead.Seal(pb.aead.AeadSealRequest(key_id=key_id, plaintext=b"fresh"), timeout=T)
            self.assertEqual(s.aead.Open(pb.aead.AeadOpenRequest(key_id=key_id, envelope=env.envelope),
                                         timeout=T).plaintext, b"fresh")

    def verify_after_restart(self, round_):
        s = self.server
        listed = {}
        for info in s.keys.ListKeys(pb.keys.ListKeysRequest(), timeout=T).keys:
            self.assertNotIn(info.key_id, listed, "ListKeys lists %s twice" % info.key_id)
            listed[info.key_id] = info
        unknown = set(listed) - set(self.records) - self.attempted - {"anchor"}
        self.assertFalse(unknown, "keys nobody created: %s" % sorted(unknown))
        counts = {"acked": 0, "deleted": 0, "in-flight created": 0, "in-flight lost": 0}
        for key_id in sorted(self.attempted | set(self.records)):
            rec = self.records.get(key_id)
            info = listed.get(key_id)
            if rec is None:
                # Creation was in flight at the kill: either outcome, but a present key must work.
                if info is None:
                    counts["in-flight lost"] += 1
                    continue
                counts["in-flight created"] += 1
                rec = Record(key_id, info.type)
                self.records[key_id] = rec
                rec.adopt(info)
                self.check_works(s, rec, info)
                continue
            if rec.deleted:
                counts["deleted"] += 1
                self.assertIsNone(info, "%s: deletion was acknowledged, key is back" % key_id)
                self.assertRpcError(grpc.StatusCode.NOT_FOUND, s.keys.GetKey,
                                    pb.keys.GetKeyRequest(key_id=key_id), timeout=T)
                continue
            if info is None:
                self.assertTrue(rec.uncertain, "%s: acknowledged key missing after restart "
                                "(type %d, versions %s)" % (key_id, rec.type, sorted(rec.versions)))
                rec.deleted = True  # its deletion was in flight and made it
                continue
            counts["acked"] += 1
            self.assertEqual(info.type, rec.type, key_id)
            got = {v.version: v.public_key for v in info.versions}
            for version, pk in rec.versions.items():
                self.assertIn(version, got, "%s: acknowledged version %d missing" % (key_id, version))
                self.assertEqual(got[version], pk, "%s v%d: public key changed" % (key_id, version))
            if not rec.uncertain:
                self.assertEqual(sorted(got), sorted(rec.versions), key_id)
                self.assertEqual(info.current_version, max(rec.versions), key_id)
            single = s.keys.GetKey(pb.keys.GetKeyRequest(key_id=key_id), timeout=T)
            self.assertEqual(summary(single), summary(info), key_id)
            rec.adopt(info)
            self.check_works(s, rec, info)
        print("  round %d restart: %d keys listed; %s" % (
            round_, len(listed), ", ".join("%s %d" % kv for kv in counts.items())), flush=True)

    # -- the test -------------------------------------------------------------------------

    def test_acknowledged_keys_survive_sigkill(self):
        s = self.server
        s.start()
        info = s.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="anchor", type=X), timeout=T)
        self.anchor_pk = info.versions[0].public_key
        t_start = time.monotonic()
        for round_ in range(ROUNDS):
            if round_ > 0:
                s.start()
                a = s.keys.GetKey(pb.keys.GetKeyRequest(key_id="anchor"), timeout=T)
                self.assertEqual(a.versions[0].public_key, self.anchor_pk)
                self.verify_after_restart(round_)
            stop = threading.Event()
            acks = [0]
            self.writer_errors = []
            threads = harness.thread_run(self.writer, THREADS, round_, stop, acks)
            deadline = time.monotonic() + 20
            while acks[0] < 5 and time.monotonic() < deadline:
                time.sleep(0.005)
            self.assertGreaterEqual(acks[0], 5, "writers made no progress\n" + s.log_tail())
            delay = self.rng.uniform(0.0, 1.0)
            time.sleep(delay)
            before = acks[0]
            s.kill()
            stop.set()
            for th in threads:
                th.join(30)
                self.assertFalse(th.is_alive(), "writer thread stuck after the kill")
            self.assertEqual(self.writer_errors, [])
            print("  round %d: SIGKILL %.3fs after the 5th ack, %d mutations acknowledged"
                  % (round_, delay, max(before, acks[0])), flush=True)
        s.start()
        self.verify_after_restart(ROUNDS)
        took = s.stop()
        print("  %d rounds in %.1fs; clean stop in %.2fs" % (ROUNDS, time.monotonic() - t_start, took))


if __name__ == "__main__":
    unittest.main(verbosity=2)
