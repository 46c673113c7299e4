#!/usr/bin/env bash
# Shared-prefix serving through `osprey router` over several `osprey serve` replicas on loopback:
# round-robin against prefix-aware routing (KV events) in one run (bench/scale.py says how; issue 18).
# `bench/scale.sh hotspot`: the hot-spot run (one hot prefix, open-loop arrivals; tail TTFT with
# round-robin, prefix routing without and with --hot-queue protection).
# Needs build/bin/osprey, the default model (make fetch) and the integration venv
# (scripts/setup-integration.sh: requests). Knobs (environment): REPLICAS SYSTEMS SYS_WORDS REQUESTS
# CONCURRENCY MAX_TOKENS KV_MEM THREADS MODEL OSPREY_BIN; for hotspot also RATE HOT_SHARE
# MAX_NUM_SEQS HOT_QUEUE.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup-integration.sh .venv-it
exec .venv-it/bin/python bench/scale.py "$@"
