"""Threads and RSS of `osprey serve` before and after N idle connections (issue 20, connection
exhaustion): usage: idle_conns.py BIN MODEL N. Starts BIN serve with caps that admit them all, opens N
idle connections (500 per 127.0.0.x source address), prints one line: threads, RSS (MiB), /health."""
import os, resource, socket, subprocess, sys, time, requests
binp, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (8192, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
p = subprocess.Popen([binp, "serve", "-m", model, "--port", str(port), "-t", "2", "--kv-cache-memory", "64M",
                      "--max-connections", "4096", "--max-connections-per-client", "0", "--connection-timeout", "600"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
url = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        if requests.get(url + "/health", timeout=1).status_code == 200: break
    except Exception: time.sleep(0.1)
def st():
    t = len(os.listdir(f"/proc/{p.pid}/task"))
    rss = [int(l.split()[1]) for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS:")][0]
    return t, rss
time.sleep(1)
t0, r0 = st()
cs = []
for i in range(n):
    c = socket.socket(); c.bind((f"127.0.0.{2 + i // 500}", 0)); c.connect(("127.0.0.1", port)); cs.append(c)
time.sleep(3)
t1, r1 = st()
ok = requests.get(url + "/health", timeout=30).status_code
print(f"{binp}: {n} idle connections: threads {t0} -> {t1} (+{t1 - t0}), RSS {r0/1024:.1f} -> {r1/1024:.1f} MiB (+{(r1 - r0)/1024:.1f}), /health {ok}")
for c in cs: c.close()
p.terminate(); p.wait()
