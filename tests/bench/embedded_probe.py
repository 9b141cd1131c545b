#!/usr/bin/python3
"""The embedded client's probe round, memo on and off (issue 32's benchmark).

    tests/bench/embedded_probe.py [--build_dir build] [--rounds 20] [--runs 3] [--smoke]

One offload_server on loopback (free ports, a temporary --data_dir, a random OFFLOAD_KEK) and one
X25519 key made with offloadctl. embedded_probe_bench (tests/bench/embedded_probe_bench.c, the
embedded C client over its POSIX transport) plays a device with 15 peers, --rounds probe rounds
per run, fresh peers each run:

  derive   a round is one Derive (box key) per peer;
  box      a round is a PING sealed to each peer and its PONG opened (a box each way).

  memo off  no clock set: every derive, seal and open is a request;
  memo on   offload_client_set_clock(offload_posix_clock_ms): derives are remembered, and with
            libsodium (OFFLOAD_LOCAL_BOX) boxes are sealed and opened on the device.

Server calls are counted at the server (offload_requests_total of X25519Service/Derive and
BoxService/Seal and Open on its /metrics, before and after each run) and by the client
(client.stats.requests). Wall time per round is the time spent inside the client's calls (the
peers' own libsodium work, which checks every answer, is left out). The order of the four
configurations alternates by run. `--smoke` (ctest bench.embedded_probe_smoke) runs 3 rounds once
and fails only if a count is not the one expected (never a time).
"""

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

PEERS = 15


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loopback_ports import free_port  # noqa: E402  (below the ephemeral range)


class Server:
    def __init__(self, build, work):
        self.build = build
        self.grpc, self.http, self.metrics = free_port(), free_port(), free_port()
        env = dict(os.environ, OFFLOAD_KEK=os.urandom(32).hex())
        self.log = open(os.path.join(work, "server.log"), "w+")
        self.proc = subprocess.Popen(
            [os.path.join(build, "bin", "offload_server"),
             "--grpc_address=127.0.0.1:%d" % self.grpc,
             "--http_address=127.0.0.1:%d" % self.http,
             "--metrics_address=127.0.0.1:%d" % self.metrics,
             "--data_dir=" + os.path.join(work, "data")],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 60
        while time.time() < deadline:
            self.log.seek(0)
            if '"server_started"' in self.log.read():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.log.seek(0)
        sys.exit("server did not start:\n" + self.log.read())

    def ctl(self, *args):
        return subprocess.run([os.path.join(self.build, "bin", "offloadctl"),
                               "--server=127.0.0.1:%d" % self.grpc, "--timeout=30s"] + list(args),
                              check=True, capture_output=True, text=True).stdout

    def counts(self):
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics,
                                      timeout=30).read().decode()
        out = {"Derive": 0, "Seal": 0, "Open": 0}
        for line in text.splitlines():
            m = re.match(r'offload_requests_total\{([^}]*)\} (\S+)', line)
            if not m:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            key = (labels.get("service"), labels.get("method"))
            if key == ("offload.v1.X25519Service", "Derive"):
                out["Derive"] += int(float(m.group(2)))
            elif key in (("offload.v1.BoxService", "Seal"), ("offload.v1.BoxService", "Open")):
                out[labels["method"]] += int(float(m.group(2)))
        return out

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(timeout=60)
        if rc != 0:
            sys.exit("server exit %d after SIGTERM" % rc)


def run_bench(build, server, key, pk, mode, memo, rounds):
    before = server.counts()
    out = subprocess.run([os.path.join(build, "bin", "embedded_probe_bench"), str(server.http),
                          key, pk, mode, memo, str(rounds)],
                         check=True, capture_output=True, text=True).stdout
    after = server.counts()
    walls, requests = [], []
    local_box = int(re.search(r"local_box (\d)", out).group(1))
    for m in re.finditer(r"round (\d+) requests (\d+) wall_us (\d+)", out):
        requests.append(int(m.group(2)))
        walls.append(int(m.group(3)))
    total = int(re.search(r"total requests (\d+)", out).group(1))
    return {"server": {k: after[k] - before[k] for k in after}, "client": total,
            "requests": requests, "walls": walls, "local_box": local_box}


def expected(mode, memo, rounds, local_box):
    if mode == "derive":
        return {"Derive": PEERS if memo == "on" else PEERS * rounds, "Seal": 0, "Open": 0}
    if memo == "on" and local_box:
        return {"Derive": PEERS, "Seal": 0, "Open": 0}
    return {"Derive": 0, "Seal": PEERS * rounds, "Open": PEERS * rounds}


def fmt(values):
    if not values:
        return "-"
    return "%.0f [%.0f-%.0f]" % (statistics.median(values), min(values), max(values))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build_dir", default="build")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.runs = 3, 1
    build = os.path.abspath(a.build_dir)
    load_start = os.getloadavg()
    configs = [(m, memo) for m in ("derive", "box") for memo in ("off", "on")]
    results = {c: [] for c in configs}
    bad = []
    with tempfile.TemporaryDirectory(prefix="embedded_probe_") as work:
        os.mkdir(os.path.join(work, "data"))
        server = Server(build, work)
        try:
            server.ctl("keys", "create", "--type=x25519", "probe")
            pk = re.search(r"public_key: *([0-9a-f]{64})", server.ctl("keys", "get", "probe")).group(1)
            for run in range(a.runs):
                order = configs if run % 2 == 0 else list(reversed(configs))
                for mode, memo in order:
                    r = run_bench(build, server, "probe", pk, mode, memo, a.rounds)
                    results[(mode, memo)].append(r)
                    want = expected(mode, memo, a.rounds, r["local_box"])
                    if r["server"] != want or r["client"] != sum(want.values()):
                        bad.append("%s memo %s: server counted %s, client %d requests; want %s" %
                                   (mode, memo, r["server"], r["client"], want))
        finally:
            server.stop()
    load_end = os.getloadavg()

    print("embedded probe round: %d peers, %d rounds per run, %d runs; %d cores, load average "
          "%.2f %.2f %.2f at the start, %.2f %.2f %.2f at the end" %
          ((PEERS, a.rounds, a.runs, os.cpu_count()) + load_start + load_end))
    print("| round | memo | server calls per run (Derive / Seal / Open) | client requests per run | "
          "first round, us | later rounds, us per round: median [min-max] | requests per later round |")
    print("|---|---|---|---|---|---|---|")
    for mode, memo in configs:
        rs = results[(mode, memo)]
        server_calls = sorted({"%d / %d / %d" % (r["server"]["Derive"], r["server"]["Seal"],
                                                 r["server"]["Open"]) for r in rs})
        clients = sorted({str(r["client"]) for r in rs})
        firsts = [r["walls"][0] for r in rs]
        later = [w for r in rs for w in r["walls"][1:]]
        later_req = sorted({q for r in rs for q in r["requests"][1:]})
        label = "15 derives" if mode == "derive" else "15 seals + 15 opens"
        if mode == "box" and memo == "on":
            label += " (on the device)" if rs and rs[0]["local_box"] else " (server)"
        print("| %s | %s | %s | %s | %s | %s | %s |" % (
            label, memo, ", ".join(server_calls), ", ".join(clients), fmt(firsts), fmt(later),
            ", ".join(map(str, later_req))))
    for b in bad:
        print("COUNT MISMATCH: " + b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
