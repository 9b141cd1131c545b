"""Scale-out: three offload_server replicas sharing a PostgreSQL key store behind nginx.

Real processes on loopback, all started here: PostgreSQL (Debian's, initdb in a temporary folder,
see pg_support.py), three replicas with --keystore=postgres and the same key-encryption key, and
nginx routing gRPC (grpc_pass on an HTTP/2 listener) and HTTP (proxy_pass) by
`hash $http_x_offload_key consistent`, plus a round-robin gRPC listener for comparison. The nginx
configuration is generated into a temporary folder (deploy/nginx is not read).

  a  a key created through one replica works on all of them (gRPC and HTTP through nginx too)
  b  after a rotation through one replica, no replica seals with the old version once the change
     has arrived (1 s is the target, printed; 30 s the asserted bound), and the open memo of every
     replica forgot the key's entries; a deletion reaches all as well
  c  a replayed open workload: the open-memo hit ratio through consistent-hash routing is within
     5 points of a single server's; round-robin routing is printed beside them
  d  SIGKILL of one replica under load (creates and seals through nginx): every acknowledged key
     is in the store and served by the survivors, which keep serving

Run: OFFLOAD_SERVER=build/service/main/offload_server /usr/bin/python3 -m unittest -v \
         test_scale_out.py      (from tests/integration; ctest sets the variables)
"""

import base64
import json
import os
import random
import re
import secrets
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import grpc
import nacl.bindings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

import harness  # noqa: E402
from harness import pb  # noqa: E402
import pg_support  # noqa: E402

REPLICAS = 3
PROPAGATION_TARGET_S = 1.0  # the promise: a change reaches every replica within this (printed)
# What the test asserts: the change arrives (a bound that tells "never" from "slow"; ASan replicas
# and PostgreSQL on 2 busy cores may take far longer than the target). The times are printed.
PROPAGATION_BOUND_S = 30.0


def envelope_version(envelope):
    """Key version from the AEAD envelope header: 0x01 | version u32 BE | nonce | ct | tag."""
    assert envelope[0] == 1, "envelope format byte %r" % envelope[0]
    return struct.unpack(">I", envelope[1:5])[0]


def local_seal(secret, version, plaintext, aad=b""):
    """An XChaCha20-Poly1305 envelope made here, so that no server has seen it (cold memos)."""
    nonce = secrets.token_bytes(24)
    ct = nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(plaintext, aad, nonce, secret)
    return b"\x01" + struct.pack(">I", version) + nonce + ct


