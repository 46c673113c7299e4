"""What llm-d's endpoint picker (EPP) and a Kubernetes probe read from `osprey serve`.

EPP's scorers scrape /metrics (Prometheus text format 0.0.4) for vLLM's gauges by their exact names:
vllm:num_requests_waiting (queue scorer), vllm:num_requests_running and vllm:kv_cache_usage_perc
(KV-cache utilization scorer, 0..1). Each must be declared `# TYPE <name> gauge` and have one sample
named exactly <name> (no _total suffix) carrying model_name, and they must move with the load: a long
request running holds KV blocks (usage > 0, running >= 1), a second one waits when --max-num-seqs is 1.

Probes: the HTTP port opens only after the model is loaded (the log says "model loaded" before
"serving"), /health answers 200 {"status": "ok"} then; on SIGTERM it answers 503 {"status":
"draining"} (a readiness probe fails, so the pod leaves the Service) while requests in flight finish,
/metrics stays answered, new generation requests get 503, and the process exits 0."""
import re
import signal
import time

import os

import pytest
import requests

from conftest import SMOL, TINY, Server


def scrape(url):
    r = requests.get(url + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    types, samples = {}, {}
    for line in r.text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)$", line)
        if m:
            types[m.group(1)] = m.group(2)
            continue
        if line.startswith("#") or not line:
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        assert m, f"not a Prometheus sample: {line!r}"
        samples.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return types, samples


EPP_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")


def gauges(srv):
    types, samples = scrape(srv.url)
    out = {}
    for name in EPP_GAUGES:
        assert types.get(name) == "gauge", (name, types.get(name))
        assert len(samples.get(name, [])) == 1, (name, samples.get(name))
        labels, v = samples[name][0]
        assert f'model_name="{srv.model}"' in labels, labels
        out[name] = v
    assert 0.0 <= out["vllm:kv_cache_usage_perc"] <= 1.0
    return out


def test_epp_gauges_follow_the_load():
    s = Server(TINY, "--max-num-seqs", "1")
    try:
        idle = gauges(s)
        assert idle == {"vllm:num_requests_waiting": 0, "vllm:num_requests_running": 0,
                        "vllm:kv_cache_usage_perc": 0.0}, idle
        streams = [requests.post(s.url + "/v1/completions", stream=True, timeout=120,
                                 json={"prompt": f"load {k}", "max_tokens": 1500, "stream": True, "ignore_eos": True})
                   for k in range(2)]
        its = [r.iter_lines() for r in streams]
        next(its[0])
        deadline = time.time() + 30
        g = gauges(s)
        while (g["vllm:num_requests_running"] < 1 or g["vllm:num_requests_waiting"] < 1) and time.time() < deadline:
            time.sleep(0.02)
            g = gauges(s)
        assert g["vllm:num_requests_running"] == 1 and g["vllm:num_requests_waiting"] == 1, g
        assert g["vllm:kv_cache_usage_perc"] > 0.0, g
        for r in streams:
            r.close()
    finally:
        assert s.stop() == 0, s.read_log()[-3000:]


def test_probe_semantics_load_and_drain():
    # SmolLM2 generates slowly enough on the CPU that the drain is still on when /health is asked;
    # the client then leaves, which aborts its request and lets the drain end (finishing a request in
    # flight is test_api.py's test_sigterm_drains)
    if not os.path.exists(SMOL):
        pytest.skip(f"no SmolLM2 model at {SMOL} (make fetch)")
    s = Server(SMOL)
    try:
        log = s.read_log()
        assert log.index("model loaded") < log.index("serving "), log  # the port opens after the load
        h = requests.get(s.url + "/health", timeout=10)
        assert h.status_code == 200 and h.json()["status"] == "ok"
        r = requests.post(s.url + "/v1/completions", stream=True, timeout=120,
                          json={"prompt": "drain", "max_tokens": 2500, "stream": True, "ignore_eos": True})
        assert r.status_code == 200, r.text
        it = r.iter_lines()
        next(it)
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 30
        h = requests.get(s.url + "/health", timeout=10)
        while h.status_code == 200 and time.time() < deadline:
            time.sleep(0.01)
            h = requests.get(s.url + "/health", timeout=10)
        assert h.status_code == 503 and h.json()["status"] == "draining", h.text
        assert requests.get(s.url + "/metrics", timeout=10).status_code == 200  # still scraped while draining
        n = requests.post(s.url + "/v1/completions", json={"prompt": "new", "max_tokens": 1}, timeout=10)
        assert n.status_code == 503
        assert next(it) is not None  # the request in flight still streams
        r.close()
        assert s.proc.wait(timeout=60) == 0
    finally:
        s.stop()
