#!/usr/bin/env bash
# GPU decode speed on the H200, in one device call: batch-1 and batch-64 decode for Llama-3.1-8B and
# SmolLM2-135M shapes with bf16 random weights (`osprey bench --random-weights`: drawn on the GPU, no
# file), timed with `osprey bench --device cuda` (every step: forward pass from a CUDA graph + greedy
# sampling on the device, token ids back to the host). Prints a table with the llama.cpp CUDA figures
# measured on this machine type (issue 7: 207.6 tok/s 8B batch 1, 5,110 tok/s 8B batch 64, 983 tok/s
# SmolLM2 shape batch 1) and the ratio. Run after scripts/gpu-test.sh unpacked the binaries into
# /tmp/osprey-gpu/gpu (same warm machine), e.g. `bash scripts/gpu-test.sh ops; bash bench/gpu/run.sh`.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
G=/tmp/osprey-gpu/gpu # unpacked there by scripts/gpu-test.sh
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
O=$G/bin/osprey
[ -x "$O" ] || { echo "bench/gpu/run.sh: no $O: run scripts/gpu-test.sh first (on this warm machine)"; exit 1; }
N_GEN=${N_GEN:-128}
N_PROMPT=${N_PROMPT:-128}
rows=()
for preset in smollm2-135m llama-3.1-8b; do
    # weights drawn on the GPU (--random-weights): bit-identical to make-random-model --dtype bf16, no file
    out=$($O bench --random-weights "$preset" --device cuda -p "$N_PROMPT" -n "$N_GEN" -r 3 --batch 64 2>/dev/null)
    echo "$preset: $out" | tr '\n' ' '; echo
    tg1=$(echo "$out" | awk '$1 ~ /^tg[0-9]+$/ {print $2}')
    tg64=$(echo "$out" | awk '$1 ~ /^tg[0-9]+@b64$/ {print $2}')
    pp=$(echo "$out" | awk '$1 ~ /^pp[0-9]+$/ {print $2}')
    case $preset in
        llama-3.1-8b) ref1=207.6 ref64=5110 ;;
        *) ref1=983 ref64= ;;
    esac
    rows+=("$(printf '%-14s %-8s %10s %10s %8s' "$preset" "b1" "$tg1" "$ref1" "$(awk -v a="$tg1" -v b="$ref1" 'BEGIN { if (a > 0) printf "%.2f", a / b }')")")
    if [ -n "$ref64" ]; then
        rows+=("$(printf '%-14s %-8s %10s %10s %8s' "$preset" "b64" "$tg64" "$ref64" "$(awk -v a="$tg64" -v b="$ref64" 'BEGIN { if (a > 0) printf "%.2f", a / b }')")")
    else
        rows+=("$(printf '%-14s %-8s %10s %10s %8s' "$preset" "b64" "$tg64" "-" "-")")
    fi
    rows+=("$(printf '%-14s %-8s %10s %10s %8s' "$preset" "pp$N_PROMPT" "$pp" "-" "-")")
done
echo "==== GPU decode, tokens/s (osprey bf16 random weights; llama.cpp CUDA figures from issue 7)"
printf '%-14s %-8s %10s %10s %8s\n' shape test osprey llama.cpp ratio
printf '%s\n' "${rows[@]}"
