#!/usr/bin/env bash
# Prompt speed of osprey against llama.cpp's llama-bench on one GGUF file, interleaved in one run
# (TEST=tg: decode speed instead, -p 0 -n N_GEN, default 128, in place of -p N_PROMPT -n 0).
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
# OSPREY_B (+ OSPREY_B_ARGS, default OSPREY_ARGS): a second osprey binary (a baseline build, say) run in
# the same rounds, right after the first one, with its own median ratio to llama.cpp's figure of the
# round and the median of the per-round ratios OSPREY / OSPREY_B.
# The box may be shared: each round also prints `others`, the share of the machine's CPU time that
# processes other than this script's used during the round (/proc/stat's busy time minus this shell's
# reaped children's, /proc/$$/stat), and the medians are printed again over the rounds where others
# stayed under QUIET_PCT percent (default 10): llama.cpp's spinning threads lose far more than osprey's
# when a core is taken (pp512 fell from ~300 to ~110 t/s under a co-tenant's compile, osprey's by ~1.5x),
# so contended rounds overstate osprey's lead. QUIET_WAIT=S (default 0) waits up to S seconds before a
# round for a 2-second window with others under QUIET_PCT.
set -euo pipefail
MODEL=$(realpath -m -- "${1:?usage: bench/pp_vs_llama.sh MODEL.gguf}")
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ROUNDS="${ROUNDS:-6}"
N_PROMPT="${N_PROMPT:-512}"
N_GEN="${N_GEN:-128}"
if [ "${TEST:-pp}" = tg ]; then SHAPE=(-p 0 -n "$N_GEN") LABEL="tg$N_GEN"; else SHAPE=(-p "$N_PROMPT" -n 0) LABEL="pp$N_PROMPT"; fi
REPS="${REPS:-3}"
THREADS="${THREADS:-2}"
LLAMA_CPP_BIN="${LLAMA_CPP_BIN:?set LLAMA_CPP_BIN to the directory holding llama-bench}"
if [ -z "${OSPREY:-}" ]; then
    OSPREY=build-cpu/bin/osprey
    [ -x "$OSPREY" ] || OSPREY=build/bin/osprey
fi
LOG="${LOG:-$(mktemp /tmp/osprey-pp-vs-llama.XXXXXX.log)}"
[ -x "$OSPREY" ] || { echo "no osprey binary $OSPREY" >&2; exit 1; }
[ -z "${OSPREY_B:-}" ] || [ -x "$OSPREY_B" ] || { echo "no osprey binary $OSPREY_B (OSPREY_B)" >&2; exit 1; }
OSPREY_B_ARGS="${OSPREY_B_ARGS-${OSPREY_ARGS:-}}"
[ -x "$LLAMA_CPP_BIN/llama-bench" ] || { echo "no $LLAMA_CPP_BIN/llama-bench" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "no model $MODEL" >&2; exit 1; }
export LD_LIBRARY_PATH="$LLAMA_CPP_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

run_llama() { # prints tokens/s (llama-bench's avg_ts, the last CSV field but one)
    local out
    # shellcheck disable=SC2086 # extra flags are word-split on purpose
    out=$("$LLAMA_CPP_BIN/llama-bench" -m "$MODEL" "${SHAPE[@]}" -r "$REPS" -t "$THREADS" -o csv \
        ${LLAMA_ARGS:-} 2>/dev/null) || { echo "llama-bench failed" >&2; exit 1; }
    echo "llama-bench $(tail -1 <<<"$out")" >>"$LOG"
    tail -1 <<<"$out" | awk -F, '{gsub(/"/, "", $(NF - 1)); print $(NF - 1)}'
}

run_osprey() { # BIN ARGS: prints tokens/s (osprey bench's ppN or tgN line)
    local out
    # shellcheck disable=SC2086
    out=$("$1" bench -m "$MODEL" "${SHAPE[@]}" -r "$REPS" -t "$THREADS" $2 2>/dev/null) ||
        { echo "osprey bench failed ($1)" >&2; exit 1; }
    echo "$1 $2 $(grep "^$LABEL" <<<"$out")" >>"$LOG"
    awk -v t="$LABEL" '$1 == t {print $2}' <<<"$out"
}

