"""The file key store's failures reach callers without the server's paths.

A key change that cannot be written, or a key file that cannot be read or opened, fails the call
with a message that says what failed and names no path of the server's (its data folder, the key
file): the path goes to the server's log only, in a `keystore_error` line. The failures are made
for real on a running server, in ways that stop root too (the tests run as root, so a mode bit
would not):
  - a directory in the place of the store's temporary file: creating the file fails (EISDIR), so
    no change can be written;
  - a directory in the place of the key file itself: it cannot be read;
  - a key file that is not a sealed store (overwritten with other bytes): it cannot be opened.
Each is asked on the gRPC port (gRPC) and on the HTTP port (Connect JSON), then undone, and the
same call then succeeds.

    OFFLOAD_SERVER=build/bin/offload_server /usr/bin/python3 -m unittest -v test_key_store_errors.py
"""

import json
import os
import shutil
import unittest
import urllib.error
import urllib.request

import grpc

from harness import Server, ServerTestCase, pb

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
            return e.code(), e.details()

    def grpc_rotate(self, key_id):
        try:
            self.server.keys.RotateKey(pb.keys.RotateKeyRequest(key_id=key_id), timeout=T)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details()

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

    def logged_errors(self):
        lines = [json.loads(l) for l in self.server.log_lines() if l.startswith("{")]
        return [l for l in lines if l.get("event") == "keystore_error"]

    def test_a_change_that_cannot_be_written(self):
        blocker = self.db + ".tmp"
        logged_before = len(self.logged_errors())
        os.mkdir(blocker)
        try:
            for what, (code, message) in [
                    ("gRPC CreateKey", self.grpc_create("new-grpc")),
                    ("gRPC RotateKey", self.grpc_rotate("held")),
                    ("Connect CreateKey", self.connect_create("new-connect"))]:
                self.assertIn(code, (grpc.StatusCode.UNAVAILABLE, "unavailable"), what)
                self.assertIn("key store unavailable", message, what)
                self.assertIn("could not be written", message, what)
                self.assertNoPath(message, what)
        finally:
            os.rmdir(blocker)
        # The detail, path and all, is in the server's log, once per call.
        logged = self.logged_errors()[logged_before:]
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
        os.mkdir(self.db)
        try:
            for what, (code, message) in [
                    ("gRPC CreateKey", self.grpc_create("unread-grpc")),
                    ("gRPC RotateKey", self.grpc_rotate("held")),
                    ("Connect CreateKey", self.connect_create("unread-connect"))]:
                self.assertIn(code, (grpc.StatusCode.UNAVAILABLE, "unavailable"), what)
                self.assertIn("key store unavailable", message, what)
                self.assertIn("could not be read", message, what)
                self.assertNoPath(message, what)
        finally:
            os.rmdir(self.db)
            os.rename(aside, self.db)
        self.assertEqual(self.grpc_create("unread-grpc"), (grpc.StatusCode.OK, ""))

    def test_a_key_file_that_cannot_be_opened(self):
        saved = self.db + ".saved"
        shutil.copy2(self.db, saved)
        with open(self.db, "r+b") as f:
            f.write(b"\x00" * 64)  # its header and the start of the sealed contents
        try:
            for what, (code, message) in [
                    ("gRPC CreateKey", self.grpc_create("damaged-grpc")),
                    ("gRPC RotateKey", self.grpc_rotate("held")),
                    ("Connect CreateKey", self.connect_create("damaged-connect"))]:
                self.assertIn(code, (grpc.StatusCode.DATA_LOSS, "data_loss"), what)
                self.assertIn("key store file", message, what)
                self.assertNoPath(message, what)
        finally:
            os.replace(saved, self.db)
        self.assertEqual(self.grpc_create("damaged-grpc"), (grpc.StatusCode.OK, ""))


if __name__ == "__main__":
    unittest.main()
