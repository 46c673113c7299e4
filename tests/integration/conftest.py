"""Fixtures for the `osprey serve` integration suite: each starts the server binary ($OSPREY_BIN, else
build/bin/osprey) on a free loopback port with a model from the repository and stops it with SIGTERM
at the end, checking that it exits 0 (drained). The tiny random model (tests/models) serves most
tests; SmolLM2 (models/, fetched by `make fetch`) serves the chat tests and is skipped when absent.
Both take a request's own chat_template (--trust-request-chat-template; off by default).
With OSPREY_ENGINE_PROCESS=1 every server runs its EngineCore in a child process (--engine-process):
ctest runs the whole suite once in each mode (integration_server, integration_server_process)."""
import os
import signal
import socket
import subprocess
import time

import openai
import pytest
import requests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("OSPREY_BIN", os.path.join(ROOT, "build", "bin", "osprey"))
TINY = os.path.join(ROOT, "tests", "models", "tiny-llama-q8_0.gguf")
SMOL = os.environ.get("OSPREY_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
ENGINE_PROCESS = os.environ.get("OSPREY_ENGINE_PROCESS") == "1"


def free_port():
    """A port free on every address: probed on the wildcard, as the servers bind their ZeroMQ endpoints
    (tcp://*:P). A probe on 127.0.0.1 could return a port that a client socket holds on another loopback
    address (test_dos binds 2,000 on 127.0.0.5), which a wildcard bind then finds in use."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


PORT_CLASH = "Address already in use"


def last_line(log):
    lines = [l for l in log.splitlines() if l.strip()]
    return lines[-1] if lines else "(empty log)"


def retry_port_clash(make, tries=5):
    """Calls make() (which picks its ports with free_port and starts a process on them) until the process
    did not lose a port race: free_port's probe socket is closed before the process binds, and in that gap
    a concurrent suite's server, or a client's ephemeral source port, can take the port."""
    for i in range(tries):
        try:
            return make()
        except RuntimeError as e:
            if PORT_CLASH not in str(e) or i == tries - 1:
                raise


class Server:
    def __init__(self, model, *extra, retry=True):
        """retry=False: the caller retries (retry_port_clash) itself because extra names more ports, which
        a retry here would reuse (a kv-events port lost to a race stays lost)."""
        if retry:
            retry_port_clash(lambda: self._launch(model, extra))
        else:
            self._launch(model, extra)

    def _launch(self, model, extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join("/tmp", f"osprey-serve-{self.port}.log")
        self.log = open(self.log_path, "w+")
        cmd = [BIN, "serve", "-m", model, "--port", str(self.port), "-t", "2",
               "--kv-cache-memory", "64M", *extra]
        if ENGINE_PROCESS and "--engine-process" not in extra:
            cmd.append("--engine-process")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:  # the reason first: CI's summary shows one line of it
                log = self.read_log()
                raise RuntimeError(f"server exited {self.proc.returncode}: {last_line(log)}\n{log}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.05)
        else:
            raise RuntimeError("server did not come up: " + self.read_log())
        key = extra[extra.index("--api-key") + 1] if "--api-key" in extra else "none"
        self.model = requests.get(self.url + "/v1/models",
                                  headers={"Authorization": "Bearer " + key}).json()["data"][0]["id"]

    def read_log(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def client(self, **kw):
        kw.setdefault("api_key", "none")
        return openai.OpenAI(base_url=self.url + "/v1", max_retries=0, timeout=120, **kw)

    def health(self):
        return requests.get(self.url + "/health", timeout=10).json()

    def rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        else:
            rc = self.proc.returncode
        self.log.close()
        return rc


@pytest.fixture(scope="session")
def server():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    s = Server(TINY, "--max-request-body", "1M", "--trust-request-chat-template")
    yield s
    rc = s.stop()
    assert rc == 0, s.read_log()[-4000:]


@pytest.fixture(scope="session")
def smol():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    if not os.path.exists(SMOL):
        pytest.skip(f"no SmolLM2 model at {SMOL} (make fetch)")
    s = Server(SMOL, "--served-model-name", "smollm2", "--trust-request-chat-template")
    yield s
    rc = s.stop()
    assert rc == 0, s.read_log()[-4000:]
