#!/usr/bin/env python3
"""Makes the logits golden fixture for SmolLM2-135M-Instruct (Q4_1) with HF transformers.

Reference: transformers loads the same GGUF (gguf_file=...), dequantizes it with the `gguf` package
and runs the model in fp32 on the CPU (no TF32, no reduced precision anywhere). osprey's fp32 forward
over the same dequantized weights must reproduce it within the tolerance derived in
tests/golden/test_logits.c.

Two steps, because the prompts are tokenized by llama.cpp (the tokenizer reference) and transformers
runs where torch is installed (the lent GPU machine has it; this machine does not):

  1. prepare (needs LLAMA_CPP_BIN, a llama.cpp build made outside the repo):
       LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin python3 tests/golden/make_logits_fixtures.py \
           prepare models/SmolLM2-135M-Instruct.Q4_1.gguf
     writes tests/golden/fixtures/logits_prompts.json (prompt texts and their token ids).
  2. run (needs torch, transformers, gguf):
       python3 tests/golden/make_logits_fixtures.py run MODEL.gguf OUT.txt
     For each prompt: 64 greedy tokens (argmax, EOS ignored) with transformers' KV cache, then one
     teacher-forced pass over prompt + continuation; for every position it writes the log-sum-exp, the
     top-2 margin and the top 20 (id, logit) pairs.

Fixture format (text, one record per line, parsed by tests/golden/test_logits.c):
  prompt <k> <n_prompt> <n_total>
  ids <n_total ids: prompt then greedy continuation>
  pos <p> <lse> <id>:<logit> ... (20 pairs, descending)
"""
import json
import os
import subprocess
import sys

PROMPTS = [
    "The three primary colors are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea, there lived",
    "Les montagnes les plus hautes du monde sont",
    "1, 2, 3, 5, 8, 13, 21,",
]
N_GEN = 64
TOP = 20
HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS_JSON = os.path.join(HERE, "fixtures", "logits_prompts.json")


def prepare(model):
    bindir = os.environ.get("LLAMA_CPP_BIN")
    if not bindir:
        sys.exit("set LLAMA_CPP_BIN to a llama.cpp build's bin directory (built outside the repo)")
    out = []
    for p in PROMPTS:
        r = subprocess.run([os.path.join(bindir, "llama-tokenize"), "-m", model, "-p", p, "--ids",
                            "--log-disable"], capture_output=True, text=True, check=True)
        ids = json.loads(r.stdout.strip().splitlines()[-1])
        out.append({"text": p, "ids": ids})
    os.makedirs(os.path.dirname(PROMPTS_JSON), exist_ok=True)
    with open(PROMPTS_JSON, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    print(f"wrote {PROMPTS_JSON}: {len(out)} prompts")


def run(model, out_path):
    import torch
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    d, f = os.path.split(os.path.abspath(model))
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
    m.eval()
    emb = m.get_input_embeddings().weight
    head = m.get_output_embeddings().weight
    assert torch.equal(emb, head), "lm_head must be tied to token_embd for this GGUF (no output.weight)"
    prompts = json.load(open(PROMPTS_JSON))
    lines = []
    with torch.no_grad():
        for k, p in enumerate(prompts):
            ids = list(p["ids"])
            n_prompt = len(ids)
            out = m(torch.tensor([ids]), use_cache=True)
            past = out.past_key_values
            for _ in range(N_GEN):
                nxt = int(out.logits[0, -1].argmax())
                ids.append(nxt)
                out = m(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
            logits = m(torch.tensor([ids])).logits[0].double()
            lines.append(f"prompt {k} {n_prompt} {len(ids)}")
            lines.append("ids " + " ".join(str(i) for i in ids))
            lse = torch.logsumexp(logits, dim=-1)
            vals, idx = logits.topk(TOP, dim=-1)
            for pos in range(len(ids)):
                pairs = " ".join(f"{int(i)}:{float(v):.6f}" for i, v in zip(idx[pos], vals[pos]))
                lines.append(f"pos {pos} {float(lse[pos]):.6f} {pairs}")
            print(f"prompt {k}: {n_prompt} prompt tokens, continuation {ids[n_prompt:n_prompt + 12]}...")
    with open(out_path, "w") as f:
        f.write("# SmolLM2-135M-Instruct.Q4_1.gguf, HF transformers fp32 CPU; tests/golden/make_logits_fixtures.py\n")
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
