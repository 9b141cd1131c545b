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
  - libsodium (the box on the device, OFFLOAD_LOCAL_BOX: Debian ships libsodium.a without stack
    data): frames and calls read from its disassembly the same way, plus the stack its hand-written
    assembly takes by register (`add $N,%r11; sub %r11,%rsp`) and realignment (`and $-32,%rsp`).
    An indirect call (call or jmp through a pointer) inside libsodium goes through the
    implementation table of its primitive (crypto_stream_salsa20's, crypto_onetimeauth_poly1305's,
    randombytes'): it counts as the deepest of every function those tables point to (every
    implementation, whichever the CPU picks); elsewhere, as the deepest address-taken function of
    the whole archive.
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
import tempfile

LIBC_FRAME = 64
ENTRY_POINTS = ["offload_derive", "offload_derive_version", "offload_box_seal",
                "offload_box_open", "offload_verify", "offload_client_init"]
# libsodium: an indirect call in a member matching the key goes to the functions that the
# implementation tables in the members matching the value point to.
SODIUM_FAMILIES = [
    (re.compile(r"_la-stream_salsa20\.o$"), re.compile(r"_la-salsa20_")),
    (re.compile(r"_la-stream_chacha20\.o$"), re.compile(r"_la-chacha20_")),
    (re.compile(r"_la-onetimeauth_poly1305\.o$"), re.compile(r"_la-poly1305_")),
    (re.compile(r"_la-randombytes\.o$"), re.compile(r"_la-randombytes_")),
]
# sodium_misuse() calls the application's misuse handler (this client sets none) and then
# abort(): counted as a frame of its own, its callees not followed.
SODIUM_LEAVES = ["sodium_misuse"]
SODIUM_CALLS = ["crypto_box_easy_afternm", "crypto_box_open_easy_afternm", "randombytes_buf",
                "sodium_init"]


def split_list(values):
    out = []
    for v in values:
        out.extend(x for x in v.split(";") if x)
    return out


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def members_size(size_tool, archive, members):
    """`size` rows of `members` of `archive` (extracted into a temporary directory)."""
    with tempfile.TemporaryDirectory(prefix="embedded_report_") as d:
        subprocess.run(["ar", "x", os.path.abspath(archive)] + members, cwd=d, check=True)
        return size_table(size_tool, [os.path.join(d, m) for m in members])


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


def read_sodium(objdump, archive):
    """Frames and calls of libsodium's functions from its disassembly, indirect calls resolved
    through the implementation tables (see the module comment). Returns frames, calls, the
    member of each function, and problems (a stack pointer moved by an unknown amount)."""
    text = run([objdump, "-dr", "--no-show-raw-insn", archive])
    frames, calls, member_of, bad = {}, {}, {}, {}
    offsets = {}  # (member, section) -> [(offset, function)]
    indirect_in = {}  # function -> member holding an indirect call
    member = section = fn = None
    pushes = subs = slack = 0
    reg_imm = {}
    member_re = re.compile(r"^(\S+\.o):\s+file format")
    func_re = re.compile(r"^([0-9a-f]+) <([^>]+)>:$")

    def close():
        if fn:
            frame = 8 + 8 * pushes + subs + slack
            frames[fn] = max(frames.get(fn, 0), frame)  # static names may repeat: keep the largest

    for line in text.splitlines():
        m = member_re.match(line)
        if m:
            close()
            member, section, fn = m.group(1), None, None
            continue
        if line.startswith("Disassembly of section "):
            close()
            section, fn = line[len("Disassembly of section "):].rstrip(":"), None
            continue
        m = func_re.match(line)
        if m:
            close()
            fn, pushes, subs, slack, reg_imm = m.group(2), 0, 0, 0, {}
            calls.setdefault(fn, set())
            member_of.setdefault(fn, member)
            offsets.setdefault((member, section), []).append((int(m.group(1), 16), fn))
            continue
        if fn is None:
            continue
        ins = line.split("\t")[-1].strip() if "\t" in line else ""
        if ins.startswith("push"):
            pushes += 1
        m = re.match(r"sub\s+\$0x([0-9a-f]+),%rsp", ins)
        if m and int(m.group(1), 16) < (1 << 63):
            subs = max(subs, int(m.group(1), 16))
        m = re.match(r"and\s+\$0x(f+[0-9a-f]+),%rsp", ins)
        if m:
            slack = max(slack, (1 << 64) - int(m.group(1), 16))
        m = re.match(r"add\s+\$0x([0-9a-f]+),(%r\w+)", ins)
        if m:
            reg_imm[m.group(2)] = int(m.group(1), 16)
        m = re.match(r"sub\s+(%r\w+),%rsp", ins)
        if m:
            if m.group(1) in reg_imm:  # rsp -= (rsp & 31) + N
                subs = max(subs, reg_imm[m.group(1)])
                slack = max(slack, 32)
            else:
                bad[fn] = "libsodium %s: stack moved by %s, an unknown amount" % (fn, m.group(1))
        m = re.match(r"(call|jmp)\s+[0-9a-f]+ <([A-Za-z_][A-Za-z0-9_.]*)(\+0x[0-9a-f]+)?>", ins)
        if m and m.group(2) != fn and m.group(3) is None:
            calls[fn].add(m.group(2))
        if re.match(r"(notrack\s+)?(call|jmp)\s+\*", ins):
            indirect_in[fn] = member
        m = re.search(r"R_X86_64_PLT32\s+([A-Za-z_][A-Za-z0-9_]*)", line)
        if m and m.group(1) != fn:
            calls[fn].add(m.group(1))
    close()

    # Address-taken functions: what the data sections' relocations point to, per member.
    taken = {}
    member = section = None
    for line in run([objdump, "-r", archive]).splitlines():
        m = member_re.match(line)
        if m:
            member, section = m.group(1), None
            continue
        m = re.match(r"RELOCATION RECORDS FOR \[(.+)\]:", line)
        if m:
            section = m.group(1)
            continue
        f = line.split()
        if section is None or section.startswith(".text") or section.startswith(".eh_frame") \
                or len(f) != 3 or not f[1].startswith("R_X86_64"):
            continue
        target = f[2]
        m = re.match(r"(\.text[\w.]*)(\+0x([0-9a-f]+))?$", target)
        if m:
            off = int(m.group(3) or "0", 16)
            hit = [name for o, name in offsets.get((member, m.group(1)), []) if o == off]
            if hit:
                taken.setdefault(member, set()).add(hit[0])
        elif target in calls:
            taken.setdefault(member, set()).add(target)

    for fn, mem in indirect_in.items():
        node = "<libsodium %s implementations>" % os.path.basename(mem)[:-2].split("_la-")[-1]
        calls[fn].add(node)
        frames[node] = 0
        for key, value in SODIUM_FAMILIES:
            if key.search(mem):
                calls[node] = set().union(*(v for k, v in taken.items() if value.search(k)))
                break
        else:
            calls[node] = set()
            bad[node] = "libsodium %s: an indirect call in %s with no known target table" % (fn, mem)
    for leaf in SODIUM_LEAVES:
        calls[leaf] = set()
    return frames, calls, member_of, bad


