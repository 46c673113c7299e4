"""Tool calling and reasoning (issue 19) through the official openai client on SmolLM2.

tool_choice "required" and a named function are generated under the tools' parameter schemas, so even
this model (no tool format of its own, no parser configured) answers with calls whose arguments
validate (checked with Pydantic models that forbid extra keys), streamed and not, and the stream's
deltas assemble to the non-streamed calls. A tool round trip (assistant tool_calls + a tool message)
renders and answers. With --enable-auto-tool-choice --tool-call-parser hermes and --reasoning-parser
qwen3, the model's text is forced (guided_choice) into the hermes and <think> formats so the parsers
run end to end. Bad input is a 400 in OpenAI's error shape."""
import json
import os
from typing import Literal

import openai
import pytest
import requests
from pydantic import BaseModel, ConfigDict

from conftest import BIN, SMOL, Server


class Weather(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: Literal["Paris", "Rome", "Oslo"]
    unit: Literal["c", "f"]


class Clock(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tz: Literal["UTC", "CET"]


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": Weather.model_json_schema()}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                      "parameters": Clock.model_json_schema()}},
]
ARGS = {"get_weather": Weather, "get_time": Clock}
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(calls, n_max=None):
    assert calls, "no tool calls"
    if n_max is not None:
        assert len(calls) <= n_max
    for c in calls:
        assert c.type == "function"
        assert c.id.startswith("call_") and len(c.id) == 29
        ARGS[c.function.name].model_validate_json(c.function.arguments)


def assemble(stream):
    """The stream's deltas -> (content, {index: {id, name, arguments}}, finish_reason)."""
    content, calls, finish = "", {}, None
    for ch in stream:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            e = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert e["id"] is None, "a call's id comes once"
                e["id"] = tc.id
            if tc.function and tc.function.name:
                e["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                e["arguments"] += tc.function.arguments
        if ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
    return content, calls, finish


@pytest.mark.parametrize("parallel", [True, False])
def test_required(smol, parallel):
    c = smol.client()
    r = c.chat.completions.create(model=smol.model, messages=MSG, tools=TOOLS, tool_choice="required",
                                  parallel_tool_calls=parallel, max_tokens=150, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    check_calls(ch.message.tool_calls, None if parallel else 1)


def test_required_sampled(smol):
    """Sampled, one call (parallel_tool_calls false: the array holds one); an unbounded array may run
    to max_tokens, which must then end "length" with no calls claimed."""
    c = smol.client()
    for seed in (1, 2, 3):
        r = c.chat.completions.create(model=smol.model, messages=MSG, tools=TOOLS, tool_choice="required",
                                      parallel_tool_calls=False, max_tokens=150, temperature=1.0, seed=seed)
        assert r.choices[0].finish_reason == "tool_calls"
        check_calls(r.choices[0].message.tool_calls, 1)
    r = c.chat.completions.create(model=smol.model, messages=MSG, tools=TOOLS, tool_choice="required",
                                  max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert not r.choices[0].message.tool_calls and r.choices[0].message.content


@pytest.mark.parametrize("name", ["get_weather", "get_time"])
def test_named(smol, name):
    c = smol.client()
    r = c.chat.completions.create(model=smol.model, messages=MSG, tools=TOOLS, max_tokens=100, temperature=0,
                                  tool_choice={"type": "function", "function": {"name": name}})
    ch = r.choices[0]
    assert ch.finish_reason == "stop"  # a named function: OpenAI and vLLM say "stop", not "tool_calls"
    assert len(ch.message.tool_calls) == 1 and ch.message.tool_calls[0].function.name == name
    check_calls(ch.message.tool_calls)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_equals_plain(smol, choice):
    c = smol.client()
    kw = dict(model=smol.model, messages=MSG, tools=TOOLS, tool_choice=choice, max_tokens=150, temperature=0)
    plain = c.chat.completions.create(**kw).choices[0]
    content, calls, finish = assemble(c.chat.completions.create(stream=True, **kw))
    assert finish == plain.finish_reason == ("tool_calls" if choice == "required" else "stop")
    assert content == ""
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == \
        [(t.function.name, t.function.arguments) for t in plain.message.tool_calls]
    for i in calls:
        assert calls[i]["id"].startswith("call_")
        ARGS[calls[i]["name"]].model_validate_json(calls[i]["arguments"])


def test_round_trip(smol):
    c = smol.client()
    r1 = c.chat.completions.create(model=smol.model, messages=MSG, tools=TOOLS, tool_choice="required",
                                   parallel_tool_calls=False, max_tokens=150, temperature=0)
    call = r1.choices[0].message.tool_calls[0]
    answer = json.dumps({"temperature": 18, "sky": "clear"})
    msgs = MSG + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": answer},
    ]
    r2 = c.chat.completions.create(model=smol.model, messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=30,
                                   temperature=0)
    ch = r2.choices[0]
    assert ch.finish_reason in ("stop", "length")
    assert ch.message.content and not ch.message.tool_calls
    # the call and the tool's answer are in the prompt: /tokenize of the conversation with and without them
    def count(m):
        r = requests.post(smol.url + "/tokenize", json={"model": smol.model, "messages": m, "tools": TOOLS})
        assert r.status_code == 200, r.text
        return r.json()["count"]
    assert count(msgs) == r2.usage.prompt_tokens
    assert count(msgs) > count(MSG) + len(answer) // 4


@pytest.mark.parametrize("body,param", [
    ({"tools": TOOLS}, "tool_choice"),  # auto with no --tool-call-parser: vLLM's 400
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}}}], "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}], "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "retrieval"}], "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
])
def test_bad_input(smol, body, param):
    c = smol.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=smol.model, messages=MSG, max_tokens=5, extra_body=body)
    err = e.value.response.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError" and err["param"] == param and err["message"]


