#!/usr/bin/env python3
"""Makes tests/golden/fixtures/gemma3_hf_greedy.txt: HF transformers' greedy continuations of the
prompts of gemma3_greedy.txt (llama.cpp's fixture, same token ids) on the real Gemma 3 270M Q4_K_M
GGUF, read by tests/golden/test_llamacpp_greedy.c.

transformers loads the GGUF itself (its gguf integration dequantizes every tensor to fp32), so this is
the same quantized model run by an implementation nobody here wrote, in fp32 with eager attention:
the exact reference for osprey's exact path. For every step it records the chosen id and the top-2
margin (logit of the best minus the second best), which tells the test where a greedy pick is a
near-tie that an approximate implementation (llama.cpp's 8-bit activations, osprey's fast path) may
legitimately flip.

Needs torch, transformers, accelerate and gguf (PyPI; CPU is enough, ~1 minute):
  python3 tests/golden/make_gemma3_hf_fixture.py models/gemma-3-270m-q4_k_m.gguf
Record format, one per line:
  prompt <k> <n_ids> <n_predict>
  hf <ids of the continuation, stopping at end-of-generation>
  margin <top-2 margin of each step, 4 decimals>
"""
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

N = 32
EOG = (1, 106)  # <eos>, <end_of_turn>


def main():
    path = sys.argv[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    fx = os.path.join(root, "tests/golden/fixtures")
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path),
                                             dtype=torch.float32, attn_implementation="eager")
    m.eval()
    prompts = [list(map(int, l.split()[1:])) for l in open(os.path.join(fx, "gemma3_greedy.txt")) if l.startswith("ids ")]
    out = ["# Gemma 3 270M Q4_K_M, HF transformers %s (GGUF dequantized to fp32, eager attention, CPU) greedy; "
           "tests/golden/make_gemma3_hf_fixture.py" % transformers.__version__]
    for k, ids in enumerate(prompts):
        cur, margins = list(ids), []
        with torch.no_grad():
            for _ in range(N):
                lg = m(torch.tensor([cur])).logits[0, -1]
                v, i = lg.topk(2)
                margins.append((v[0] - v[1]).item())
                t = i[0].item()
                if t in EOG:
                    break
                cur.append(t)
        out.append("prompt %d %d %d" % (k, len(ids), N))
        out.append("hf " + " ".join(map(str, cur[len(ids):])))
        out.append("margin " + " ".join("%.4f" % x for x in margins))
    with open(os.path.join(fx, "gemma3_hf_greedy.txt"), "w") as f:
        f.write("\n".join(out) + "\n")
    print("wrote", os.path.join(fx, "gemma3_hf_greedy.txt"))


if __name__ == "__main__":
    main()
