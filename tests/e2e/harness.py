"""End-to-end harness: runs a real offload_server and talks to it with python3-grpcio.

    from harness import Server, pb
    server = Server("demo", backend="libsodium")
    server.start()                      # returns once grpc.health.v1 reports SERVING for ""
    info = server.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="k", type=pb.keys.KEY_TYPE_ED25519))
    server.stop()                       # SIGTERM, asserts exit code 0

Configuration comes from the environment (CMake passes it to every e2e test):
  OFFLOAD_SERVER            path of the offload_server binary (required)
  OFFLOAD_PROTO_DIR         the repository's proto/ folder (default: ../../proto from this file)
  OFFLOAD_TESTVECTORS_DIR   the shared test vectors folder (default: ../../../shared/testvectors)
  OFFLOAD_SERVER_EXTRA_ARGS extra flags for every server, split like a shell would
  OFFLOAD_E2E_KEEP          keep server data and log folders after the run when set to 1
  OFFLOAD_SANITIZER         the build's sanitizer (address, thread) or empty: RSS bounds are
                            only checked without one

Python stubs are generated from proto/ at import time (once per process) into a temporary folder
with protoc and Debian's grpc_python_plugin. Run with /usr/bin/python3: the Debian python3-grpcio
and python3-protobuf packages are only visible to it. Everything binds to 127.0.0.1.
"""

import atexit
import contextlib
import importlib
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loopback_ports import free_port  # noqa: E402,F401  (tests use harness.free_port)

HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(HERE))

PROTO_DIR = os.environ.get("OFFLOAD_PROTO_DIR", os.path.join(_REPO, "proto"))
TESTVECTORS_DIR = os.environ.get(
    "OFFLOAD_TESTVECTORS_DIR", os.path.join(os.path.dirname(_REPO), "shared", "testvectors"))
KEEP = os.environ.get("OFFLOAD_E2E_KEEP") == "1"
SANITIZED = bool(os.environ.get("OFFLOAD_SANITIZER"))

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
MAX_MESSAGE = 64 * 1024 * 1024  # client side; the server's own limit is what is under test

# gRPC canonical codes as integers, for batch ItemStatus.code.
OK = 0
CANCELLED = 1
INVALID_ARGUMENT = 3
NOT_FOUND = 5
ALREADY_EXISTS = 6
FAILED_PRECONDITION = 9
RESOURCE_EXHAUSTED = 8
UNAVAILABLE = 14

