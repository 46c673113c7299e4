"""The web page in a real browser (issue 19): Debian's chromium, headless, driven through chromedriver
with selenium, against `osprey serve` on SmolLM2. A conversation of three turns (three non-empty
assistant replies, each request carrying the whole conversation); a stopped generation (the page goes
back to idle with the reply marked stopped, and the server's vllm:num_requests_running returns to 0:
the abort reached the engine); the dashboard under load from the openai client (the running and
throughput figures leave 0, then running returns to 0); with --api-key, the key typed in the settings
is what the page's API calls send. Every wait is on a condition in the page or on the server, never a
sleep standing in for one; replies are greedy (temperature 0, a seed). Screenshots go to
build/artifacts/webui/ (beside the osprey binary's bin/; $OSPREY_ARTIFACTS overrides). Skipped, saying
why, without selenium, chromium or chromedriver (scripts/setup.sh installs the two Debian packages,
scripts/setup-integration.sh selenium)."""
import os
import re
import shutil
import threading
import time

import pytest
import requests

from conftest import BIN, TINY, Server

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (scripts/setup-integration.sh)")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/lib/chromium/chromium")
                 if p and os.path.exists(p)), None)
CHROMEDRIVER = next((p for p in (shutil.which("chromedriver"), "/usr/lib/chromium/chromedriver")
                     if p and os.path.exists(p)), None)
pytestmark = pytest.mark.skipif(not CHROMIUM or not CHROMEDRIVER,
                                reason=f"headless browser test needs Debian's chromium and chromium-driver "
                                       f"(scripts/setup.sh installs them): chromium {CHROMIUM or 'absent'}, "
                                       f"chromedriver {CHROMEDRIVER or 'absent'}")
WAIT = 60  # seconds: an upper bound for a condition, never a duration the test relies on


@pytest.fixture(scope="module")
def artifacts():
    d = os.environ.get("OSPREY_ARTIFACTS") or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(BIN))),
                                                            "artifacts", "webui")
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def browser():
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900",
              "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=o)
    yield d
    d.quit()


@pytest.fixture
def page(browser, artifacts, request):
    """The browser, with a screenshot of the page saved when the test ends (passed or failed), and no
    JavaScript error in the console allowed (failed HTTP requests are the tests' to check: the 401s of
    test_api_key_from_settings are meant)."""
    yield browser
    browser.save_screenshot(os.path.join(artifacts, request.node.name + "-end.png"))
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and e.get("source") != "network"]
    assert not errors, errors


def wait(d, what, cond, timeout=WAIT):
    return WebDriverWait(d, timeout, poll_frequency=0.05).until(lambda _: cond(), message=what)


def open_page(d, url, path="/"):
    d.get(url + path)
    d.execute_script("localStorage.clear(); sessionStorage.clear();")
    d.get(url + path)
    wait(d, "the page's scripts ran", lambda: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "idle")


def set_field(d, id_, value):
    if not d.find_element(By.ID, id_).is_displayed():
        d.find_element(By.ID, "toggle-settings").click()
    e = d.find_element(By.ID, id_)
    e.clear()
    e.send_keys(str(value))


def state(d):
    return d.find_element(By.TAG_NAME, "body").get_attribute("data-state")


def replies(d):
    return d.find_elements(By.CSS_SELECTOR, ".msg.assistant")


def say(d, text):
    d.find_element(By.ID, "prompt").send_keys(text)
    d.find_element(By.ID, "send").click()


