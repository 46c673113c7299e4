#!/usr/bin/env python3
"""Writes tests/golden/fixtures/dequant.txt: ggml block data and its dequantized values, made with the
`gguf` Python package (gguf-py's numpy quantizers and dequantizers, written independently of osprey).

For each type gguf-py can quantize (F16, BF16, Q4_0, Q4_1, Q8_0, Q5_0, Q5_1): random fp32 rows
(seeded, with a few extreme values) are quantized by gguf.quants, then dequantized by gguf.quants.
For the K-quants it can only dequantize (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): random block bytes with
finite fp16 super-block scales, dequantized by gguf.quants (these rows have no fp32 input: "-").
gguf-py has no Q8_K at all (tests/unit/test_dtype.c checks it by hand). The fixture holds the raw
bytes (hex) and the expected float32 bits (hex), so tests/unit/test_dtype.c can demand bit-exact equality (and, for F16/BF16, that osprey's
fp32 -> f16/bf16 rounding gives the same bytes). New rows go after the old ones, so the existing
rows stay byte-identical.

  python3 -m venv /tmp/gv && /tmp/gv/bin/pip install gguf numpy
  /tmp/gv/bin/python tests/golden/make_dequant_fixtures.py

Format, one line per row:
  <TYPE> <n_values> <hex of the input f32, or -> <hex of the block bytes> <hex of the dequantized f32>
"""
import os

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

HERE = os.path.dirname(os.path.abspath(__file__))
TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q8_0]
QUANTIZED = [T.Q5_0, T.Q5_1]  # gguf-py quantizes these too
DEQUANT_ONLY = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]

# Byte offsets of the fp16 scales in each 256-value super-block (ggml-common.h).
HALF_FIELDS = {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def random_blocks(rng, t, n_blocks, row):
    """Uniformly random block bytes, except the fp16 super-block scales: |s| drawn log-uniformly
    (row 2: some in the subnormal range), random sign, never NaN/inf."""
    _, type_size = gguf.GGML_QUANT_SIZES[t]
    b = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    lo, hi = (-30, -10) if row == 2 else (-12, 2)
    for off in HALF_FIELDS[t]:
        s = (2.0 ** rng.uniform(lo, hi, n_blocks)) * rng.choice([-1.0, 1.0], n_blocks)
        b[:, off:off + 2] = s.astype(np.float16).reshape(n_blocks, 1).view(np.uint8)
    return b


def main():
    rng = np.random.default_rng(1234)
    lines = []
    for t in TYPES:
        for row in range(4):
            n = 64
            x = rng.standard_normal(n).astype(np.float32) * (10.0 ** (row - 2))
            if row == 3:
                x[0] = 0.0
                x[5] = 60000.0
                x[6] = -x[5]
                x[7] = 1e-7  # subnormal in f16
            q = quants.quantize(x.reshape(1, n), t)
            y = quants.dequantize(q, t).astype(np.float32).reshape(n)
            lines.append(f"{t.name} {n} {x.tobytes().hex()} {q.tobytes().hex()} {y.tobytes().hex()}")
    # Appended after the rows above (same seed order, so those stay byte-identical).
    for t in QUANTIZED:
        for row in range(4):
            n = 64
            x = rng.standard_normal(n).astype(np.float32) * (10.0 ** (row - 2))
            if row == 3:
                x[0] = 0.0
                x[5] = 60000.0
                x[6] = -x[5]
                x[7] = 1e-7
            q = quants.quantize(x.reshape(1, n), t)
            y = quants.dequantize(q, t).astype(np.float32).reshape(n)
            lines.append(f"{t.name} {n} {x.tobytes().hex()} {q.tobytes().hex()} {y.tobytes().hex()}")
    # Types gguf-py can only dequantize: random block bytes with finite half scales.
    for t in DEQUANT_ONLY:
        for row in range(3):
            n = 512 if row == 0 else 256
            q = random_blocks(rng, t, n // 256, row)
            y = quants.dequantize(q.reshape(1, -1), t).astype(np.float32).reshape(n)
            assert np.all(np.isfinite(y))
            lines.append(f"{t.name} {n} - {q.tobytes().hex()} {y.tobytes().hex()}")  # no fp32 input
    out = os.path.join(HERE, "fixtures", "dequant.txt")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(lines)} rows")


if __name__ == "__main__":
    main()
