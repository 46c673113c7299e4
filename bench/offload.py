"""Tiered KV offload (issue 18): time to first token of a long prompt whose prefix blocks the KV pool
evicted, served from the disk tier (`--kv-offload-disk`) against recomputing it (no tier), one run, the
same server binary and model.

For each mode a fresh `osprey serve` with a KV cache that holds about one long prompt: prompt P (cold),
then prompts Q1..Qk (other text, each evicting P's blocks), then P again, timed (max_tokens 1, so the
request's latency is its TTFT). Repeated REPS times with new P/Q texts; medians reported. In the tier
mode the disk files are the page cache's (a warm local disk); the cost model decides as in serving
unless ALWAYS_LOAD=1. Standard library only.

Environment: OSPREY_BIN (build/bin/osprey), MODEL (the default SmolLM2), THREADS (2), WORDS (prompt words,
1500), KV_MEM (48M), REPS (5), ALWAYS_LOAD (0), DEVICE (cpu; cuda for the GPU), MODES (the tiers timed
against recomputing: disk, or host (--kv-offloading-size HOST_GIB, GPU only), comma-separated; default
disk), HOST_GIB (8)."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from procs import free_port  # bench/procs.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("OSPREY_BIN", os.path.join(ROOT, "build", "bin", "osprey"))
MODEL = os.environ.get("MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
THREADS = os.environ.get("THREADS", "2")
WORDS = int(os.environ.get("WORDS", "1500"))
KV_MEM = os.environ.get("KV_MEM", "48M")
REPS = int(os.environ.get("REPS", "5"))
DEVICE = os.environ.get("DEVICE", "cpu")
MODES = [m for m in os.environ.get("MODES", "disk").split(",") if m]
HOST_GIB = os.environ.get("HOST_GIB", "8")



def text(seed, n):
    vocab = ["river", "stone", "lamp", "orange", "quiet", "north", "paper", "violin", "seven", "garden",
             "cloud", "iron", "maple", "signal", "harbor", "velvet", "pencil", "summer", "copper", "window"]
    x = seed * 2654435761 % 2**32
    out = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(vocab[x % len(vocab)])
    return " ".join(out)


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t0, out


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


def run(mode, tier_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [BIN, "serve", "-m", MODEL, "--port", str(port), "-t", THREADS, "--kv-cache-memory", KV_MEM,
           "--prefix-caching-hash-seed", "1", "--device", DEVICE]
    if mode == "disk":
        cmd += ["--kv-offload-disk", tier_dir, "--kv-offload-disk-size", "4"]
    if mode == "host":
        cmd += ["--kv-offloading-size", HOST_GIB]
    log = open(os.path.join(tempfile.gettempdir(), f"osprey-offload-bench-{os.getpid()}-{mode}.log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
            model = json.loads(r.read())["data"][0]["id"]
        ttft, texts = [], []
        for rep in range(REPS):
            body = lambda prompt: {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            P = text(1000 + rep, WORDS)
            post(url + "/v1/completions", body(P))
            for k in range(2):
                post(url + "/v1/completions", body(text(2000 + 10 * rep + k, WORDS)))
            t, out = post(url + "/v1/completions", body(P))
            ttft.append(t)
            texts.append(out["choices"][0]["text"])
        hits = metric(url, "osprey:kv_offload_hit_tokens_total")
        prompt_tokens = out["usage"]["prompt_tokens"]
        return ttft, texts, hits, prompt_tokens
    finally:
        p.terminate()
        p.wait(timeout=60)
        log.close()


def main():
    tier_dir = tempfile.mkdtemp(prefix="osprey-offload-bench-")
    try:
        cpu = "unknown"
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        print(f"# {BIN}, {os.path.basename(MODEL)}, device {DEVICE}, {THREADS} threads, KV cache {KV_MEM}, "
              f"{WORDS}-word prompts, {REPS} reps, CPU {cpu}")
        res = {}
        for mode in ["recompute"] + MODES:
            res[mode] = run(mode, tier_dir)
            t, _, hits, n = res[mode]
            print(f"{mode:10s} TTFT of the evicted prompt ({n} tokens): median {1e3 * statistics.median(t):8.1f} ms "
                  f"(min {1e3 * min(t):.1f}, max {1e3 * max(t):.1f}); tokens served by offload loads: {int(hits)}")
        ok = True
        for mode in MODES:
            same = res["recompute"][1] == res[mode][1]
            ratio = statistics.median(res["recompute"][0]) / statistics.median(res[mode][0])
            print(f"recompute / {mode} TTFT: {ratio:.2f}x; first tokens identical: {same}")
            ok &= same
        return 0 if ok else 1
    finally:
        shutil.rmtree(tier_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
