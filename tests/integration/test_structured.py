"""Structured outputs (issue 19) through the official openai client: response_format json_schema via
`chat.completions.parse` with Pydantic models on SmolLM2 (greedy and sampled, streamed and not, outputs
validated by the models), json_object, vLLM's guided_choice / guided_grammar / guided_json, a grammar cut
by max_tokens ending "length", and a 400 in OpenAI's error shape for everything the server cannot
honour (unknown types, unsupported schema keywords, regex, bad grammars, two kinds at once). With
--speculative-config (n-gram, k drafts every step): the very same structured outputs as without, greedy
and seeded, plain and streamed, with drafts verified and accepted (the grammar's forced continuations)."""
import json
import re
from typing import List, Literal, Optional

import os

import openai
import pytest
import requests
from pydantic import BaseModel, Field

from conftest import BIN, SMOL, Server


class Address(BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    zip: str = Field(max_length=6)


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int
    tags: List[str] = Field(max_length=3)
    address: Address
    nickname: Optional[str] = Field(default=None, max_length=10)


def parse_fn(client):
    beta = getattr(getattr(client, "beta", None), "chat", None)
    if beta is not None and hasattr(beta.completions, "parse"):
        return beta.completions.parse
    return client.chat.completions.parse


MSG = [{"role": "user", "content": "Invent a person. Answer in JSON."}]


@pytest.mark.parametrize("sampled", [False, True])
def test_parse_pydantic(smol, sampled):
    c = smol.client()
    kw = dict(temperature=0.8, seed=11) if sampled else dict(temperature=0)
    r = parse_fn(c)(model=smol.model, messages=MSG, response_format=Person, max_tokens=200, **kw)
    p = r.choices[0].message.parsed
    assert isinstance(p, Person), r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"


def test_json_schema_streamed_equals_plain(smol):
    c = smol.client()
    rf = {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": Address.model_json_schema()}}
    plain = c.chat.completions.create(model=smol.model, messages=MSG, response_format=rf, max_tokens=60, temperature=0)
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=smol.model, messages=MSG, response_format=rf, max_tokens=60, temperature=0, stream=True) if ch.choices)
    assert text == plain.choices[0].message.content
    Address.model_validate_json(text)


def test_json_object(smol):
    r = smol.client().chat.completions.create(model=smol.model, messages=MSG, max_tokens=120, temperature=0,
                                              response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].finish_reason == "length"


def test_cut_by_max_tokens_is_length(smol):
    r = smol.client().chat.completions.create(
        model=smol.model, messages=MSG, max_tokens=4, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": Person.model_json_schema()}})
    assert r.choices[0].finish_reason == "length"


def test_guided_choice_and_grammar(server):
    c = server.client()
    for seed in range(4):
        r = c.completions.create(model=server.model, prompt="Pick", max_tokens=20, temperature=1.0, seed=seed,
                                 extra_body={"guided_choice": ["yes", "no", "maybe so"]})
        assert r.choices[0].text in ("yes", "no", "maybe so") and r.choices[0].finish_reason == "stop"
    r = c.completions.create(model=server.model, prompt="Digits", max_tokens=20, temperature=1.0, seed=3, n=2,
                             extra_body={"guided_grammar": 'root ::= [0-9]{3} ("-" [a-c])?'})
    for ch in r.choices:
        assert re.fullmatch(r"[0-9]{3}(-[a-c])?", ch.text) and ch.finish_reason == "stop", ch.text
    r = c.completions.create(model=server.model, prompt="x", max_tokens=40, temperature=1.0, seed=5,
                             extra_body={"guided_json": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                                         "required": ["ok"]}})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].text)["ok"], bool)


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"guided_regex": "[a-z]+"}, "guided_regex"),
    ({"guided_grammar": "root ::= (\"a\""}, "guided_grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": {"type": "integer", "minimum": 3}}, "guided_json"),
    ({"guided_choice": ["a"], "guided_grammar": "root ::= \"a\""}, "guided_choice"),
    ({"structured_outputs": {"regex": "a"}}, "structured_outputs"),
])
def test_unsupported_is_400(server, extra, param):
    body = {"model": server.model, "prompt": "x", "max_tokens": 4, **extra}
    r = requests.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]
    with pytest.raises(openai.BadRequestError):
        server.client().completions.create(model=server.model, prompt="x", max_tokens=4, extra_body=extra)


def spec_metric(server, name):
    for line in requests.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f"vllm:spec_decode_{name}_total{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no vllm:spec_decode_{name}_total in /metrics")


def test_speculation_under_a_grammar_changes_no_token(smol):
    if not os.path.exists(BIN) or not os.path.exists(SMOL):
        pytest.skip("needs the binary and SmolLM2")
    os.environ["OSPREY_SPEC_FIXED_K"] = "1"  # k drafts every step: no switch deciding they do not pay here
    try:
        spec = Server(SMOL, "--served-model-name", "smollm2", "--speculative-config",
                      '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}')
    finally:
        del os.environ["OSPREY_SPEC_FIXED_K"]
    try:
        rf = {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": Person.model_json_schema()}}
        for kw in (dict(temperature=0), dict(temperature=0.8, seed=5)):
            want = smol.client().chat.completions.create(model=smol.model, messages=MSG, response_format=rf,
                                                         max_tokens=200, **kw)
            got = spec.client().chat.completions.create(model=smol.model, messages=MSG, response_format=rf,
                                                        max_tokens=200, **kw)
            assert got.choices[0].message.content == want.choices[0].message.content
            assert got.choices[0].finish_reason == want.choices[0].finish_reason
            assert got.usage.completion_tokens == want.usage.completion_tokens
            streamed = "".join(ch.choices[0].delta.content or "" for ch in spec.client().chat.completions.create(
                model=smol.model, messages=MSG, response_format=rf, max_tokens=200, stream=True, **kw) if ch.choices)
            assert streamed == want.choices[0].message.content
        Person.model_validate_json(want.choices[0].message.content)
        drafted, accepted = spec_metric(spec, "num_draft_tokens"), spec_metric(spec, "num_accepted_tokens")
        assert drafted > 0 and accepted > drafted / 2, (drafted, accepted)
    finally:
        assert spec.stop() == 0, spec.read_log()[-4000:]
