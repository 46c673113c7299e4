"""HTTPS and the first-run items of `osprey serve` (issue 20): --ssl-keyfile / --ssl-certfile through
libmicrohttpd's TLS, `osprey serve MODEL` with the model as a positional argument (vllm serve's form),
and the start-up log (weight and KV memory in MiB, KV capacity in tokens, the URL to open, no
progress bar in a log file).

The key and certificate are test-only fixtures (tests/integration/fixtures/tls/README.md): a
self-signed certificate for 127.0.0.1 that the clients trust as their CA. The openai client
completes over https with it; plain http to the TLS port gets no answer (the handshake fails) and the
server goes on serving; a client that does not trust the certificate refuses it; every bad flag
(one of the pair, a missing file, a key that is not the certificate's, a certificate given as the
key, client-certificate flags) exits 1 with one line naming the flag before any model loads. The extra
API servers of --api-server-count and `osprey router` take the same flags."""
import os
import re
import ssl
import subprocess
import time

import openai
import pytest
import requests

from conftest import BIN, ENGINE_PROCESS, SMOL, TINY, free_port, last_line, retry_port_clash

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIX = os.path.join(ROOT, "tests", "integration", "fixtures", "tls")
KEY, CERT, OTHER_KEY = (os.path.join(FIX, n) for n in ("key.pem", "cert.pem", "other-key.pem"))


def need_bin():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")


class TlsProc:
    """`osprey serve` (cmd given) started on a free port; ready once GET /health answers 200 over
    https with CERT as the CA (or over http when tls is False)."""

    def __init__(self, args, tls=True, port=None, ready="/health"):
        self.tls, self.ready = tls, ready
        retry_port_clash(lambda: self._launch(args, port))

    def _launch(self, args, port):
        self.port = port or free_port()
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        self.log_path = f"/tmp/osprey-tls-{self.port}.log"
        self.log = open(self.log_path, "w+")
        cmd = [BIN, *args, "--port", str(self.port)]
        if ENGINE_PROCESS and cmd[1] == "serve" and "--engine-process" not in cmd and "--api-server-count" not in cmd:
            cmd.append("--engine-process")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                log = self.read_log()
                raise RuntimeError(f"exited {self.proc.returncode}: {last_line(log)}\n{log}")
            try:
                if requests.get(self.url + self.ready, timeout=2, verify=CERT).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.05)
        raise RuntimeError("did not come up: " + self.read_log())

    def read_log(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                rc = self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        else:
            rc = self.proc.returncode
        self.log.close()
        return rc


def serve_args(model, *extra):
    # the positional form (vllm serve MODEL)
    return ["serve", model, "-t", "2", "--kv-cache-memory", "64M", *extra]


@pytest.fixture(scope="module")
def tls_server():
    need_bin()
    s = TlsProc(serve_args(TINY, "--ssl-keyfile", KEY, "--ssl-certfile", CERT))
    yield s
    rc = s.stop()
    assert rc == 0, s.read_log()[-4000:]


def trusting_client(url, **kw):
    ctx = ssl.create_default_context(cafile=CERT)
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpxClient(verify=ctx), **kw)


def test_openai_client_over_https(tls_server):
    c = trusting_client(tls_server.url)
    model = c.models.list().data[0].id
    r = c.completions.create(model=model, prompt="over TLS", max_tokens=8, temperature=0)
    assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(model=model, prompt="over TLS", max_tokens=8,
                                                                          temperature=0, stream=True) if ch.choices)
    assert streamed == r.choices[0].text  # the same greedy tokens, streamed over TLS


def test_log_says_https(tls_server):
    log = tls_server.read_log()
    assert f"serving tiny-llama-q8_0.gguf on https://127.0.0.1:{tls_server.port} (no API key, TLS; " in log, log
    assert f"open https://127.0.0.1:{tls_server.port}/v1 as the OpenAI API base" in log, log
    assert f"--cacert {CERT}" in log, log


