#!/usr/bin/env bash
# The tensor-core kernel's launch shapes side by side (ATTN_KERNEL=v2, the default, or v1; bench/gpu/attn_bench.c under ATTN_FOLD_STAGES, ATTN_SPLIT_STAGES,
# ATTN_SPLIT_WAVES, ATTN_CHUNKS_PER_CTA; none changes a result bit, test_gpu_attention asserts it):
# one line per row, one column per shape. Usage: tune.sh [decode|prefill|all] "NAME:VAR=V,VAR=V" ...
# e.g. tune.sh decode "base:" "s3:ATTN_SPLIT_STAGES=3" "w2:ATTN_SPLIT_WAVES=2". Run after
# scripts/gpu-test.sh unpacked the binaries into /tmp/osprey-gpu/gpu (same warm machine).
set -uo pipefail
G=/tmp/osprey-gpu/gpu
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
what=$1
shift
K=${ATTN_KERNEL:-v2} # the kernel whose launch shapes are compared (v2 or v1)
dir=$(mktemp -d)
names=()
for spec in "$@"; do
    name=${spec%%:*} vars=${spec#*:}
    names+=("$name")
    env ATTN_KERNEL=$K $(echo "$vars" | tr ',' ' ') timeout 120 $G/bin/attn_bench "$what" | grep "\"kernel\": \"$K\"" > "$dir/$name.jsonl" || echo "tune: $name failed"
done
python3 - "$dir" "${names[@]}" <<'PY'
import json, sys, os
d, names = sys.argv[1], sys.argv[2:]
rows = {}
for n in names:
    for l in open(os.path.join(d, n + ".jsonl")):
        r = json.loads(l)
        rows.setdefault((r["kind"], r["B"], r["ctx"]), {})[n] = r
print(f"{'kind':8} {'B':>3} {'ctx':>7} | " + " ".join(f"{n:>16}" for n in names) + "   (us; GB/s or TF/s)")
for (k, B, c), v in sorted(rows.items()):
    f = "gbps" if k == "decode" else "tflops"
    cells = [f"{v[n]['us']:8.1f} {v[n][f]:7.1f}" if n in v else f"{'-':>16}" for n in names]
    print(f"{k:8} {B:3d} {c:7d} | " + " ".join(cells))
PY
rm -rf "$dir"
