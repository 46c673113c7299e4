#!/usr/bin/env bash
# Issue 17's sampling row in one device call: osprey's GPU sampler (bench/gpu/sample_bench.c) beside
# PyTorch's sort-based sampler (bench/gpu/sample_torch.py) on the same logits, and, when BASE_BENCH
# names a sample_bench built from an older tree, that sampler too (the before/after of a change).
# Prints one table: setting, batch, microseconds a call for each (osprey twice: programmatic dependent
# launch off, as sample_bench runs by default, and on; and "shapes": select+finish fused for small
# grids, 1,024-CTA grids for large ones), and torch / osprey.
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
# the launch shapes before they became the default (sample.cu: OSPREY_SAMPLE_FUSED, OSPREY_SAMPLE_GRID_CTAS)
OSPREY_SAMPLE_FUSED=0 OSPREY_SAMPLE_GRID_CTAS=0 "$G/bin/sample_bench" "$vocab" "$reps" |
    sed 's/"sampler": "osprey"/"sampler": "osprey-shapes"/' > "$dir/shapes.jsonl" || echo "sample_bench (shapes) failed"
if [ -n "${BASE_BENCH:-}" ]; then
    "$BASE_BENCH" "$vocab" "$reps" | sed 's/"sampler": "osprey"/"sampler": "osprey-base"/' > "$dir/base.jsonl" ||
        echo "base sample_bench failed"
fi
python3 bench/gpu/sample_torch.py "$vocab" "$reps" > "$dir/torch.jsonl" || echo "sample_torch.py failed"
python3 - "$dir" <<'EOF'
import json, sys, os
d = sys.argv[1]
rows = {}
for f in ("osprey.jsonl", "pdl.jsonl", "shapes.jsonl", "base.jsonl", "torch.jsonl"):
    p = os.path.join(d, f)
    if not os.path.exists(p):
        continue
    for line in open(p):
        r = json.loads(line)
        rows.setdefault((r["setting"], r["batch"]), {})[r["sampler"]] = r["us"]
cols = ["osprey", "osprey-pdl", "osprey-shapes", "osprey-base", "torch-sort"]
print(f"{'setting':<55} {'B':>4} " + " ".join(f"{c + ' us':>15}" for c in cols) + f" {'torch/osprey':>13}")
for (s, b), v in rows.items():
    cells = " ".join(f"{v[c]:>15.1f}" if c in v else f"{'-':>15}" for c in cols)
    ratio = f"{v['torch-sort'] / v['osprey']:>12.1f}x" if "torch-sort" in v and "osprey" in v else f"{'-':>13}"
    print(f"{s:<55} {b:>4} {cells} {ratio}")
EOF
