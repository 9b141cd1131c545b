#!/usr/bin/env bash
# Builds crypto-offload (Release) and runs every test: unit tests, crypto vectors, and the
# end-to-end tests against a real server process on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600
