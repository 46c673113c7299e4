"""`osprey router` in front of fake backends (Python http.server speaking just enough of osprey serve:
/health, /metrics with the vLLM gauges the picker reads, /v1/models, POST /v1/completions) and in
front of two real `osprey serve` processes.

Checks: an SSE stream reaches the client byte for byte (chunked on the backend side, decoded and
passed through); requests sharing a long prefix stick to one backend while another prefix goes to
the other; a backend whose queue passes --hot-queue stops winning on prefix; the shorter queue wins a
new prefix; a backend that stopped listening is skipped by a retry (osprey_router_retries_total
counts it) before the poller notices; a backend that dies mid-stream ends the client's SSE stream
with an error event; a client that disconnects makes the router close its backend connection; no
healthy backend means 503; real servers behind the router stream completions through it."""
import os
import subprocess
import time

import pytest
import requests

from conftest import BIN, TINY, Server, free_port, last_line, retry_port_clash
from fake_backend import FakeBackend

SSE = [b'data: {"id": "x", "choices": [{"text": "h\\u00e9llo"}]}\n\n', b": a comment line\n\n",
       b'data: {"id": "x", "choices": [{"text": " world"}]}\n\n', b"data: [DONE]\n\n"]


class Fake(FakeBackend):
    """A fake backend. mode: "sse" (the SSE chunks above), "die" (two chunks, then a reset),
    "slow" (a chunk every 50 ms until the client goes; records that it went)."""

    def __init__(self, name, model="m"):
        self.name = name
        self.prompts = []
        super().__init__("sse", model)

    def post(self, h, body):
        self.prompts.append(body.get("prompt"))
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        if self.mode == "sse":
            for c in SSE:
                h.chunk(c)
                time.sleep(0.01)
            h.wfile.write(b"0\r\n\r\n")
        elif self.mode == "die":
            h.chunk(SSE[0])
            h.chunk(SSE[1])
            h.reset()
        else:
            try:
                for _ in range(2000):
                    h.chunk(b"data: {}\n\n")
                    time.sleep(0.05)
            except OSError:
                self.client_gone.set()


