"""Prefill/decode disaggregation through `osprey router --prefill-backends` (vLLM's toy_proxy_server
flow, NixlConnector field names).

With fake backends (Python http.server): the prefill request the router sends (the client's body with
max_tokens 1, stream false, no stream_options / min_tokens, kv_transfer_params {"do_remote_decode":
true}); the decode request (the client's own body with the prefill answer's kv_transfer_params added,
verbatim; without them when the prefill answered null); a prefill's non-2xx answer passed to the client
as is; a prefill dying mid-answer is a 502 error JSON; a refused prefill backend is skipped for the next;
n > 1 goes straight to the decode pool (counted); a client's own kv_transfer_params are dropped; /health
wants a healthy backend in each pool; a client leaving during the prefill closes the prefill connection.

With real servers (a kv_producer, a kv_consumer and a co-located plain server, one hash seed): greedy
completions and chat, streamed or not, and seeded sampling give the co-located server's exact text
through the P/D router, for long prompts (blocks pulled) and a 5-token one (null kv_transfer_params);
the transfer counters move; a dead prefill server makes requests fail cleanly; a dead decode server
after the prefill answered is a clean error and the held transfer is dropped at its timeout; a pull from
nowhere is recomputed to the same text. Skipped when the binary has no --kv-transfer-config."""
import json
import os
import select
import signal
import socket
import subprocess
import time

import pytest
import requests

from conftest import BIN, SMOL, TINY, Server, free_port, retry_port_clash
from fake_backend import FakeBackend
from test_router import Router

PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "0123456789abcdef",
          "remote_host": "127.0.0.1", "remote_port": 4242, "remote_request_id": "fedcba9876543210",
          "remote_block_ids": [0, 1, 2, 3], "tp_size": 1}
SSE = [b'data: {"id": "d", "choices": [{"text": "decoded"}]}\n\n', b"data: [DONE]\n\n"]


