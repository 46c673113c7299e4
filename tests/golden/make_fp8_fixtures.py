#!/usr/bin/env python3
"""Writes tests/golden/fixtures/fp8.txt: FP8 E4M3 and FP4 E2M1 conversions and NVFP4 micro-blocks,
made with ml_dtypes (float8_e4m3fn, float4_e2m1fn: Google's numpy dtypes, written independently of
osprey), for tests/unit/test_fp8.c to demand bit-exact equality.

Rows:
  E4M3_DEC <code> <f32 bits>          every code, decoded
  E4M3_ENC <f32 bits> <code>          fp32 -> E4M3: every tie between neighbours, one fp32 ulp either
                                      side, and log-uniform values in [2^-12, 464) of both signs
                                      (ml_dtypes does not saturate: past 464 it gives NaN where osprey
                                      gives +-448, so the fixture stays inside; the test checks that part)
  E2M1_DEC <code> <f32 bits>
  E2M1_ENC <f32 bits> <code>          ties, their neighbours, values in [0, 8) and beyond (saturating)
  NVFP4 <tensor scale bits> <16 x f32 bits> <scale code> <8 packed bytes, hex>
                                      the micro-block recipe of src/core/dtype.h with ml_dtypes' casts:
                                      scale = e4m3(amax / 6 / ts), value i = e2m1(x_i / (scale ts))

  python3 -m venv /tmp/mlenv && /tmp/mlenv/bin/pip install ml_dtypes numpy
  /tmp/mlenv/bin/python tests/golden/make_fp8_fixtures.py
"""
import os

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
E4M3, E2M1 = ml_dtypes.float8_e4m3fn, ml_dtypes.float4_e2m1fn
rng = np.random.default_rng(20261201)


def bits(x):
    return f"{np.float32(x).view(np.uint32):08x}"


def neighbours_and_ties(codes, dtype, top):
    vals = sorted({float(np.array([c], np.uint8).view(dtype)[0]) for c in codes})
    vals = [v for v in vals if np.isfinite(v) and 0 <= v <= top]
    out = []
    for a, b in zip(vals, vals[1:]):
        m = np.float32((a + b) / 2)
        out += [m, np.nextafter(m, np.float32(0)), np.nextafter(m, np.float32(np.inf))]
    out += [np.float32(v) for v in vals]
    return out


lines = []
for c in range(256):
    v = np.array([c], np.uint8).view(E4M3).astype(np.float32)[0]
    lines.append(f"E4M3_DEC {c:02x} {bits(v)}")
enc = neighbours_and_ties(range(128), E4M3, 448.0)
enc += list(np.float32(2.0 ** rng.uniform(-12, np.log2(463.9), 600)))
for x in enc + [-v for v in enc]:
    x = np.float32(x)
    if not abs(x) < 464:
        continue
    c = np.array([x], np.float32).astype(E4M3).view(np.uint8)[0]
    lines.append(f"E4M3_ENC {bits(x)} {c:02x}")
for c in range(16):
    v = np.array([c], np.uint8).view(E2M1).astype(np.float32)[0]
    lines.append(f"E2M1_DEC {c:x} {bits(v)}")
enc = neighbours_and_ties(range(8), E2M1, 6.0) + list(np.float32(rng.uniform(0, 8, 200))) + [np.float32(v) for v in (7, 100, 1e30)]
for x in enc + [-v for v in enc]:
    x = np.float32(x)
    c = np.array([x], np.float32).astype(E2M1).view(np.uint8)[0]
    lines.append(f"E2M1_ENC {bits(x)} {c:x}")
for k in range(120):
    ts = np.float32(2.0 ** rng.uniform(-8, 2))
    x = (rng.standard_normal(16) * 2.0 ** rng.uniform(-6, 6)).astype(np.float32)
    if k % 10 == 0:
        x[rng.integers(16)] *= np.float32(40.0)  # an outlier
    amax = np.float32(np.max(np.abs(x)))
    s = np.array([amax / np.float32(6.0) / ts], np.float32).astype(E4M3)
    sd = np.float32(s.astype(np.float32)[0]) * ts
    q = (x / sd).astype(E2M1).view(np.uint8) if sd > 0 else np.zeros(16, np.uint8)
    packed = bytes(int(q[2 * i]) | (int(q[2 * i + 1]) << 4) for i in range(8))
    if not np.isfinite(s.astype(np.float32)[0]):
        continue  # beyond E4M3's range: ml_dtypes gives NaN, osprey saturates
    lines.append("NVFP4 " + bits(ts) + " " + " ".join(bits(v) for v in x) + f" {s.view(np.uint8)[0]:02x} {packed.hex()}")
with open(os.path.join(HERE, "fixtures", "fp8.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
print(len(lines), "rows")
