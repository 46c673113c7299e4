"""OpenAI API behaviour of `osprey serve` through the official openai client: completions streaming and
not (deltas concatenate to the non-streamed text), n > 1, several prompts, token-id prompts, echo,
stop strings (inside and across tokens, never streamed), usage, /v1/models, /tokenize, /detokenize,
/metrics names, and chat on SmolLM2."""
import json
import subprocess
import time

import pytest
import requests

SEEDED = dict(temperature=1.0, seed=1234)
NOEOS = {"ignore_eos": True}


def stream_text(client, **kw):
    """Streams a completion; returns (text, finish_reason, usage, chunks)."""
    text, finish, usage, chunks = "", None, None, 0
    for ch in client.completions.create(stream=True, **kw):
        chunks += 1
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            text += c.text
            if c.finish_reason:
                finish = c.finish_reason
    return text, finish, usage, chunks


def test_models(server):
    r = requests.get(server.url + "/v1/models").json()
    assert r["object"] == "list" and r["data"][0]["id"] == server.model
    assert server.client().models.list().data[0].id == server.model


def test_completion_basic(server):
    c = server.client()
    r = c.completions.create(model=server.model, prompt="Hello world", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    n_prompt = requests.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()["count"]
    assert r.usage.prompt_tokens == n_prompt
    assert r.usage.completion_tokens == 8
    assert r.usage.total_tokens == n_prompt + 8


def test_default_max_tokens_is_16(server):
    r = server.client().completions.create(model=server.model, prompt="abc", **SEEDED)
    assert r.usage.completion_tokens == 16


def test_stream_matches_non_stream(server):
    c = server.client()
    for kw in (dict(temperature=0), SEEDED):
        r = c.completions.create(model=server.model, prompt="The quick brown fox", max_tokens=40, **kw)
        text, finish, usage, chunks = stream_text(c, model=server.model, prompt="The quick brown fox", max_tokens=40,
                                                  stream_options={"include_usage": True}, **kw)
        assert text == r.choices[0].text
        assert finish == r.choices[0].finish_reason
        assert usage.completion_tokens == r.usage.completion_tokens
        assert usage.prompt_tokens == r.usage.prompt_tokens
        assert chunks >= 3


def test_stream_without_usage(server):
    c = server.client()
    text, finish, usage, _ = stream_text(c, model=server.model, prompt="x y z", max_tokens=5, **SEEDED)
    assert usage is None and finish == "length"


def test_raw_sse_format(server):
    r = requests.post(server.url + "/v1/completions", stream=True,
                      json={"prompt": "abc", "max_tokens": 4, "stream": True, "temperature": 0})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.content.decode("utf-8").split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        assert e.startswith("data: ")
        obj = json.loads(e[6:])
        assert obj["object"] == "text_completion" and obj["model"] == server.model
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_n_choices(server):
    c = server.client()
    r = c.completions.create(model=server.model, prompt="Once upon", max_tokens=12, n=3, extra_body=NOEOS, **SEEDED)
    assert sorted(ch.index for ch in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 36
    # streaming: each index's deltas concatenate to the same texts
    texts = {}
    for ch in c.completions.create(model=server.model, prompt="Once upon", max_tokens=12, n=3, stream=True,
                                     extra_body=NOEOS, **SEEDED):
        for x in ch.choices:
            texts[x.index] = texts.get(x.index, "") + x.text
    assert texts == {ch.index: ch.text for ch in r.choices}
    # seeded requests repeat
    r2 = c.completions.create(model=server.model, prompt="Once upon", max_tokens=12, n=3, extra_body=NOEOS, **SEEDED)
    assert [ch.text for ch in r2.choices] == [ch.text for ch in r.choices]


def test_several_prompts_and_token_ids(server):
    c = server.client()
    ids = requests.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    a = c.completions.create(model=server.model, prompt="Hello world", max_tokens=6, temperature=0)
    b = c.completions.create(model=server.model, prompt=ids, max_tokens=6, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    r = c.completions.create(model=server.model, prompt=["Hello world", ids], max_tokens=6, temperature=0, n=2)
    assert len(r.choices) == 4
    assert all(ch.text == a.choices[0].text for ch in r.choices)


def test_echo(server):
    c = server.client()
    r = c.completions.create(model=server.model, prompt="Hello there", max_tokens=5, temperature=0)
    e = c.completions.create(model=server.model, prompt="Hello there", max_tokens=5, temperature=0, echo=True)
    assert e.choices[0].text == "Hello there" + r.choices[0].text
    text, _, _, _ = stream_text(c, model=server.model, prompt="Hello there", max_tokens=5, temperature=0, echo=True)
    assert text == e.choices[0].text


def test_echo_max_tokens_zero(server):
    # echo with max_tokens 0 returns the prompt alone (OpenAI allows it, vLLM serves it): no completion
    # tokens, finish "length"; streamed too. max_tokens 0 without echo, or on chat, stays a 400.
    c = server.client()
    for prompt in ("Hello there", ["Hello there", "abc"]):
        r = c.completions.create(model=server.model, prompt=prompt, max_tokens=0, echo=True)
        want = prompt if isinstance(prompt, list) else [prompt]
        assert [x.text for x in r.choices] == want
        assert all(x.finish_reason == "length" and x.logprobs is None for x in r.choices)
        assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens > 0
    text, finish, _, _ = stream_text(c, model=server.model, prompt="Hello there", max_tokens=0, echo=True)
    assert text == "Hello there" and finish == "length"
    for body in ({"prompt": "a", "max_tokens": 0}, {"prompt": "a", "max_tokens": 0, "echo": False},
                 {"prompt": "a", "max_tokens": 0, "echo": True, "min_tokens": 1}):
        r = requests.post(server.url + "/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] in ("max_tokens", "min_tokens"), (body, r.text)
    r = requests.post(server.url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0, "echo": True})
    assert r.status_code == 400, r.text


def test_echo_logprobs_scores_the_prompt(server):
    # echo + logprobs returns the prompt tokens' logprobs first (the first one null), then the
    # completion's: what lm-evaluation-harness's loglikelihood reads (token_logprobs[ctxlen:-1]). A
    # prompt that is a greedy continuation must score each continuation token as generation did.
    import math
    c = server.client()
    ids = requests.post(server.url + "/tokenize", json={"prompt": "abc", "add_special_tokens": False}).json()["tokens"]
    g = c.completions.create(model=server.model, prompt=ids, max_tokens=4, temperature=0, logprobs=2,
                             extra_body=NOEOS)
    gen_ids = requests.post(server.url + "/tokenize", json={"prompt": g.choices[0].text,
                                                            "add_special_tokens": False}).json()["tokens"]
    full = ids + gen_ids
    for max_tokens in (0, 1, 3):
        r = c.completions.create(model=server.model, prompt=full, max_tokens=max_tokens, temperature=0, logprobs=2,
                                 echo=True, extra_body=NOEOS)
        lp = r.choices[0].logprobs
        n = len(full) + max_tokens
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(x <= 0 for x in lp.token_logprobs[1:])
        assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
        for i in range(1, len(full)):
            assert lp.tokens[i] in lp.top_logprobs[i] and 1 <= len(lp.top_logprobs[i]) <= 3
        if len(gen_ids) == len(g.choices[0].logprobs.token_logprobs):  # the text re-tokenized to the same ids
            tail = lp.token_logprobs[len(ids):len(full)]
            assert all(math.isclose(a, b, abs_tol=2e-3) for a, b in zip(tail, g.choices[0].logprobs.token_logprobs)), \
                (tail, g.choices[0].logprobs.token_logprobs)
        assert r.usage.completion_tokens == max_tokens
    # several choices and prompts: each choice carries its own prompt's entries
    r = c.completions.create(model=server.model, prompt=[full, ids], max_tokens=1, n=2, logprobs=0, echo=True,
                             temperature=0, extra_body=NOEOS)
    assert [len(x.logprobs.tokens) for x in r.choices] == [len(full) + 1] * 2 + [len(ids) + 1] * 2
    assert all(x.logprobs.token_logprobs[0] is None for x in r.choices)


def test_echo_logprobs_one_token_prompt(server):
    # A one-token prompt has no prompt logprobs (nothing precedes its token), but echo + logprobs still
    # puts its null entry first, as OpenAI and vLLM do: lm-eval reads token_logprobs[ctxlen:-1] by prompt
    # position. (Before: the entry was missing, so the completion's token sat at index 0.)
    c = server.client()
    ids = requests.post(server.url + "/tokenize", json={"prompt": "abc", "add_special_tokens": False}).json()["tokens"]
    for prompt in (ids[:1], [ids[:1], ids]):
        for max_tokens in (0, 1, 2):
            r = c.completions.create(model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     logprobs=1, echo=True, extra_body=NOEOS)
            lens = [1] if isinstance(prompt[0], int) else [len(p) for p in prompt]
            assert [len(x.logprobs.token_logprobs) for x in r.choices] == [n + max_tokens for n in lens]
            for x in r.choices:
                lp = x.logprobs
                assert len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset) == len(lp.token_logprobs)
                assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and lp.text_offset[0] == 0
                assert all(v <= 0 for v in lp.token_logprobs[1:])
                assert x.text.startswith("".join(lp.tokens[:1]))


def _reference(server, prompt, n=60):
    return server.client().completions.create(model=server.model, prompt=prompt, max_tokens=n,
                                              extra_body={"ignore_eos": True}, **SEEDED).choices[0].text


def test_stop_strings(server):
    c = server.client()
    prompt = "Stop strings:"
    ref = _reference(server, prompt)
    assert len(ref) > 20
    tried = 0
    # stops at many offsets and lengths: some sit inside one token, some span several
    for start in range(2, min(len(ref) - 4, 40), 3):
        for ln in (1, 2, 3, 5):
            stop = ref[start:start + ln]
            if not stop.strip():
                continue
            idx = ref.index(stop)
            want = ref[:idx]
            r = c.completions.create(model=server.model, prompt=prompt, max_tokens=60, stop=[stop],
                                     extra_body={"ignore_eos": True}, **SEEDED)
            assert r.choices[0].text == want, (stop, ref)
            assert r.choices[0].finish_reason == "stop"
            text, finish, _, _ = stream_text(c, model=server.model, prompt=prompt, max_tokens=60, stop=stop,
                                             extra_body={"ignore_eos": True}, **SEEDED)
            assert text == want and finish == "stop"
            r = c.completions.create(model=server.model, prompt=prompt, max_tokens=60, stop=[stop],
                                     extra_body={"ignore_eos": True, "include_stop_str_in_output": True}, **SEEDED)
            assert r.choices[0].text == ref[:idx + len(stop)]
            tried += 1
    assert tried >= 10


def test_stop_string_never_matching(server):
    c = server.client()
    ref = _reference(server, "No stop:", 30)
    r = c.completions.create(model=server.model, prompt="No stop:", max_tokens=30, stop=["\u2603never\u2603"],
                             extra_body={"ignore_eos": True}, **SEEDED)
    assert r.choices[0].text == ref and r.choices[0].finish_reason == "length"


def test_stop_token_ids_and_min_tokens(server):
    c = server.client()
    ids = requests.post(server.url + "/tokenize", json={"prompt": "ab"}).json()["tokens"]
    r = c.completions.create(model=server.model, prompt="ab", max_tokens=20, temperature=0,
                             extra_body={"min_tokens": 5, "ignore_eos": True})
    assert r.usage.completion_tokens == 20
    assert ids


def test_logprobs(server):
    import math
    c = server.client()
    r = c.completions.create(model=server.model, prompt="abc", max_tokens=6, temperature=0, logprobs=3,
                             extra_body=NOEOS)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0 and 1 <= len(top) <= 3
        assert max(top.values()) >= l - 1e-4  # greedy: the chosen token is the most likely
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert "".join(lp.tokens) == r.choices[0].text
    # streamed logprobs concatenate to the same lists
    toks, lps = [], []
    for ch in c.completions.create(model=server.model, prompt="abc", max_tokens=6, temperature=0, logprobs=3,
                                   stream=True, extra_body=NOEOS):
        for x in ch.choices:
            if x.logprobs:
                toks += x.logprobs.tokens
                lps += x.logprobs.token_logprobs
    assert toks == lp.tokens and all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(lps, lp.token_logprobs))


def test_chat_logprobs(server):
    r = requests.post(server.url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
                            "logprobs": True, "top_logprobs": 2, "ignore_eos": True,
                            "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for e in content:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 2 and isinstance(e["bytes"], list)
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] or "\ufffd" in e["token"]


def test_tokenize_detokenize(server):
    t = requests.post(server.url + "/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}).json()
    assert t["count"] == len(t["tokens"]) and t["max_model_len"] > 0
    d = requests.post(server.url + "/detokenize", json={"tokens": t["tokens"]}).json()
    assert d["prompt"] == "Hello world"


def test_metrics_names(server):
    server.client().completions.create(model=server.model, prompt="metrics", max_tokens=3, temperature=0)
    body = requests.get(server.url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_success_total"):
        lines = [l for l in body.splitlines() if l.startswith(name)]
        assert lines, name
        assert all(f'model_name="{server.model}"' in l for l in lines), name
    gen = [l for l in body.splitlines() if l.startswith("vllm:generation_tokens_total")][0]
    assert float(gen.split()[-1]) > 0


def test_api_key(tmp_path):
    from conftest import TINY, Server
    s = Server(TINY, "--api-key", "sekrit")
    try:
        r = requests.post(s.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1})
        assert r.status_code == 401 and "error" in r.json()
        r = requests.post(s.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1},
                          headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        ok = s.client(api_key="sekrit").completions.create(model=s.model, prompt="a", max_tokens=2,
                                                                 extra_body=NOEOS)  # sampled: EOS may come first
        assert ok.usage.completion_tokens == 2
        assert requests.get(s.url + "/health").status_code == 200  # not behind the key
    finally:
        assert s.stop() == 0


def test_queue_full_503():
    from conftest import TINY, Server
    s = Server(TINY, "--max-queued-requests", "1", "--max-num-seqs", "1")
    try:
        long = requests.post(s.url + "/v1/completions", stream=True,
                             json={"prompt": "a", "max_tokens": 1500, "stream": True,
                                   "ignore_eos": True})
        it = long.iter_lines()
        next(it)  # the first chunk: the request is in flight
        r = requests.post(s.url + "/v1/completions", json={"prompt": "b", "max_tokens": 1})
        assert r.status_code == 503 and r.json()["error"]["code"] == 503
        long.close()
    finally:
        assert s.stop() == 0


def test_queue_full_waits():
    # --queue-wait-timeout: over --max-queued-requests a request waits for a slot instead of a 503
    import threading
    from conftest import TINY, Server
    s = Server(TINY, "--max-queued-requests", "1", "--max-num-seqs", "1", "--queue-wait-timeout", "60")
    try:
        long = requests.post(s.url + "/v1/completions", stream=True,
                             json={"prompt": "a", "max_tokens": 300, "stream": True, "ignore_eos": True})
        it = long.iter_lines()
        next(it)  # the first chunk: the request is in flight, the queue is full
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", requests.post(
            s.url + "/v1/completions", json={"prompt": "b", "max_tokens": 2}, timeout=120)))
        t.start()
        rest = b"\n".join(it)  # the long one runs to its end; then the waiting one gets the slot
        assert rest.strip().endswith(b"data: [DONE]")
        t.join(120)
        assert out["r"].status_code == 200, out["r"].text
        assert out["r"].json()["choices"][0]["finish_reason"] == "length"
    finally:
        assert s.stop() == 0


