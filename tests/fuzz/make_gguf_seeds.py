#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_gguf (tests/fuzz/corpus/gguf/): a few small, valid GGUF files
and some truncated copies, so libFuzzer starts from inputs that already reach deep into the reader.

Covers GGUF v2 and v3, every metadata value type, arrays of every element type, arrays of strings,
nested arrays (two levels), an empty array, general.alignment (32 and 64), and tensors of plain and
block-quantized types. Standard library only (struct); the output is deterministic, so rerunning it
changes nothing. Format: ggml/docs/gguf.md.

    python3 tests/fuzz/make_gguf_seeds.py [OUT_DIR]
"""
import os
import struct
import sys

# Metadata value types (gguf.md).
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}

# ggml tensor types used here: (id, values per block, bytes per block).
GGML_F32, GGML_F16, GGML_Q4_1, GGML_Q8_0 = (0, 1, 4), (1, 1, 2), (3, 32, 20), (8, 32, 34)


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    """Encodes a value of type t (without the leading type id). Arrays: v = (elem_type, [items])."""
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(value(et, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


def gguf(version, kvs, tensors, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, [ne...], ggml_type, data_bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += gstr(key) + struct.pack("<I", t) + value(t, v)
    offset, blobs = 0, []
    for name, ne, (tid, _, _), data in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", tid, offset)
        pad = -len(data) % alignment
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    out += b"\0" * (-len(out) % alignment)
    return out + b"".join(blobs)


def tensor(name, ne, ty, fill):
    n = 1
    for d in ne:
        n *= d
    _, block, size = ty
    nbytes = n // block * size
    return (name, ne, ty, bytes((fill + i) & 0xFF for i in range(nbytes)))


def all_types_kvs():
    return [
        ("general.architecture", STR, "llama"),
        ("general.name", STR, "seed \u00e9\u4e2d"),
        ("general.alignment", U32, 32),
        ("t.u8", U8, 255), ("t.i8", I8, -128), ("t.u16", U16, 65535), ("t.i16", I16, -32768),
        ("t.u32", U32, 4000000000), ("t.i32", I32, -2000000000), ("t.f32", F32, 1.5),
        ("t.bool", BOOL, 1), ("t.u64", U64, 2**64 - 1), ("t.i64", I64, -2**63), ("t.f64", F64, -0.25),
        ("t.str.empty", STR, ""),
        ("a.u8", ARR, (U8, [1, 2, 3])), ("a.i8", ARR, (I8, [-1, 0, 1])),
        ("a.u16", ARR, (U16, [1, 65535])), ("a.i16", ARR, (I16, [-2, 2])),
        ("a.u32", ARR, (U32, [7, 8, 9])), ("a.i32", ARR, (I32, [-7, 7])),
        ("a.f32", ARR, (F32, [0.5, -1.0, 3.25])), ("a.bool", ARR, (BOOL, [0, 1, 1])),
        ("a.u64", ARR, (U64, [1, 2**63])), ("a.i64", ARR, (I64, [-5, 5])),
        ("a.f64", ARR, (F64, [1e300, -1e-300])),
        ("a.str", ARR, (STR, ["<s>", "</s>", "", "hello"])),
        ("a.empty", ARR, (U32, [])),
        ("a.nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["x", "yz"]), (ARR, [(I32, [-1])]), (F32, [])])),
    ]


def seeds():
    s = {}
    s["v3_all_types.gguf"] = gguf(3, all_types_kvs(), [
        tensor("token_embd.weight", [8, 2], GGML_F32, 1),
        tensor("output_norm.weight", [8], GGML_F16, 2),
    ])
    s["v2_basic.gguf"] = gguf(2, [
        ("general.architecture", STR, "llama"),
        ("llama.context_length", U32, 2048),
        ("llama.rope.freq_base", F32, 10000.0),
        ("tokenizer.ggml.tokens", ARR, (STR, ["a", "b", "c"])),
        ("tokenizer.ggml.scores", ARR, (F32, [0.0, -1.0, -2.0])),
        ("tokenizer.ggml.token_type", ARR, (I32, [1, 1, 1])),
    ], [tensor("blk.0.attn_q.weight", [4, 4], GGML_F32, 3)])
    s["v3_align64_quant.gguf"] = gguf(3, [
        ("general.alignment", U32, 64),
        ("general.architecture", STR, "llama"),
    ], [
        tensor("blk.0.ffn_up.weight", [32, 2], GGML_Q4_1, 4),
        tensor("blk.0.ffn_down.weight", [64, 1], GGML_Q8_0, 5),
        tensor("blk.0.attn_norm.weight", [3], GGML_F32, 6),
    ], alignment=64)
    s["v3_metadata_only.gguf"] = gguf(3, all_types_kvs()[3:16], [])
    s["v3_empty.gguf"] = gguf(3, [], [])
    s["v2_empty_tensor_list.gguf"] = gguf(2, [("general.architecture", STR, "gpt2")], [])
    full = s["v3_all_types.gguf"]
    for cut in (3, 24, 100, 400, len(full) - 40, len(full) - 1):
        s["trunc_v3_all_types_%d.gguf" % cut] = full[:cut]
    return s


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "gguf")
    os.makedirs(out, exist_ok=True)
    total = 0
    for name, data in sorted(seeds().items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        total += len(data)
    print("wrote %d seeds (%d bytes) to %s" % (len(seeds()), total, out))


if __name__ == "__main__":
    main()
