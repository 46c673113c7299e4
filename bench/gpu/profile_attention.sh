#!/usr/bin/env bash
# ncu on the attention kernels at issue 12's shapes (8B: 32/8 heads, D = 128), one launch each:
# causal prefill of 16k tokens and batch-1 decode at 32k, for v2 (others with KERNELS="v2 v1 v0"; CASES="prefill 1 16384,..." picks the shapes).
# Sections: SpeedOfLight, MemoryWorkloadAnalysis, Occupancy, WarpStateStats, LaunchStats,
# ComputeWorkloadAnalysis. Reports under $OUT (ncu-*.txt). Run after scripts/gpu-test.sh unpacked the
# binaries into /tmp/osprey-gpu/gpu (same warm machine); SASS=1 adds per-instruction counts (end of file). ncu locks the SM clock at its base, so its
# durations run longer than attention.sh's.
set -uo pipefail
G=/tmp/osprey-gpu/gpu
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
dir=${OUT:-/tmp}
secs="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis_Tables"
for k in ${KERNELS:-v2}; do
    IFS=, read -ra cases <<< "${CASES:-prefill 1 16384,decode 1 32768,decode 64 8192}"
    for c in "${cases[@]}"; do
        tag="ncu-$k-$(echo "$c" | tr ' ' '-')"
        # skip the warm-up launch; profile the next one (its attention kernel, not the merge)
        ncu --kernel-name regex:'attn_ws_kernel|attn_mma_kernel|attn_dec_kernel|paged_attention_kernel' --launch-skip 1 --launch-count 1 $secs \
            $G/bin/attn_bench one $c $k > "$dir/$tag.txt" 2>&1
        echo "== $tag"
        grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Stall|Executed Ipc|Shared|Bank" "$dir/$tag.txt" | head -24
    done
done
# SASS=1: also the per-instruction execution counts and stall samples of v2's prefill kernel (ncu's
# SourceCounters section; the source page as CSV, one row per SASS line) into $OUT/ncu-sass-prefill.csv,
# and the 40 most-executed lines, the 30 with the most stall samples, the opcode mix (SASS_KERNEL=v2: v2's).
if [ "${SASS:-0}" = 1 ]; then
    sk=${SASS_KERNEL:-v3}
    ncu --kernel-name regex:'attn_ws_kernel|attn_mma_kernel' --launch-skip 1 --launch-count 1 --section SourceCounters \
        --section WarpStateStats --import-source no -o "$dir/ncu-sass" -f $G/bin/attn_bench one prefill 1 16384 $sk > /dev/null 2>&1
    ncu -i "$dir/ncu-sass.ncu-rep" --page source --csv --print-source sass > "$dir/ncu-sass-prefill.csv" 2>/dev/null
    echo "== SASS lines by warp instructions executed (top 40)"
    python3 - "$dir/ncu-sass-prefill.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1]))]
# the page may start with non-table lines: the header is the first row naming a Source column
while rows and "Source" not in rows[0]:
    rows.pop(0)
if not rows:
    sys.exit("no source page")
hdr = rows[0]
print("columns:", "; ".join(hdr)[:600])
col = next((i for i, h in enumerate(hdr) if h.startswith("Warp Instructions Executed") or h == "Instructions Executed"), None)
stl = next((i for i, h in enumerate(hdr) if h.startswith("Warp Stall Sampling (All")), None)
src = next((i for i, h in enumerate(hdr) if h == "Source"), 1)
if col is None:
    sys.exit("columns: " + ", ".join(hdr))
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
body = [r for r in rows[1:] if len(r) > col]
tot = sum(num(r[col]) for r in body) or 1.0
print(f"total warp instructions {tot:.4g}")
for r in sorted(body, key=lambda r: -num(r[col]))[:40]:
    print(f"{100 * num(r[col]) / tot:5.1f}%  {r[src][:110]}")
if stl is not None:
    st = sum(num(r[stl]) for r in body) or 1.0
    print("== SASS lines by stall samples (top 30)")
    for r in sorted(body, key=lambda r: -num(r[stl]))[:30]:
        print(f"{100 * num(r[stl]) / st:5.1f}%  {r[src][:110]}")
# instruction mix: by opcode (first word of the SASS, predicate stripped)
mix = {}
for r in body:
    t = r[src].split()
    if t and t[0].startswith("@"): t = t[1:]
    if t: mix[t[0].split(".")[0]] = mix.get(t[0].split(".")[0], 0) + num(r[col])
print("== opcodes:", ", ".join(f"{k} {100 * v / tot:.1f}%" for k, v in sorted(mix.items(), key=lambda kv: -kv[1])[:25]))
PY
fi