def metric(url, name):
    text = requests.get(url + "/metrics", timeout=10).text
    m = re.search(r"^" + re.escape(name) + r"\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1))


def test_three_turn_conversation(smol, page, artifacts):
    d = page
    open_page(d, smol.url)
    wait(d, "the model's name", lambda: d.find_element(By.ID, "model-name").text == smol.model)
    set_field(d, "system-prompt", "You are a helpful assistant.")
    set_field(d, "temperature", 0)
    set_field(d, "max-tokens", 24)
    set_field(d, "seed", 7)
    prompts = ["What is the capital of France?", "And of Germany?", "Name a river in one of them."]
    prompt_tokens = []
    for k, text in enumerate(prompts, 1):
        say(d, text)
        wait(d, f"reply {k} done", lambda: len(replies(d)) == k and replies(d)[-1].get_attribute("data-done") is not None)
        r = replies(d)[-1]
        assert r.get_attribute("data-done") in ("stop", "length"), r.text
        assert r.find_element(By.CSS_SELECTOR, ".content").text.strip(), f"reply {k} is empty"
        assert state(d) == "idle"
        meta = r.find_element(By.CSS_SELECTOR, ".meta").text
        prompt_tokens.append(int(re.search(r"(\d+) prompt \+ (\d+) tokens", meta).group(1)))
        d.save_screenshot(os.path.join(artifacts, f"conversation-turn{k}.png"))
    assert len(d.find_elements(By.CSS_SELECTOR, ".msg.user")) == 3 and len(replies(d)) == 3
    # each turn sends the conversation so far: the prompt grows by at least the previous reply
    assert prompt_tokens[0] < prompt_tokens[1] < prompt_tokens[2], prompt_tokens


def test_stop_generation(smol, page, artifacts):
    d = page
    open_page(d, smol.url)
    set_field(d, "temperature", 0)
    set_field(d, "max-tokens", 1000)  # a long greedy story: ends by length, not on its own, within far more than it runs
    assert metric(smol.url, "vllm:num_requests_running") == 0
    say(d, "Write a very long story about a dragon.")
    wait(d, "the reply streams", lambda: state(d) == "generating" and len(replies(d)) == 1
         and replies(d)[0].find_element(By.CSS_SELECTOR, ".content").text.strip() != "")
    assert d.find_element(By.ID, "send").get_attribute("disabled") is not None
    d.save_screenshot(os.path.join(artifacts, "stop-streaming.png"))
    d.find_element(By.ID, "stop").click()
    wait(d, "the page is idle again", lambda: state(d) == "idle")
    r = replies(d)[0]
    assert r.get_attribute("data-done") == "stopped", r.get_attribute("data-done")
    assert r.find_element(By.CSS_SELECTOR, ".content").text.strip(), "the partial reply is kept"
    assert d.find_element(By.ID, "status").text == "idle (stopped)"
    assert d.find_element(By.ID, "stop").get_attribute("disabled") is not None
    assert d.find_element(By.ID, "send").get_attribute("disabled") is None
    wait(d, "the server aborted the request", lambda: metric(smol.url, "vllm:num_requests_running") == 0)
    wait(d, "nothing in flight", lambda: metric(smol.url, "osprey:requests_in_flight") == 0)
    aborted = re.search(r'^vllm:request_success_total\{finished_reason="abort"[^}]*\} (\S+)$',
                        requests.get(smol.url + "/metrics", timeout=10).text, re.M)
    assert aborted and float(aborted.group(1)) >= 1
    d.save_screenshot(os.path.join(artifacts, "stop-stopped.png"))


def test_dashboard_under_load(smol, page, artifacts):
    d = page
    open_page(d, smol.url, "/dashboard?poll=200")
    assert d.find_element(By.ID, "view-chat").get_attribute("hidden") is not None
    text = lambda id_: d.find_element(By.ID, id_).text  # noqa: E731
    num = lambda id_: float(text(id_)) if re.fullmatch(r"[0-9.]+", text(id_)) else -1.0  # noqa: E731 ('–': no value yet)
    polls = lambda: int(d.find_element(By.ID, "view-dashboard").get_attribute("data-polls"))  # noqa: E731
    wait(d, "two polls of an idle server", lambda: polls() >= 2 and text("m-running") == "0" and text("m-engine-tps") == "0.0")
    gen0 = float(text("m-gen-total"))
    d.save_screenshot(os.path.join(artifacts, "dashboard-idle.png"))

    stop = threading.Event()
    errors = []

    def load():
        c = smol.client()
        while not stop.is_set():
            try:
                c.chat.completions.create(model=smol.model, messages=[{"role": "user", "content": "Tell me about birds."}],
                                          max_tokens=48, temperature=0)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        # the load runs until the page has shown it: no race with the poll interval
        wait(d, "running > 0 on the page", lambda: text("m-running") not in ("–", "0"))
        wait(d, "engine tokens/s > 0", lambda: num("m-engine-tps") > 0)
        wait(d, "generated tokens grew", lambda: num("m-gen-total") > gen0)
        wait(d, "TTFT and TPOT shown", lambda: text("m-ttft") != "–" and text("m-tpot") != "–")
        d.save_screenshot(os.path.join(artifacts, "dashboard-load.png"))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=WAIT)
    assert not errors, errors
    wait(d, "running back to 0 on the page", lambda: text("m-running") == "0")
    # the plots drew the load: some pixel of the requests plot is in the 'running' colour's line
    drawn = d.execute_script("""
        const c = document.getElementById('plot-requests'), g = c.getContext('2d');
        const px = g.getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++; return n;""")
    assert drawn > 0
    d.save_screenshot(os.path.join(artifacts, "dashboard-after.png"))


