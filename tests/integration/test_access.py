"""Who may call `osprey serve` (issue 20): the API key (exact "Bearer KEY", compared in constant time)
and CORS with vLLM's flags and defaults (--allowed-origins, --allowed-methods, --allowed-headers:
"*"; the headers are those of Starlette's CORSMiddleware, which vLLM uses); preflights are answered
without the key. Each CORS case fails on c8d3dac (no CORS headers; a preflight got 401 or 405)."""
import requests

from conftest import TINY, Server

PRE = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
       "Access-Control-Request-Headers": "authorization, content-type"}


def test_api_key_near_misses_and_cors_defaults():
    s = Server(TINY, "--api-key", "sekrit")
    try:
        body = {"prompt": "a", "max_tokens": 1}
        for auth in ("Bearer sekri", "Bearer sekritt", "bearer sekrit", "sekrit", "Bearer  sekrit", "Basic c2Vrcml0"):
            r = requests.post(s.url + "/v1/completions", json=body, headers={"Authorization": auth})
            assert r.status_code == 401, auth
        # a preflight needs no key and allows everything by default
        r = requests.options(s.url + "/v1/chat/completions", headers=PRE)
        assert r.status_code == 200 and r.text == "OK", (r.status_code, r.text)
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert r.headers["Access-Control-Allow-Methods"] == "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
        assert r.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        assert r.headers["Access-Control-Max-Age"] == "600"
        # the request itself: answered with the origin allowed, the 401 too (so a page can read it)
        r = requests.post(s.url + "/v1/completions", json=body,
                          headers={"Origin": "http://app.example", "Authorization": "Bearer sekrit"})
        assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "*"
        r = requests.post(s.url + "/v1/completions", json=body, headers={"Origin": "http://app.example"})
        assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == "*"
        # a streamed reply carries it too; a request without Origin gets no CORS header
        r = requests.post(s.url + "/v1/completions", json={**body, "stream": True},
                          headers={"Origin": "http://app.example", "Authorization": "Bearer sekrit"})
        assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "*"
        r = requests.get(s.url + "/health")
        assert "Access-Control-Allow-Origin" not in r.headers
        # OPTIONS that is no preflight is not a route
        assert requests.options(s.url + "/health").status_code == 405
    finally:
        assert s.stop() == 0


def test_cors_restricted():
    s = Server(TINY, "--allowed-origins", '["http://app.example"]', "--allowed-methods", "GET,POST",
               "--allowed-headers", '["Authorization", "Content-Type"]')
    try:
        r = requests.options(s.url + "/v1/completions", headers=PRE)
        assert r.status_code == 200
        assert r.headers["Access-Control-Allow-Origin"] == "http://app.example" and r.headers["Vary"] == "Origin"
        assert r.headers["Access-Control-Allow-Methods"] == "GET, POST"
        assert r.headers["Access-Control-Allow-Headers"] == \
            "Accept, Accept-Language, Authorization, Content-Language, Content-Type"
        r = requests.options(s.url + "/v1/completions", headers={**PRE, "Origin": "http://evil.example"})
        assert r.status_code == 400 and r.text == "Disallowed CORS origin"
        assert "Access-Control-Allow-Origin" not in r.headers
        r = requests.options(s.url + "/v1/completions", headers={**PRE, "Access-Control-Request-Method": "DELETE",
                                                                 "Access-Control-Request-Headers": "x-secret"})
        assert r.status_code == 400 and r.text == "Disallowed CORS method, headers"
        r = requests.get(s.url + "/v1/models", headers={"Origin": "http://app.example"})
        assert r.headers["Access-Control-Allow-Origin"] == "http://app.example" and r.headers["Vary"] == "Origin"
        r = requests.get(s.url + "/v1/models", headers={"Origin": "http://evil.example"})
        assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
    finally:
        assert s.stop() == 0


def test_cors_bad_flag_is_refused():
    import subprocess
    from conftest import BIN
    p = subprocess.run([BIN, "serve", "-m", TINY, "--allowed-origins", "[1, 2]"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--allowed-origins" in p.stderr and "JSON list" in p.stderr


def test_empty_api_key_means_no_key():
    # `--api-key ""` (an unset variable expanded) is no key, as in vLLM, not a key only an empty
    # Bearer matches
    s = Server(TINY, "--api-key", "")
    try:
        r = requests.post(s.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1})
        assert r.status_code == 200, r.text
    finally:
        assert s.stop() == 0