def test_sigterm_drains():
    import signal
    from conftest import TINY, Server
    s = Server(TINY)
    r = requests.post(s.url + "/v1/completions", stream=True,
                      json={"prompt": "a", "max_tokens": 400, "stream": True, "ignore_eos": True})
    it = r.iter_lines()
    next(it)
    s.proc.send_signal(signal.SIGTERM)
    rest = b"\n".join(it)
    assert rest.strip().endswith(b"data: [DONE]")
    assert s.proc.wait(timeout=60) == 0


def test_sigterm_drains_non_streaming():
    # two plain (non-streaming) requests in flight when SIGTERM comes: both get their whole completion
    # (the drain waits until each response is sent, not only until its job is done)
    import signal
    import threading
    from conftest import TINY, Server
    s = Server(TINY)
    out = {}

    def go(k, n):
        try:
            out[k] = requests.post(s.url + "/v1/completions", timeout=120,
                                   json={"prompt": f"p{k}", "max_tokens": n, "ignore_eos": True})
        except Exception as e:  # noqa: BLE001
            out[k] = e

    ts = [threading.Thread(target=go, args=(k, n)) for k, n in ((0, 600), (1, 1200))]
    for t in ts:
        t.start()
    deadline = time.time() + 30
    while s.health()["num_requests_running"] < 2 and time.time() < deadline:
        time.sleep(0.02)
    s.proc.send_signal(signal.SIGTERM)
    for t in ts:
        t.join(120)
    for k, n in ((0, 600), (1, 1200)):
        r = out[k]
        assert isinstance(r, requests.Response) and r.status_code == 200, r
        assert r.json()["usage"]["completion_tokens"] == n
    assert s.proc.wait(timeout=60) == 0


