#!/usr/bin/env bash
# CPU speed A/B of two osprey binaries on the same GGUF file, same threads, interleaved in one run.
#
#   BUILD=1 bench/ab_cpu.sh                     builds both (BASE, default bb1ad02, and this tree), then runs
#   BASE_DIR=/path/to/base bench/ab_cpu.sh [A_BIN [B_BIN]]
#
# A is the baseline, B the candidate. Defaults: A = $BASE_DIR/build/bin/osprey, a CPU-only Release
# build of the base commit (BASE, default bb1ad02) exported outside this repository:
#   mkdir -p "$BASE_DIR" && git archive "$BASE" | tar -x -C "$BASE_DIR"
#   cmake -S "$BASE_DIR" -B "$BASE_DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=OFF
#   cmake --build "$BASE_DIR/build" -j 2 --target osprey osprey_cli
# and B = build/bin/osprey (OSPREY, as in cpu_generate.sh).
#
# Two tests, each its own process as llama-bench separates them: pp = `osprey bench -p N_PROMPT -n 0`
# (one prompt batch), tg = `osprey bench -p 0 -n N_GEN` (single-token decode steps). The figures are
# osprey's own tokens/s (the mean over -r REPS repetitions inside the process, after its warm-up), so
# model loading is not in them. Runs are interleaved A B A B ... for PAIRS pairs (default 7, at least
# 5 for a figure worth quoting) and the result is the MEDIAN of the per-pair ratios B/A (> 1: B is
# faster), which stays meaningful while the machine's speed drifts; min and max show the spread. The
# whole-process wall time of each run (load included) is kept too and its median ratio A/B printed
# beside it (> 1: B finished sooner). THREADS (default 2), N_PROMPT (128), N_GEN (64), REPS (3), PAIRS,
# MODEL and TESTS ("pp tg") override the shape. Every run's line goes to $LOG (default a file in /tmp).
# A_ARGS / B_ARGS: extra flags for each side's `osprey bench` (word-split), e.g. a mode A/B on one binary:
#   A_ARGS= B_ARGS="--cpu-activations q8" bench/ab_cpu.sh build/bin/osprey build/bin/osprey
set -euo pipefail
# paths given on the command line or in BASE_DIR are the caller's; the defaults are the repository's
args=(); for a in "$@"; do args+=("${a:+$(realpath -m -- "$a")}"); done
[ -z "${BASE_DIR:-}" ] || BASE_DIR=$(realpath -m -- "$BASE_DIR")
[ -z "${MODEL:-}" ] || MODEL=$(realpath -m -- "$MODEL")
cd "$(dirname "${BASH_SOURCE[0]}")/.."
set -- "${args[@]}"

THREADS="${THREADS:-2}"
N_PROMPT="${N_PROMPT:-128}"
N_GEN="${N_GEN:-64}"
REPS="${REPS:-3}"
PAIRS="${PAIRS:-7}"
TESTS="${TESTS:-pp tg}"
MODEL="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
BASE="${BASE:-bb1ad02}"
A="${1:-${BASE_DIR:+$BASE_DIR/build/bin/osprey}}"
B="${2:-${OSPREY:-build/bin/osprey}}"
LOG="${LOG:-$(mktemp /tmp/osprey-ab-cpu.XXXXXX.log)}"

# BUILD=1: make both sides here first (the base exported from this repository's history into
# BASE_DIR, default /tmp/osprey-base-$BASE; the candidate is this tree's CPU-only build/)
if [ "${BUILD:-0}" = 1 ]; then
    BASE_DIR=${BASE_DIR:-/tmp/osprey-base-$BASE}
    if [ ! -x "$BASE_DIR/build/bin/osprey" ]; then
        mkdir -p "$BASE_DIR" && git archive "$BASE" | tar -x -C "$BASE_DIR"
        cmake -S "$BASE_DIR" -B "$BASE_DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=OFF >/dev/null
        cmake --build "$BASE_DIR/build" -j "${JOBS:-2}" --target osprey_cli >/dev/null
    fi
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j "${JOBS:-2}" --target osprey_cli >/dev/null
    A="${1:-$BASE_DIR/build/bin/osprey}"
