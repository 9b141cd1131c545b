#!/usr/bin/env bash
# Installs the Debian 12 packages that building, running and testing crypto-offload need.
# Idempotent: it asks apt only for what is missing, and does nothing when all is there.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config git
  # libraries (Debian 12: gRPC 1.51, Protobuf 3.21, libsodium 1.0.18, OpenSSL 3.0, Abseil 20220623)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libsodium-dev libssl-dev libabsl-dev nlohmann-json3-dev prometheus-cpp-dev
  # the embedded client (client/embedded): nanopb generator (protoc-gen-nanopb) and runtime
  nanopb libnanopb-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # the ASan + UBSan build and its libFuzzer targets (tests/fuzz) are built with clang
  clang libclang-rt-14-dev
  # third-party clients used by the end-to-end tests (run with /usr/bin/python3)
  python3 python3-grpcio python3-protobuf python3-nacl
  # the Connect / gRPC-Web end-to-end test (tests/e2e/connect: @connectrpc/connect-node)
  nodejs npm
  # a real Prometheus (and promtool) for the observability test; the test runs its own process
  prometheus
)

# The npm packages of tests/e2e/connect, exactly as package-lock.json pins them: `npm ci` when
# node_modules is missing or older than the lock file. Works with Debian 12's node 18 and npm 9.
npm_packages() {
  local dir
  dir="$(cd "$(dirname "$0")/.." && pwd)/tests/e2e/connect"
  if [ ! -f "$dir/node_modules/.package-lock.json" ] ||
     [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
    echo "install-deps: npm ci in $dir" >&2
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
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
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
npm_packages
