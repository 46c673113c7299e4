#!/usr/bin/env python3
"""Prefill/decode disaggregation against co-location, on one host (bench/pd.sh runs it).

Two setups, started once, each behind its own `osprey router`:
  P/D        one prefill server (kv_producer) and one decode server (kv_consumer), `--prefill-backends`
  co-located two plain servers behind the plain router
Every server gets THREADS threads (1 on the 2-core CI machine: both setups use the same two cores'
worth of servers), KV_MEM of KV cache, one --prefix-caching-hash-seed.

Workload: open-loop Poisson arrivals at each of RATES requests/s for DURATION seconds (seeded; the same
arrival times and prompts for both setups at a rate), each request a unique ~PROMPT_WORDS-word prompt
(no shared prefix: the prefix cache does not help), MAX_TOKENS generated tokens (ignore_eos), greedy,
streamed. Requests still running DRAIN seconds after the last arrival are cancelled (the client closes
the connection; counted as unfinished; the TTFT of one that had its first token still counts). The setups run one after the other at each rate.

Printed per setup and rate: requests finished / sent, TTFT (first streamed token, client side) mean /
p50 / p90, TPOT ((last - first token) / (tokens - 1)) mean / p50 / p90, output tokens/s; for P/D also
the router's mean prefill time (osprey_router_pd_prefill_seconds) and the KV transfer time from the
decode server (osprey:kv_transfer_recv_seconds_total over its received blocks and per request). Then
the same as a Markdown table for bench/RESULTS.md."""
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import threading
import time

import requests

from percentile import nearest_rank  # bench/percentile.py
from procs import free_port, metric_sum, stop, wait_up  # bench/procs.py

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("OSPREY_BIN", os.path.join(ROOT, "build", "bin", "osprey"))
MODEL = os.environ.get("MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
RATES = [float(x) for x in os.environ.get("RATES", "0.1,0.2,0.3,0.4").split(",")]
DURATION = float(os.environ.get("DURATION", "40"))
DRAIN = float(os.environ.get("DRAIN", "20"))
PROMPT_WORDS = int(os.environ.get("PROMPT_WORDS", "950"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "64"))
THREADS = os.environ.get("THREADS", "1")
KV_MEM = os.environ.get("KV_MEM", "512M")
SEQUENTIAL = os.environ.get("SEQUENTIAL", "0") == "1"
SETUPS = os.environ.get("SETUPS", "pd,colo").split(",")  # "pd" alone: only the P/D pair (e.g. IPC vs TCP)
SERVE_EXTRA = os.environ.get("SERVE_EXTRA", "").split()  # more `osprey serve` flags, e.g. "--device cuda"
SEED = "7"


def serve(procs, *extra):
    port = free_port()
    log_path = f"/tmp/osprey-pd-bench-{os.getpid()}-{port}.log"
    with open(log_path, "w") as log:
        p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", str(port), "-t", THREADS, "--kv-cache-memory", KV_MEM,
                              "--prefix-caching-hash-seed", SEED, *SERVE_EXTRA, *extra], stdout=log, stderr=subprocess.STDOUT)
    p.log_path = log_path  # its start-up lines, shown if it exits before it is up
    procs.append(p)
    url = f"http://127.0.0.1:{port}"
    wait_up(url + "/health", p, "server " + " ".join(extra))
    return url