# Channel options for a channel made before its server listens (Server.start). The first
# connection attempt then fails, and gRPC waits out a reconnect backoff (1 s, growing) and, for
# 127.0.0.1 too, a minimum time between re-resolutions: each start took 5 s of waiting for a
# server that was up in 0.1-0.3 s. With these a start takes what the server takes. Not
# grpc.min_reconnect_backoff_ms: gRPC also uses it as the time a connection attempt (TCP, TLS,
# HTTP/2 settings) may take, and a short one fails handshakes on a busy machine.
FAST_RECONNECT = [
    ("grpc.dns_min_time_between_resolutions_ms", 50),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

_WORK = tempfile.mkdtemp(prefix="offload-e2e-")
_LIVE_SERVERS = []


def _cleanup():
    for server in list(_LIVE_SERVERS):
        server.kill()
    if KEEP:
        sys.stderr.write("e2e: kept %s\n" % _WORK)
    else:
        shutil.rmtree(_WORK, ignore_errors=True)


atexit.register(_cleanup)


# ----------------------------------------------------------------------------------------------
# Stubs generated from proto/ at test time.

def _generate_stubs():
    out = os.path.join(_WORK, "stubs")
    os.makedirs(out)
    protos = sorted(
        os.path.join("offload", "v1", f)
        for f in os.listdir(os.path.join(PROTO_DIR, "offload", "v1")) if f.endswith(".proto"))
    if not protos:
        raise RuntimeError("no .proto files under %s/offload/v1" % PROTO_DIR)
    # google.rpc.Status and RetryInfo: the details of grpc-status-details-bin (proto/google/rpc).
    protos += [os.path.join("google", "rpc", f) for f in ("status.proto", "error_details.proto")]
    common = ["protoc", "--python_out=" + out, "--grpc_out=" + out,
              "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"]
    for cmd in (common + ["-I", PROTO_DIR] + protos,
                common + ["-I", os.path.join(PROTO_DIR, "grpc", "health", "v1"), "health.proto"]):
        run = subprocess.run(cmd, cwd=PROTO_DIR, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError("stub generation failed: %s\n%s" % (" ".join(cmd), run.stderr))
    sys.path.insert(0, out)
    mod = lambda name: importlib.import_module(name)
    return types.SimpleNamespace(
        common=mod("offload.v1.common_pb2"),
        keys=mod("offload.v1.keys_pb2"), keys_grpc=mod("offload.v1.keys_pb2_grpc"),
        ed=mod("offload.v1.ed25519_pb2"), ed_grpc=mod("offload.v1.ed25519_pb2_grpc"),
        x=mod("offload.v1.x25519_pb2"), x_grpc=mod("offload.v1.x25519_pb2_grpc"),
        box=mod("offload.v1.box_pb2"), box_grpc=mod("offload.v1.box_pb2_grpc"),
        aead=mod("offload.v1.aead_pb2"), aead_grpc=mod("offload.v1.aead_pb2_grpc"),
        health=mod("health_pb2"), health_grpc=mod("health_pb2_grpc"),
        rpc_status=mod("google.rpc.status_pb2"), error_details=mod("google.rpc.error_details_pb2"))


pb = _generate_stubs()


# ----------------------------------------------------------------------------------------------
# Small helpers shared by the tests.

def vector_path(*parts):
    return os.path.join(TESTVECTORS_DIR, *parts)


def load_json(*parts):
    with open(vector_path(*parts)) as f:
        return json.load(f)


def h(hexstr):
    return bytes.fromhex(hexstr)


def rpc_error(fn, *args, **kwargs):
    """Calls `fn` and returns the grpc.RpcError it raised, or None if it succeeded."""
    try:
        fn(*args, **kwargs)
    except grpc.RpcError as e:
        return e
    return None


def retry_delay_ms(error):
    """The RetryInfo delay of a gRPC error (its grpc-status-details-bin), in ms, or None."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in pb.rpc_status.Status.FromString(value).details:
                info = pb.error_details.RetryInfo()
                if detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
                    return info.retry_delay.seconds * 1000 + info.retry_delay.nanos / 1e6
    return None


# The listeners of offload_server, by flag; server_started names the port each one bound
# (grpc_port, http_port, metrics_port: 0 for one that is off).
LISTENER_FLAGS = ("grpc_address", "http_address", "metrics_address")


def read_started(log_path):
    """The server_started line in the log at `log_path` as a dict, or None before it."""
    with open(log_path, "rb") as f:
        for line in f:
            if line.startswith(b"{") and b'"event":"server_started"' in line:
                return json.loads(line)
    return None


def wait_started(proc, log_path, timeout=START_TIMEOUT_S):
    """Waits for the server_started line of `proc` (a server writing its log to `log_path`) and
    returns it. Once it is there, that process has bound its ports: what answers on them is that
    server and no other. RuntimeError if the process exits first or the line takes `timeout`
    seconds."""
    deadline = time.monotonic() + timeout
    while True:
        started = read_started(log_path)
        if started is not None:
            return started
        rc = proc.poll()
        if rc is not None:
            raise RuntimeError("exited with code %s before server_started" % rc)
        if time.monotonic() > deadline:
            raise RuntimeError("no server_started within %.0fs" % timeout)
        time.sleep(0.02)


def started_ports(started):
    """{listener flag: bound port} from a server_started line (0: that listener is off)."""
    return {flag: int(started.get(flag[:-len("_address")] + "_port") or 0)
            for flag in LISTENER_FLAGS}


_SERVER_FLAGS = None


def server_flags(binary):
    """Flag names that `binary --helpfull` lists (empty if it cannot say)."""
    global _SERVER_FLAGS
    if _SERVER_FLAGS is None:
        names = set()
        for flag in ("--helpfull", "--help"):
            try:
                run = subprocess.run([binary, flag], capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                continue
            import re
            names |= set(re.findall(r"--([a-z][a-z0-9_]*)", run.stdout + run.stderr))
        _SERVER_FLAGS = names
    return _SERVER_FLAGS


# ----------------------------------------------------------------------------------------------
# A process's memory, seen from outside (needs the process dumpable: --allow_core_dumps).

def memory_hits(pid, needle):
    """Every place `needle` (bytes) sits in the readable mappings of process `pid`, as
    [(mapping start, end, perms, path, set(vmflags))], one entry per hit. Reads /proc/PID/smaps
    and /proc/PID/mem (the kernel's own [vvar]/[vsyscall] are skipped)."""
    maps = []
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            parts = line.split()
            head = parts[0] if parts else ""
            if "-" in head and len(parts) >= 5 and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                maps.append([lo, hi, parts[1], parts[5] if len(parts) > 5 else "", set()])
            elif line.startswith("VmFlags:") and maps:
                maps[-1][4].update(line.split()[1:])
    hits = []
    with open("/proc/%d/mem" % pid, "rb", buffering=0) as mem:
        for lo, hi, perms, path, flags in maps:
            if "r" not in perms or path in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
                continue
            step, tail = 1 << 20, b""
            at = lo
            while at < hi:
                try:
                    mem.seek(at)
                    chunk = mem.read(min(step, hi - at))
                except OSError:
                    break
                if not chunk:
                    break
                data = tail + chunk
                start = 0
                while True:
                    i = data.find(needle, start)
                    if i < 0:
                        break
                    hits.append((lo, hi, perms, path, flags))
                    start = i + 1
                tail = data[-(len(needle) - 1):] if len(needle) > 1 else b""
                at += len(chunk)
    return hits


# ----------------------------------------------------------------------------------------------
# The server process.

class Server:
    """One offload_server process on a free loopback port, with a stub per service.

    `data_dir` and `kek_hex` may be passed to restart on the same key store; otherwise each
    Server gets a fresh folder and a random key-encryption key (given as OFFLOAD_KEK).
    """

    def __init__(self, name, backend=None, data_dir=None, kek_hex=None, args=()):
        self.binary = os.environ.get("OFFLOAD_SERVER")
        if not self.binary:
            raise RuntimeError("OFFLOAD_SERVER is not set (path of the offload_server binary)")
        if not os.access(self.binary, os.X_OK):
            raise RuntimeError("OFFLOAD_SERVER=%s is not an executable file" % self.binary)
        self.name = name
        self.backend = backend
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="data-%s-" % name, dir=_WORK)
        self.kek_hex = kek_hex or secrets.token_hex(32)
        self.extra_args = list(args)
        self.proc = None
        self.channel = None
        self.address = None
        self.log_path = None
        self.starts = 0

    # -- lifecycle --------------------------------------------------------------------------

    def command(self):
        # Every listener the harness fills in asks for port 0: the server binds a free port itself
        # and names it in its server_started line (started_ports), so no other process can take
        # a port between our choice and the bind. A port picked free and handed over instead was
        # taken now and then by a test running beside this one under a busy ctest -j, and the
        # start failed with "cannot listen on".
        self.address = "127.0.0.1:0"
        cmd = [self.binary, "--grpc_address=" + self.address, "--data_dir=" + self.data_dir]
        if self.backend:
            cmd.append("--backend=" + self.backend)
        # Any other listener the binary has (HTTP gateway, metrics) gets its own port, so that
        # several servers can run side by side.
        for flag in sorted(server_flags(self.binary)):
            if flag == "grpc_address" or any(a.startswith("--%s=" % flag) for a in self.extra_args):
                continue
            if flag in LISTENER_FLAGS:
                cmd.append("--%s=127.0.0.1:0" % flag)
        cmd += shlex.split(os.environ.get("OFFLOAD_SERVER_EXTRA_ARGS", ""))
        cmd += self.extra_args
        self.command_line = cmd
        return cmd

    def flag_value(self, flag):
        """The value the running server got for --`flag` (the last one given wins); for a
        listener asked for port 0, the port it bound (once started)."""
        for arg in reversed(self.command_line):
            if arg.startswith("--%s=" % flag):
                return arg.split("=", 1)[1]
        raise KeyError(flag)

    def bound_port(self, flag):
        """The port the running server listens on for --`flag` (grpc_address, http_address,
        metrics_address)."""
        return int(self.flag_value(flag).rsplit(":", 1)[1])

    def start(self):
        """Starts the process and waits until it logged server_started and health reports
        SERVING (fails fast if it exits). Its listeners were asked for port 0 (see command); the
        ports bound are read from server_started and put in place of the 0s, so that address,
        flag_value and bound_port name them."""
        assert self.proc is None, "already running"
        self.starts += 1
        cmd = self.command()
        self.log_path = os.path.join(_WORK, "%s.%d.stderr.log" % (self.name, self.starts))
        env = dict(os.environ, OFFLOAD_KEK=self.kek_hex)
        self._log = open(self.log_path, "wb")
        self._log.write(("# " + " ".join(shlex.quote(c) for c in cmd) + "\n").encode())
        self._log.flush()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=self._log, env=env)
        _LIVE_SERVERS.append(self)
        # Our own process must have bound its ports: its server_started line says which.
        try:
            started = wait_started(self.proc, self.log_path, START_TIMEOUT_S)
        except RuntimeError as e:
            self._log.flush()
            if self.proc.poll() is None:
                self.kill()
            raise RuntimeError("%s: %s\n%s" % (self.name, e, self.log_tail())) from None
        ports = started_ports(started)
        for i in reversed(range(len(self.command_line))):
            flag, _, value = self.command_line[i][2:].partition("=")
            if flag not in ports:  # not a listener, or an earlier one overridden by this one
                continue
            if value.endswith(":0") and ports[flag]:
                self.command_line[i] = "--%s=%s:%d" % (flag, value.rsplit(":", 1)[0], ports[flag])
            del ports[flag]  # the last one given is the one in use
        self.address = self.flag_value("grpc_address")
        # A channel made before the port listens backs off (about 1 s, then longer) before it
        # tries again: wait for the port first, then connect once.
        self._wait_listening(START_TIMEOUT_S)
        self.channel = self.new_channel()
        self._bind_stubs(self.channel)
        self.wait_serving(START_TIMEOUT_S)
        return self

    def _read_log(self):
        with open(self.log_path, "rb") as f:
            return f.read()

    def _wait_listening(self, timeout):
        host, port = self.address.rsplit(":", 1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return  # wait_serving reports the exit
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                return
            except OSError:
                time.sleep(0.02)

    def new_channel(self):
        return grpc.insecure_channel(self.address, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.enable_http_proxy", 0),
            ("grpc.enable_retries", 0),
        ] + FAST_RECONNECT)

    def stubs_on(self, channel):
        return types.SimpleNamespace(
            keys=pb.keys_grpc.KeyServiceStub(channel),
            ed=pb.ed_grpc.Ed25519ServiceStub(channel),
            x=pb.x_grpc.X25519ServiceStub(channel),
            box=pb.box_grpc.BoxServiceStub(channel),
            aead=pb.aead_grpc.AeadServiceStub(channel),
            health=pb.health_grpc.HealthStub(channel))

    def _bind_stubs(self, channel):
        s = self.stubs_on(channel)
        self.keys, self.ed, self.x, self.box, self.aead, self.health = (
            s.keys, s.ed, s.x, s.box, s.aead, s.health)

    def health_status(self, timeout=2.0):
        resp = self.health.Check(pb.health.HealthCheckRequest(service=""), timeout=timeout)
        return resp.status

    def wait_serving(self, timeout):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise RuntimeError("%s exited with code %s before SERVING\n%s"
                                   % (self.name, rc, self.log_tail()))
            try:
                status = self.health_status(timeout=1.0)
                if status == pb.health.HealthCheckResponse.SERVING:
                    return
                last = "health status %s" % pb.health.HealthCheckResponse.ServingStatus.Name(status)
            except grpc.RpcError as e:
                last = "%s: %s" % (e.code(), e.details())
            time.sleep(0.05)
        self.kill()
        raise RuntimeError("%s not SERVING after %.0fs (last: %s)\n%s"
                           % (self.name, timeout, last, self.log_tail()))

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        """Waits for the process; returns its exit code or None on timeout (process left alive)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def _closed(self):
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self in _LIVE_SERVERS:
            _LIVE_SERVERS.remove(self)
        self._log.close()
        self.proc = None

    def terminate(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM and wait. Returns (exit code or None if it had to be SIGKILLed, seconds)."""
        t0 = time.monotonic()
        self.signal(signal.SIGTERM)
        rc = self.wait_exit(timeout)
        took = time.monotonic() - t0
        if rc is None:
            self.proc.kill()
            self.proc.wait()
        self._closed()
        return rc, took

    def stop(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM; asserts that the server exits with code 0 within `timeout` seconds.

        Returns the seconds it took to exit."""
        if self.proc is None:
            return 0.0
        rc, took = self.terminate(timeout)
        if rc is None:
            raise AssertionError("%s did not exit within %.0fs of SIGTERM\n%s"
                                 % (self.name, timeout, self.log_tail()))
        if rc != 0:
            raise AssertionError("%s exited with code %d after SIGTERM (expected 0)\n%s"
                                 % (self.name, rc, self.log_tail()))
        return took

    def kill(self):
        """SIGKILL, no questions asked (crash simulation and clean-up)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        self._closed()

    # -- logs -------------------------------------------------------------------------------

    def log_tail(self, lines=40):
        if not self.log_path or not os.path.exists(self.log_path):
            return "(no log)"
        with open(self.log_path, "rb") as f:
            data = f.read().decode("utf-8", "replace").splitlines()
        return "---- %s: last %d lines of %s ----\n%s\n---- end ----" % (
            self.name, min(lines, len(data)), self.log_path, "\n".join(data[-lines:]))

    def log_lines(self):
        return self._read_log().decode("utf-8", "replace").splitlines()


NGINX = os.environ.get("OFFLOAD_NGINX", "/usr/sbin/nginx")


class Nginx:
    """A real nginx (Debian's), run from a config in a temp folder of its own.

    `conf` is a template: {dir} becomes the folder (for pid, logs and temp paths) and {user}
    the `user` directive root needs (workers run as nobody). start(port) checks the config with
    `nginx -t`, runs nginx in the foreground and waits until `port` accepts connections;
    close() stops it gracefully and removes the folder."""

    def __init__(self, conf, **fields):
        self.dir = tempfile.mkdtemp(prefix="offload-nginx-", dir=_WORK)
        os.chmod(self.dir, 0o755)  # workers (nobody when we are root) create temp files here
        self.conf = os.path.join(self.dir, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf.format(dir=self.dir,
                                user="user nobody nogroup;" if os.getuid() == 0 else "",
                                **fields))
        self.proc = None

    def start(self, port):
        args = [NGINX, "-p", self.dir, "-e", self.dir + "/error.log", "-c", self.conf]
        test = subprocess.run(args + ["-t", "-q"], capture_output=True, text=True)
        if test.returncode != 0:
            raise RuntimeError("nginx -t rejected the config:\n%s" % test.stderr)
        self.proc = subprocess.Popen(args + ["-g", "daemon off;"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("nginx exited with %s\n%s" % (self.proc.returncode,
                                                                 self.log_tail()))
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not listen\n" + self.log_tail())

    def log_tail(self, lines=20):
        try:
            with open(os.path.join(self.dir, "error.log")) as f:
                return "\n".join(f.read().splitlines()[-lines:])
        except OSError:
            return "(no nginx log)"

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class ServerTestCase(unittest.TestCase):
    """A TestCase whose failures print the tail of its servers' logs.

    Subclasses put their Server objects in `cls.servers` (a list)."""

    servers = ()

    def run(self, result=None):
        if result is None:
            return super().run(result)
        before = len(result.failures) + len(result.errors)
        out = super().run(result)
        if len(result.failures) + len(result.errors) > before:
            for server in self.servers:
                sys.stderr.write("\n" + server.log_tail() + "\n")
        return out

    # -- assertions shared by the tests ------------------------------------------------------

    def assertRpcError(self, code, fn, *args, contains=(), **kwargs):
        """Asserts that `fn(*args)` fails with grpc status `code`; returns the error."""
        err = rpc_error(fn, *args, **kwargs)
        self.assertIsNotNone(err, "expected %s, call succeeded" % code)
        self.assertEqual(err.code(), code, "expected %s, got %s: %s"
                         % (code, err.code(), err.details()))
        if isinstance(contains, str):
            contains = (contains,)
        for part in contains:
            self.assertIn(part, err.details() or "", "message does not mention %r" % part)
        return err

    def assertItem(self, result, code, contains=(), what=""):
        """Asserts a batch item's ItemStatus code (and message parts for errors)."""
        self.assertEqual(result.status.code, code, "%s: expected item code %d, got %d (%s)"
                         % (what, code, result.status.code, result.status.message))
        if isinstance(contains, str):
            contains = (contains,)
        for part in contains:
            self.assertIn(part, result.status.message,
                          "%s: item message does not mention %r" % (what, part))


def start_together(servers):
    """Starts `servers` side by side (each spends a moment measuring the crypto backends; a
    shared key store migrates its schema once, under its lock) and raises the first failure."""
    errors = []

    def start(server):
        try:
            server.start()
        except Exception as e:  # noqa: BLE001 - raised below
            errors.append(e)
    threads = [threading.Thread(target=start, args=(s,)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def stop_together(servers):
    """SIGTERM to the live `servers` at once, after closing their idle client channels (a server
    waits for its open connections on SIGTERM); raises unless every one exits 0 (a clean exit
    also runs the sanitizers' leak check)."""
    live = [s for s in servers if s.proc is not None]
    for s in live:
        if s.channel is not None:
            s.channel.close()
            s.channel = None
    for s in live:
        s.signal(signal.SIGTERM)
    codes = {s.name: s.terminate()[0] for s in live}
    bad = {name: rc for name, rc in codes.items() if rc != 0}
    if bad:
        raise AssertionError("servers did not exit cleanly after SIGTERM: %s" % bad)


def thread_run(fn, n, *args):
    """Runs fn(i, *args) for i in range(n) on threads; returns the threads (started)."""
    threads = [threading.Thread(target=fn, args=(i,) + args, daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads
