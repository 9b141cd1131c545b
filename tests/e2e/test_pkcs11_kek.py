"""A key-encryption key that never sits in a file (issue 26): --kek_pkcs11 with Debian's SoftHSM2.

A token is initialised in a temporary folder (SOFTHSM2_CONF, inherited by every process started
here) and its AES-256 KEK is generated inside it by `offload_server --kek_pkcs11_create`
(C_GenerateKey). Then:

  file store   the server starts with its KEK in the token, serves, restarts and still serves the
               same keys; a rotation (a second KEK generated in the token while client threads
               keep calling) fails no call, re-wraps keys.db under the new KEK (the file names
               it), and loses no key (checked after another restart)
  errors       a wrong PIN and a missing token each stop the start: nonzero exit, and a log line
               naming the problem (never the PIN)
  postgres     two replicas on one PostgreSQL (tests/integration/pg_support.py) and one token:
               a rotation while both serve fails no call; every row ends up naming the new KEK
  pin-value    a PIN given in the URI (pin-value=) serves, and is gone from the command line
               (/proc/PID/cmdline, what `ps` shows), from the log, and from the process's memory
               as part of the URI (issue 33)

Run: OFFLOAD_SERVER=build/bin/offload_server /usr/bin/python3 -m unittest -v test_pkcs11_kek.py
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import harness
from harness import pb

MODULE = "/usr/lib/softhsm/libsofthsm2.so"
PIN = "e2e-pin-2468"
REFRESH = "0.3s"
HERE = os.path.dirname(os.path.abspath(__file__))


def have_softhsm():
    return os.access(MODULE, os.R_OK) and shutil.which("softhsm2-util") is not None


class Token:
    """A SoftHSM2 token in a temporary folder, with a PIN file."""

    def __init__(self, label="offload"):
        self.dir = tempfile.mkdtemp(prefix="softhsm-", dir=harness._WORK)
        os.mkdir(os.path.join(self.dir, "tokens"), 0o700)
        conf = os.path.join(self.dir, "softhsm2.conf")
        with open(conf, "w") as f:
            f.write("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n"
                    % os.path.join(self.dir, "tokens"))
        os.environ["SOFTHSM2_CONF"] = conf
        subprocess.run(["softhsm2-util", "--init-token", "--free", "--label", label,
                        "--pin", PIN, "--so-pin", "e2e-so-1357"], check=True,
                       capture_output=True, timeout=60)
        self.pin_file = os.path.join(self.dir, "pin")
        with open(self.pin_file, "w") as f:
            f.write(PIN + "\n")
        os.chmod(self.pin_file, 0o600)
        self.label = label

    def uri(self, token=None, pin_file=None):
        return "pkcs11:token=%s;object=offload-kek?module-path=%s&pin-source=%s" % (
            token or self.label, MODULE, pin_file or self.pin_file)

    def create_kek(self):
        run = subprocess.run([os.environ["OFFLOAD_SERVER"], "--kek_pkcs11=" + self.uri(),
                              "--kek_pkcs11_create"], capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            raise AssertionError("--kek_pkcs11_create failed: %s" % run.stderr)
        return run.stdout.strip()


def envelope_kek_name(blob):
    """The KEK name in a format 2 envelope (service/keys/envelope.h)."""
    assert blob[:4] == b"OFKS", blob[:8]
    if blob[4] == 1:
        return "raw:" + blob[8:16].hex()
    assert blob[4] == 2, blob[4]
    return blob[8:8 + blob[6]].decode()


class Caller:
    """Client threads that keep signing, opening and creating keys until stopped; every failure
    is kept."""

    def __init__(self, servers, threads=3):
        self.servers = servers
        self.stop = threading.Event()
        self.errors = []
        self.calls = 0
        self.created = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(threads)]

    def run(self, i):
        n = 0
        while not self.stop.is_set():
            server = self.servers[n % len(self.servers)]
            n += 1
            try:
                server.ed.Sign(pb.ed.SignRequest(key_id="ed", message=b"m%d" % n), timeout=10)
                env = server.aead.Seal(pb.aead.AeadSealRequest(key_id="ae", plaintext=b"p%d" % n),
                                       timeout=10).envelope
                server.aead.Open(pb.aead.AeadOpenRequest(key_id="ae", envelope=env), timeout=10)
                if n % 5 == 0:
                    key_id = "during-%d-%d" % (i, n)
                    server.keys.CreateKey(pb.keys.CreateKeyRequest(
                        key_id=key_id, type=pb.keys.KEY_TYPE_X25519), timeout=10)
                    with self.lock:
                        self.created.append(key_id)
                with self.lock:
                    self.calls += 1
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with self.lock:
                    self.errors.append(repr(e))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


def failed_start(args, data_dir):
    """Runs the server with `args` and expects it to stop on its own: (exit code, output)."""
    cmd = [os.environ["OFFLOAD_SERVER"], "--data_dir=" + data_dir, "--grpc_address=127.0.0.1:0",
           "--http_address=", "--metrics_address="] + args
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return run.returncode, run.stdout + run.stderr


@unittest.skipUnless(have_softhsm(), "softhsm2 is not installed (scripts/install-deps.sh)")
class Pkcs11KekFileStoreTest(harness.ServerTestCase):
    def test_start_serve_restart_rotate(self):
        token = Token()
        first = token.create_kek()
        self.assertEqual(first, "pkcs11:offload-kek/0000000000000001")
        args = ["--kek_pkcs11=" + token.uri(), "--kek_refresh_interval=" + REFRESH]
        server = harness.Server("p11", args=args)
        self.servers = [server]
        server.start()
        K = pb.keys
        server.keys.CreateKey(K.CreateKeyRequest(key_id="ed", type=K.KEY_TYPE_ED25519), timeout=10)
        server.keys.CreateKey(K.CreateKeyRequest(key_id="ae", type=K.KEY_TYPE_XCHACHA20_POLY1305),
                              timeout=10)
        signature = server.ed.Sign(pb.ed.SignRequest(key_id="ed", message=b"hello"),
                                   timeout=10).signature
        env = server.aead.Seal(pb.aead.AeadSealRequest(key_id="ae", plaintext=b"secret"),
                               timeout=10).envelope
        db = os.path.join(server.data_dir, "keys.db")
        with open(db, "rb") as f:
            self.assertEqual(envelope_kek_name(f.read()), first)
        log = "\n".join(server.log_lines())
        self.assertNotIn(PIN, log)

        # Restart: the same keys, from the token's KEK.
        server.stop()
        server = harness.Server("p11b", data_dir=server.data_dir, args=args)
        self.servers = [server]
        server.start()
        self.assertEqual(server.ed.Sign(pb.ed.SignRequest(key_id="ed", message=b"hello"),
                                        timeout=10).signature, signature)
        self.assertEqual(server.aead.Open(pb.aead.AeadOpenRequest(key_id="ae", envelope=env),
                                          timeout=10).plaintext, b"secret")

        # Rotation while calls run.
        with Caller([server]) as caller:
            time.sleep(1.0)
            second = token.create_kek()
            self.assertEqual(second, "pkcs11:offload-kek/0000000000000002")

            def rewrapped():
                with open(db, "rb") as f:
                    return envelope_kek_name(f.read()) == second
            wait_for(rewrapped, 30, "keys.db re-wrapped under " + second)
            time.sleep(1.0)
        self.assertEqual(caller.errors, [], server.log_tail())
        self.assertGreater(caller.calls, 10)
        self.assertTrue(any("kek_rotated" in line and second in line
                            for line in server.log_lines()), server.log_tail())
        print("\npkcs11 rotation (file store): %d calls, %d keys created during it, 0 failed"
              % (caller.calls, len(caller.created)))

        # Nothing lost: restart, every key is there and works.
        server.stop()
        server = harness.Server("p11c", data_dir=server.data_dir, args=args)
        self.servers = [server]
        server.start()
        self.assertEqual(server.ed.Sign(pb.ed.SignRequest(key_id="ed", message=b"hello"),
                                        timeout=10).signature, signature)
        self.assertEqual(server.aead.Open(pb.aead.AeadOpenRequest(key_id="ae", envelope=env),
                                          timeout=10).plaintext, b"secret")
        for key_id in caller.created:
            server.keys.GetKey(K.GetKeyRequest(key_id=key_id), timeout=10)
        server.stop()

    def test_a_pin_value_is_scrubbed_from_the_command_line_and_memory(self):
        token = Token()
        token.create_kek()
        uri = "pkcs11:token=%s;object=offload-kek?pin-value=%s&module-path=%s" % (
            token.label, PIN, MODULE)
        server = harness.Server("p11-pin-value", args=[
            "--kek_pkcs11=" + uri, "--allow_core_dumps"])  # /proc/PID/mem readable here
        self.servers = [server]
        server.start()
        try:
            K = pb.keys
            server.keys.CreateKey(K.CreateKeyRequest(key_id="ed", type=K.KEY_TYPE_ED25519),
                                  timeout=10)
            server.ed.Sign(pb.ed.SignRequest(key_id="ed", message=b"m"), timeout=10)
            with open("/proc/%d/cmdline" % server.proc.pid, "rb") as f:
                cmdline = f.read()
            self.assertIn(b"--kek_pkcs11=pkcs11:token=", cmdline)
            self.assertIn(b"module-path=" + MODULE.encode(), cmdline)
            self.assertNotIn(PIN.encode(), cmdline)
            # The server's own lines (the first is the harness's note of the command it ran).
            self.assertNotIn(PIN, "\n".join(server.log_lines()[1:]))
            if not harness.SANITIZED:  # a sanitizer's shadow memory is terabytes to read
                self.assertEqual(
                    harness.memory_hits(server.proc.pid, b"pin-value=" + PIN.encode()), [])
        finally:
            server.stop()

    def test_wrong_pin_and_missing_token_stop_the_start(self):
        token = Token()
        token.create_kek()
        data_dir = tempfile.mkdtemp(prefix="p11-bad-", dir=harness._WORK)
        wrong = os.path.join(token.dir, "wrong-pin")
        with open(wrong, "w") as f:
            f.write("not-the-pin-1122\n")
        os.chmod(wrong, 0o644)
        rc, out = failed_start(["--kek_pkcs11=" + token.uri(pin_file=wrong)], data_dir)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("accessible by group or others", out)  # a readable PIN file: refused
        os.chmod(wrong, 0o600)
        rc, out = failed_start(["--kek_pkcs11=" + token.uri(pin_file=wrong)], data_dir)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("wrong PIN", out)
        self.assertNotIn("not-the-pin-1122", out)
        rc, out = failed_start(["--kek_pkcs11=" + token.uri(token="absent")], data_dir)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("no token matches", out)
        self.assertIn('tokens present: token \\"offload\\"', out)  # lists what is there
        self.assertFalse(os.path.exists(os.path.join(data_dir, "keys.db")))


@unittest.skipUnless(have_softhsm(), "softhsm2 is not installed (scripts/install-deps.sh)")
class Pkcs11KekPostgresTest(harness.ServerTestCase):
    def test_rotation_with_two_replicas(self):
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
        import pg_support  # noqa: E402
        if pg_support.find_bindir() is None:
            self.skipTest("no PostgreSQL under /usr/lib/postgresql")
        pg = pg_support.Postgres().start()
        self.addCleanup(pg.close)
        os.environ["OFFLOAD_POSTGRES_DSN"] = pg.dsn
        token = Token()
        first = token.create_kek()
        args = ["--keystore=postgres", "--kek_pkcs11=" + token.uri(),
                "--kek_refresh_interval=" + REFRESH]
        replicas = [harness.Server("p11pg%d" % i, args=args) for i in range(2)]
        self.servers = replicas
        harness.start_together(replicas)
        K = pb.keys
        a, b = replicas
        a.keys.CreateKey(K.CreateKeyRequest(key_id="ed", type=K.KEY_TYPE_ED25519), timeout=10)
        a.keys.CreateKey(K.CreateKeyRequest(key_id="ae", type=K.KEY_TYPE_XCHACHA20_POLY1305),
                         timeout=10)
        wait_for(lambda: self._served(b), 10, "the keys to reach the second replica")

        def row_keks():
            out = pg.psql("SELECT encode(record, 'hex') FROM offload_keys")
            return {envelope_kek_name(bytes.fromhex(line)) for line in out.splitlines() if line}
        self.assertEqual(row_keks(), {first})

        with Caller(replicas, threads=4) as caller:
            time.sleep(1.0)
            second = token.create_kek()
            wait_for(lambda: row_keks() == {second}, 30, "every row re-wrapped under " + second)
            time.sleep(1.0)
        self.assertEqual(caller.errors, [], a.log_tail() + b.log_tail())
        self.assertEqual(row_keks(), {second})
        for r in replicas:
            self.assertTrue(any("kek_rotated" in line for line in r.log_lines()), r.log_tail())
        print("\npkcs11 rotation (postgres, 2 replicas): %d calls, %d keys created, 0 failed"
              % (caller.calls, len(caller.created)))
        harness.stop_together(replicas)

        # A fresh replica loads every key.
        fresh = harness.Server("p11pg-fresh", args=args)
        self.servers = [fresh]
        fresh.start()
        for key_id in ["ed", "ae"] + caller.created:
            fresh.keys.GetKey(K.GetKeyRequest(key_id=key_id), timeout=10)
        fresh.stop()

    @staticmethod
    def _served(server):
        try:
            server.ed.Sign(pb.ed.SignRequest(key_id="ed", message=b"x"), timeout=5)
            server.aead.Seal(pb.aead.AeadSealRequest(key_id="ae", plaintext=b"x"), timeout=5)
            return True
        except Exception:  # noqa: BLE001
            return False


if __name__ == "__main__":
    unittest.main()
