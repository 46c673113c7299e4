"""Writes the seed corpus of tests/fuzz/fuzz_ipc.c (tests/fuzz/corpus/ipc/): one well-formed message of
each type of src/engine/ipc.h, as the other side's msgpack would write it, plus a few near-misses.
Run with the integration venv: .venv-it/bin/python tests/fuzz/make_ipc_seeds.py"""
import os
import struct

import msgpack

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "ipc")
# osp_engine_stats fields sent (ipc.c: N_STATS; OSP_SPEC_MAX_TOKENS is 16): counts, iteration buckets,
# speculation, its positions, KV offload (9), KV transfer (8: its CUDA IPC blocks last)
NSTATS = 11 + 14 + 3 + 16 + 9 + 8


def ids(*xs):
    return struct.pack("<%di" % len(xs), *xs)


def lp(tok, top):
    return [tok, -0.25, 1, [t for t, _ in top], [v for _, v in top]]


seeds = {
    "hello": {"t": 1, "fe": 0},
    "ready": {"t": 2, "epoch": 3, "mml": 8192, "vocab": 49152, "nb": 4096, "bs": 16, "pid": 1234},
    "add_min": {"t": 3, "id": 1, "gen": 1, "prompt": ids(1, 2, 3)},
    "add_full": {"t": 3, "id": 2 ** 40, "gen": 7, "prompt": ids(*range(40)), "temp": 0.7, "top_k": 40, "top_p": 0.95,
                 "min_p": 0.05, "pres": 0.5, "freq": -0.5, "rep": 1.1, "bias": [[5, -100.0], [6, 2.0]], "seed": 42,
                 "n": 1, "sidx": 2, "lp": 5, "plp": -1, "max": 64, "min": 2, "ieos": True, "stop": ids(2, 9),
                 "prio": -3, "salt": 99, "gram": 'root ::= "yes" | "no"'},
    "ready_kv": {"t": 2, "epoch": 0, "mml": 2048, "vocab": 32000, "nb": 64, "bs": 16, "pid": 77,
                 "kv": [1, "127.0.0.1", 41234, 2 ** 63 + 5]},
    "add_kvt_prefill": {"t": 3, "id": 6, "gen": 1, "prompt": ids(*range(50)),
                        "kvt": [False, True, "10.1.2.3", 5600, 2 ** 64 - 1, 12, 3]},
    "add_kvt_decode": {"t": 3, "id": 7, "gen": 1, "prompt": ids(1, 2), "kvt": [True, False, "", 0, 0, 0, 0]},
    "add_embed": {"t": 3, "id": 3, "gen": 2, "prompt": ids(5, 6, 7), "pool": 1, "enorm": False},
    "abort": {"t": 4, "id": 5, "gen": 9},
    "heartbeat": {"t": 5},
    "ack_ok": {"t": 6, "id": 5, "gen": 9, "ok": True},
    "ack_refused": {"t": 6, "id": 5, "gen": 9, "ok": False, "err": "prompt + max_tokens > max_model_len"},
    "outputs": {"t": 7, "outs": [
        {"id": 1, "gen": 1, "tok": ids(17, 18), "fin": False, "why": 0, "nout": 2, "np": 3, "nc": 0, "sched": 12.5,
         "lp": [lp(17, [(17, -0.25), (3, -2.0)]), lp(18, [])]},
        {"id": 2, "gen": 4, "tok": b"", "fin": True, "why": 4, "nout": 9, "np": 3, "nc": 0, "sched": 1.0, "err": "NaN logits",
         "plp": [lp(2, [(2, -0.1)]), lp(3, [(3, -0.5)])]},
        {"id": 3, "gen": 5, "tok": ids(1), "fin": True, "why": 3, "nout": 1, "np": 1, "nc": 1, "sched": 0.0},
    ], "stats": list(range(NSTATS))},
    "outputs_kvt": {"t": 7, "outs": [
        {"id": 5, "gen": 1, "tok": ids(9), "fin": True, "why": 2, "nout": 1, "np": 40, "nc": 0, "sched": 3.0,
         "kvid": 2 ** 40 + 1, "kvnb": 2}], "stats": list(range(NSTATS))},
    "outputs_empty": {"t": 7, "outs": [], "stats": [0] * NSTATS},
    "outputs_embd": {"t": 7, "outs": [
        {"id": 4, "gen": 2, "tok": b"", "fin": True, "why": 1, "nout": 0, "np": 3, "nc": 0, "sched": 2.0,
         "embd": [0.5, -0.25, 0.125, 1e-3]}], "stats": [0] * NSTATS},
}

os.makedirs(OUT, exist_ok=True)
for name, msg in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(msgpack.packb(msg, use_bin_type=True))
# near-misses: an unknown field, a truncated message, a prompt whose length is not a multiple of 4
with open(os.path.join(OUT, "bad_unknown_field"), "wb") as f:
    f.write(msgpack.packb({"t": 4, "id": 5, "gen": 9, "extra": 1}))
with open(os.path.join(OUT, "bad_truncated"), "wb") as f:
    f.write(msgpack.packb(seeds["add_full"], use_bin_type=True)[:-7])
with open(os.path.join(OUT, "bad_prompt_len"), "wb") as f:
    f.write(msgpack.packb({"t": 3, "id": 1, "gen": 1, "prompt": b"\x01\x02\x03"}, use_bin_type=True))
# an ADD with enorm but no pool (refused: it would not survive re-encoding), found by the fuzzer
with open(os.path.join(OUT, "bad_enorm_without_pool"), "wb") as f:
    f.write(msgpack.packb({"t": 3, "id": 3, "gen": 2, "prompt": ids(5, 6, 7), "prio": 1, "enorm": False}, use_bin_type=True))