class FakePD(FakeBackend):
    """A fake P/D backend recording the JSON bodies it was sent. mode (prefill): "ok" (a completion with
    PARAMS), "null" (kv_transfer_params null), "400" (an error answer), "die" (half an answer, then a
    reset), "hang" (no answer; records when the client closes the connection). Decode: SSE when the
    request streams, else a JSON completion."""

    def __init__(self, mode="ok", model="m"):
        self.bodies = []
        super().__init__(mode, model)

    def post(self, h, body):
        self.bodies.append(body)
        if self.mode == "decode":
            if body.get("stream"):
                h.send_response(200)
                h.send_header("Content-Type", "text/event-stream")
                h.end_headers()
                for c in SSE:
                    h.wfile.write(c)
            else:
                h.send_text(200, '{"id": "d", "choices": [{"text": "decoded"}]}')
        elif self.mode in ("ok", "null"):
            h.send_text(200, json.dumps({"id": "p", "object": "text_completion",
                                         "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                                         "kv_transfer_params": PARAMS if self.mode == "ok" else None}))
        elif self.mode == "400":
            h.send_text(400, '{"error": {"message": "bad prompt", "type": "BadRequestError", "code": 400}}')
        elif self.mode == "die":
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", "1000")
            h.end_headers()
            h.wfile.write(b'{"id": "p", "choi')
            h.wfile.flush()
            h.reset()
        elif self.mode == "hang":
            deadline = time.time() + 30
            while time.time() < deadline:
                if select.select([h.connection], [], [], 0.05)[0]:
                    if not h.connection.recv(1, socket.MSG_PEEK):
                        self.client_gone.set()
                        return
            h.send_text(500, "{}")


def need_bin():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")


@pytest.fixture
def pd():
    need_bin()
    fs = {"p": FakePD("ok"), "d": FakePD("decode")}
    yield fs
    for f in fs.values():
        f.close()


def pd_router(decode, prefill, *extra):
    return Router([f.url for f in decode], "--prefill-backends", ",".join(f.url for f in prefill), *extra)


def router_metric(r, line_prefix):
    for line in requests.get(r.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.split()[-1])
    raise KeyError(line_prefix)


def test_prefill_request_and_decode_request(pd):
    p, d = pd["p"], pd["d"]
    r = pd_router([d], [p])
    try:
        req = {"model": "m", "prompt": "hello there", "max_tokens": 50, "stream": True,
               "stream_options": {"include_usage": True}, "min_tokens": 3, "temperature": 0.8, "seed": 1234}
        resp = requests.post(r.url + "/v1/completions", json=req, stream=True, timeout=30)
        assert resp.status_code == 200 and resp.raw.read() == b"".join(SSE)
        assert resp.headers["X-Osprey-Backend"] == d.url and resp.headers["X-Osprey-Prefill-Backend"] == p.url
        want_p = {k: v for k, v in req.items() if k not in ("stream_options", "min_tokens")}
        want_p.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
        assert p.bodies == [want_p]
        assert d.bodies == [{**req, "kv_transfer_params": PARAMS}]  # the prefill's params, verbatim
        # chat: max_completion_tokens is cut to 1 too; not streamed: a JSON answer
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
        resp = requests.post(r.url + "/v1/chat/completions", json=chat, timeout=30)
        assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "decoded"
        assert p.bodies[1] == {**chat, "max_completion_tokens": 1, "max_tokens": 1, "stream": False,
                               "kv_transfer_params": {"do_remote_decode": True}}
        assert d.bodies[1] == {**chat, "kv_transfer_params": PARAMS}
        assert router_metric(r, "osprey_router_pd_requests_total") == 2
        assert router_metric(r, "osprey_router_pd_prefill_seconds_count") == 2
        assert r.metric("osprey_router_requests_total", p.url) == 2 and r.metric("osprey_router_requests_total", d.url) == 2
        assert 'osprey_router_backend_pool{backend="%s",pool="prefill"} 1' % p.url in \
            requests.get(r.url + "/metrics", timeout=5).text
    finally:
        assert r.stop() == 0


def test_null_params_send_the_original_request(pd):
    p, d = pd["p"], pd["d"]
    p.mode = "null"
    r = pd_router([d], [p])
    try:
        raw = b'{"model": "m", "prompt": "hi",   "max_tokens": 7}'
        resp = requests.post(r.url + "/v1/completions", data=raw, headers={"Content-Type": "application/json"}, timeout=30)
        assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "decoded"
        assert len(p.bodies) == 1 and d.bodies == [json.loads(raw)]
        assert router_metric(r, 'osprey_router_pd_fallback_total{reason="no_transfer"}') == 1
    finally:
        assert r.stop() == 0


def test_prefill_error_passes_through(pd):
    p, d = pd["p"], pd["d"]
    p.mode = "400"
    r = pd_router([d], [p])
    try:
        resp = requests.post(r.url + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=30)
        assert resp.status_code == 400 and resp.json()["error"]["message"] == "bad prompt"
        assert not d.bodies
        assert router_metric(r, "osprey_router_pd_prefill_rejected_total") == 1
    finally:
        assert r.stop() == 0


def test_prefill_dying_is_a_502(pd):
    p, d = pd["p"], pd["d"]
    p.mode = "die"
    r = pd_router([d], [p])
    try:
        for stream in (False, True):
            resp = requests.post(r.url + "/v1/completions", json={"model": "m", "prompt": "x", "stream": stream}, timeout=30)
            assert resp.status_code == 502 and resp.headers["Content-Type"] == "application/json"
            assert resp.json()["error"]["code"] == 502 and "prefill" in resp.json()["error"]["message"]
        assert not d.bodies
        assert r.metric("osprey_router_errors_total", p.url) == 2
    finally:
        assert r.stop() == 0


def test_refused_prefill_backend_is_skipped(pd):
    p, d = pd["p"], pd["d"]
    dead = FakePD("ok")
    dead.close()
    r = pd_router([d], [dead, p], "--poll-interval", "600000")  # the poller will not notice in time
    try:
        for i in range(3):
            resp = requests.post(r.url + "/v1/completions", json={"model": "m", "prompt": f"q{i}"}, timeout=30)
            assert resp.status_code == 200, resp.text
        assert len(p.bodies) == 3 and len(d.bodies) == 3
        assert r.metric("osprey_router_backend_healthy", dead.url) == 0
    finally:
        assert r.stop() == 0


def test_n_above_1_goes_straight_to_decode(pd):
    p, d = pd["p"], pd["d"]
    r = pd_router([d], [p])
    try:
        raw = b'{"model": "m", "prompt": "many", "n": 2, "max_tokens": 4}'
        resp = requests.post(r.url + "/v1/completions", data=raw, headers={"Content-Type": "application/json"}, timeout=30)
        assert resp.status_code == 200
        assert not p.bodies and d.bodies == [json.loads(raw)]
        assert resp.headers.get("X-Osprey-Prefill-Backend") is None
        assert router_metric(r, 'osprey_router_pd_fallback_total{reason="n"}') == 1
        assert router_metric(r, "osprey_router_pd_requests_total") == 0
        # several prompts in one request: the same (a list of token ids is one prompt)
        for prompt, n_d in ((["a", "b"], 2), ([1, 2, 3], 3)):
            resp = requests.post(r.url + "/v1/completions", json={"model": "m", "prompt": prompt}, timeout=30)
            assert resp.status_code == 200 and len(d.bodies) == n_d
        assert router_metric(r, 'osprey_router_pd_fallback_total{reason="prompts"}') == 1
        assert len(p.bodies) == 1 and router_metric(r, "osprey_router_pd_requests_total") == 1
    finally:
        assert r.stop() == 0


def test_client_params_are_dropped(pd):
    p, d = pd["p"], pd["d"]
    r = pd_router([d], [p])
    try:
        evil = {"do_remote_prefill": True, "remote_host": "10.0.0.1", "remote_port": 1}
        resp = requests.post(r.url + "/v1/completions", timeout=30,
                             json={"model": "m", "prompt": "x", "kv_transfer_params": evil})
        assert resp.status_code == 200
        assert p.bodies[0]["kv_transfer_params"] == {"do_remote_decode": True}
        assert d.bodies[0]["kv_transfer_params"] == PARAMS
    finally:
        assert r.stop() == 0


def test_no_prefill_backend_goes_to_decode(pd):
    """The prefill pool down: the router stays healthy and the decode pool computes whole requests."""
    p, d = pd["p"], pd["d"]
    r = pd_router([d], [p], "--poll-interval", "50")
    try:
        assert requests.get(r.url + "/health", timeout=5).status_code == 200
        p.close()
        deadline = time.time() + 10
        while time.time() < deadline and router_metric(r, 'osprey_router_backend_healthy{backend="%s"}' % p.url) != 0:
            time.sleep(0.05)
        assert requests.get(r.url + "/health", timeout=5).status_code == 200
        n0 = len(d.bodies)
        resp = requests.post(r.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 5}, timeout=30)
        assert resp.status_code == 200, resp.text
        assert len(d.bodies) == n0 + 1 and "kv_transfer_params" not in d.bodies[-1]
        assert d.bodies[-1]["max_tokens"] == 5
        assert router_metric(r, 'osprey_router_pd_fallback_total{reason="no_prefill"}') == 1
    finally:
        pd["p"] = FakePD("ok")  # the fixture closes it
        assert r.stop() == 0


def test_client_leaving_during_prefill_closes_it(pd):
    p, d = pd["p"], pd["d"]
    p.mode = "hang"
    r = pd_router([d], [p])
    try:
        s = socket.create_connection(("127.0.0.1", r.port))
        body = b'{"model": "m", "prompt": "wait for me"}'
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.time() + 10
        while time.time() < deadline and not p.bodies:
            time.sleep(0.02)
        assert p.bodies
        s.close()
        assert p.client_gone.wait(10)
        deadline = time.time() + 10
        while time.time() < deadline and r.metric("osprey_router_backend_active", p.url) > 0:
            time.sleep(0.05)
        assert r.metric("osprey_router_backend_active", p.url) == 0 and not d.bodies
    finally:
        assert r.stop() == 0


def test_flags_are_checked():
    need_bin()
    out = subprocess.run([BIN, "router", "--help"], capture_output=True, text=True)
    assert "--prefill-backends" in out.stdout and "--prefill-timeout" in out.stdout
    bad = subprocess.run([BIN, "router", "--backends", "http://127.0.0.1:9", "--prefill-backends", "http://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "both pools" in bad.stderr


# ---- real servers ------------------------------------------------------------------------------

def has_pd():
    if not os.path.exists(BIN):
        return False
    out = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=30)
    return "--kv-transfer-config" in out.stdout + out.stderr


def kv_config(role, extra=None):
    c = {"kv_connector": "OspreyConnector", "kv_role": role, "kv_ip": "127.0.0.1", "kv_port": 0}
    if extra:
        c["kv_connector_extra_config"] = extra
    return json.dumps(c)


def metric(server, name):
    for line in requests.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def wait_metric(server, name, ok, timeout=20):
    deadline = time.time() + timeout
    v = metric(server, name)
    while time.time() < deadline and not ok(v):
        time.sleep(0.05)
        v = metric(server, name)
    assert ok(v), (name, v)
    return v


SEED = ["--prefix-caching-hash-seed", "7"]


class Trio:
    """A prefill server, a decode server and a co-located one (one model, one seed), and the router."""

    def __init__(self, model, timeout_s=None, poll="200", name=None):
        extra = {"timeout_s": timeout_s} if timeout_s else None
        name = ["--served-model-name", name] if name else []
        self.servers = []
        try:
            self.prefill = self.add(Server(model, *SEED, *name, "--kv-transfer-config", kv_config("kv_producer", extra)))
            self.decode = self.add(Server(model, *SEED, *name, "--kv-transfer-config", kv_config("kv_consumer")))
            self.colo = self.add(Server(model, *SEED, *name))
            self.router = Router([self.decode.url], "--prefill-backends", self.prefill.url, "--poll-interval", poll)
        except BaseException:
            self.stop(check=False)
            raise

    def add(self, s):
        self.servers.append(s)
        return s

    def client(self):
        import openai
        return openai.OpenAI(base_url=self.router.url + "/v1", api_key="none", max_retries=0, timeout=120)

    def stop(self, check=True):
        r = getattr(self, "router", None)
        if r:
            assert r.stop() == 0 or not check
        for s in self.servers:
            rc = s.stop()
            assert rc in (0, -signal.SIGKILL) or not check, s.read_log()[-3000:]


def long_prompt(i, words=60):
    return f"Story {i}: " + " ".join(f"the {w}{i} walked to the market" for w in range(words // 6 + 1))[:words * 6]


@pytest.fixture(scope="module")
def trio():
    if not has_pd():
        pytest.skip("osprey serve has no --kv-transfer-config (P/D disaggregation) in this build")
    t = Trio(TINY)
    yield t
    t.stop()


def same_as_colo(t, prompt, stream=False, **kw):
    args = dict(model=t.colo.model, prompt=prompt, max_tokens=12, temperature=0, **kw)
    want = t.colo.client().completions.create(**args)
    if stream:
        got = "".join(ch.choices[0].text for ch in t.client().completions.create(stream=True, **args) if ch.choices)
    else:
        got = t.client().completions.create(**args)
        assert got.usage.completion_tokens == want.usage.completion_tokens
        got = got.choices[0].text
    assert got == want.choices[0].text, (prompt[:40], got, want.choices[0].text)
    return got


def test_pd_greedy_matches_colocated(trio):
    t = trio
    sent0 = metric(t.prefill, "osprey:kv_transfer_sent_blocks_total") or 0
    recv0 = metric(t.decode, "osprey:kv_transfer_recv_blocks_total") or 0
    for i, words in enumerate((120, 200, 280)):
        same_as_colo(t, long_prompt(i, words))
        same_as_colo(t, long_prompt(i + 10, words), stream=True)
    same_as_colo(t, "Hello there, my friend")  # 16 tokens: one full block held, the last token computed
    same_as_colo(t, "Hi you")  # 5 tokens: nothing held, null kv_transfer_params
    same_as_colo(t, "Hi you", stream=True)
    assert router_metric(t.router, 'osprey_router_pd_fallback_total{reason="no_transfer"}') >= 2
    assert router_metric(t.router, "osprey_router_pd_requests_total") >= 9
    assert metric(t.prefill, "osprey:kv_transfer_sent_blocks_total") > sent0
    assert metric(t.decode, "osprey:kv_transfer_recv_blocks_total") > recv0
    assert metric(t.decode, "vllm:prefix_cache_hits_total") > 0  # the pulled blocks count as cached
    assert metric(t.decode, "osprey:kv_transfer_recv_seconds_total") > 0


def test_pd_seeded_sampling_matches_colocated(trio):
    for i in range(2):
        args = dict(model=trio.colo.model, prompt=long_prompt(20 + i, 150), max_tokens=16, temperature=0.8, seed=1234)
        want = trio.colo.client().completions.create(**args).choices[0].text
        assert trio.client().completions.create(**args).choices[0].text == want
        got = "".join(ch.choices[0].text for ch in trio.client().completions.create(stream=True, **args) if ch.choices)
        assert got == want


def test_pd_pull_from_nowhere_is_recomputed(trio):
    """A do_remote_prefill request whose remote_port has no listener: the decode server recomputes."""
    t = trio
    prompt = long_prompt(30, 150)
    r = requests.post(t.prefill.url + "/v1/completions", timeout=60,
                      json={"model": t.prefill.model, "prompt": prompt, "max_tokens": 1,
                            "kv_transfer_params": {"do_remote_decode": True}})
    assert r.status_code == 200, r.text
    params = r.json()["kv_transfer_params"]
    assert params and params["do_remote_prefill"] and params["remote_block_ids"], params
    params["remote_port"] = free_port()
    failed0 = metric(t.decode, "osprey:kv_transfer_failed_blocks_total") or 0
    want = t.colo.client().completions.create(model=t.colo.model, prompt=prompt, max_tokens=12, temperature=0)
    got = requests.post(t.decode.url + "/v1/completions", timeout=60,
                        json={"model": t.decode.model, "prompt": prompt, "max_tokens": 12, "temperature": 0,
                              "kv_transfer_params": params})
    assert got.status_code == 200, got.text
    assert got.json()["choices"][0]["text"] == want.choices[0].text
    assert metric(t.decode, "osprey:kv_transfer_failed_blocks_total") > failed0


def test_pd_chat_matches_colocated():
    if not has_pd():
        pytest.skip("osprey serve has no --kv-transfer-config (P/D disaggregation) in this build")
    if not os.path.exists(SMOL):
        pytest.skip(f"no SmolLM2 model at {SMOL} (make fetch): the chat check needs a chat template")
    t = Trio(SMOL, name="smollm2")
    try:
        system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer in plain words." for i in range(12))
        for q in ("What is the capital of France?", "Name three colors."):
            args = dict(model="smollm2", max_tokens=16, temperature=0,
                        messages=[{"role": "system", "content": system}, {"role": "user", "content": q}])
            want = t.colo.client().chat.completions.create(**args).choices[0].message.content
            assert t.client().chat.completions.create(**args).choices[0].message.content == want
            got = "".join(ch.choices[0].delta.content or "" for ch in
                          t.client().chat.completions.create(stream=True, **args) if ch.choices)
            assert got == want
        args = dict(model="smollm2", prompt=system + " Tell me a story.", max_tokens=16, temperature=0)
        assert t.client().completions.create(**args).choices[0].text == \
            t.colo.client().completions.create(**args).choices[0].text
        assert metric(t.decode, "osprey:kv_transfer_recv_blocks_total") > 0
    finally:
        t.stop()


def idle(server):
    wait_metric(server, "vllm:num_requests_running", lambda v: v == 0)
    wait_metric(server, "vllm:kv_cache_usage_perc", lambda v: v == 0)


def test_pd_prefill_killed():
    """The prefill server SIGKILLed, once after answering a prefill whose blocks the decode server then
    cannot pull (recomputed: the same text), then for good: new requests through the router go straight to
    the decode pool, which computes them (the same text). The decode server ends idle with no blocks in
    use."""
    if not has_pd():
        pytest.skip("osprey serve has no --kv-transfer-config (P/D disaggregation) in this build")
    t = Trio(TINY, poll="600000")  # the router learns of the dead server from the refused connection
    try:
        prompt = long_prompt(40, 150)
        r = requests.post(t.prefill.url + "/v1/completions", timeout=60,
                          json={"model": t.prefill.model, "prompt": prompt, "max_tokens": 1,
                                "kv_transfer_params": {"do_remote_decode": True}})
        assert r.status_code == 200 and r.json()["kv_transfer_params"], r.text
        t.prefill.proc.send_signal(signal.SIGKILL)
        t.prefill.proc.wait()
        want = t.colo.client().completions.create(model=t.colo.model, prompt=prompt, max_tokens=12, temperature=0)
        got = requests.post(t.decode.url + "/v1/completions", timeout=60,
                            json={"model": t.decode.model, "prompt": prompt, "max_tokens": 12, "temperature": 0,
                                  "kv_transfer_params": r.json()["kv_transfer_params"]})
        assert got.status_code == 200 and got.json()["choices"][0]["text"] == want.choices[0].text
        assert metric(t.decode, "osprey:kv_transfer_failed_blocks_total") > 0
        # the prefill pool is gone: the decode pool computes whole requests (the same text)
        body = {"model": t.decode.model, "prompt": long_prompt(41, 150), "max_tokens": 12, "temperature": 0}
        want = requests.post(t.colo.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
        for stream in (False, True):
            resp = requests.post(t.router.url + "/v1/completions", timeout=60, json={**body, "stream": stream})
            assert resp.status_code == 200, resp.text
            if not stream:
                assert resp.json()["choices"][0]["text"] == want
        assert router_metric(t.router, 'osprey_router_pd_fallback_total{reason="no_prefill"}') >= 1
        assert requests.get(t.router.url + "/health", timeout=5).status_code == 200
        idle(t.decode)
    finally:
        t.stop()


def test_pd_decode_killed_after_prefill():
    """The decode server dies with the router not yet aware: the prefill runs and holds the blocks, the
    decode connection is refused, the client gets a clean 5xx error JSON, and the router releases the
    held transfer on the prefill server (which would otherwise drop it at its timeout, 2 s here)."""
    if not has_pd():
        pytest.skip("osprey serve has no --kv-transfer-config (P/D disaggregation) in this build")
    t = Trio(TINY, timeout_s=2, poll="600000")
    try:
        dropped0 = metric(t.prefill, "osprey:kv_transfer_dropped_total") or 0
        t.decode.proc.send_signal(signal.SIGKILL)
        t.decode.proc.wait()
        resp = requests.post(t.router.url + "/v1/completions", timeout=60,
                             json={"model": t.prefill.model, "prompt": long_prompt(50, 150), "max_tokens": 8})
        assert 500 <= resp.status_code < 600 and resp.json()["error"]["code"] == resp.status_code, resp.text
        assert router_metric(t.router, "osprey_router_pd_prefill_seconds_count") == 1  # the prefill did answer
        assert router_metric(t.router, "osprey_router_pd_released_total") == 1
        wait_metric(t.prefill, "osprey:kv_transfer_held", lambda v: v == 0)
        assert (metric(t.prefill, "osprey:kv_transfer_dropped_total") or 0) == dropped0  # released, not timed out
        idle(t.prefill)
    finally:
        t.stop()


def test_pd_structured_and_prompt_logprobs_match_colocated(trio):
    """A grammar (guided_choice) and echo + logprobs (prompt logprobs) through the P/D router: the prefill
    server takes them (its one token under the grammar; a prompt-logprobs prompt is not held, so the
    decode server computes it) and the text is the co-located server's."""
    t = trio
    prompt = long_prompt(40, 150)
    for extra in ({"guided_choice": ["alpha beta", "gamma delta"]}, {"echo": True, "logprobs": 1}):
        body = {"model": t.colo.model, "prompt": prompt, "max_tokens": 6, "temperature": 0, **extra}
        want = requests.post(t.colo.url + "/v1/completions", json=body, timeout=60)
        got = requests.post(t.router.url + "/v1/completions", json=body, timeout=60)
        assert want.status_code == 200, want.text
        assert got.status_code == 200, got.text
        assert got.json()["choices"][0]["text"] == want.json()["choices"][0]["text"], extra


def test_pd_consumer_n2_pulls_once(trio):
    """n = 2 sent to a consumer with a producer's kv_transfer_params (as a proxy might): the blocks are
    pulled once (the first choice's), none fails, and both choices are the co-located server's."""
    t = trio
    prompt = long_prompt(50, 150)
    r = requests.post(t.prefill.url + "/v1/completions", timeout=60,
                      json={"model": t.prefill.model, "prompt": prompt, "max_tokens": 1,
                            "kv_transfer_params": {"do_remote_decode": True}})
    params = r.json()["kv_transfer_params"]
    assert params and params["remote_block_ids"], r.text
    recv0 = metric(t.decode, "osprey:kv_transfer_recv_blocks_total") or 0
    failed0 = metric(t.decode, "osprey:kv_transfer_failed_blocks_total") or 0
    body = {"model": t.colo.model, "prompt": prompt, "max_tokens": 8, "temperature": 0.8, "seed": 7, "n": 2}
    want = requests.post(t.colo.url + "/v1/completions", json=body, timeout=60).json()["choices"]
    got = requests.post(t.decode.url + "/v1/completions", json={**body, "kv_transfer_params": params}, timeout=60)
    assert got.status_code == 200, got.text
    assert [c["text"] for c in got.json()["choices"]] == [c["text"] for c in want]
    assert metric(t.decode, "osprey:kv_transfer_recv_blocks_total") - recv0 == len(params["remote_block_ids"])
    assert (metric(t.decode, "osprey:kv_transfer_failed_blocks_total") or 0) == failed0


def test_pd_decode_refusal_releases_the_transfer(trio):
    """A request the decode server refuses (max_tokens past the model's length) after the prefill held its
    blocks: the client gets the 400, and the router releases the producer's copies at once instead of
    leaving them to the timeout."""
    t = trio
    released0 = router_metric(t.router, "osprey_router_pd_released_total")
    held0 = metric(t.prefill, "osprey:kv_transfer_held") or 0  # other tests' unpulled transfers
    body = {"model": t.colo.model, "prompt": long_prompt(60, 150), "max_tokens": 100000}
    resp = requests.post(t.router.url + "/v1/completions", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    assert router_metric(t.router, "osprey_router_pd_released_total") == released0 + 1
    wait_metric(t.prefill, "osprey:kv_transfer_held", lambda v: v == held0)
