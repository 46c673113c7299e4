"""`osprey serve --engine-process` (issue 23): the EngineCore in a child process and its lifecycle.
Each test starts its own server with --engine-process (so it runs once, in the default suite run):
kill -9 of the core during 32 streaming requests (every client gets an error event + [DONE] or a
complete answer, none hangs past 2 s, the restart is counted, the next 100 requests succeed and no
KV block is left allocated), a client disconnect that reaches the core and frees the blocks, and
/health saying not-ready while the core is down."""
import concurrent.futures
import json
import os
import signal
import socket
import threading
import time

import pytest
import requests

from conftest import BIN, ENGINE_PROCESS, TINY, Server

pytestmark = pytest.mark.skipif(ENGINE_PROCESS, reason="starts its own --engine-process servers; run once, in the default run")


def core_pid(server):
    """The pid of the server's engine core child."""
    for task in os.listdir(f"/proc/{server.proc.pid}/task"):
        with open(f"/proc/{server.proc.pid}/task/{task}/children") as f:
            for pid in f.read().split():
                with open(f"/proc/{pid}/cmdline", "rb") as c:
                    if b"__engine-core" in c.read():
                        return int(pid)
    return None


def metric(server, name):
    for line in requests.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def wait_for(pred, timeout=60, step=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


@pytest.fixture()
def proc_server():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    s = Server(TINY, "--engine-process", "--max-num-seqs", "64")
    yield s
    rc = s.stop()
    assert rc == 0, s.read_log()[-4000:]


def stream_one(server, started, results, i, killed_at):
    """One streaming request read to its end: ('done', t_end) for a complete answer, ('error', t_end)
    for an SSE error event followed by [DONE], ('bad', why) otherwise."""
    body = {"model": server.model, "prompt": f"request {i}", "max_tokens": 1800, "ignore_eos": True, "stream": True}
    try:
        with requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=(10, 10)) as r:
            if r.status_code != 200:
                results[i] = ("bad", f"status {r.status_code}")
                started.release()
                return
            first, error, finish = True, False, None
            for line in r.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if first:
                    started.release()
                    first = False
                if data == b"[DONE]":
                    t = time.time()
                    if error:
                        results[i] = ("error", t)
                    elif finish == "length":
                        results[i] = ("done", t)
                    else:
                        results[i] = ("bad", f"[DONE] after finish {finish}")
                    return
                obj = json.loads(data)
                if "error" in obj:
                    assert obj["error"]["code"] == 503 and "engine core" in obj["error"]["message"]
                    error = True
                elif obj["choices"][0]["finish_reason"]:
                    finish = obj["choices"][0]["finish_reason"]
            results[i] = ("bad", "stream ended without [DONE]")
    except Exception as e:  # a hang shows up here as a read timeout
        results[i] = ("bad", repr(e))
    finally:
        if first:
            started.release()


def test_kill_core_during_streams(proc_server):
    s = proc_server
    pid = core_pid(s)
    assert pid
    n = 32
    started = threading.Semaphore(0)
    results = [None] * n
    killed_at = [0.0]
    threads = [threading.Thread(target=stream_one, args=(s, started, results, i, killed_at)) for i in range(n)]
    for t in threads:
        t.start()
    for _ in range(n):  # every stream has its first chunk: all 32 are in flight
        started.acquire()
    killed_at[0] = time.time()
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(30)
    kinds = [r[0] if r else "bad" for r in results]
    assert "bad" not in kinds, [r for r in results if not r or r[0] == "bad"]
    assert kinds.count("error") > 0  # the kill did land while they ran
    late = [r[1] - killed_at[0] for r in results if r[0] == "error"]
    assert max(late) < 2.0, late  # none hangs past 2 s after the core died
    # the restart: counted, a new core, ready again
    assert wait_for(lambda: metric(s, "osprey:engine_core_restarts_total") == 1)
    assert wait_for(lambda: requests.get(s.url + "/health", timeout=10).status_code == 200)
    assert core_pid(s) not in (None, pid)

    # the next 100 requests succeed
    def one(i):
        r = requests.post(s.url + "/v1/completions", json={"model": s.model, "prompt": f"after {i}", "max_tokens": 8,
                                                           "ignore_eos": True}, timeout=60)
        return r.status_code, r.json()

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(one, range(100)))
    assert all(code == 200 and o["choices"][0]["finish_reason"] == "length" for code, o in outs), outs[:3]
    # no block left allocated in the new core
    h = wait_for(lambda: (lambda j: j if j["num_requests_running"] == 0 and j["kv_cache_free_blocks"] == j["kv_cache_total_blocks"]
                          else None)(requests.get(s.url + "/health", timeout=10).json()))
    assert h, requests.get(s.url + "/health", timeout=10).json()


