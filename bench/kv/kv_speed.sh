#!/usr/bin/env bash
# Decode speed with each KV dtype on the CPU (issue 13's "Fast", CPU row): osprey bench's tg at a
# given depth, one run per dtype per round, the dtypes interleaved round by round (so a drift in the
# machine's load hits them alike), then the median per dtype and its ratio to f16. Run it on an idle
# machine: another job on the cores invalidates the A/B.
# usage: bench/kv/kv_speed.sh [MODEL] [DEPTH (4096)] [ROUNDS (5)] [GEN (32)]
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
DEPTH=${2:-4096}
ROUNDS=${3:-5}
GEN=${4:-32}
BIN=${OSPREY_BUILD:-build}/bin/osprey
DTYPES="f16 fp8 nvfp4"
echo "commit $(git rev-parse --short HEAD), $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($(nproc) cores), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: $0 $MODEL $DEPTH $ROUNDS $GEN"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for r in $(seq "$ROUNDS"); do
  for d in $DTYPES; do
    tps=$("$BIN" bench -m "$MODEL" -p 0 -n "$GEN" -d "$DEPTH" -r 1 -t "$(nproc)" --kv-cache-dtype "$d" 2>/dev/null |
          awk '/^tg/ {print $2}')
    echo "$d $tps" >>"$tmp"
    echo "round $r $d: $tps tok/s" >&2
  done
done
echo "| KV dtype | median tok/s (tg$GEN@d$DEPTH, $ROUNDS interleaved runs) | vs f16 |"
echo "|---|---|---|"
f16=$(awk '$1 == "f16" {print $2}' "$tmp" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
for d in $DTYPES; do
  med=$(awk -v d="$d" '$1 == d {print $2}' "$tmp" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
  echo "| $d | $med | $(awk -v a="$med" -v b="$f16" 'BEGIN {printf "%.2f", a / b}') |"
done
