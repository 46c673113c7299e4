#!/usr/bin/env bash
# Prefill/decode disaggregation against co-location on one host: 1 prefill + 1 decode server behind
# `osprey router --prefill-backends` vs 2 co-located servers behind the plain router, ~1,000-token
# prompts, 64 output tokens, Poisson arrivals at rising rates; TTFT, TPOT and the KV transfer time
# (bench/pd.py says how). Needs build/bin/osprey (or OSPREY_BIN) with --kv-transfer-config, the default
# model (make fetch) and the integration venv (scripts/setup-integration.sh: requests). About 9 minutes
# with the defaults. The default rates (0.1-0.4 req/s) are sized for the 2-core CPU: one thread prefills
# a ~950-token SmolLM2 prompt in ~4 s, so one server prefills ~0.25 req/s at most; on a bigger machine
# raise THREADS and RATES. Knobs (environment): RATES DURATION DRAIN PROMPT_WORDS MAX_TOKENS THREADS
# KV_MEM MODEL OSPREY_BIN SERVE_EXTRA (more serve flags, e.g. "--device cuda").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup-integration.sh .venv-it
exec .venv-it/bin/python bench/pd.py "$@"
