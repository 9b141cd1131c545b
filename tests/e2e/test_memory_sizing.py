"""The memory bounds sized against a cgroup memory limit (--memory_limit_file, issue 33).

A server given a limit file of 512 MiB sizes the bounds that no flag set - each port's memory
budget 1/8 of it, the open memo 1/4, the verify memo 1/32, the derive memo 1/64, each at most its
default - keeps the one a flag sets, logs the figures (memory_sizing), and runs with them (the
memos' byte bounds as /metrics shows them). A file saying "max" sizes nothing.
"""

import json
import os
import re
import tempfile
import unittest
import urllib.request

import harness

MIB = 1 << 20


def capacities(server):
    text = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        "http://%s/metrics" % server.flag_value("metrics_address"), timeout=10).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^offload_memo_capacity_bytes\{cache="([a-z]+)"\} (\S+)$', text, re.M)}


def sizing_line(server):
    lines = [json.loads(l) for l in server.log_lines() if '"memory_sizing"' in l]
    assert len(lines) == 1, lines
    return lines[0]


class MemorySizingTest(harness.ServerTestCase):

    def limit_file(self, text):
        fd, path = tempfile.mkstemp(prefix="memory.max-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.addCleanup(os.remove, path)
        return path

    def start(self, *args):
        server = harness.Server("memory-sizing", args=list(args))
        self.servers = [server]
        server.start()
        self.addCleanup(server.stop)
        return server

    def test_bounds_not_given_are_sized_to_the_limit(self):
        server = self.start("--memory_limit_file=" + self.limit_file("536870912\n"),
                            "--memo_derive_bytes=%d" % MIB)
        line = sizing_line(server)
        print("\n  " + json.dumps(line))
        self.assertEqual(line["limit_bytes"], 512 * MIB)
        self.assertEqual(line["http_memory_budget_bytes"], 64 * MIB)
        self.assertEqual(line["grpc_memory_budget_bytes"], 64 * MIB)
        self.assertEqual(line["memo_open_bytes_total"], 128 * MIB)
        self.assertEqual(line["memo_verify_bytes"], 16 * MIB)
        self.assertEqual(line["memo_derive_bytes"], MIB)  # the flag's
        self.assertEqual(line["given_by_flags"], ["memo_derive_bytes"])
        caps = capacities(server)
        self.assertEqual(caps.get("verify"), 16 * MIB, caps)
        self.assertEqual(caps.get("derive"), MIB, caps)

    def test_no_limit_sizes_nothing(self):
        server = self.start("--memory_limit_file=" + self.limit_file("max\n"))
        self.assertIsNone(sizing_line(server)["limit_bytes"])
        caps = capacities(server)
        self.assertEqual(caps.get("verify"), 32 * MIB, caps)
        self.assertEqual(caps.get("derive"), 16 * MIB, caps)


if __name__ == "__main__":
    unittest.main()
