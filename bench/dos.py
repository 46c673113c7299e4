#!/usr/bin/env python3
"""The three denial-of-service figures of issue 20, measured against one `osprey serve` binary, in the
shape the issue measured them before the fixes:

1. abandoned: a non-streaming request (max_tokens 2000, ignore_eos) whose client gives up after 2 s:
   seconds from the client's close until the server counts the request aborted and every KV block is
   free, and how many tokens it generated after the close (the issue: the slot and blocks were held
   for 40 s, to max_tokens).
2. templates: 8 concurrent requests, each with a one-line chat_template that doubles a string 25
   times (32 MiB), against a server started with --trust-request-chat-template; the server's peak RSS
   while they run, and the same requests without the flag (the issue: RSS 664 MB -> 4.4 GB in 13 s).
3. flood: 4,200 half-sent requests held open from one client address (127.0.0.2), then /health and a
   completion from another (127.0.0.1): their status and latency, and the server's threads (the
   issue: /health was locked out).

Usage: bench/dos.py [--bin build/bin/osprey] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
Prints one line per figure. No assertion: tests/integration/test_dos.py asserts the behaviour; this
gives the numbers for the issue's before/after comparison.
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import requests

from procs import free_port  # bench/procs.py

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))



class Server:
    def __init__(self, binary, model, *extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(f"/tmp/osprey-dos-{self.port}.log", "w+")
        self.proc = subprocess.Popen([binary, "serve", "-m", model, "--port", str(self.port), "-t", "2", "--served-model-name", "m", *extra],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                sys.exit("server exited: " + self.log.read()[-2000:])
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.1)
        sys.exit("server did not come up")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def health(self):
        return requests.get(self.url + "/health", timeout=10).json()

    def metric(self, name, **labels):
        total = 0.0
        for line in requests.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                if all(f'{k}="{v}"' in line for k, v in labels.items()):
                    total += float(line.split()[-1])
        return total

    def rss_mb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def threads(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))


def abandoned(binary, model):
    s = Server(binary, model)
    try:
        ab0 = s.metric("vllm:request_success_total", finished_reason="abort")
        body = json.dumps({"model": "m", "prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True}).encode()
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(2.0)  # the client gives up after 2 s
        gen_at_close = s.metric("vllm:generation_tokens_total")
        c.close()
        t0 = time.time()
        while time.time() - t0 < 120:
            h = s.health()
            if (s.metric("vllm:request_success_total", finished_reason="abort") > ab0
                    and h["kv_cache_free_blocks"] == h["kv_cache_total_blocks"] and h["num_requests_running"] == 0):
                break
            time.sleep(0.02)
        dt = time.time() - t0
        after = s.metric("vllm:generation_tokens_total") - gen_at_close
        print(f"abandoned: aborted and every KV block free {dt:.2f} s after the client closed; "
              f"{after:.0f} tokens generated after the close (max_tokens 2000)")
    finally:
        s.stop()


def templates(binary, model):
    tmpl = ("{% set ns = namespace(s='x') %}{% for i in range(25) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
            "{{ ns.s|length }}")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "chat_template": tmpl}
    for trusted in (True, False):
        s = Server(binary, model, *(["--trust-request-chat-template"] if trusted else []))
        try:
            rss0, peak, codes = s.rss_mb(), s.rss_mb(), []
            done = threading.Event()

            def sample():
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, s.rss_mb())
                    time.sleep(0.01)

            th = threading.Thread(target=sample)
            th.start()
            t0 = time.time()
            workers = [threading.Thread(target=lambda: codes.append(
                requests.post(s.url + "/v1/chat/completions", json=body, timeout=120).status_code)) for _ in range(8)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            dt = time.time() - t0
            done.set()
            th.join()
            ok = requests.post(s.url + "/v1/completions", json={"model": "m", "prompt": "a", "max_tokens": 2},
                               timeout=60).status_code
            print(f"templates ({'--trust-request-chat-template' if trusted else 'default'}): 8 at once -> "
                  f"{sorted(codes)} in {dt:.2f} s; RSS {rss0:.0f} MB -> peak {peak:.0f} MB; a completion after: {ok}")
        finally:
            s.stop()


def flood(binary, model, n=4200):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 512)), hard))
    s = Server(binary, model)
    conns = []
    try:
        th0 = s.threads()
        half = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        refused = 0
        for _ in range(n):
            c = socket.socket()
            c.bind(("127.0.0.2", 0))
            c.settimeout(5)
            try:
                c.connect(("127.0.0.1", s.port))
                c.sendall(half)
            except OSError:
                refused += 1
            conns.append(c)
        time.sleep(1.0)
        t0 = time.time()
        try:
            hc = requests.get(s.url + "/health", timeout=10).status_code
        except requests.RequestException as e:
            hc = type(e).__name__
        th = time.time() - t0
        t0 = time.time()
        try:
            cc = requests.post(s.url + "/v1/completions", json={"model": "m", "prompt": "a", "max_tokens": 4},
                               timeout=30).status_code
        except requests.RequestException as e:
            cc = type(e).__name__
        tc = time.time() - t0
        print(f"flood: {n} half-sent requests from 127.0.0.2 ({refused} refused at connect or send); then from "
              f"127.0.0.1 /health {hc} in {th * 1000:.0f} ms, a completion {cc} in {tc * 1000:.0f} ms; server threads "
              f"{th0} -> {s.threads()}")
    finally:
        for c in conns:
            c.close()
        s.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "osprey"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    a = ap.parse_args()
    print(f"# {a.bin} ({subprocess.run([a.bin, '--version'], capture_output=True, text=True).stdout.splitlines()[0]}), "
          f"model {os.path.basename(a.model)}, load {os.getloadavg()[0]:.1f}")
    abandoned(a.bin, a.model)
    templates(a.bin, a.model)
    flood(a.bin, a.model)


if __name__ == "__main__":
    main()
