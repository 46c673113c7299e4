#!/usr/bin/env python3
"""Expected renderings of every chat template in ../shared/testdata/chat-templates for the golden
test tests/golden/test_chat_templates.c.

Each template is rendered with Python's jinja2 configured the way transformers configures it
(transformers/utils/chat_template_utils.py, _compile_jinja_template and render_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[{% generation %}
tracker, loopcontrols]), its tojson (json.dumps with ensure_ascii=False), raise_exception and
strftime_now (here at a fixed time, NOW below, so that the fixtures are deterministic; the C test
passes the same time to osprey), and render(messages=..., tools=..., documents=None,
add_generation_prompt=..., bos_token=..., eos_token=...).

Writes tests/golden/fixtures/templates/conversations.json (the inputs) and one <template>.json per
template: its FNV-1a 64 hash (so a changed template is detected), and for every conversation x
add_generation_prompt the expected text or the jinja2 error. The shared templates stay in ../shared.

Templates the shared set lacks are committed here as tests/golden/fixtures/templates/*.jinja (exact
copies, with no header; a sibling <name>.txt says where each comes from) and rendered the same way;
their fixtures also name the directory they are in ("template_dir", relative to the repository
root), which fixtures of shared templates leave out. google-gemma-3-it.jinja is Gemma 3's chat
template (google/gemma-3-270m-it, gemma-3-1b-it), decoded from the verbatim tokenizer_config.json
"chat_template" quoted in ShishirPatil/gorilla,
berkeley-function-call-leaderboard/bfcl_eval/model_handler/local_inference/gemma.py.

usage: python3 tests/golden/make_template_fixtures.py [--shared DIR]
"""
import argparse
import json
import os
import sys
from datetime import datetime, timezone

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = 1749988800  # 2025-06-15 12:00:00 UTC
BOS, EOS = "<s>", "</s>"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

CONVERSATIONS = [
    {"name": "user", "messages": [{"role": "user", "content": "Hello!"}]},
    {"name": "system_user", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 2?"}]},
    {"name": "multi_turn", "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "And another one?"}]},
    {"name": "developer", "messages": [
        {"role": "developer", "content": "Always answer in French."},
        {"role": "user", "content": "Good morning"}]},
    {"name": "unicode", "messages": [
        {"role": "user", "content": "Grüße aus Köln! 你好，世界 🦅 naïve café — “quotes” and a back\\slash"},
        {"role": "assistant", "content": "¡Hola! Привет, мир. こんにちは 👋"},
        {"role": "user", "content": "Tab\there, newline\nthere, <b>tags</b> & {{ braces }}"}]},
    {"name": "text_parts", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be concise."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "a cat."}]}]},
    {"name": "assistant_last", "messages": [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi there!"}]},
    {"name": "whitespace", "messages": [
        {"role": "user", "content": "  leading and trailing spaces  \n\n"},
        {"role": "assistant", "content": "\nok\n"},
        {"role": "user", "content": ""}]},
    {"name": "tools", "tools": [WEATHER_TOOL], "messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Paris?"}]},
    {"name": "tool_call_round", "tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
        {"role": "user", "content": "Thanks!"}]},
]


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


class AssistantTracker(Extension):
    """transformers' {% generation %} tag: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.fromtimestamp(NOW, tz=timezone.utc).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"))
    args = ap.parse_args()
    tdir = os.path.join(args.shared, "testdata", "chat-templates")
    out = os.path.join(here, "fixtures", "templates")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "conversations.json"), "w", encoding="utf-8") as f:
        json.dump({"now": NOW, "bos_token": BOS, "eos_token": EOS, "conversations": CONVERSATIONS}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    env = make_env()
    n_ok = n_err = 0
    # (directory, name, template_dir recorded in the fixture): the shared templates, then the repo's own
    sources = [(tdir, name, None) for name in sorted(os.listdir(tdir)) if name.endswith(".jinja")]
    own_dir = os.path.relpath(out, root)
    own = [(out, name, own_dir) for name in sorted(os.listdir(out)) if name.endswith(".jinja")]
    clash = {n for _, n, _ in sources} & {n for _, n, _ in own}
    if clash:
        sys.exit("templates both in %s and %s: %s" % (tdir, out, ", ".join(sorted(clash))))
    for src_dir, name, template_dir in sources + own:
        raw = open(os.path.join(src_dir, name), "rb").read()
        src = raw.decode("utf-8")
        try:
            tmpl, compile_err = env.from_string(src), None
        except Exception as e:  # noqa: BLE001 - any jinja2 failure is an expected error
            tmpl, compile_err = None, "%s: %s" % (type(e).__name__, e)
        cases = []
        for conv in CONVERSATIONS:
            for agp in (False, True):
                case = {"conv": conv["name"], "add_generation_prompt": agp}
                if compile_err:
                    case["error"] = compile_err
                else:
                    try:
                        case["output"] = tmpl.render(messages=conv["messages"], tools=conv.get("tools"),
                                                     documents=None, add_generation_prompt=agp,
                                                     bos_token=BOS, eos_token=EOS)
                    except Exception as e:  # noqa: BLE001
                        case["error"] = "%s: %s" % (type(e).__name__, e)
                n_ok += "output" in case
                n_err += "error" in case
                cases.append(case)
        fixture = {"template": name}
        if template_dir:
            fixture["template_dir"] = template_dir
        fixture.update({"fnv1a64": fnv1a64(raw), "cases": cases})
        with open(os.path.join(out, name[:-len(".jinja")] + ".json"), "w", encoding="utf-8") as f:
            json.dump(fixture, f, ensure_ascii=False, indent=1)
            f.write("\n")
    print("jinja2 %s: %d renderings, %d errors" % (jinja2.__version__, n_ok, n_err), file=sys.stderr)


if __name__ == "__main__":
    main()
