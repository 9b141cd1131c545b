#!/usr/bin/python3
"""Issue 34: what a fresh call costs beyond its crypto, against the minimal gRPC server, raw
libsodium and nghttpd (libnghttp2's own server: the HTTP/2 floor), all in one run.

    tests/bench/fresh_call.py --build_dir build                     # 3 rounds x 5 s per row
    tests/bench/fresh_call.py --build_dir build --main_server /tmp/main/offload_server
    tests/bench/fresh_call.py --build_dir build --smoke             # counts only (ctest)

Servers, started once and side by side on loopback (an idle one costs nothing): ours with
`--memo=false` (the fresh rows: h2load repeats one body, which our memo would answer), ours with
the memo on (the hit rows), tests/bench/minimal_server (gRPC 1.51's callback API, the work inline)
and `nghttpd --no-tls` serving a 100 B and a 55,000 B file (Debian's nghttp2-server). Each row
runs `h2load -c 2 -m 32 -t 1` (a 1 s warm-up, then --seconds measured) on every server of the
row, the servers' order alternated round by round; the figure is the median of --rounds. Per
server and row: server CPU per completed call (utime+stime of /proc/<pid>/stat over the window),
context switches per call (voluntary + involuntary, summed over /proc/<pid>/task/*/status: the
main thread's own /proc/<pid>/status counts only itself), calls/s. Raw libsodium over the very
64 triples of the BatchVerify(64) body (raw_batch_verify) runs once per round.

Head-of-line (not a target, figures only): offload_load with one connection (--channels=1) sends
memo-hit Verifies on an open-loop schedule (--hol_rate calls/s) to ours with the memo on, once
alone and once with --background_batch_verify=1000 (two BatchVerify(1000) calls of invalid
signatures, never memoised, kept running on the same connection); with --main_server, the same
two runs against that binary (e.g. main's build) for comparison. p50/p99/p999 of the Verifies.

The exit status is 1 only when a call failed (non-2xx, a grpc-status other than 0, an offload_load
error); timing is never asserted. --smoke runs each row for a few hundred calls and one short
head-of-line run: it checks that every row answers and prints the counts, for the test command.
"""
import argparse
import datetime
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_all as R  # noqa: E402

GRPC_H = ['content-type: application/grpc', 'te: trailers']
V = '/offload.v1.Ed25519Service/Verify'
BV = '/offload.v1.Ed25519Service/BatchVerify'
D = '/offload.v1.X25519Service/Derive'
OP = '/offload.v1.AeadService/Open'
O55 = ['--workload=open', '--aead=chacha20', f'--size={R.B55000}', '--mode=warm', '--warm_set=1']

# row id -> (title, [(series, server key, path or None for nghttpd, body key or file, items)])
ROWS = {
    'verify': ('Verify fresh', [('ours', 'fresh', V, 'verify', 1),
                                ('minimal', 'minimal', V, 'verify', 1)]),
    'open': ('Open 55,000 B fresh', [('ours', 'fresh', OP, 'open-fresh', 1),
                                     ('minimal', 'minimal', OP, 'open-minimal', 1)]),
    'open_hit': ('Open 55,000 B memo hit', [('ours', 'memo', OP, 'open-memo', 1),
                                            ('nghttpd GET 55,000 B', 'nghttpd', None, 'big', 1)]),
    'bv64': ('BatchVerify(64) fresh', [('ours', 'fresh', BV, 'batch64', 64),
                                       ('minimal', 'minimal', BV, 'batch64', 64)]),
    'verify_hit': ('Verify memo hit', [('ours', 'memo', V, 'verify', 1),
                                       ('nghttpd GET 100 B', 'nghttpd', None, 'small', 1)]),
    'derive': ('Derive fresh', [('ours', 'fresh', D, 'derive-fresh', 1)]),
    'derive_hit': ('Derive memo hit', [('ours', 'memo', D, 'derive-memo', 1)]),
}


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def switches(pid):
    """Voluntary + involuntary context switches of every thread of `pid` so far."""
    total = 0
    for task in glob.glob(f'/proc/{pid}/task/*/status'):
        try:
            with open(task) as f:
                status = f.read()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        for field in ('voluntary_ctxt_switches', 'nonvoluntary_ctxt_switches'):
            total += int(re.search(rf'^{field}:\s+(\d+)', status, re.M).group(1))
    return total


