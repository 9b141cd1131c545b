"""A throwaway PostgreSQL for tests: Debian's postgresql binaries, a cluster made by initdb in a
temporary folder, listening on 127.0.0.1 at a free port and on a Unix socket in that folder.

    from pg_support import Postgres
    with Postgres() as pg:
        os.environ["OFFLOAD_POSTGRES_DSN"] = pg.dsn        # password auth over 127.0.0.1
        ...

Or as a wrapper around a command, which gets the server's address in OFFLOAD_POSTGRES_DSN:
    /usr/bin/python3 pg_support.py run -- ./offload_postgres_key_store_test

initdb and postgres refuse to run as root: when the test runs as root (CI), they run as the
`postgres` system user that the Debian package creates (setpriv), in a folder that user owns.
Local connections (Unix socket) are trusted; TCP connections need the superuser's password
(scram-sha-256), which `dsn` carries and `admin_dsn` (socket) does not. fsync is off: the tests
kill our servers, never PostgreSQL, and a test database needs no protection from power loss.
"""

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

START_TIMEOUT_S = 30.0
USER = "offload"


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loopback_ports import free_port as _free_port  # noqa: E402  (below the ephemeral range)


def find_bindir():
    """The newest /usr/lib/postgresql/<major>/bin that has initdb and postgres, or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                        key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0)
    for bindir in reversed(candidates):
        if all(os.access(os.path.join(bindir, b), os.X_OK) for b in ("initdb", "postgres")):
            return bindir
    return None


class Postgres:
    def __init__(self):
        self.bindir = find_bindir()
        if self.bindir is None:
            raise RuntimeError("no PostgreSQL under /usr/lib/postgresql (Debian package "
                               "postgresql; scripts/install-deps.sh installs it)")
        self.port = None
        self.proc = None
        self.password = secrets.token_hex(16)
        self.as_root = os.getuid() == 0
        # As root, the folder must be reachable by the postgres user: /tmp, not some private TMPDIR.
        self.dir = tempfile.mkdtemp(prefix="offload-pg-", dir="/tmp" if self.as_root else None)
        self.data = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "postgres.log")

    # Runs argv as the postgres user when we are root.
    def _argv(self, argv):
        if not self.as_root:
            return argv
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise RuntimeError("running as root but there is no `postgres` user to run "
                               "PostgreSQL as (Debian's postgresql package creates it)")
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"] + argv

    def start(self):
        if self.as_root:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        pwfile = os.path.join(self.dir, "pwfile")
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.password + "\n")
        if self.as_root:
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        run = subprocess.run(
            self._argv([os.path.join(self.bindir, "initdb"), "-D", self.data, "-U", USER,
                        "--pwfile=" + pwfile, "--auth-local=trust",
                        "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8",
                        "--locale=C"]),
            cwd=self.dir, capture_output=True, text=True)
        os.unlink(pwfile)
        if run.returncode != 0:
            raise RuntimeError("initdb failed (%d):\n%s%s" % (run.returncode, run.stdout, run.stderr))
        for attempt in range(5):
            self.port = _free_port()
            if self._launch():
                return self
            if "could not bind" not in self.log_tail():
                break
        raise RuntimeError("postgres did not start\n" + self.log_tail())

    def _launch(self):
        """Starts postgres on self.port and waits until it accepts connections (False if not)."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self._argv([os.path.join(self.bindir, "postgres"), "-D", self.data,
                        "-p", str(self.port), "-k", self.dir,
                        "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                        "-c", "max_connections=100", "-c", "shared_buffers=16MB"]),
            cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        if self._wait_ready():
            return True
        self.stop()
        return False

    def restart(self):
        """Fast shutdown (every session is terminated) and a start on the same port and data, as
        an operator's restart or a failover to the same address. Returns once it accepts
        connections."""
        self.stop()
        for attempt in range(50):  # the port may be briefly unbindable after the shutdown
            if self._launch():
                return self
            if "could not bind" not in self.log_tail(5):
                break
            time.sleep(0.1)
        raise RuntimeError("postgres did not restart\n" + self.log_tail())

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        isready = os.path.join(self.bindir, "pg_isready")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            run = subprocess.run([isready, "-q", "-h", self.dir, "-p", str(self.port), "-U", USER,
                                  "-d", "postgres"], capture_output=True)
            if run.returncode == 0:
                return True
            time.sleep(0.05)
        return False

    @property
    def dsn(self):
        """Keyword-form connection string over TCP 127.0.0.1, with the password."""
        return "host=127.0.0.1 port=%d user=%s password=%s dbname=postgres" % (
            self.port, USER, self.password)

    @property
    def admin_dsn(self):
        """Over the Unix socket (trusted, no password)."""
        return "host=%s port=%d user=%s dbname=postgres" % (self.dir, self.port, USER)

    def psql(self, sql):
        """Runs `sql` with psql over the socket; returns stdout (unaligned, tuples only)."""
        run = subprocess.run([os.path.join(self.bindir, "psql"), "-X", "-A", "-t", "-q",
                              "-v", "ON_ERROR_STOP=1", "-d", self.admin_dsn, "-c", sql],
                             capture_output=True, text=True, timeout=30)
        if run.returncode != 0:
            raise RuntimeError("psql failed: %s\n%s" % (sql, run.stderr))
        return run.stdout.strip()

    def log_tail(self, lines=30):
        try:
            with open(self.log_path, "rb") as f:
                data = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return "(no postgres log)"
        return "\n".join(data[-lines:])

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc):
        self.close()


def start_for_class(test_class):
    """A PostgreSQL for a test class's servers: started, closed by the class's cleanup, and its
    DSN (with its password) in OFFLOAD_POSTGRES_DSN - by environment, never on a command line -
    where `--keystore=postgres` servers read it. Returns it."""
    pg = Postgres().start()
    test_class.addClassCleanup(pg.close)
    os.environ["OFFLOAD_POSTGRES_DSN"] = pg.dsn
    return pg


def main(argv):
    if len(argv) < 3 or argv[1] != "run" or argv[2] != "--" or len(argv) < 4:
        sys.stderr.write("usage: pg_support.py run -- <command> [args...]\n")
        return 2
    with Postgres() as pg:
        env = dict(os.environ, OFFLOAD_POSTGRES_DSN=pg.dsn)
        rc = subprocess.run(argv[3:], env=env).returncode
        if rc != 0:
            sys.stderr.write("---- postgres log (tail) ----\n%s\n" % pg.log_tail())
        return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
