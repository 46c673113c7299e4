#!/usr/bin/env bash
# Offline throughput (issue 4): N requests of PROMPT random tokens generating GEN tokens each (greedy,
# ignore_eos) through the engine all at once, the same requests one at a time, and llama.cpp's
# llama-batched-bench with the same shape, model and threads, in one run; then the shared-prefix TTFT
# test (32 requests sharing a 1000-token system prompt) with prefix caching off and on.
#
#   BUILD=/tmp/build bench/offline_throughput.sh [MODEL]
# Env: N (64) PROMPT (32) GEN (256) THREADS (2); SINGLE_N (N): how many of the requests the
# one-at-a-time run does (its tokens/s is a per-request rate, so a subset measures the same thing);
# PREFIX_N (32): requests in the shared-prefix test;
# CPU_ACTIVATIONS=q8: osprey's engine with --cpu-activations q8 (one activation level, as llama.cpp's).
# LLAMA_CPP_BIN: directory holding llama-batched-bench (a llama.cpp build outside the repo; skipped
# when unset). The benchmark binary is the CMake target offline_throughput of $BUILD.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
BUILD=${BUILD:-build}
N=${N:-64} PROMPT=${PROMPT:-32} GEN=${GEN:-256} THREADS=${THREADS:-2} SINGLE_N=${SINGLE_N:-$N} PREFIX_N=${PREFIX_N:-32}
BIN="$BUILD/bin/offline_throughput"
cmake --build "$BUILD" --target offline_throughput >/dev/null # CMake links it in every build (CUDA or not)
export OMP_NUM_THREADS=$THREADS
echo "commit $(git rev-parse --short HEAD), $(date -u +%F), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
b=$("$BIN" "$MODEL" batch "$N" "$PROMPT" "$GEN" "$THREADS" | grep RESULT); echo "$b"
s=$("$BIN" "$MODEL" single "$SINGLE_N" "$PROMPT" "$GEN" "$THREADS" | grep RESULT); echo "$s"
bt=$(sed -E 's/.*total_tok_s=([0-9.]+).*/\1/' <<<"$b"); st=$(sed -E 's/.*total_tok_s=([0-9.]+).*/\1/' <<<"$s")
echo "engine batched / one at a time (total tokens/s): $(awk "BEGIN{printf \"%.2f\", $bt/$st}")x"
if [ -n "${LLAMA_CPP_BIN:-}" ] && [ -x "$LLAMA_CPP_BIN/llama-batched-bench" ]; then
    l=$("$LLAMA_CPP_BIN/llama-batched-bench" -m "$MODEL" -c $((N * (PROMPT + GEN) + 64)) -b 2048 -ub 512 \
        -npp "$PROMPT" -ntg "$GEN" -npl "$N" -t "$THREADS" 2>/dev/null | grep -E '^\|\s+[0-9]' | tail -1)
    echo "llama-batched-bench: $l"
    lt=$(awk -F'|' '{gsub(/ /,""); print $(NF-1)}' <<<"$l")
    echo "engine batched / llama.cpp (total tokens/s): $(awk "BEGIN{printf \"%.2f\", $bt/$lt}")x"
else
    echo "llama-batched-bench: skipped (set LLAMA_CPP_BIN)"
fi
"$BIN" "$MODEL" prefix "$PREFIX_N" 1000 24 "$THREADS" 0 | grep RESULT
"$BIN" "$MODEL" prefix "$PREFIX_N" 1000 24 "$THREADS" 1 | grep RESULT
