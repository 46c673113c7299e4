#!/usr/bin/env bash
# Accuracy of quantized KV pages against f16 KV (issue 13), on the CPU: teacher forcing over the
# first N tokens of a fixed text (default: the GPL-3 text Debian's base-files ships) with f32, fp8 and
# nvfp4 KV, each compared with f16 KV position by position (top-1 agreement, mean KL, max |dlogit|,
# perplexity). Prints a markdown table with the commit, date and CPU, for bench/RESULTS.md.
# usage: bench/kv/kv_accuracy.sh [MODEL] [TEXT] [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
TEXT=${2:-/usr/share/common-licenses/GPL-3}
N=${3:-512}
BIN=${OSPREY_BUILD:-build}/bin/kv_accuracy
[ -x "$BIN" ] || { echo "build $BIN first (cmake --build build --target kv_accuracy)" >&2; exit 1; }
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include bench/kv || echo -dirty), $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($(nproc) cores)"
echo "command: $0 $MODEL $TEXT $N"
nice "$BIN" -m "$MODEL" -f "$TEXT" -n "$N" -t "$(nproc)"