@pytest.fixture(scope="module")
def parsers():
    if not os.path.exists(BIN) or not os.path.exists(SMOL):
        pytest.skip("no osprey binary or SmolLM2 model")
    s = Server(SMOL, "--served-model-name", "smollm2", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
               "--reasoning-parser", "qwen3")
    yield s
    assert s.stop() == 0, s.read_log()[-4000:]


HERMES_TEXT = ('<think>Paris is a city.</think>Let me check.\n<tool_call>\n'
               '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>')


@pytest.mark.parametrize("stream", [False, True])
def test_auto_hermes_and_reasoning(parsers, stream):
    c = parsers.client()
    kw = dict(model=parsers.model, messages=MSG, tools=TOOLS, max_tokens=300, temperature=0,
              extra_body={"guided_choice": [HERMES_TEXT]})
    if not stream:
        ch = c.chat.completions.create(**kw).choices[0]
        m = ch.message.model_dump()
        assert ch.finish_reason == "tool_calls"
        assert m["reasoning_content"] == "Paris is a city."
        assert ch.message.content == "Let me check.\n"
        [call] = ch.message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "c"}
        return
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in c.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta.model_dump()
        reasoning += d.get("reasoning_content") or ""
        content += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            e = calls.setdefault(tc["index"], {"name": None, "arguments": ""})
            e["name"] = (tc.get("function") or {}).get("name") or e["name"]
            e["arguments"] += (tc.get("function") or {}).get("arguments") or ""
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == "Paris is a city."
    assert content == "Let me check.\n"
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Paris", "unit": "c"}


def test_auto_plain_text_and_no_thinking(parsers):
    """With the parsers on, a reply with no call and no <think> is plain content, streamed the same."""
    c = parsers.client()
    kw = dict(model=parsers.model, messages=MSG, tools=TOOLS, max_tokens=20, temperature=0)
    ch = c.chat.completions.create(**kw).choices[0]
    assert ch.finish_reason in ("stop", "length")
    assert not ch.message.tool_calls
    m = ch.message.model_dump()
    assert "reasoning_content" in m and m["reasoning_content"] is None
    text = "".join(x.choices[0].delta.content or "" for x in c.chat.completions.create(stream=True, **kw) if x.choices)
    assert text == (ch.message.content or "")


def test_chat_template_kwargs_reach_template(smol):
    """chat_template_kwargs (enable_thinking) reach the template as variables, tools as `tools`."""
    tmpl = "{{ 'THINK' if enable_thinking else 'NOTHINK' }}{% for t in tools %} {{ t.function.name }}{% endfor %}"

    def toks(body):
        r = requests.post(smol.url + "/tokenize", json=body)
        assert r.status_code == 200, r.text
        return r.json()["tokens"]
    for flag, want in [(True, "THINK get_weather get_time"), (False, "NOTHINK get_weather get_time")]:
        got = toks({"messages": MSG, "tools": TOOLS, "chat_template": tmpl,
                    "chat_template_kwargs": {"enable_thinking": flag}})
        assert got == toks({"prompt": want, "add_special_tokens": False})


TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "f"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_parallel(parsers, parallel):
    """Two calls in the model's text: both, or the first only with parallel_tool_calls false."""
    c = parsers.client()
    r = c.chat.completions.create(model=parsers.model, messages=MSG, tools=TOOLS, max_tokens=300, temperature=0,
                                  parallel_tool_calls=parallel, extra_body={"guided_choice": [TWO_CALLS]})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    names = [t.function.name for t in ch.message.tool_calls]
    assert names == (["get_weather", "get_time"] if parallel else ["get_weather"])
    check_calls(ch.message.tool_calls)