class Router:
    def __init__(self, backends, *extra):
        retry_port_clash(lambda: self._launch(backends, extra))

    def _launch(self, backends, extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = f"/tmp/osprey-router-{self.port}.log"
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen([BIN, "router", "--backends", ",".join(backends), "--port", str(self.port), *extra],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                log = self.read_log()
                raise RuntimeError(f"router exited {self.proc.returncode}: {last_line(log)}\n{log}")
            try:
                requests.get(self.url + "/metrics", timeout=1)
                return
            except requests.RequestException:
                time.sleep(0.05)
        raise RuntimeError("router did not come up: " + self.read_log())

    def read_log(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def post(self, prompt, stream=True, **kw):
        return requests.post(self.url + "/v1/completions", json={"model": "m", "prompt": prompt, "stream": stream, **kw},
                             stream=True, timeout=30)

    def metric(self, name, backend):
        for line in requests.get(self.url + "/metrics", timeout=5).text.splitlines():
            if line.startswith(f'{name}{{backend="{backend}"}}'):
                return float(line.split()[-1])
        raise KeyError(name)

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(timeout=30)
        self.log.close()
        return rc


@pytest.fixture
def fakes():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    fs = [Fake("a"), Fake("b")]
    yield fs
    for f in fs:
        f.close()


LONG_A = "You are a helpful assistant for the Acme company. Answer briefly and politely. " * 4
LONG_B = "System: translate everything the user says into French, keeping the punctuation. " * 4


def test_sse_byte_for_byte(fakes):
    r = Router([f.url for f in fakes])
    try:
        resp = r.post("hello")
        assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.raw.read() == b"".join(SSE)
    finally:
        assert r.stop() == 0


def test_an_escaped_nul_matches_no_route(fakes):
    # the router unescapes as osprey serve does (tools/server/url.h): /v1/models%00x is not /v1/models
    r = Router([f.url for f in fakes])
    try:
        for path in ("/v1/models%00x", "/health%00", "/metrics%00"):
            assert requests.get(r.url + path, timeout=10).status_code == 404, path
        assert requests.post(r.url + "/v1/completions%00", json={"prompt": "a"}, timeout=10).status_code == 404
        assert requests.get(r.url + "/v1/mod%65ls", timeout=10).status_code == 200
    finally:
        assert r.stop() == 0


def test_wrong_method_is_405_with_allow(fakes):
    # RFC 9110 15.5.6: a known path with a method it does not take is 405 with Allow (osprey serve does
    # the same); HEAD is served wherever GET is; an unknown path stays 404
    r = Router([f.url for f in fakes])
    try:
        for path in ("/v1/completions", "/v1/chat/completions"):
            resp = requests.get(r.url + path, timeout=10)
            assert resp.status_code == 405 and resp.headers["Allow"] == "POST", path
            assert resp.json()["error"]["code"] == 405
        for path in ("/health", "/metrics", "/v1/models"):
            resp = requests.post(r.url + path, json={}, timeout=10)
            assert resp.status_code == 405 and resp.headers["Allow"] == "GET, HEAD", path
            head = requests.head(r.url + path, timeout=10)  # /health: 503 until a backend is polled healthy
            assert head.status_code in ((200, 503) if path == "/health" else (200,)) and head.content == b"", path
        assert requests.delete(r.url + "/v1/models", timeout=10).status_code == 405
        assert requests.get(r.url + "/v1/nothing", timeout=10).status_code == 404
        assert requests.post(r.url + "/v1/nothing", json={}, timeout=10).status_code == 404
    finally:
        assert r.stop() == 0


def test_prefix_affinity_and_hot_spot(fakes):
    a, b = fakes
    r = Router([a.url, b.url], "--poll-interval", "50")
    try:
        for i in range(4):
            for base in (LONG_A, LONG_B):
                assert r.post(base + f" question {i}").raw.read() == b"".join(SSE)
        a_on = {("a" if (LONG_A + f" question {i}") in a.prompts else "b") for i in range(4)}
        b_on = {("a" if (LONG_B + f" question {i}") in a.prompts else "b") for i in range(4)}
        assert len(a_on) == 1 and len(b_on) == 1 and a_on != b_on, (a_on, b_on)
        # the backend holding prefix A turns into a hot spot: A's next request goes to the other one
        hot = a if a_on == {"a"} else b
        other = b if hot is a else a
        hot.waiting = 20
        time.sleep(0.3)  # a few polls
        n_other = len(other.prompts)
        r.post(LONG_A + " question 99").raw.read()
        assert len(other.prompts) == n_other + 1 and other.prompts[-1].endswith("question 99")
    finally:
        assert r.stop() == 0


def test_shorter_queue_wins_new_prefix(fakes):
    a, b = fakes
    a.waiting = 5
    r = Router([a.url, b.url], "--poll-interval", "50")
    try:
        for i in range(3):
            r.post(f"fresh prompt {i} " * 10).raw.read()
        assert len(b.prompts) == 3 and not a.prompts
    finally:
        assert r.stop() == 0


def test_retry_when_a_backend_stops_listening(fakes):
    a, b = fakes
    r = Router([a.url, b.url], "--poll-interval", "600000")  # the poller will not notice in time
    try:
        a.close()
        for i in range(4):
            resp = r.post(f"after the crash {i}")
            assert resp.status_code == 200 and resp.raw.read() == b"".join(SSE)
        assert len(b.prompts) == 4
        assert r.metric("osprey_router_retries_total", b.url) >= 1
        assert r.metric("osprey_router_backend_healthy", a.url) == 0
    finally:
        assert r.stop() == 0


def test_backend_dies_mid_stream(fakes):
    a, b = fakes
    a.mode = b.mode = "die"
    r = Router([a.url, b.url])
    try:
        got = r.post("doomed").raw.read()
        assert got.startswith(SSE[0] + SSE[1]), got
        assert b'"code": 502' in got[len(SSE[0] + SSE[1]):] and got.endswith(b"\n\n"), got
        assert r.metric("osprey_router_errors_total", a.url) + r.metric("osprey_router_errors_total", b.url) == 1
    finally:
        assert r.stop() == 0


def test_client_disconnect_closes_backend(fakes):
    a, b = fakes
    a.mode = b.mode = "slow"
    r = Router([a.url, b.url])
    try:
        resp = r.post("slow one")
        it = resp.iter_lines()
        next(it)
        resp.close()
        assert a.client_gone.wait(20) or b.client_gone.wait(1)
        deadline = time.time() + 10
        while time.time() < deadline and (r.metric("osprey_router_backend_active", a.url) +
                                          r.metric("osprey_router_backend_active", b.url)) > 0:
            time.sleep(0.05)
        assert r.metric("osprey_router_backend_active", a.url) + r.metric("osprey_router_backend_active", b.url) == 0
    finally:
        assert r.stop() == 0


def test_no_healthy_backend_is_503():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    r = Router([f"http://127.0.0.1:{free_port()}"])
    try:
        resp = r.post("nobody home", stream=False)
        assert resp.status_code == 503 and "no healthy backend" in resp.json()["error"]["message"]
        assert requests.get(r.url + "/health", timeout=5).status_code == 503
    finally:
        assert r.stop() == 0


def test_real_servers_behind_the_router():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    s1, s2 = Server(TINY), Server(TINY)
    r = None
    try:
        r = Router([s1.url, s2.url])
        models = requests.get(r.url + "/v1/models", timeout=5).json()["data"]
        assert [m["id"] for m in models] == [s1.model]
        import openai
        c = openai.OpenAI(base_url=r.url + "/v1", api_key="none", max_retries=0, timeout=60)
        direct = s1.client().completions.create(model=s1.model, prompt="The router", max_tokens=8, temperature=0)
        routed = c.completions.create(model=s1.model, prompt="The router", max_tokens=8, temperature=0)
        assert routed.choices[0].text == direct.choices[0].text
        text = "".join(ch.choices[0].text for ch in c.completions.create(
            model=s1.model, prompt="The router", max_tokens=8, temperature=0, stream=True) if ch.choices)
        assert text == direct.choices[0].text
    finally:
        if r:
            assert r.stop() == 0
        assert s1.stop() == 0 and s2.stop() == 0


def test_precise_prefix_from_kv_events():
    """Two real servers publishing KV events (sha256_cbor, one seed) and a router subscribed to both:
    a prompt sent to one server directly (the router never saw it) is routed to that server, because
    its KV events say it holds the prompt's blocks; another prompt cached on the other server goes
    there. The first request goes to the second server, where the tie-break alone (round robin from
    the first) would not send it."""
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    hash_args = ["--prefix-caching-hash-algo", "sha256_cbor", "--prefix-caching-hash-seed", "42"]

    def publishing_server():
        p = free_port()
        return Server(TINY, "--block-size", "16", *hash_args, "--kv-events-config",
                      '{"enable_kv_cache_events": true, "endpoint": "tcp://*:%d"}' % p, retry=False), p
    servers, pubs = zip(*[retry_port_clash(publishing_server) for _ in range(2)])
    r = None
    try:
        r = Router([s.url for s in servers], "--kv-events", ",".join(f"tcp://127.0.0.1:{p}" for p in pubs),
                   *hash_args, "--block-size", "16", "--log-level", "debug")
        time.sleep(0.5)  # the subscriptions reach the publishers
        prompts = ["Once upon a time in a land far away there lived a cat who liked to count the stars. " * 3,
                   "The committee met on Tuesday to discuss the budget for the new library building. " * 3]
        for s, p in zip(servers, prompts):  # prompt i cached on server i only, behind the router's back
            s.client().completions.create(model=s.model, prompt=p, max_tokens=1, temperature=0)
        deadline = time.time() + 20
        while time.time() < deadline and min(r.metric("osprey_router_kv_blocks", s.url) for s in servers) < 3:
            time.sleep(0.05)
        assert min(r.metric("osprey_router_kv_blocks", s.url) for s in servers) >= 3, r.read_log()[-2000:]
        for rep in range(3):
            for s, p in reversed(list(zip(servers, prompts))):
                resp = requests.post(r.url + "/v1/completions", timeout=60,
                                     json={"model": s.model, "prompt": p + f" and then {rep}", "max_tokens": 1})
                assert resp.status_code == 200, resp.text
                assert resp.headers["X-Osprey-Backend"] == s.url, (rep, resp.headers["X-Osprey-Backend"], s.url)
        assert r.metric("osprey_router_kv_event_gaps_total", servers[0].url) == 0
        assert "blocks)" in r.read_log()  # scored by blocks from the events, not by prompt chunks
    finally:
        if r:
            assert r.stop() == 0
        for s in servers:
            assert s.stop() == 0
