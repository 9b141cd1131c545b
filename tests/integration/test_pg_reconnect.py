"""Replicas on a PostgreSQL key store keep working when PostgreSQL drops their connections.

Real processes on loopback, all started here: PostgreSQL (Debian's, initdb in a temporary folder,
see pg_support.py) and three offload_server replicas with --keystore=postgres. Each replica holds
two connections: the key store's and the change listener's (LISTEN offload_key_changes).

  a  pg_terminate_backend of every client session (what a failover, a pooler's idle timeout or
     an operator does): the first CreateKey, RotateKey and DeleteKey afterwards, each through
     another replica and each after its own termination, succeed; the change reaches the other
     replicas
  b  the same after a restart of PostgreSQL (fast shutdown, start on the same port and data)

  c  PostgreSQL stopped: a key change through a replica is refused UNAVAILABLE "key store
     unavailable" with a retry delay, nothing of the store's address or libpq's message (those
     are in the replica's log); keys already held still serve; after the restart a change goes
     through

a and b check the answers (no UNAVAILABLE, the store holds what was acknowledged), that no
replica's log reports a failed resync or reload (the listener resyncs on a fresh connection),
and how long each change took to reach the other replicas: printed against the 1 s the issue
asks for, asserted within PROPAGATION_BOUND_S (a bound loose enough for a busy machine; the
printed figures are the measure).

Run: OFFLOAD_SERVER=build/bin/offload_server /usr/bin/python3 -m unittest -v test_pg_reconnect.py
     (from tests/integration; ctest sets the variables)
"""

import json
import os
import secrets
import sys
import time
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

import harness  # noqa: E402
from harness import pb, retry_delay_ms  # noqa: E402
import pg_support  # noqa: E402

REPLICAS = 3
PROPAGATION_TARGET_S = 1.0  # issue 14: a change reaches the other replicas within 1 s
PROPAGATION_BOUND_S = 5.0   # what the test asserts (a loaded machine may be slower than 1 s)
# Log events that mean a replica used a dead connection, or missed a change for a while.
BAD_EVENTS = ("keystore_resync_failed", "keystore_reload_failed")


