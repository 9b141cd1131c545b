"""The file key store's failures reach callers without the server's paths, with the right code.

A key change that cannot be written, or a key file that cannot be read or opened, fails the call
with a message that says what failed and names no path of the server's (its data folder, the key
file): the path goes to the server's log only, on a `keystore_unavailable` line (a system call
failed) or a `keystore_error` line (the file's own fault). Only a failed system call is
UNAVAILABLE, with a retry delay; the file's faults keep their code and carry none (a retry cannot
mend them). The failures are made for real on a running server, in ways that stop root too (the
tests run as root, so a mode bit would not):
  - a directory in the place of the store's temporary file: creating it fails (EISDIR), so no
    change can be written: UNAVAILABLE;
  - the key file a symlink to itself: opening it fails (ELOOP): UNAVAILABLE;
  - the key file removed: DATA_LOSS; a directory in its place: FAILED_PRECONDITION;
  - a key file that is not a sealed store (overwritten with other bytes): DATA_LOSS.
Each is asked on the gRPC port (gRPC) and on the HTTP port (Connect JSON), then undone, and the
same call then succeeds. (A change that reached the file but whose directory fsync failed, UNKNOWN,
cannot be made to happen here without faking the file system: not tested.)

    OFFLOAD_SERVER=build/bin/offload_server /usr/bin/python3 -m unittest -v test_key_store_errors.py
"""

import json
import os
import shutil
import unittest
import urllib.error
import urllib.request

import grpc

from harness import Server, ServerTestCase, pb, retry_delay_ms

T = 10
ED = pb.keys.KEY_TYPE_ED25519


class KeyStoreErrorsTest(ServerTestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = Server("keystore-errors", backend="libsodium").start()
        cls.servers = [cls.server]
        cls.db = os.path.join(cls.server.data_dir, "keys.db")
        cls.server.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="held", type=ED), timeout=T)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def grpc_create(self, key_id):
        """CreateKey on the gRPC port: (code, message)."""
        try:
            self.server.keys.CreateKey(pb.keys.CreateKeyRequest(key_id=key_id, type=ED), timeout=T)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            self.retry_delays.append(retry_delay_ms(e))
            return e.code(), e.details()

    def grpc_rotate(self, key_id):
        try:
            self.server.keys.RotateKey(pb.keys.RotateKeyRequest(key_id=key_id), timeout=T)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            self.retry_delays.append(retry_delay_ms(e))
            return e.code(), e.details()

    def setUp(self):
        self.retry_delays = []  # of the gRPC calls that failed, in order

    def connect_create(self, key_id):
        """CreateKey over Connect JSON on the HTTP port: (Connect code, message)."""
        url = "http://127.0.0.1:%d/offload.v1.KeyService/CreateKey" % (
            self.server.bound_port("http_address"))
        request = urllib.request.Request(
            url, json.dumps({"keyId": key_id, "type": "KEY_TYPE_ED25519"}).encode(),
            {"content-type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=T) as r:
                return "ok", r.read().decode()
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
            return body.get("code"), body.get("message", "")

    def assertNoPath(self, message, what):
        for part in (self.server.data_dir, os.path.dirname(self.server.data_dir), "keys.db", "/"):
            self.assertNotIn(part, message, "%s: the caller's message names %r" % (what, part))

    def logged(self, event):
        lines = [json.loads(l) for l in self.server.log_lines() if l.startswith("{")]
        return [l for l in lines if l.get("event") == event]

    def ask_all(self, prefix, grpc_code, connect_code, words):
        """CreateKey and RotateKey on gRPC, CreateKey on Connect: each fails with the code and
        `words`, and names no path."""
        for what, (code, message) in [
                ("gRPC CreateKey", self.grpc_create(prefix + "-grpc")),
                ("gRPC RotateKey", self.grpc_rotate("held")),
                ("Connect CreateKey", self.connect_create(prefix + "-connect"))]:
            self.assertEqual(code, grpc_code if what.startswith("gRPC") else connect_code,
                             "%s: %s" % (what, message))
            self.assertIn(words, message, what)
            self.assertNoPath(message, what)
        # Only UNAVAILABLE says "try again later".
        self.assertEqual(len(self.retry_delays), 2, self.retry_delays)
        for delay in self.retry_delays:
            if grpc_code == grpc.StatusCode.UNAVAILABLE:
                self.assertIsNotNone(delay)
            else:
                self.assertIsNone(delay)

    def test_a_change_that_cannot_be_written(self):
        blocker = self.db + ".tmp"
        logged_before = len(self.logged("keystore_unavailable"))
        os.mkdir(blocker)
        try:
            self.ask_all("new", grpc.StatusCode.UNAVAILABLE, "unavailable",
                         "key store unavailable: the change could not be written")
        finally:
            os.rmdir(blocker)
        # The detail, path and all, is in the server's log, once per call, on the line the
        # PostgreSQL store uses for the same kind of failure.
        logged = self.logged("keystore_unavailable")[logged_before:]
        self.assertEqual(len(logged), 3, logged)
        for line in logged:
            self.assertIn(blocker, line["error"], line)
            self.assertEqual(line["store"], "file:" + self.db, line)
        self.assertEqual([l["call"] for l in logged], ["insert", "update", "insert"])
        # Nothing was changed, and the store works again.
        self.assertEqual(self.grpc_create("new-grpc"), (grpc.StatusCode.OK, ""))
        self.assertEqual(self.connect_create("new-connect")[0], "ok")
        self.assertEqual(self.grpc_rotate("held"), (grpc.StatusCode.OK, ""))

    def test_a_key_file_that_cannot_be_read(self):
        aside = self.db + ".aside"
        os.rename(self.db, aside)
        os.symlink("keys.db", self.db)
        try:
            self.ask_all("unread", grpc.StatusCode.UNAVAILABLE, "unavailable",
                         "key store unavailable: the key store file could not be read")
        finally:
            os.unlink(self.db)
            os.rename(aside, self.db)
        self.assertEqual(self.grpc_create("unread-grpc"), (grpc.StatusCode.OK, ""))

    def test_a_key_file_that_is_gone_or_not_a_file(self):
        aside = self.db + ".aside"
        os.rename(self.db, aside)
        try:
            self.ask_all("gone", grpc.StatusCode.DATA_LOSS, "data_loss",
                         "the key store file has disappeared")
            self.retry_delays = []
            logged_before = len(self.logged("keystore_error"))
            os.mkdir(self.db)
            try:
                self.ask_all("dir", grpc.StatusCode.FAILED_PRECONDITION, "failed_precondition",
                             "the key store file is not a regular file")
            finally:
                os.rmdir(self.db)
            logged = self.logged("keystore_error")[logged_before:]
            self.assertEqual(len(logged), 3, logged)
            for line in logged:
                self.assertIn(self.db, line["error"], line)
        finally:
            os.rename(aside, self.db)
        self.assertEqual(self.grpc_create("gone-grpc"), (grpc.StatusCode.OK, ""))

    def test_a_key_file_that_cannot_be_opened(self):
        saved = self.db + ".saved"
        shutil.copy2(self.db, saved)
        with open(self.db, "r+b") as f:
            f.write(b"\x00" * 64)  # its header and the start of the sealed contents
        try:
            self.ask_all("damaged", grpc.StatusCode.DATA_LOSS, "data_loss",
                         "the key store file cannot be opened")
        finally:
            os.replace(saved, self.db)
        self.assertEqual(self.grpc_create("damaged-grpc"), (grpc.StatusCode.OK, ""))


if __name__ == "__main__":
    unittest.main()
