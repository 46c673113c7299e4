#!/usr/bin/env bash
# Prompt speed of osprey against llama.cpp's llama-bench on one GGUF file, interleaved in one run.
#
#   LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin bench/pp_vs_llama.sh MODEL.gguf
#
# Each round runs `llama-bench -m MODEL -p N_PROMPT -n 0 -r REPS -t THREADS` and
# `osprey bench -m MODEL -p N_PROMPT -n 0 -r REPS -t THREADS $OSPREY_ARGS` back to back (who goes first
# alternates by round, so a drift in the machine's speed does not favour one side), and the ratio of
# the two tokens/s figures (each the tool's own mean over its repetitions, after its warm-up, so model
# loading is not in it) is that round's figure. The result is the MEDIAN of the per-round ratios
# osprey / llama.cpp (> 1: osprey is faster), with their min..max: on a shared box single rounds
# swing widely, the median stays meaningful. ROUNDS (default 6), N_PROMPT (512), REPS (3), THREADS
# (2); OSPREY (default build-cpu/bin/osprey, else build/bin/osprey) and OSPREY_ARGS (word-split, e.g.
# "--cpu-activations q8"); LLAMA_ARGS for llama-bench's extra flags. Every round's line goes to $LOG
# (default a file in /tmp). LD_LIBRARY_PATH gets LLAMA_CPP_BIN (llama.cpp's shared libraries).
set -euo pipefail
MODEL=$(realpath -m -- "${1:?usage: bench/pp_vs_llama.sh MODEL.gguf}")
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ROUNDS="${ROUNDS:-6}"
N_PROMPT="${N_PROMPT:-512}"
REPS="${REPS:-3}"
THREADS="${THREADS:-2}"
LLAMA_CPP_BIN="${LLAMA_CPP_BIN:?set LLAMA_CPP_BIN to the directory holding llama-bench}"
if [ -z "${OSPREY:-}" ]; then
    OSPREY=build-cpu/bin/osprey
    [ -x "$OSPREY" ] || OSPREY=build/bin/osprey
fi
LOG="${LOG:-$(mktemp /tmp/osprey-pp-vs-llama.XXXXXX.log)}"
[ -x "$OSPREY" ] || { echo "no osprey binary $OSPREY" >&2; exit 1; }
[ -x "$LLAMA_CPP_BIN/llama-bench" ] || { echo "no $LLAMA_CPP_BIN/llama-bench" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "no model $MODEL" >&2; exit 1; }
export LD_LIBRARY_PATH="$LLAMA_CPP_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

run_llama() { # prints tokens/s (llama-bench's avg_ts, the last CSV field but one)
    local out
    # shellcheck disable=SC2086 # extra flags are word-split on purpose
    out=$("$LLAMA_CPP_BIN/llama-bench" -m "$MODEL" -p "$N_PROMPT" -n 0 -r "$REPS" -t "$THREADS" -o csv \
        ${LLAMA_ARGS:-} 2>/dev/null) || { echo "llama-bench failed" >&2; exit 1; }
    echo "llama-bench $(tail -1 <<<"$out")" >>"$LOG"
    tail -1 <<<"$out" | awk -F, '{gsub(/"/, "", $(NF - 1)); print $(NF - 1)}'
}

run_osprey() { # prints tokens/s (osprey bench's ppN line)
    local out
    # shellcheck disable=SC2086
    out=$("$OSPREY" bench -m "$MODEL" -p "$N_PROMPT" -n 0 -r "$REPS" -t "$THREADS" ${OSPREY_ARGS:-} 2>/dev/null) ||
        { echo "osprey bench failed" >&2; exit 1; }
    echo "osprey ${OSPREY_ARGS:-} $(grep "^pp" <<<"$out")" >>"$LOG"
    awk '$1 ~ /^pp[0-9]+$/ {print $2}' <<<"$out"
}

echo "osprey: $OSPREY ${OSPREY_ARGS:-}; llama.cpp: $LLAMA_CPP_BIN/llama-bench ${LLAMA_ARGS:-}"
echo "model $MODEL, pp$N_PROMPT, -t $THREADS, -r $REPS, $ROUNDS rounds; load $(cut -d' ' -f1-3 /proc/loadavg); log $LOG"
ratios=""
for ((i = 1; i <= ROUNDS; i++)); do
    if ((i % 2)); then l=$(run_llama); o=$(run_osprey); else o=$(run_osprey); l=$(run_llama); fi
    r=$(awk -v o="$o" -v l="$l" 'BEGIN {printf "%.4f", o / l}')
    ratios+="$r "
    printf 'round %-3d llama.cpp %9.2f t/s  osprey %9.2f t/s  osprey/llama.cpp %.3f  (load %s)\n' \
        "$i" "$l" "$o" "$r" "$(cut -d' ' -f1 /proc/loadavg)"
done
tr ' ' '\n' <<<"$ratios" | sed '/^$/d' | sort -g | awk -v n="$ROUNDS" -v p="$N_PROMPT" '{v[NR] = $1} END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "pp%s osprey / llama.cpp: median %.3fx over %d rounds (min %.3f, max %.3f)\n", p, m, NR, v[1], v[NR]}'
