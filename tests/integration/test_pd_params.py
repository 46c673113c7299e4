"""Prefill/decode disaggregation at one server's edge: `osprey serve --kv-transfer-config JSON` (vLLM's
flag, osprey's connector) and a request's `kv_transfer_params` (vLLM's NixlConnector fields). Every
malformed or disallowed kv_transfer_params is a 400 naming it; a server without the flag refuses any
that asks for something; a bad --kv-transfer-config stops `osprey serve` with a message naming the key;
a producer answers a do_remote_decode request with the kv_transfer_params a proxy copies into the decode
request (one remote block id per full prompt block), or null when no block is full. The two-server P/D
path through the router is tests/integration/test_pd_*.py's. Runs in both suite modes (with
OSPREY_ENGINE_PROCESS=1 the config reaches the engine core child, and its listener comes back in READY)."""
import os
import re
import subprocess

import pytest
import requests

from conftest import BIN, TINY, Server

PRODUCER = '{"kv_connector": "OspreyConnector", "kv_role": "kv_producer"}'
CONSUMER = '{"kv_connector": "OspreyConnector", "kv_role": "kv_consumer", "kv_buffer_size": 1e8}'

PREFILL_FROM = {"do_remote_prefill": True, "remote_engine_id": "00112233aabbccdd", "remote_host": "127.0.0.1",
                "remote_port": 9, "remote_request_id": "0000000000000001", "remote_block_ids": [0, 1, 2]}


def started(*extra):
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    return Server(TINY, *extra)


@pytest.fixture(scope="module")
def producer():
    s = started("--kv-transfer-config", PRODUCER, "--prefix-caching-hash-seed", "5", "--trust-request-chat-template")
    yield s
    assert s.stop() == 0, s.read_log()[-4000:]


@pytest.fixture(scope="module")
def consumer():
    s = started("--kv-transfer-config", CONSUMER, "--prefix-caching-hash-seed", "5")
    yield s
    assert s.stop() == 0, s.read_log()[-4000:]


def post(s, kvp, route="completions", **body):
    body.setdefault("max_tokens", 2)
    body.setdefault("temperature", 0)
    if route == "completions":
        body.setdefault("prompt", "Hello there")
    else:
        body.setdefault("messages", [{"role": "user", "content": "Hello"}])
    if kvp is not ...:
        body["kv_transfer_params"] = kvp
    return requests.post(f"{s.url}/v1/{route}", json={"model": s.model, **body}, timeout=60)


def refused(r, *says):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "kv_transfer_params", err
    for w in says:
        assert w in err["message"], err
    return err["message"]


def metric(s, name):
    for line in requests.get(s.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.split()[-1])
    return None


# ---- 400s ------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_malformed_params_are_400(producer, route):
    refused(post(producer, [True], route), "must be an object")
    refused(post(producer, "do_remote_decode", route), "must be an object")
    refused(post(producer, {"do_remote_decode": True, "bogus": 1}, route), "bogus")
    refused(post(producer, {"do_remote_decode": "yes"}, route), "do_remote_decode", "boolean")
    refused(post(producer, {"do_remote_decode": True, "tp_size": 2}, route), "tp_size")
    refused(post(producer, {"do_remote_decode": True, "do_remote_prefill": True}, route), "both")
    bad = [("remote_engine_id", "xyz"), ("remote_engine_id", "0011223344556677aa"), ("remote_engine_id", 5),
           ("remote_request_id", "g000000000000000"), ("remote_host", ""), ("remote_host", "h" * 300),
           ("remote_host", 7), ("remote_port", 0), ("remote_port", 70000), ("remote_port", "80"),
           ("remote_block_ids", [0, -1]), ("remote_block_ids", [0, 1.5]), ("remote_block_ids", 3)]
    for key, val in bad:
        refused(post(producer, {"do_remote_decode": True, key: val}, route), key)


def test_prefill_needs_every_remote_field(consumer):
    for key in ("remote_engine_id", "remote_host", "remote_port", "remote_request_id", "remote_block_ids"):
        kvp = {k: v for k, v in PREFILL_FROM.items() if k != key}
        refused(post(consumer, kvp), "do_remote_prefill", key)
        kvp[key] = None  # null is "not given"
        refused(post(consumer, kvp), key)


def test_remote_decode_is_one_unstreamed_choice(producer):
    refused(post(producer, {"do_remote_decode": True}, stream=True), "stream")
    refused(post(producer, {"do_remote_decode": True}, "chat/completions", stream=True), "stream")
    refused(post(producer, {"do_remote_decode": True}, n=2), "n = 1")
    refused(post(producer, {"do_remote_decode": True}, prompt=["a b", "c d"]), "single prompt")


def test_roles(producer, consumer):
    refused(post(producer, PREFILL_FROM), "do_remote_prefill", "kv_consumer", "kv_producer")
    refused(post(consumer, {"do_remote_decode": True}), "do_remote_decode", "kv_producer", "kv_consumer")


