#!/usr/bin/python3
"""Issue 34's rows in counts that do not depend on the machine's load: instructions (callgrind),
system calls and context switches (perf stat) per call, for one server binary.

    tests/bench/fresh_call_counts.py --build_dir build --rows verify,open_hit --calls 4000
    tests/bench/fresh_call_counts.py --server /tmp/main/offload_server --callgrind --top 25

Each row of fresh_call.py (ours only: the same servers, flags and bodies) gets its own server
process. Without --callgrind: `h2load -c 2 -m 32 -t 1 -n <calls>` once to warm, then again under
`perf stat -e raw_syscalls:sys_enter,context-switches -p <pid>` (needs root or
perf_event_paranoid <= 1). With --callgrind the server runs under `valgrind --tool=callgrind`
(instrumentation on only around the measured h2load run, which is kept shorter) and the script
prints instructions per call by shared object and, with --top N, the N functions with the most
exclusive instructions. With --perf SECONDS the server runs as it is and a sampling profile is
taken instead: `h2load -c 2 -m 32 -t 1 -D` on the row, and one second in, `perf record -F 2000 -e
cpu-clock -p <pid>` for SECONDS; the script prints the shares of the server's samples by shared
object (the kernel as `[kernel.kallsyms]`) and, with --top N, the N symbols with the most samples.
--floor profiles, for the memo-hit rows, the row's nghttpd GET (the HTTP/2 floor the bound is
against) instead of ours. Nothing is asserted: figures for the README and for finding where the
time goes.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fresh_call as F  # noqa: E402
import run_all as R  # noqa: E402


def h2load(url, body, calls):
    cmd = ['h2load', '-c', '2', '-m', '32', '-t', '1', '-n', str(calls)]
    if body is not None:
        cmd += ['-d', body] + sum((['-H', h] for h in F.GRPC_H), [])
    p = subprocess.run(cmd + [url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    codes = re.search(r'status codes: (\d+) 2xx', p.stdout)
    return int(codes.group(1)) if codes else 0


def annotate(dump, top):
    """({object: instructions}, [(instructions, function)] of the `top` largest)."""
    out = subprocess.run(['callgrind_annotate', '--threshold=100', dump], capture_output=True,
                         text=True).stdout
    objects, funcs = {}, []
    for line in out.splitlines():
        m = re.match(r'^\s*([\d,]+) \([^)]*\)\s+(.*?)\s*\[(.+)\]\s*$', line) or \
            re.match(r'^\s*([\d,]+)\s+(.*?)\s*\[(.+)\]\s*$', line)
        if m:
            n = int(m.group(1).replace(',', ''))
            obj = os.path.basename(m.group(3))
            objects[obj] = objects.get(obj, 0) + n
            funcs.append((n, f'{m.group(2)} [{obj}]'))
    funcs.sort(reverse=True)
    return objects, funcs[:top]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--build_dir', default=os.path.join(R.ROOT, 'build'))
    ap.add_argument('--server', default=None, help='offload_server binary (default: build_dir/bin)')
    ap.add_argument('--rows', default='verify,open,open_hit,bv64,verify_hit,derive,derive_hit')
    ap.add_argument('--calls', type=int, default=4000)
    ap.add_argument('--callgrind', action='store_true')
    ap.add_argument('--top', type=int, default=0)
    ap.add_argument('--extra', action='append', default=[], help='one more server flag')
    ap.add_argument('--keep', action='store_true', help='keep the callgrind dumps (path printed)')
    ap.add_argument('--perf', type=float, default=0,
                    help='seconds of perf record (cpu-clock samples) under load, instead of counts')
    ap.add_argument('--floor', action='store_true',
                    help="with --perf: profile the row's nghttpd GET (memo-hit rows) instead of ours")
    args = ap.parse_args()
    if args.floor and not args.perf:
        ap.error('--floor goes with --perf')
    build_dir = os.path.abspath(args.build_dir)
    binary = args.server or os.path.join(build_dir, 'bin', 'offload_server')
    runner = R.Runner(build_dir, 1, 1)
    for row_id in args.rows.split(','):
        title, series = F.ROWS[row_id]
        name, key, path, b, items = series[0]
        work = tempfile.mkdtemp(prefix='fresh-counts-')
        if args.perf:
            try:
                profile_row(args, build_dir, binary, runner, work, row_id)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            continue
        prefix = ['valgrind', '--tool=callgrind', '--instr-atstart=no',
                  '--callgrind-out-file=' + os.path.join(work, 'cg.%p')] if args.callgrind else []
        extra = (['--memo=false'] if key == 'fresh' else []) + args.extra
        server = start(build_dir, work, key, extra, binary, prefix)
        try:
            bodies = F.make_bodies(runner, {key: server}, work)
            url = f'http://127.0.0.1:{server.port}{path}'
            body = bodies[b] + '.grpc'
            calls = max(200, args.calls // 10) if args.callgrind else args.calls
            h2load(url, body, min(calls, 2000))  # warm: memo entries, buffers, lazy set-up
            if args.callgrind:
                pid = str(server.pid)
                for c in (['-i', 'on'], ['-z']):
                    subprocess.run(['callgrind_control'] + c + [pid], capture_output=True)
                ok = h2load(url, body, calls)
                for c in (['-d', 'run'], ['-i', 'off']):
                    subprocess.run(['callgrind_control'] + c + [pid], capture_output=True)
            else:
                perf = subprocess.Popen(['perf', 'stat', '-x', ',', '-e',
                                         'raw_syscalls:sys_enter,context-switches', '-p',
                                         str(server.pid)], stderr=subprocess.PIPE, text=True)
                ok = h2load(url, body, calls)
                perf.send_signal(2)
                counts = {}
                for line in perf.communicate()[1].splitlines():
                    f = line.split(',')
                    if len(f) > 2 and f[0].strip().isdigit():
                        counts[f[2]] = int(f[0])
        finally:
            server.stop()
        if args.callgrind:
            dumps = [f for f in os.listdir(work) if re.match(r'cg\.\d+\.\d+$', f)]
            objects, funcs = annotate(os.path.join(work, sorted(dumps)[-1]), args.top)
            total = sum(objects.values())
            # The crypto libraries' part varies with the inputs (a body's random signature):
            # what the server adds is the rest.
            crypto = sum(n for obj, n in objects.items()
                         if obj.startswith(('libsodium.', 'libcrypto.')))
            print(f'{title} ({name}): {total / ok:,.0f} instructions per call over {ok} calls'
                  + (f' ({total / ok / items:,.0f} per item)' if items > 1 else '')
                  + f'; outside libsodium and libcrypto: {(total - crypto) / ok:,.0f} per call'
                  + (f' ({(total - crypto) / ok / items:,.0f} per item)' if items > 1 else ''))
            for obj, n in sorted(objects.items(), key=lambda kv: -kv[1]):
                if n / ok >= 50:
                    print(f'    {n / ok:12,.0f}  {obj}')
            for n, fn in funcs:
                print(f'    {n / ok:12,.0f}  {fn}')
        else:
            print(f'{title} ({name}): {ok} calls; per call: '
                  f'{counts.get("raw_syscalls:sys_enter", 0) / max(ok, 1):.3f} system calls, '
                  f'{counts.get("context-switches", 0) / max(ok, 1):.3f} context switches')
        if args.keep and args.callgrind:
            print(f'    dump kept in {work}')
        else:
            shutil.rmtree(work, ignore_errors=True)


def profile_row(args, build_dir, binary, runner, work, row_id):
    """--perf: shares of the server's cpu-clock samples under the row's load."""
    title, series = F.ROWS[row_id]
    floor = [s for s in series if s[1] == 'nghttpd']
    if args.floor and not floor:
        print(f'{title}: no nghttpd GET in this row (--floor is for the memo-hit rows)')
        return
    name, key, path, b, _ = floor[0] if args.floor else series[0]
    if args.floor:
        docroot = os.path.join(work, 'docroot')
        os.makedirs(docroot)
        with open(os.path.join(docroot, b), 'wb') as f:
            f.write(os.urandom(100 if b == 'small' else R.B55000))
        server = F.Nghttpd(docroot, work)
        url, body = f'http://127.0.0.1:{server.port}/{b}', None
    else:
        extra = (['--memo=false'] if key == 'fresh' else []) + args.extra
        server = start(build_dir, work, key, extra, binary, [])
    try:
        if not args.floor:
            bodies = F.make_bodies(runner, {key: server}, work)
            url, body = f'http://127.0.0.1:{server.port}{path}', bodies[b] + '.grpc'
        h2load(url, body, 2000)  # warm: memo entries, buffers, lazy set-up
        cmd = ['h2load', '-c', '2', '-m', '32', '-t', '1', '-D', str(round(args.perf) + 2)]
        if body is not None:
            cmd += ['-d', body] + sum((['-H', h] for h in F.GRPC_H), [])
        cpu0 = R.proc_cpu_seconds(server.pid)
        load = subprocess.Popen(cmd + [url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        time.sleep(1)
        data = os.path.join(work, 'perf.data')
        subprocess.run(['perf', 'record', '-q', '-F', '2000', '-e', 'cpu-clock', '-p',
                        str(server.pid), '-o', data, '--', 'sleep', str(args.perf)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = load.communicate()[0]
        cpu = R.proc_cpu_seconds(server.pid) - cpu0
    finally:
        server.stop()
    codes = re.search(r'status codes: (\d+) 2xx', out)
    per_call = cpu * 1e6 / int(codes.group(1)) if codes and int(codes.group(1)) else 0.0

    def report(sort):
        out = subprocess.run(['perf', 'report', '-i', data, '--no-children', '--sort', sort,
                              '--stdio', '-q'], capture_output=True, text=True).stdout
        rows = []
        for line in out.splitlines():
            m = re.match(r'^\s*([\d.]+)%\s+(.*?)\s*$', line)
            if m:
                rows.append((float(m.group(1)), re.sub(r'\s+', ' ', m.group(2))))
        return rows

    # The shares are of the samples; the microseconds, of the server's CPU per 2xx answer over
    # the whole h2load run (the shares applied to it: an estimate).
    print(f'{title} ({name}): {per_call:.1f} us of server CPU per call; shares of the '
          f'server\'s samples ({args.perf:g} s, 2000/s) and their part of it')
    for share, obj in report('dso'):
        if share >= 0.5:
            print(f'    {share:5.1f}%  {share * per_call / 100:6.2f} us  {obj}')
    for share, sym in report('dso,sym')[:args.top]:
        print(f'    {share:5.1f}%  {sym}')


def start(build_dir, work, key, extra, binary, prefix):
    if not prefix:
        return R.start_ours(build_dir, work, 'ours-' + key, extra, binary)
    data = os.path.join(work, 'data')
    os.makedirs(data)
    env = dict(os.environ, OFFLOAD_KEK=os.urandom(32).hex())
    cmd = prefix + [binary, '--grpc_address=127.0.0.1:0', '--data_dir=' + data,
                    f'--http_address=127.0.0.1:{R.free_port()}',
                    f'--metrics_address=127.0.0.1:{R.free_port()}'] + extra
    return R.Server('cg-' + key, cmd, env, r'"grpc_port":(\d+)', work)


if __name__ == '__main__':
    sys.exit(main())