def test_plain_http_to_the_tls_port_fails(tls_server):
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{tls_server.port}/health", timeout=10)
    # a raw plaintext request gets no HTTP reply: GnuTLS drops the connection
    import socket
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    assert not got.startswith(b"HTTP/"), got
    # and the server goes on serving
    assert requests.get(tls_server.url + "/health", timeout=10, verify=CERT).status_code == 200


def test_client_without_the_ca_refuses(tls_server):
    c = openai.OpenAI(base_url=tls_server.url + "/v1", api_key="none", max_retries=0, timeout=30)
    with pytest.raises(openai.APIConnectionError):
        c.models.list()  # the system CAs do not vouch for the self-signed certificate
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(tls_server.url + "/health", timeout=10)


def run_serve(*args, timeout=60):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("extra,needle", [
    (["--ssl-keyfile", KEY], "--ssl-keyfile needs --ssl-certfile too"),
    (["--ssl-certfile", CERT], "--ssl-certfile needs --ssl-keyfile too"),
    (["--ssl-keyfile", "/nonexistent/key.pem", "--ssl-certfile", CERT], "--ssl-keyfile: cannot open '/nonexistent/key.pem'"),
    (["--ssl-keyfile", KEY, "--ssl-certfile", "/nonexistent/cert.pem"], "--ssl-certfile: cannot open '/nonexistent/cert.pem'"),
    (["--ssl-keyfile", OTHER_KEY, "--ssl-certfile", CERT], "The certificate and the given key do not match"),
    (["--ssl-keyfile", CERT, "--ssl-certfile", KEY], "holds no PEM private key"),
    (["--ssl-keyfile", KEY, "--ssl-certfile", KEY], "holds no PEM certificate"),
    (["--ssl-keyfile", FIX, "--ssl-certfile", CERT], "is not a regular file"),
    (["--ssl-keyfile", KEY, "--ssl-certfile", CERT, "--ssl-ca-certs", CERT], "--ssl-ca-certs (client certificate verification) is not implemented"),
    (["--ssl-keyfile", KEY, "--ssl-certfile", CERT, "--ssl-cert-reqs", "2"], "--ssl-cert-reqs: only 0"),
])
def test_bad_tls_flags(extra, needle):
    """Each is one clear line and exit 1, before the model loads (no 'loading model' line after the
    version), never a crash."""
    need_bin()
    r = run_serve("serve", TINY, "--port", "0", *extra)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert needle in r.stderr, r.stderr
    assert "loading model" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("osprey: error: "), r.stderr


def test_bad_tls_flags_router():
    need_bin()
    r = run_serve("router", "--backends", "http://127.0.0.1:9", "--port", "0", "--ssl-keyfile", OTHER_KEY,
                  "--ssl-certfile", CERT)
    assert r.returncode == 1 and "do not match" in r.stderr, r.stderr
    r = run_serve("router", "--backends", "http://127.0.0.1:9", "--port", "0", "--ssl-keyfile", KEY)
    assert r.returncode == 1 and "--ssl-keyfile needs --ssl-certfile too" in r.stderr, r.stderr


def test_router_over_https(server):
    """osprey router serves HTTPS to its clients with the same flags; it reaches the (plain http)
    backend as before."""
    need_bin()
    r = TlsProc(["router", "--backends", server.url, "--poll-interval", "50", "--ssl-keyfile", KEY, "--ssl-certfile",
                 CERT], ready="/metrics")
    try:
        assert re.search(r"routing to 1 backends on https://127\.0\.0\.1:\d+", r.read_log()), r.read_log()
        c = trusting_client(r.url)
        deadline = time.time() + 30
        while True:  # the router takes requests once its poller saw the backend healthy
            try:
                out = c.completions.create(model=server.model, prompt="via the router", max_tokens=4, temperature=0)
                break
            except openai.APIStatusError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        assert out.usage.completion_tokens == 4
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{r.port}/metrics", timeout=10)
    finally:
        assert r.stop() == 0, r.read_log()