def test_server_without_config_refuses(server):
    refused(post(server, {"do_remote_decode": True}), "--kv-transfer-config")
    refused(post(server, PREFILL_FROM), "--kv-transfer-config")
    refused(post(server, {"do_remote_decode": True}, "chat/completions"), "--kv-transfer-config")
    # nothing asked: accepted, and the reply has no kv_transfer_params
    for kvp in ({}, {"do_remote_decode": False, "do_remote_prefill": False}, None):
        r = post(server, kvp)
        assert r.status_code == 200, r.text
        assert "kv_transfer_params" not in r.json()
    # still checked for shape, and unknown keys named
    refused(post(server, {"remote_port": 0}), "remote_port")
    refused(post(server, {"nope": True}), "nope")


def test_plain_requests_on_a_producer_have_no_key(producer):
    r = post(producer, ...)
    assert r.status_code == 200, r.text
    assert "kv_transfer_params" not in r.json()


def test_metrics_only_with_a_role(producer, server):
    for name in ("osprey:kv_transfer_held", "osprey:kv_transfer_held_blocks", "osprey:kv_transfer_sent_blocks_total",
                 "osprey:kv_transfer_dropped_total", "osprey:kv_transfer_recv_blocks_total",
                 "osprey:kv_transfer_failed_blocks_total", "osprey:kv_transfer_recv_seconds_total"):
        assert metric(producer, name) is not None, name
        assert metric(server, name) is None, name


# ---- --kv-transfer-config errors ------------------------------------------------------------------


@pytest.mark.parametrize("cfg,says", [
    ("{not json", "not JSON"),
    ('["kv_producer"]', "must be a JSON object"),
    ('{"kv_connector": "OspreyConnector", "kv_role": "kv_producer", "kv_rank": 0}', "'kv_rank'"),
    ('{"kv_connector": "OspreyConnector", "kv_role": "producer"}', "'kv_role'"),
    ('{"kv_connector": "OspreyConnector"}', "'kv_role'"),
    ('{"kv_role": "kv_producer"}', "'kv_connector'"),
    ('{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}', "'kv_connector'"),
    ('{"kv_connector": "OspreyConnector", "kv_role": "kv_producer", "kv_port": 70000}', "'kv_port'"),
    ('{"kv_connector": "OspreyConnector", "kv_role": "kv_producer", "kv_port": "1"}', "'kv_port'"),
    ('{"kv_connector": "OspreyConnector", "kv_role": "kv_producer", "kv_ip": ""}', "'kv_ip'"),
    ('{"kv_connector": "OspreyConnector", "kv_role": "kv_producer", "kv_buffer_size": 0}', "'kv_buffer_size'"),
    ('{"kv_connector": "OspreyConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"timeout_s": 0}}',
     "timeout_s"),
    ('{"kv_connector": "OspreyConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"x": 1}}',
     "kv_connector_extra_config.x"),
    ('{"kv_connector": "OspreyConnector", "kv_role": "kv_both", "kv_connector_extra_config": 3}',
     "'kv_connector_extra_config'"),
])
def test_bad_config_stops_serve(cfg, says):
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    r = subprocess.run([BIN, "serve", "-m", TINY, "--port", "0", "--kv-transfer-config", cfg], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and says in r.stderr, r.stderr
    assert "--kv-transfer-config" in r.stderr


def test_help_names_the_flag():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    out = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "--kv-transfer-config JSON" in out


# ---- a producer's reply (needs the engine side) ----------------------------------------------------


def listening(s):
    m = re.search(r"kv transfer: producer listening on ([^ ]+):(\d+)", s.read_log())
    assert m, s.read_log()[-3000:]
    return m.group(1), int(m.group(2))


def test_producer_logs_its_listener(producer):
    host, port = listening(producer)
    assert host == "127.0.0.1" and 0 < port < 65536


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_producer_returns_its_blocks(producer, route):
    host, port = listening(producer)
    words = " ".join(f"w{i}" for i in range(60))  # about 100 tokens on the tiny model's vocabulary
    body = {"prompt": words} if route == "completions" else {"messages": [{"role": "user", "content": words}],
                                                             "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    # vLLM's toy proxy sends the remote_* fields as null with do_remote_decode
    r = post(producer, {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                        "remote_block_ids": None, "remote_host": None, "remote_port": None}, route, max_tokens=1, **body)
    assert r.status_code == 200, r.text
    j = r.json()
    n_prompt = j["usage"]["prompt_tokens"]
    assert 80 <= n_prompt <= 200, n_prompt
    kvp = j["kv_transfer_params"]
    assert kvp["do_remote_prefill"] is True and kvp["do_remote_decode"] is False
    assert kvp["remote_block_ids"] == list(range(n_prompt // 16))
    assert kvp["remote_host"] == host and kvp["remote_port"] == port
    assert re.fullmatch(r"[0-9a-f]{16}", kvp["remote_engine_id"]), kvp
    assert re.fullmatch(r"[0-9a-f]{16}", kvp["remote_request_id"]), kvp
    assert kvp["tp_size"] == 1
    assert metric(producer, "osprey:kv_transfer_held") >= 1
    assert metric(producer, "osprey:kv_transfer_held_blocks") >= n_prompt // 16


def test_short_prompt_holds_nothing(producer):
    r = post(producer, {"do_remote_decode": True}, prompt=[5, 6, 7, 8, 9], max_tokens=1)
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["usage"]["prompt_tokens"] == 5
    assert "kv_transfer_params" in j and j["kv_transfer_params"] is None
