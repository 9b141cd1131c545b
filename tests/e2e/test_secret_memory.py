"""Secrets stay out of swap and core dumps (issue 26, secret memory), seen from outside a real
server through /proc: key material sits in locked memory (VmLck > 0; mappings whose VmFlags carry
`lo` and `dd`), memo payloads (cached plaintexts, shared keys) in mappings marked `dd`
(MADV_DONTDUMP) - one at least as large as a cached plaintext - and the process is not dumpable
(core limit 0; its `process_hardened` log line). `--locked_memory_bytes=0` is the control: nothing
locked, key material counted as fallback, and the service works the same.

The audit chain's key (issue 33) is kept by the chain alone, in locked memory: read through
/proc/PID/mem of a server started with --allow_core_dumps, its bytes sit only in mappings marked
`dd`, never in the ordinary heap (an options copy, a stdio buffer).

Secret memory costs the open memo at most a page per entry (issue 33): 27 blobs of 55 KB stay in
an open memo bounded by 27 x (ciphertext + plaintext + 4 KiB), all 27 hit on a second pass.

That SIGABRT leaves no core file by default is test_process_hardening.py's."""
import json
import os
import re
import secrets
import unittest
import urllib.request

import harness
from harness import Server, ServerTestCase, pb

T = 30
BIG = 3 << 20  # a plaintext larger than any slab: a no-dump mapping of its own


def smaps(pid):
    """[(start, end, {field: kB}, set(vmflags))] of /proc/PID/smaps."""
    regions = []
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                regions.append((int(m.group(1), 16), int(m.group(2), 16), {}, set()))
            elif line.startswith("VmFlags:"):
                regions[-1][3].update(line.split()[1:])
            else:
                name, _, value = line.partition(":")
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB":
                    regions[-1][2][name] = int(parts[0])
    return regions


def status_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


def core_limit(pid):
    with open("/proc/%d/limits" % pid) as f:
        for line in f:
            if line.startswith("Max core file size"):
                return line.split()[4:6]
    raise AssertionError("no core limit")


def logged(server, event):
    for line in server.log_lines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == event:
                return entry
    return None


