#!/usr/bin/python3
"""Instructions per Connect Verify (memo hit) with and without a remembered bearer token, by
library: the server (token_cost.py's, one HTTP loop) runs under `valgrind --tool=callgrind`;
instrumentation is on only around each h2load run (callgrind_control -i on, -z, then -d, -i off),
one dump per transport and variant. Needs valgrind (not installed by scripts/install-deps.sh).

    /usr/bin/python3 tests/bench/token_callgrind.py [--calls 5000]

Prints the instructions per call of each dump, and per shared object the difference a token
makes (callgrind_annotate of each dump).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import token_cost as tc  # noqa: E402
from http_edge import h2load  # noqa: E402

RUNS = [("HTTP/2 -c 4 -m 8", ["-c", "4", "-m", "8"]), ("HTTP/1.1 --h1 -c 4", ["--h1", "-c", "4"])]


def by_object(dump):
    """Instructions per shared object (callgrind_annotate's totals per file)."""
    out = subprocess.run(["callgrind_annotate", "--threshold=100", dump], capture_output=True,
                         text=True).stdout
    totals = {}
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+) .*\[(.+)\]\s*$", line)
        if m:
            name = os.path.basename(m.group(2))
            totals[name] = totals.get(name, 0) + int(m.group(1).replace(",", ""))
    return totals


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=os.path.join(tc.REPO, "build/bin/offload_server"))
    p.add_argument("--calls", type=int, default=5000)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="token-callgrind-")
    server = tc.Server(a.server, work, prefix=[
        "valgrind", "--tool=callgrind", "--instr-atstart=no",
        "--callgrind-out-file=" + os.path.join(work, "cg.%p")], extra=["--http_threads=1"],
        ready_seconds=120)
    pid = str(server.proc.pid)
    try:
        body = tc.verify_body(server)
        body_file = os.path.join(work, "verify.bin")
        with open(body_file, "wb") as f:
            f.write(body)
        token = server.token("EdDSA")
        print("# Instructions per Connect Verify (memo hit), %d calls per run, an EdDSA token of "
              "%d bytes" % (a.calls, len(token)))
        dumps = []
        for title, args in RUNS:
            for variant, extra in (("no identity", []),
                                   ("remembered token", ["-H", "authorization: Bearer " + token])):
                cmd = args + ["-d", body_file, "-H", "content-type: application/proto"] + extra + \
                    [server.url("/offload.v1.Ed25519Service/Verify")]
                h2load(cmd, 400)
                for c in (["-i", "on"], ["-z"]):
                    subprocess.run(["callgrind_control"] + c + [pid], capture_output=True)
                h2load(cmd, a.calls)
                for c in (["-d", "run%d" % len(dumps)], ["-i", "off"]):
                    subprocess.run(["callgrind_control"] + c + [pid], capture_output=True)
                dumps.append((title, variant))
    finally:
        server.stop()
    files = sorted((f for f in os.listdir(work) if re.match(r"cg\.\d+\.\d+$", f)),
                   key=lambda f: int(f.rsplit(".", 1)[1]))
    objs = [by_object(os.path.join(work, f)) for f in files]
    for i in range(0, len(objs), 2):
        title = dumps[i][0]
        none, tok = objs[i], objs[i + 1]
        print("\n## %s: %.0f -> %.0f instructions per call (%+.0f)" % (
            title, sum(none.values()) / a.calls, sum(tok.values()) / a.calls,
            (sum(tok.values()) - sum(none.values())) / a.calls))
        print("| object | token adds (instructions per call) |")
        print("| --- | ---: |")
        for name in sorted(set(none) | set(tok), key=lambda n: none.get(n, 0) - tok.get(n, 0)):
            d = (tok.get(name, 0) - none.get(name, 0)) / a.calls
            if abs(d) >= 20:
                print("| %s | %+.0f |" % (name, d))
    print("\ndumps:", work)


if __name__ == "__main__":
    main()
