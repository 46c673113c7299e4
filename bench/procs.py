"""Process and metrics helpers shared by the standard-library bench drivers that start osprey servers
and routers on loopback (bench/pd.py, bench/scale.py, bench/offload.py, bench/dos.py)."""
import os
import signal
import socket
import subprocess
import sys
import time

import urllib.request


def free_port():
    """A TCP port free on 127.0.0.1 now (the server binds it moments later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def wait_up(url, proc, what, timeout=120):
    """Waits until GET url answers 200; exits the bench with the process's log tail (proc.log_path,
    when set) if it exits first, or after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            log = getattr(proc, "log_path", None)
            tail = open(log).read()[-2000:] if log and os.path.exists(log) else ""
            sys.exit(f"{what} exited ({proc.returncode})\n{tail}")
        if _get_ok(url):
            return
        time.sleep(0.1)
    sys.exit(f"{what} did not come up")


def stop(procs):
    """SIGTERM to every process still running (a graceful drain), then waits; killed after 60 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()


def metric_sum(urls, name):
    """The sum over the servers at urls of every sample of Prometheus metric `name` (any labels)."""
    total = 0.0
    for u in urls:
        with urllib.request.urlopen(u + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + "{") or line.startswith(name + " "):
                    total += float(line.split()[-1])
    return total
