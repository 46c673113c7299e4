#!/usr/bin/env bash
# GPU decode speed A/B on the H200, in one device call: the baseline CLI (A, a CUDA build of bb1ad02,
# the commit before the op-list/backend refactor, staged by scripts/gpu-pack.sh under base/) against
# this tree's (B), on the shapes of bench/gpu/run.sh: batch-1 and batch-64 decode for SmolLM2-135M and
# Llama-3.1-8B with bf16 random weights drawn on the GPU (`osprey bench --random-weights PRESET
# --device cuda --batch 64`: every step a forward pass from a CUDA graph + greedy sampling on the
# device, token ids back to the host; one process prints the batch-1 line tg<N> and the batch line
# tg<N>@b64, both trees print the same format). Each run is its own process (weights drawn, graphs
# captured, timed by osprey after its warm-up, so load time is not in the figure); runs are interleaved
# A B A B ... for PAIRS pairs (default 5) and the result per shape is the MEDIAN of the per-pair ratios
# B/A (> 1: B is faster), which stays meaningful while the card's clocks drift; every ratio is printed.
# Small shapes keep it short (-p 16 -n 64 -r 2: the 8B KV cache holds 64 x 96 positions, 0.75 GiB):
# about 2-3 minutes on an H200, most of it drawing the 8B's weights; MAX_S (default 360) stops starting
# new pairs past that many seconds. Run after scripts/gpu-test.sh unpacked the binaries into
# /tmp/osprey-gpu (same warm machine), e.g. `bash scripts/gpu-test.sh ab` or
# `bash scripts/gpu-test.sh ops; bash bench/gpu/ab.sh`. A, B, PAIRS, N_PROMPT, N_GEN, REPS, BATCH,
# PRESETS and RUN_TIMEOUT (one run, default 90 s) override; every run's output goes to $LOG (default
# $OUT/gpu-ab.log, else /tmp/gpu-ab.log).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
S=/tmp/osprey-gpu # unpacked there by scripts/gpu-test.sh
G=$S/gpu
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} OMP_WAIT_POLICY=passive
A=${A:-$S/base/bin/osprey}
B=${B:-$G/bin/osprey}
PAIRS=${PAIRS:-5}
N_PROMPT=${N_PROMPT:-16}
N_GEN=${N_GEN:-64}
REPS=${REPS:-2}
BATCH=${BATCH:-64}
PRESETS=${PRESETS:-smollm2-135m llama-3.1-8b}
MAX_S=${MAX_S:-360}
LOG=${LOG:-${OUT:-/tmp}/gpu-ab.log}
[ -x "$A" ] || { echo "bench/gpu/ab.sh: no baseline $A: stage it with scripts/gpu-pack.sh (base/bin/osprey) and run scripts/gpu-test.sh first"; exit 1; }
[ -x "$B" ] || { echo "bench/gpu/ab.sh: no $B: run scripts/gpu-test.sh first (on this warm machine)"; exit 1; }
[ "$PAIRS" -ge 1 ] 2>/dev/null || { echo "bench/gpu/ab.sh: PAIRS must be >= 1"; exit 1; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
echo "A: $A"
echo "B: $B"
echo "presets: $PRESETS; -p $N_PROMPT -n $N_GEN -r $REPS --batch $BATCH; $PAIRS pairs A B A B ...; log $LOG"
: >"$LOG"

# one run: prints "<tg tok/s> <tg@bB tok/s> <wall s>" ("-" for a figure it did not print)
run_one() { # BIN PRESET
    local bin=$1 preset=$2 t0 t1 out rc
    t0=$(date +%s.%N)
    out=$(timeout "${RUN_TIMEOUT:-90}" "$bin" bench --random-weights "$preset" --device cuda -p "$N_PROMPT" -n "$N_GEN" -r "$REPS" \
        --batch "$BATCH" 2>>"$LOG")
    rc=$?
    t1=$(date +%s.%N)
    echo "$bin $preset rc=$rc: $(tr '\n' ' ' <<<"$out")" >>"$LOG"
    awk -v f1="$(awk '$1 ~ /^tg[0-9]+$/ {print $2}' <<<"$out")" -v fb="$(awk -v b="^tg[0-9]+@b$BATCH" '$1 ~ b"$" {print $2}' <<<"$out")" \
        -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%s %s %.2f\n", f1 == "" ? "-" : f1, fb == "" ? "-" : fb, t1 - t0 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || a <= 0) print "-"; else printf "%.3f", b / a }'; }
# median, min, max of the numbers on stdin ("-" skipped)
stats() { tr ' ' '\n' | sed '/^$/d; /^-$/d' | sort -g | awk '{v[NR] = $1} END {
    if (NR == 0) { print "- - -"; exit }
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f %.3f %.3f\n", m, v[1], v[NR] }'; }

t1f() { awk -v x="$1" 'BEGIN { if (x == "-") print x; else printf "%.1f", x }'; }
declare -A ra fa fb wa wb
shapes=()
for preset in $PRESETS; do shapes+=("$preset b1" "$preset b$BATCH"); done
start=$(date +%s)
done_pairs=0 bad=0
for ((i = 1; i <= PAIRS; i++)); do
    if [ $(($(date +%s) - start)) -gt "$MAX_S" ]; then
        echo "stopping after $done_pairs pairs: past MAX_S=$MAX_S s"
        break
    fi
    for preset in $PRESETS; do
        read -r a1 ab aw < <(run_one "$A" "$preset")
        read -r b1 bb bw < <(run_one "$B" "$preset")
        for x in "$a1" "$ab" "$b1" "$bb"; do [ "$x" = - ] && bad=$((bad + 1)); done
        k="$preset b1" kb="$preset b$BATCH"
        ra[$k]+="$(ratio "$a1" "$b1") " ra[$kb]+="$(ratio "$ab" "$bb") "
        fa[$k]+="$a1 " fb[$k]+="$b1 " fa[$kb]+="$ab " fb[$kb]+="$bb "
        wa[$preset]+="$aw " wb[$preset]+="$bw "
        printf 'pair %-2d %-14s b1 A %9s B %9s B/A %6s | b%d A %9s B %9s B/A %6s | wall A %6.1fs B %6.1fs\n' \
            "$i" "$preset" "$a1" "$b1" "$(ratio "$a1" "$b1")" "$BATCH" "$ab" "$bb" "$(ratio "$ab" "$bb")" "$aw" "$bw"
    done
    done_pairs=$i
    # nothing parsed in the whole first pair: the binaries do not run here (see $LOG); stop
    if [ "$i" = 1 ] && [ "$bad" -ge $((4 * ${#shapes[@]} / 2)) ]; then echo "no figures in pair 1: stopping (see $LOG)"; break; fi
done

echo
echo "==== GPU decode A/B, tokens/s (A: baseline bb1ad02, B: this tree; bf16 random weights, $done_pairs pairs, $(($(date +%s) - start)) s)"
printf '%-14s %-5s %10s %10s %8s %15s  %s\n' shape test "A t/s" "B t/s" "B/A" "B/A min..max" "per-pair B/A"
for s in "${shapes[@]}"; do
    read -r preset test <<<"$s"
    read -r ma _ _ < <(stats <<<"${fa[$s]:-}")
    read -r mb _ _ < <(stats <<<"${fb[$s]:-}")
    read -r mr lo hi < <(stats <<<"${ra[$s]:-}")
    printf '%-14s %-5s %10s %10s %8s %7s..%-7s  %s\n' "$preset" "$test" "$(t1f "$ma")" "$(t1f "$mb")" "${mr/%[0-9]/&x}" "$lo" "$hi" \
        "${ra[$s]:-}"
done
echo "(A/B t/s: medians of osprey's own figures; B/A: median of the per-pair ratios, > 1: B faster)"
for preset in $PRESETS; do
    read -r mwa _ _ < <(stats <<<"${wa[$preset]:-}")
    read -r mwb _ _ < <(stats <<<"${wb[$preset]:-}")
    echo "wall per run (load included), median: $preset A ${mwa}s B ${mwb}s"
done
[ "$bad" -eq 0 ] || { echo "bench/gpu/ab.sh: $bad figures missing (see $LOG)"; exit 1; }
