#!/usr/bin/env bash
# Issue 12's end-to-end rows in one device call: Llama-3.1-8B shapes with bf16 random weights drawn on
# the GPU (`osprey bench --random-weights llama-3.1-8b --device cuda`: no file), f16 KV, block size 16.
# Prefill at 8k / 16k / 32k (pp: one prefill, timed from an idle device to the first sampled token),
# decode at batch 2 at depth 8k and 32k, batch 64 at depth 4k, batch 1 at depth 32k and 128k (every
# timed region starts and ends with the device idle). Beside each row: llama.cpp CUDA's figure on this
# machine type from the issue (osprey bb1ad02's session, same random-weight 8B shape; none for the
# batch-1 depth rows) and, for decode, the byte floor: (weights read per step + the KV read) / the
# copy bandwidth PyTorch measures here in the same call. Run after scripts/gpu-test.sh unpacked the
# binaries into /tmp/osprey-gpu/gpu (same warm machine). ROWS="pp8k b2d8k ..." picks rows.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
G=/tmp/osprey-gpu/gpu
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
O=$G/bin/osprey
[ -x "$O" ] || { echo "bench/gpu/e2e.sh: no $O: run scripts/gpu-test.sh first (on this warm machine)"; exit 1; }
ROWS=${ROWS:-"pp8k pp16k pp32k b2d8k b2d32k b64d4k b1d128k"} # the b2 and b64 rows add batch 1 at their depth
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | sed 's/^/gpu: /'
# the machine's copy bandwidth (device to device, 4 GiB, read + write counted)
BW=$(python3 -c '
import torch
a = torch.empty(1 << 31, dtype=torch.float16, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize(); s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): b.copy_(a)
e.record(); torch.cuda.synchronize()
print(f"{2 * a.numel() * 2 * 10 / (s.elapsed_time(e) * 1e-3) / 1e9:.0f}")' 2>/dev/null)
echo "copy bandwidth: ${BW:-?} GB/s"
W=15.01 # GB a decode step reads: the weights less the embedding table (8.03e9 - 0.525e9 params, bf16)
KVT=131072 # KV bytes a token holds: 32 layers x 8 kv heads x 128 x (K + V) x 2 bytes
B="$O bench --random-weights llama-3.1-8b --device cuda"
out=()
row() { # name, llama.cpp figure or -, batch, depth (0: prefill row), bench args...
    local name=$1 ref=$2 b=$3 d=$4
    shift 4
    local res
    res=$($B "$@" 2>&1)
    echo "$res" | sed "s/^/  [$name] /" | grep -v '^  \[.*\] #' >&2
    local v
    if [ "$d" = 0 ]; then v=$(echo "$res" | awk '$1 ~ /^pp[0-9]+$/ {print $2}')
    elif [ "$b" = 1 ]; then v=$(echo "$res" | awk '$1 ~ /^tg[0-9]+@d[0-9]+$/ {print $2}')
    else v=$(echo "$res" | awk -v t="@b$b@d$d" '$1 ~ /^tg/ && index($1, t) {print $2}'); fi
    local ratio=- floor=- pf=-
    [ "$ref" != - ] && [ -n "$v" ] && ratio=$(awk -v a="$v" -v r="$ref" 'BEGIN { printf "%.2f", a / r }')
    if [ "$d" != 0 ] && [ -n "${BW:-}" ] && [ -n "$v" ]; then
        floor=$(awk -v b="$b" -v d="$d" -v w="$W" -v k="$KVT" -v bw="$BW" 'BEGIN { printf "%.0f", b / ((w * 1e9 + b * d * k) / (bw * 1e9)) }')
        pf=$(awk -v a="$v" -v f="$floor" 'BEGIN { printf "%.2f", a / f }')
    fi
    out+=("$(printf '%-9s %12s %12s %8s %10s %8s' "$name" "${v:-FAILED}" "$ref" "$ratio" "$floor" "$pf")")
    # a batched decode row also ran batch 1 at the same depth (tg<N>@d<D>): its own row
    if [ "$b" != 1 ] && [ "$d" != 0 ]; then
        v=$(echo "$res" | awk '$1 ~ /^tg[0-9]+@d[0-9]+$/ {print $2}')
        [ -n "$v" ] && [ -n "${BW:-}" ] || return 0
        floor=$(awk -v d="$d" -v w="$W" -v k="$KVT" -v bw="$BW" 'BEGIN { printf "%.0f", 1 / ((w * 1e9 + d * k) / (bw * 1e9)) }')
        pf=$(awk -v a="$v" -v f="$floor" 'BEGIN { printf "%.2f", a / f }')
        out+=("$(printf '%-9s %12s %12s %8s %10s %8s' "b1d$((d / 1024))k" "$v" - - "$floor" "$pf")")
    fi
}
for r in $ROWS; do
    case $r in
        pp8k) row pp8k 19497 1 0 -p 8192 -n 0 -r 2 ;;
        pp16k) row pp16k 16715 1 0 -p 16384 -n 0 -r 2 ;;
        pp32k) row pp32k 12642 1 0 -p 32768 -n 0 -r 1 ;;
        b2d8k) row b2d8k 301 2 8192 -p 0 -n 64 --depth 8192 --batch 2 -r 2 ;;
        b2d32k) row b2d32k 234.5 2 32768 -p 0 -n 64 --depth 32768 --batch 2 -r 1 ;;
        b1d32k) row b1d32k - 1 32768 -p 0 -n 64 --depth 32768 -r 1 ;;
        b64d4k) row b64d4k 3131 64 4096 -p 0 -n 32 --depth 4096 --batch 64 -r 1 ;;
        b1d128k) row b1d128k - 1 131072 -p 0 -n 32 --depth 131072 -r 1 ;;
    esac
done
echo "==== 8B end to end, tokens/s (osprey bf16 random weights, f16 KV; llama.cpp: the issue's figures)"
printf '%-9s %12s %12s %8s %10s %8s\n' row osprey llama.cpp ratio floor "/floor"
printf '%s\n' "${out[@]}"