def test_health_not_ready_while_core_down(monkeypatch):
    """Between the core's death and its successor's READY (held back 1.5 s by a test hook), /health is
    503 "engine core restarting" and a generation request gets 503 with Retry-After; then both recover."""
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    monkeypatch.setenv("OSPREY_ENGINE_CORE_RESTART_DELAY_MS", "1500")
    s = Server(TINY, "--engine-process")
    try:
        pid = core_pid(s)
        os.kill(pid, signal.SIGKILL)
        # (a Response is falsy for a 503: wrap it)
        h = wait_for(lambda: (lambda r: [r] if r.status_code == 503 else None)(requests.get(s.url + "/health", timeout=10)), timeout=10)
        assert h and h[0].json()["status"] == "engine core restarting"
        r = requests.post(s.url + "/v1/completions", json={"model": s.model, "prompt": "x", "max_tokens": 2}, timeout=10)
        if r.status_code != 200:  # the new core may just have come up; else it is refused, with Retry-After
            assert r.status_code == 503 and r.headers.get("Retry-After") and "engine core" in r.json()["error"]["message"]
        assert wait_for(lambda: requests.get(s.url + "/health", timeout=10).status_code == 200)
        r = requests.post(s.url + "/v1/completions", json={"model": s.model, "prompt": "x", "max_tokens": 2}, timeout=10)
        assert r.status_code == 200
        assert metric(s, "osprey:engine_core_restarts_total") == 1
    finally:
        assert s.stop() == 0, s.read_log()[-4000:]


def test_disconnect_reaches_core(proc_server):
    """A streaming client that hangs up: its request is aborted in the core and the blocks come back."""
    s = proc_server
    body = json.dumps({"model": s.model, "prompt": "hang up", "max_tokens": 1900, "ignore_eos": True, "stream": True}).encode()
    c = socket.create_connection(("127.0.0.1", s.port))
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    c.settimeout(30)
    while b"data: " not in got:  # the headers may come alone first
        chunk = c.recv(4096)
        assert chunk, got
        got += chunk
    c.close()
    h = wait_for(lambda: (lambda j: j if j["num_requests_running"] == 0 and j["kv_cache_free_blocks"] == j["kv_cache_total_blocks"]
                          else None)(requests.get(s.url + "/health", timeout=10).json()))
    assert h
    log = s.read_log()
    assert "client disconnected" in log
    assert "1900 output tokens" not in log  # aborted, not run to its end


def test_two_api_servers(monkeypatch):
    """--api-server-count 2: two frontend processes on one port share one core. 128 concurrent streams
    (about 64 through each; both serve some) each receive exactly their own tokens: the text equals a
    non-streamed request with the same prompt and seed made afterwards (seeded sampling: a request's
    tokens do not depend on its batch; the tiny model's greedy text is the same for every prompt). Then the core is killed under 16
    streams: every one ends with an error event + [DONE] or completes (the second frontend notices the
    core's connection closing), and both serve again."""
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    s = Server(TINY, "--api-server-count", "2", "--max-num-seqs", "128")
    try:
        assert wait_for(lambda: s.read_log().count("serving ") >= 2, timeout=60)

        def stream_text(i):
            body = {"model": s.model, "prompt": f"stream {i} says", "max_tokens": 24, "ignore_eos": True, "temperature": 1.0, "seed": i, "stream": True}
            text, done = [], False
            with requests.post(s.url + "/v1/completions", json=body, stream=True, timeout=(10, 60)) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line == b"data: [DONE]":
                        done = True
                    elif line.startswith(b"data: "):
                        text.append(json.loads(line[6:])["choices"][0]["text"])
            assert done
            return "".join(text)

        def plain_text(i):
            body = {"model": s.model, "prompt": f"stream {i} says", "max_tokens": 24, "ignore_eos": True, "temperature": 1.0, "seed": i}
            r = requests.post(s.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200
            return r.json()["choices"][0]["text"]

        with concurrent.futures.ThreadPoolExecutor(128) as ex:
            got = list(ex.map(stream_text, range(128)))
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            want = list(ex.map(plain_text, range(128)))
        assert got == want
        assert len(set(got)) > 1  # the prompts do lead to different texts
        # both frontends served: each process' response ids share their own random 16-digit prefix
        prefixes = {line.split("request cmpl-")[1][:16] for line in s.read_log().splitlines() if "request cmpl-" in line}
        assert len(prefixes) == 2, prefixes

        pid = core_pid(s)
        n = 16
        started = threading.Semaphore(0)
        results = [None] * n
        threads = [threading.Thread(target=stream_one, args=(s, started, results, i, None)) for i in range(n)]
        for t in threads:
            t.start()
        for _ in range(n):
            started.acquire()
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        for t in threads:
            t.join(30)
        assert all(r and r[0] in ("error", "done") for r in results), results
        assert max(r[1] - killed for r in results) < 2.0
        assert wait_for(lambda: requests.get(s.url + "/health", timeout=10).status_code == 200)
        # both frontends serve again (several requests: the kernel spreads connections over them)
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            again = list(ex.map(lambda i: wait_for(lambda: requests.post(
                s.url + "/v1/completions", json={"model": s.model, "prompt": "again", "max_tokens": 2}, timeout=30).status_code == 200,
                timeout=30), range(16)))
        assert all(again)
    finally:
        assert s.stop() == 0, s.read_log()[-4000:]
