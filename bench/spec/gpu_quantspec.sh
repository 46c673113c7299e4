#!/usr/bin/env bash
# QuantSpec on the GPU (issue 14), run on the device machine from binaries built here (scripts/gpu-pack.sh):
#   proj   the 8B projection's costs: a random Llama-3.1-8B (Q8_0 blocks: the target bf16 on the GPU, the draft's
#          Q4_0 copies in their blocks) and a CTX-character prompt (~0.43 tokens a character with the generated
#          vocabulary: 37,000 -> ~16k tokens); plain decode against quantspec k 3 drafting every step
#          (OSPREY_SPEC_FIXED_K=1): generate's "speculative cost" line gives the draft call and the verification
#          step, its generation line the plain step; over f16 and int8_hier pages
#   smol   SmolLM2 (MODEL, the real one) at batch 1 (bench/spec.sh DEVICE=cuda: n-gram, quantspec over f16 and
#          int8_hier pages, interleaved with plain) and 32 (offline_throughput SPEC=.. KV=..)
# The projection itself (bench/spec/NOTES.md, nineteenth session): tokens a round E = (1 - a^(k+1)) / (1 - a) at
# the acceptance a measured on real models, speedup E x plain step / (draft call + verification step).
#   BIN=/tmp/osprey-gpu/gpu/bin bash bench/spec/gpu_quantspec.sh proj|smol [MODEL]
#   (proj with BASE=<another build's osprey>: its quantspec runs too, in the same call: e.g. a Q4_0 draft copy
#   before 36c69b1 against the Q4_K one)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
what=${1:-proj}
BIN=${BIN:-build/bin}
OUTD=${OUT:-/tmp}
QS='{"method": "quantspec", "num_speculative_tokens": 3}'
NG='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
if [ "$what" = proj ]; then
    M=${PROJ_MODEL:-/tmp/r8b.gguf}
    [ -f "$M" ] || "$BIN/osprey" make-random-model --preset llama-3.1-8b --dtype q8_0 --random-blocks -o "$M" >/dev/null
    P=$(python3 -c "import random; random.seed(1); print(''.join(random.choice('abcdefghij klmnop') for _ in range(${CTX:-37000})))")
    runs="f16:plain f16:spec int8_hier:plain int8_hier:spec"
    [ -n "${BASE:-}" ] && runs="$runs f16:base int8_hier:base"
    for run in $runs; do
        kv=${run%%:*} side=${run##*:}
        extra=() exe="$BIN/osprey"
        [ "$side" != plain ] && extra=(--speculative-config "$QS")
        [ "$side" = base ] && exe=$BASE
        OSPREY_SPEC_FIXED_K=1 timeout "${RUN_TIMEOUT:-170}" "$exe" generate -m "$M" --device cuda -p "$P" -n "${NGEN:-32}" \
            --temp 0 --seed 1 --kv-cache-dtype "$kv" "${extra[@]}" >"$OUTD/proj_${kv}_$side.out" 2>"$OUTD/proj_${kv}_$side.err"
        echo "== 8B $kv $side (rc $?)"
        grep -E "prompt:|speculative|error" "$OUTD/proj_${kv}_$side.err" | head -4
    done
    md5sum "$OUTD"/proj_*.out # spec and base give plain's text, page type by page type
elif [ "$what" = smol ]; then
    M=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
    for cfg in ngram qs qs_int8h; do
        spec=$QS args=""
        [ $cfg = ngram ] && spec=$NG
        [ $cfg = qs_int8h ] && args="--kv-cache-dtype int8_hier"
        echo "== batch 1, $cfg"
        OSPREY="$BIN/osprey" DEVICE=cuda REPS=${REPS:-3} N_GEN=128 SPEC="$spec" ARGS="$args" bash bench/spec.sh "$M" 2>&1 | tail -6
    done
    for cfg in plain ngram qs plain_int8h qs_int8h; do
        env_=()
        case $cfg in
            ngram) env_=(SPEC="$NG") ;;
            qs) env_=(SPEC="$QS") ;;
            plain_int8h) env_=(KV=int8_hier) ;;
            qs_int8h) env_=(SPEC="$QS" KV=int8_hier) ;;
        esac
        echo "== batch 32, $cfg: $(env DEVICE=cuda "${env_[@]}" "$BIN/offline_throughput" "$M" batch 32 64 128 2 2>&1 | grep -E 'RESULT|error' | head -2)"
    done
else
    echo "usage: bench/spec/gpu_quantspec.sh proj|smol [MODEL]" >&2
    exit 2
fi