class PostgresReconnectTest(harness.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        t0 = time.monotonic()
        cls.pg = pg_support.start_for_class(cls)
        kek = secrets.token_hex(32)
        cls.replicas = [harness.Server("pgr%d" % i, backend="libsodium", kek_hex=kek,
                                       args=["--keystore=postgres", "--key_deletion_wait=0"])
                        for i in range(REPLICAS)]
        cls.servers = cls.replicas
        for r in cls.replicas:
            cls.addClassCleanup(r.kill)
        cls.addClassCleanup(cls.stop_replicas)
        harness.start_together(cls.replicas)
        cls.figures = []
        print("\npg-reconnect: postgres and %d replicas up in %.1fs"
              % (REPLICAS, time.monotonic() - t0), file=sys.stderr)

    @classmethod
    def stop_replicas(cls):
        harness.stop_together(cls.replicas)

    # -- helpers -----------------------------------------------------------------------------

    def terminate_sessions(self):
        """pg_terminate_backend of every client session but psql's own, waiting (up to 5 s each)
        until each has exited. Returns how many were terminated."""
        out = self.pg.psql(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
        return int(out)

    def sessions(self):
        return int(self.pg.psql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                                "'client backend' AND pid <> pg_backend_pid()"))

    @staticmethod
    def key_version(r, key_id):
        """The replica's current version of `key_id`, None when it has no such key."""
        try:
            return r.keys.GetKey(pb.keys.GetKeyRequest(key_id=key_id), timeout=5).current_version
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def wait_others(self, writer, key_id, version, what):
        """Seconds until every replica but `writer` holds `key_id` at `version` (None: absent)."""
        t0 = time.monotonic()
        pending = [r for r in self.replicas if r is not writer]
        while pending:
            pending = [r for r in pending if self.key_version(r, key_id) != version]
            took = time.monotonic() - t0
            if pending and took > PROPAGATION_BOUND_S:
                self.fail("%s: not on %s after %.1fs" % (what, [r.name for r in pending], took))
            if pending:
                time.sleep(0.005)
        took = time.monotonic() - t0
        self.figures.append((what, took))
        print("pg-reconnect: %-42s reached the other replicas in %.3fs (target %.1fs: %s)"
              % (what, took, PROPAGATION_TARGET_S,
                 "met" if took <= PROPAGATION_TARGET_S else "MISSED"), file=sys.stderr)
        return took

    def stored_version(self, key_id):
        out = self.pg.psql("SELECT current_version FROM offload_keys WHERE key_id = '%s'" % key_id)
        return int(out) if out else None

    def log_marks(self):
        return [len(r.log_lines()) for r in self.replicas]

    @staticmethod
    def store_failure(lines, mark, i):
        """The error the key store logged for the call behind bad event lines[i]: the listener's
        reload (on_change -> Load, call "load") or resync (on_resync -> LoadAll, call "load
        all") logs keystore_unavailable with the store's detail just before the listener logs
        the bad event, whose own error is only "key store unavailable" (the store gives its
        callers no more, see PostgresKeyStore::ForCaller). Only lines[mark:i] are searched,
        backwards from the bad event, and the search stops at the first store failure of any
        call (keystore_unavailable or keystore_error) or at an earlier bad event: that line is
        the cause only if it is keystore_unavailable of the bad event's call. None otherwise (no
        such line, or another call's, or another failure's: an older line excuses nothing)."""
        call = "load" if "keystore_reload_failed" in lines[i] else "load all"
        for line in reversed(lines[mark:i]):
            if any(e in line for e in BAD_EVENTS):
                return None
            try:
                event = json.loads(line)
            except ValueError:
                continue
            name = event.get("event")
            if name in ("keystore_unavailable", "keystore_error"):
                if name == "keystore_unavailable" and event.get("call") == call:
                    return event.get("error", "")
                return None
        return None

    def assert_no_bad_events(self, marks, heal_timeout=10.0):
        deadline = time.monotonic() + heal_timeout
        for r, mark in zip(self.replicas, marks):
            while True:
                lines = r.log_lines()
                bad, unhealed = [], []
                for i in range(mark, len(lines)):
                    line = lines[i]
                    if not any(e in line for e in BAD_EVENTS):
                        continue
                    # A reload (queued by a NOTIFY before a PostgreSQL restart) or a resync (of a
                    # listener that reconnected while PostgreSQL was shutting down) that runs
                    # while PostgreSQL is down cannot connect: no dead connection was used (a
                    # session the restart closed during the call is retried once on a new one,
                    # keystore_retry, and it is that new connection that fails to connect), and
                    # the resync after the listener's next reconnect heals it (required here; it
                    # may come after the last call of the test, so it is waited for). The store's
                    # detail ("postgres: connect: ...") is on its keystore_unavailable line, not
                    # on the listener's: a query that failed on a dead connection says no
                    # "connect:" there and stays a failure.
                    cause = self.store_failure(lines, mark, i)
                    if cause is not None and "postgres: connect:" in cause:
                        if not any("keys_resynced" in later for later in lines[i + 1:]):
                            unhealed.append(line)
                        continue
                    bad.append("%s (store: %s)" % (line, cause))
                self.assertEqual(bad, [], "%s used a dead connection" % r.name)
                if not unhealed or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(unhealed, [], "%s: no resync after these failures within %.0fs"
                             % (r.name, heal_timeout))

    def run_key_lifecycle(self, prefix, disrupt):
        """CreateKey through replica 0, RotateKey through 1, DeleteKey through 2, each the first
        call after `disrupt()`; every change must reach the other replicas."""
        r0, r1, r2 = self.replicas
        key_id = "%s-key" % prefix
        marks = self.log_marks()

        disrupt("create")
        info = r0.keys.CreateKey(pb.keys.CreateKeyRequest(
            key_id=key_id, type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305), timeout=10)
        self.assertEqual(info.current_version, 1)
        self.assertEqual(self.stored_version(key_id), 1)
        self.wait_others(r0, key_id, 1, "%s: CreateKey" % prefix)

        disrupt("rotate")
        info = r1.keys.RotateKey(pb.keys.RotateKeyRequest(key_id=key_id), timeout=10)
        self.assertEqual(info.current_version, 2)
        self.assertEqual(self.stored_version(key_id), 2)
        self.wait_others(r1, key_id, 2, "%s: RotateKey" % prefix)
        # Every replica seals with the new version (the key material arrived, not just a number).
        for r in self.replicas:
            env = r.aead.Seal(pb.aead.AeadSealRequest(key_id=key_id, plaintext=b"p"),
                              timeout=5).envelope
            self.assertEqual(int.from_bytes(env[1:5], "big"), 2, r.name)

        disrupt("delete")
        r2.keys.DeleteKey(pb.keys.DeleteKeyRequest(key_id=key_id), timeout=10)
        self.assertIsNone(self.stored_version(key_id))
        self.wait_others(r2, key_id, None, "%s: DeleteKey" % prefix)

        self.assert_no_bad_events(marks)
        for r in self.replicas:
            self.assertEqual(r.health_status(), pb.health.HealthCheckResponse.SERVING, r.name)

    # -- a: sessions terminated ----------------------------------------------------------------

    def test_a_first_writes_after_pg_terminate_backend_succeed(self):
        # Each replica holds its store's and its listener's connection.
        self.assertGreaterEqual(self.sessions(), REPLICAS)

        def disrupt(what):
            # The writer's store session too: it reconnected when it reloaded the last change.
            n = self.terminate_sessions()
            self.assertGreaterEqual(n, REPLICAS, "terminated sessions before %s" % what)
        self.run_key_lifecycle("term", disrupt)

    # -- b: PostgreSQL restarted ---------------------------------------------------------------

    def test_b_first_writes_after_a_postgres_restart_succeed(self):
        def disrupt(what):
            t0 = time.monotonic()
            self.pg.restart()
            print("pg-reconnect: restart before %s took %.2fs" % (what, time.monotonic() - t0),
                  file=sys.stderr)
        self.run_key_lifecycle("restart", disrupt)

    # -- c: PostgreSQL down ----------------------------------------------------------------------

    def test_c_key_calls_while_postgres_is_down_say_only_unavailable(self):
        r0 = self.replicas[0]
        r0.keys.CreateKey(pb.keys.CreateKeyRequest(
            key_id="down-key", type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305), timeout=10)
        mark = len(r0.log_lines())
        self.pg.stop()
        try:
            calls = (
                (r0.keys.CreateKey, pb.keys.CreateKeyRequest(
                    key_id="down-new", type=pb.keys.KEY_TYPE_ED25519)),
                (r0.keys.RotateKey, pb.keys.RotateKeyRequest(key_id="down-key")),
            )
            for call, request in calls:
                e = harness.rpc_error(call, request, timeout=10)
                self.assertIsNotNone(e, "a key change succeeded with PostgreSQL down")
                # The caller (anonymous here) learns that the store is unavailable and when to
                # come back, not where the store is nor what libpq said.
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
                self.assertEqual(e.details(), "key store unavailable")
                delay = retry_delay_ms(e)
                self.assertIsNotNone(delay, "no RetryInfo")
                self.assertTrue(100 <= delay <= 10000, delay)
            # The detail is in the server's log.
            logged = [line for line in r0.log_lines()[mark:] if "keystore_unavailable" in line]
            self.assertTrue(logged, "no keystore_unavailable line")
            self.assertIn("port=%d" % self.pg.port, logged[0])
            self.assertIn("connect", logged[0])
            self.assertNotIn(self.pg.password, "".join(r0.log_lines()))
            # Keys already held still serve.
            r0.aead.Seal(pb.aead.AeadSealRequest(key_id="down-key", plaintext=b"p"), timeout=5)
        finally:
            self.pg.restart()
        # Back: the next change goes through.
        deadline = time.monotonic() + 10
        while True:
            e = harness.rpc_error(r0.keys.RotateKey, pb.keys.RotateKeyRequest(key_id="down-key"),
                                  timeout=10)
            if e is None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertIsNone(e)
        self.assertEqual(self.stored_version("down-key"), 2)


if __name__ == "__main__":
    unittest.main()
