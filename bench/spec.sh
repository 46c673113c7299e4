#!/usr/bin/env bash
# Speculative decoding against plain decoding (issue 14): `osprey generate` at batch 1 on one prompt,
# the two runs interleaved (plain, spec, plain, spec, ...) so machine noise hits both alike; prints
# each run's decode tokens/s, the medians, the ratio spec / plain, the mean acceptance length (vLLM's:
# 1 + accepted drafts per verification row; and tokens per decode step) and checks that both runs
# printed the same text (greedy, or sampled with the fixed seed: they must).
#
#   bench/spec.sh [MODEL.gguf]          REPS (5), N_GEN (128), THREADS (2), SPEC (the config JSON),
#                                       PROMPT (an input-grounded one: edit a given text), TEMP (0),
#                                       ARGS (more generate flags for both runs, e.g. "--kv-cache-dtype
#                                       int8_hier": QuantSpec's pages, which the plain run must use too),
#                                       DEVICE (cpu; cuda: the target and a draft model on the GPU)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MODEL="${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
REPS="${REPS:-5}"
N_GEN="${N_GEN:-128}"
THREADS="${THREADS:-2}"
TEMP="${TEMP:-0}"
read -r -a ARGS_A <<<"${ARGS:-}"
OSPREY="${OSPREY:-build/bin/osprey}"
SPEC="${SPEC:-{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5\}}"
DEFAULT_PROMPT='<|im_start|>user
Rewrite the following text, replacing "osprey" with "sea hawk" and changing nothing else.

The osprey is a diurnal, fish-eating bird of prey with a cosmopolitan range. It is a large raptor,
reaching more than 60 cm in length and 180 cm across the wings. It is brown on the upperparts and
predominantly greyish on the head and underparts. The osprey tolerates a wide variety of habitats,
nesting in any location near a body of water providing an adequate food supply. It is found on all
continents except Antarctica, although in South America it occurs only as a non-breeding migrant.
As its other common names suggest, the diet of the osprey consists almost exclusively of fish.<|im_end|>
<|im_start|>assistant
'
PROMPT="${PROMPT:-$DEFAULT_PROMPT}"

[ -x "$OSPREY" ] || { echo "build osprey first (make build)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() { # $1: plain|spec, $2: rep
    local extra=()
    [ "$1" = spec ] && extra=(--speculative-config "$SPEC")
    "$OSPREY" generate -m "$MODEL" -p "$PROMPT" -n "$N_GEN" --temp "$TEMP" --seed 1 -t "$THREADS" --device "${DEVICE:-cpu}" \
        ${ARGS_A[@]+"${ARGS_A[@]}"} "${extra[@]}" >"$tmp/$1.$2.out" 2>"$tmp/$1.$2.err"
    # "generation: N tokens, S decode steps in T ms, R tokens/s"
    sed -n 's/.*generation: \([0-9]*\) tokens, \([0-9]*\) decode steps in \([0-9.]*\) ms, \([0-9.]*\) tokens\/s.*/\1 \2 \3 \4/p' \
        "$tmp/$1.$2.err"
}

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "# model $MODEL on ${DEVICE:-cpu}, $N_GEN tokens, temp $TEMP, $THREADS threads, $REPS interleaved pairs; spec: $SPEC; args: ${ARGS:-none}"
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %4s %7s %6s %9s %9s\n' run rep tokens steps ms tok/s
for r in $(seq 1 "$REPS"); do
    for side in plain spec; do
        read -r n steps ms tps <<<"$(run "$side" "$r")"
        printf '%-6s %4d %7d %6d %9.0f %9.1f\n' "$side" "$r" "$n" "$steps" "$ms" "$tps"
        echo "$tps" >>"$tmp/$side.tps"
        echo "$n $steps" >>"$tmp/$side.steps"
    done
    cmp -s "$tmp/plain.$r.out" "$tmp/spec.$r.out" || { echo "MISMATCH: rep $r outputs differ"; exit 1; }
done
p=$(median <"$tmp/plain.tps")
s=$(median <"$tmp/spec.tps")
tps_step=$(awk '{t += $1 - 1; s += $2} END {printf "%.2f", s ? t / s : 0}' "$tmp/spec.steps")
grep -h '^speculative' "$tmp/spec.1.err" || true
printf 'median decode tokens/s: plain %.1f, spec %.1f, ratio %.2fx; %s tokens per decode step; outputs identical\n' \
    "$p" "$s" "$(awk -v a="$s" -v b="$p" 'BEGIN {print a / b}')" "$tps_step"