def test_api_servers_share_the_tls_flags():
    """--api-server-count 2: the second frontend (started by the first, with serve's own arguments)
    serves HTTPS too: both log an https URL and every request over the shared port succeeds."""
    need_bin()
    s = TlsProc(serve_args(TINY, "--api-server-count", "2", "--ssl-keyfile", KEY, "--ssl-certfile", CERT))
    try:
        deadline = time.time() + 60
        while s.read_log().count(" on https://") < 2 and time.time() < deadline:
            time.sleep(0.1)
        log = s.read_log()
        assert log.count(" on https://") == 2 and " on http://" not in log, log
        c = trusting_client(s.url)
        model = c.models.list().data[0].id
        for i in range(8):  # SO_REUSEPORT spreads new connections over both; each must speak TLS
            fresh = trusting_client(s.url)
            # ignore_eos: the random tiny model may sample its EOS first (a 1-token answer failed CI here once)
            out = fresh.completions.create(model=model, prompt=f"n{i}", max_tokens=2, extra_body={"ignore_eos": True})
            assert out.usage.completion_tokens == 2
    finally:
        assert s.stop() == 0, s.read_log()[-4000:]


# ---- osprey serve MODEL and the start-up log ----------------------------------------------------

def test_positional_model_and_startup_log():
    """`osprey serve MODEL` serves MODEL; the log has the memory line (weights and KV cache in MiB, KV
    capacity in tokens), the http URL to open, and no progress bar (stderr is a file, not a TTY)."""
    need_bin()
    model = SMOL if os.path.exists(SMOL) else TINY
    s = TlsProc(serve_args(model), tls=False)
    try:
        r = requests.get(s.url + "/v1/models", timeout=10).json()
        assert r["data"][0]["id"] == os.path.basename(model)
        log = s.read_log()
        m = re.search(r"memory: weights ([0-9.]+) MiB \((CPU, mapped from the file|GPU)\), KV cache ([0-9.]+) MiB \((\w+)\), "
                      r"KV capacity (\d+) tokens \((\d+) blocks of (\d+)\)", log)
        if ENGINE_PROCESS:
            # the core process logs the memory line; the frontend logs the capacity it was told
            assert re.search(r"engine core process \d+ ready \(epoch 0\): KV cache capacity (\d+) tokens", log), log
        assert m, log
        weights_mib, kv_mib = float(m.group(1)), float(m.group(3))
        assert abs(weights_mib * 2**20 - sum_tensor_bytes(model)) <= 0.1 * 2**20, (weights_mib, log)
        assert kv_mib == 64.0  # --kv-cache-memory 64M
        assert int(m.group(5)) == int(m.group(6)) * int(m.group(7))
        health = requests.get(s.url + "/health", timeout=10).json()
        assert int(m.group(6)) == health["kv_cache_total_blocks"], health
        assert f"open http://127.0.0.1:{s.port}/v1 as the OpenAI API base, e.g. curl http://127.0.0.1:{s.port}/v1/models" in log
        assert "loading weights [" not in log and "\r" not in log, log
        assert "model loaded" in log and log.index("model loaded") < log.index("serving ")  # kept for other tests
    finally:
        assert s.stop() == 0, s.read_log()[-4000:]


