"""/v1/embeddings through the official openai client (client.embeddings.create) against `osprey serve`
on SmolLM2 (default pooling: last token, L2-normalized): the reply's shape and usage, base64 equal to
float, batches equal to singles, token-id inputs equal to text, a paraphrase pair closer than an
unrelated pair, embeddings next to a running generation, and the 400s of bad requests."""
import base64
import concurrent.futures
import math
import struct

import openai
import pytest
import requests

N_EMBD = 576  # SmolLM2-135M's hidden size


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def close(a, b, tol=1e-5):
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= tol


def tokenize(server, text):
    return requests.post(server.url + "/tokenize", json={"prompt": text}).json()["tokens"]


def test_shape_usage_and_norm(smol):
    c = smol.client()
    text = "The quick brown fox jumps over the lazy dog."
    r = c.embeddings.create(model=smol.model, input=text, encoding_format="float")
    assert r.object == "list" and r.model == smol.model
    assert len(r.data) == 1 and r.data[0].index == 0 and r.data[0].object == "embedding"
    v = r.data[0].embedding
    assert len(v) == N_EMBD and all(isinstance(x, float) for x in v)
    assert abs(sum(x * x for x in v) - 1.0) < 1e-4  # L2-normalized by default
    n = len(tokenize(smol, text))
    assert r.usage.prompt_tokens == n and r.usage.total_tokens == n


def test_base64_equals_float(smol):
    c = smol.client()
    text = "Embeddings in base64 are little-endian float32."
    f = c.embeddings.create(model=smol.model, input=text, encoding_format="float").data[0].embedding
    # the client's default asks for base64 and decodes it itself
    d = c.embeddings.create(model=smol.model, input=text).data[0].embedding
    assert d == f
    # asked explicitly, the client hands the string over: decode it by hand
    b = c.embeddings.create(model=smol.model, input=text, encoding_format="base64").data[0].embedding
    assert isinstance(b, str)
    raw = base64.b64decode(b)
    assert len(raw) == 4 * N_EMBD
    assert list(struct.unpack("<%df" % N_EMBD, raw)) == f


def test_batch_equals_singles_and_ids_equal_text(smol):
    c = smol.client()
    texts = ["A red apple.", "Paris is the capital of France, a country in Europe.", "1 2 3 4 5 6 7 8 9 10"]
    batch = c.embeddings.create(model=smol.model, input=texts, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2]
    total = 0
    for i, t in enumerate(texts):
        single = c.embeddings.create(model=smol.model, input=t, encoding_format="float").data[0].embedding
        assert close(batch.data[i].embedding, single), i
        total += len(tokenize(smol, t))
    assert batch.usage.prompt_tokens == total
    # token ids: one list, and a list of lists, give the text's vectors
    ids = [tokenize(smol, t) for t in texts]
    one = c.embeddings.create(model=smol.model, input=ids[1], encoding_format="float").data[0].embedding
    assert close(one, batch.data[1].embedding)
    many = c.embeddings.create(model=smol.model, input=ids, encoding_format="float")
    for i in range(3):
        assert close(many.data[i].embedding, batch.data[i].embedding), i


def test_paraphrase_closer_than_unrelated(smol):
    c = smol.client()
    sets = [("The cat sat on the mat.", "A cat was sitting on the rug.", "Stock markets fell sharply on Tuesday."),
            ("How do I bake bread at home?", "What is a recipe for homemade bread?", "The rocket launched into orbit."),
            ("I love playing football with my friends.", "Playing soccer with friends is my favorite.",
             "Quantum computers use qubits.")]
    for a, b, u in sets:
        e = [d.embedding for d in c.embeddings.create(model=smol.model, input=[a, b, u], encoding_format="float").data]
        assert cos(e[0], e[1]) > cos(e[0], e[2]) + 0.05, (a, cos(e[0], e[1]), cos(e[0], e[2]))


def test_embeddings_beside_generation(smol):
    """Embedding requests share the engine's steps with a running generation: both answer, and the vectors
    are those of the requests run alone."""
    c = smol.client()
    texts = ["Batched with a chat.", "Another input in the same steps."]
    alone = [d.embedding for d in c.embeddings.create(model=smol.model, input=texts, encoding_format="float").data]
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        chat = ex.submit(c.chat.completions.create, model=smol.model, max_tokens=48, temperature=0,
                         messages=[{"role": "user", "content": "Count from one to twenty."}])
        embs = [ex.submit(c.embeddings.create, model=smol.model, input=texts, encoding_format="float") for _ in range(3)]
        assert chat.result().choices[0].message.content
        for f in embs:
            got = [d.embedding for d in f.result().data]
            assert all(close(g, a) for g, a in zip(got, alone))


def test_user_is_advisory(smol):
    c = smol.client()
    a = c.embeddings.create(model=smol.model, input="same", encoding_format="float").data[0].embedding
    b = c.embeddings.create(model=smol.model, input="same", encoding_format="float", user="u-42").data[0].embedding
    assert a == b


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [""]}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [1, "a"]}, "input"),
    ({"input": [49152]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": 5}, "input"),
    ({}, "input"),
    ({"input": "x", "dimensions": 64}, "dimensions"),
    ({"input": "x", "dimensions": "64"}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "stream": True}, "stream"),
    ({"input": "x", "max_tokens": 4}, "max_tokens"),
    ({"input": "x", "truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
    ({"input": ["x"] * 129}, "input"),
])
def test_bad_requests(smol, body, param):
    r = requests.post(smol.url + "/v1/embeddings", json={"model": smol.model, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError" and err["param"] == param and err["message"]


def test_errors_through_the_client(smol):
    c = smol.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.embeddings.create(model=smol.model, input="x", dimensions=32)
    assert "dimensions" in str(e.value) and "576" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        c.embeddings.create(model="no-such-model", input="x")
    # longer than the context (8192 tokens): 400 naming the input
    with pytest.raises(openai.BadRequestError) as e:
        c.embeddings.create(model=smol.model, input=[[1] * 8193])
    assert "maximum context length" in str(e.value)


def test_pooling_flags(smol):
    """--no-embd-normalize gives the raw pooled vector (normalized by hand: the default server's);
    --pooling mean gives another vector, normalized."""
    from conftest import SMOL, Server
    text = "Pooling flags change the vector."
    ref = smol.client().embeddings.create(model=smol.model, input=text, encoding_format="float").data[0].embedding
    raw_srv = Server(SMOL, "--served-model-name", "smollm2", "--no-embd-normalize")
    try:
        raw = raw_srv.client().embeddings.create(model="smollm2", input=text, encoding_format="float").data[0].embedding
    finally:
        assert raw_srv.stop() == 0
    norm = math.sqrt(sum(x * x for x in raw))
    assert abs(norm - 1.0) > 1e-3
    assert close([x / norm for x in raw], ref)
    mean_srv = Server(SMOL, "--served-model-name", "smollm2", "--pooling", "mean")
    try:
        mean = mean_srv.client().embeddings.create(model="smollm2", input=text, encoding_format="float").data[0].embedding
    finally:
        assert mean_srv.stop() == 0
    assert abs(sum(x * x for x in mean) - 1.0) < 1e-4 and not close(mean, ref, 1e-3)