def metric(server, name):
    body = urllib.request.urlopen(
        "http://%s/metrics" % server.flag_value("metrics_address"), timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise AssertionError("no %s in /metrics" % name)


class SecretMemoryTest(ServerTestCase):
    def fill(self, server):
        """Keys of every type on both backends' paths, then the memos: an open of BIG bytes,
        small opens, derives. Returns the big plaintext."""
        for key_id, key_type in [("ed", pb.keys.KEY_TYPE_ED25519), ("xa", pb.keys.KEY_TYPE_X25519),
                                 ("xb", pb.keys.KEY_TYPE_X25519),
                                 ("chacha", pb.keys.KEY_TYPE_CHACHA20_POLY1305),
                                 ("gcm", pb.keys.KEY_TYPE_AES256_GCM)]:
            server.keys.CreateKey(pb.keys.CreateKeyRequest(key_id=key_id, type=key_type),
                                  timeout=T)
        big = secrets.token_bytes(BIG)
        sealed = server.aead.Seal(pb.aead.AeadSealRequest(key_id="chacha", plaintext=big),
                                  timeout=T)
        opened = server.aead.Open(pb.aead.AeadOpenRequest(key_id="chacha",
                                                          envelope=sealed.envelope), timeout=T)
        self.assertEqual(opened.plaintext, big)
        self.assertTrue(opened.memo_hit)  # Seal recorded it: the plaintext is in the memo
        for i in range(20):
            small = secrets.token_bytes(100 + 50 * i)
            env = server.aead.Seal(pb.aead.AeadSealRequest(key_id="gcm", plaintext=small),
                                   timeout=T).envelope
            got = server.aead.Open(pb.aead.AeadOpenRequest(key_id="gcm", envelope=env), timeout=T)
            self.assertEqual(got.plaintext, small)
        xb = server.keys.GetKey(pb.keys.GetKeyRequest(key_id="xb"), timeout=T)
        peer = xb.versions[0].public_key
        first = server.x.Derive(pb.x.DeriveRequest(key_id="xa", peer_public_key=peer), timeout=T)
        again = server.x.Derive(pb.x.DeriveRequest(key_id="xa", peer_public_key=peer), timeout=T)
        self.assertEqual(first.shared_key, again.shared_key)
        self.assertTrue(again.memo_hit)
        msg = b"secret memory"
        sig = server.ed.Sign(pb.ed.SignRequest(key_id="ed", message=msg), timeout=T).signature
        self.assertEqual(len(sig), 64)
        return big

    def test_keys_locked_memos_not_dumped_process_not_dumpable(self):
        server = Server("secret-memory")
        self.servers = [server]
        server.start()
        try:
            self.fill(server)
            pid = server.proc.pid
            vm_lck = status_kb(pid, "VmLck")
            regions = smaps(pid)
            locked = [r for r in regions if "lo" in r[3]]
            locked_dd = [r for r in locked if "dd" in r[3] and r[2].get("Locked", 0) > 0]
            big_dd = [r for r in regions if "dd" in r[3] and "lo" not in r[3]
                      and r[1] - r[0] >= BIG and r[2].get("Rss", 0) * 1024 >= BIG]
            print("  VmLck %d kB; %d locked mappings (%d also dd); %d dd mappings, largest "
                  "unlocked dd %d kB" % (
                      vm_lck, len(locked), len(locked_dd),
                      sum(1 for r in regions if "dd" in r[3]),
                      max([(r[1] - r[0]) >> 10 for r in regions if "dd" in r[3]
                           and "lo" not in r[3]] or [0])))
            self.assertGreater(vm_lck, 0)
            self.assertTrue(locked_dd, "no mapping is both locked and dontdump")
            self.assertTrue(big_dd, "no dontdump mapping holds the %d-byte cached plaintext" % BIG)
            # Not dumpable, no core files.
            self.assertEqual(core_limit(pid), ["0", "0"])
            hardened = logged(server, "process_hardened")
            self.assertEqual((hardened["dumpable"], hardened["core_limit"]), (False, 0))
            line = logged(server, "locked_memory")
            self.assertIsNotNone(line)
            self.assertGreater(line["budget_bytes"], 0)
            self.assertGreater(metric(server, "offload_locked_memory_bytes"), 0)
            self.assertEqual(metric(server, "offload_locked_memory_fallback_bytes"), 0)
            self.assertGreaterEqual(metric(server, "offload_nodump_memory_bytes"), BIG)
        finally:
            server.stop()

    def test_no_locked_memory_budget_is_the_control(self):
        server = Server("secret-memory-nolock", args=["--locked_memory_bytes=0"])
        self.servers = [server]
        server.start()
        try:
            self.fill(server)
            pid = server.proc.pid
            self.assertEqual(status_kb(pid, "VmLck"), 0)
            regions = smaps(pid)
            self.assertFalse([r for r in regions if "lo" in r[3]])
            # Key material still kept out of dumps, counted as fallback; no warning for a budget
            # of 0, which is a choice (the start-up `locked_memory` line says it).
            self.assertGreater(metric(server, "offload_locked_memory_fallback_bytes"), 0)
            self.assertIsNone(logged(server, "locked_memory_exhausted"))
            self.assertEqual(logged(server, "locked_memory")["budget_bytes"], 0)
            self.assertTrue([r for r in regions if "dd" in r[3] and r[1] - r[0] >= BIG])
        finally:
            server.stop()

    @unittest.skipIf(harness.SANITIZED, "a sanitizer's allocator and shadow memory: the Release "
                     "build's memory is what is checked")
    def test_the_audit_chain_key_lives_only_in_secret_memory(self):
        work = os.path.join(harness._WORK, "chain-key")
        os.makedirs(work, exist_ok=True)
        key = secrets.token_bytes(32)
        key_file = os.path.join(work, "key")
        with open(key_file, "wb") as f:
            f.write(key)
        server = Server("chain-key", args=[
            "--allow_core_dumps",  # /proc/PID/mem readable by this test (the same user)
            "--audit_log_file=" + os.path.join(work, "audit.jsonl"),
            "--audit_chain_key_file=" + key_file])
        self.servers = [server]
        server.start()
        try:
            for i in range(3):  # lines sealed under the key
                server.keys.CreateKey(pb.keys.CreateKeyRequest(
                    key_id="k%d" % i, type=pb.keys.KEY_TYPE_ED25519), timeout=T)
            hits = harness.memory_hits(server.proc.pid, key)
            self.assertTrue(hits, "the key is nowhere: the scan does not work")
            outside = [(hex(lo), perms, path) for lo, hi, perms, path, flags in hits
                       if "dd" not in flags]
            self.assertEqual(outside, [], "the chain key outside secret memory")
        finally:
            server.stop()

    def test_27_blobs_of_55_kb_fit_their_bytes_plus_a_page_each(self):
        blob = 55000
        plaintexts = [secrets.token_bytes(blob) for _ in range(27)]
        # The envelope a client stores and sends back (aead.proto): 5 + nonce (24) + n + tag.
        envelope = 5 + 24 + blob + 16
        budget = 27 * (envelope + blob + 4096)
        server = Server("memo-27", args=["--memo_open_bytes_per_key=%d" % budget,
                                         "--memo_open_bytes_total=%d" % budget])
        self.servers = [server]
        server.start()
        try:
            server.keys.CreateKey(pb.keys.CreateKeyRequest(
                key_id="blobs", type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305), timeout=T)
            envs = [server.aead.Seal(pb.aead.AeadSealRequest(key_id="blobs", plaintext=p),
                                     timeout=T).envelope for p in plaintexts]
            self.assertEqual({len(e) for e in envs}, {envelope})
            # A rotation drops the key's entries (Seal recorded them): the first pass opens and
            # records each envelope as a phone's resume does, the second must hit all 27.
            server.keys.RotateKey(pb.keys.RotateKeyRequest(key_id="blobs"), timeout=T)
            for n, (env, p) in enumerate(zip(envs, plaintexts)):
                got = server.aead.Open(pb.aead.AeadOpenRequest(key_id="blobs", envelope=env),
                                       timeout=T)
                self.assertEqual(got.plaintext, p)
                self.assertFalse(got.memo_hit, n)
            hits = 0
            for env, p in zip(envs, plaintexts):
                got = server.aead.Open(pb.aead.AeadOpenRequest(key_id="blobs", envelope=env),
                                       timeout=T)
                self.assertEqual(got.plaintext, p)
                hits += got.memo_hit
            self.assertEqual(hits, 27, "budget %d bytes for 27 envelopes of %d bytes"
                             % (budget, envelope))
            self.assertEqual(metric(server, 'offload_memo_entries{cache="open"}'), 27)
            self.assertLessEqual(metric(server, 'offload_memo_bytes{cache="open"}'), budget)
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main()
