#!/usr/bin/env bash
# CPU generation speed: osprey against llama.cpp on the same GGUF files, same threads, in one run.
#
#   LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin bench/cpu_generate.sh [MODEL.gguf ...]
#
# For each model: llama.cpp's llama-bench (pp = one 128-token prompt batch, tg = 128 single-token
# decode steps, -r repetitions) and `osprey bench` with the same shape, interleaved model by model,
# then the ratios osprey / llama.cpp. THREADS (default 2), N_PROMPT, N_GEN and REPS override the
# shape. llama.cpp is a build made outside this repository (no recipe for it is kept here); without
# LLAMA_CPP_BIN only osprey runs. Default models: the SmolLM2 Q4_1 model, and random-weight Q8_0 and
# Q4_1 models of the same shapes that `osprey make-random-model` writes to /tmp (speed depends only
# on shapes and types). Peak RSS (from /usr/bin/time) is printed for both sides. OSPREY_ARGS: more
# `osprey bench` flags (word-split), e.g. "--cpu-activations q8" (one activation level, as llama.cpp's).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

THREADS="${THREADS:-2}"
N_PROMPT="${N_PROMPT:-128}"
N_GEN="${N_GEN:-128}"
REPS="${REPS:-3}"
OSPREY="${OSPREY:-build/bin/osprey}"
LLAMA_BENCH="${LLAMA_CPP_BIN:+$LLAMA_CPP_BIN/llama-bench}"
read -r -a OARGS <<<"${OSPREY_ARGS:-}"

[ -x "$OSPREY" ] || { echo "build osprey first (make build)" >&2; exit 1; }
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
    models=(models/SmolLM2-135M-Instruct.Q4_1.gguf)
    rnd=/tmp/osprey-bench-smollm2-q8_0.gguf
    [ -f "$rnd" ] || "$OSPREY" make-random-model --preset smollm2-135m --dtype q8_0 -o "$rnd" >/dev/null
    models+=("$rnd")
fi

peak_kb() { /usr/bin/time -f '%M' "$@" 2>&1 >/dev/null | tail -n 1; }

printf '%-44s %-6s %12s %12s %8s %10s %10s\n' model test osprey_t/s llama_t/s ratio osprey_KB llama_KB
for m in "${models[@]}"; do
    o=$("$OSPREY" bench -m "$m" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" -r "$REPS" ${OARGS[@]+"${OARGS[@]}"})
    o_rss=$(peak_kb "$OSPREY" bench -m "$m" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" -r 1 ${OARGS[@]+"${OARGS[@]}"})
    o_pp=$(awk '/^pp/ {print $2}' <<<"$o"); o_tg=$(awk '/^tg/ {print $2}' <<<"$o")
    l_pp=-; l_tg=-; l_rss=-
    if [ -n "$LLAMA_BENCH" ] && [ -x "$LLAMA_BENCH" ]; then
        l=$("$LLAMA_BENCH" -m "$m" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" -r "$REPS" -o csv 2>/dev/null)
        l_rss=$(peak_kb "$LLAMA_BENCH" -m "$m" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" -r 1 -o csv)
        # csv columns: find n_prompt, n_gen and avg_ts by header name
        read -r l_pp l_tg < <(python3 - "$l" <<'PY'
import csv, io, sys
rows = list(csv.DictReader(io.StringIO(sys.argv[1])))
pp = next((r["avg_ts"] for r in rows if int(r["n_prompt"]) > 0 and int(r["n_gen"]) == 0), "-")
tg = next((r["avg_ts"] for r in rows if int(r["n_gen"]) > 0 and int(r["n_prompt"]) == 0), "-")
print(pp, tg)
PY
)
    fi
    for test in pp tg; do
        ov=$([ $test = pp ] && echo "$o_pp" || echo "$o_tg"); lv=$([ $test = pp ] && echo "$l_pp" || echo "$l_tg")
        ratio=$(python3 -c "import sys; a,b=sys.argv[1:]; print('-' if b=='-' else f'{float(a)/float(b):.2f}x')" "$ov" "$lv")
        n=$([ $test = pp ] && echo "$N_PROMPT" || echo "$N_GEN")
        printf '%-44s %-6s %12.1f %12s %8s %10s %10s\n' "$(basename "$m")" "$test$n" "$ov" "$lv" "$ratio" "$o_rss" "$l_rss"
    done
done
