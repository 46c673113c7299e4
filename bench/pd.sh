#!/usr/bin/env bash
# Prefill/decode disaggregation against co-location on one host: 1 prefill + 1 decode server behind
# `osprey router --prefill-backends` vs 2 co-located servers behind the plain router, ~1,000-token
# prompts, 64 output tokens, Poisson arrivals at rising rates; TTFT, TPOT and the KV transfer time
# (bench/pd.py says how). Needs build/bin/osprey (or OSPREY_BIN) with --kv-transfer-config, the default
# model (make fetch) and the integration venv (scripts/setup-integration.sh: requests). About 8 minutes
# with the defaults. Knobs (environment): RATES DURATION DRAIN PROMPT_WORDS MAX_TOKENS THREADS KV_MEM
# MODEL OSPREY_BIN.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup-integration.sh .venv-it
exec .venv-it/bin/python bench/pd.py "$@"
