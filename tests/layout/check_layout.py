#!/usr/bin/python3
"""The layout rules of ../shared/DESIGN.md, checked on the source tree (ctest layout.rules).

    tests/layout/check_layout.py [--root .]      # exit 1 and one line per breach
    tests/layout/check_layout.py --self-test     # each rule must catch a planted breach

Data flows one way: httpd (bytes and frames) -> http (protocol mapping) -> call (policy) -> ops.
Checked on every file of service/ but the tests (*_test.cc), by its #include "..." lines and its
string literals (comments stripped):
  call/     includes no protocol header (service/http/, service/httpd/, service/gateway/)
  http/     includes nothing of service/ but http/ and common/ (so no ops/, keys/, httpd/)
  metrics/  includes no service/httpd/, service/http/ or service/gateway/ (no transport)
  api/      includes no service/http/, service/httpd/, service/gateway/ or service/call/
  httpd/    includes nothing of service/ but httpd/ and common/, and no protobuf
  crypto/   includes nothing of service/ but crypto/ and common/ (crypto knows no request)
  gateway/, http/, httpd/ include no service/crypto/ (transport code touches no cipher)
  api/ is the only place that lists methods: no string literal elsewhere is an RPC's name
  ("Sign", "BatchVerify": read from proto/offload/v1/*.proto) or names an offload.v1 service.
"""
import argparse
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def strip_comments(text):
    """C++ text without // and /* */ comments (string and character literals kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '/' and i + 1 < n and text[i + 1] == '/':
            j = text.find('\n', i)
            i = n if j < 0 else j
        elif c == '/' and i + 1 < n and text[i + 1] == '*':
            j = text.find('*/', i + 2)
            i = n if j < 0 else j + 2
        elif c in '"\'':
            if c == '"' and text[i - 1:i] == 'R' and text[i + 1:i + 2] != '\\':
                # A raw string literal R"delim( ... )delim".
                k = text.find('(', i)
                delim = ')' + text[i + 1:k] + '"'
                j = text.find(delim, k)
                j = n if j < 0 else j + len(delim)
                out.append(text[i:j])
                i = j
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def proto_names(root):
    """The RPC names and service names of proto/offload/v1."""
    methods, services = set(), set()
    folder = os.path.join(root, 'proto', 'offload', 'v1')
    for name in sorted(os.listdir(folder)):
        if name.endswith('.proto'):
            with open(os.path.join(folder, name)) as f:
                text = f.read()
            services |= set(re.findall(r'^\s*service\s+(\w+)', text, re.M))
            methods |= set(re.findall(r'^\s*rpc\s+(\w+)\s*\(', text, re.M))
    return methods, services


# folder -> (what its includes of service/ may be, if listed; what they may not be)
RULES = {
    'call': (None, ('service/http/', 'service/httpd/', 'service/gateway/')),
    'http': (('service/http/', 'service/common/'), ()),
    'metrics': (None, ('service/httpd/', 'service/http/', 'service/gateway/')),
    'api': (None, ('service/http/', 'service/httpd/', 'service/gateway/', 'service/call/')),
    'httpd': (('service/httpd/', 'service/common/'), ()),
    'crypto': (('service/crypto/', 'service/common/'), ()),
    'gateway': (None, ('service/crypto/',)),
}


def check(root):
    breaches = []
    methods, services = proto_names(root)
    if not methods or not services:
        return ['proto/offload/v1: no service or rpc found (is --root the repository?)']
    service_dir = os.path.join(root, 'service')
    for dirpath, _, files in os.walk(service_dir):
        for name in sorted(files):
            if not name.endswith(('.h', '.cc')) or name.endswith('_test.cc'):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            folder = rel.split(os.sep)[1]
            with open(path, encoding='utf-8', errors='replace') as f:
                text = strip_comments(f.read())
            includes = INCLUDE.findall(text)
            allowed, denied = RULES.get(folder, (None, ()))
            for inc in includes:
                if not inc.startswith('service/'):
                    if folder == 'httpd' and (inc.startswith('google/protobuf/') or
                                              inc.endswith('.pb.h')):
                        breaches.append(f'{rel}: httpd/ knows no protobuf, includes {inc}')
                    continue
                if allowed is not None and not inc.startswith(allowed):
                    breaches.append(f'{rel}: {folder}/ may include only {", ".join(allowed)}; '
                                    f'includes {inc}')
                elif inc.startswith(denied):
                    breaches.append(f'{rel}: {folder}/ may not include {inc}')
            if folder == 'api':
                continue
            for m in LITERAL.finditer(text):
                s = m.group(1)
                if s in methods:
                    breaches.append(f'{rel}: lists the method "{s}" (api/ is the only place that '
                                    'lists methods)')
                elif s in services or any('offload.v1.' + sv in s for sv in services):
                    breaches.append(f'{rel}: names the service in "{s}" (api/ is the only place '
                                    'that lists methods)')
    return breaches


def self_test():
    """Each rule catches a breach planted in a small tree; a clean tree passes."""
    planted = {
        'service/call/bad.cc': '#include "service/http/protocol.h"\n',
        'service/http/bad.cc': '#include "service/ops/operations.h"\n',
        'service/http/bad2.h': '#include "service/keys/key_manager.h"\n',
        'service/metrics/bad.cc': '#include "service/httpd/server.h"\n',
        'service/api/bad.cc': '#include "service/gateway/gateway.h"\n',
        'service/httpd/bad.cc': '#include "google/protobuf/message.h"\n',
        'service/crypto/bad.cc': '#include "service/ops/operations.h"\n',
        'service/gateway/bad.cc': '#include "service/crypto/aead.h"\n',
        'service/auth/bad.cc': 'const char* kOp[] = {"Sign"};\n',
        'service/auth/bad2.cc': 'auto p = "/offload.v1.AeadService/Open";\n',
    }
    clean = {
        'service/api/methods.cc': 'const char* k = "/offload.v1.AeadService/Open"; // "Sign"\n',
        'service/auth/ok.cc': '// "Sign" in a comment\n/* "Verify" */\nconst char* k = "Signer";\n',
        'service/auth/ok_test.cc': 'const char* k = "Sign";\n',
        'service/call/ok.cc': '#include "service/api/method_table.h"\n',
    }
    proto = ('service KeyService {\n  rpc Sign(A) returns (B);\n}\n'
             'service AeadService {\n  rpc Open(A) returns (B);\n}\n')
    failures = []
    with tempfile.TemporaryDirectory() as root:
        def write(files):
            for rel, text in files.items():
                path = os.path.join(root, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, 'w') as f:
                    f.write(text)
        write({'proto/offload/v1/x.proto': proto})
        write(clean)
        if check(root):
            failures.append(f'a clean tree was refused: {check(root)}')
        for rel, text in planted.items():
            write({rel: text})
            found = [b for b in check(root) if b.startswith(rel + ':')]
            if not found:
                failures.append(f'not caught: {rel}: {text.strip()}')
            os.remove(os.path.join(root, rel))
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--root', default=os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    ap.add_argument('--self-test', action='store_true')
    args = ap.parse_args()
    if args.self_test:
        failures = self_test()
        for f in failures:
            print('self-test:', f)
        print(f'self-test: {"FAILED" if failures else "every rule catches its breach"}')
        return 1 if failures else 0
    breaches = check(args.root)
    for b in breaches:
        print(b)
    print(f'layout: {len(breaches)} breach(es)' if breaches else 'layout: every rule holds')
    return 1 if breaches else 0


if __name__ == '__main__':
    sys.exit(main())
