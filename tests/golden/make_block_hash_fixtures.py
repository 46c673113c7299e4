#!/usr/bin/env python3
"""Writes tests/golden/fixtures/block_hash_sha256_cbor.txt: vLLM's sha256_cbor prefix-caching block
hashes computed in Python with hashlib and cbor2 (canonical=True, as vllm/utils/hashing.py calls it),
for tests/golden/test_block_hash_golden.c to demand byte equality from src/kv/prefix_cache.c.

vLLM's recipe (vllm/v1/core/kv_cache_utils.py: init_none_hash, hash_block_tokens):
  NONE_HASH = sha256_cbor(os.getenv("PYTHONHASHSEED"))          # the seed as a text string
  h_i       = sha256_cbor((h_{i-1} or NONE_HASH, tuple(block_token_ids), extra_keys))
and the 64-bit form KV events carry (maybe_convert_block_hash): int.from_bytes(h[-8:], "big").

Rows:
  NONE <seed> <hex of NONE_HASH>
  CHAIN <seed> <block_size> <extra hex or -> <n> <n token ids>     then one row per full block:
  HASH <hex of h_i> <64-bit form>

  python3 -m venv /tmp/cborenv && /tmp/cborenv/bin/pip install cbor2
  /tmp/cborenv/bin/python tests/golden/make_block_hash_fixtures.py
"""
import hashlib
import os
import random

import cbor2

HERE = os.path.dirname(os.path.abspath(__file__))


def sha256_cbor(x):
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()


def main():
    rng = random.Random(20261203)
    seeds = ["0", "42", "12345", "4294967295", "18446744073709551615"]
    lines = []
    for s in seeds:
        lines.append(f"NONE {s} {sha256_cbor(s).hex()}")
    # token values across every CBOR head width: < 24, 1 byte, 2 bytes, 4 bytes
    edge = [0, 1, 23, 24, 255, 256, 65535, 65536, 151935, 2**31 - 1]
    cases = [
        ("42", 16, None, edge + [rng.randrange(50000) for _ in range(16 * 3 - len(edge))]),
        ("0", 16, None, [rng.randrange(200000) for _ in range(16 * 4 + 5)]),  # a partial tail: not hashed
        ("12345", 1, None, [7, 24, 300, 70000]),
        ("18446744073709551615", 256, None, [2**31 - 1 - rng.randrange(1000) for _ in range(512)]),
        ("42", 16, (1234567).to_bytes(8, "little"), [rng.randrange(49152) for _ in range(32)]),
    ]
    for seed, bs, extra, toks in cases:
        lines.append(f"CHAIN {seed} {bs} {extra.hex() if extra else '-'} {len(toks)} " + " ".join(map(str, toks)))
        parent = sha256_cbor(seed)
        for i in range(len(toks) // bs):
            h = sha256_cbor((parent, tuple(toks[i * bs:(i + 1) * bs]), (extra,) if extra else None))
            lines.append(f"HASH {h.hex()} {int.from_bytes(h[-8:], 'big')}")
            parent = h
    out = os.path.join(HERE, "fixtures", "block_hash_sha256_cbor.txt")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(lines)} rows")


if __name__ == "__main__":
    main()