def sum_tensor_bytes(path):
    """The GGUF's tensor data bytes: the file size less the header, which ends where the first
    tensor's data starts (GGUF v3: tensor data section, aligned; the last tensor ends the file)."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"GGUF"
    off = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", data, off)
    off += 16
    align = 32

    def read_str(o):
        n = struct.unpack_from("<Q", data, o)[0]
        return data[o + 8:o + 8 + n].decode(), o + 8 + n
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_val(t, o):
        if t == 8:
            return read_str(o)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, o)
            o += 12
            for _ in range(n):
                o = skip_val(et, o)
            return o
        return o + sizes[t]
    for _ in range(n_kv):
        key, off = read_str(off)
        t = struct.unpack_from("<I", data, off)[0]
        off += 4
        if key == "general.alignment":
            align = struct.unpack_from("<I", data, off)[0]
        off = skip_val(t, off)
    for _ in range(n_tensors):
        _, off = read_str(off)
        nd = struct.unpack_from("<I", data, off)[0]
        off += 4 + 8 * nd + 4 + 8
    start = (off + align - 1) // align * align
    return len(data) - start


def test_positional_and_flag_must_agree():
    need_bin()
    r = run_serve("serve", TINY, "-m", SMOL, "--port", "0")
    assert r.returncode == 1 and "two different models" in r.stderr, r.stderr
    r = run_serve("serve", TINY, "extra", "--port", "0")
    assert r.returncode == 1 and "unexpected argument 'extra'" in r.stderr, r.stderr
    r = run_serve("serve", "--port", "0")
    assert r.returncode == 1 and "serve needs a model" in r.stderr, r.stderr


def test_positional_and_same_flag_serve():
    """The same file both ways (here through two spellings of its path) is one model, not an error."""
    need_bin()
    alias = os.path.join(os.path.dirname(TINY), ".", os.path.basename(TINY))
    s = TlsProc(["serve", TINY, "-m", alias, "-t", "1", "--kv-cache-memory", "16M"], tls=False)
    try:
        assert requests.get(s.url + "/v1/models", timeout=10).json()["data"][0]["id"] == os.path.basename(TINY)
    finally:
        assert s.stop() == 0


def test_abandoned_request_over_tls_is_aborted():
    """A non-streaming request whose TLS client hangs up is aborted and its KV blocks freed, as over
    plain http (the server watches the TCP socket under the TLS session): far fewer than max_tokens are
    generated, and the request counts as finished_reason="abort"."""
    need_bin()
    if not os.path.exists(SMOL):
        pytest.skip(f"no SmolLM2 model at {SMOL} (make fetch)")
    import json
    import socket
    from test_dos import wait_for
    s = TlsProc(serve_args(SMOL, "--ssl-keyfile", KEY, "--ssl-certfile", CERT))
    try:
        s.health = lambda: requests.get(s.url + "/health", timeout=10, verify=CERT).json()

        def metric_tls(name, **labels):  # test_dos.metric, over https
            for line in requests.get(s.url + "/metrics", timeout=10, verify=CERT).text.splitlines():
                if (line.startswith(name + "{") or line.startswith(name + " ")) and \
                        all(f'{k}="{v}"' in line for k, v in labels.items()):
                    return float(line.split()[-1])
            return 0.0
        n = 2000  # within the 64M cache's 2912 tokens
        gen0 = metric_tls("vllm:generation_tokens_total")
        ctx = ssl.create_default_context(cafile=CERT)
        raw = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        c = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        body = json.dumps({"prompt": "a", "max_tokens": n, "ignore_eos": True}).encode()
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert wait_for(lambda: s.health()["num_requests_running"] >= 1, timeout=30)
        c.close()
        wait_for(lambda: metric_tls("vllm:request_success_total", finished_reason="abort") >= 1
                 or metric_tls("vllm:request_success_total", finished_reason="length") >= 1, timeout=120)
        assert metric_tls("vllm:request_success_total", finished_reason="abort") == 1
        assert metric_tls("vllm:request_success_total", finished_reason="length") == 0
        assert metric_tls("vllm:generation_tokens_total") - gen0 < n
        assert wait_for(lambda: (lambda h: h["kv_cache_free_blocks"] == h["kv_cache_total_blocks"]
                                 and h["num_requests_running"] == 0)(s.health()), timeout=30), s.health()
    finally:
        assert s.stop() == 0, s.read_log()[-4000:]
