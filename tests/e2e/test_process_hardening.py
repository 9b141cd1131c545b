"""Secrets stay out of core dumps (issue 26, secret memory): a server started with default flags
is not dumpable and has a core size limit of 0 even when started with an unlimited one, so
SIGABRT leaves no core file. The control: the same server with --allow_core_dumps, started with
an unlimited limit, does leave one (where the kernel writes cores into the working directory and
the build has no sanitizer, which turns core files off itself)."""
import glob
import json
import os
import resource
import secrets
import signal
import subprocess
import tempfile
import unittest
import urllib.request

import harness


def start(cwd, *flags):
    """offload_server in `cwd` with an unlimited core size limit; returns (process, log path).

    Its ports are port 0, bound by the server itself, and read from its own server_started line
    (harness.wait_started): a port picked free beforehand could be taken by a test running beside
    this one, and then this server would exit, or another server answer our readiness probe."""
    log_path = os.path.join(cwd, "server.log")
    log = open(log_path, "wb")

    def unlimited_core():
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    proc = subprocess.Popen(
        [os.environ["OFFLOAD_SERVER"], "--grpc_address=127.0.0.1:0",
         "--http_address=127.0.0.1:0", "--metrics_address=",
         "--data_dir=" + os.path.join(cwd, "data")] + list(flags),
        cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=unlimited_core,
        env=dict(os.environ, OFFLOAD_KEK=secrets.token_hex(32)))
    log.close()
    try:
        started = harness.wait_started(proc, log_path, timeout=60)
    except RuntimeError as e:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise AssertionError("server: %s: %s" % (e, open(log_path).read()[-2000:])) from None
    http = harness.started_ports(started)["http_address"]
    with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % http, timeout=30) as r:
        if r.status != 200:
            raise AssertionError("/readyz answered %d" % r.status)
    return proc, log_path


def logged(log_path, event):
    with open(log_path) as f:
        for line in f:
            if line.startswith("{") and json.loads(line).get("event") == event:
                return json.loads(line)
    return None


def core_limit(pid):
    with open("/proc/%d/limits" % pid) as f:
        for line in f:
            if line.startswith("Max core file size"):
                return line.split()[4:6]  # soft, hard
    raise AssertionError("no core limit in /proc/%d/limits" % pid)


def abort_and_wait(proc):
    proc.send_signal(signal.SIGABRT)
    proc.wait(timeout=60)
    return proc.returncode


class ProcessHardeningTest(unittest.TestCase):
    def test_no_core_file_by_default(self):
        cwd = tempfile.mkdtemp(prefix="harden-", dir=harness._WORK)
        proc, log_path = start(cwd)
        self.assertEqual(core_limit(proc.pid), ["0", "0"])
        line = logged(log_path, "process_hardened")
        self.assertEqual((line["dumpable"], line["core_limit"]), (False, 0), line)
        if os.getuid() != 0:  # non-dumpable: /proc/<pid> belongs to root, not to its user
            self.assertEqual(os.stat("/proc/%d" % proc.pid).st_uid, 0)
        self.assertEqual(abort_and_wait(proc), -signal.SIGABRT)
        self.assertEqual(glob.glob(os.path.join(cwd, "core*")), [])

    def test_allow_core_dumps_is_the_control(self):
        cwd = tempfile.mkdtemp(prefix="harden-allow-", dir=harness._WORK)
        proc, log_path = start(cwd, "--allow_core_dumps")
        # Our hardening sets both limits to 0; with --allow_core_dumps both stay. (An ASan build
        # sets the soft limit to 0 itself, its disable_coredump: the hard one still shows ours.)
        soft, hard = core_limit(proc.pid)
        self.assertEqual(hard, "unlimited")
        self.assertIn(soft, ["unlimited", "0"] if os.environ.get("OFFLOAD_SANITIZER") else
                      ["unlimited"])
        self.assertEqual(logged(log_path, "process_hardened")["dumpable"], True)
        self.assertEqual(abort_and_wait(proc), -signal.SIGABRT)
        with open("/proc/sys/kernel/core_pattern") as f:
            pattern = f.read().strip()
        if pattern.startswith("|") or "/" in pattern or os.environ.get("OFFLOAD_SANITIZER"):
            self.skipTest("cores do not land in the working directory here (core_pattern %r, "
                          "sanitizer %r)" % (pattern, os.environ.get("OFFLOAD_SANITIZER")))
        cores = glob.glob(os.path.join(cwd, "core*"))
        self.assertTrue(cores, "no core file with --allow_core_dumps (core_pattern %r)" % pattern)
        print("  control: %s, %d bytes" % (os.path.basename(cores[0]), os.path.getsize(cores[0])))
        for c in cores:
            os.remove(c)  # a few hundred MB of address space, most of it sparse


if __name__ == "__main__":
    unittest.main()
