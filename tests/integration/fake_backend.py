"""A fake `osprey serve` for the router's tests (test_router.py, test_pd.py): a Python http.server that
speaks just enough of it for the router's poller and picker (/health, /metrics with the vLLM gauges the
picker reads, /v1/models) and hands every POST to the subclass's `post(handler, body)`."""
import http.server
import json
import socket
import threading


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake = None  # the FakeBackend, set on the subclass each instance makes

    def log_message(self, *a):
        pass

    def send_text(self, code, body, ctype="application/json"):
        b = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def chunk(self, b):
        """One chunk of a Transfer-Encoding: chunked body."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
        self.wfile.flush()

    def reset(self):
        """Drops the connection with a TCP reset (SO_LINGER 0): a backend dying mid-answer."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.connection.close()

    def do_GET(self):
        f = self.fake
        if self.path == "/health":
            self.send_text(200, '{"status": "ok"}')
        elif self.path == "/metrics":
            self.send_text(200, "# TYPE vllm:num_requests_waiting gauge\n"
                                f'vllm:num_requests_waiting{{model_name="{f.model}"}} {f.waiting}\n'
                                "# TYPE vllm:num_requests_running gauge\n"
                                f'vllm:num_requests_running{{model_name="{f.model}"}} 0\n'
                                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                                f'vllm:kv_cache_usage_perc{{model_name="{f.model}"}} 0.1\n',
                           "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            self.send_text(200, '{"object": "list", "data": [{"id": "%s"}]}' % f.model)
        else:
            self.send_text(404, "{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.close_connection = True
        self.fake.post(self, body)


class FakeBackend:
    """Serves on 127.0.0.1 (self.url) from construction until close(). `waiting` is the queue the
    /metrics gauge reports; `mode` is the subclass's; `client_gone` is set by a subclass that sees its
    client leave."""

    def __init__(self, mode, model="m"):
        self.mode, self.model = mode, model
        self.waiting = 0
        self.client_gone = threading.Event()
        handler = type("H", (Handler,), {"fake": self})
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def post(self, h, body):
        raise NotImplementedError

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