def test_api_key_from_settings(page):
    s = Server(TINY, "--api-key", "sekrit")
    try:
        d = page
        open_page(d, s.url)
        wait(d, "the page asks for the key", lambda: "API key required" in d.find_element(By.ID, "model-name").text)
        set_field(d, "max-tokens", 4)
        say(d, "hi")
        wait(d, "the 401 shown", lambda: len(replies(d)) == 1 and replies(d)[0].get_attribute("data-done") == "error")
        assert "HTTP 401" in replies(d)[0].text
        set_field(d, "api-key", "sekrit")
        d.find_element(By.ID, "api-key").send_keys("\t")  # 'change': the model list is fetched again with the key
        wait(d, "the model named", lambda: d.find_element(By.ID, "model-name").text == s.model)
        say(d, "hi")
        wait(d, "a reply", lambda: len(replies(d)) == 2 and replies(d)[1].get_attribute("data-done") is not None)
        assert replies(d)[1].get_attribute("data-done") in ("stop", "length")
    finally:
        assert s.stop() == 0


def test_out_of_range_setting_refused_in_the_page(smol, page):
    # top_p 0 is outside the server's (0, 1]: the page says so and sends nothing, and stays usable
    d = page
    open_page(d, smol.url)
    set_field(d, "top-p", 0)
    say(d, "hi")
    err = d.find_element(By.ID, "settings-error")
    wait(d, "the settings error shown", lambda: err.is_displayed())
    assert "top_p must be a number in (0, 1]" in err.text and not replies(d) and state(d) == "idle"


