#!/usr/bin/env bash
# Tiered KV offload (issue 18): TTFT of an evicted long prompt loaded back from the disk tier against
# recomputing it, same binary and model, one run (bench/offload.py says how). Needs build/bin/osprey
# (or OSPREY_BIN) and the default model (make fetch). Knobs: MODEL THREADS WORDS KV_MEM REPS ALWAYS_LOAD.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ "${ALWAYS_LOAD:-0}" != 0 ] && export OSPREY_KV_OFFLOAD_ALWAYS_LOAD=1
exec python3 bench/offload.py "$@"