def test_non_streaming_client_gone_is_aborted(smol):
    # a plain request whose client hangs up is aborted while tokens still come, not run to its end
    # (SmolLM2 takes seconds for 2000 tokens; the server looks at the client every 200 ms)
    import socket
    body = json.dumps({"prompt": "a", "max_tokens": 2000, "ignore_eos": True}).encode()
    c = socket.create_connection(("127.0.0.1", smol.port), timeout=5)
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.time() + 30
    while smol.health()["num_requests_running"] < 1 and time.time() < deadline:
        time.sleep(0.02)
    c.close()
    deadline = time.time() + 30
    while "(client disconnected)" not in smol.read_log() and time.time() < deadline:
        time.sleep(0.05)
    log = smol.read_log()
    assert "(client disconnected)" in log, log[-2000:]
    assert "2000 output tokens" not in log


def test_version(tmp_path):
    # GET /version (no API key, as vLLM's), the version in /v1/models and the start-up log all say what
    # the library's build info says; `osprey --version` too where the CLI has it
    import re
    import subprocess
    from conftest import BIN, TINY, Server
    s = Server(TINY, "--api-key", "k")
    try:
        r = requests.get(s.url + "/version")
        assert r.status_code == 200, r.text
        v = r.json()
        assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", v["version"]), v
        assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?|unknown", v["commit"]), v
        assert isinstance(v["cuda"], bool) and ("CUDA=ON" if v["cuda"] else "CUDA=OFF") in v["options"], v
        for k in ("build_type", "compiler", "c_flags"):
            assert isinstance(v[k], str), v
        assert requests.post(s.url + "/version").status_code == 405
        m = requests.get(s.url + "/v1/models", headers={"Authorization": "Bearer k"}).json()
        assert m["data"][0]["version"] == v["version"], m
        line = f"osprey {v['version']} (commit {v['commit']}, {v['build_type']}, CUDA {'on' if v['cuda'] else 'off'}"
        assert line in s.read_log(), s.read_log()[:2000]
    finally:
        assert s.stop() == 0
    p = subprocess.run([BIN, "--version"], capture_output=True, text=True, timeout=30)
    if p.returncode == 0:
        assert line in p.stdout + p.stderr, (p.stdout, p.stderr)


