#!/usr/bin/env bash
# Installs the Debian 12 packages that building, running and testing crypto-offload need.
# Idempotent: it asks apt only for what is missing, and does nothing when all is there.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config git
  # the openssl command (throwaway certificates in the TLS tests) and curl (e2e.cors)
  openssl curl
  # libraries (Debian 12: gRPC 1.51, Protobuf 3.21, libsodium 1.0.18, OpenSSL 3.0, Abseil 20220623)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libsodium-dev libssl-dev libabsl-dev nlohmann-json3-dev prometheus-cpp-dev
  # the HTTP engine under the gateway and /metrics: libnghttp2 (HTTP/2, Debian's security-
  # maintained build) and Boost (Asio for sockets, timers and TLS; Beast's HTTP/1.1 parser)
  libnghttp2-dev libboost-dev
  # bearer tokens (service/auth/tokens.h): cjose checks ES256 and RS256 JWS signatures
  libcjose-dev libjansson-dev
  # the embedded client (client/embedded): nanopb generator (protoc-gen-nanopb) and runtime
  nanopb libnanopb-dev
  # the embedded client's TLS transport (client/embedded/transport_mbedtls.c): mbedTLS, as
  # ESP-IDF ships it
  libmbedtls-dev
  # tests and benchmarks (h2load drives the HTTP and gRPC benchmarks of tests/bench: http_edge.py,
  # http_compression.py, run_all.py's fixed-body rows); nghttpd (nghttp2-server), libnghttp2's
  # own server, is the HTTP/2 floor of tests/bench/fresh_call.py
  libgtest-dev libgmock-dev libbenchmark-dev nghttp2-client nghttp2-server
  # the ASan + UBSan build and its libFuzzer targets (tests/fuzz) are built with clang; llvm-14
  # holds the llvm-symbolizer that the sanitizer runtimes and libFuzzer (NEW_FUNC lines) name
  # stack frames with: clang only recommends it, and without it every fuzzer writes "invalid path
  # to external symbolizer" into the sanitizer logs, which fails run_sanitizer_ctest.sh
  clang libclang-rt-14-dev llvm-14
  # third-party clients used by the end-to-end tests (run with /usr/bin/python3)
  python3 python3-grpcio python3-protobuf python3-nacl
  # tokens minted by an independent implementation (tests/e2e/test_tokens.py): PyJWT
  python3-jwt python3-cryptography
  # the raw-frame HTTP/2 client of the abuse test (tests/e2e/test_http2_abuse.py)
  python3-h2 python3-hyperframe python3-hpack
  # the Connect / gRPC-Web end-to-end test (tests/e2e/connect: @connectrpc/connect-node)
  nodejs npm
  # the web example's browser test (tests/e2e/web): Debian's Chromium, driven headless by
  # playwright-core (which never downloads a browser), and a font for the page and its screenshot
  chromium fonts-dejavu-core
  # a real Prometheus (and promtool) for the observability test; the test runs its own process
  prometheus
  # the postgres key store (libpq) and the scale-out test: a real PostgreSQL and nginx, started
  # by the test itself on loopback (their system services are never started, see below)
  libpq-dev postgresql nginx
  # the PKCS#11 KEK (--kek_pkcs11): p11-kit's headers and loader; SoftHSM2 and pkcs11-tool
  # (opensc) for its tests and for trying it without an HSM
  libp11-kit-dev softhsm2 opensc
)

# The deployment checks (tests/deploy): nginx -t and a routing test with a real nginx (the test
# runs its own process), docker-compose config, python3-yaml; and kubectl for `kubectl kustomize`:
# Debian's kubernetes-client (1.20) only when no kubectl is on PATH, since it conflicts with
# other kubectl installs.
packages+=(docker-compose python3-yaml)  # nginx: above
if ! command -v kubectl >/dev/null; then packages+=(kubernetes-client); fi

# The npm packages of tests/e2e/connect, tests/e2e/interop_node, tests/deploy, the benchmark peer
# (tests/bench/peer), the TypeScript client (client/ts), the examples that use it (examples/web,
# examples/mobile-ts: they link it, so client/ts comes first) and the browser test
# (tests/e2e/web), exactly as their package-lock.json pin them: `npm ci` when node_modules is
# missing or older than the lock file. Works with Debian 12's node 18 and npm 9.
npm_packages() {
  local root dir
  root="$(cd "$(dirname "$0")/.." && pwd)"
  for dir in "$root/tests/e2e/connect" "$root/tests/e2e/interop_node" "$root/tests/deploy" \
             "$root/tests/bench/peer" "$root/client/ts" "$root/examples/web" \
             "$root/examples/mobile-ts" "$root/tests/e2e/web"; do
    if [ ! -f "$dir/node_modules/.package-lock.json" ] ||
       [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
      echo "install-deps: npm ci in $dir" >&2
      (cd "$dir" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
    fi
  done
}

missing=()
for p in "${packages[@]}"; do
  # npm may come with another nodejs build (e.g. NodeSource's provides it): any npm will do.
  if [ "$p" = npm ] && command -v npm >/dev/null; then continue; fi
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  npm_packages
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# Installing postgresql or nginx would start their services (nginx on 0.0.0.0:80). Debian's
# invoke-rc.d asks /usr/sbin/policy-rc.d first: exit 101 forbids the start. We put one there for
# the duration of apt-get when there is none, and remove only the one we made.
policy=/usr/sbin/policy-rc.d
made_policy=""
remove_policy() {
  if [ -n "$made_policy" ]; then $sudo rm -f "$policy" || true; fi
}
if [ ! -e "$policy" ]; then
  trap remove_policy EXIT
  made_policy=1
  printf '#!/bin/sh\n# scripts/install-deps.sh: no service starts while packages install\nexit 101\n' |
    $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
fi
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
remove_policy
made_policy=""
npm_packages