def test_markdown_and_metrics_parsing_in_the_page(smol, page):
    """The page's own renderer and parser, run in the browser on fixed inputs."""
    d = page
    open_page(d, smol.url)
    render = lambda md: d.execute_script(  # noqa: E731
        "const box = document.createElement('div'); box.appendChild(OspreyMarkdown.render(arguments[0]));"
        "return box.innerHTML;", md)
    assert render("# Title\n\nSome **bold**, *it*, ~~no~~ and `x < y`.") == (
        "<h1>Title</h1><p>Some <strong>bold</strong>, <em>it</em>, <del>no</del> and <code>x &lt; y</code>.</p>")
    html = render("```python\ndef f():\n    return 1\n```\nafter")
    assert html.startswith('<div class="codeblock"><div class="head"><span>python</span><button class="copy" type="button">copy</button>')
    assert html.endswith("</div><p>after</p>")
    code = lambda md: d.execute_script(  # noqa: E731
        "const box = document.createElement('div'); box.appendChild(OspreyMarkdown.render(arguments[0]));"
        "return [...box.querySelectorAll('pre code')].map((c) => c.textContent);", md)
    assert code("```python\ndef f():\n    return 1\n```\nafter") == ["def f():\n    return 1"]
    assert code("text\n```js\nlet s = \"a\"; // streaming: no closing fence yet") == ['let s = "a"; // streaming: no closing fence yet']
    assert code("~~~\n```\nkept\n~~~") == ["```\nkept"]
    assert render("- a\n- b\n\n1. x\n2. y") == "<ul><li>a</li><li>b</li></ul><ol><li>x</li><li>y</li></ol>"
    assert render("- a\n  - nested\n- b") == "<ul><li>a<ul><li>nested</li></ul></li><li>b</li></ul>"
    assert render("> quoted\n> more") == "<blockquote><p>quoted<br>more</p></blockquote>"
    assert render("|a|b|\n|-|-|\n|1|2|") == (
        "<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td>2</td></tr></tbody></table>")
    assert render("snake_case_name and 2 * 3 and 4 * 5") == "<p>snake_case_name and 2 * 3 and 4 * 5</p>"
    assert render("line one\nline two\n\n---\n") == "<p>line one<br>line two</p><hr>"
    # nothing in a reply becomes markup or a script: text stays text, only http(s)/mailto links are links
    hostile = '<img src=x onerror="window.pwned=1"> <script>window.pwned=1</script> [x](javascript:window.pwned=1)'
    html = render(hostile)
    assert "<img" not in html and "<script" not in html and 'href="javascript' not in html, html
    assert render("[site](https://example.com/a_b) and https://example.org/x.") == (
        '<p><a href="https://example.com/a_b" target="_blank" rel="noopener noreferrer">site</a> and '
        '<a href="https://example.org/x" target="_blank" rel="noopener noreferrer">https://example.org/x</a>.</p>')
    # balanced parentheses in a destination or a bare URL (one level), an unbalanced ")" left outside
    a = lambda href, text: f'<a href="{href}" target="_blank" rel="noopener noreferrer">{text}</a>'  # noqa: E731
    wiki = "https://en.wikipedia.org/wiki/Foo_(bar)"
    assert render(f"[w]({wiki}) and {wiki}, (see https://x.org/a)") == (
        f"<p>{a(wiki, 'w')} and {a(wiki, wiki)}, (see {a('https://x.org/a', 'https://x.org/a')})</p>")
    assert d.execute_script("return window.pwned === undefined")
    # a long line of short matches beside an unclosed "**" renders (each rule's search is kept until
    # passed; it was cubic: 32 KB of this took 47 s in node), and its 4,000 <em> are all there
    assert render("**a *b* " * 4000).count("<em>b</em>") == 4000
    # and the block rules on long runs of spaces or brackets (each once quadratic: 4,000 spaces after a
    # "#" took 8 s): headings, fences and table separators are matched without backtracking over them
    heading = render("# a" + " " * 4000 + "x ##")
    assert heading.startswith("<h1>a ") and heading.endswith(" x</h1>")
    assert render("[" * 65000) == "<p>" + "[" * 65000 + "</p>"
    assert code("```" + " " * 50000 + "js  more\nx") == ["x"]
    assert render("|a|b|\n" + " " * 50000 + "-:-x").startswith("<p>|a|b|<br>")
    # thousands of nesting levels (a looping model's '>' or indented '-') do not overflow the stack: past 32
    # levels the rest is plain text
    deep = render(">" * 4000)
    assert deep.count("<blockquote>") == 33 and deep.endswith("</blockquote>" * 33), deep[:200]
    assert render("\n".join(" " * i + "- x" for i in range(200))).count("<ul>") == 33
    # the dashboard's Prometheus text parser
    parsed = d.execute_script("""
        const m = OspreyDashboard.parse(arguments[0]);
        return Object.fromEntries([...m].map(([k, v]) => [k, v.map((s) => [s.labels, s.value])]));""",
        '# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n'
        'vllm:num_requests_running{model_name="m"} 3\n'
        'vllm:request_success_total{finished_reason="stop",model_name="m"} 5\n'
        'vllm:request_success_total{finished_reason="abort",model_name="m"} 2\n'
        'x_bucket{le="+Inf",model_name="a\\"b,c"} 7\n'
        'process_open_fds 12\nbad line\n\nno_value{a="b"}\n')
    assert parsed == {
        "vllm:num_requests_running": [[{"model_name": "m"}, 3]],
        "vllm:request_success_total": [[{"finished_reason": "stop", "model_name": "m"}, 5],
                                       [{"finished_reason": "abort", "model_name": "m"}, 2]],
        "x_bucket": [[{"le": "+Inf", "model_name": 'a"b,c'}, 7]],
        "process_open_fds": [[{}, 12]],
    }, parsed
