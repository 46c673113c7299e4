#!/usr/bin/env python3
"""Shared-prefix serving through `osprey router` over REPLICAS `osprey serve` processes on loopback:
round-robin against prefix-aware routing, in one run (bench/scale.sh runs it; issue 18).

Workload: SYSTEMS long system prompts (~SYS_WORDS words each) shared by many users; each request is
one system prompt + a short user line, streamed, MAX_TOKENS tokens, CONCURRENCY clients at a time,
REQUESTS requests per phase. Each replica's KV cache (KV_MEM) holds only a few of the system prompts,
so where a prompt lands decides whether it is a prefix-cache hit.

Two phases against the same replicas, each with its own set of system prompts (so the first phase's
cache does not help the second): "round-robin" (router weights all 0: the tie-break rotates) and
"prefix-aware" (the router's default weights, precise scoring from the replicas' KV events). Printed:
per phase mean / p50 / p90 TTFT (first streamed token), requests/s and generated tokens/s, prefix
hit rate from the replicas' vllm:prefix_cache_* counters; then the ratios.

`scale.py hotspot` (bench/scale.sh hotspot): the hot-spot run. Open-loop Poisson arrivals at RATE
requests/s (seeded), HOT_SHARE of them behind one hot system prompt and the rest spread over SYSTEMS
others; each replica runs at most MAX_NUM_SEQS sequences, so a replica that gets more requests than
it can run queues them (vllm:num_requests_waiting). Three phases, each with its own prompts:
"round-robin", "prefix" (precise prefix scoring, --hot-queue -1: no protection, every hot request
is drawn to the replica that caches the hot prompt) and "prefix+hot" (--hot-queue HOT_QUEUE: a replica
whose queue passes it scores no prefix, so the hot prompt spills over). Printed per phase: TTFT mean,
p50, p90, p99 and max, requests/s, the share of hot requests the busiest replica took, and the hit rate."""
import os
import random
import statistics
import subprocess
import sys
import threading
import time

import requests

