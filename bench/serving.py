"""Open-loop load generator for an OpenAI-compatible /v1/chat/completions endpoint (bench/serving.sh).

Requests arrive as a Poisson process at --rate req/s (seeded, so every server sees the same
schedule and the same prompts); each is a streamed chat completion of exactly --max-tokens tokens
(ignore_eos, temperature 0). Uses the official `openai` client (AsyncOpenAI) as the HTTP/SSE layer.

Per request: TTFT = first content chunk - send time; TPOT = (end - first chunk) / (tokens - 1).
Prints one JSON line: rate, requests, completed, errors, ttft_p50/p99 (ms), tpot_p50 (ms),
output tok/s and req/s over the whole run (first send to last completion).
"""
import argparse, asyncio, json, random, statistics, sys, time

import openai

from percentile import pct  # bench/percentile.py

TOPICS = ["the history of the printing press", "how vaccines train the immune system", "why the sky is blue",
          "the rules of chess", "how a compiler works", "the water cycle", "photosynthesis", "black holes",
          "the French revolution", "how to bake bread", "plate tectonics", "the stock market", "honey bees",
          "the internet's first decades", "volcanoes", "the Roman empire"]


def make_prompt(rng):
    topic = rng.choice(TOPICS)
    extra = " ".join(rng.choice(TOPICS) for _ in range(rng.randint(4, 12)))
    return f"Write a short explanation of {topic} for a curious student. Mention, if relevant: {extra}."


async def one(client, model, prompt, max_tokens, res):
    t0 = time.perf_counter()
    first = None
    n = 0
    usage = None
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.0,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter()
                n += 1
        t1 = time.perf_counter()
        toks = usage.completion_tokens if usage is not None and usage.completion_tokens else n
        if first is None:
            raise RuntimeError("no content")
        res.append({"ttft": first - t0, "tpot": (t1 - first) / (toks - 1) if toks > 1 else None, "toks": toks,
                    "end": t1, "start": t0})
    except Exception as e:  # noqa: BLE001 - counted and reported
        res.append({"error": repr(e)[:200], "start": t0, "end": time.perf_counter()})


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", default="model")
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--num-requests", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    prompts = [make_prompt(rng) for _ in range(a.num_requests)]
    gaps = [rng.expovariate(a.rate) for _ in range(a.num_requests)]
    client = openai.AsyncOpenAI(base_url=a.base_url, api_key="none", max_retries=0, timeout=600)
    res, tasks = [], []
    t_start = time.perf_counter()
    t_next = t_start
    for p, g in zip(prompts, gaps):
        t_next += g
        d = t_next - time.perf_counter()
        if d > 0:
            await asyncio.sleep(d)
        tasks.append(asyncio.create_task(one(client, a.model, p, a.max_tokens, res)))
    await asyncio.gather(*tasks)
    ok = [r for r in res if "error" not in r]
    errs = [r["error"] for r in res if "error" in r]
    span = max(r["end"] for r in res) - min(r["start"] for r in res)
    out = {"rate": a.rate, "requests": a.num_requests, "completed": len(ok), "errors": len(errs),
           "ttft_p50_ms": 1e3 * pct([r["ttft"] for r in ok], 50), "ttft_p99_ms": 1e3 * pct([r["ttft"] for r in ok], 99),
           "tpot_p50_ms": 1e3 * pct([r["tpot"] for r in ok if r["tpot"] is not None], 50),
           "out_tok_s": sum(r["toks"] for r in ok) / span, "req_s": len(ok) / span,
           "mean_out_tokens": statistics.mean([r["toks"] for r in ok]) if ok else 0}
    if errs:
        print("errors (first 3): " + "; ".join(errs[:3]), file=sys.stderr)
    print(json.dumps(out))


asyncio.run(main())
