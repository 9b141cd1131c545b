#!/usr/bin/env python3
"""Code size and worst-case stack of the embedded client (run by the `embedded_size` target).

Code size: `size` (Berkeley format) of the client's object files compiled at -Os: the client
(offload_client.c) and the nanopb messages generated from proto/. Listed apart: the POSIX test
transport with the HTTP/1.1 framing and socket code it shares with the TLS transport (internal/;
a device brings its own transport) and Debian's nanopb runtime archive as shipped.

Stack: every frame size from GCC's -fstack-usage, the call graph from -fcallgraph-info (both in the
.ci files next to the objects), summed along the deepest path from each public entry point. Calls
leaving our objects:
  - nanopb runtime (Debian ships no sources, only libprotobuf-nanopb.a): frames and calls read from
    its x86-64 disassembly (return address + pushes + the largest `sub $N,%rsp`), conservatively;
    indirect calls inside nanopb are its stream callbacks (buf_read / buf_write for the buffer
    streams the client uses). nanopb's decoder recurses only into sub-messages, and none of the
    messages the client decodes has one, so cycles are cut and reported.
  - the transport callback (`__indirect_call` in call()): the POSIX transport's own deepest path,
    reported as a separate line; a device transport replaces it.
  - libc (memcpy, memset, memcmp, strlen, socket calls): LIBC_FRAME bytes each, an allowance.
Exit status 1 when a frame is unbounded (dynamic stack without a bound) or a file is missing.
"""
import argparse
import os
import re
import subprocess
import sys

LIBC_FRAME = 64
ENTRY_POINTS = ["offload_derive", "offload_box_seal", "offload_box_open", "offload_verify",
                "offload_client_init"]


def split_list(values):
    out = []
    for v in values:
        out.extend(x for x in v.split(";") if x)
    return out


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def size_table(size_tool, paths):
    rows = []
    for line in run([size_tool, "-B"] + paths).splitlines()[1:]:
        f = line.split()
        rows.append((int(f[0]), int(f[1]), int(f[2]), " ".join(f[5:])))
    return rows


def print_sizes(title, rows):
    print(title)
    print("  %7s %7s %7s  %s" % ("text", "data", "bss", "object"))
    for text, data, bss, name in rows:
        print("  %7d %7d %7d  %s" % (text, data, bss, os.path.basename(name.split(" (ex")[0])))
    t = [sum(r[i] for r in rows) for i in range(3)]
    print("  %7d %7d %7d  total" % tuple(t))
    return t


