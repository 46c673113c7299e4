"""PyTorch's sort-based sampler on the logits sample_bench wrote (issue 17's sampling row peer).

The filter is the common sort-based one (vLLM's PyTorch fallback spells it the same way): sort each
row's logits, mask below the k-th largest (top-k), softmax, mask where the ascending cumulative mass
is <= 1 - top_p (top-p, keeping the largest), min-p against the row's maximum probability, then
torch.multinomial on the renormalized probabilities. Greedy is argmax. Timed like sample_bench: 5
warm-up calls, then CUDA events around `reps` back-to-back calls; the device's time per call.
One JSON line per (setting, batch): {"sampler": "torch-sort", ...}.
Usage: python3 sample_torch.py [vocab reps]   (LOGITS_FILE as sample_bench)
"""
import json
import os
import sys

import numpy as np
import torch

SETTINGS = [  # name, temperature, top_p, min_p, top_k: the same as sample_bench.c
    ("top_k=50 top_p=0.9", 1.0, 0.9, 0.0, 50),
    ("greedy", 0.0, 1.0, 0.0, 0),
    ("T=1 (plain)", 1.0, 1.0, 0.0, 0),
    ("top_k=40 top_p=0.95 min_p=0.05 (llama.cpp defaults)", 0.8, 0.95, 0.05, 40),
    ("top_p=0.9", 1.0, 0.9, 0.0, 0),
    ("top_k=50", 1.0, 1.0, 0.0, 50),
]
BATCHES = [1, 8, 32, 128, 256]


def sample(logits, t, top_p, min_p, top_k, gen):
    if t == 0.0:
        return logits.argmax(dim=-1)
    x = logits / t
    if top_k > 0 or top_p < 1.0:
        xs, idx = x.sort(dim=-1, descending=False)
        if top_k > 0:
            kth = xs[:, -top_k].unsqueeze(1)
            xs = xs.masked_fill(xs < kth, float("-inf"))
        if top_p < 1.0:
            ps = xs.softmax(dim=-1)
            cum = ps.cumsum(dim=-1)
            drop = cum <= 1.0 - top_p
            drop[:, -1] = False
            xs = xs.masked_fill(drop, float("-inf"))
        x = torch.empty_like(xs).scatter_(-1, idx, xs)
    p = x.softmax(dim=-1)
    if min_p > 0.0:
        p = p.masked_fill(p < min_p * p.max(dim=-1, keepdim=True).values, 0.0)
    return torch.multinomial(p, 1, generator=gen).squeeze(1)


def main():
    vocab = int(sys.argv[1]) if len(sys.argv) > 1 else 128256
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    path = os.environ.get("LOGITS_FILE", "/tmp/sample_logits.bin")
    host = np.fromfile(path, dtype=np.float32)
    rows = host.size // vocab
    assert rows >= max(BATCHES) and host.size == rows * vocab, "logits file does not match the vocab"
    logits = torch.from_numpy(host.reshape(rows, vocab)).cuda()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    only = os.environ.get("SAMPLE_SETTINGS")  # as sample_bench: indices into SETTINGS
    only = {int(i) for i in only.split(",")} if only else None
    for si, (name, t, top_p, min_p, top_k) in enumerate(SETTINGS):
        if only is not None and si not in only:
            continue
        for b in BATCHES:
            x = logits[:b].contiguous()
            for _ in range(5):
                sample(x, t, top_p, min_p, top_k, gen)
            torch.cuda.synchronize()
            e0.record()
            for _ in range(reps):
                tok = sample(x, t, top_p, min_p, top_k, gen)
            e1.record()
            torch.cuda.synchronize()
            us = 1000.0 * e0.elapsed_time(e1) / reps
            print(json.dumps({"sampler": "torch-sort", "setting": name, "batch": b, "vocab": vocab,
                              "us": round(us, 2), "token0": int(tok[0])}), flush=True)


if __name__ == "__main__":
    main()
