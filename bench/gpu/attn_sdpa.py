"""PyTorch's scaled_dot_product_attention on the shapes of bench/gpu/attn_bench.c (the peer of
issue 12's kernel rows): decode (B sequences, one query token each, dense K/V of ctx tokens) and
causal prefill (one sequence of n tokens), 32 query heads, 8 KV heads (GQA through enable_gqa, or
K/V repeated per query head where this torch lacks it), head_dim 128, bf16, random inputs. Timed
with CUDA events around back-to-back calls after a warm-up, the median of 5 samples of ~20 ms.
Prints one JSON object per row, the same fields as attn_bench ("kernel": "sdpa")."""
import json
import sys

import torch
import torch.nn.functional as F

H, HKV, D = 32, 8, 128


def sdpa(q, k, v, causal):
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:  # torch < 2.5
        g = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=causal)


def time_us(fn):
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    e1.synchronize()
    iters = max(1, min(2000, int(20.0 / max(e0.elapsed_time(e1), 1e-3))))
    samples = []
    for _ in range(5):
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        e1.synchronize()
        samples.append(e0.elapsed_time(e1) / iters)
    samples.sort()
    return samples[2] * 1e3


def row(kind, B, ctx):
    g = torch.Generator(device="cuda").manual_seed(1234)
    dt = torch.bfloat16
    nq = ctx if kind == "prefill" else 1
    q = torch.rand(B, H, nq, D, device="cuda", dtype=dt, generator=g) * 4 - 2
    k = torch.rand(B, HKV, ctx, D, device="cuda", dtype=dt, generator=g) * 2 - 1
    v = torch.rand(B, HKV, ctx, D, device="cuda", dtype=dt, generator=g) * 2 - 1
    us = time_us(lambda: sdpa(q, k, v, kind == "prefill"))
    kv_bytes = B * ctx * HKV * D * 2 * 2
    flops = 4 * ctx * ctx / 2 * D * H if kind == "prefill" else 4 * B * ctx * D * H
    print(json.dumps({"kind": kind, "B": B, "ctx": ctx, "kernel": "sdpa", "us": round(us, 2),
                      "gbps": round(kv_bytes / (us * 1e3), 1), "tflops": round(flops / (us * 1e6), 2)}), flush=True)
    del q, k, v
    torch.cuda.empty_cache()


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("decode", "all"):
        for B in (1, 2, 8, 64):
            for ctx in (1024, 8192, 32768, 131072):
                if ctx == 131072 and B > 8:
                    continue
                row("decode", B, ctx)
    if what in ("prefill", "all"):
        for n in (4096, 8192, 16384, 32768):
            row("prefill", 1, n)


if __name__ == "__main__":
    main()