class Nghttpd:
    """nghttpd --no-tls serving `docroot` on a free loopback port."""

    def __init__(self, docroot, workdir):
        self.port = R.free_port()
        self.log = open(os.path.join(workdir, 'nghttpd.log'), 'w')
        binary = shutil.which('nghttpd') or '/usr/sbin/nghttpd'  # sbin: not on every PATH
        self.proc = subprocess.Popen([binary, '--no-tls', '-a', '127.0.0.1', '-d', docroot,
                                      str(self.port)], stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection(('127.0.0.1', self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError('nghttpd did not start (is nghttp2-server installed?)')

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.log.close()


def h2load(pid, url, body, seconds, calls):
    """h2load -c 2 -m 32 -t 1 (gRPC headers and `body` for a POST, else a GET): a 1 s warm-up, then
    --seconds (or `calls` requests when set). Server CPU and context switches per 2xx answer."""
    cmd = ['h2load', '-c', '2', '-m', '32', '-t', '1']
    if body is not None:
        cmd += ['-d', body]
        for h in GRPC_H:
            cmd += ['-H', h]
    if calls:
        run = cmd + ['-n', str(calls), url]
    else:
        subprocess.run(cmd + ['-D', '1', url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run = cmd + ['-D', str(max(1, round(seconds))), url]
    c0, s0 = R.proc_cpu_seconds(pid), switches(pid)
    p = subprocess.run(run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    c1, s1 = R.proc_cpu_seconds(pid), switches(pid)
    m = re.search(r'finished in [^,]*, ([\d.]+) req/s', p.stdout)
    codes = re.search(r'status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx', p.stdout)
    req = re.search(r'requests: \d+ total, \d+ started, \d+ done, \d+ succeeded, (\d+) failed, '
                    r'(\d+) errored', p.stdout)
    ok = int(codes.group(1)) if codes else 0
    bad = (sum(int(codes.group(i)) for i in (2, 3, 4)) if codes else 1) + \
          (int(req.group(1)) + int(req.group(2)) if req else 1)
    return {'rps': float(m.group(1)) if m else 0.0, 'ok': ok, 'bad': bad,
            'cpu': (c1 - c0) * 1e6 / ok if ok else None,
            'switches': (s1 - s0) / ok if ok else None}


def offload_load(build_dir, port, pid, args, background):
    """Memo-hit Verifies on one connection, open loop; with `background`, two BatchVerify(1000)
    calls kept running on it. Returns {p50, p99, p999, calls, background} or None on failure."""
    cmd = [os.path.join(build_dir, 'bin', 'offload_load'), f'--server=127.0.0.1:{port}',
           f'--server_pid={pid}', '--workload=verify', '--mode=warm', '--warm_set=64',
           '--channels=1', f'--rate={args.hol_rate}', '--inflight=256',
           f'--warmup={0.5 if args.smoke else 1}', f'--duration={1 if args.smoke else args.seconds}']
    if background:
        cmd += ['--background_batch_verify=1000', '--background_inflight=2']
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log('    ' + '\n    '.join(l for l in p.stdout.splitlines() if not l.startswith('|')))
    row = R.parse_row(p.stdout)
    if p.returncode != 0 or row is None:
        return None
    bg = re.search(r'background: (\d+) BatchVerify', p.stdout)
    return {'p50': row['p50'], 'p99': row['p99'], 'p999': row['p999'], 'calls': row['calls_s'],
            'background': int(bg.group(1)) if bg else 0}


def make_bodies(runner, servers, work):
    """The rows' request bodies (offload_load --write_request; FILE.grpc is gRPC-framed), each
    made against the server that needs its keys, for the servers in `servers`."""
    bodies = {}
    wr = lambda key, flags, name: R.write_request(runner, servers[key], flags,
                                                  os.path.join(work, name + '.bin'))
    any_grpc = next(k for k in ('minimal', 'fresh', 'memo') if k in servers)
    bodies['verify'] = wr(any_grpc, ['--workload=verify', '--mode=cold', '--cold_items=1'],
                          'verify')
    bodies['batch64'] = wr(any_grpc, ['--workload=batch_verify', '--batch=64', '--mode=cold',
                                      '--cold_items=64'], 'batch64')
    for key in ('fresh', 'memo', 'minimal'):
        if key in servers:
            bodies['open-' + key] = wr(key, O55, 'open-' + key)
    for key in ('fresh', 'memo'):
        if key in servers:
            bodies['derive-' + key] = wr(key, ['--workload=derive', '--mode=cold'], 'derive-' + key)
    return bodies


def fmt(x, digits=1, unit=''):
    return '-' if x is None else f'{x:,.{digits}f}{unit}'


def cell(xs, digits=1):
    xs = [x for x in xs if x is not None]
    if not xs:
        return '-'
    return f'{R.median(xs):,.{digits}f} [{min(xs):,.{digits}f}-{max(xs):,.{digits}f}]'


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--build_dir', default=os.path.join(R.ROOT, 'build'))
    ap.add_argument('--server', default=None, help='offload_server binary (default: build_dir/bin)')
    ap.add_argument('--main_server', default=None,
                    help='another offload_server binary (main\'s) for the head-of-line figures')
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--seconds', type=float, default=5.0)
    ap.add_argument('--rows', default=','.join(ROWS), help='comma-separated: ' + ','.join(ROWS))
    ap.add_argument('--hol_rate', type=float, default=2000, help='memo-hit Verifies per second')
    ap.add_argument('--smoke', action='store_true', help='a few hundred calls per row; counts only')
    ap.add_argument('--out', default=None, help='also write the report here')
    args = ap.parse_args()
    build_dir = os.path.abspath(args.build_dir)
    binary = args.server or os.path.join(build_dir, 'bin', 'offload_server')
    rows = [r for r in args.rows.split(',') if r]
    for r in rows:
        if r not in ROWS:
            ap.error(f'unknown row {r!r}')
    rounds = 1 if args.smoke else args.rounds
    calls = 320 if args.smoke else 0
    started = time.time()
    load_before = ' / '.join(f'{x:.1f}' for x in os.getloadavg())
    work = tempfile.mkdtemp(prefix='fresh-call-')
    failed = []
    servers = {}
    runner = R.Runner(build_dir, 1, args.seconds)
    try:
        servers['fresh'] = R.start_ours(build_dir, work, 'ours-fresh', ['--memo=false'], binary)
        servers['memo'] = R.start_ours(build_dir, work, 'ours-memo', [], binary)
        servers['minimal'] = R.start_minimal(build_dir, work)
        docroot = os.path.join(work, 'docroot')
        os.makedirs(docroot)
        for name, size in (('small', 100), ('big', R.B55000)):
            with open(os.path.join(docroot, name), 'wb') as f:
                f.write(os.urandom(size))
        servers['nghttpd'] = Nghttpd(docroot, work)

        bodies = make_bodies(runner, servers, work)

        plan = [(ROWS[row][0], s) for row in rows for s in ROWS[row][1]]
        for row, (series, key, path, b, _) in plan:
            if path is not None and not R.grpc_call_ok(servers[key].port, path, bodies[b] + '.grpc'):
                failed.append(f'{row} {series}: no grpc-status 0')
        results = {}
        raw = []
        for r in range(rounds):
            p = subprocess.run([os.path.join(build_dir, 'bin', 'raw_batch_verify'),
                                '--request=' + bodies['batch64'],
                                f'--seconds={0.2 if args.smoke else max(1.0, args.seconds / 2)}'],
                               stdout=subprocess.PIPE, text=True)
            log(f'[round {r + 1}] raw_batch_verify: {p.stdout.strip()}')
            if p.returncode != 0:
                failed.append('raw_batch_verify failed')
            else:
                raw.append(json.loads(p.stdout)['cpu_us_per_verify'])
            for row_id in rows:
                row, series_list = ROWS[row_id]
                if r % 2:
                    series_list = list(reversed(series_list))
                for series, key, path, b, items in series_list:
                    server = servers[key]
                    if path is None:
                        url, data = f'http://127.0.0.1:{server.port}/{b}', None
                    else:
                        url, data = f'http://127.0.0.1:{server.port}{path}', bodies[b] + '.grpc'
                    res = h2load(server.pid, url, data, args.seconds, calls)
                    if res['bad'] or not res['ok']:
                        failed.append(f'{row} {series}: {res["bad"]} bad answers, {res["ok"]} ok')
                    c = results.setdefault(row, {}).setdefault(series, {'cpu': [], 'sw': [], 'rps': []})
                    c['cpu'].append(res['cpu'] / items if res['cpu'] is not None else None)
                    c['sw'].append(res['switches'])
                    c['rps'].append(res['rps'])
                    log(f'[round {r + 1}] {row:24s} {series:22s} ok {res["ok"]:7d} '
                        f'cpu/call {fmt(res["cpu"], 2)} us  switches/call {fmt(res["switches"], 3)}  '
                        f'{res["rps"]:,.0f} calls/s')
        hol = {}
        hol_servers = [('this build', servers['memo'])]
        if args.main_server:
            hol_servers.append(('main', R.start_ours(build_dir, work, 'main-memo', [],
                                                     args.main_server)))
            servers['main'] = hol_servers[-1][1]
        for name, server in hol_servers:
            for background in (False, True):
                log(f'[head-of-line] {name}, {"with" if background else "without"} BatchVerify(1000)')
                res = offload_load(build_dir, server.port, server.pid, args, background)
                if res is None:
                    failed.append(f'head-of-line {name} background={background}')
                hol[(name, background)] = res
    finally:
        for s in servers.values():
            s.stop()
        shutil.rmtree(work, ignore_errors=True)

    med = lambda row, series, what: R.median(results.get(row, {}).get(series, {}).get(what, []))
    lines = []
    w = lines.append
    w(f'Command: `tests/bench/fresh_call.py {" ".join(sys.argv[1:])}`  ')
    w(f'Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, '
      f'{time.time() - started:.0f} s; load average {load_before} before, '
      f'{" / ".join(f"{x:.1f}" for x in os.getloadavg())} after; {os.cpu_count()} CPUs.  ')
    w(f'h2load -c 2 -m 32 -t 1, {"the smoke run" if args.smoke else f"{args.seconds:g} s per row"}'
      f', {rounds} round(s), servers alternated; median [min-max].')
    w('')
    w('| row | series | server CPU us/item | context switches/call | calls/s |')
    w('| --- | --- | ---: | ---: | ---: |')
    for row_id in rows:
        row = ROWS[row_id][0]
        for series, *_ in ROWS[row_id][1]:
            c = results.get(row, {}).get(series, {})
            w(f"| {row} | {series} | {cell(c.get('cpu', []))} | {cell(c.get('sw', []), 3)} | "
              f"{fmt(R.median(c.get('rps', [])), 0)} |")
    w(f"| BatchVerify(64) fresh | raw libsodium, same 64 triples | {cell(raw, 2)} | | |")
    w('')
    w('| target | measured | bound | result |')
    w('| --- | ---: | ---: | --- |')

    def target(name, value, bound, unit='x'):
        ok = None if value is None else value <= bound
        w(f"| {name} | {fmt(value, 2, unit)} | <= {bound:.2f}{unit} | "
          f"{'n/a' if ok is None else ('met' if ok else 'missed')} |")

    rt = R.ratio
    target('Verify fresh: ours / minimal', rt(med('Verify fresh', 'ours', 'cpu'),
                                              med('Verify fresh', 'minimal', 'cpu')), 0.65)
    target('Verify fresh: context switches per call (ours)', med('Verify fresh', 'ours', 'sw'),
           0.5, '')
    target('Open 55,000 B fresh: ours / minimal', rt(med('Open 55,000 B fresh', 'ours', 'cpu'),
                                                     med('Open 55,000 B fresh', 'minimal', 'cpu')),
           0.75)
    target('Open 55,000 B memo hit: ours / nghttpd GET 55,000 B',
           rt(med('Open 55,000 B memo hit', 'ours', 'cpu'),
              med('Open 55,000 B memo hit', 'nghttpd GET 55,000 B', 'cpu')), 1.5)
    target('BatchVerify(64) fresh: ours / raw libsodium (same 64 triples)',
           rt(med('BatchVerify(64) fresh', 'ours', 'cpu'), R.median(raw)), 1.03)
    small = med('Verify memo hit', 'nghttpd GET 100 B', 'cpu')
    target('Verify memo hit: ours / nghttpd GET 100 B', rt(med('Verify memo hit', 'ours', 'cpu'),
                                                           small), 1.5)
    target('Derive memo hit: ours / nghttpd GET 100 B', rt(med('Derive memo hit', 'ours', 'cpu'),
                                                           small), 1.5)
    w('')
    w(f'Head-of-line: memo-hit Verifies at {args.hol_rate:g} calls/s on one connection (offload_load '
      '--channels=1, open loop), alone and with two BatchVerify(1000) calls of invalid signatures '
      'kept running on the same connection.')
    w('')
    w('| server | big batches | Verify p50 ms | p99 ms | p999 ms | Verify calls/s | BatchVerify(1000) done |')
    w('| --- | --- | ---: | ---: | ---: | ---: | ---: |')
    for (name, background), res in hol.items():
        if res is None:
            w(f'| {name} | {"yes" if background else "no"} | failed | | | | |')
            continue
        w(f"| {name} | {'yes' if background else 'no'} | {res['p50']:.3f} | {res['p99']:.3f} | "
          f"{res['p999']:.3f} | {res['calls']:,.0f} | {res['background']} |")
    if failed:
        w('')
        w('Failed: ' + '; '.join(failed))
    text = '\n'.join(lines) + '\n'
    print(text, end='')
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
