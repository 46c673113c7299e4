"""KV cache events of `osprey serve --kv-events-config`, read by a decoder written from vLLM's schema
(vllm/distributed/kv_events.py: msgspec structs with tag=True, omit_defaults=True; ZmqEventPublisher's
frames and replay protocol), with pyzmq and msgpack, not with osprey's code:

  PUB frames      [topic, sequence number (8 bytes, big-endian), msgpack EventBatch]
  EventBatch      {"ts": float, "events": [...], "data_parallel_rank": int}
  BlockStored     {"type": "BlockStored", "block_hashes": [int], "parent_block_hash": int|None,
                   "token_ids": [int], "block_size": int, "lora_id": None, "medium": str,
                   "lora_name": None, "group_idx": int}
  BlockRemoved    {"type": "BlockRemoved", "block_hashes": [int], "medium": str, "group_idx": int}
  AllBlocksCleared {"type": "AllBlocksCleared"}
  replay          DEALER sends ["", start seq (8 bytes)]; gets ["", seq, payload] for every kept batch
                  from start on, then ["", -1 (8 bytes), ""]
  array_like      the older positional form: [ts, events], ["BlockStored", hashes, parent, tokens,
                  block_size, lora_id, medium], ["BlockRemoved", hashes, medium], ["AllBlocksCleared"]

A small KV cache (16 blocks of 16 tokens) and prompts sharing prefixes force hits and evictions. The
checks: sequence numbers run 0, 1, 2, ... with no gap; every stored hash is new to the index and its
parent is in it; every removed hash is in it; token_ids hold block_size tokens per hash; the topic is
kv@<pod>@<model>; a subscriber that joins late fills its gap from the replay endpoint and rebuilds the
same index as one that saw everything; the replay buffer keeps only buffer_steps batches; two
replicas with one seed and sha256_cbor report the same hashes for the same prompt, and another seed
different ones; a bad config is refused at start-up with a message naming the key."""
import os
import socket
import subprocess
import time

import msgpack
import pytest
import zmq

from conftest import BIN, TINY, Server, free_port, retry_port_clash

END_SEQ = b"\xff" * 8


