#!/usr/bin/python3
"""A/B of offload_server binaries under h2load, the servers alternated round by round.

    tests/bench/h2load_ab.py --server before=/tmp/offload_server.old \\
        --server after=build/bin/offload_server --rows bv_hit,bd_hit --rounds 4
    tests/bench/h2load_ab.py --server ours=build/bin/offload_server --rows verify --threads

A --server whose file is named minimal_server (tests/bench/minimal_server.cc) takes the fresh
rows only. Each round starts every --server afresh (random OFFLOAD_KEK, temp data dir, loopback ports) per
row, writes the row's body against it with offload_load --write_request, and runs h2load as
run_all.py's h2load rows do (2 connections x 4 streams, 1 s warm-up, --seconds measured). Rows:
  verify      unary Verify, fresh (the server at --memo=false: the body repeats)
  open_fresh  AEAD Open of 55,000 B, fresh (--memo=false)
  open_hit    AEAD Open of 55,000 B, memo hit over gRPC
  bv_hit      BatchVerify(64), all 64 items memo hits
  bd_hit      BatchDerive(64), all 64 items memo hits
It prints server CPU us per item (utime+stime of the server over the window / items answered)
and items/s per round, then the median per row and server. --threads adds, per thread name, the
context switches per call (voluntary / involuntary, /proc/<pid>/task/*/status) over the window.
Each body is first sent once with curl and must answer grpc-status 0; any non-2xx answer under
h2load fails the run too (exit 1). Nothing is asserted about speed.
"""
import argparse
import glob
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_all as R  # noqa: E402

O55 = ['--workload=open', '--aead=chacha20', f'--size={R.B55000}', '--mode=warm', '--warm_set=1']
# row: (path, offload_load flags for the body, server at --memo=false?, items per request)
ROWS = {
    'verify': ('/offload.v1.Ed25519Service/Verify',
               ['--workload=verify', '--mode=cold', '--cold_items=1'], True, 1),
    'open_fresh': ('/offload.v1.AeadService/Open', O55, True, 1),
    'open_hit': ('/offload.v1.AeadService/Open', O55, False, 1),
    'bv_hit': ('/offload.v1.Ed25519Service/BatchVerify',
               ['--workload=batch_verify', '--batch=64', '--mode=cold', '--cold_items=64'], False, 64),
    'bd_hit': ('/offload.v1.X25519Service/BatchDerive',
               ['--workload=batch_derive', '--batch=64', '--mode=cold', '--cold_items=64'], False, 64),
}
GRPC_HEADERS = ['content-type: application/grpc', 'te: trailers']


def thread_switches(pid):
    """{tid: (thread name, voluntary, involuntary)} of `pid`'s threads."""
    out = {}
    for task in glob.glob(f'/proc/{pid}/task/*'):
        try:
            with open(task + '/comm') as f:
                name = f.read().strip()
            with open(task + '/status') as f:
                status = f.read()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        vol = int(re.search(r'^voluntary_ctxt_switches:\s+(\d+)', status, re.M).group(1))
        invol = int(re.search(r'^nonvoluntary_ctxt_switches:\s+(\d+)', status, re.M).group(1))
        out[task.rsplit('/', 1)[1]] = (name, vol, invol)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--server', action='append', required=True, metavar='NAME=BINARY',
                    help='an offload_server binary to measure (repeat for each side)')
    ap.add_argument('--rows', default='bv_hit,bd_hit', help='comma-separated: ' + ','.join(ROWS))
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--seconds', type=float, default=4.0)
    ap.add_argument('--build_dir', default=os.path.join(R.ROOT, 'build'),
                    help='where bin/offload_load is')
    ap.add_argument('--threads', action='store_true', help='context switches per call by thread')
    args = ap.parse_args()
    servers = []
    for spec in args.server:
        name, sep, binary = spec.partition('=')
        if not sep or not name or not os.access(binary, os.X_OK):
            ap.error(f'--server {spec!r}: expected NAME=BINARY, an executable')
        servers.append((name, binary))
    rows = args.rows.split(',')
    for row in rows:
        if row not in ROWS:
            ap.error(f'unknown row {row!r}')
    runner = R.Runner(args.build_dir, 1, args.seconds)
    work = tempfile.mkdtemp(prefix='h2load-ab-')
    results = {}
    failed = False
    for r in range(args.rounds):
        for name, binary in servers:
            for row in rows:
                path, body_flags, no_memo, items = ROWS[row]
                tag = f'{name}-{row}-{r}'
                if os.path.basename(binary) == 'minimal_server':
                    if not no_memo:
                        continue  # the minimal server has no memo: fresh rows only
                    server = R.Server(tag, [binary, '--address=127.0.0.1:0'], dict(os.environ),
                                      r'"grpc_port":(\d+)', work)
                else:
                    server = R.start_ours(args.build_dir, work, tag,
                                          ['--memo=false'] if no_memo else [], binary=binary)
                try:
                    body = R.write_request(runner, server, body_flags, os.path.join(work, tag + '.bin'))
                    # h2load counts a gRPC error (HTTP 200, grpc-status in the trailers) as 2xx:
                    # one call with curl first, which must answer grpc-status 0.
                    if not R.grpc_call_ok(server.port, path, body + '.grpc'):
                        print(f'round {r + 1} {row} {name}: no grpc-status 0', flush=True)
                        failed = True
                        continue
                    before = thread_switches(server.pid) if args.threads else {}
                    res = R.h2load(server.pid, f'http://127.0.0.1:{server.port}{path}',
                                   body + '.grpc', GRPC_HEADERS, False, args.seconds, 1)
                    after = thread_switches(server.pid) if args.threads else {}
                finally:
                    server.stop()
                if res['bad'] or not res['ok']:
                    print(f'round {r + 1} {row} {name}: {res["bad"]} bad answers', flush=True)
                    failed = True
                    continue
                cpu = res['cpu'] / items
                results.setdefault((row, name), []).append((cpu, res['rps'] * items))
                print(f'round {r + 1} {row:10s} {name:10s} {cpu:8.2f} us/item '
                      f'{res["rps"] * items:12,.0f} items/s', flush=True)
                if args.threads:
                    per_name = {}
                    for tid, (tname, vol, invol) in after.items():
                        if tid in before:
                            acc = per_name.setdefault(tname, [0, 0, 0])
                            acc[0] += vol - before[tid][1]
                            acc[1] += invol - before[tid][2]
                            acc[2] += 1
                    for tname, (vol, invol, n) in sorted(per_name.items()):
                        if vol or invol:
                            # The window includes h2load's 1 s warm-up: switches per call are
                            # over all calls answered in warm-up and window together.
                            measured = max(1, round(args.seconds))  # as h2load's -D runs it
                            calls = res['ok'] * (1 + measured) / measured
                            print(f'    {tname:16s} x{n}: {vol / calls:.2f} voluntary, '
                                  f'{invol / calls:.2f} involuntary switches per call')
    shutil.rmtree(work, ignore_errors=True)
    print('\nmedian server CPU us/item [min-max], median items/s')
    for (row, name), xs in sorted(results.items()):
        cpus = [c for c, _ in xs]
        print(f'{row:10s} {name:10s} {R.median(cpus):8.2f} [{min(cpus):.2f}-{max(cpus):.2f}] '
              f'{R.median([i for _, i in xs]):12,.0f}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