NGINX_CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
{user}
events {{ worker_connections 1024; }}
http {{
  access_log off;
  # nginx closes a client connection (GOAWAY) after keepalive_requests calls (1000 by default);
  # gRPC clients may fail calls that race with the GOAWAY, so allow many more.
  keepalive_requests 1000000;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  # A key's requests go to one replica (its memo stays warm); a failed replica's keys move on.
  upstream grpc_by_key {{
    hash $http_x_offload_key consistent;
{grpc_servers}
    keepalive 16;
  }}
  upstream grpc_round_robin {{
{grpc_servers}
    keepalive 16;
  }}
  upstream http_by_key {{
    hash $http_x_offload_key consistent;
{http_servers}
    keepalive 16;
  }}
  server {{
    listen 127.0.0.1:{grpc_hash_port} http2;
    location / {{ grpc_pass grpc://grpc_by_key; }}
  }}
  server {{
    listen 127.0.0.1:{grpc_rr_port} http2;
    location / {{ grpc_pass grpc://grpc_round_robin; }}
  }}
  server {{
    listen 127.0.0.1:{http_port};
    location / {{
      proxy_pass http://http_by_key;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""


def start_nginx(grpc_addresses, http_addresses):
    """The router of this test (NGINX_CONF) on three free ports: .grpc_hash_port,
    .grpc_rr_port, .http_port."""
    ports = {"grpc_hash_port": harness.free_port(), "grpc_rr_port": harness.free_port(),
             "http_port": harness.free_port()}
    nginx = harness.Nginx(
        NGINX_CONF,
        grpc_servers="\n".join("    server %s;" % a for a in grpc_addresses),
        http_servers="\n".join("    server %s;" % a for a in http_addresses), **ports)
    for name, port in ports.items():
        setattr(nginx, name, port)
    return nginx.start(ports["http_port"])


def open_memo_counts(metrics_address):
    """(hits, misses) of the open memo from a replica's /metrics."""
    with urllib.request.urlopen("http://%s/metrics" % metrics_address, timeout=5) as r:
        text = r.read().decode()
    def value(name):
        m = re.search(r'^%s\{[^}]*cache="open"[^}]*\} (\S+)$' % name, text, re.M)
        if m is None:
            raise AssertionError("%s{cache=\"open\"} not in /metrics of %s" % (name, metrics_address))
        return float(m.group(1))
    return value("offload_memo_hits_total"), value("offload_memo_misses_total")


class ScaleOutTest(harness.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        t0 = time.monotonic()
        cls.pg = pg_support.start_for_class(cls)
        kek = secrets.token_hex(32)
        cls.http_addresses = ["127.0.0.1:%d" % harness.free_port() for _ in range(REPLICAS)]
        cls.metrics_addresses = ["127.0.0.1:%d" % harness.free_port() for _ in range(REPLICAS)]
        cls.replicas = [
            harness.Server("replica%d" % i, backend="libsodium", kek_hex=kek,
                           args=["--keystore=postgres", "--key_deletion_wait=0",
                                 "--http_address=" + cls.http_addresses[i],
                                 "--metrics_address=" + cls.metrics_addresses[i]])
            for i in range(REPLICAS)]
        cls.servers = cls.replicas
        for r in cls.replicas:
            cls.addClassCleanup(r.kill)
        cls.addClassCleanup(cls.stop_replicas)
        # Started together: the schema migration runs once, under its advisory lock.
        harness.start_together(cls.replicas)
        cls.nginx = start_nginx([r.address for r in cls.replicas], cls.http_addresses)
        cls.addClassCleanup(cls.nginx.close)
        cls.hash_channel = harness.Server.new_channel(
            type("A", (), {"address": "127.0.0.1:%d" % cls.nginx.grpc_hash_port})())
        cls.rr_channel = harness.Server.new_channel(
            type("A", (), {"address": "127.0.0.1:%d" % cls.nginx.grpc_rr_port})())
        cls.addClassCleanup(cls.hash_channel.close)
        cls.addClassCleanup(cls.rr_channel.close)
        cls.via_hash = cls.replicas[0].stubs_on(cls.hash_channel)
        cls.via_rr = cls.replicas[0].stubs_on(cls.rr_channel)
        print("\nscale-out: postgres, %d replicas and nginx up in %.1fs"
              % (REPLICAS, time.monotonic() - t0), file=sys.stderr)

    @classmethod
    def stop_replicas(cls):
        harness.stop_together(cls.replicas)

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def md(key_id):
        return (("x-offload-key", key_id),)

    def wait_all(self, predicate, timeout, what):
        """Polls predicate(replica) on every replica until all hold; returns seconds taken."""
        t0 = time.monotonic()
        pending = list(self.replicas)
        while pending:
            pending = [r for r in pending if not predicate(r)]
            if pending and time.monotonic() - t0 > timeout:
                self.fail("%s: not on %s after %.1fs" % (what, [r.name for r in pending], timeout))
            if pending:
                time.sleep(0.005)
        return time.monotonic() - t0

    @staticmethod
    def has_key(key_id, version=None):
        def check(r):
            try:
                info = r.keys.GetKey(pb.keys.GetKeyRequest(key_id=key_id), timeout=5)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return False
                raise
            return version is None or info.current_version == version
        return check

    def import_key(self, stub, key_id, secret, metadata=()):
        return stub.ImportKey(pb.keys.ImportKeyRequest(
            key_id=key_id, type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305, secret=secret),
            timeout=10, metadata=metadata)

    def http_seal(self, key_id, plaintext):
        body = json.dumps({"keyId": key_id,
                           "plaintext": base64.b64encode(plaintext).decode()}).encode()
        req = urllib.request.Request(
            "http://127.0.0.1:%d/offload.v1.AeadService/Seal" % self.nginx.http_port, data=body,
            headers={"Content-Type": "application/json", "x-offload-key": key_id})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return base64.b64decode(json.loads(resp.read())["envelope"])

    # -- a: one key, every replica ------------------------------------------------------------

    def test_a_key_created_through_one_replica_works_on_all(self):
        r0 = self.replicas[0]
        # The PostgreSQL password came by environment: not on a command line, not in a log.
        for r in self.replicas:
            with open("/proc/%d/cmdline" % r.proc.pid, "rb") as f:
                self.assertNotIn(self.pg.password.encode(), f.read(), r.name)
            self.assertNotIn(self.pg.password, "\n".join(r.log_lines()), r.name)
        r0.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="a-aead",
                                                   type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305),
                          timeout=10)
        took = self.wait_all(self.has_key("a-aead"), PROPAGATION_BOUND_S, "created key")
        print("scale-out a: a created key reached every replica in %.3fs (target %.1fs)"
              % (took, PROPAGATION_TARGET_S), file=sys.stderr)
        # Sealed by one replica, opened by every other (same key material everywhere).
        env = r0.aead.Seal(pb.aead.AeadSealRequest(key_id="a-aead", plaintext=b"hello"),
                           timeout=5).envelope
        for r in self.replicas[1:]:
            got = r.aead.Open(pb.aead.AeadOpenRequest(key_id="a-aead", envelope=env), timeout=5)
            self.assertEqual(got.plaintext, b"hello", r.name)
        # Ed25519 signatures are deterministic: every replica signs identically.
        self.replicas[1].keys.CreateKey(pb.keys.CreateKeyRequest(
            key_id="a-ed", type=pb.keys.KEY_TYPE_ED25519), timeout=10)
        self.wait_all(self.has_key("a-ed"), PROPAGATION_BOUND_S, "created key")
        sigs = {r.ed.Sign(pb.ed.SignRequest(key_id="a-ed", message=b"m"), timeout=5).signature
                for r in self.replicas}
        self.assertEqual(len(sigs), 1)
        # Through nginx: gRPC hashed by x-offload-key, and HTTP (Connect JSON).
        env2 = self.via_hash.aead.Seal(pb.aead.AeadSealRequest(key_id="a-aead", plaintext=b"x"),
                                       timeout=5, metadata=self.md("a-aead")).envelope
        env3 = self.http_seal("a-aead", b"over http")
        for r in self.replicas:
            self.assertEqual(r.aead.Open(pb.aead.AeadOpenRequest(
                key_id="a-aead", envelope=env2), timeout=5).plaintext, b"x")
            self.assertEqual(r.aead.Open(pb.aead.AeadOpenRequest(
                key_id="a-aead", envelope=env3), timeout=5).plaintext, b"over http")

    # -- b: rotation and deletion reach every replica ----------------------------------------

    def test_b_rotation_and_deletion_reach_every_replica_within_a_second(self):
        r0, r1, r2 = self.replicas
        r0.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="b-rot",
                                                   type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305),
                          timeout=10)
        self.wait_all(self.has_key("b-rot"), PROPAGATION_BOUND_S, "created key")
        old = r0.aead.Seal(pb.aead.AeadSealRequest(key_id="b-rot", plaintext=b"old"),
                           timeout=5).envelope
        self.assertEqual(envelope_version(old), 1)
        # Warm every replica's open memo with the old envelope.
        for r in self.replicas:
            for _ in range(2):
                last = r.aead.Open(pb.aead.AeadOpenRequest(key_id="b-rot", envelope=old), timeout=5)
            self.assertTrue(last.memo_hit, "%s: second open of an envelope is a memo hit" % r.name)

        info = r1.keys.RotateKey(pb.keys.RotateKeyRequest(key_id="b-rot"), timeout=10)
        self.assertEqual(info.current_version, 2)
        t_rotated = time.monotonic()
        took = self.wait_all(self.has_key("b-rot", 2), PROPAGATION_BOUND_S, "rotation")
        time.sleep(max(0.0, PROPAGATION_TARGET_S - (time.monotonic() - t_rotated)))
        # One second after the rotation: every replica seals with version 2 only.
        for r in self.replicas:
            for _ in range(3):
                env = r.aead.Seal(pb.aead.AeadSealRequest(key_id="b-rot", plaintext=b"new"),
                                  timeout=5).envelope
                self.assertEqual(envelope_version(env), 2, "%s sealed with the old version" % r.name)
            # The old version still opens, but the memo forgot it (new key instances).
            got = r.aead.Open(pb.aead.AeadOpenRequest(key_id="b-rot", envelope=old), timeout=5)
            self.assertEqual(got.plaintext, b"old")
            self.assertFalse(got.memo_hit, "%s: memo entries survived the rotation" % r.name)
        env = self.via_hash.aead.Seal(pb.aead.AeadSealRequest(key_id="b-rot", plaintext=b"n"),
                                      timeout=5, metadata=self.md("b-rot")).envelope
        self.assertEqual(envelope_version(env), 2)
        print("scale-out b: the rotation reached every replica in %.3fs (target %.1fs)"
              % (took, PROPAGATION_TARGET_S), file=sys.stderr)

        r2.keys.DeleteKey(pb.keys.DeleteKeyRequest(key_id="b-rot"), timeout=10)
        took = self.wait_all(lambda r: not self.has_key("b-rot")(r), PROPAGATION_BOUND_S, "deletion")
        for r in self.replicas:
            self.assertRpcError(grpc.StatusCode.NOT_FOUND, r.aead.Seal,
                                pb.aead.AeadSealRequest(key_id="b-rot", plaintext=b"x"), timeout=5)
        print("scale-out b: the deletion reached every replica in %.3fs (target %.1fs)"
              % (took, PROPAGATION_TARGET_S), file=sys.stderr)

    # -- c: hit ratio by routing ---------------------------------------------------------------

    KEYS, ENVELOPES, ROUNDS = 24, 6, 5

    def replay(self, prefix, stub, use_metadata):
        """Imports KEYS fresh keys through replica 0, makes ENVELOPES envelopes per key locally
        (no memo has seen them), then opens each of them ROUNDS times in a shuffled order through
        `stub`. Returns (hit ratio from memo_hit, hits counted by /metrics on all replicas)."""
        rng = random.Random(8)  # the same sequence shape for every routing
        keys = {}
        for k in range(self.KEYS):
            key_id = "%s-%02d" % (prefix, k)
            secret = bytes(rng.randrange(256) for _ in range(32))
            self.import_key(self.replicas[0].keys, key_id, secret)
            keys[key_id] = [local_seal(secret, 1, b"payload %d/%d" % (k, e))
                            for e in range(self.ENVELOPES)]
        for key_id in keys:
            self.wait_all(self.has_key(key_id), PROPAGATION_BOUND_S, "imported key")
        work = [(key_id, env) for key_id, envs in keys.items() for env in envs] * self.ROUNDS
        rng.shuffle(work)
        before = [open_memo_counts(a) for a in self.metrics_addresses]
        hits = 0
        for key_id, env in work:
            got = stub.aead.Open(pb.aead.AeadOpenRequest(key_id=key_id, envelope=env), timeout=10,
                                 metadata=self.md(key_id) if use_metadata else ())
            hits += got.memo_hit
        after = [open_memo_counts(a) for a in self.metrics_addresses]
        metric_hits = sum(a[0] - b[0] for a, b in zip(after, before))
        per_replica = ["%s %d/%d" % (r.name, a[0] - b[0], (a[0] - b[0]) + (a[1] - b[1]))
                       for r, a, b in zip(self.replicas, after, before)]
        return hits / len(work), metric_hits, hits, per_replica

    def test_c_consistent_hash_keeps_the_single_server_hit_ratio(self):
        single, m_single, h_single, _ = self.replay("c-one", self.replicas[0], False)
        hashed, m_hashed, h_hashed, per_hashed = self.replay("c-hash", self.via_hash, True)
        rr, m_rr, h_rr, per_rr = self.replay("c-rr", self.via_rr, True)
        opens = self.KEYS * self.ENVELOPES * self.ROUNDS
        print("scale-out c: open-memo hit ratio over %d opens of %d envelopes (%d keys): "
              "single server %.1f%%, 3 replicas consistent-hash %.1f%%, 3 replicas round-robin "
              "%.1f%%" % (opens, self.KEYS * self.ENVELOPES, self.KEYS, 100 * single,
                          100 * hashed, 100 * rr), file=sys.stderr)
        print("scale-out c: /metrics hits/lookups per replica: hash [%s], round-robin [%s]"
              % (", ".join(per_hashed), ", ".join(per_rr)), file=sys.stderr)
        # The two measures agree: /metrics counts what the responses said.
        self.assertEqual((m_single, m_hashed, m_rr), (h_single, h_hashed, h_rr))
        self.assertGreater(single, 0.5)  # the workload repeats: a memo must hit
        self.assertLessEqual(abs(hashed - single), 0.05)

    # -- d: a replica dies under load ----------------------------------------------------------

    def test_d_sigkill_of_a_replica_under_load_loses_no_acknowledged_key(self):
        victim = self.replicas[2]
        survivors = self.replicas[:2]
        for k in range(4):
            self.replicas[0].keys.CreateKey(pb.keys.CreateKeyRequest(
                key_id="d-load-%d" % k, type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305), timeout=10)
        for k in range(4):
            self.wait_all(self.has_key("d-load-%d" % k), PROPAGATION_BOUND_S, "created key")

        stop = threading.Event()
        lock = threading.Lock()
        acked, errors = [], []  # errors: (monotonic time the failed call started, what)

        def creator(t):
            i = 0
            while not stop.is_set():
                key_id = "d-%d-%04d" % (t, i)
                i += 1
                started = time.monotonic()
                try:
                    self.via_hash.keys.CreateKey(pb.keys.CreateKeyRequest(
                        key_id=key_id, type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305), timeout=60,
                        metadata=self.md(key_id))
                    with lock:
                        acked.append(key_id)
                except grpc.RpcError as e:
                    with lock:
                        errors.append((started, "create %s: %s %s"
                                       % (key_id, e.code(), e.details())))

        def sealer(t):
            i = 0
            while not stop.is_set():
                key_id = "d-load-%d" % (i % 4)
                i += 1
                started = time.monotonic()
                try:
                    env = self.via_hash.aead.Seal(pb.aead.AeadSealRequest(
                        key_id=key_id, plaintext=b"p"), timeout=60, metadata=self.md(key_id))
                    started = time.monotonic()
                    self.via_hash.aead.Open(pb.aead.AeadOpenRequest(
                        key_id=key_id, envelope=env.envelope), timeout=60, metadata=self.md(key_id))
                except grpc.RpcError as e:
                    with lock:
                        errors.append((started, "seal %s: %s %s"
                                       % (key_id, e.code(), e.details())))

        threads = harness.thread_run(creator, 2) + harness.thread_run(sealer, 2)

        def wait_acked(n):  # until `n` keys are acknowledged, 60 s at most
            give_up = time.monotonic() + 60
            while time.monotonic() < give_up:
                with lock:
                    if len(acked) >= n:
                        break
                time.sleep(0.02)
            with lock:
                return len(acked)

        acked_before_kill = wait_acked(20)
        t_kill = time.monotonic()
        victim.kill()  # SIGKILL
        wait_acked(acked_before_kill + 20)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(timeout=90)
        # Calls that started before the kill, or as nginx was finding out (its first failed
        # attempt on the dead replica marks it down), may fail; calls started later may not, however
        # long they take.
        grace = 0.5
        late = ["started %+.3fs after the kill: %s" % (when - t_kill, what) for when, what in errors
                if when > t_kill + grace]
        if late:
            print("nginx error log:\n" + self.nginx.log_tail(), file=sys.stderr)
        print("scale-out d: %d keys acknowledged (%d before the SIGKILL), %d calls failed "
              "(all started within %.1fs of the kill: %s)"
              % (len(acked), acked_before_kill, len(errors), grace, not late), file=sys.stderr)
        self.assertGreater(acked_before_kill, 0)
        self.assertGreater(len(acked) - acked_before_kill, 0, "no key acknowledged after the kill")
        self.assertEqual(late, [], "calls failed after the kill")

        # Every acknowledged key is in PostgreSQL and served by each survivor and through nginx.
        stored = set(self.pg.psql("SELECT key_id FROM offload_keys").split())
        self.assertEqual(sorted(set(acked) - stored), [], "acknowledged keys missing in the store")
        deadline = time.monotonic() + PROPAGATION_BOUND_S
        for r in survivors:
            while True:
                listed = {k.key_id for k in r.keys.ListKeys(pb.keys.ListKeysRequest(),
                                                            timeout=10).keys}
                missing = sorted(set(acked) - listed)
                if not missing or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            self.assertEqual(missing, [], "%s lacks acknowledged keys" % r.name)
            self.assertEqual(r.health_status(), pb.health.HealthCheckResponse.SERVING)
        for key_id in acked:
            self.via_hash.aead.Seal(pb.aead.AeadSealRequest(key_id=key_id, plaintext=b"after"),
                                    timeout=5, metadata=self.md(key_id))

    # -- e: configuration mistakes are refused at start -----------------------------------------

    def test_e_postgres_store_refuses_a_per_replica_kek_and_unknown_stores(self):
        binary = os.environ["OFFLOAD_SERVER"]
        env = {k: v for k, v in os.environ.items() if k != "OFFLOAD_KEK"}
        data = tempfile.mkdtemp(prefix="offload-scale-")
        self.addCleanup(shutil.rmtree, data, True)
        common = [binary, "--grpc_address=127.0.0.1:0", "--http_address=", "--metrics_address=",
                  "--data_dir=" + data, "--backend=libsodium"]
        # No KEK given: the file store would generate one; replicas of a shared store must not.
        run = subprocess.run(common + ["--keystore=postgres"], env=env, capture_output=True,
                             text=True, timeout=60)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("same KEK on every replica", run.stderr + run.stdout)
        self.assertFalse(os.path.exists(os.path.join(data, "kek")), "a KEK was generated")
        env["OFFLOAD_KEK"] = secrets.token_hex(32)
        run = subprocess.run(common + ["--keystore=etcd"], env=env, capture_output=True,
                             text=True, timeout=60)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("keystore: expected file or postgres", run.stderr + run.stdout)
        # An unreachable database: a clear error, without the password.
        bad_env = dict(env, OFFLOAD_POSTGRES_DSN="host=127.0.0.1 port=%d user=u "
                       "password=not-this-one connect_timeout=5" % harness.free_port())
        run = subprocess.run(common + ["--keystore=postgres"], env=bad_env, capture_output=True,
                             text=True, timeout=60)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("postgres:host=127.0.0.1", run.stderr + run.stdout)
        self.assertNotIn("not-this-one", run.stderr + run.stdout)


if __name__ == "__main__":
    unittest.main()
