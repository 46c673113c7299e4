"""The web page over HTTP (issue 19): GET / and /dashboard give the page (text/html), every file of
tools/server/webui/ is served from the binary at /webui/<name> byte for byte with the Content-Type of
its extension, an ETag (a conditional GET gets 304) and Cache-Control: no-cache; only GET and HEAD;
--no-webui turns all of it off (404, as before the page existed). With --api-key the page and its
files need no key, while the API they call still does. The page in a real browser is
test_webui_browser.py."""
import os
import re

import pytest
import requests

from conftest import TINY, Server

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WEBUI = os.path.join(ROOT, "tools", "server", "webui")
TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}


def webui_files():
    return sorted(n for n in os.listdir(WEBUI) if not n.startswith("."))


def test_page_at_root_and_dashboard(server):
    for path in ("/", "/dashboard", "/webui/index.html"):
        r = requests.get(server.url + path, timeout=10)
        assert r.status_code == 200, path
        assert r.headers["Content-Type"] == "text/html; charset=utf-8"
        assert r.text.startswith("<!DOCTYPE html>")
        assert "<title>osprey</title>" in r.text
        assert r.headers["Cache-Control"] == "no-cache"
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'self'" in r.headers["Content-Security-Policy"]
    # a query string does not change the route (the dashboard's ?poll=MS)
    assert requests.get(server.url + "/dashboard?poll=250", timeout=10).status_code == 200


def test_every_embedded_file_is_served(server):
    files = webui_files()
    assert {"index.html", "app.js", "chat.js", "dashboard.js", "markdown.js", "style.css"} <= set(files)
    etags = set()
    for name in files:
        r = requests.get(server.url + "/webui/" + name, timeout=10)
        assert r.status_code == 200, name
        with open(os.path.join(WEBUI, name), "rb") as f:
            assert r.content == f.read(), name
        assert r.headers["Content-Type"] == TYPES[os.path.splitext(name)[1]], name
        etag = r.headers["ETag"]
        assert re.fullmatch(r'"[0-9a-f]{16}"', etag), etag
        etags.add(etag)
        # revalidation: the same tag (strong or weak, alone or in a list) gets 304 and no body
        for inm in (etag, "W/" + etag, '"nope", ' + etag, "*"):
            r304 = requests.get(server.url + "/webui/" + name, headers={"If-None-Match": inm}, timeout=10)
            assert r304.status_code == 304 and r304.content == b"" and r304.headers["ETag"] == etag, (name, inm)
        r = requests.get(server.url + "/webui/" + name, headers={"If-None-Match": '"0000000000000000"'}, timeout=10)
        assert r.status_code == 200 and len(r.content) > 0
        h = requests.head(server.url + "/webui/" + name, timeout=10)
        assert h.status_code == 200 and h.headers["ETag"] == etag
    assert len(etags) == len(files)
    # what the page links to is all there
    page = requests.get(server.url + "/", timeout=10).text
    for ref in re.findall(r'(?:src|href)="(/webui/[^"]+)"', page):
        assert ref[len("/webui/"):] in files, ref


def test_unknown_paths_and_methods(server):
    for path in ("/webui/nope.js", "/webui/", "/webui", "/index.html", "/dashboard/"):
        r = requests.get(server.url + path, timeout=10)
        assert r.status_code == 404, path
        assert r.json()["error"]["code"] == 404
    for method in ("POST", "PUT", "DELETE"):
        r = requests.request(method, server.url + "/", timeout=10)
        assert r.status_code == 405, method
        assert r.json()["error"]["message"] == f"method {method} not allowed on /"


def test_no_webui_flag():
    s = Server(TINY, "--no-webui")
    try:
        for path in ["/", "/dashboard"] + ["/webui/" + n for n in webui_files()]:
            r = requests.get(s.url + path, timeout=10)
            assert r.status_code == 404, path
            assert r.json()["error"]["message"] == f"no route GET {path}"
        r = requests.post(s.url + "/", json={}, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["message"] == "no route POST /"
        assert requests.get(s.url + "/metrics", timeout=10).status_code == 200  # the rest is unchanged
        assert "web chat and dashboard" not in s.read_log()
    finally:
        assert s.stop() == 0


def test_page_needs_no_key_but_the_api_does():
    s = Server(TINY, "--api-key", "sekrit")
    try:
        assert "web chat and dashboard: open " + s.url + "/" in s.read_log()
        for path in ["/", "/dashboard"] + ["/webui/" + n for n in webui_files()]:
            assert requests.get(s.url + path, timeout=10).status_code == 200, path
        assert requests.get(s.url + "/metrics", timeout=10).status_code == 200  # the dashboard's feed
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert requests.post(s.url + "/v1/chat/completions", json=body, timeout=30).status_code == 401
        ok = requests.post(s.url + "/v1/chat/completions", json=body, timeout=30,
                           headers={"Authorization": "Bearer sekrit"})
        assert ok.status_code == 200
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("name", ["app.js", "chat.js", "dashboard.js", "markdown.js"])
def test_scripts_fetch_nothing_from_elsewhere(name):
    # offline: no absolute URL is loaded by the page (links written by the model are the user's to follow)
    with open(os.path.join(WEBUI, name)) as f:
        src = f.read()
    for call in re.findall(r'fetch\(\s*([^,)]+)', src):
        assert call.strip().startswith(('"/', "`/")), (name, call)
    assert "import(" not in src and "importScripts" not in src and "XMLHttpRequest" not in src


def test_page_loads_nothing_from_elsewhere():
    with open(os.path.join(WEBUI, "index.html")) as f:
        page = f.read()
    refs = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert refs and all(r.startswith("/") and not r.startswith("//") for r in refs), refs
    with open(os.path.join(WEBUI, "style.css")) as f:
        css = f.read()
    assert "url(" not in css and "@import" not in css
