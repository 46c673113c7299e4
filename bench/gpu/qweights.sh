#!/usr/bin/env bash
# Quantized weights on the GPU (issue 17), in one device call: a Llama-3.1-8B-shaped Q4_K_M GGUF with
# random weights (osprey make-random-model --dtype q4_k_m: llama.cpp's Q4_K_M type mix, quantized by
# core/quantize.c), decoded by osprey with the matrices kept in their blocks (--gpu-weights quant),
# by osprey with every matrix dequantized to bf16 at load (--gpu-weights bf16), and by llama.cpp CUDA
# (llama-bench, llama-batched-bench from $LLAMA_BIN, built from public source on this machine in the
# same session; no llama.cpp row when absent). Same file, same call; prints a table with the ratios.
#   MODEL   the GGUF (default /tmp/m8b-q4km.gguf; made here when missing)
#   N_GEN, N_PROMPT, BATCH   tg / pp lengths and the batched row (128, 512, 64)
#   WEIGHTS  the osprey rows ("quant bf16")
# Run after scripts/gpu-test.sh unpacked the binaries into /tmp/osprey-gpu/gpu (same warm machine).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
G=/tmp/osprey-gpu/gpu
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
O=$G/bin/osprey
[ -x "$O" ] || { echo "bench/gpu/qweights.sh: no $O: run scripts/gpu-test.sh first (on this warm machine)"; exit 1; }
MODEL=${MODEL:-/tmp/m8b-q4km.gguf}
N_GEN=${N_GEN:-128}
N_PROMPT=${N_PROMPT:-512}
BATCH=${BATCH:-64}
if [ ! -f "$MODEL" ]; then
    $O make-random-model --preset llama-3.1-8b --dtype q4_k_m --random-blocks -o "$MODEL" || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
rows=()
val() { echo "$1" | awk -v t="$2" '$1 == t {print $2}'; }
for w in ${WEIGHTS:-quant bf16}; do
    out=$($O bench -m "$MODEL" --device cuda --gpu-weights $w -p "$N_PROMPT" -n "$N_GEN" -r 3 --batch "$BATCH" 2>&1)
    echo "osprey --gpu-weights $w:"; echo "$out" | sed 's/^/  /'
    eval "o_${w}_tg=\$(val \"\$out\" tg$N_GEN)"
    eval "o_${w}_pp=\$(val \"\$out\" pp$N_PROMPT)"
    eval "o_${w}_tgb=\$(val \"\$out\" tg$N_GEN@b$BATCH)"
done
l_tg= l_pp= l_tgb=
if [ -n "${LLAMA_BIN:-}" ] && [ -x "$LLAMA_BIN/llama-bench" ]; then
    lb=$("$LLAMA_BIN/llama-bench" -m "$MODEL" -ngl 99 -p "$N_PROMPT" -n "$N_GEN" -r 3 -o csv 2>/dev/null)
    echo "llama-bench:"; echo "$lb" | sed 's/^/  /'
    # csv: the avg_ts column; the row with n_prompt > 0 is pp, the one with n_gen > 0 is tg
    l_pp=$(echo "$lb" | python3 -c 'import csv,sys; r=[x for x in csv.DictReader(sys.stdin) if int(x["n_prompt"])>0]; print("%.2f" % float(r[0]["avg_ts"]) if r else "")')
    l_tg=$(echo "$lb" | python3 -c 'import csv,sys; r=[x for x in csv.DictReader(sys.stdin) if int(x["n_gen"])>0]; print("%.2f" % float(r[0]["avg_ts"]) if r else "")')
    if [ -x "$LLAMA_BIN/llama-batched-bench" ]; then
        bb=$("$LLAMA_BIN/llama-batched-bench" -m "$MODEL" -ngl 99 -c $((BATCH * (128 + N_GEN) + 256)) -b 2048 -ub 512 \
            -npp 128 -ntg "$N_GEN" -npl "$BATCH" 2>/dev/null | grep '^|' )
        echo "llama-batched-bench:"; echo "$bb" | sed 's/^/  /'
        # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |: S_TG, decode only
        l_tgb=$(echo "$bb" | awk -F'|' -v b="$BATCH" '$4+0 == b {gsub(/ /, "", $9); print $9}' | tail -1)
    fi
fi
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else printf "-" }'; }
echo "==== 8B Q4_K_M on the GPU, tokens/s ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
printf '%-12s %10s %10s %10s %12s %12s\n' test quant bf16 llama.cpp quant/llama quant/bf16
printf '%-12s %10s %10s %10s %12s %12s\n' "tg$N_GEN" "${o_quant_tg:--}" "${o_bf16_tg:--}" "${l_tg:--}" "$(ratio "${o_quant_tg:-0}" "${l_tg:-0}")" "$(ratio "${o_quant_tg:-0}" "${o_bf16_tg:-0}")"
printf '%-12s %10s %10s %10s %12s %12s\n' "pp$N_PROMPT" "${o_quant_pp:--}" "${o_bf16_pp:--}" "${l_pp:--}" "$(ratio "${o_quant_pp:-0}" "${l_pp:-0}")" "$(ratio "${o_quant_pp:-0}" "${o_bf16_pp:-0}")"
printf '%-12s %10s %10s %10s %12s %12s\n' "tg$N_GEN@b$BATCH" "${o_quant_tgb:--}" "${o_bf16_tgb:--}" "${l_tgb:--}" "$(ratio "${o_quant_tgb:-0}" "${l_tgb:-0}")" "$(ratio "${o_quant_tgb:-0}" "${o_bf16_tgb:-0}")"
