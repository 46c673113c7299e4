#!/usr/bin/env bash
# Issue 12's kernel rows in one device call: osprey's paged attention (bench/gpu/attn_bench.c: v3
# (warp-specialized, prefill at D 128) with and without ping-pong, v2 (wgmma) auto, v2 forced to fold
# mode, v1 (mma.sync), v0) and PyTorch's SDPA on the same shapes
# (bench/gpu/attn_sdpa.py), then one table: time, K/V bytes/s (decode) or causal TFLOP/s (prefill), and
# v2 / SDPA (goals:
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
ks = ["v4", "v3", "v3-np", "v2", "v2-fold", "v1", "v0", "sdpa"]
print(f"{'kind':8} {'B':>3} {'ctx':>7} | " + " ".join(f"{n + ' us':>9}" for n in ks) +
      f" | {'best':>8} {'sdpa':>8} {'unit':>6} | {'best/sdpa':>9} {'v3/v2':>6} {'v2/sdpa':>7} {'v2/v1':>6} {'v4/v2':>6}")
for (kind, B, ctx), k in sorted(by.items()):
    unit = "GB/s" if kind == "decode" else "TF/s"
    f = "gbps" if kind == "decode" else "tflops"
    v4, v3, v2, v1, s = k.get("v4"), k.get("v3"), k.get("v2"), k.get("v1"), k.get("sdpa")
    best = v3 or v2  # the default kernel of the shape: v3 where it runs (prefill, D 128), else v2
    def us(n): return f"{k[n]['us']:9.1f}" if n in k else f"{'-':>9}"
    def ratio(a, b, w): return f"{b['us'] / a['us']:{w}.2f}" if a and b else f"{'-':>{w}}"
    print(f"{kind:8} {B:3d} {ctx:7d} | " + " ".join(us(n) for n in ks) +
          f" | {best[f] if best else 0:8.1f} {s[f] if s else 0:8.1f} {unit:>6} | {ratio(best, s, 9)} {ratio(v3, v2, 6)} "
          f"{ratio(v2, s, 7)} {ratio(v2, v1, 6)} {ratio(v4, v2, 6)}")
PY
