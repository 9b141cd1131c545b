"""The audit trail's HMAC chain (issue 26): a server started with --audit_log_file and
--audit_chain_key_file writes every line with a mac chaining it to the one before, also across a
restart; `offloadctl audit verify` (OFFLOAD_CTL) accepts the untouched file and names the first
broken line when a line is removed or edited, and a foreign key fails at line 1."""
import os
import subprocess
import tempfile
import unittest

import grpc

import harness
from harness import pb


def verify(audit, key):
    r = subprocess.run([os.environ["OFFLOAD_CTL"], "audit", "verify", "--key_file=" + key, audit],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


class AuditChainTest(harness.ServerTestCase):
    def test_chain_across_a_restart_and_tampering(self):
        if not os.environ.get("OFFLOAD_CTL"):
            self.skipTest("OFFLOAD_CTL (the offloadctl binary) is not set")
        work = tempfile.mkdtemp(prefix="audit-chain-", dir=harness._WORK)
        key, audit = os.path.join(work, "key"), os.path.join(work, "audit.jsonl")
        with open(key, "wb") as f:
            f.write(os.urandom(32))
        args = ["--audit_log_file=" + audit, "--audit_chain_key_file=" + key]
        server = harness.Server("audit", args=args)
        self.servers = [server]
        server.start()
        K = pb.keys
        for i in range(3):
            server.keys.CreateKey(K.CreateKeyRequest(key_id="k%d" % i, type=K.KEY_TYPE_X25519),
                                  timeout=10)
        server.keys.RotateKey(K.RotateKeyRequest(key_id="k0"), timeout=10)
        server.stop()
        server = harness.Server("audit2", data_dir=server.data_dir, kek_hex=server.kek_hex,
                                args=args)
        self.servers = [server]
        server.start()
        server.keys.DeleteKey(K.DeleteKeyRequest(key_id="k1"), timeout=10)
        self.assertRpcError(grpc.StatusCode.NOT_FOUND, server.keys.DeleteKey,
                            K.DeleteKeyRequest(key_id="nope"), timeout=10)
        server.stop()

        with open(audit) as f:
            lines = f.read().splitlines()
        self.assertEqual(len(lines), 6, lines)
        self.assertTrue(all('"mac":"' in line for line in lines))
        self.assertEqual(verify(audit, key), (0, "ok: 6 lines, every mac checks\n"))

        def tampered(new_lines):
            path = os.path.join(work, "tampered.jsonl")
            with open(path, "w") as f:
                f.write("\n".join(new_lines) + "\n")
            return verify(path, key)

        code, out = tampered(lines[:2] + lines[3:])  # line 3 removed
        self.assertEqual(code, 1, out)
        self.assertIn("broken: line 3 ", out)
        edited = list(lines)
        edited[4] = edited[4].replace('"key_id":"k1"', '"key_id":"k2"')
        self.assertNotEqual(edited[4], lines[4])
        code, out = tampered(edited)
        self.assertEqual(code, 1, out)
        self.assertIn("broken: line 5 ", out)
        other = os.path.join(work, "other.key")
        with open(other, "wb") as f:
            f.write(os.urandom(32))
        code, out = verify(audit, other)
        self.assertEqual(code, 1, out)
        self.assertIn("broken: line 1 ", out)


if __name__ == "__main__":
    unittest.main()
