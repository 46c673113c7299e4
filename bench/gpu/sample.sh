#!/usr/bin/env bash
# Issue 17's sampling row in one device call: osprey's GPU sampler (bench/gpu/sample_bench.c) beside
# PyTorch's sort-based sampler (bench/gpu/sample_torch.py) on the same logits, and, when BASE_BENCH
# names a sample_bench built from an older tree, that sampler too (the before/after of a change).
# Prints one table: setting, batch, microseconds a call for each, and torch / osprey. osprey runs as
# sample_bench does by default (programmatic dependent launch off), then with PDL on, then with the
# 2026-12-06 changes off (sample.cu): "2-launch" keeps the scan its own launch for small grids
# (OSPREY_SAMPLE_ONE_LAUNCH=0), "block-U" runs the finisher's rejection rounds on the whole block
# (OSPREY_SAMPLE_WARP_VIEW=0), "prev" both (the launch shapes and finisher before that day).
#   usage: bash bench/gpu/sample.sh [vocab reps]     (G: the unpacked binaries, default /tmp/osprey-gpu/gpu)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
G=${G:-/tmp/osprey-gpu/gpu}
vocab=${1:-128256}
reps=${2:-200}
dir=${OUT:-/tmp}/sample-bench
mkdir -p "$dir"
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
"$G/bin/sample_bench" "$vocab" "$reps" > "$dir/osprey.jsonl" || { echo "sample_bench failed"; exit 1; }
# with programmatic dependent launch forced on (the CUDA backend turns it on when its matrices are quantized)
OSPREY_CUDA_PDL=1 "$G/bin/sample_bench" "$vocab" "$reps" | sed 's/"sampler": "osprey"/"sampler": "osprey-pdl"/' > "$dir/pdl.jsonl" ||
    echo "sample_bench (PDL) failed"
# the day's two changes off, one at a time and together (the same tokens by design up to rounding)
OSPREY_SAMPLE_ONE_LAUNCH=0 "$G/bin/sample_bench" "$vocab" "$reps" |
    sed 's/"sampler": "osprey"/"sampler": "osprey-2launch"/' > "$dir/2launch.jsonl" || echo "sample_bench (2-launch) failed"
OSPREY_SAMPLE_WARP_VIEW=0 "$G/bin/sample_bench" "$vocab" "$reps" |
    sed 's/"sampler": "osprey"/"sampler": "osprey-blockU"/' > "$dir/blocku.jsonl" || echo "sample_bench (block-U) failed"
OSPREY_SAMPLE_ONE_LAUNCH=0 OSPREY_SAMPLE_WARP_VIEW=0 "$G/bin/sample_bench" "$vocab" "$reps" |
    sed 's/"sampler": "osprey"/"sampler": "osprey-prev"/' > "$dir/prev.jsonl" || echo "sample_bench (prev) failed"
if [ -n "${BASE_BENCH:-}" ]; then
    "$BASE_BENCH" "$vocab" "$reps" | sed 's/"sampler": "osprey"/"sampler": "osprey-base"/' > "$dir/base.jsonl" ||
        echo "base sample_bench failed"
fi
python3 bench/gpu/sample_torch.py "$vocab" "$reps" > "$dir/torch.jsonl" || echo "sample_torch.py failed"
python3 - "$dir" <<'EOF'
import json, sys, os
d = sys.argv[1]
rows = {}
for f in ("osprey.jsonl", "pdl.jsonl", "2launch.jsonl", "blocku.jsonl", "prev.jsonl", "base.jsonl", "torch.jsonl"):
    p = os.path.join(d, f)
    if not os.path.exists(p):
        continue
    for line in open(p):
        r = json.loads(line)
        rows.setdefault((r["setting"], r["batch"]), {})[r["sampler"]] = r["us"]
cols = ["osprey", "osprey-pdl", "osprey-2launch", "osprey-blockU", "osprey-prev", "osprey-base", "torch-sort"]
print(f"{'setting':<55} {'B':>4} " + " ".join(f"{c + ' us':>15}" for c in cols) + f" {'torch/osprey':>13}")
for (s, b), v in rows.items():
    cells = " ".join(f"{v[c]:>15.1f}" if c in v else f"{'-':>15}" for c in cols)
    ratio = f"{v['torch-sort'] / v['osprey']:>12.1f}x" if "torch-sort" in v and "osprey" in v else f"{'-':>13}"
    print(f"{s:<55} {b:>4} {cells} {ratio}")
EOF
