"""Speculative decoding through `osprey serve` (issue 14): a SmolLM2 server with vLLM's
--speculative-config gives the same completions as one without (greedy and seeded sampling, n = 2,
streamed, stop strings cut mid-draft, max_tokens), its /metrics carry vLLM's spec_decode counters with
accepted drafts, and a malformed config stops the server at start-up with one error line."""
import os
import re
import subprocess

import pytest
import requests

from conftest import BIN, SMOL, Server

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
TEXT = ("The osprey is a fish-eating bird of prey with a cosmopolitan range. It is a large raptor with a "
        "wingspan of about 180 cm. It is brown on the upperparts and predominantly greyish on the head and "
        "underparts.")
PROMPTS = [f"Repeat the following text exactly.\nText: {TEXT}\nRepeated text: The osprey",
           f"Text: {TEXT}\nThe same text in capitals: THE OSPREY",
           "List the numbers from one to twenty in words: one, two, three,"]


@pytest.fixture(scope="module")
def pair():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    if not os.path.exists(SMOL):
        pytest.skip(f"no SmolLM2 model at {SMOL} (make fetch)")
    plain = Server(SMOL, "--served-model-name", "smollm2")
    spec = Server(SMOL, "--served-model-name", "smollm2", "--speculative-config", SPEC)
    yield plain, spec
    for s in (plain, spec):
        rc = s.stop()
        assert rc == 0, s.read_log()[-4000:]


def complete(server, **kw):
    r = server.client().completions.create(model="smollm2", extra_body={"ignore_eos": True}, **kw)
    return [(c.text, c.finish_reason) for c in r.choices]


def stream(server, **kw):
    text, finish = {}, {}
    for ch in server.client().completions.create(model="smollm2", stream=True, extra_body={"ignore_eos": True}, **kw):
        for c in ch.choices:
            text[c.index] = text.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return [(text[i], finish.get(i)) for i in sorted(text)]


def test_same_completions(pair):
    plain, spec = pair
    for p in PROMPTS:
        for kw in ({"temperature": 0, "max_tokens": 48},
                   {"temperature": 0.8, "top_p": 0.9, "seed": 7, "max_tokens": 40, "n": 2},
                   {"temperature": 0, "max_tokens": 13}):
            want = complete(plain, prompt=p, **kw)
            assert complete(spec, prompt=p, **kw) == want, (p, kw)
            assert stream(spec, prompt=p, **kw) == want, (p, kw)


def test_stop_strings_mid_draft(pair):
    plain, spec = pair
    ref = complete(plain, prompt=PROMPTS[0], temperature=0, max_tokens=48)[0][0]
    tried = 0
    for start in range(4, min(len(ref) - 6, 120), 9):
        stop = ref[start:start + 3]
        if not stop.strip():
            continue
        want = complete(plain, prompt=PROMPTS[0], temperature=0, max_tokens=48, stop=[stop])
        assert want[0][1] == "stop"
        assert complete(spec, prompt=PROMPTS[0], temperature=0, max_tokens=48, stop=[stop]) == want, stop
        assert stream(spec, prompt=PROMPTS[0], temperature=0, max_tokens=48, stop=[stop]) == want, stop
        tried += 1
    assert tried >= 5


def test_metrics(pair):
    plain, spec = pair
    complete(spec, prompt=PROMPTS[0], temperature=0, max_tokens=32)
    body = requests.get(spec.url + "/metrics").text
    val = {}
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        m = re.search(rf'^vllm:spec_decode_{name}_total{{model_name="smollm2"}} (\S+)$', body, re.M)
        assert m, name
        val[name] = float(m.group(1))
    assert 0 < val["num_accepted_tokens"] <= val["num_draft_tokens"]
    assert val["num_drafts"] <= val["num_draft_tokens"] <= 4 * val["num_drafts"]
    pos = [float(x) for x in re.findall(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{model_name="smollm2",'
                                        r'position="\d"\} (\S+)$', body, re.M)]
    assert len(pos) == 4 and sum(pos) == val["num_accepted_tokens"]
    assert all(a >= b for a, b in zip(pos, pos[1:]))
    assert "spec_decode" not in requests.get(plain.url + "/metrics").text  # only with a speculative config


@pytest.mark.parametrize("cfg, frag", [('{"method": "ngram"', "not JSON"),
                                        ('{"method": "medusa", "num_speculative_tokens": 2}', "not implemented yet"),
                                        ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}',
                                         "prompt_lookup_min")])
def test_bad_config(cfg, frag):
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    r = subprocess.run([BIN, "serve", "-m", SMOL, "--port", "0", "--speculative-config", cfg], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    errs = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errs) == 1 and "--speculative-config" in errs[0] and frag in errs[0], r.stderr


def test_draft_model_same_completions(pair):
    """vLLM's draft_model method with SmolLM2 as its own draft: the plain server's completions (greedy,
    seeded n = 2, streamed), and the drafts counted."""
    plain, _ = pair
    cfg = '{"method": "draft_model", "model": "%s", "num_speculative_tokens": 3}' % SMOL
    draft = Server(SMOL, "--served-model-name", "smollm2", "--speculative-config", cfg)
    try:
        for p in PROMPTS[:2]:
            for kw in ({"temperature": 0, "max_tokens": 32},
                       {"temperature": 0.8, "top_p": 0.9, "seed": 7, "max_tokens": 24, "n": 2}):
                want = complete(plain, prompt=p, **kw)
                assert complete(draft, prompt=p, **kw) == want, (p, kw)
                assert stream(draft, prompt=p, **kw) == want, (p, kw)
        body = requests.get(draft.url + "/metrics").text
        m = re.search(r'^vllm:spec_decode_num_accepted_tokens_total\{model_name="smollm2"\} (\S+)$', body, re.M)
        assert m and float(m.group(1)) > 0
    finally:
        rc = draft.stop()
    assert rc == 0, draft.read_log()[-4000:]


def test_draft_model_missing_file():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    if not os.path.exists(SMOL):
        pytest.skip(f"no SmolLM2 model at {SMOL} (make fetch)")
    cfg = '{"method": "draft_model", "model": "/nonexistent/draft.gguf", "num_speculative_tokens": 2}'
    r = subprocess.run([BIN, "serve", "-m", SMOL, "--port", "0", "--speculative-config", cfg], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    errs = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errs) == 1 and "draft model" in errs[0] and "/nonexistent/draft.gguf" in errs[0], r.stderr
