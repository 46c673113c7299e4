#!/usr/bin/env bash
# Shared-prefix serving through `osprey router` over several `osprey serve` replicas on loopback:
# round-robin against prefix-aware routing (KV events) in one run (bench/scale.py says how; issue 18).
# Needs build/bin/osprey, the default model (make fetch) and the integration venv
# (scripts/setup-integration.sh: requests). Knobs (environment): REPLICAS SYSTEMS SYS_WORDS REQUESTS
# CONCURRENCY MAX_TOKENS KV_MEM THREADS MODEL OSPREY_BIN.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup-integration.sh .venv-it
exec .venv-it/bin/python bench/scale.py "$@"
