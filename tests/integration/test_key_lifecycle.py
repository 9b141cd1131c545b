"""Key lifecycle through real servers: no single call loses a key.

The same scenarios run on the file key store (one server, restarted) and on a shared PostgreSQL
key store with two replicas, where every lifecycle call goes through replica 0 and its effect is
checked on replica 1 (which learns it by the store's change notification). The servers run with
--key_deletion_wait=3s (the short wait flag), so scheduled deletions really happen.

  disabled       a disabled key refuses Sign, Seal, Open, Derive, Box (FAILED_PRECONDITION), also
                 an envelope the open memo holds; enabled again, it serves as before
  deletion       DeleteKey: pending, every call refused; CancelKeyDeletion brings it back whole
                 (old envelopes open); a second DeleteKey is carried out after the wait: NOT_FOUND
                 everywhere, the id free; a request may not ask for a shorter wait
  versions       a disabled version refuses its envelopes, derivations and box opens; DestroyKeyVersion wipes it
                 after the wait; RestoreKeyVersion undoes a scheduled destruction
  min_version    min_decryption_version refuses older AEAD envelopes and X25519 versions;
                 Rewrap moves an envelope to the current version, same plaintext, and refuses a
                 retired one; BatchRewrap item by item; SetMinDecryptionVersion on a key pending
                 deletion is refused, so a cancel brings back a key whose old envelopes open
  connect        the lifecycle RPCs over Connect (HTTP/1.1 JSON) as well

Run: from tests/integration, with OFFLOAD_SERVER and OFFLOAD_PROTO_DIR set (ctest sets them):
  /usr/bin/python3 -m unittest -v test_key_lifecycle.py
"""

import json
import os
import secrets
import struct
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import grpc
import nacl.public

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

import harness  # noqa: E402
from harness import pb  # noqa: E402

K = pb.keys
WAIT_S = 3
# How long a change may take to reach the other replica, or a due deletion to be carried out: a
# bound that tells "never" from "slow" (sanitizer builds on 2 busy cores), not a target.
BOUND_S = 30.0
T = 10
FP = grpc.StatusCode.FAILED_PRECONDITION


def envelope_version(envelope):
    return struct.unpack(">I", envelope[1:5])[0]


