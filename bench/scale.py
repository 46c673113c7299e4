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
hit rate from the replicas' vllm:prefix_cache_* counters; then the ratios."""
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import requests

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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url, proc, what):
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.1)
    sys.exit(f"{what} did not come up")


def words(rng, n):
    vocab = ("the of and to in is that for it as with was on be by this are from at or an have not they which "
             "system assistant answer question policy customer order account service please always never "
             "information data report summary detail example rule must should may will can user reply").split()
    return " ".join(rng.choice(vocab) for _ in range(n))


def metric_sum(urls, name):
    total = 0.0
    for u in urls:
        for line in requests.get(u + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + "{"):
                total += float(line.split()[-1])
    return total


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


def main():
    procs = []
    try:
        reps, pubs = [], []
        for i in range(REPLICAS):
            port, pub = free_port(), free_port()
            p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", str(port), "-t", THREADS, "--kv-cache-memory", KV_MEM,
                                  "--prefix-caching-hash-algo", "sha256_cbor", "--prefix-caching-hash-seed", SEED,
                                  "--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "tcp://*:%d"}' % pub],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            reps.append(f"http://127.0.0.1:{port}")
            pubs.append(f"tcp://127.0.0.1:{pub}")
        for u, p in zip(reps, procs):
            wait_up(u + "/health", p, "replica")
        model = requests.get(reps[0] + "/v1/models").json()["data"][0]["id"]
        routers = {}
        for name, extra in (("round-robin", ["--weights", "prefix=0,queue=0,kv=0,active=0"]),
                            ("prefix-aware", ["--kv-events", ",".join(pubs), "--prefix-caching-hash-algo", "sha256_cbor",
                                              "--prefix-caching-hash-seed", SEED])):
            port = free_port()
            p = subprocess.Popen([BIN, "router", "--backends", ",".join(reps), "--port", str(port), *extra],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            routers[name] = f"http://127.0.0.1:{port}"
            wait_up(routers[name] + "/health", p, "router")
        time.sleep(0.5)
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
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
