#!/usr/bin/python3
"""Issues 4, 15 and 24's benchmark tables in one run: raw library speed, our server, a minimal C++
gRPC server (tests/bench/minimal_server.cc), the Node.js peer.

    tests/bench/run_all.sh                 # full: Release build, ~10 s per workload, ~12 min
    tests/bench/run_all.sh --short         # 2.5 s per workload, ~4 min
    tests/bench/run_all.sh --build_dir build-bench --skip_build --out /tmp/table.md
    tests/bench/run_all.sh --baseline_ref main     # A/B against main's build, in one run
    tests/bench/run_all.sh --baseline_server /tmp/before/bin/offload_server

One run measures, on this machine:
  1. crypto_bench (in process): Ed25519 verify per backend, X25519 per backend, ChaCha20-Poly1305
     open of 55 KB (and 1 KB) per backend - CPU time, median of the repetitions;
  2. with offload_load, on three servers started side by side on loopback: offload_server (memo
     on, fresh data dir) and the Node.js peer (tests/bench/peer, `npm ci` when needed) in its two
     configurations, key objects cached and keys parsed per call: Verify, BatchVerify (1, 8, 64,
     256), Derive, BatchDerive(64), AEAD Open and BatchOpen(16) of 1 KB and 55 KB
     (ChaCha20-Poly1305 keys, the algorithm node:crypto also has). Each workload runs cold (fresh
     inputs) on the three servers back to back, then warm (a repeated set: memo hits) on ours
     (the peer has no memo). After Verify cold, each server also runs unary Verify at half the
     capacity just measured, open loop, for its p99.
  3. issue 15: the minimal server takes every cold workload it serves (Verify, BatchVerify, Open,
     BatchOpen) beside ours; then h2load (a fixed request body, the issue's load generator)
     measures, alternating the servers --h2load_rounds times: unary Verify, BatchVerify(64) and
     AEAD Open of 55,000 B fresh on the minimal server and on ours with --memo=false (a fixed body
     would hit ours' memo), and the Open memo hit on ours over gRPC and over Connect (HTTP/2 h2c
     and HTTP/1.1 keep-alive); in process, memo_bench's 55,000 B hit next to its memcmp.
  4. issue 24 (the gRPC port on our engine): the same figures against issue 24's bounds, and
     raw_batch_verify - libsodium's crypto_sign_verify_detached over the very 64 triples of the
     h2load BatchVerify(64) body, once per h2load round - as the raw baseline for BatchVerify(64).
  5. with --baseline_ref (a git ref: its tree is exported with `git archive` and its
     offload_server built, Release, in <build_dir>-baseline) or --baseline_server (such a binary
     built by hand): the build before a change, e.g. main against a branch. A fourth
     server, started beside ours, takes every workload of ours right after it (before it, every
     other workload) and every h2load row ours takes (alternated in each round, with its own
     --memo=false twin); "A/B" tables then give both builds' figures and their ratio, so that a
     change is judged against the noise of the same run.
It prints a markdown report (figures, ratios, each issue-4 target met or missed) to stdout and
writes it to --out. Server CPU per item is utime+stime of the server process (/proc/<pid>/stat)
over the measured window, so it holds although the load generator shares the 2 cores; items/s and
latency are loopback figures that the load generator's own CPU use depresses. Timing is never
asserted: the exit status is 1 only if a run failed or reported an error.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PEER_DIR = os.path.join(HERE, 'peer')
KB55 = 56320
B55000 = 55000  # issue 15's blob size


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def run_cmd(cmd, **kw):
    log('$ ' + ' '.join(cmd))
    return subprocess.run(cmd, check=True, **kw)


def build(build_dir):
    cmake = ['cmake', '-S', ROOT, '-B', build_dir, '-G', 'Ninja', '-DCMAKE_BUILD_TYPE=Release',
             '-DOFFLOAD_BUILD_BENCH=ON', '-DOFFLOAD_BUILD_TESTS=ON']
    if shutil.which('ccache'):
        cmake += ['-DCMAKE_CXX_COMPILER_LAUNCHER=ccache', '-DCMAKE_C_COMPILER_LAUNCHER=ccache']
    run_cmd(cmake, stdout=subprocess.DEVNULL)
    run_cmd(['cmake', '--build', build_dir, '-j', str(os.cpu_count() or 2), '--target',
             'offload_server', 'offload_load', 'crypto_bench', 'minimal_server', 'memo_bench',
             'raw_batch_verify'],
            stdout=subprocess.DEVNULL)


def build_baseline(ref, build_dir):
    """offload_server of git `ref` (Release, ccache when present): its path."""
    base = build_dir + '-baseline'
    src = os.path.join(base, 'src')
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    sha = subprocess.run(['git', '-C', ROOT, 'rev-parse', '--verify', ref + '^{commit}'],
                         stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    log(f'$ git archive {ref} ({sha[:12]}) | tar -x -C {src}')
    archive = subprocess.Popen(['git', '-C', ROOT, 'archive', sha], stdout=subprocess.PIPE)
    subprocess.run(['tar', '-x', '-C', src], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f'git archive {ref} failed')
    cmake = ['cmake', '-S', src, '-B', os.path.join(base, 'build'), '-G', 'Ninja',
             '-DCMAKE_BUILD_TYPE=Release', '-DOFFLOAD_BUILD_TESTS=OFF', '-DOFFLOAD_BUILD_BENCH=OFF']
    if shutil.which('ccache'):
        cmake += ['-DCMAKE_CXX_COMPILER_LAUNCHER=ccache', '-DCMAKE_C_COMPILER_LAUNCHER=ccache']
    run_cmd(cmake, stdout=subprocess.DEVNULL)
    run_cmd(['cmake', '--build', os.path.join(base, 'build'), '-j', str(os.cpu_count() or 2),
             '--target', 'offload_server'], stdout=subprocess.DEVNULL)
    return os.path.join(base, 'build', 'bin', 'offload_server'), sha


def npm_ci():
    """`npm ci` in tests/bench/peer when node_modules is missing or older than the lock file."""
    stamp = os.path.join(PEER_DIR, 'node_modules', '.package-lock.json')
    lock = os.path.join(PEER_DIR, 'package-lock.json')
    if not os.path.exists(stamp) or os.path.getmtime(lock) > os.path.getmtime(stamp):
        run_cmd(['npm', 'ci', '--no-audit', '--no-fund', '--loglevel=error'], cwd=PEER_DIR)


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loopback_ports import free_port  # noqa: E402  (below the ephemeral range)


# ------------------------------------------------------------------------------------------------
# Raw in-process figures

def crypto_bench(build_dir, short, workdir):
    out = os.path.join(workdir, 'crypto_bench.json')
    cmd = [os.path.join(build_dir, 'bin', 'crypto_bench'),
           '--benchmark_filter=^BM_(Ed25519Verify|X25519Derive|ChaCha20Poly1305Open)/',
           '--benchmark_out=' + out, '--benchmark_out_format=json']
    if short:
        cmd += ['--benchmark_min_time=0.2']
    else:
        cmd += ['--benchmark_repetitions=3', '--benchmark_report_aggregates_only=true']
    run_cmd(cmd, stdout=subprocess.DEVNULL)
    with open(out) as f:
        data = json.load(f)
    raw = {}
    scale = {'ns': 1e-3, 'us': 1.0, 'ms': 1e3}
    for b in data['benchmarks']:
        if b.get('run_type') == 'aggregate' and b.get('aggregate_name') != 'median':
            continue
        name = b.get('run_name', b['name'])
        raw[name] = b['cpu_time'] * scale[b['time_unit']]
    return raw, data.get('context', {})


# ------------------------------------------------------------------------------------------------
# Servers

class Server:
    """A server process on a free loopback port: ours (offload_server) or the Node peer."""

    def __init__(self, name, cmd, env, ready_pattern, workdir):
        self.name = name
        self.log_path = os.path.join(workdir, name + '.log')
        self.log = open(self.log_path, 'w')
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline:
            with open(self.log_path) as f:
                m = re.search(ready_pattern, f.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if self.port is None:
            self.stop()
            with open(self.log_path) as f:
                raise RuntimeError(f'{name} did not start:\n{f.read()}')

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_ours(build_dir, workdir, name='ours', extra=(), binary=None):
    """Our server (build_dir/bin/offload_server, or `binary`) on loopback ports, fresh data dir."""
    data = os.path.join(workdir, name + '-data')
    os.makedirs(data, exist_ok=True)
    env = dict(os.environ, OFFLOAD_KEK=os.urandom(32).hex())
    http_port = free_port()
    cmd = [binary or os.path.join(build_dir, 'bin', 'offload_server'), '--grpc_address=127.0.0.1:0',
           '--data_dir=' + data, f'--http_address=127.0.0.1:{http_port}',
           f'--metrics_address=127.0.0.1:{free_port()}'] + list(extra)
    server = Server(name, cmd, env, r'"grpc_port":(\d+)', workdir)
    server.http_port = http_port
    return server


def start_minimal(build_dir, workdir):
    cmd = [os.path.join(build_dir, 'bin', 'minimal_server'), '--address=127.0.0.1:0']
    return Server('minimal', cmd, dict(os.environ), r'"grpc_port":(\d+)', workdir)


# The workloads the minimal server serves (no X25519, no memo).
MINIMAL_WORKLOADS = ('--workload=verify', '--workload=batch_verify', '--workload=open',
                     '--workload=batch_open')


def start_peer(mode, workdir):
    cmd = ['node', os.path.join(PEER_DIR, 'server.js'), '--mode=' + mode,
           '--address=127.0.0.1:0', '--proto_dir=' + os.path.join(ROOT, 'proto')]
    return Server('peer-' + mode, cmd, dict(os.environ), r'"grpc_port":(\d+)', workdir)


# ------------------------------------------------------------------------------------------------
# Workloads

def workloads(peer):
    """(label, offload_load flags, kind) for each run; `peer` keeps only the cold ones."""
    out = []

    def add(label, flags, warm_flags=()):
        out.append((label + ' cold', list(flags) + ['--mode=cold'], label, 'cold'))
        if not peer:
            out.append((label + ' warm', list(flags) + ['--mode=warm'] + list(warm_flags),
                        label, 'warm'))

    add('Verify', ['--workload=verify'])
    for b in (1, 8, 64, 256):
        add(f'BatchVerify({b})', ['--workload=batch_verify', f'--batch={b}'],
            [f'--warm_set={max(b, 64)}'])
    add('Derive', ['--workload=derive'])
    add('BatchDerive(64)', ['--workload=batch_derive', '--batch=64'])
    for size, name, warm_set in ((1024, '1 KB', 64), (KB55, '55 KB', 16), (B55000, '55,000 B', 16)):
        common = ['--aead=chacha20', f'--size={size}']
        add(f'Open {name}', ['--workload=open'] + common, [f'--warm_set={warm_set}'])
        add(f'BatchOpen(16) {name}', ['--workload=batch_open', '--batch=16'] + common,
            [f'--warm_set={warm_set}'])
    return out


# Fastest plausible items/s per cold verify workload on this machine, to size the signatures
# made beforehand (the run ends early, and says so, if they run out).
COLD_VERIFY_RATE = {'verify': 15000, 'batch_verify': 45000}


class Runner:
    def __init__(self, build_dir, warmup, duration):
        self.load = os.path.join(build_dir, 'bin', 'offload_load')
        self.warmup = warmup
        self.duration = duration
        self.failed = []

    def run(self, server, label, flags, rate=0.0):
        flags = list(flags)
        if '--mode=cold' in flags and any(f in flags for f in ('--workload=verify',
                                                               '--workload=batch_verify')):
            per_s = rate if rate > 0 else COLD_VERIFY_RATE[
                'verify' if '--workload=verify' in flags else 'batch_verify']
            flags.append(f'--cold_items={int(per_s * (self.warmup + self.duration) * 1.2) + 1000}')
        cmd = [self.load, f'--server=127.0.0.1:{server.port}', f'--server_pid={server.pid}',
               f'--warmup={self.warmup}', f'--duration={self.duration}',
               f'--label={label}'] + flags
        if rate > 0:
            cmd += [f'--rate={rate:.0f}', '--inflight=64']
        log(f'[{server.name}] {label}')
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in p.stdout.splitlines():
            if not line.startswith('|'):
                log('    ' + line)
        row = parse_row(p.stdout)
        if p.returncode != 0 or row is None or row['errors'] > 0:
            self.failed.append(f'{server.name}: {label}')
            log(f'    FAILED (exit {p.returncode})')
        if row is not None:
            row['ended_early'] = 'ended early' in p.stdout
        return row


def parse_row(output):
    rows = [l for l in output.splitlines() if l.startswith('| ')]
    if not rows:
        return None
    cells = [c.strip() for c in rows[-1].strip('|').split('|')]
    if len(cells) != 9:
        return None
    label, items, calls, p50, p99, p999, hit, errors, cpu = cells
    return {'label': label, 'items_s': float(items), 'calls_s': float(calls), 'p50': float(p50),
            'p99': float(p99), 'p999': float(p999), 'hit': float(hit), 'errors': int(errors),
            'cpu': float(cpu) if cpu != '-' else None}


# ------------------------------------------------------------------------------------------------
# Issue 15: h2load with fixed request bodies, and memo_bench in process

def proc_cpu_seconds(pid):
    """utime + stime of `pid` (/proc/<pid>/stat), in seconds."""
    with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def write_request(runner, server, flags, path):
    """offload_load --write_request: the workload's first request as a body file (keys kept)."""
    cmd = [runner.load, f'--server=127.0.0.1:{server.port}', '--write_request=' + path] + flags
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return path


