"""Open-loop long-prompt load generator for /v1/chat/completions (bench/api_servers.sh, issue 23).

Standard library only (http.client, threads, multiprocessing): runs where the `openai` package is not
installed. Requests arrive as a Poisson process at --rate req/s for --duration s (seeded: every server
sees the same schedule and the same prompts). Each is a streamed chat completion (temperature 0,
ignore_eos, --max-tokens tokens) on a new connection, so SO_REUSEPORT spreads them over the API
servers. The schedule is split round-robin over --procs worker processes; each builds all its request
bodies before the start, then starts a thread per request --lead-s ahead of its time, which sleeps
until its send time: the client's own work stays out of the timings, and the lag (actual send -
scheduled send) is reported so a client that falls behind shows.

Prompts (one user message of about --prompt-tokens tokens after the chat template; the text is words
drawn from a fixed list by a seeded generator, about one token a word; the word count is fitted
through the server's /tokenize before the run, and every reply's usage.prompt_tokens is reported):
  distinct  every prompt differs from its first content token ("[r<seed>-<i>]" then its own words):
            nothing past the template's system turn is in the prefix cache, the engine prefills all
  shared    every prompt is one long prefix plus a short unique suffix: the prefix cache serves the
            prefix, and the frontend's JSON parsing, chat render and tokenization of the whole prompt
            is most of each request's work

Per request: TTFT = first SSE chunk with content - send; e2e = [DONE] (or end of stream) - send.
Prints one JSON line: rate, duration, sent, done, errors, unfinished (no answer --drain-s after the last
arrival), send_rate (requests sent over the span of their actual send times), ttft_p50/p90/p99 and
e2e_p50/p99 (ms, over the requests done: when done < sent, the slow tail is missing from them),
done_req_s, prompt_tokens (mean of usage.prompt_tokens), send_lag_p99_ms, prefix_hit (the engine's
prefix-cache hit share of prompt tokens over the run, from /metrics). --probe N only times /tokenize.
"""
import argparse, http.client, json, multiprocessing as mp, random, signal, sys, threading, time, urllib.parse

from percentile import pct  # bench/percentile.py

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have "
         "an had they you were their one all we can her has there been if more when will would who so no time "
         "people year way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night "
         "point home water room mother area money story fact month lot right study book eye job word business "
         "issue side kind head house service friend father power hour game line end member law car city "
         "community name president team minute idea kid body information back parent face others level office "
         "door health person art war history party result change morning reason research girl guy moment air "
         "teacher force education foot boy age policy music market sense nation plan college interest death "
         "experience effect use class control care field development role effort rate heart drug show leader "
         "light voice wife police mind price report decision son view relationship town road arm difference "
         "value building action model season society tax director position player record paper space ground "
         "form event official matter center couple project activity star table need court oil situation "
         "cost industry figure street image phone data picture practice piece land product doctor wall patient "
         "worker news test movie north love support technology step baby computer type attention film tree "
         "source organization hair window evidence population site bank truth").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def prompt_text(mode, seed, i, n_words, prefix):
    """The user message of request i (deterministic in mode, seed, i and the word count)."""
    if mode == "shared":
        r = random.Random(f"{seed}-suffix-{i}")
        return f"{prefix}\n\nQuestion {i}: in {r.randint(3, 9)} words, what is the {r.choice(WORDS)} about?"
    r = random.Random(f"{seed}-distinct-{i}")
    return f"[r{seed}-{i}] {words(r, n_words)}"


def shared_prefix(seed, n_words):
    return words(random.Random(f"{seed}-prefix"), n_words)


