"""What the Prometheus metrics cost: server CPU per BatchVerify(64) item, metrics on vs off.

Two offload_server processes run side by side (fresh data folders, free loopback ports): "on"
with the defaults (every RPC counted, the /metrics exposer up) and a real Prometheus scraping it
every second, "off" with --metrics=false (nothing counted, no exposer). tests/bench's offload_load
drives one at a time, alternating on/off/off/on... (so that drift in the machine's load hits both
alike), and reports the server's CPU time per item from /proc/<pid>/stat over its window.
Printed: every run, the median per configuration and workload, and on/off - 1.

    /usr/bin/python3 tests/integration/metrics_cost.py --build_dir build-obs \\
        --rounds 6 --duration 3 --modes warm,cold --taskset 1

warm: 64 repeated items (memo hits, ~1-2 us of work per item: where a fixed per-call cost shows
most); cold: 64 fresh signatures per call (a real Ed25519 verification per item). Needs the
offload_server and offload_load targets built; nothing is asserted. --taskset pins both servers
to the same CPU(s), which removes most worker-wakeup noise on a small shared machine. Figures:
deploy/prometheus/README.md ("Metrics cost").
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build_dir", default=os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                         "build-obs"))
    ap.add_argument("--rounds", type=int, default=6, help="on/off pairs per mode")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--modes", default="warm,cold")
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--no_prometheus", action="store_true",
                    help="metrics on without a Prometheus scraping it")
    ap.add_argument("--idle_seconds", type=float, default=20.0,
                    help="first, both servers idle this long: the scrape's own CPU cost")
    ap.add_argument("--taskset", default="",
                    help="CPU list for both servers (taskset -c), e.g. 1; the load runs anywhere")
    args = ap.parse_args()

    server_bin = os.path.join(args.build_dir, "bin", "offload_server")
    load_bin = os.path.join(args.build_dir, "bin", "offload_load")
    for b in (server_bin, load_bin):
        if not os.access(b, os.X_OK):
            sys.exit("missing %s (build the offload_server and offload_load targets)" % b)
    os.environ["OFFLOAD_SERVER"] = server_bin
    from obs_support import Prometheus, harness  # generates stubs; needs OFFLOAD_SERVER

    metrics_address = "127.0.0.1:%d" % harness.free_port()
    on = harness.Server("metrics-on", args=["--metrics_address=" + metrics_address]).start()
    off = harness.Server("metrics-off", args=["--metrics=false"]).start()
    if args.taskset:
        for server in (on, off):
            subprocess.run(["taskset", "-a", "-p", "-c", args.taskset, str(server.proc.pid)],
                           check=True, capture_output=True)
    prom = None
    if not args.no_prometheus:
        prom = Prometheus([metrics_address]).start()
    results = {}  # (mode, config) -> [us/item]
    try:
        if args.idle_seconds > 0:
            time.sleep(2)
            before = {n: cpu_seconds(s.proc.pid) for n, s in (("on", on), ("off", off))}
            time.sleep(args.idle_seconds)
            after = {n: cpu_seconds(s.proc.pid) for n, s in (("on", on), ("off", off))}
            idle = {n: (after[n] - before[n]) / args.idle_seconds for n in before}
            print("idle %.0fs: server CPU %.2f ms/s with metrics (scraped every 1s: %s), "
                  "%.2f ms/s with --metrics=false"
                  % (args.idle_seconds, 1000 * idle["on"], prom is not None, 1000 * idle["off"]))
        print("uptime: %s" % subprocess.run(["uptime"], capture_output=True, text=True).stdout
              .strip())
        print("server %s; load %s; %d rounds x %.0fs; Prometheus scraping 'on' every 1s: %s"
              % (server_bin, load_bin, args.rounds, args.duration, prom is not None))
        for mode in args.modes.split(","):
            for r in range(args.rounds):
                order = [("on", on), ("off", off)] if r % 2 == 0 else [("off", off), ("on", on)]
                for config, server in order:
                    cmd = [load_bin, "--server=" + server.address,
                           "--server_pid=%d" % server.proc.pid, "--workload=batch_verify",
                           "--batch=64", "--mode=" + mode, "--inflight=%d" % args.inflight,
                           "--duration=%g" % args.duration, "--warmup=%g" % args.warmup,
                           "--label=%s %s" % (mode, config)]
                    if mode == "cold":
                        cmd.append("--cold_items=%d" % int(40000 * (args.duration + args.warmup)))
                    run = subprocess.run(cmd, capture_output=True, text=True)
                    m = re.search(r"server CPU ([0-9.]+) us/item", run.stdout)
                    ips = re.search(r"([0-9]+) items/s", run.stdout)
                    if run.returncode != 0 or not m:
                        print("FAILED: %s\n%s%s" % (" ".join(cmd), run.stdout, run.stderr))
                        return 1
                    us = float(m.group(1))
                    results.setdefault((mode, config), []).append(us)
                    print("  %-4s round %d %-3s: %7.3f us/item server CPU, %s items/s"
                          % (mode, r, config, us, ips.group(1) if ips else "?"))
        print()
        print("| workload | metrics on: server CPU us/item (median) | --metrics=false | "
              "overhead (on/off - 1) | runs each |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for mode in args.modes.split(","):
            a = statistics.median(results[(mode, "on")])
            b = statistics.median(results[(mode, "off")])
            pairs = [x / y - 1 for x, y in zip(results[(mode, "on")], results[(mode, "off")])]
            print("| BatchVerify(64) %s | %.3f | %.3f | %+.1f%% (median pair %+.1f%%; pairs: %s) "
                  "| %d |" % (mode, a, b, 100 * (a / b - 1), 100 * statistics.median(pairs),
                              " ".join("%+.1f%%" % (100 * p) for p in pairs),
                              len(results[(mode, "on")])))
    finally:
        if prom:
            prom.stop()
        on.stop()
        off.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
