#!/usr/bin/env python3
"""Saves the tokenizer transformers builds from a GGUF's tokenizer.ggml.* metadata (through the `gguf`
package) as a transformers tokenizer directory: the tokenizer both lm-eval backends use in run.sh
(`hf` with the GGUF itself, `local-completions` with tokenizer_backend huggingface), so both score the
same token ids. Nothing here is osprey's code. Usage: save_tokenizer.py MODEL.gguf OUT_DIR
"""
import os
import sys

from transformers import AutoTokenizer


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: save_tokenizer.py MODEL.gguf OUT_DIR")
    gguf, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    tok.save_pretrained(out)
    text = "The capital city of France is Paris"
    print(f"save_tokenizer: {os.path.basename(gguf)} -> {out} (vocab {len(tok)}, bos {tok.bos_token!r}, "
          f"eos {tok.eos_token!r}, {text!r} -> {tok(text)['input_ids']})")


if __name__ == "__main__":
    main()
