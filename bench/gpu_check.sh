#!/usr/bin/env bash
# The GPU check in two parts; see bench/gpu_check.py and bench/README.md.
exec python3 "$(dirname "${BASH_SOURCE[0]}")/gpu_check.py" "$@"
