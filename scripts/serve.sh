#!/usr/bin/env bash
# Builds crypto-offload (Release) and starts the server on its embedded default: gRPC on
# 127.0.0.1:50051, file key store in ./data (a key-encryption key is generated into ./data/kek
# unless OFFLOAD_KEK or --kek_file supplies one). Extra arguments go to the server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target offload_server offloadctl
exec build/bin/offload_server --grpc_address=127.0.0.1:50051 --data_dir=data "$@"
