"""A K/V split page cache through the server (issue 13): `osprey serve -ctk fp8 -ctv nvfp4` (llama.cpp's
--cache-type-k / --cache-type-v) starts, says so on its memory line, answers through the official
openai client, and a repeated prompt hits the prefix cache (quantized blocks of both formats reused)
with the same greedy tokens. Runs in both suite modes: with OSPREY_ENGINE_PROCESS=1 the flags reach the
engine core child too."""
import pytest
import requests

from conftest import TINY, Server


def metric(server, name):
    for line in requests.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.split()[-1])
    return None


@pytest.fixture(scope="module")
def split():
    s = Server(TINY, "-ctk", "fp8", "--cache-type-v", "nvfp4")
    yield s
    rc = s.stop()
    assert rc == 0, s.read_log()[-4000:]


def test_memory_line_names_both_dtypes(split):
    log = split.read_log()
    assert "(K fp8, V nvfp4)" in log, log[-2000:]


def test_prefix_hit_same_tokens(split):
    client = split.client()
    prompt = "one two three four five six seven eight nine ten " * 6  # several full blocks
    first = client.completions.create(model=split.model, prompt=prompt, max_tokens=8, temperature=0)
    hits0 = metric(split, "vllm:prefix_cache_hits_total") or 0
    second = client.completions.create(model=split.model, prompt=prompt, max_tokens=8, temperature=0)
    hits1 = metric(split, "vllm:prefix_cache_hits_total") or 0
    assert first.usage.completion_tokens == 8
    assert second.choices[0].text == first.choices[0].text
    assert hits1 >= hits0 + 16, (hits0, hits1)
