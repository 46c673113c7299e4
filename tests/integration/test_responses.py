"""/v1/responses (issue 19: OpenAI's Responses API) through the official openai client on SmolLM2.

Text in and out, instructions, max_output_tokens cutting a reply (status incomplete), the typed
stream (event order, sequence numbers, deltas reassembling to the non-streamed text under greedy
decoding), previous_response_id (the second turn's prompt is the first turn's conversation plus the
new input, counted with /tokenize), GET and DELETE of a stored response and the store's bound, a
function tool round trip with tool_choice required (function_call output item, then
function_call_output input), json_schema output validating, and every unsupported field or value a
400 in OpenAI's error shape."""
import json
from typing import List, Literal

import openai
import pytest
import requests
from pydantic import BaseModel, ConfigDict

from conftest import BIN, SMOL, Server

import os


class Weather(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: Literal["Paris", "Rome", "Oslo"]
    unit: Literal["c", "f"]


TOOLS = [
    {"type": "function", "name": "get_weather", "description": "The weather in a city",
     "parameters": Weather.model_json_schema()},
    {"type": "function", "name": "get_time", "description": "The time in a time zone",
     "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
                    "additionalProperties": False}},
]
Q = "What is the capital of France?"


def tokens(smol, messages):
    r = requests.post(smol.url + "/tokenize", json={"model": smol.model, "messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["count"]


def test_text(smol):
    c = smol.client()
    r = c.responses.create(model=smol.model, input=Q, max_output_tokens=40, temperature=0, metadata={"k": "v"},
                           user="u1")
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output[0].content[0].type == "output_text"
    assert r.output_text and r.output_text == r.output[0].content[0].text
    assert r.usage.input_tokens == tokens(smol, [{"role": "user", "content": Q}])
    assert 0 < r.usage.output_tokens <= 40
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.metadata == {"k": "v"} and r.user == "u1" and r.max_output_tokens == 40 and r.store is True


def test_same_as_chat(smol):
    """The same conversation through /v1/responses and /v1/chat/completions: one prompt, one greedy reply."""
    c = smol.client()
    r = c.responses.create(model=smol.model, instructions="Be brief.", input=Q, max_output_tokens=30, temperature=0)
    ch = c.chat.completions.create(model=smol.model, max_tokens=30, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": Q}])
    assert r.output_text == ch.choices[0].message.content
    assert r.usage.input_tokens == ch.usage.prompt_tokens and r.usage.output_tokens == ch.usage.completion_tokens
    assert (r.status == "incomplete") == (ch.choices[0].finish_reason == "length")


def test_instructions_and_items(smol):
    c = smol.client()
    ins = "You answer in one word."
    r = c.responses.create(model=smol.model, instructions=ins, max_output_tokens=20, temperature=0,
                           input=[{"role": "user", "content": [{"type": "input_text", "text": Q}]}])
    assert r.instructions == ins
    # the instructions lead the prompt as a system message
    assert r.usage.input_tokens == tokens(smol, [{"role": "system", "content": ins}, {"role": "user", "content": Q}])
    # a string input is the same as one user message item
    r2 = c.responses.create(model=smol.model, instructions=ins, input=Q, max_output_tokens=20, temperature=0)
    assert r2.output_text == r.output_text


def test_incomplete(smol):
    c = smol.client()
    r = c.responses.create(model=smol.model, input="Write a long story about a dragon.", max_output_tokens=5,
                           temperature=0)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5
    assert r.output[0].status == "incomplete"


@pytest.mark.parametrize("max_out", [5, 60])
def test_stream_matches(smol, max_out):
    c = smol.client()
    kw = dict(model=smol.model, input="Name three colors.", instructions="Be brief.", max_output_tokens=max_out,
              temperature=0)
    plain = c.responses.create(**kw)
    events = list(c.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    head = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done",
            "response.completed" if plain.status == "completed" else "response.incomplete"]
    assert types[:4] == head and types[-4:] == tail
    assert set(types[4:-4]) <= {"response.output_text.delta"}
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text
    assert events[-4].text == text and events[-3].part.text == text
    assert events[-2].item.content[0].text == text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == plain.usage.output_tokens
    assert final.status == plain.status
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id


def test_previous_response(smol):
    c = smol.client()
    r1 = c.responses.create(model=smol.model, input=Q, instructions="Be brief.", max_output_tokens=20,
                            temperature=0)
    r2 = c.responses.create(model=smol.model, input="And of Italy?", previous_response_id=r1.id,
                            max_output_tokens=20, temperature=0)
    assert r2.previous_response_id == r1.id
    # the second prompt is the first turn (its input and output; not its instructions, as OpenAI) + the new input
    conv = [{"role": "user", "content": Q}, {"role": "assistant", "content": r1.output_text},
            {"role": "user", "content": "And of Italy?"}]
    assert r2.usage.input_tokens == tokens(smol, conv)
    assert r2.usage.input_tokens > r1.usage.input_tokens - 10 + r1.usage.output_tokens
    # a chain of three
    r3 = c.responses.create(model=smol.model, input="And of Spain?", previous_response_id=r2.id,
                            max_output_tokens=20, temperature=0)
    conv += [{"role": "assistant", "content": r2.output_text}, {"role": "user", "content": "And of Spain?"}]
    assert r3.usage.input_tokens == tokens(smol, conv)
    # a stored response reads back; store false is not kept
    got = c.responses.retrieve(r1.id)
    assert got.id == r1.id and got.output_text == r1.output_text
    r4 = c.responses.create(model=smol.model, input=Q, max_output_tokens=5, store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r4.id)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=smol.model, input="x", previous_response_id=r4.id, max_output_tokens=5)
    assert e.value.response.json()["error"]["param"] == "previous_response_id"
    c.responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r1.id)


def test_stream_previous_response(smol):
    """A streamed response is stored too, and continues like a plain one."""
    c = smol.client()
    events = list(c.responses.create(model=smol.model, input=Q, max_output_tokens=15, temperature=0, stream=True))
    r1 = events[-1].response
    r2 = c.responses.create(model=smol.model, input="Why?", previous_response_id=r1.id, max_output_tokens=5)
    conv = [{"role": "user", "content": Q}, {"role": "assistant", "content": r1.output_text},
            {"role": "user", "content": "Why?"}]
    assert r2.usage.input_tokens == tokens(smol, conv)


@pytest.fixture(scope="module")
def small_store():
    if not os.path.exists(BIN) or not os.path.exists(SMOL):
        pytest.skip("no osprey binary or SmolLM2 model")
    s = Server(SMOL, "--served-model-name", "smollm2", "--responses-store-size", "2")
    yield s
    assert s.stop() == 0, s.read_log()[-4000:]


def test_store_bound(small_store):
    c = small_store.client()
    ids = [c.responses.create(model=small_store.model, input=f"Say {i}.", max_output_tokens=3).id for i in range(3)]
    with pytest.raises(openai.NotFoundError):  # the least recently used one went
        c.responses.retrieve(ids[0])
    c.responses.retrieve(ids[1])  # now the most recently used
    c.responses.create(model=small_store.model, input="x", max_output_tokens=3)
    c.responses.retrieve(ids[1])
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(ids[2])


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round_trip(smol, stream):
    c = smol.client()
    q = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model=smol.model, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              max_output_tokens=150, temperature=0)
    if stream:
        events = list(c.responses.create(input=q, stream=True, **kw))
        r1 = events[-1].response
        types = [e.type for e in events]
        assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
        assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
        assert types[-1] == "response.completed"
        args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert args == r1.output[0].arguments
        assert c.responses.create(input=q, **kw).output[0].arguments == args
    else:
        r1 = c.responses.create(input=q, **kw)
    assert r1.status == "completed"
    calls = [o for o in r1.output if o.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert call.call_id.startswith("call_") and call.name in ("get_weather", "get_time")
    json.loads(call.arguments)
    if call.name == "get_weather":
        Weather.model_validate_json(call.arguments)
    answer = json.dumps({"temperature": 18, "sky": "clear"})
    # OpenAI's round trip: the output items go back in the input, then the function's output
    inp = q + list(r1.output) + [{"type": "function_call_output", "call_id": call.call_id, "output": answer}]
    r2 = c.responses.create(model=smol.model, input=inp, tools=TOOLS, tool_choice="none", max_output_tokens=30,
                            temperature=0)
    assert r2.output[0].type == "message" and r2.output_text
    msgs = q + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": answer}]
    r = requests.post(smol.url + "/tokenize", json={"model": smol.model, "messages": msgs,
                                                     "tools": [{"type": "function", "function": {
                                                         k: v for k, v in t.items() if k != "type"}} for t in TOOLS]})
    assert r.status_code == 200, r.text
    assert r2.usage.input_tokens == r.json()["count"]
    # the same through previous_response_id: only the function's output is new
    r3 = c.responses.create(model=smol.model, previous_response_id=r1.id, tools=TOOLS, tool_choice="none",
                            input=[{"type": "function_call_output", "call_id": call.call_id, "output": answer}],
                            max_output_tokens=30, temperature=0)
    assert r3.usage.input_tokens == r2.usage.input_tokens and r3.output_text == r2.output_text


def test_named_tool(smol):
    c = smol.client()
    kw = dict(model=smol.model, input="Weather in Oslo?", tools=TOOLS, max_output_tokens=100,
              tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    r = c.responses.create(**kw)
    assert [o.type for o in r.output] == ["function_call"] and r.output[0].name == "get_weather"
    Weather.model_validate_json(r.output[0].arguments)
    # streamed: the arguments come as they are generated, under one function_call item
    events = list(c.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert events[2].item.type == "function_call" and events[2].item.name == "get_weather"
    assert events[2].item.call_id == r.output[0].call_id or events[2].item.call_id.startswith("call_")
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and set(types[3:-3]) == {"response.function_call_arguments.delta"}
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert "".join(deltas) == r.output[0].arguments == events[-3].arguments
    final = events[-1].response
    assert final.output[0].call_id == events[2].item.call_id and final.output[0].arguments == r.output[0].arguments


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")
    explanation: str
    output: int


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: List[Step]
    final: Literal["yes", "no"]


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema(smol, stream):
    c = smol.client()
    schema = Plan.model_json_schema()
    schema["properties"]["steps"]["maxItems"] = 2
    kw = dict(model=smol.model, input="Plan how to add 2 and 3.", max_output_tokens=300, temperature=0,
              text={"format": {"type": "json_schema", "name": "plan", "schema": schema, "strict": True}})
    if stream:
        r = list(c.responses.create(stream=True, **kw))[-1].response
    else:
        r = c.responses.create(**kw)
    assert r.status == "completed", r.output_text
    Plan.model_validate_json(r.output_text)
    assert r.text.format.type == "json_schema"


def test_json_object_and_parse(smol):
    c = smol.client()
    r = c.responses.create(model=smol.model, input="Reply with a JSON object describing a cat: its name and age.", max_output_tokens=200,
                           temperature=0, text={"format": {"type": "json_object"}})
    assert r.status == "completed" and isinstance(json.loads(r.output_text), dict)
    p = c.responses.parse(model=smol.model, input="Weather in Rome, in celsius.", text_format=Weather,
                          max_output_tokens=100, temperature=0)
    assert isinstance(p.output_parsed, Weather)


BAD = [
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["x"]}]}, "tools"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "bogus": 1}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tools": TOOLS}, "tool_choice"),  # auto needs --enable-auto-tool-choice, as on the chat route
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "string", "pattern": "^a"}}}}, "text.format"),
    ({"text": {"verbosity": "low"}}, "text"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"store": "yes"}, "store"),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_fields(smol, body, param):
    c = smol.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=smol.model, input=Q, extra_body=body)
    err = e.value.response.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError" and err["param"] == param and err["message"]


BAD_INPUT = [
    [],
    [{"role": "tool", "content": "x"}],
    [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}],
    [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}],
    [{"type": "function_call", "name": "f", "arguments": "{}"}],
    [{"type": "function_call_output", "output": "x"}],
    [{"type": "item_reference", "id": "x"}],
    [{"role": "user", "content": "x", "extra": 1}],
    42,
]


@pytest.mark.parametrize("inp", BAD_INPUT)
def test_bad_input(smol, inp):
    r = requests.post(smol.url + "/v1/responses", json={"model": smol.model, "input": inp})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "input" and err["message"]


def test_missing_input_and_model(smol):
    r = requests.post(smol.url + "/v1/responses", json={"model": smol.model})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = requests.post(smol.url + "/v1/responses", json={"model": "nope", "input": "x"})
    assert r.status_code == 404
    r = requests.get(smol.url + "/v1/responses/resp_nope")
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = requests.get(smol.url + "/v1/responses/resp_nope/input_items")  # not served
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    r = requests.put(smol.url + "/v1/responses/resp_nope")
    assert r.status_code == 405
    r = requests.get(smol.url + "/v1/responses")
    assert r.status_code == 405
