#!/usr/bin/env bash
# Issues 4, 15 and 24's benchmark tables in one command (see run_all.py and README.md):
#   tests/bench/run_all.sh            # full: Release build in build-bench, ~10 s per workload
#   tests/bench/run_all.sh --short    # a few seconds per workload
exec /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/run_all.py" "$@"
