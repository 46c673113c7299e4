#!/usr/bin/env python3
"""Writes tests/golden/fixtures/dequant.txt: ggml block data and its dequantized values, made with the
`gguf` Python package (gguf-py's numpy quantizers and dequantizers, written independently of osprey).

For each type: random fp32 rows (seeded, with a few extreme values) are quantized by gguf.quants,
then dequantized by gguf.quants; the fixture holds the raw bytes (hex) and the expected float32 bits
(hex), so tests/unit/test_dtype.c can demand bit-exact equality (and, for F16/BF16, that osprey's
fp32 -> f16/bf16 rounding gives the same bytes).

  python3 -m venv /tmp/gv && /tmp/gv/bin/pip install gguf numpy
  /tmp/gv/bin/python tests/golden/make_dequant_fixtures.py

Format, one line per row:
  <TYPE> <n_values> <hex of the input f32> <hex of the block bytes> <hex of the dequantized f32>
"""
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

HERE = os.path.dirname(os.path.abspath(__file__))
TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q8_0]


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
    out = os.path.join(HERE, "fixtures", "dequant.txt")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(lines)} rows")


if __name__ == "__main__":
    main()