from percentile import nearest_rank  # bench/percentile.py
from procs import free_port, metric_sum, stop, wait_up  # bench/procs.py

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("OSPREY_BIN", os.path.join(ROOT, "build", "bin", "osprey"))
MODEL = os.environ.get("MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
REPLICAS = int(os.environ.get("REPLICAS", "4"))
SYSTEMS = int(os.environ.get("SYSTEMS", "8"))
SYS_WORDS = int(os.environ.get("SYS_WORDS", "350"))
REQUESTS = int(os.environ.get("REQUESTS", "48"))
CONCURRENCY = int(os.environ.get("CONCURRENCY", "4"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "8"))
KV_MEM = os.environ.get("KV_MEM", "40M")
THREADS = os.environ.get("THREADS", "1")
SEED = "42"
# the hot-spot run (`scale.py hotspot`)
RATE = float(os.environ.get("RATE", "1.5"))
HOT_SHARE = float(os.environ.get("HOT_SHARE", "0.8"))
MAX_NUM_SEQS = os.environ.get("MAX_NUM_SEQS", "4")
HOT_QUEUE = os.environ.get("HOT_QUEUE", "2")


def words(rng, n):
    vocab = ("the of and to in is that for it as with was on be by this are from at or an have not they which "
             "system assistant answer question policy customer order account service please always never "
             "information data report summary detail example rule must should may will can user reply").split()
    return " ".join(rng.choice(vocab) for _ in range(n))


def phase(name, router_url, replica_urls, model, systems, rng):
    jobs = [(rng.randrange(len(systems)), i) for i in range(REQUESTS)]
    q0, h0 = metric_sum(replica_urls, "vllm:prefix_cache_queries_total"), metric_sum(replica_urls, "vllm:prefix_cache_hits_total")
    ttft, ntok, lock = [], [0], threading.Lock()

    def client(mine):
        for s, i in mine:
            prompt = systems[s] + f"\nUser {i}: what is rule number {i}?\nAssistant:"
            t0 = time.time()
            first = None
            n = 0
            with requests.post(router_url + "/v1/completions", stream=True, timeout=600,
                               json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True,
                                     "temperature": 0, "ignore_eos": True}) as r:
                assert r.status_code == 200, r.text
                for line in r.iter_lines():
                    if line.startswith(b"data: {"):
                        if first is None:
                            first = time.time() - t0
                        n += 1
            with lock:
                ttft.append(first)
                ntok[0] += n

    t0 = time.time()
    threads = [threading.Thread(target=client, args=(jobs[k::CONCURRENCY],)) for k in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    q = metric_sum(replica_urls, "vllm:prefix_cache_queries_total") - q0
    h = metric_sum(replica_urls, "vllm:prefix_cache_hits_total") - h0
    ttft.sort()
    row = {"name": name, "mean": statistics.mean(ttft), "p50": ttft[len(ttft) // 2], "p90": ttft[int(len(ttft) * 0.9)],
           "rps": REQUESTS / wall, "tps": ntok[0] / wall, "hit": h / q if q else 0.0, "wall": wall}
    print(f"{name:13s} {REQUESTS:5d} {row['mean'] * 1000:9.0f} {row['p50'] * 1000:8.0f} {row['p90'] * 1000:8.0f} "
          f"{row['rps']:7.2f} {row['tps']:8.1f} {row['hit'] * 100:6.1f}% {wall:7.1f}", flush=True)
    return row


def start(procs, router_kinds, serve_extra=()):
    """REPLICAS replicas publishing KV events, and one router per (name, extra flags); returns the
    replica URLs, the model name and {name: router URL}."""
    reps, pubs = [], []
    for i in range(REPLICAS):
        port, pub = free_port(), free_port()
        p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", str(port), "-t", THREADS, "--kv-cache-memory", KV_MEM,
                              "--prefix-caching-hash-algo", "sha256_cbor", "--prefix-caching-hash-seed", SEED,
                              "--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "tcp://*:%d"}' % pub,
                              *serve_extra],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        reps.append(f"http://127.0.0.1:{port}")
        pubs.append(f"tcp://127.0.0.1:{pub}")
    for u, p in zip(reps, procs):
        wait_up(u + "/health", p, "replica")
    model = requests.get(reps[0] + "/v1/models").json()["data"][0]["id"]
    precise = ["--kv-events", ",".join(pubs), "--prefix-caching-hash-algo", "sha256_cbor", "--prefix-caching-hash-seed", SEED]
    routers = {}
    for name, extra in router_kinds:
        port = free_port()
        p = subprocess.Popen([BIN, "router", "--backends", ",".join(reps), "--port", str(port),
                              *[a for x in extra for a in (precise if x == "PRECISE" else [x])]],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        routers[name] = f"http://127.0.0.1:{port}"
        wait_up(routers[name] + "/health", p, "router")
    time.sleep(0.5)  # the routers' KV-event subscriptions reach the publishers
    return reps, model, routers


def hot_phase(name, router_url, replica_urls, model, hot, others, rng):
    """Open-loop: request i starts at its Poisson arrival time whatever the others are doing."""
    t, jobs = 0.0, []
    for i in range(REQUESTS):
        t += rng.expovariate(RATE)
        is_hot = rng.random() < HOT_SHARE
        jobs.append((t, is_hot, hot if is_hot else others[rng.randrange(len(others))], i))
    q0, h0 = metric_sum(replica_urls, "vllm:prefix_cache_queries_total"), metric_sum(replica_urls, "vllm:prefix_cache_hits_total")
    ttft, where, errors, lock = [], {}, [], threading.Lock()

    def one(start, is_hot, system, i):
        time.sleep(max(0.0, t0 + start - time.time()))
        prompt = system + f"\nUser {i}: what is rule number {i}?\nAssistant:"
        ts = time.time()
        try:
            with requests.post(router_url + "/v1/completions", stream=True, timeout=900,
                               json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True,
                                     "temperature": 0, "ignore_eos": True}) as r:
                assert r.status_code == 200, r.text
                backend = r.headers.get("X-Osprey-Backend", "?")
                first = None
                for line in r.iter_lines():
                    if line.startswith(b"data: {") and first is None:
                        first = time.time() - ts
            with lock:
                ttft.append(first)
                if is_hot:
                    where[backend] = where.get(backend, 0) + 1
        except Exception as e:  # a failed request is counted, not hidden
            with lock:
                errors.append(repr(e)[:200])

    t0 = time.time() + 0.2
    threads = [threading.Thread(target=one, args=j) for j in jobs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.time() - t0
    q = metric_sum(replica_urls, "vllm:prefix_cache_queries_total") - q0
    h = metric_sum(replica_urls, "vllm:prefix_cache_hits_total") - h0
    ttft.sort()
    nhot = sum(where.values())
    row = {"name": name, "mean": statistics.mean(ttft), "p50": nearest_rank(ttft, 0.5), "p90": nearest_rank(ttft, 0.9), "p99": nearest_rank(ttft, 0.99),
           "max": ttft[-1], "rps": len(ttft) / wall, "busiest": max(where.values()) / nhot if nhot else 0.0,
           "hit": h / q if q else 0.0, "errors": len(errors)}
    print(f"{name:12s} {len(ttft):5d} {row['mean'] * 1000:8.0f} {row['p50'] * 1000:7.0f} {row['p90'] * 1000:7.0f} "
          f"{row['p99'] * 1000:7.0f} {row['max'] * 1000:7.0f} {row['rps']:6.2f} {row['busiest'] * 100:8.0f}% "
          f"{row['hit'] * 100:6.1f}% {len(errors):4d}", flush=True)
    for e in errors[:3]:
        print(f"#   error: {e}")
    return row


def hotspot():
    procs = []
    try:
        kinds = (("round-robin", ["--weights", "prefix=0,queue=0,kv=0,active=0"]),
                 ("prefix", ["PRECISE", "--hot-queue", "-1"]),
                 ("prefix+hot", ["PRECISE", "--hot-queue", HOT_QUEUE]))
        reps, model, routers = start(procs, kinds, ["--max-num-seqs", MAX_NUM_SEQS])
        print(f"# hot spot: {REPLICAS} replicas of {os.path.basename(MODEL)} (-t {THREADS}, KV {KV_MEM}, --max-num-seqs "
              f"{MAX_NUM_SEQS} each), Poisson arrivals at {RATE:g} req/s, {HOT_SHARE * 100:.0f}% behind one hot system "
              f"prompt of ~{SYS_WORDS} words, the rest over {SYSTEMS} others; {REQUESTS} requests per phase, "
              f"{MAX_TOKENS} tokens each; prefix+hot: --hot-queue {HOT_QUEUE}")
        print(f"# load average: {' '.join(open('/proc/loadavg').read().split()[:3])}")
        print("phase         reqs  TTFT ms  p50 ms  p90 ms  p99 ms  max ms  req/s  hot@top    hit  err")
        rows = {}
        for k, (name, _) in enumerate(kinds):
            rng = random.Random(2000 + k)
            hot = f"Hot system prompt {k}: " + words(rng, SYS_WORDS)
            others = [f"System prompt {k}-{s}: " + words(rng, SYS_WORDS) for s in range(SYSTEMS)]
            rows[name] = hot_phase(name, routers[name], reps, model, hot, others, random.Random(11))
        rr, pf, ph = rows["round-robin"], rows["prefix"], rows["prefix+hot"]
        print(f"p99 TTFT: prefix {pf['p99'] / rr['p99']:.2f}x round-robin's, prefix+hot {ph['p99'] / rr['p99']:.2f}x "
              f"round-robin's, {ph['p99'] / pf['p99']:.2f}x prefix's; mean TTFT prefix+hot {rr['mean'] / ph['mean']:.2f}x "
              f"lower than round-robin")
        print(f"# load average at the end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    finally:
        stop(procs)


def main():
    procs = []
    try:
        reps, model, routers = start(procs, (("round-robin", ["--weights", "prefix=0,queue=0,kv=0,active=0"]),
                                             ("prefix-aware", ["PRECISE"])))
        print(f"# {REPLICAS} replicas of {os.path.basename(MODEL)} (-t {THREADS}, KV {KV_MEM} each), {SYSTEMS} system "
              f"prompts of ~{SYS_WORDS} words, {REQUESTS} requests per phase, {CONCURRENCY} clients, {MAX_TOKENS} tokens each")
        print(f"# load average: {' '.join(open('/proc/loadavg').read().split()[:3])}")
        print("phase         reqs  TTFT ms   p50 ms   p90 ms   req/s    tok/s    hit    wall s")
        rows = {}
        for k, name in enumerate(("round-robin", "prefix-aware")):
            rng = random.Random(1000 + k)
            systems = [f"System prompt {k}-{s}: " + words(rng, SYS_WORDS) for s in range(SYSTEMS)]
            rows[name] = phase(name, routers[name], reps, model, systems, random.Random(7))
        rr, pa = rows["round-robin"], rows["prefix-aware"]
        print(f"prefix-aware vs round-robin: mean TTFT {rr['mean'] / pa['mean']:.2f}x lower, throughput "
              f"{pa['rps'] / rr['rps']:.2f}x (requests/s), prefix hit rate {rr['hit'] * 100:.0f}% -> {pa['hit'] * 100:.0f}%")
    finally:
        stop(procs)


if __name__ == "__main__":
    if sys.argv[1:] == ["hotspot"]:
        hotspot()
    elif sys.argv[1:]:
        sys.exit("usage: scale.py [hotspot]")
    else:
        main()