fi
if [ -z "$A" ] || [ ! -x "$A" ]; then
    echo "no baseline binary: give A_BIN, or BASE_DIR holding a build of $BASE, or BUILD=1 (recipe at the top of $0)" >&2
    exit 1
fi
[ -x "$B" ] || { echo "no candidate binary $B (make build, or give B_BIN)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "no model $MODEL (scripts/fetch-model.sh)" >&2; exit 1; }
[ "$PAIRS" -ge 1 ] || { echo "PAIRS must be >= 1" >&2; exit 1; }

# one run: prints "<tokens/s> <wall seconds>"; the bench line itself goes to $LOG
run_one() { # BIN TEST EXTRA_ARGS
    local bin=$1 test=$2 extra=${3:-} p n t0 t1 out fig
    if [ "$test" = pp ]; then p=$N_PROMPT n=0; else p=0 n=$N_GEN; fi
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086 # extra flags are word-split on purpose
    out=$("$bin" bench -m "$MODEL" -p "$p" -n "$n" -t "$THREADS" -r "$REPS" $extra 2>/dev/null) ||
        { echo "$bin bench failed" >&2; exit 1; }
    t1=$(date +%s.%N)
    fig=$(awk -v t="$test" '$1 ~ "^"t"[0-9]+$" {print $2}' <<<"$out")
    [ -n "$fig" ] || { echo "$bin printed no $test line: $out" >&2; exit 1; }
    echo "$bin${extra:+ $extra} $test $out wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')" >>"$LOG"
    awk -v f="$fig" -v a="$t0" -v b="$t1" 'BEGIN {printf "%s %.4f\n", f, b - a}'
}

echo "A: $A${A_ARGS:+ $A_ARGS}"
echo "B: $B${B_ARGS:+ $B_ARGS}"
echo "model $MODEL, -t $THREADS, pp$N_PROMPT, tg$N_GEN, -r $REPS, $PAIRS pairs A B A B ...; load $(cut -d' ' -f1-3 /proc/loadavg); log $LOG"
declare -A ratios wall_ratios a_figs b_figs
for ((i = 1; i <= PAIRS; i++)); do
    for test in $TESTS; do
        ra=$(run_one "$A" "$test" "${A_ARGS:-}"); read -r fa wa <<<"$ra"
        rb=$(run_one "$B" "$test" "${B_ARGS:-}"); read -r fb wb <<<"$rb"
        ratios[$test]+="$(awk -v a="$fa" -v b="$fb" 'BEGIN {printf "%.6f", b / a}') "
        wall_ratios[$test]+="$(awk -v a="$wa" -v b="$wb" 'BEGIN {printf "%.6f", a / b}') "
        a_figs[$test]+="$fa "; b_figs[$test]+="$fb "
        printf 'pair %-3d %-3s A %10.2f t/s  B %10.2f t/s  B/A %.3f   wall A %.3fs B %.3fs\n' \
            "$i" "$test" "$fa" "$fb" "$(awk -v a="$fa" -v b="$fb" 'BEGIN {print b / a}')" "$wa" "$wb"
    done
done

stats() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{v[NR] = $1} END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f %.3f %.3f\n", m, v[1], v[NR]}'; }

echo
printf '%-8s %12s %12s %10s %15s %14s\n' test A_t/s B_t/s B/A "B/A min..max" "wall A/B"
for test in $TESTS; do
    n=$([ "$test" = pp ] && echo "$N_PROMPT" || echo "$N_GEN")
    read -r ma _ _ < <(stats <<<"${a_figs[$test]}")
    read -r mb _ _ < <(stats <<<"${b_figs[$test]}")
    read -r mr lo hi < <(stats <<<"${ratios[$test]}")
    read -r mw _ _ < <(stats <<<"${wall_ratios[$test]}")
    printf '%-8s %12.2f %12.2f %9.3fx %7.3f..%-7.3f %13.3fx\n' "$test$n" "$ma" "$mb" "$mr" "$lo" "$hi" "$mw"
done
echo "(medians over $PAIRS pairs; B/A is the median of the per-pair ratios of osprey's own tokens/s; wall A/B: whole process, load included)"