# /proc/stat's busy and total jiffies of all CPUs, and this shell's reaped children's CPU jiffies
cpu_busy_total() { awk '$1 == "cpu" {b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6}' /proc/stat; }
own_children() { awk '{print $16 + $17}' "/proc/$$/stat"; }
others_pct() { # B0 T0 C0 B1 T1 C1: the percentage of the CPU time others used between two samples
    awk -v b0="$1" -v t0="$2" -v c0="$3" -v b1="$4" -v t1="$5" -v c1="$6" \
        'BEGIN {o = (b1 - b0) - (c1 - c0); if (o < 0) o = 0; printf "%.0f", (t1 > t0 ? 100 * o / (t1 - t0) : 0)}'
}
wait_quiet() {
    local waited=0 b0 t0 b1 t1 pct
    while ((waited < ${QUIET_WAIT:-0})); do
        read -r b0 t0 < <(cpu_busy_total); sleep 2; read -r b1 t1 < <(cpu_busy_total)
        pct=$(awk -v b0="$b0" -v t0="$t0" -v b1="$b1" -v t1="$t1" 'BEGIN {printf "%.0f", 100 * (b1 - b0) / (t1 - t0)}')
        ((pct < ${QUIET_PCT:-10})) && return 0
        waited=$((waited + 2))
    done
}

median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{v[NR] = $1} END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "median %.3fx over %d rounds (min %.3f, max %.3f)", m, NR, v[1], v[NR]}'; }

echo "osprey: $OSPREY ${OSPREY_ARGS:-}${OSPREY_B:+; osprey B: $OSPREY_B $OSPREY_B_ARGS}; llama.cpp: $LLAMA_CPP_BIN/llama-bench ${LLAMA_ARGS:-}"
echo "model $MODEL, $LABEL, -t $THREADS, -r $REPS, $ROUNDS rounds; load $(cut -d' ' -f1-3 /proc/loadavg); log $LOG"
QUIET_PCT="${QUIET_PCT:-10}"
ratios="" ratios_b="" ratios_ab="" q_ratios="" q_ratios_b="" q_ratios_ab=""
for ((i = 1; i <= ROUNDS; i++)); do
    wait_quiet
    read -r b0 t0 < <(cpu_busy_total); c0=$(own_children)
    ob=""
    if ((i % 2)); then
        l=$(run_llama); o=$(run_osprey "$OSPREY" "${OSPREY_ARGS:-}")
        [ -z "${OSPREY_B:-}" ] || ob=$(run_osprey "$OSPREY_B" "$OSPREY_B_ARGS")
    else
        [ -z "${OSPREY_B:-}" ] || ob=$(run_osprey "$OSPREY_B" "$OSPREY_B_ARGS")
        o=$(run_osprey "$OSPREY" "${OSPREY_ARGS:-}"); l=$(run_llama)
    fi
    read -r b1 t1 < <(cpu_busy_total); c1=$(own_children)
    others=$(others_pct "$b0" "$t0" "$c0" "$b1" "$t1" "$c1")
    quiet=$((others < QUIET_PCT))
    r=$(awk -v o="$o" -v l="$l" 'BEGIN {printf "%.4f", o / l}')
    ratios+="$r "
    ((quiet)) && q_ratios+="$r "
    line=$(printf 'round %-3d llama.cpp %9.2f t/s  osprey %9.2f t/s  osprey/llama.cpp %.3f' "$i" "$l" "$o" "$r")
    if [ -n "$ob" ]; then
        rb=$(awk -v o="$ob" -v l="$l" 'BEGIN {printf "%.4f", o / l}')
        rab=$(awk -v o="$o" -v b="$ob" 'BEGIN {printf "%.4f", o / b}')
        ratios_b+="$rb " ratios_ab+="$rab "
        ((quiet)) && q_ratios_b+="$rb " q_ratios_ab+="$rab "
        line+=$(printf '  B %9.2f t/s  B/llama.cpp %.3f  osprey/B %.3f' "$ob" "$rb" "$rab")
    fi
    echo "$line  (others $others %)"
done
echo "all rounds:"
echo "$LABEL osprey / llama.cpp: $(median <<<"$ratios")"
if [ -n "${OSPREY_B:-}" ]; then
    echo "$LABEL osprey B / llama.cpp: $(median <<<"$ratios_b")"
    echo "$LABEL osprey / osprey B: $(median <<<"$ratios_ab")"
fi
if [ -n "$q_ratios" ]; then
    echo "rounds with others < $QUIET_PCT %:"
    echo "$LABEL osprey / llama.cpp: $(median <<<"$q_ratios")"
    if [ -n "${OSPREY_B:-}" ]; then
        echo "$LABEL osprey B / llama.cpp: $(median <<<"$q_ratios_b")"
        echo "$LABEL osprey / osprey B: $(median <<<"$q_ratios_ab")"
    fi
else
    echo "no round with others < $QUIET_PCT %"
fi
