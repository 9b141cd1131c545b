"""The audit trail's HMAC chain (issue 26): a server started with --audit_log_file and
--audit_chain_key_file writes every line with a mac chaining it to the one before, also across a
restart; `offloadctl audit verify` (OFFLOAD_CTL) accepts the untouched file and names the first
broken line when a line is removed or edited, and a foreign key fails at line 1.

Checkpoints (issue 33): with --audit_checkpoint_file and a short --audit_checkpoint_interval, the
server writes audit_checkpoint lines apart from the audit file (that file and its own log), on
its interval, before moving to a rotated file, and at shutdown; `offloadctl audit verify
--checkpoints` accepts the untouched files (rotated and current, either checkpoint source) and
finds the last 3 lines cut from the current file, or 2 from the rotated one, which the chain alone
cannot tell."""
import json
import os
import subprocess
import tempfile
import time
import unittest

import grpc

import harness
from harness import pb


def verify(audit, key, *more):
    files = [audit] if isinstance(audit, str) else list(audit)
    r = subprocess.run([os.environ["OFFLOAD_CTL"], "audit", "verify", "--key_file=" + key]
                       + list(more) + files, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def checkpoints(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def cut(path, n, work, name):
    """A copy of `path` without its last `n` lines."""
    with open(path) as f:
        lines = f.read().splitlines()
    out = os.path.join(work, name)
    with open(out, "w") as f:
        f.write("\n".join(lines[:-n]) + "\n")
    return out


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

    def test_checkpoints_find_a_cut_tail_across_a_rotation(self):
        if not os.environ.get("OFFLOAD_CTL"):
            self.skipTest("OFFLOAD_CTL (the offloadctl binary) is not set")
        work = tempfile.mkdtemp(prefix="audit-cp-", dir=harness._WORK)
        key, audit = os.path.join(work, "key"), os.path.join(work, "audit.jsonl")
        marks = os.path.join(work, "checkpoints.jsonl")
        with open(key, "wb") as f:
            f.write(os.urandom(32))
        server = harness.Server("audit-cp", args=[
            "--audit_log_file=" + audit, "--audit_chain_key_file=" + key,
            "--audit_checkpoint_file=" + marks, "--audit_checkpoint_interval=100ms"])
        self.servers = [server]
        server.start()
        K = pb.keys
        for i in range(20):
            server.keys.CreateKey(K.CreateKeyRequest(key_id="a%d" % i, type=K.KEY_TYPE_X25519),
                                  timeout=10)
        # The interval's checkpoint, while serving.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (
                os.path.exists(marks) and any(c["lines"] == 20 for c in checkpoints(marks))):
            time.sleep(0.05)
        self.assertTrue(any(c["lines"] == 20 for c in checkpoints(marks)), checkpoints(marks))
        # A rotation (logrotate's create mode): the server re-opens the path within a second.
        os.rename(audit, audit + ".1")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not os.path.exists(audit):
            time.sleep(0.05)
        for i in range(33):
            server.keys.CreateKey(K.CreateKeyRequest(key_id="b%d" % i, type=K.KEY_TYPE_X25519),
                                  timeout=10)
        server.stop()
        cps = checkpoints(marks)
        self.assertEqual({c["event"] for c in cps}, {"audit_checkpoint"})
        with open(audit) as f:
            current = f.read().splitlines()
        self.assertEqual(len(current), 34, current[:2])  # audit_file_reopened, then 33 lines
        self.assertEqual(cps[-1]["lines"], 34)  # the shutdown's
        self.assertEqual(cps[-1]["mac"], json.loads(current[-1])["mac"])
        logged = [json.loads(l) for l in server.log_lines() if '"audit_checkpoint"' in l
                  and l.startswith("{")]
        self.assertEqual([(c["lines"], c["mac"]) for c in logged],
                         [(c["lines"], c["mac"]) for c in cps])

        files = [audit + ".1", audit]
        for source in (marks, server.log_path):
            code, out = verify(files, key, "--checkpoints=" + source)
            self.assertEqual(code, 0, out)
            self.assertIn("ok: 54 lines in 2 files", out)
            self.assertIn("checkpoints found", out)
        # The last 3 lines cut: the chain alone says ok (its stated limit), the checkpoints not.
        current_cut = cut(audit, 3, work, "audit-cut.jsonl")
        self.assertEqual(verify(current_cut, key), (0, "ok: 31 lines, every mac checks\n"))
        code, out = verify([audit + ".1", current_cut], key, "--checkpoints=" + marks)
        self.assertEqual(code, 1, out)
        self.assertIn("has 31 lines", out)
        self.assertIn("cut from its end", out)
        # 2 lines cut from the rotated file: its checkpoint (written before the server moved on)
        # and the new file's previous_file_mac both tell.
        old_cut = cut(audit + ".1", 2, work, "audit-old-cut.jsonl")
        code, out = verify([old_cut, audit], key, "--checkpoints=" + marks)
        self.assertEqual(code, 1, out)
        self.assertIn("cut from", out)
        code, out = verify([old_cut], key, "--checkpoints=" + marks)
        self.assertEqual(code, 1, out)  # the last checkpoint names the current file, not given


if __name__ == "__main__":
    unittest.main()