def eventually(fn, what, bound=BOUND_S):
    """Calls fn until it returns without an AssertionError (or grpc error), up to `bound` s."""
    deadline = time.monotonic() + bound
    while True:
        try:
            return fn()
        except (AssertionError, grpc.RpcError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class LifecycleScenarios:
    """Mixed into a TestCase that sets `admin` (where lifecycle calls go) and `other` (where
    their effect is checked; the same server on the file store), each with --audit_log_file."""

    def audit_lines(self):
        lines = []
        for server in self.servers:
            with open(server.flag_value("audit_log_file")) as f:
                lines += [json.loads(line) for line in f if line.strip()]
        return lines

    def code_of(self, fn):
        try:
            fn()
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    def assert_code_on(self, server, code, fn_of_server, what):
        def check():
            got = self.code_of(lambda: fn_of_server(server))
            self.assertEqual(got, code, "%s on %s" % (what, server.name))
        eventually(check, what)

    def create(self, key_id, key_type):
        return self.admin.keys.CreateKey(K.CreateKeyRequest(key_id=key_id, type=key_type),
                                         timeout=T)

    def key_state(self, server, key_id):
        return server.keys.GetKey(K.GetKeyRequest(key_id=key_id), timeout=T)

    def seal(self, server, key_id, plaintext, aad=b""):
        return server.aead.Seal(pb.aead.AeadSealRequest(key_id=key_id, plaintext=plaintext,
                                                        associated_data=aad), timeout=T)

    def open(self, server, key_id, envelope, aad=b""):
        return server.aead.Open(pb.aead.AeadOpenRequest(key_id=key_id, envelope=envelope,
                                                        associated_data=aad), timeout=T)

    # -- scenarios -------------------------------------------------------------------------------

    def test_disabled_key_refuses_every_operation(self):
        p = "dis-"
        self.create(p + "ed", K.KEY_TYPE_ED25519)
        self.create(p + "x", K.KEY_TYPE_X25519)
        self.create(p + "a", K.KEY_TYPE_AES256_GCM)
        peer = nacl.public.PrivateKey.generate()
        env = eventually(lambda: self.seal(self.other, p + "a", b"kept").envelope, "seal")
        self.assertEqual(self.open(self.other, p + "a", env).plaintext, b"kept")  # now memoized
        calls = {
            "sign": lambda s: s.ed.Sign(pb.ed.SignRequest(key_id=p + "ed", message=b"m"),
                                        timeout=T),
            "derive": lambda s: s.x.Derive(pb.x.DeriveRequest(
                key_id=p + "x", peer_public_key=bytes(peer.public_key)), timeout=T),
            "box": lambda s: s.box.Seal(pb.box.BoxSealRequest(
                key_id=p + "x", peer_public_key=bytes(peer.public_key), plaintext=b"p"),
                timeout=T),
            "seal": lambda s: self.seal(s, p + "a", b"x"),
            "open (memoized)": lambda s: self.open(s, p + "a", env),
        }
        for name in (p + "ed", p + "x", p + "a"):
            info = self.admin.keys.DisableKey(K.DisableKeyRequest(key_id=name), timeout=T)
            self.assertEqual(info.state, K.KEY_STATE_DISABLED)
        for what, call in calls.items():
            self.assert_code_on(self.other, FP, call, "disabled: " + what)
        self.assertEqual(self.key_state(self.other, p + "a").state, K.KEY_STATE_DISABLED)
        with self.assertRaises(grpc.RpcError) as e:
            self.open(self.other, p + "a", env)
        self.assertIn("disabled", e.exception.details())
        for name in (p + "ed", p + "x", p + "a"):
            self.admin.keys.EnableKey(K.EnableKeyRequest(key_id=name), timeout=T)
        for what, call in calls.items():
            self.assert_code_on(self.other, grpc.StatusCode.OK, call, "enabled: " + what)
        self.assertEqual(self.open(self.other, p + "a", env).plaintext, b"kept")

    def test_deletion_waits_cancel_restores_then_destroys(self):
        key_id = "del-a"
        self.create(key_id, K.KEY_TYPE_XCHACHA20_POLY1305)
        self.admin.keys.RotateKey(K.RotateKeyRequest(key_id=key_id), timeout=T)
        env = eventually(lambda: self.seal(self.other, key_id, b"precious"), "seal").envelope
        before = self.key_state(self.admin, key_id)

        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.admin.keys.DeleteKey,
                            K.DeleteKeyRequest(key_id=key_id, wait_seconds=WAIT_S - 1),
                            timeout=T, contains=("wait_seconds",))
        # Scheduled far enough ahead that the cancel surely comes first.
        deleted = self.admin.keys.DeleteKey(K.DeleteKeyRequest(key_id=key_id, wait_seconds=3600),
                                            timeout=T)
        self.assertGreater(deleted.deletion_unix_seconds, time.time() + 3000)
        self.assertEqual(deleted.key.state, K.KEY_STATE_PENDING_DELETION)
        self.assert_code_on(self.other, FP, lambda s: self.open(s, key_id, env), "pending: open")
        self.assert_code_on(self.other, FP, lambda s: self.seal(s, key_id, b"x"), "pending: seal")
        self.assertEqual(self.key_state(self.other, key_id).state, K.KEY_STATE_PENDING_DELETION)
        self.assertRpcError(FP, self.admin.keys.DeleteKey, K.DeleteKeyRequest(key_id=key_id),
                            timeout=T, contains=("scheduled",))

        back = self.admin.keys.CancelKeyDeletion(K.CancelKeyDeletionRequest(key_id=key_id),
                                                 timeout=T)
        self.assertEqual(back.SerializeToString(), before.SerializeToString())
        got = eventually(lambda: self.open(self.other, key_id, env), "open after cancel")
        self.assertEqual(got.plaintext, b"precious")

        # Now for real: after the wait the key is gone everywhere and its id is free.
        self.admin.keys.DeleteKey(K.DeleteKeyRequest(key_id=key_id), timeout=T)
        for server in {id(s): s for s in (self.admin, self.other)}.values():
            self.assert_code_on(server, grpc.StatusCode.NOT_FOUND,
                                lambda s: self.key_state(s, key_id), "destroyed: GetKey")
            self.assert_code_on(server, grpc.StatusCode.NOT_FOUND,
                                lambda s: self.open(s, key_id, env), "destroyed: open")
        self.assertRpcError(grpc.StatusCode.NOT_FOUND, self.admin.keys.CancelKeyDeletion,
                            K.CancelKeyDeletionRequest(key_id=key_id), timeout=T)
        fresh = self.create(key_id, K.KEY_TYPE_XCHACHA20_POLY1305)
        self.assertEqual(fresh.current_version, 1)
        self.assertEqual(fresh.state, K.KEY_STATE_ENABLED)

        # The audit trail names each call, and the reaper's wipe (by whichever replica did it).
        lines = self.audit_lines()
        calls = [(l.get("method"), l.get("wait_seconds")) for l in lines
                 if l.get("key_id") == key_id and l.get("event", "").startswith("key_")]
        self.assertIn(("DeleteKey", 3600), calls)
        self.assertIn(("CancelKeyDeletion", None), calls)
        eventually(lambda: self.assertTrue(
            [l for l in self.audit_lines() if l.get("event") == "key_destroyed"
             and l.get("key_id") == key_id], "no key_destroyed line"), "key_destroyed audited")

    def test_versions_disable_destroy_restore(self):
        key_id = "ver-a"
        self.create(key_id, K.KEY_TYPE_CHACHA20_POLY1305)
        envs = {}
        for v in (1, 2, 3):
            if v > 1:
                self.admin.keys.RotateKey(K.RotateKeyRequest(key_id=key_id), timeout=T)
            envs[v] = eventually(lambda: self._seal_at(self.other, key_id, v), "seal v%d" % v)
        self.assertRpcError(FP, self.admin.keys.DisableKeyVersion,
                            K.KeyVersionRequest(key_id=key_id, version=3), timeout=T,
                            contains=("current",))
        for v in (1, 2):
            self.admin.keys.DisableKeyVersion(K.KeyVersionRequest(key_id=key_id, version=v),
                                              timeout=T)
        for v in (1, 2):
            self.assert_code_on(self.other, FP, lambda s: self.open(s, key_id, envs[v]),
                                "disabled version %d" % v)
        self.assertEqual(self.open(self.other, key_id, envs[3]).plaintext, b"v3")

        self.admin.keys.DestroyKeyVersion(K.KeyVersionRequest(key_id=key_id, version=1),
                                          timeout=T)
        info = self.admin.keys.DestroyKeyVersion(
            K.KeyVersionRequest(key_id=key_id, version=2, wait_seconds=3600), timeout=T)
        self.assertEqual(info.versions[1].state, K.KEY_VERSION_STATE_DESTROY_SCHEDULED)
        self.admin.keys.RestoreKeyVersion(K.KeyVersionRequest(key_id=key_id, version=2),
                                          timeout=T)
        self.admin.keys.EnableKeyVersion(K.KeyVersionRequest(key_id=key_id, version=2), timeout=T)

        def destroyed(server):
            info = self.key_state(server, key_id)
            self.assertEqual([v.state for v in info.versions],
                             [K.KEY_VERSION_STATE_DESTROYED, K.KEY_VERSION_STATE_ENABLED,
                              K.KEY_VERSION_STATE_ENABLED])
        for server in (self.admin, self.other):
            eventually(lambda: destroyed(server), "version 1 destroyed on " + server.name)
        self.assert_code_on(self.other, FP, lambda s: self.open(s, key_id, envs[1]),
                            "destroyed version")
        self.assert_code_on(self.other, grpc.StatusCode.OK,
                            lambda s: self.open(s, key_id, envs[2]), "restored version")
        self.assertRpcError(FP, self.admin.keys.EnableKeyVersion,
                            K.KeyVersionRequest(key_id=key_id, version=1), timeout=T)

        # An X25519 key's disabled version: no derivation, no box open with it.
        x_id = "ver-x"
        self.create(x_id, K.KEY_TYPE_X25519)
        self.admin.keys.RotateKey(K.RotateKeyRequest(key_id=x_id), timeout=T)
        self.admin.keys.DisableKeyVersion(K.KeyVersionRequest(key_id=x_id, version=1), timeout=T)
        peer = nacl.public.PrivateKey.generate()
        for what, call in (
                ("derive", lambda s: s.x.Derive(pb.x.DeriveRequest(
                    key_id=x_id, key_version=1, peer_public_key=bytes(peer.public_key)),
                    timeout=T)),
                ("box open", lambda s: s.box.Open(pb.box.BoxOpenRequest(
                    key_id=x_id, key_version=1, peer_public_key=bytes(peer.public_key),
                    nonce=bytes(24), ciphertext=bytes(32)), timeout=T))):
            self.assert_code_on(self.other, FP, call, "disabled version: " + what)
        self.assert_code_on(self.other, grpc.StatusCode.OK, lambda s: s.x.Derive(
            pb.x.DeriveRequest(key_id=x_id, key_version=2, peer_public_key=bytes(peer.public_key)),
            timeout=T), "enabled version: derive")

    def _seal_at(self, server, key_id, version):
        r = self.seal(server, key_id, b"v%d" % version)
        self.assertEqual(r.key_version, version)
        return r.envelope

    def test_min_decryption_version_and_rewrap(self):
        key_id = "min-a"
        self.create(key_id, K.KEY_TYPE_AES256_GCM)
        old = eventually(lambda: self._seal_at(self.other, key_id, 1), "seal v1")
        aad = b"record-7"
        old_aad = self.seal(self.other, key_id, b"with aad", aad).envelope
        self.admin.keys.RotateKey(K.RotateKeyRequest(key_id=key_id), timeout=T)

        def rewrap(server, envelope, aad=b""):
            return server.aead.Rewrap(pb.aead.AeadRewrapRequest(
                key_id=key_id, envelope=envelope, associated_data=aad), timeout=T)
        moved = eventually(lambda: self._checked_rewrap(rewrap, old), "rewrap")
        self.assertEqual(self.open(self.other, key_id, moved).plaintext, b"v1")
        moved_aad = rewrap(self.other, old_aad, aad)
        self.assertEqual(self.open(self.other, key_id, moved_aad.envelope, aad).plaintext,
                         b"with aad")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, rewrap, self.other, old_aad, b"no",
                            contains=("authentication failed",))

        self.admin.keys.SetMinDecryptionVersion(K.SetMinDecryptionVersionRequest(
            key_id=key_id, min_decryption_version=2), timeout=T)
        self.assert_code_on(self.other, FP, lambda s: self.open(s, key_id, old), "retired open")
        self.assert_code_on(self.other, FP, lambda s: rewrap(s, old), "retired rewrap")
        self.assertEqual(self.open(self.other, key_id, moved).plaintext, b"v1")

        batch = self.other.aead.BatchRewrap(pb.aead.BatchAeadRewrapRequest(items=[
            pb.aead.AeadRewrapRequest(key_id=key_id, envelope=moved),
            pb.aead.AeadRewrapRequest(key_id=key_id, envelope=old),
            pb.aead.AeadRewrapRequest(key_id=key_id, envelope=b"\x01"),
        ]), timeout=T)
        self.assertItem(batch.results[0], grpc.StatusCode.OK.value[0])
        self.assertItem(batch.results[1], FP.value[0], contains=("min_decryption_version",))
        self.assertItem(batch.results[2], grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertEqual(self.open(self.other, key_id,
                                   batch.results[0].response.envelope).plaintext, b"v1")

        # X25519: a derivation or box of a retired version is refused too.
        x_id = "min-x"
        self.create(x_id, K.KEY_TYPE_X25519)
        self.admin.keys.RotateKey(K.RotateKeyRequest(key_id=x_id), timeout=T)
        self.admin.keys.SetMinDecryptionVersion(K.SetMinDecryptionVersionRequest(
            key_id=x_id, min_decryption_version=2), timeout=T)
        peer = nacl.public.PrivateKey.generate()
        derive_v1 = lambda s: s.x.Derive(pb.x.DeriveRequest(
            key_id=x_id, key_version=1, peer_public_key=bytes(peer.public_key)), timeout=T)
        box_open_v1 = lambda s: s.box.Open(pb.box.BoxOpenRequest(
            key_id=x_id, key_version=1, peer_public_key=bytes(peer.public_key),
            nonce=bytes(24), ciphertext=bytes(32)), timeout=T)
        self.assert_code_on(self.other, FP, derive_v1, "retired derive")
        self.assert_code_on(self.other, FP, box_open_v1, "retired box open")

    def test_min_decryption_version_refused_while_pending_deletion(self):
        # Issue 33's recipe: create, seal, rotate, delete (2 min), min-decryption-version 2 is
        # refused, cancel: the key is as it was and the version-1 envelope still opens.
        key_id = "minpend-a"
        self.create(key_id, K.KEY_TYPE_XCHACHA20_POLY1305)
        env = eventually(lambda: self._seal_at(self.other, key_id, 1), "seal v1")
        self.admin.keys.RotateKey(K.RotateKeyRequest(key_id=key_id), timeout=T)
        before = self.key_state(self.admin, key_id)
        self.admin.keys.DeleteKey(K.DeleteKeyRequest(key_id=key_id, wait_seconds=120), timeout=T)
        self.assertRpcError(FP, self.admin.keys.SetMinDecryptionVersion,
                            K.SetMinDecryptionVersionRequest(key_id=key_id,
                                                             min_decryption_version=2),
                            timeout=T, contains=("scheduled for deletion",))
        back = self.admin.keys.CancelKeyDeletion(K.CancelKeyDeletionRequest(key_id=key_id),
                                                 timeout=T)
        self.assertEqual(back.SerializeToString(), before.SerializeToString())
        self.assertEqual(back.min_decryption_version, 0)
        got = eventually(lambda: self.open(self.other, key_id, env), "open v1 after cancel")
        self.assertEqual(got.plaintext, b"v1")
        refused = [l for l in self.audit_lines() if l.get("key_id") == key_id
                   and l.get("method") == "SetMinDecryptionVersion"]
        self.assertEqual([l.get("code") for l in refused], ["FAILED_PRECONDITION"])

    def _checked_rewrap(self, rewrap, envelope):
        r = rewrap(self.other, envelope)
        self.assertEqual(r.key_version, 2)
        self.assertEqual(r.previous_key_version, 1)
        self.assertEqual(envelope_version(r.envelope), 2)
        return r.envelope

    def test_connect_lifecycle_calls(self):
        key_id = "con-a"
        self.create(key_id, K.KEY_TYPE_AES256_GCM)
        port = self.admin.flag_value("http_address").rsplit(":", 1)[1]

        def call(method, body):
            req = urllib.request.Request(
                "http://127.0.0.1:%s/offload.v1.KeyService/%s" % (port, method),
                data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=T) as r:
                return json.loads(r.read())
        self.assertEqual(call("DisableKey", {"keyId": key_id})["state"], "KEY_STATE_DISABLED")
        self.assertEqual(call("EnableKey", {"keyId": key_id})["state"], "KEY_STATE_ENABLED")
        got = call("DeleteKey", {"keyId": key_id, "waitSeconds": "3600"})
        self.assertEqual(got["key"]["state"], "KEY_STATE_PENDING_DELETION")
        self.assertEqual(call("CancelKeyDeletion", {"keyId": key_id})["state"],
                         "KEY_STATE_ENABLED")
        try:
            call("DeleteKey", {"keyId": key_id, "waitSeconds": "1"})
            self.fail("a shorter wait was accepted")
        except urllib.error.HTTPError as e:
            self.assertEqual(e.code, 400)
            self.assertIn("wait_seconds", json.loads(e.read())["message"])


class FileStoreLifecycleTest(LifecycleScenarios, harness.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="life-")
        cls.server = harness.Server("life-file", args=[
            "--key_deletion_wait=%ds" % WAIT_S,
            "--audit_log_file=" + os.path.join(cls.dir, "audit.jsonl")])
        cls.servers = [cls.server]
        cls.addClassCleanup(cls.server.kill)
        cls.server.start()
        cls.admin = cls.other = cls.server

    def test_states_survive_a_restart(self):
        s = self.server
        self.create("rs-a", K.KEY_TYPE_AES256_GCM)
        self.create("rs-b", K.KEY_TYPE_ED25519)
        s.keys.RotateKey(K.RotateKeyRequest(key_id="rs-a"), timeout=T)
        s.keys.DisableKeyVersion(K.KeyVersionRequest(key_id="rs-a", version=1), timeout=T)
        s.keys.SetMinDecryptionVersion(K.SetMinDecryptionVersionRequest(
            key_id="rs-a", min_decryption_version=2), timeout=T)
        s.keys.DeleteKey(K.DeleteKeyRequest(key_id="rs-b", wait_seconds=3600), timeout=T)
        before = [self.key_state(s, k) for k in ("rs-a", "rs-b")]
        s.stop()
        s.start()
        after = [self.key_state(s, k) for k in ("rs-a", "rs-b")]
        self.assertEqual([a.SerializeToString() for a in after],
                         [b.SerializeToString() for b in before])
        s.keys.CancelKeyDeletion(K.CancelKeyDeletionRequest(key_id="rs-b"), timeout=T)
        s.ed.Sign(pb.ed.SignRequest(key_id="rs-b", message=b"m"), timeout=T)


@unittest.skipUnless(os.path.isdir("/usr/lib/postgresql"), "needs Debian's postgresql")
class PostgresReplicasLifecycleTest(LifecycleScenarios, harness.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        import pg_support  # noqa: E402 (only where PostgreSQL is installed)
        cls.pg = pg_support.start_for_class(cls)
        kek = secrets.token_hex(32)
        cls.dir = tempfile.mkdtemp(prefix="life-pg-")
        cls.replicas = [harness.Server("life-pg%d" % i, backend="libsodium", kek_hex=kek,
                                       args=["--keystore=postgres",
                                             "--key_deletion_wait=%ds" % WAIT_S,
                                             "--audit_log_file=" + os.path.join(
                                                 cls.dir, "audit-%d.jsonl" % i)])
                        for i in range(2)]
        cls.servers = cls.replicas
        for r in cls.replicas:
            cls.addClassCleanup(r.kill)
        cls.addClassCleanup(lambda: harness.stop_together(cls.replicas))
        harness.start_together(cls.replicas)
        cls.admin, cls.other = cls.replicas


if __name__ == "__main__":
    unittest.main()