def body(args, text):
    return json.dumps({"model": args.model, "messages": [{"role": "user", "content": text}],
                       "max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()


def conn(args, timeout):
    u = urllib.parse.urlsplit(args.base_url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout), u.path.rstrip("/")


def tokens_of(args, text):
    """The prompt's token count after the chat template, from the server's /tokenize."""
    c, _ = conn(args, 120)
    c.request("POST", "/tokenize", json.dumps({"model": args.model, "messages": [{"role": "user", "content": text}],
                                               "add_generation_prompt": True}), {"Content-Type": "application/json"})
    r = c.getresponse()
    d = json.loads(r.read())
    c.close()
    if r.status != 200:
        raise RuntimeError(f"/tokenize: {r.status} {d}")
    return d["count"] if "count" in d else len(d["tokens"])


def prefix_counters(args):
    """(queried, hit) prompt tokens of the engine's prefix cache from /metrics (the core's counters,
    the same from every API server), or None."""
    try:
        c, _ = conn(args, 30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        v = {}
        for line in text.splitlines():
            for k in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
                if line.startswith(k + "{") or line.startswith(k + " "):
                    v[k] = float(line.rsplit(" ", 1)[1])
        return v["vllm:prefix_cache_queries_total"], v["vllm:prefix_cache_hits_total"]
    except Exception:  # noqa: BLE001 - reported as unknown
        return None


def fit_words(args):
    """The word count whose prompts come to about --prompt-tokens tokens (two proportional steps on a
    few sample prompts), and the sampled counts."""
    n = args.prompt_tokens
    for _ in range(3):
        prefix = shared_prefix(args.seed, n)
        counts = [tokens_of(args, prompt_text(args.mode, args.seed, i, n, prefix)) for i in range(4)]
        mean = sum(counts) / len(counts)
        if abs(mean - args.prompt_tokens) <= max(8, args.prompt_tokens // 200):
            break
        n = max(1, int(round(n * args.prompt_tokens / mean)))
    else:  # three steps without converging: the counts of the last n, measured
        prefix = shared_prefix(args.seed, n)
        counts = [tokens_of(args, prompt_text(args.mode, args.seed, i, n, prefix)) for i in range(4)]
    return n, counts


def one(args, path, payload, t_send, res, lock):
    rec = {"t_sched": t_send}
    d = t_send - time.monotonic()
    if d > 0:
        time.sleep(d)
    t0 = time.monotonic()
    rec["lag"] = t0 - t_send
    first = None
    usage = None
    c = None
    try:
        c, _ = conn(args, args.timeout)
        c.request("POST", path, payload, {"Content-Type": "application/json", "Accept": "text/event-stream"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError(f"SSE error: {str(ev['error'])[:200]}")
            if ev.get("usage"):
                usage = ev["usage"]
            if first is None:
                for ch in ev.get("choices") or ():
                    if (ch.get("delta") or {}).get("content"):
                        first = time.monotonic()
                        break
        t1 = time.monotonic()
        c.close()
        if first is None:
            raise RuntimeError("no content in the stream")
        rec.update(ttft=first - t0, e2e=t1 - t0, end=t1,
                   prompt_tokens=usage.get("prompt_tokens") if usage else None)
    except Exception as e:  # noqa: BLE001 - counted and reported
        rec.update(error=repr(e)[:240], end=time.monotonic())
    finally:
        if c is not None:
            c.close()
    with lock:
        res.append(rec)


def worker(args, k, n_words, ready, go, start, q):
    """Worker k of args.procs: the requests i with i % procs == k. Their bodies are built before the
    start (ready/go: barriers with the parent, which then sets start); each request's thread is started
    lead_s before its time. Always answers on q, also when a thread cannot be started."""
    sent, last, res, lock, threads = 0, 0.0, [], threading.Lock(), []
    try:
        rng = random.Random(args.seed)
        sched, t = [], 0.0
        while True:
            t += rng.expovariate(args.rate)
            if t >= args.duration:
                break
            sched.append(t)
        prefix = shared_prefix(args.seed, n_words) if args.mode == "shared" else ""
        path = conn(args, 1)[1] + "/chat/completions"
        mine = [(sched[i], body(args, prompt_text(args.mode, args.seed, i, n_words, prefix)))
                for i in range(k, len(sched), args.procs)]
        ready.wait()
        go.wait()
        t_start = start.value
        for ts, payload in mine:
            t_send = t_start + ts
            d = t_send - args.lead_s - time.monotonic()
            if d > 0:
                time.sleep(d)
            sent, last = sent + 1, t_send
            th = threading.Thread(target=one, args=(args, path, payload, t_send, res, lock), daemon=True)
            try:
                th.start()
            except RuntimeError as e:  # too many threads: counted as this request's error
                with lock:
                    res.append({"t_sched": t_send, "error": f"client: {e}", "end": time.monotonic()})
                continue
            threads.append(th)
        deadline = t_start + args.duration + args.drain_s
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
    finally:
        with lock:
            out = list(res)
        q.put((k, sent, last, out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default="model")
    ap.add_argument("--rate", type=float, required=True, help="mean arrivals per second (Poisson)")
    ap.add_argument("--duration", type=float, required=True, help="seconds of arrivals")
    ap.add_argument("--mode", choices=("distinct", "shared"), default="shared")
    ap.add_argument("--prompt-tokens", type=int, default=7500, help="target tokens a prompt, chat template included")
    ap.add_argument("--words", type=int, default=0, help="words a prompt (skips the /tokenize fit)")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--procs", type=int, default=4, help="client worker processes")
    ap.add_argument("--lead-s", type=float, default=0.05, help="a request's thread starts this early")
    ap.add_argument("--drain-s", type=float, default=120, help="after the last arrival, wait this long")
    ap.add_argument("--timeout", type=float, default=300, help="socket timeout of a request")
    ap.add_argument("--warmup", type=int, default=2, help="requests sent one by one before the run")
    ap.add_argument("--probe", type=int, default=0,
                    help="only time N /tokenize calls (chat render + tokenization of a prompt, one at a time) and "
                         "print {words, prompt_tokens, tokenize_ms (median)}: one HTTP thread's cost a request")
    a = ap.parse_args()

    if a.words:
        n_words, counts = a.words, []
    else:
        n_words, counts = fit_words(a)
    print(f"# {a.mode}: {n_words} words a prompt, sample prompt tokens {counts}", file=sys.stderr)
    if a.probe:
        pre = shared_prefix(a.seed, n_words) if a.mode == "shared" else ""
        ts = []
        for i in range(a.probe):
            t0 = time.monotonic()
            n = tokens_of(a, prompt_text(a.mode, a.seed, i, n_words, pre))
            ts.append(time.monotonic() - t0)
        print(json.dumps({"words": n_words, "prompt_tokens": n, "tokenize_ms": round(1e3 * pct(ts, 50), 2)}))
        return
    # warm-up (and, in shared mode, the prefix into the cache), outside the schedule
    for w in range(a.warmup):
        wr, wl = [], threading.Lock()
        pre = shared_prefix(a.seed, n_words) if a.mode == "shared" else ""
        one(a, conn(a, 1)[1] + "/chat/completions", body(a, prompt_text(a.mode, a.seed + 1000003, w, n_words, pre)),
            time.monotonic(), wr, wl)
        if "error" in wr[0]:
            print(f"warm-up failed: {wr[0]['error']}", file=sys.stderr)
            sys.exit(1)

    pc0 = prefix_counters(a)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ready, go, start = ctx.Barrier(a.procs + 1), ctx.Barrier(a.procs + 1), ctx.Value("d", 0.0)
    # daemon workers, and SIGTERM as an exit: a stopped client takes its workers with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ps = [ctx.Process(target=worker, args=(a, k, n_words, ready, go, start, q), daemon=True) for k in range(a.procs)]
    for p in ps:
        p.start()
    ready.wait(timeout=600)  # every worker has built its bodies
    t_start = start.value = time.monotonic() + 0.2
    go.wait()
    sent, res = 0, []
    for _ in ps:
        _, n, _, r = q.get(timeout=a.duration + a.drain_s + 120)
        sent += n
        res += r
    t_sends = [r["t_sched"] + r["lag"] for r in res if "lag" in r]  # when each request actually went out
    for p in ps:
        p.join()
    pc1 = prefix_counters(a)
    ok = [r for r in res if "error" not in r]
    errs = [r["error"] for r in res if "error" in r]
    ttft = [r["ttft"] for r in ok]
    e2e = [r["e2e"] for r in ok]
    pts = [r["prompt_tokens"] for r in ok if r.get("prompt_tokens")]
    out = {"mode": a.mode, "rate": a.rate, "duration": a.duration, "sent": sent, "done": len(ok),
           "errors": len(errs), "unfinished": sent - len(res),
           "send_rate": round(len(t_sends) / (max(t_sends) - t_start), 3) if len(t_sends) > 1 and max(t_sends) > t_start else None,
           "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p90_ms": 1e3 * pct(ttft, 90), "ttft_p99_ms": 1e3 * pct(ttft, 99),
           "e2e_p50_ms": 1e3 * pct(e2e, 50), "e2e_p99_ms": 1e3 * pct(e2e, 99),
           "done_req_s": round(len(ok) / (max(r["end"] for r in ok) - t_start), 3) if ok else 0,
           "prompt_tokens": round(sum(pts) / len(pts), 1) if pts else None,
           "send_lag_p99_ms": 1e3 * pct([r["lag"] for r in res if "lag" in r], 99),
           "prefix_hit": round((pc1[1] - pc0[1]) / (pc1[0] - pc0[0]), 3) if pc0 and pc1 and pc1[0] > pc0[0] else None}
    out = {k: (round(v, 1) if k.endswith("_ms") else v) for k, v in out.items()}
    if errs:
        print("errors (first 3): " + "; ".join(errs[:3]), file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