def test_request_ids_unique_across_processes_and_within_one():
    # two fresh servers (as two restarts) start from different ids; one server's ids never repeat
    # (each request, each n > 1 request and chat ids included) and have the form <kind>-<32 hex>
    import re
    from conftest import TINY, Server
    a, b = Server(TINY, "--trust-request-chat-template"), Server(TINY, "--trust-request-chat-template")
    try:
        first = [s.client().completions.create(model=s.model, prompt="hi", max_tokens=1).id for s in (a, b)]
        assert first[0] != first[1], first
        ids = list(first[:1])
        c = a.client()
        for i in range(30):
            ids.append(c.completions.create(model=a.model, prompt="x" * (i % 3 + 1), max_tokens=1,
                                            n=1 + i % 3).id)
        for s in (a, b):
            r = requests.post(s.url + "/v1/chat/completions", json={
                "model": s.model, "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}],
                "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}).json()
            if "id" in r:
                assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", r["id"]), r
                ids.append(r["id"])
        assert len(set(ids)) == len(ids), ids
        for i in first + ids:
            assert re.fullmatch(r"(chat)?cmpl-[0-9a-f]{32}", i), i
    finally:
        assert a.stop() == 0
        assert b.stop() == 0


@pytest.mark.parametrize("which", ["tiny", "default"])
def test_fresh_server_reports_free_kv(which):
    # before its first request a server's KV blocks are all free (/health and /metrics; they read
    # 0 free / usage 1 until the first step before 995c861), on the tiny model and on the default
    # model (SmolLM2, the CPU's default KV sizing), and all free again once a request has finished
    import os
    from conftest import SMOL, TINY, Server
    if which == "default" and not os.path.exists(SMOL):
        pytest.skip(f"no SmolLM2 model at {SMOL} (make fetch)")
    s = Server(TINY if which == "tiny" else SMOL)

    def check():
        h = s.health()
        assert h["kv_cache_total_blocks"] > 0
        assert h["kv_cache_free_blocks"] == h["kv_cache_total_blocks"], h
        m = requests.get(s.url + "/metrics").text
        usage = [l for l in m.splitlines() if l.startswith("vllm:kv_cache_usage_perc")]
        assert usage and float(usage[0].split()[-1]) == 0.0, usage
        free = [l for l in m.splitlines() if l.startswith("osprey:kv_cache_free_blocks")]
        assert free and int(float(free[0].split()[-1])) == h["kv_cache_total_blocks"], free

    try:
        check()
        s.client().completions.create(model=s.model, prompt="hello there", max_tokens=4)
        check()  # finished: its blocks are free again (prefix-cached blocks count as free)
    finally:
        assert s.stop() == 0


# ---- chat (SmolLM2) ----------------------------------------------------------------------------

def test_chat_basic(smol):
    c = smol.client()
    msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is 2+2?"}]
    r = c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=16, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.usage.completion_tokens <= 16
    text, finish, usage = "", None, None
    for ch in c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=16, temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for x in ch.choices:
            text += x.delta.content or ""
            finish = x.finish_reason or finish
    assert text == r.choices[0].message.content
    assert finish == r.choices[0].finish_reason
    assert usage.total_tokens == r.usage.total_tokens


def test_chat_text_parts_and_n(smol):
    c = smol.client()
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Name a color."}]}]
    r = c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=8, n=2, seed=7, temperature=1.0)
    assert [x.index for x in r.choices] == [0, 1]


def test_chat_prompt_too_long(smol):
    r = requests.post(smol.url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi " * 9000}], "max_tokens": 10})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]


def test_logit_bias_and_sampling_fields(server):
    c = server.client()
    tok = requests.post(server.url + "/tokenize", json={"prompt": "q", "add_special_tokens": False}).json()["tokens"][-1]
    piece = requests.post(server.url + "/detokenize", json={"tokens": [tok]}).json()["prompt"]
    r = c.completions.create(model=server.model, prompt="Hello", max_tokens=5, temperature=0,
                             logit_bias={str(tok): 100}, extra_body={"ignore_eos": True})
    assert r.choices[0].text == piece * 5
    r = c.completions.create(model=server.model, prompt="Hello", max_tokens=5, temperature=0.8, seed=3, top_p=0.9,
                             presence_penalty=0.5, frequency_penalty=0.5,
                             extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2, "ignore_eos": True})
    assert r.usage.completion_tokens == 5


def _chat_tokens(srv, msgs, **kw):
    r = requests.post(srv.url + "/tokenize", json={"messages": msgs, **kw})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_chat_uses_model_template(smol):
    import subprocess
    from conftest import BIN, SMOL
    msgs = [{"role": "user", "content": "Hi there \u00e9\u4e2d"}]
    text = subprocess.run([BIN, "render-template", "-m", SMOL, "--messages", json.dumps(msgs),
                           "--add-generation-prompt"], capture_output=True, check=True).stdout.decode()
    want = requests.post(smol.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
    got = _chat_tokens(smol, msgs)
    assert got == want or got == requests.post(
        smol.url + "/tokenize", json={"prompt": text.rstrip("\n"), "add_special_tokens": False}).json()["tokens"]
    # SmolLM2's template adds its default system prompt when there is none
    rendered = requests.post(smol.url + "/detokenize", json={"tokens": got}).json()["prompt"]
    assert "SmolLM" in rendered and rendered.endswith("<|im_start|>assistant\n")
    no_gen = requests.post(smol.url + "/detokenize",
                           json={"tokens": _chat_tokens(smol, msgs, add_generation_prompt=False)}).json()["prompt"]
    assert not no_gen.endswith("<|im_start|>assistant\n")


def test_chat_continue_final_message_and_request_template(smol):
    msgs = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "one, two,"}]
    toks = _chat_tokens(smol, msgs, continue_final_message=True, add_generation_prompt=False)
    text = requests.post(smol.url + "/detokenize", json={"tokens": toks}).json()["prompt"]
    assert text.endswith("one, two,")
    tmpl = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    r = requests.post(smol.url + "/v1/chat/completions",
                      json={"messages": msgs, "chat_template": tmpl, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200
    bad = "{{ raise_exception('no such conversation') }}"
    r = requests.post(smol.url + "/v1/chat/completions", json={"messages": msgs, "chat_template": bad})
    assert r.status_code == 400 and "no such conversation" in r.json()["error"]["message"]
    r = requests.post(smol.url + "/v1/chat/completions", json={"messages": msgs, "chat_template": "{% if %}"})
    assert r.status_code == 400


def test_metrics_phases_iterations_and_process():
    # vLLM's request phase histograms, vllm:iteration_tokens_total and the process_* collector (issue
    # 20; none of them on c8d3dac): on a fresh server one request of 5 tokens is one observation of each
    # phase, the steps add up to the engine's scheduled tokens, and the process series are there
    from conftest import TINY, Server
    s = Server(TINY)
    try:
        r = requests.post(s.url + "/v1/completions", json={"prompt": "one two three", "max_tokens": 5, "ignore_eos": True})
        assert r.status_code == 200
        usage = r.json()["usage"]
        body = requests.get(s.url + "/metrics").text
        val = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                val[k.replace(f',model_name="{s.model}"', "").replace(f'{{model_name="{s.model}"}}', "")] = float(v)
        for ph in ("queue", "prefill", "decode", "inference"):
            assert val[f"vllm:request_{ph}_time_seconds_count"] == 1, ph
            assert val[f"vllm:request_{ph}_time_seconds_sum"] >= 0, ph
            assert val[f'vllm:request_{ph}_time_seconds_bucket{{le="+Inf"}}'] == 1, ph
        steps = val["vllm:iteration_tokens_total_count"]
        assert steps == val['vllm:iteration_tokens_total_bucket{le="+Inf"}'] and steps >= 5
        # the prompt once (prefill) and one token a step after it: prompt + 4 (the 5th is sampled, not fed)
        assert val["vllm:iteration_tokens_total_sum"] == usage["prompt_tokens"] + usage["completion_tokens"] - 1
        assert val['vllm:iteration_tokens_total_bucket{le="1"}'] == steps - 1
        assert val["process_resident_memory_bytes"] > 1 << 20
        assert val["process_virtual_memory_bytes"] >= val["process_resident_memory_bytes"]
        assert val["process_open_fds"] >= 3 and val["process_max_fds"] != 0
        assert val["process_cpu_seconds_total"] >= 0  # clock ticks: a tiny-model server may not have used one
        assert abs(val["process_start_time_seconds"] - time.time()) < 3600, val["process_start_time_seconds"]
    finally:
        assert s.stop() == 0


def test_restart_at_once_on_the_same_port():
    """A server stopped and started again at once binds its port although the first one's closed
    connections sit in TIME_WAIT: the listening socket keeps libmicrohttpd's default SO_REUSEADDR (serve
    once passed MHD_OPTION_LISTENING_ADDRESS_REUSE 0, which means "disallow", and the restart failed with
    "Address already in use" for up to a minute)."""
    from conftest import BIN, TINY, free_port
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def start():
        p = subprocess.Popen([BIN, "serve", "-m", TINY, "--port", str(port), "-t", "2", "--kv-cache-memory", "64M"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if p.poll() is not None:
                return p, p.stdout.read()
            try:
                if requests.get(url + "/health", timeout=1).status_code == 200:
                    return p, None
            except requests.RequestException:
                time.sleep(0.05)
        p.kill()
        return p, "did not come up"

    first, err = start()
    assert err is None, err
    for _ in range(20):  # connections the server closes: TIME_WAIT on its side
        assert requests.get(url + "/health", headers={"Connection": "close"}, timeout=10).status_code == 200
    first.terminate()
    assert first.wait(timeout=30) == 0
    second, err = start()
    try:
        assert err is None, err
    finally:
        if second.poll() is None:
            second.terminate()
            second.wait(timeout=30)