def grpc_call_ok(port, grpc_path, body_file):
    """One call of the framed body with curl: does the server answer grpc-status 0?"""
    p = subprocess.run(['curl', '-s', '-v', '--http2-prior-knowledge', '-o', '/dev/null',
                        '-H', 'content-type: application/grpc', '-H', 'te: trailers',
                        '--data-binary', '@' + body_file, f'http://127.0.0.1:{port}{grpc_path}'],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return re.search(r'grpc-status: 0\b', p.stdout) is not None


def h2load(pid, url, body_file, headers, h1, seconds, warmup):
    """h2load with a fixed body; 8 requests in flight (2 connections x 4 streams, or 8 HTTP/1.1
    keep-alive connections). Returns req/s, 2xx count, non-2xx + errors, server CPU us/request."""
    cmd = ['h2load', '-d', body_file]
    for h in headers:
        cmd += ['-H', h]
    cmd += ['--h1', '-c', '8', '-m', '1'] if h1 else ['-c', '2', '-m', '4']
    # h2load's -D takes whole seconds.
    subprocess.run(cmd + ['-D', str(max(1, round(warmup))), url], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    c0 = proc_cpu_seconds(pid)
    p = subprocess.run(cmd + ['-D', str(max(1, round(seconds))), url], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    c1 = proc_cpu_seconds(pid)
    m = re.search(r'finished in [^,]*, ([\d.]+) req/s', p.stdout)
    codes = re.search(r'status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx', p.stdout)
    req = re.search(r'requests: \d+ total, \d+ started, \d+ done, \d+ succeeded, (\d+) failed, '
                    r'(\d+) errored', p.stdout)
    ok = int(codes.group(1)) if codes else 0
    bad = (sum(int(codes.group(i)) for i in (2, 3, 4)) if codes else 1) + \
          (int(req.group(1)) + int(req.group(2)) if req else 1)
    return {'rps': float(m.group(1)) if m else 0.0, 'ok': ok, 'bad': bad,
            'cpu': (c1 - c0) * 1e6 / ok if ok else None}


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def h2load_section(build_dir, workdir, servers, rounds, warmup, duration, runner):
    """Issue 15's fixed-body rows: {row: {series: [cpu us per item per round]}} plus req/s."""
    grpc_h = ['content-type: application/grpc', 'te: trailers']
    connect_h = ['content-type: application/proto', 'connect-protocol-version: 1']
    mini, nomemo, ours = servers['minimal'], servers['ours_nomemo'], servers['ours']
    body = lambda name: os.path.join(workdir, name + '.bin')
    verify = write_request(runner, mini, ['--workload=verify', '--mode=cold', '--cold_items=1'],
                           body('verify'))
    batch = write_request(runner, mini, ['--workload=batch_verify', '--batch=64', '--mode=cold',
                                         '--cold_items=64'], body('batch64'))
    # BatchDerive names an X25519 key of the server that gets the body: one body per server.
    derive_flags = ['--workload=batch_derive', '--batch=64', '--mode=cold', '--cold_items=64']
    ab = 'baseline' in servers
    pairs = (('nomemo', 'ours_nomemo'), ('ours', 'ours'))
    if ab:
        pairs += (('baseline_nomemo', 'baseline_nomemo'), ('baseline', 'baseline'))
    derives = {name: write_request(runner, servers[key], derive_flags, body('derive64-' + name))
               for name, key in pairs}
    open_flags = ['--workload=open', '--aead=chacha20', f'--size={B55000}', '--mode=warm',
                  '--warm_set=1']
    opens = {name: write_request(runner, servers[key], open_flags, body('open-' + name))
             for name, key in (('minimal', 'minimal'),) + pairs}
    V, BV, BD, OP = ('/offload.v1.Ed25519Service/Verify', '/offload.v1.Ed25519Service/BatchVerify',
                     '/offload.v1.X25519Service/BatchDerive', '/offload.v1.AeadService/Open')
    # (row, series, server, path, body, items per request, connect?, http/1.1?)
    plan = [
        ('Verify fresh', 'minimal', mini, V, verify + '.grpc', 1, False, False),
        ('Verify fresh', 'ours', nomemo, V, verify + '.grpc', 1, False, False),
        ('BatchVerify(64) fresh', 'minimal', mini, BV, batch + '.grpc', 64, False, False),
        ('BatchVerify(64) fresh', 'ours', nomemo, BV, batch + '.grpc', 64, False, False),
        # The same 64 triples every request: after the first, all 64 are memo hits.
        ('BatchVerify(64) memo hit', 'ours', ours, BV, batch + '.grpc', 64, False, False),
        ('BatchDerive(64) fresh', 'ours', nomemo, BD, derives['nomemo'] + '.grpc', 64, False, False),
        ('BatchDerive(64) memo hit', 'ours', ours, BD, derives['ours'] + '.grpc', 64, False, False),
        ('Open 55,000 B fresh', 'minimal', mini, OP, opens['minimal'] + '.grpc', 1, False, False),
        ('Open 55,000 B fresh', 'ours', nomemo, OP, opens['nomemo'] + '.grpc', 1, False, False),
        ('Open 55,000 B memo hit', 'ours gRPC', ours, OP, opens['ours'] + '.grpc', 1, False, False),
        ('Open 55,000 B memo hit', 'ours Connect h2c', ours, OP, opens['ours'], 1, True, False),
        ('Open 55,000 B memo hit', 'ours Connect HTTP/1.1', ours, OP, opens['ours'], 1, True, True),
    ]
    if ab:
        # Every row of ours on the baseline build too, right after ours (its own bodies where
        # they name its keys), as "<series> (baseline)".
        twin = {id(nomemo): servers['baseline_nomemo'], id(ours): servers['baseline']}
        # Bodies that name a server's keys, by that server's: ours -> the baseline's.
        theirs = {derives['nomemo']: derives['baseline_nomemo'], derives['ours']: derives['baseline'],
                  opens['nomemo']: opens['baseline_nomemo'], opens['ours']: opens['baseline']}
        mirrored = []
        for row, series, server, path, b, items, connect, h1 in plan:
            mirrored.append((row, series, server, path, b, items, connect, h1))
            if id(server) in twin:
                b_other = b
                for mine, other in theirs.items():
                    if b == mine or b == mine + '.grpc':
                        b_other = other + b[len(mine):]
                mirrored.append((row, series + ' (baseline)', twin[id(server)], path, b_other,
                                 items, connect, h1))
        plan = mirrored
    for _, series, server, path, b, _, connect, _ in plan:
        if not connect and not grpc_call_ok(server.port, path, b):
            runner.failed.append(f'{series}: {path} did not answer grpc-status 0')
    out = {}
    raw_bv = []
    for r in range(rounds):
        # Issue 24: raw libsodium over the same 64 triples the BatchVerify(64) rows send.
        p = subprocess.run([os.path.join(build_dir, 'bin', 'raw_batch_verify'), '--request=' + batch,
                            f'--seconds={max(1.0, duration / 2)}'], stdout=subprocess.PIPE, text=True)
        log(f'[raw_batch_verify round {r + 1}] {p.stdout.strip()}')
        if p.returncode != 0:
            runner.failed.append('raw_batch_verify failed')
        else:
            raw_bv.append(json.loads(p.stdout)['cpu_us_per_verify'])
        order = plan
        if ab and r % 2 == 1:  # the baseline twin first in every other round
            order = []
            for entry in plan:
                if entry[1].endswith(' (baseline)') and order and order[-1][0] == entry[0]:
                    order.insert(len(order) - 1, entry)
                else:
                    order.append(entry)
        for row, series, server, path, b, items, connect, h1 in order:
            port = server.http_port if connect else server.port
            log(f'[h2load round {r + 1}] {row}: {series}')
            res = h2load(server.pid, f'http://127.0.0.1:{port}{path}', b,
                         connect_h if connect else grpc_h, h1, duration, warmup)
            if res['bad'] or not res['ok']:
                runner.failed.append(f'h2load {row} {series}: {res["bad"]} bad responses')
            cell = out.setdefault(row, {}).setdefault(series, {'cpu': [], 'rps': []})
            cell['cpu'].append(res['cpu'] / items if res['cpu'] is not None else None)
            cell['rps'].append(res['rps'] * items)
    return out, raw_bv


def memo_bench(build_dir, short, workdir):
    """memo_bench's 55,000 B figures (CPU ns -> us): the zero-copy hit and its memcmp."""
    out = os.path.join(workdir, 'memo_bench.json')
    cmd = [os.path.join(build_dir, 'bin', 'memo_bench'),
           '--benchmark_filter=^BM_(MemoOpenHitShared/alg:0/size:55000|PartMemcmp/size:55000|'
           'OpsAeadOpenSharedHit/size:55000|PartOpenDigest/size:56320)$',
           '--benchmark_out=' + out, '--benchmark_out_format=json']
    cmd += ['--benchmark_min_time=0.2'] if short else [
        '--benchmark_repetitions=5', '--benchmark_report_aggregates_only=true']
    run_cmd(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        data = json.load(f)
    scale = {'ns': 1e-3, 'us': 1.0, 'ms': 1e3}
    res = {}
    for b in data['benchmarks']:
        if b.get('run_type') == 'aggregate' and b.get('aggregate_name') != 'median':
            continue
        res[b.get('run_name', b['name'])] = b['cpu_time'] * scale[b['time_unit']]
    return res


# ------------------------------------------------------------------------------------------------
# The report

def fmt(x, digits=0, unit=''):
    if x is None:
        return '-'
    if digits == 0:
        return f'{x:,.0f}{unit}'
    return f'{x:.{digits}f}{unit}'


def ratio(a, b):
    return a / b if a is not None and b else None


def report(ctx):
    raw, ours, peers, half = ctx['raw'], ctx['ours'], ctx['peers'], ctx['half']
    lines = []
    w = lines.append
    w(f"Command: `{ctx['command']}`  ")
    w(f"Date: {ctx['date']} (run took {ctx['elapsed']:.0f} s); {ctx['mode']} mode: warm-up "
      f"{ctx['warmup']} s + {ctx['duration']} s measured per workload.  ")
    w(f"Machine: {ctx['machine']}; load average {ctx['load_before']} before, "
      f"{ctx['load_after']} after.  ")
    w(f"Peer: node {ctx['node']} (OpenSSL {ctx['node_openssl']}), @grpc/grpc-js "
      f"{ctx['grpc_js']}. Server backends: {ctx['backends']}.  ")
    w('The machine is shared and noisy (other builds run on the same 2 cores): absolute figures '
      'vary run to run; the ratios compare figures measured in this same run. Server CPU per item '
      '(/proc/<pid>/stat of the server over the window) is the steadier figure: the load '
      'generator runs on the same cores and takes CPU from the server, which lowers items/s.')
    w('')
    w('### Raw, in process (crypto_bench, CPU time per operation)')
    w('')
    w('| operation | libsodium | OpenSSL |')
    w('| --- | ---: | ---: |')
    for title, key in (('Ed25519 verify (64 B message)', 'BM_Ed25519Verify/backend:{}'),
                       ('X25519', 'BM_X25519Derive/backend:{}'),
                       ('ChaCha20-Poly1305 open 1 KB', 'BM_ChaCha20Poly1305Open/backend:{}/bytes:1024'),
                       ('ChaCha20-Poly1305 open 55 KB', 'BM_ChaCha20Poly1305Open/backend:{}/bytes:56320')):
        w(f'| {title} | {fmt(raw.get(key.format(0)), 2, " us")} | '
          f'{fmt(raw.get(key.format(1)), 2, " us")} |')
    w('')
    w('### Our server and the Node.js peer (same workloads, same run)')
    w('')
    w('Items/s and server CPU us per item; p99 is per call (ms). The peer has no memo, so it runs '
      'the cold workloads only; "vs peer" divides our items/s by the better peer configuration\'s '
      'cold items/s for the same workload.')
    w('')
    w('| workload | ours items/s | ours CPU us/item | ours p99 ms | memo hit | '
      'peer cached items/s | peer cached CPU us/item | peer parse items/s | '
      'peer parse CPU us/item | vs peer |')
    w('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
    for label, row in ours.items():
        base, kind = row['base'], row['kind']
        pc = peers['cached'].get(base + ' cold')
        pp = peers['parse'].get(base + ' cold')
        best = max([p['items_s'] for p in (pc, pp) if p] or [0]) or None
        show_peer = kind == 'cold'
        w(f"| {label}{' (ended early)' if row.get('ended_early') else ''} | "
          f"{fmt(row['items_s'])} | {fmt(row['cpu'], 1)} | {fmt(row['p99'], 2)} | "
          f"{row['hit']:.2f} | "
          f"{fmt(pc['items_s']) if pc and show_peer else ''} | "
          f"{fmt(pc['cpu'], 1) if pc and show_peer else ''} | "
          f"{fmt(pp['items_s']) if pp and show_peer else ''} | "
          f"{fmt(pp['cpu'], 1) if pp and show_peer else ''} | "
          f"{fmt(ratio(row['items_s'], best), 2, 'x')} |")
    w('')
    w('### Unary Verify at half the measured capacity (open loop, fresh signatures)')
    w('')
    w('| server | capacity (closed loop) | offered calls/s | achieved | p50 ms | p99 ms | p999 ms |')
    w('| --- | ---: | ---: | ---: | ---: | ---: | ---: |')
    for name, h in half.items():
        if h['row']:
            w(f"| {name} | {fmt(h['capacity'])} | {fmt(h['rate'])} | {fmt(h['row']['calls_s'])} | "
              f"{fmt(h['row']['p50'], 2)} | {fmt(h['row']['p99'], 2)} | {fmt(h['row']['p999'], 2)} |")
    w('')
    w('### Issue 4 targets')
    w('')
    w('| target | measured | limit | result |')
    w('| --- | ---: | ---: | --- |')
    for name, measured, limit, ok in targets(ctx):
        w(f"| {name} | {measured} | {limit} | {'met' if ok else ('missed' if ok is False else 'n/a')} |")
    report_issue15(ctx, w)
    if ctx.get('baseline'):
        report_ab(ctx, w)
    if ctx['failed']:
        w('')
        w('Runs that failed or reported errors: ' + '; '.join(ctx['failed']))
    return '\n'.join(lines) + '\n'


def report_ab(ctx, w):
    """This build against --baseline_server, every figure from the same run."""
    ours, base, h2 = ctx['ours'], ctx['baseline'], ctx.get('h2') or {}
    w('')
    w('## A/B: this build against the baseline build (same run)')
    w('')
    w(f"This build: {ctx.get('this_commit') or '?'} (and its working tree). Baseline: "
      f"{ctx.get('baseline_ref') or ctx['baseline_server']}"
      f"{' (`' + ctx['baseline_server'] + '`)' if ctx.get('baseline_ref') else ''}, started beside "
      "ours with the same flags; each "
      'workload ran on both back to back (the baseline first every other workload), each h2load '
      'row on both in every round (the baseline first every other round). Ratio: this build / '
      'the baseline (server CPU per item: under 1 is cheaper).')
    w('')
    w('| workload | this CPU us/item | baseline CPU us/item | ratio | this items/s | '
      'baseline items/s | this p99 ms | baseline p99 ms |')
    w('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
    for label, o in ours.items():
        b = base.get(label)
        if not b:
            continue
        w(f"| {label} | {fmt(o['cpu'], 1)} | {fmt(b['cpu'], 1)} | "
          f"{fmt(ratio(o['cpu'], b['cpu']), 2, 'x')} | {fmt(o['items_s'])} | "
          f"{fmt(b['items_s'])} | {fmt(o['p99'], 2)} | {fmt(b['p99'], 2)} |")
    w('')
    w('| h2load row | series | this CPU us/item (median [min-max]) | baseline | ratio of medians |')
    w('| --- | --- | ---: | ---: | ---: |')
    for row, series_map in h2.items():
        for series, cell in series_map.items():
            twin = series_map.get(series + ' (baseline)')
            if series.endswith(' (baseline)') or twin is None:
                continue
            xs = [x for x in cell['cpu'] if x is not None]
            ys = [y for y in twin['cpu'] if y is not None]
            spread = lambda v: f' [{min(v):.1f}-{max(v):.1f}]' if v else ''
            w(f"| {row} | {series} | {fmt(median(xs), 1)}{spread(xs)} | "
              f"{fmt(median(ys), 1)}{spread(ys)} | {fmt(ratio(median(xs), median(ys)), 2, 'x')} |")


def report_issue15(ctx, w):
    ours, mini, h2, mb, raw = ctx['ours'], ctx['minimal'], ctx['h2'], ctx['memo_bench'], ctx['raw']
    w('')
    w('## Issue 15: against a minimal C++ gRPC server')
    w('')
    w('### offload_load, fresh inputs (cold), ours (memo on) and the minimal server')
    w('')
    w('| workload | ours CPU us/item | minimal CPU us/item | ours / minimal | ours items/s | '
      'minimal items/s |')
    w('| --- | ---: | ---: | ---: | ---: | ---: |')
    for label, m in mini.items():
        o = ours.get(label)
        if not o:
            continue
        w(f"| {label} | {fmt(o['cpu'], 1)} | {fmt(m['cpu'], 1)} | "
          f"{fmt(ratio(o['cpu'], m['cpu']), 2, 'x')} | {fmt(o['items_s'])} | {fmt(m['items_s'])} |")
    w('')
    w(f"### h2load, a fixed body, 8 requests in flight ({ctx['h2_rounds']} rounds, servers "
      'alternated; median [min-max] of server CPU us per item)')
    w('')
    w('Fresh rows: the minimal server, and ours with `--memo=false` (a repeated body would hit '
      'our memo). Hit rows: ours with the memo on, the same body every request (all its items hit '
      'after the first).')
    w('')
    w('| row | series | server CPU us/item | items/s (median) |')
    w('| --- | --- | ---: | ---: |')
    for row, series_map in h2.items():
        for series, cell in series_map.items():
            xs = [x for x in cell['cpu'] if x is not None]
            spread = f' [{min(xs):.1f}-{max(xs):.1f}]' if xs else ''
            w(f"| {row} | {series} | {fmt(median(xs), 1)}{spread} | {fmt(median(cell['rps']))} |")
    w('')
    w('### In process (memo_bench, CPU time, median)')
    w('')
    w('| what | us |')
    w('| --- | ---: |')
    for name, key in (('Open hit, 55,000 B, Memo API (digest, lookup, memcmp, buffer reference)',
                       'BM_MemoOpenHitShared/alg:0/size:55000'),
                      ('Open hit, 55,000 B, through ops::Operations (key, envelope, digest, lookup)',
                       'BM_OpsAeadOpenSharedHit/size:55000'),
                      ('memcmp of 55,016 B (the stored ciphertext and tag)', 'BM_PartMemcmp/size:55000'),
                      ('open digest (BLAKE2b of nonce, tag, length, AAD)', 'BM_PartOpenDigest/size:56320')):
        w(f'| {name} | {fmt(mb.get(key), 3)} |')
    w('')
    w('### Issue 15 targets')
    w('')
    w('| target | measured | limit | result |')
    w('| --- | ---: | ---: | --- |')
    for name, measured, limit, ok in targets15(ctx):
        w(f"| {name} | {measured} | {limit} | {'met' if ok else ('missed' if ok is False else 'n/a')} |")
    report_issue24(ctx, w)


def report_issue24(ctx, w):
    w('')
    w('## Issue 24 targets (the gRPC port on our engine)')
    w('')
    rb = ctx.get('raw_bv') or []
    w('Measured: h2load, fixed body, median of the rounds (server CPU us per item from /proc; '
      'fresh = ours with `--memo=false`). Cross-check: the same ratio from offload_load (fresh '
      'inputs, memo on). Raw libsodium over the same 64 triples: raw_batch_verify on the h2load '
      f"BatchVerify(64) body, median of {len(rb)} runs: {fmt(median(rb), 2, ' us')} per verify"
      + (f' [{min(rb):.2f}-{max(rb):.2f}]' if rb else '') + '.')
    w('')
    w('| target | measured (h2load) | bound | result | cross-check (offload_load) |')
    w('| --- | ---: | ---: | --- | ---: |')
    for name, measured, limit, ok, cross in targets24(ctx):
        w(f"| {name} | {measured} | {limit} | {'met' if ok else ('missed' if ok is False else 'n/a')} "
          f"| {cross} |")


def targets24(ctx):
    """Issue 24's rows: (target, measured, bound, ok, offload_load cross-check)."""
    ours, mini, h2 = ctx['ours'], ctx['minimal'], ctx['h2']
    h = lambda row, series: median(h2.get(row, {}).get(series, {}).get('cpu', []))
    hr = lambda row: median(h2.get(row, {}).get('ours', {}).get('rps', []))
    oc = lambda label: ours.get(label, {}).get('cpu')
    mc = lambda label: mini.get(label, {}).get('cpu')
    oi = lambda label: ours.get(label, {}).get('items_s')
    raw_bv = median(ctx.get('raw_bv') or [])
    out = []

    def add(name, value, limit, cross, le=True):
        ok = None if value is None else (value <= limit if le else value >= limit)
        out.append((name, '-' if value is None else f'{value:.2f}x',
                    f"{'<=' if le else '>='} {limit:.2f}x", ok,
                    '-' if cross is None else f'{cross:.2f}x'))

    add('unary Verify fresh: server CPU/item, ours / minimal',
        ratio(h('Verify fresh', 'ours'), h('Verify fresh', 'minimal')), 0.80,
        ratio(oc('Verify cold'), mc('Verify cold')))
    add('BatchVerify(64) fresh: server CPU/item, ours / raw libsodium over the same 64 triples',
        ratio(h('BatchVerify(64) fresh', 'ours'), raw_bv), 1.03,
        ratio(oc('BatchVerify(64) cold'), raw_bv))
    add('AEAD Open 55,000 B fresh: server CPU/item, ours / minimal',
        ratio(h('Open 55,000 B fresh', 'ours'), h('Open 55,000 B fresh', 'minimal')), 0.60,
        ratio(oc('Open 55,000 B cold'), mc('Open 55,000 B cold')))
    add('AEAD Open 55,000 B memo hit (gRPC): server CPU/item, ours / minimal fresh open',
        ratio(h('Open 55,000 B memo hit', 'ours gRPC'), h('Open 55,000 B fresh', 'minimal')), 0.25,
        ratio(oc('Open 55,000 B warm'), mc('Open 55,000 B cold')))
    add('BatchVerify(64) memo hits / fresh, items/s (ours)',
        ratio(hr('BatchVerify(64) memo hit'), hr('BatchVerify(64) fresh')), 30,
        ratio(oi('BatchVerify(64) warm'), oi('BatchVerify(64) cold')), le=False)
    add('BatchDerive(64) memo hits / fresh, items/s (ours)',
        ratio(hr('BatchDerive(64) memo hit'), hr('BatchDerive(64) fresh')), 20,
        ratio(oi('BatchDerive(64) warm'), oi('BatchDerive(64) cold')), le=False)
    return out


def targets15(ctx):
    ours, mini, h2, mb, raw = ctx['ours'], ctx['minimal'], ctx['h2'], ctx['memo_bench'], ctx['raw']
    out = []
    h = lambda row, series: median(h2.get(row, {}).get(series, {}).get('cpu', []))
    oc = lambda label: ours.get(label, {}).get('cpu')
    mc = lambda label: mini.get(label, {}).get('cpu')

    def add(name, value, limit, le=True, unit='x'):
        ok = None if value is None or limit is None else (value <= limit if le else value >= limit)
        out.append((name, '-' if value is None else f'{value:.2f}{unit}',
                    '-' if limit is None else f"{'<=' if le else '>='} {limit:.2f}{unit}", ok))

    add('unary Verify fresh, ours / minimal (h2load)', ratio(h('Verify fresh', 'ours'),
                                                              h('Verify fresh', 'minimal')), 1.00)
    add('unary Verify fresh, ours / minimal (offload_load cold)',
        ratio(oc('Verify cold'), mc('Verify cold')), 1.00)
    add('BatchVerify(64) fresh, ours / minimal (h2load)',
        ratio(h('BatchVerify(64) fresh', 'ours'), h('BatchVerify(64) fresh', 'minimal')), 1.00)
    add('BatchVerify(64) fresh, ours / minimal (offload_load cold)',
        ratio(oc('BatchVerify(64) cold'), mc('BatchVerify(64) cold')), 1.00)
    verify_raw = raw.get('BM_Ed25519Verify/backend:0')
    add('BatchVerify(64) fresh, ours / raw libsodium verify (h2load, 64 triples)',
        ratio(h('BatchVerify(64) fresh', 'ours'), verify_raw), 1.05)
    add('BatchVerify(64) fresh, ours / raw libsodium verify (offload_load cold)',
        ratio(oc('BatchVerify(64) cold'), verify_raw), 1.05)
    add('AEAD Open 55,000 B fresh, ours / minimal (h2load)',
        ratio(h('Open 55,000 B fresh', 'ours'), h('Open 55,000 B fresh', 'minimal')), 0.90)
    add('AEAD Open 55,000 B fresh, ours / minimal (offload_load cold)',
        ratio(oc('Open 55,000 B cold'), mc('Open 55,000 B cold')), 0.90)
    add('AEAD Open 55,000 B memo hit over gRPC / minimal fresh open (h2load)',
        ratio(h('Open 55,000 B memo hit', 'ours gRPC'), h('Open 55,000 B fresh', 'minimal')), 0.35)
    add('AEAD Open 55,000 B memo hit over gRPC (offload_load warm) / minimal fresh (offload_load)',
        ratio(oc('Open 55,000 B warm'), mc('Open 55,000 B cold')), 0.35)
    memcmp = mb.get('BM_PartMemcmp/size:55000')
    add('in process: 55,000 B hit (Memo API) <= memcmp + 1 us', mb.get(
        'BM_MemoOpenHitShared/alg:0/size:55000'), memcmp + 1 if memcmp else None, unit=' us')
    add('in process: 55,000 B hit (ops::Operations) <= memcmp + 1 us', mb.get(
        'BM_OpsAeadOpenSharedHit/size:55000'), memcmp + 1 if memcmp else None, unit=' us')
    g = h('Open 55,000 B memo hit', 'ours gRPC')
    add('memo hit over Connect h2c / over gRPC',
        ratio(h('Open 55,000 B memo hit', 'ours Connect h2c'), g), 1.3)
    add('memo hit over Connect HTTP/1.1 keep-alive / over gRPC',
        ratio(h('Open 55,000 B memo hit', 'ours Connect HTTP/1.1'), g), 1.3)
    hr = lambda row: median(h2.get(row, {}).get('ours', {}).get('rps', []))
    for base, limit in (('BatchVerify(64)', 30), ('BatchDerive(64)', 20)):
        add(f'{base} memo hits / fresh, items/s (h2load, ours memo on / memo off)',
            ratio(hr(base + ' memo hit'), hr(base + ' fresh')), limit, le=False)
        add(f'{base} memo hits / fresh, items/s (offload_load warm / cold)',
            ratio(ours.get(base + ' warm', {}).get('items_s'),
                  ours.get(base + ' cold', {}).get('items_s')), limit, le=False)
    return out


def targets(ctx):
    raw, ours, peers, half = ctx['raw'], ctx['ours'], ctx['peers'], ctx['half']
    get = lambda label, key: ours.get(label, {}).get(key)
    verify_raw = [raw.get(f'BM_Ed25519Verify/backend:{i}') for i in (0, 1)]
    verify_raw = min([v for v in verify_raw if v] or [None]) if any(verify_raw) else None
    chacha_raw = raw.get(f'BM_ChaCha20Poly1305Open/backend:1/bytes:{KB55}')

    def peer_best(base):
        vals = [p.get(base + ' cold', {}).get('items_s') for p in peers.values()]
        vals = [v for v in vals if v]
        return max(vals) if vals else None

    out = []

    def add(name, value, limit, ok, vfmt, lfmt, note=''):
        out.append((name, (vfmt(value) + note) if value is not None else '-',
                    lfmt(limit) if limit is not None else '-',
                    None if value is None or limit is None else ok(value, limit)))

    le = lambda v, l: v <= l
    ge = lambda v, l: v >= l
    x2 = lambda v: f'{v:.2f}x'
    x1 = lambda v: f'{v:.1f}x'
    us = lambda v: f'{v:.1f} us'
    bv64 = get('BatchVerify(64) cold', 'cpu')
    add('BatchVerify(64) fresh: server CPU per item / raw verify (fastest backend)',
        ratio(bv64, verify_raw), 1.05, le, x2, x2)
    v = get('Verify cold', 'cpu')
    add('Unary Verify (fresh): server CPU per call <= raw verify + 15 us', v,
        verify_raw + 15 if verify_raw else None, le, us, us)
    add('BatchVerify(64) items/s vs the Node peer\'s best',
        ratio(get('BatchVerify(64) cold', 'items_s'), peer_best('BatchVerify(64)')), 3.3, ge, x2, x2)
    add('Unary Verify items/s vs the Node peer\'s best',
        ratio(get('Verify cold', 'items_s'), peer_best('Verify')), 2.8, ge, x2, x2)

    def warm_cold(name, base, limit):
        cpu = ratio(get(base + ' cold', 'cpu'), get(base + ' warm', 'cpu'))
        add(f'{name} warm / cold items/s', ratio(get(base + ' warm', 'items_s'),
                                                 get(base + ' cold', 'items_s')),
            limit, ge, x2, x1, f' (server CPU/item cold / warm: {cpu:.1f}x)' if cpu else '')

    warm_cold('BatchVerify(64)', 'BatchVerify(64)', 20)
    warm_cold('BatchDerive(64)', 'BatchDerive(64)', 20)
    warm_cold('AEAD Open 55 KB (unary Open)', 'Open 55 KB', 10)
    warm_cold('AEAD Open 55 KB (BatchOpen(16))', 'BatchOpen(16) 55 KB', 10)
    add('AEAD Open 55 KB cold: server CPU per item / raw OpenSSL ChaCha20-Poly1305 (unary Open)',
        ratio(get('Open 55 KB cold', 'cpu'), chacha_raw), 1.2, le, x2, x2)
    add('AEAD Open 55 KB cold: server CPU per item / raw OpenSSL ChaCha20-Poly1305 (BatchOpen(16))',
        ratio(get('BatchOpen(16) 55 KB cold', 'cpu'), chacha_raw), 1.2, le, x2, x2)
    h = half.get('ours', {}).get('row')
    add('Unary Verify p99 at half the measured capacity', h['p99'] if h else None, 2.0, le,
        lambda v: f'{v:.2f} ms', lambda v: f'{v:.1f} ms',
        f" (achieved {h['calls_s']:,.0f} of {half['ours']['rate']:,.0f} calls/s offered)" if h else '')
    return out


# ------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--short', action='store_true', help='2.5 s per workload instead of 10')
    ap.add_argument('--build_dir', default=os.path.join(ROOT, 'build-bench'))
    ap.add_argument('--skip_build', action='store_true', help='use the binaries in --build_dir')
    ap.add_argument('--out', default=None, help='report file (default <build_dir>/bench-table.md)')
    ap.add_argument('--warmup', type=float, default=None)
    ap.add_argument('--duration', type=float, default=None)
    ap.add_argument('--h2load_only', action='store_true',
                    help='only the issue-15 h2load rows and memo_bench (no offload_load, no peer)')
    ap.add_argument('--baseline_server', default=None,
                    help='an offload_server of the tree before a change: A/B against it, same run')
    ap.add_argument('--baseline_ref', default=None,
                    help='a git ref whose offload_server is built and used as --baseline_server')
    ap.add_argument('--h2load_rounds', type=int, default=3,
                    help='alternations of the servers in the h2load rows (median and spread)')
    args = ap.parse_args()
    build_dir = os.path.abspath(args.build_dir)
    out_path = args.out or os.path.join(build_dir, 'bench-table.md')
    warmup = args.warmup if args.warmup is not None else (0.5 if args.short else 1.5)
    duration = args.duration if args.duration is not None else (2.0 if args.short else 8.0)

    started = time.time()
    ctx = {'command': 'tests/bench/run_all.sh ' + ' '.join(sys.argv[1:]),
           'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
           'mode': 'short' if args.short else 'full', 'warmup': warmup, 'duration': duration,
           'load_before': ' / '.join(f'{x:.1f}' for x in os.getloadavg())}
    cpu_model = ''
    try:
        with open('/proc/cpuinfo') as f:
            cpu_model = re.search(r'model name\s*:\s*(.*)', f.read()).group(1)
    except (OSError, AttributeError):
        pass
    ctx['machine'] = f'{os.cpu_count()} CPUs ({cpu_model}), {platform.system()} {platform.release()}'

    if not args.skip_build:
        build(build_dir)
    if args.baseline_ref:
        args.baseline_server, sha = build_baseline(args.baseline_ref, build_dir)
        ctx['baseline_ref'] = f'{args.baseline_ref} ({sha[:12]})'
    ctx['this_commit'] = subprocess.run(['git', '-C', ROOT, 'rev-parse', '--short=12', 'HEAD'],
                                        stdout=subprocess.PIPE, text=True).stdout.strip()
    npm_ci()
    node_info = subprocess.run(['node', '-p', 'JSON.stringify(process.versions)'],
                               stdout=subprocess.PIPE, text=True, check=True).stdout
    ctx['node'] = 'v' + json.loads(node_info)['node']
    ctx['node_openssl'] = json.loads(node_info)['openssl']
    with open(os.path.join(PEER_DIR, 'node_modules', '@grpc', 'grpc-js', 'package.json')) as f:
        ctx['grpc_js'] = json.load(f)['version']

    workdir = tempfile.mkdtemp(prefix='offload-run-all-')
    runner = Runner(build_dir, warmup, duration)
    try:
        log('== raw in-process figures (crypto_bench)')
        ctx['raw'], _ = crypto_bench(build_dir, args.short, workdir)

        # The three servers run side by side (an idle one costs nothing), and each workload runs
        # on ours, then on both peer configurations, back to back: a change in the machine's load
        # during the run then hits the figures that a ratio compares alike.
        log('== servers: ours, the Node.js peer with key objects cached, and parsing per call')
        ctx['ours'], ctx['half'], ctx['peers'] = {}, {}, {'cached': {}, 'parse': {}}
        ctx['minimal'], ctx['baseline'] = {}, {}
        servers = {}
        try:
            servers['ours'] = start_ours(build_dir, workdir)
            servers['minimal'] = start_minimal(build_dir, workdir)
            for mode in (() if args.h2load_only else ('cached', 'parse')):
                servers[mode] = start_peer(mode, workdir)
            with open(servers['ours'].log_path) as f:
                m = re.search(r'"choice":"([^"]*)"', f.read())
            ctx['backends'] = f'`{m.group(1)}`' if m else 'not logged'
            half_names = {'ours': 'ours', 'cached': 'Node peer (cached)', 'parse': 'Node peer (parse)'}
            if args.baseline_server:
                servers['baseline'] = start_ours(build_dir, workdir, 'baseline',
                                                 binary=os.path.abspath(args.baseline_server))
                ctx['baseline_server'] = os.path.abspath(args.baseline_server)
            for i, (label, flags, base, kind) in enumerate(
                    [] if args.h2load_only else workloads(peer=False)):
                names = ('ours', 'cached', 'parse') if kind == 'cold' else ('ours',)
                if kind == 'cold' and any(w in flags for w in MINIMAL_WORKLOADS):
                    names = ('ours', 'minimal', 'cached', 'parse')
                if 'baseline' in servers:  # beside ours, first every other workload
                    names = (('ours', 'baseline') if i % 2 == 0 else ('baseline', 'ours')) + names[1:]
                for name in names:
                    row = runner.run(servers[name], label, flags)
                    if row is None:
                        continue
                    row.update(base=base, kind=kind)
                    if name == 'minimal':
                        ctx['minimal'][label] = row
                        continue
                    if name == 'baseline':
                        ctx['baseline'][label] = row
                        continue
                    (ctx['ours'] if name == 'ours' else ctx['peers'][name])[label] = row
                    if label == 'Verify cold':  # the p99 at half the capacity just measured
                        cap = row['items_s']
                        ctx['half'][half_names[name]] = {
                            'capacity': cap, 'rate': cap / 2, 'row': runner.run(
                                servers[name], 'Verify cold at half capacity', flags, rate=cap / 2)}
            for name in ('cached', 'parse'):  # idle from here on
                if name in servers:
                    servers.pop(name).stop()
            log('== issue 15: h2load, fixed bodies (minimal server, ours memo off, ours memo on)')
            servers['ours_nomemo'] = start_ours(build_dir, workdir, 'ours-nomemo', ['--memo=false'])
            if 'baseline' in servers:
                servers['baseline_nomemo'] = start_ours(
                    build_dir, workdir, 'baseline-nomemo', ['--memo=false'],
                    binary=os.path.abspath(args.baseline_server))
            ctx['h2'], ctx['raw_bv'] = h2load_section(build_dir, workdir, servers, args.h2load_rounds,
                                       warmup, duration, runner)
        finally:
            for server in servers.values():
                server.stop()
        log('== issue 15: memo_bench (in process)')
        ctx['memo_bench'] = memo_bench(build_dir, args.short, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    ctx['failed'] = runner.failed
    ctx['h2_rounds'] = args.h2load_rounds
    ctx['elapsed'] = time.time() - started
    ctx['load_after'] = ' / '.join(f'{x:.1f}' for x in os.getloadavg())
    text = report(ctx)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, 'w') as f:
        f.write(text)
    print(text, end='')
    log(f'report written to {out_path}')
    return 1 if runner.failed else 0


if __name__ == '__main__':
    sys.exit(main())
