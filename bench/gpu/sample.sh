#!/usr/bin/env bash
# Issue 17's sampling row in one device call: osprey's GPU sampler (bench/gpu/sample_bench.c) beside
# PyTorch's sort-based sampler (bench/gpu/sample_torch.py) on the same logits, and, when BASE_BENCH
# names a sample_bench built from an older tree, that sampler too (the before/after of a change).
# Prints one table: setting, batch, microseconds a call for each, and torch / osprey. osprey runs as
# sample_bench does by default (programmatic dependent launch off), then with PDL on, then with the
# sampler's other shapes one at a time (sample.cu; the same tokens by design up to rounding): "old" the
# defaults before 2026-12-06 (two launches for small grids, 8-bit list levels, plain atomics in top-k's
# histograms: OSPREY_SAMPLE_ONE_LAUNCH=0 OSPREY_SAMPLE_LIST_BITS=8 OSPREY_SAMPLE_HIST_AGG=0), "noagg" plain
# atomics alone (OSPREY_SAMPLE_HIST_AGG=0), "warpU" the finisher's rejection rounds on one warp for
# U <= 3,072 (OSPREY_SAMPLE_WARP_VIEW=3072), "pre" each next slice preloaded in CTAs of several
# (OSPREY_SAMPLE_PRELOAD=1), "1pass" the lists built by the scan (OSPREY_SAMPLE_ONE_PASS=1), "1pass+pre"
# the two, "tau" top-k + top-p rows' lists cut at one row-wide threshold in the scan at every batch size
# (OSPREY_SAMPLE_TAU=1; the default takes it from 64 rows on), "notau" never (OSPREY_SAMPLE_TAU=0),
# "tau-warp" the same with their small views on warp 0 (OSPREY_SAMPLE_WARP_VIEW=512), "tau+pre" with preload,
# "tau-cta" with tau found by every scan CTA instead of once a row before the scan (OSPREY_SAMPLE_TAU_PRE=0).
# SAMPLE_SETTINGS=i,... (sample_bench.c's indices) times only those settings.
#   usage: bash bench/gpu/sample.sh [vocab reps]     (G: the unpacked binaries, default /tmp/osprey-gpu/gpu)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
G=${G:-/tmp/osprey-gpu/gpu}
vocab=${1:-128256}
reps=${2:-200}
dir=/tmp/sample-bench # outside $OUT: a device call brings back a few files only
mkdir -p "$dir"
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
"$G/bin/sample_bench" "$vocab" "$reps" > "$dir/osprey.jsonl" || { echo "sample_bench failed"; exit 1; }
# with programmatic dependent launch forced on (the CUDA backend turns it on when its matrices are quantized)
OSPREY_CUDA_PDL=1 "$G/bin/sample_bench" "$vocab" "$reps" | sed 's/"sampler": "osprey"/"sampler": "osprey-pdl"/' > "$dir/pdl.jsonl" ||
    echo "sample_bench (PDL) failed"
# the other shapes, one at a time
variant() { # name, then the environment
    local name=$1; shift
    env "$@" "$G/bin/sample_bench" "$vocab" "$reps" | sed "s/\"sampler\": \"osprey\"/\"sampler\": \"osprey-$name\"/" \
        > "$dir/$name.jsonl" || echo "sample_bench ($name) failed"
}
variant old OSPREY_SAMPLE_ONE_LAUNCH=0 OSPREY_SAMPLE_LIST_BITS=8 OSPREY_SAMPLE_HIST_AGG=0
variant noagg OSPREY_SAMPLE_HIST_AGG=0
variant warpU OSPREY_SAMPLE_WARP_VIEW=3072
variant pre OSPREY_SAMPLE_PRELOAD=1
variant 1pass OSPREY_SAMPLE_ONE_PASS=1
variant 1pass+pre OSPREY_SAMPLE_ONE_PASS=1 OSPREY_SAMPLE_PRELOAD=1
variant tau OSPREY_SAMPLE_TAU=1
variant notau OSPREY_SAMPLE_TAU=0
variant tau-warp OSPREY_SAMPLE_TAU=1 OSPREY_SAMPLE_WARP_VIEW=512
variant tau+pre OSPREY_SAMPLE_TAU=1 OSPREY_SAMPLE_PRELOAD=1
variant tau-cta OSPREY_SAMPLE_TAU=1 OSPREY_SAMPLE_TAU_PRE=0
if [ -n "${BASE_BENCH:-}" ]; then
    "$BASE_BENCH" "$vocab" "$reps" | sed 's/"sampler": "osprey"/"sampler": "osprey-base"/' > "$dir/base.jsonl" ||
        echo "base sample_bench failed"
fi
python3 bench/gpu/sample_torch.py "$vocab" "$reps" > "$dir/torch.jsonl" || echo "sample_torch.py failed"
python3 - "$dir" <<'EOF'
import json, sys, os
d = sys.argv[1]
rows = {}
for f in ("osprey.jsonl", "pdl.jsonl", "old.jsonl", "noagg.jsonl", "warpU.jsonl", "pre.jsonl", "1pass.jsonl", "1pass+pre.jsonl",
          "tau.jsonl", "notau.jsonl", "tau-warp.jsonl", "tau+pre.jsonl", "tau-cta.jsonl", "base.jsonl", "torch.jsonl"):
    p = os.path.join(d, f)
    if not os.path.exists(p):
        continue
    for line in open(p):
        r = json.loads(line)
        rows.setdefault((r["setting"], r["batch"]), {})[r["sampler"]] = r["us"]
cols = ["osprey", "osprey-pdl", "osprey-old", "osprey-noagg", "osprey-warpU", "osprey-pre", "osprey-1pass", "osprey-1pass+pre",
        "osprey-tau", "osprey-notau", "osprey-tau-warp", "osprey-tau+pre", "osprey-tau-cta", "osprey-base", "torch-sort"]
cols = [c for c in cols if any(c in v for v in rows.values())]
print(f"{'setting':<24} {'B':>4} " + " ".join(f"{c.replace('osprey-', '') + ' us':>11}" for c in cols) + f" {'torch/osprey':>13}")
for (s, b), v in rows.items():
    cells = " ".join(f"{v[c]:>11.1f}" if c in v else f"{'-':>11}" for c in cols)
    ratio = f"{v['torch-sort'] / v['osprey']:>12.1f}x" if "torch-sort" in v and "osprey" in v else f"{'-':>13}"
    print(f"{s[:24]:<24} {b:>4} {cells} {ratio}")
EOF