def router(procs, *args):
    port = free_port()
    p = subprocess.Popen([BIN, "router", "--port", str(port), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(p)
    url = f"http://127.0.0.1:{port}"
    wait_up(url + "/health", p, "router")
    return url


def kv(role):
    return json.dumps({"kv_connector": "OspreyConnector", "kv_role": role, "kv_ip": "127.0.0.1", "kv_port": 0})


VOCAB = ("the of and to in is that for it as with was on be by this are from at or an have not they which system "
         "assistant answer question policy customer order account service please always never information data "
         "report summary detail example rule must should may will can user reply river mountain city garden "
         "window table music paper light water stone green quiet early").split()


def workload(rate):
    rng = random.Random(int(rate * 1000) + 17)
    t, jobs = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t > DURATION:
            break
        prompt = f"Document {len(jobs)} at rate {rate}: " + " ".join(rng.choice(VOCAB) for _ in range(PROMPT_WORDS))
        jobs.append((t, prompt + "\nSummary:"))
    return jobs


def phase(setup, url, model, rate, jobs):
    ttft, tpot, errors, ntok, ptok, lock = [], [], [], [0], [], threading.Lock()
    cutoff = [None]
    conns = []

    def one(start, prompt):
        time.sleep(max(0.0, t0 + start - time.time()))
        ts = time.time()
        host, port = url.split("//")[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=DURATION + DRAIN + 60)
        first = None
        try:
            with lock:
                if cutoff[0]:
                    raise RuntimeError("cancelled before sending")
                conns.append(conn)
            conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                         body=json.dumps({"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True,
                                          "stream_options": {"include_usage": True}, "temperature": 0,
                                          "ignore_eos": True}))
            r = conn.getresponse()
            if r.status != 200:
                raise RuntimeError(f"{r.status} {r.read()[:120]}")
            last = usage = None
            while True:
                line = r.readline()
                if not line:
                    break
                if not line.startswith(b"data: {"):
                    continue
                d = json.loads(line[6:])
                if d.get("usage"):
                    usage = d["usage"]
                if d.get("choices") and d["choices"][0].get("text"):
                    last = time.time()
                    first = first or last
            if first is None or not usage:
                raise RuntimeError("no tokens")
            with lock:
                ttft.append(first - ts)
                if usage["completion_tokens"] > 1:
                    tpot.append((last - first) / (usage["completion_tokens"] - 1))
                ntok[0] += usage["completion_tokens"]
                ptok.append(usage["prompt_tokens"])
        except Exception as e:  # a failed or cancelled request is counted, not hidden
            with lock:
                errors.append("cancelled" if cutoff[0] else repr(e)[:160])
                if first is not None:  # cancelled after its first token: its TTFT counts (no survivor bias)
                    ttft.append(first - ts)
        finally:
            conn.close()

    before = {k: metric_sum([url], k) for k in ("osprey_router_pd_prefill_seconds_sum", "osprey_router_pd_prefill_seconds_count")}
    dec = setup.get("decode")
    xb = {k: metric_sum([dec], k) for k in ("osprey:kv_transfer_recv_seconds_total", "osprey:kv_transfer_recv_blocks_total",
                                      "osprey:kv_transfer_failed_blocks_total", "osprey:kv_transfer_ipc_blocks_total")} if dec else {}
    t0 = time.time() + 0.2
    threads = [threading.Thread(target=one, args=j, daemon=True) for j in jobs]
    for th in threads:
        th.start()
    end = t0 + (jobs[-1][0] if jobs else 0) + DRAIN
    for th in threads:
        th.join(max(0.0, end - time.time()))
    if any(th.is_alive() for th in threads):
        cutoff[0] = True
        with lock:
            for c in conns:  # cancel: the router sees the client go and aborts the backend request
                try:
                    c.sock.shutdown(socket.SHUT_RDWR)
                except Exception:
                    pass
        for th in threads:
            th.join(30)
    wall = time.time() - t0
    row = {"setup": setup["name"], "rate": rate, "sent": len(jobs), "done": len(ptok), "errors": errors,
           "tps": ntok[0] / wall, "prompt_tokens": statistics.mean(ptok) if ptok else 0}
    for k, xs in (("ttft", sorted(ttft)), ("tpot", sorted(tpot))):
        row[k] = (statistics.mean(xs), nearest_rank(xs, 0.5), nearest_rank(xs, 0.9)) if xs else (float("nan"),) * 3
    n = metric_sum([url], "osprey_router_pd_prefill_seconds_count") - before["osprey_router_pd_prefill_seconds_count"]
    row["prefill"] = (metric_sum([url], "osprey_router_pd_prefill_seconds_sum") - before["osprey_router_pd_prefill_seconds_sum"]) / n \
        if n else None
    if dec:
        secs = metric_sum([dec], "osprey:kv_transfer_recv_seconds_total") - xb["osprey:kv_transfer_recv_seconds_total"]
        blocks = metric_sum([dec], "osprey:kv_transfer_recv_blocks_total") - xb["osprey:kv_transfer_recv_blocks_total"]
        row["xfer_block_ms"] = secs / blocks * 1000 if blocks else None
        row["xfer_req_ms"] = secs / n * 1000 if n else None
        row["xfer_blocks"] = blocks
        row["failed_blocks"] = metric_sum([dec], "osprey:kv_transfer_failed_blocks_total") - xb["osprey:kv_transfer_failed_blocks_total"]
        row["ipc_blocks"] = metric_sum([dec], "osprey:kv_transfer_ipc_blocks_total") - xb["osprey:kv_transfer_ipc_blocks_total"]
    print_row(row)
    for e in sorted(set(e for e in errors if e != "cancelled"))[:3]:
        print(f"#   error: {e}", flush=True)
    return row


def ms(x):
    return "-" if x is None or x != x else f"{x * 1000:.0f}"


def print_row(r):
    t, p = r["ttft"], r["tpot"]
    extra = ""
    if r.get("prefill") is not None:
        extra = f"  prefill {ms(r['prefill'])} ms"
    if r.get("xfer_block_ms") is not None:
        extra += f", KV pull {r['xfer_req_ms']:.1f} ms/req ({r['xfer_block_ms']:.2f} ms/block, {r['xfer_blocks']:.0f} blocks" \
                 f", {r['failed_blocks']:.0f} failed, {r.get('ipc_blocks', 0):.0f} by CUDA IPC)"
    print(f"{r['setup']:11s} {r['rate']:5.2f} {r['done']:4d}/{r['sent']:<4d} {ms(t[0]):>7s} {ms(t[1]):>6s} {ms(t[2]):>6s} "
          f"{ms(p[0]):>7s} {ms(p[1]):>6s} {ms(p[2]):>6s} {r['tps']:7.1f}{extra}", flush=True)


def start(procs, which):
    """The servers and router of one setup: "pd" (1 prefill + 1 decode) or "colo" (2 plain servers)."""
    if which == "pd":
        pre = serve(procs, "--kv-transfer-config", kv("kv_producer"))
        dec = serve(procs, "--kv-transfer-config", kv("kv_consumer"))
        return {"name": "P/D 1P+1D", "url": router(procs, "--backends", dec, "--prefill-backends", pre), "decode": dec,
                "models": dec}
    c1, c2 = serve(procs), serve(procs)
    return {"name": "co-located", "url": router(procs, "--backends", f"{c1},{c2}"), "models": c1}


def main():
    procs = []
    rows = []
    try:
        # SEQUENTIAL=1: one setup's servers at a time (one GPU holds two 8B servers, not four)
        setups = [[w] for w in SETUPS] if SEQUENTIAL else [SETUPS]
        header = False
        for group in setups:
            live = [start(procs, w) for w in group]
            model = requests.get(live[0]["models"] + "/v1/models").json()["data"][0]["id"]
            if not header:
                print(f"# {os.path.basename(MODEL)}, every server -t {THREADS} and KV {KV_MEM} {' '.join(SERVE_EXTRA)}; P/D: 1 "
                      f"prefill + 1 decode server, co-located: 2 servers; ~{PROMPT_WORDS}-word unique prompts, "
                      f"{MAX_TOKENS} tokens (ignore_eos, greedy, streamed); Poisson arrivals for {DURATION:g} s per rate, "
                      f"cancelled {DRAIN:g} s after the last arrival{'; the setups one after the other' if SEQUENTIAL else ''}")
                print(f"# {os.cpu_count()} CPUs; load average: {' '.join(open('/proc/loadavg').read().split()[:3])}")
                print("setup        rate done/sent  TTFT ms    p50    p90 TPOT ms    p50    p90   tok/s")
                header = True
            for rate in RATES:
                jobs = workload(rate)
                for s in live:
                    rows.append(phase(s, s["url"], model, rate, jobs))
                    time.sleep(1)
            stop(procs)
            procs = []
        ptoks = [r["prompt_tokens"] for r in rows if r["prompt_tokens"]]
        print(f"# prompt tokens per request: {statistics.mean(ptoks):.0f}" if ptoks else "# no request finished")
        print(f"# load average at the end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
        print()
        print("| setup | req/s | done/sent | TTFT mean / p50 / p90 ms | TPOT mean / p50 / p90 ms | out tok/s | "
              "prefill ms | KV pull ms/req (ms/block) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            t, p = r["ttft"], r["tpot"]
            xfer = f"{r['xfer_req_ms']:.1f} ({r['xfer_block_ms']:.2f})" if r.get("xfer_block_ms") is not None else "-"
            print(f"| {r['setup']} | {r['rate']:g} | {r['done']}/{r['sent']} | {ms(t[0])} / {ms(t[1])} / {ms(t[2])} | "
                  f"{ms(p[0])} / {ms(p[1])} / {ms(p[2])} | {r['tps']:.1f} | {ms(r.get('prefill'))} | {xfer} |")
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
