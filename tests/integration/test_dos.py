"""Denial-of-service bounds of `osprey serve` (issue 20), each a bounded loopback test that counts
(no timed assertions): a non-streaming request whose client went away is aborted and its KV blocks
freed, whatever the client left unread; the connection caps (--max-connections, --max-connections-
per-client) and the inactivity timeout (--connection-timeout) keep a flood of half-sent requests from
one client from locking out everyone else; over the cap a request gets 503 with Retry-After."""
import json
import socket
import struct
import time

import pytest
import requests


def metric(server, name, **labels):
    """The value of one /metrics series (labels matched as given, model_name ignored), else 0."""
    for line in requests.get(server.url + "/metrics", timeout=10).text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.split()[-1])
    return 0.0


def wait_for(pred, timeout=60, step=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def post_raw(port, body, src="127.0.0.1"):
    c = socket.socket()
    c.bind((src, 0))
    c.settimeout(10)
    c.connect(("127.0.0.1", port))
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return c


@pytest.mark.parametrize("how", ["close", "unread-bytes-then-close", "reset"])
def test_abandoned_plain_request_is_aborted(smol, how):
    # a non-streaming request whose client hung up is aborted, counted as finished_reason="abort", its
    # blocks freed, and far fewer than max_tokens generated. "unread-bytes-then-close": the client sent
    # a few bytes after its request (a pipelined request's start) before closing; the server's peek saw
    # those bytes and took the client for alive, so the request ran to max_tokens (fails on c8d3dac)
    n = 2000
    aborted0 = metric(smol, "vllm:request_success_total", finished_reason="abort")
    length0 = metric(smol, "vllm:request_success_total", finished_reason="length")
    gen0 = metric(smol, "vllm:generation_tokens_total")
    c = post_raw(smol.port, json.dumps({"prompt": "a", "max_tokens": n, "ignore_eos": True}).encode())
    assert wait_for(lambda: smol.health()["num_requests_running"] >= 1, timeout=30)
    if how == "unread-bytes-then-close":
        c.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.1)
    if how == "reset":
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    # ends one way or the other: aborted (right), or run to its end (the bug)
    wait_for(lambda: metric(smol, "vllm:request_success_total", finished_reason="abort") > aborted0
             or metric(smol, "vllm:request_success_total", finished_reason="length") > length0, timeout=120)
    assert metric(smol, "vllm:request_success_total", finished_reason="abort") == aborted0 + 1
    assert metric(smol, "vllm:request_success_total", finished_reason="length") == length0
    assert metric(smol, "vllm:generation_tokens_total") - gen0 < n
    h = wait_for(lambda: (lambda h: h if h["kv_cache_free_blocks"] == h["kv_cache_total_blocks"]
                          and h["num_requests_running"] == 0 else None)(smol.health()), timeout=30)
    assert h, smol.health()