class Index:
    """The router's view, rebuilt from events; every rule of the schema checked as events arrive."""

    def __init__(self, block_size, array_like=False):
        self.bs = block_size
        self.array_like = array_like
        self.hashes = set()
        self.stored = self.removed = self.cleared = 0
        self.last_seq = -1

    def batch(self, seq, payload):
        assert seq == self.last_seq + 1, f"sequence {seq} after {self.last_seq}: a gap or a repeat"
        self.last_seq = seq
        b = msgpack.unpackb(payload, raw=False)
        if self.array_like:
            assert isinstance(b, list) and len(b) == 2, b
            ts, events = b
        else:
            assert isinstance(b, dict) and set(b) == {"ts", "events", "data_parallel_rank"}, b
            ts, events = b["ts"], b["events"]
            assert b["data_parallel_rank"] == 0
        assert isinstance(ts, float) and abs(ts - time.time()) < 600
        assert events, "an empty batch was published"
        for e in events:
            self.event(e)

    def event(self, e):
        if self.array_like:
            kind = e[0]
            if kind == "BlockStored":
                assert len(e) == 7, e
                e = dict(zip(["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                              "medium"], e))
            elif kind == "BlockRemoved":
                assert len(e) == 3, e
                e = dict(zip(["type", "block_hashes", "medium"], e))
            else:
                assert e == ["AllBlocksCleared"], e
                e = {"type": kind}
        kind = e["type"]
        if kind == "BlockStored":
            if not self.array_like:
                assert set(e) == {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                  "medium", "lora_name", "group_idx"}, e
                assert e["lora_name"] is None and e["group_idx"] == 0
            assert e["block_size"] == self.bs and e["lora_id"] is None and e["medium"] == "CPU"
            hs = e["block_hashes"]
            assert hs and all(isinstance(h, int) and 0 <= h < 2**64 for h in hs)
            assert len(e["token_ids"]) == self.bs * len(hs)
            parent = e["parent_block_hash"]
            assert parent is None or parent in self.hashes, "stored under a parent the index does not hold"
            for h in hs:
                assert h not in self.hashes, f"block {h:016x} stored twice"
                self.hashes.add(h)
            self.stored += len(hs)
        elif kind == "BlockRemoved":
            if not self.array_like:
                assert set(e) == {"type", "block_hashes", "medium", "group_idx"}, e
            assert e["medium"] == "CPU"
            for h in e["block_hashes"]:
                assert h in self.hashes, f"block {h:016x} removed but never stored"
                self.hashes.remove(h)
            self.removed += len(e["block_hashes"])
        else:
            assert kind == "AllBlocksCleared" and set(e) == {"type"}, e
            self.hashes.clear()
            self.cleared += 1


def subscribe(ctx, port):
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 3000)
    sub.connect(f"tcp://127.0.0.1:{port}")
    return sub


def drain(sub, idx, topics, until_seq, timeout=30):
    """Reads batches until idx has seen until_seq (the server's count) or the time runs out."""
    deadline = time.time() + timeout
    while idx.last_seq < until_seq and time.time() < deadline:
        try:
            topic, seq, payload = sub.recv_multipart()
        except zmq.Again:
            continue
        topics.add(topic.decode())
        assert len(seq) == 8
        idx.batch(int.from_bytes(seq, "big"), payload)


def replay(ctx, port, start):
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.RCVTIMEO, 5000)
    d.connect(f"tcp://127.0.0.1:{port}")
    d.send_multipart([b"", start.to_bytes(8, "big")])
    got = []
    while True:
        empty, seq, payload = d.recv_multipart()
        assert empty == b""
        if seq == END_SEQ:
            assert payload == b""
            break
        got.append((int.from_bytes(seq, "big"), payload))
    d.close(linger=0)
    return got


PROMPTS = [
    "The quick brown fox jumps over the lazy dog and then the dog sleeps all afternoon in the warm sun.",
    "A system prompt shared by many users: you are a helpful assistant who answers in short sentences.",
]


def traffic(srv, n):
    c = srv.client()
    for i in range(n):
        base = PROMPTS[i % 2]
        # shared prefixes (hits) and new tails (stores); more distinct blocks than the pool holds (evictions)
        c.completions.create(model=srv.model, prompt=base + f" Variation number {i} of the text, " * (1 + i % 3),
                             max_tokens=4, temperature=0)


def start(extra, cfg_extra=""):
    """A server publishing on fresh ports; returns (server, publisher port, replay port)."""
    def make():
        pub, rep = free_port(), free_port()
        cfg = '{"enable_kv_cache_events": true, "endpoint": "tcp://*:%d", "replay_endpoint": "tcp://*:%d"%s}' % (
            pub, rep, cfg_extra)
        return (Server(TINY, "--kv-cache-memory", "64K", "--block-size", "16", "--kv-events-config", cfg, *extra,
                       retry=False), pub, rep)
    return retry_port_clash(make)


@pytest.fixture(scope="module")
def ctx():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    c = zmq.Context()
    yield c
    c.term()


def run_and_collect(ctx, srv, pub, rep, n, array_like=False, late=False):
    """A subscriber from the start and, with late, one that joins half-way; returns both indexes."""
    sub = subscribe(ctx, pub)
    time.sleep(0.5)  # ZeroMQ's slow joiner: the subscription must reach the PUB before the first batch
    idx, topics = Index(16, array_like), set()
    traffic(srv, n // 2)
    late_sub = subscribe(ctx, pub) if late else None
    time.sleep(0.5)
    traffic(srv, n - n // 2)
    last = replay(ctx, rep, 0)[-1][0]  # the newest kept batch: how far to read
    drain(sub, idx, topics, last)
    assert idx.last_seq == last, f"saw up to {idx.last_seq} of {last}"
    late_idx = None
    if late:
        late_idx = Index(16, array_like)
        first = None
        live = []
        deadline = time.time() + 30
        while (not live or live[-1][0] < last) and time.time() < deadline:
            try:
                _, seq, payload = late_sub.recv_multipart()
            except zmq.Again:
                continue
            live.append((int.from_bytes(seq, "big"), payload))
        first = live[0][0]
        assert first > 0, "the late subscriber saw everything: no gap to fill"
        gap = [(s, p) for s, p in replay(ctx, rep, 0) if s < first]
        assert [s for s, _ in gap] == list(range(first)), "replay did not return exactly the missed batches"
        for s, p in gap + live:
            late_idx.batch(s, p)
        late_sub.close(linger=0)
    sub.close(linger=0)
    return idx, topics, late_idx


def test_events_exactly_once_in_order_and_replay_fills_gap(ctx):
    srv, pub, rep = start(["--prefix-caching-hash-algo", "sha256_cbor", "--prefix-caching-hash-seed", "42"])
    try:
        idx, topics, late = run_and_collect(ctx, srv, pub, rep, 12, late=True)
        print(f"kv events: {idx.last_seq + 1} batches, {idx.stored} stored, {idx.removed} removed, {len(idx.hashes)} indexed")
        assert idx.stored > 0 and idx.removed > 0, (idx.stored, idx.removed)  # hits, stores and evictions
        assert len(idx.hashes) <= 16  # never more cached blocks than the pool has
        assert topics == {f"kv@{os.environ.get('POD_IP') or socket.gethostname()}@{srv.model}"}, topics
        assert late.hashes == idx.hashes  # the replayed gap + live stream rebuild the same index
        # the replayed batches are byte for byte what was published
        kept = replay(ctx, rep, 0)
        assert [s for s, _ in kept] == list(range(len(kept)))
    finally:
        assert srv.stop() == 0, srv.read_log()[-3000:]


def test_replay_buffer_is_bounded(ctx):
    srv, pub, rep = start([], ', "buffer_steps": 3')
    try:
        traffic(srv, 6)
        kept = replay(ctx, rep, 0)
        assert len(kept) == 3 and kept[-1][0] >= 3, [s for s, _ in kept]
        assert [s for s, _ in kept] == list(range(kept[0][0], kept[0][0] + 3))
        assert replay(ctx, rep, kept[-1][0] + 1) == []  # nothing newer: just the end marker
    finally:
        assert srv.stop() == 0, srv.read_log()[-3000:]


def test_array_like_form(ctx):
    srv, pub, rep = start(["--kv-events-array-like"], ', "topic": "mytopic"')
    try:
        idx, topics, _ = run_and_collect(ctx, srv, pub, rep, 6, array_like=True)
        assert idx.stored > 0 and topics == {"mytopic"}
    finally:
        assert srv.stop() == 0, srv.read_log()[-3000:]


def stored_hashes(ctx, seed, prompt):
    srv, pub, rep = start(["--prefix-caching-hash-algo", "sha256_cbor", "--prefix-caching-hash-seed", str(seed)])
    try:
        srv.client().completions.create(model=srv.model, prompt=prompt, max_tokens=1, temperature=0)
        idx = Index(16)
        for s, p in replay(ctx, rep, 0):
            idx.batch(s, p)
        return idx.hashes
    finally:
        assert srv.stop() == 0, srv.read_log()[-3000:]


def test_replicas_with_one_seed_agree(ctx):
    prompt = PROMPTS[1] * 2
    a, b, c = stored_hashes(ctx, 7, prompt), stored_hashes(ctx, 7, prompt), stored_hashes(ctx, 8, prompt)
    assert len(a) >= 2 and a == b, (a, b)
    assert not (a & c), "another seed gave the same hashes"


@pytest.mark.parametrize("cfg,says", [
    ('{"enable_kv_cache_events": true, "bogus": 1}', "unknown key 'bogus'"),
    ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "'publisher'"),
    ('{"enable_kv_cache_events": true, "endpoint": "nonsense://x"}', "nonsense://x"),
    ("not json", "not JSON"),
])
def test_bad_config_refused(cfg, says):
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    r = subprocess.run([BIN, "serve", "-m", TINY, "--port", "0", "--kv-events-config", cfg], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and says in r.stderr, r.stderr


@pytest.mark.parametrize("args,env,says", [
    (["--prefix-caching-hash-algo", "md5"], {}, "--prefix-caching-hash-algo: 'md5'"),
    (["--prefix-caching-hash-seed", "01"], {}, "--prefix-caching-hash-seed: '01'"),
    (["--prefix-caching-hash-seed", "-1"], {}, "--prefix-caching-hash-seed: '-1'"),
    ([], {"OSPREY_HASH_SEED": "abc"}, "$OSPREY_HASH_SEED: 'abc'"),
    ([], {"PYTHONHASHSEED": "18446744073709551616"}, "$PYTHONHASHSEED"),
])
def test_bad_hash_flags_refused(args, env, says):
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    r = subprocess.run([BIN, "serve", "-m", TINY, "--port", "0", *args], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env})
    assert r.returncode != 0 and says in r.stderr, r.stderr
