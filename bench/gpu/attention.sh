#!/usr/bin/env bash
# Issue 12's kernel rows in one device call: osprey's paged attention (bench/gpu/attn_bench.c: v1
# auto, v1 forced to fold mode, v0) and PyTorch's SDPA on the same shapes (bench/gpu/attn_sdpa.py),
# then one table: time, K/V bytes/s (decode) or causal TFLOP/s (prefill), and v1 / SDPA (goals:
# decode >= 0.9x SDPA's bytes/s, prefill 16k >= 0.85x SDPA). Run after scripts/gpu-test.sh unpacked
# the binaries into /tmp/osprey-gpu/gpu (same warm machine). Full JSON rows under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
G=/tmp/osprey-gpu/gpu
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
what=${1:-all}
dir=${OUT:-/tmp}
$G/bin/attn_bench "$what" > "$dir/attn_osprey.jsonl" || { echo "attn_bench failed"; exit 1; }
python3 bench/gpu/attn_sdpa.py "$what" > "$dir/attn_sdpa.jsonl" || { echo "attn_sdpa.py failed"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | sed 's/^/gpu: /'
python3 - "$dir/attn_osprey.jsonl" "$dir/attn_sdpa.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.strip()]
by = {}
for r in rows:
    by.setdefault((r["kind"], r["B"], r["ctx"]), {})[r["kernel"]] = r
print(f"{'kind':8} {'B':>3} {'ctx':>7} | {'v1 us':>9} {'fold us':>9} {'v0 us':>9} {'sdpa us':>9} | "
      f"{'v1':>8} {'sdpa':>8} {'unit':>6} | {'v1/sdpa':>7} {'v1/v0':>6}")
for (kind, B, ctx), k in sorted(by.items()):
    unit = "GB/s" if kind == "decode" else "TF/s"
    f = "gbps" if kind == "decode" else "tflops"
    v1, s = k.get("v1"), k.get("sdpa")
    def us(n): return f"{k[n]['us']:9.1f}" if n in k else f"{'-':>9}"
    ratio = f"{s['us'] / v1['us']:7.2f}" if v1 and s else f"{'-':>7}"
    r0 = f"{k['v0']['us'] / v1['us']:6.2f}" if v1 and "v0" in k else f"{'-':>6}"
    print(f"{kind:8} {B:3d} {ctx:7d} | {us('v1')} {us('v1-fold')} {us('v0')} {us('sdpa')} | "
          f"{v1[f] if v1 else 0:8.1f} {s[f] if s else 0:8.1f} {unit:>6} | {ratio} {r0}")
PY