NODE_RE = re.compile(r'node: \{ title: "([^"]+)" label: "([^"]*)"')
EDGE_RE = re.compile(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"')
SIZE_RE = re.compile(r'\\n(\d+) bytes \(([^)]*)\)')


def read_callgraph(objs):
    """frames: name -> (bytes, qualifier); calls: name -> set(callees). Static functions are
    titled 'file:name'; shortened to 'name' (our files share no static names that matter)."""
    frames, calls, bad = {}, {}, []

    def short(title):
        return title.rsplit(":", 1)[-1]

    for obj in objs:
        ci = obj[:-2] + ".ci" if obj.endswith(".o") else obj + ".ci"
        if not os.path.exists(ci):
            bad.append("missing " + ci)
            continue
        with open(ci) as f:
            for line in f:
                m = NODE_RE.search(line)
                if m:
                    s = SIZE_RE.search(m.group(2))
                    if s:
                        frames[short(m.group(1))] = (int(s.group(1)), s.group(2))
                        if "dynamic" in s.group(2) and "bounded" not in s.group(2):
                            bad.append("unbounded stack in " + m.group(1))
                    continue
                m = EDGE_RE.search(line)
                if m:
                    calls.setdefault(short(m.group(1)), set()).add(short(m.group(2)))
    return frames, calls, bad


def read_nanopb(objdump, archive):
    """Frames and calls of the nanopb runtime from its disassembly."""
    text = run([objdump, "-dr", "--no-show-raw-insn", archive])
    frames, calls = {}, {}
    fn = None
    pushes = subs = 0
    func_re = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")
    for line in text.splitlines():
        m = func_re.match(line)
        if m:
            if fn:
                frames[fn] = 8 + 8 * pushes + subs
            fn, pushes, subs = m.group(1), 0, 0
            calls.setdefault(fn, set())
            continue
        if fn is None:
            continue
        ins = line.split("\t")[-1].strip() if "\t" in line else ""
        if ins.startswith("push"):
            pushes += 1
        m = re.match(r"sub\s+\$0x([0-9a-f]+),%rsp", ins)
        if m:
            v = int(m.group(1), 16)
            if v < (1 << 63):  # `sub $-128,%rsp` (shown as 0xff..80) releases stack
                subs = max(subs, v)
        m = re.match(r"(call|jmp)\s+[0-9a-f]+ <([A-Za-z_][A-Za-z0-9_]*)(\+0x[0-9a-f]+)?>", ins)
        if m and m.group(2) != fn and m.group(3) is None:
            calls[fn].add(m.group(2))
        if ins.startswith("call") and "*" in ins:
            calls[fn].add("__nanopb_stream_callback")
        m = re.search(r"R_X86_64_PLT32\s+([A-Za-z_][A-Za-z0-9_]*)", line)
        if m and m.group(1) != fn:
            calls[fn].add(m.group(1))
    if fn:
        frames[fn] = 8 + 8 * pushes + subs
    cb = max(frames.get("buf_read", LIBC_FRAME), frames.get("buf_write", LIBC_FRAME))
    frames["__nanopb_stream_callback"] = cb
    calls["__nanopb_stream_callback"] = set()
    return frames, calls


def deepest(fn, frames, calls, transport, path, cycles):
    """(bytes, path) of the deepest chain from `fn`; a function already on the path is a cycle."""
    if fn in path:
        cycles.add(" -> ".join(path[path.index(fn):] + [fn]))
        return 0, []
    if fn == "__indirect_call":
        return (transport[0], ["<transport: " + " -> ".join(transport[1]) + ">"]) if transport \
            else (0, ["<transport>"])
    own = frames[fn][0] if fn in frames else LIBC_FRAME
    best = (0, [])
    for callee in sorted(calls.get(fn, ())):
        b = deepest(callee, frames, calls, transport, path + [fn], cycles)
        if b[0] > best[0]:
            best = b
    return own + best[0], [fn] + best[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="size")
    ap.add_argument("--objdump", default="objdump")
    ap.add_argument("--nanopb-archive", required=True)
    ap.add_argument("--client-objs", nargs="+", required=True)
    ap.add_argument("--transport-objs", nargs="+", required=True)
    ap.add_argument("--max-message", default="?")
    a = ap.parse_args()
    client_objs = split_list(a.client_objs)
    transport_objs = split_list(a.transport_objs)

    print("== embedded client: code size, gcc -Os (max message %s bytes) ==" % a.max_message)
    lib = print_sizes("offload_embedded (client + generated nanopb messages):",
                      size_table(a.size, client_objs))
    print_sizes("POSIX test transport + internal/ (a device supplies its own):",
                size_table(a.size, transport_objs))
    npb = print_sizes("nanopb runtime, Debian's libprotobuf-nanopb.a as shipped (not -Os):",
                      size_table(a.size, [a.nanopb_archive]))
    print("client + nanopb runtime: %d bytes of code (text), %d data, %d bss"
          % (lib[0] + npb[0], lib[1] + npb[1], lib[2] + npb[2]))

    frames, calls, bad = read_callgraph(client_objs + transport_objs)
    nframes, ncalls = read_nanopb(a.objdump, a.nanopb_archive)
    for k, v in nframes.items():
        frames.setdefault(k, (v, "nanopb disassembly"))
    for k, v in ncalls.items():
        calls.setdefault(k, set()).update(v)
    cycles = set()
    t_bytes, t_path = deepest("offload_posix_transport", frames, calls, None, [], cycles)

    print()
    print("== worst-case stack, x86-64 -Os (gcc -fstack-usage + call graph; libc calls %d B each) =="
          % LIBC_FRAME)
    worst = 0
    for entry in ENTRY_POINTS:
        c_bytes, c_path = deepest(entry, frames, calls, None, [], cycles)
        w_bytes, w_path = deepest(entry, frames, calls, (t_bytes, t_path), [], cycles)
        worst = max(worst, w_bytes)
        print("%-20s %5d B without the transport, %5d B with the POSIX transport" %
              (entry, c_bytes, w_bytes))
        print("  deepest: " + " -> ".join(
            "%s(%d)" % (f, frames[f][0]) if f in frames else f for f in w_path))
    print("offload_posix_transport alone: %d B" % t_bytes)
    for c in sorted(cycles):
        print("recursion cut (not reached: the client's messages have no sub-messages): " + c)
    print("WORST CASE: %d bytes of stack (client + nanopb + POSIX transport)" % worst)
    print("client memory: offload_client_t and the wire buffer are the caller's (static) storage")
    for b in bad:
        print("ERROR: " + b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