def reachable(roots, calls):
    seen, todo = set(), list(roots)
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo.extend(calls.get(f, ()))
    return seen


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
    ap.add_argument("--sodium-archive", default="",
                    help="libsodium.a, when the client is built with OFFLOAD_LOCAL_BOX")
    ap.add_argument("--memo-slots", default="?")
    a = ap.parse_args()
    client_objs = split_list(a.client_objs)
    transport_objs = split_list(a.transport_objs)

    print("== embedded client: code size, gcc -Os (max message %s bytes, %s memo slots, box on "
          "the device %s) ==" % (a.max_message, a.memo_slots, "on" if a.sodium_archive else "off"))
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
    if a.sodium_archive:
        sframes, scalls, smember, sbad = read_sodium(a.objdump, a.sodium_archive)
        for k, v in sframes.items():
            frames.setdefault(k, (v, "libsodium disassembly"))
        for k, v in scalls.items():
            calls.setdefault(k, set()).update(v)
        used = reachable([c for c in SODIUM_CALLS if c in scalls], scalls)
        bad.extend(why for fn, why in sorted(sbad.items()) if fn in used)
        print("libsodium the client reaches, Debian's libsodium.a as shipped (-O2, with its "
              "SSE2/AVX2 variants; its libc calls not counted):")
        for label, roots in (("the box calls (%s)" % ", ".join(SODIUM_CALLS[:3]), SODIUM_CALLS[:3]),
                             ("with sodium_init() (offload_client_init)", SODIUM_CALLS)):
            members = sorted({smember[f] for f in reachable(roots, scalls) if f in smember})
            code = members_size(a.size, a.sodium_archive, members)
            print("  %7d bytes of code (text) in %2d objects: %s" % (
                sum(r[0] for r in code), len(members), label))
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
        if "libsodium" in c or c.split(" -> ")[0] in SODIUM_CALLS + SODIUM_LEAVES:
            print("cycle cut (libsodium: through its implementation tables): " + c)
        else:
            print("recursion cut (not reached: the client's messages have no sub-messages): " + c)
    print("WORST CASE: %d bytes of stack (client + nanopb%s + POSIX transport)" %
          (worst, " + libsodium" if a.sodium_archive else ""))
    print("client memory: offload_client_t and the wire buffer are the caller's (static) storage")
    for b in bad:
        print("ERROR: " + b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
