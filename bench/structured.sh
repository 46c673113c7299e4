#!/usr/bin/env bash
# Structured outputs end to end (issue 19, "Fast"): osprey serve vs llama.cpp's llama-server on the CPU,
# same GGUF, same threads, same chat prompt, greedy (temperature 0), MAX_TOKENS, non-streaming:
#   (a) unconstrained, (b) under the 20-property JSON schema bench/structured_schema.json
#       (osprey: response_format json_schema; llama-server: its `json_schema` field, the same schema).
# Each server runs alone (one after the other); before measuring, one request of each kind warms it up
# (osprey compiles the schema's automaton on the first request with it and caches it).
# Then REPS requests of each kind, alternating. Tokens/s = completion_tokens / wall time of the request
# (client side, prefill included); server side, osprey's decode time per token from /metrics
# (vllm:time_per_output_token_seconds, delta around each request) and llama-server's `timings`.
# Every structured output must parse as JSON and validate against the schema (python jsonschema when
# importable, else json.loads only): a row with an invalid output is marked, its speed is not a result.
# Finally grammar_bench (bench/grammar/mask_bench.c: the same 20 properties, without the length caps) gives the mask time per token on one
# core for the same model's vocabulary, printed beside osprey's unconstrained step time of this run.
# Prints tables and the issue's ratios (structured/unconstrained >= 0.9, osprey/llama-server structured
# >= 1.5); no timed assertion.
#
# Usage: bench/structured.sh   (env: OSPREY_BIN [build/bin/osprey], LLAMA_SERVER [llama-server binary;
#   without it only osprey runs], GRAMMAR_BENCH [grammar_bench beside OSPREY_BIN; skipped if absent],
#   MODEL [models/SmolLM2-135M-Instruct.Q4_1.gguf], SCHEMA [bench/structured_schema.json], REPS [3],
#   MAX_TOKENS [256], THREADS [2], CTX [4096], PORT [8393: osprey; llama-server on PORT+1], PYTHON [python3: needs only the standard
#   library; jsonschema if present], GB_REPS [5: grammar_bench repetitions], SPEC_CONFIG [a
#   --speculative-config JSON: osprey runs a second time with it, as "osprey-spec", on PORT+2],
#   OSPREY_ARGS [more `osprey serve` arguments for both, e.g. --cpu-activations q8])
# llama-server is not built here (a CPU build of llama.cpp, e.g. cmake --build build --target llama-server).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OSPREY_BIN=${OSPREY_BIN:-build/bin/osprey}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
SCHEMA=${SCHEMA:-bench/structured_schema.json}
REPS=${REPS:-3}
MAX_TOKENS=${MAX_TOKENS:-256}
THREADS=${THREADS:-2}
CTX=${CTX:-4096}
BASE_PORT=${PORT:-8393}
PORT=$BASE_PORT
PYTHON=${PYTHON:-python3}
GB_REPS=${GB_REPS:-5}
GRAMMAR_BENCH=${GRAMMAR_BENCH:-$(dirname "$OSPREY_BIN")/grammar_bench}
OUT=$(mktemp -d /tmp/osprey-structured.XXXXXX)
SRV_PID=

stop_server() { if [ -n "$SRV_PID" ]; then kill "$SRV_PID" 2>/dev/null || true; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=; fi; }
trap stop_server EXIT

wait_health() {
    for _ in $(seq 1 1200); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        kill -0 "$SRV_PID" 2>/dev/null || { echo "server died; log: $1" >&2; cat "$1" >&2; exit 1; }
        sleep 0.1
    done
    echo "server not healthy after 120 s" >&2; exit 1
}

# The client: warm-up, then REPS x (unconstrained, structured); one JSON line per measured request.
cat >"$OUT/client.py" <<'PY'
import json, re, sys, time, urllib.request
name, port, schema_path, reps, max_tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
schema = json.load(open(schema_path))
base = f"http://127.0.0.1:{port}"
PROMPT = ("Describe a fictional employee of a software company as a JSON object with exactly these 20 fields: "
          "id, name, email, age, score, active, role (admin, user or guest), tags (a list of strings), city, country, "
          "zip, phone, created (a date YYYY-MM-DD), height, weight, notes, manager (an object with id and name), "
          "level, verified, nickname. Answer with the JSON object only.")

def post(body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        d = json.load(r)
    return d, time.perf_counter() - t0

def tpot_metrics():
    """osprey: (sum, count) of vllm:time_per_output_token_seconds; None elsewhere."""
    if name != "osprey":
        return None
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    s = c = 0.0
    for line in text.splitlines():
        m = re.match(r"vllm:time_per_output_token_seconds_(sum|count)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            if m.group(1) == "sum": s += float(m.group(3))
            else: c += float(m.group(3))
    return s, c

def body(kind):
    b = {"model": "model", "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
         "max_tokens": max_tokens, "stream": False}
    if kind == "structured":
        if name.startswith("osprey"):
            b["response_format"] = {"type": "json_schema", "json_schema": {"name": "employee", "schema": schema, "strict": True}}
        else:
            b["json_schema"] = schema  # llama-server's own field
    return b

try:
    import jsonschema
except ImportError:
    jsonschema = None

def check(text):
    try:
        obj = json.loads(text)
    except Exception as e:
        return "not JSON"
    if jsonschema is None:
        return "json ok (no jsonschema)"
    try:
        jsonschema.validate(obj, schema)
    except jsonschema.ValidationError as e:
        return "schema: " + e.message[:60]
    return "valid"

def one(kind, warm=False):
    m0 = tpot_metrics()
    d, wall = post(body(kind))
    m1 = tpot_metrics()
    ch = d["choices"][0]
    text = ch["message"].get("content") or ""
    n = d["usage"]["completion_tokens"]
    rec = {"server": name, "kind": kind, "warmup": warm, "wall_s": wall, "completion_tokens": n,
           "prompt_tokens": d["usage"]["prompt_tokens"], "finish_reason": ch.get("finish_reason"),
           "tok_s": n / wall, "check": check(text), "text_head": text[:120]}
    if m0 and m1 and m1[1] > m0[1]:
        rec["server_tpot_ms"] = 1e3 * (m1[0] - m0[0]) / (m1[1] - m0[1])
    t = d.get("timings")
    if t:
        rec["server_decode_tok_s"] = t.get("predicted_per_second")
        rec["server_tpot_ms"] = t.get("predicted_per_token_ms")
        rec["server_prompt_ms"] = t.get("prompt_ms")
    if kind == "structured" and warm:
        rec["text"] = text
    print(json.dumps(rec), flush=True)

one("unconstrained", warm=True)
one("structured", warm=True)
for _ in range(reps):
    one("unconstrained")
    one("structured")
PY

run_server() { # name, command...
    local name=$1; shift
    # the previous run's sockets on PORT gone (osprey serve cannot bind over TIME-WAIT ones: up to 60 s)
    for _ in $(seq 1 700); do
        command -v ss >/dev/null && [ -n "$(ss -Htan "( sport = :$PORT )" 2>/dev/null)" ] || break
        sleep 0.1
    done
    "$@" >"$OUT/$name.log" 2>&1 &
    SRV_PID=$!
    wait_health "$OUT/$name.log"
    echo "  $name: warm-up + $REPS x (unconstrained, structured) ..." >&2
    "$PYTHON" "$OUT/client.py" "$name" "$PORT" "$SCHEMA" "$REPS" "$MAX_TOKENS" >>"$OUT/results.jsonl"
    stop_server
}

: >"$OUT/results.jsonl"
run_server osprey "$OSPREY_BIN" serve -m "$MODEL" --port "$PORT" -t "$THREADS" --max-model-len "$CTX" \
    --served-model-name model --log-level warning ${OSPREY_ARGS:-}
if [ -n "${SPEC_CONFIG:-}" ]; then # the same server with speculative decoding (under a grammar: its forced
    PORT=$((BASE_PORT + 2))           # continuations drafted, every draft verified: the same tokens)
    run_server osprey-spec "$OSPREY_BIN" serve -m "$MODEL" --port "$PORT" -t "$THREADS" --max-model-len "$CTX" \
        --served-model-name model --log-level warning --speculative-config "$SPEC_CONFIG" ${OSPREY_ARGS:-}
fi
if [ -n "${LLAMA_SERVER:-}" ]; then
    PORT=$((BASE_PORT + 1))
    run_server llama-server "$LLAMA_SERVER" -m "$MODEL" --port "$PORT" -t "$THREADS" -tb "$THREADS" -np 1 -c "$CTX" \
        --alias model --log-disable
fi
: >"$OUT/grammar_bench.txt"
if [ -x "$GRAMMAR_BENCH" ]; then
    echo "  grammar_bench -m $MODEL -r $GB_REPS ..." >&2
    "$GRAMMAR_BENCH" -m "$MODEL" -r "$GB_REPS" >"$OUT/grammar_bench.txt"
fi

"$PYTHON" - "$OUT/results.jsonl" "$OUT/grammar_bench.txt" "$MODEL" <<'PY'
import json, re, statistics as st, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
gb = open(sys.argv[2]).read()
print(f"model {sys.argv[3]}")
print()
print("| server | kind | reps | completion tokens | finish | tok/s (client, median) | server ms/token (median) | output check |")
print("|---|---|---|---|---|---|---|---|")
agg = {}
for srv in dict.fromkeys(r["server"] for r in recs):
    for kind in ("unconstrained", "structured"):
        rs = [r for r in recs if r["server"] == srv and r["kind"] == kind and not r["warmup"]]
        if not rs:
            continue
        tps = st.median(r["tok_s"] for r in rs)
        tp = [r["server_tpot_ms"] for r in rs if r.get("server_tpot_ms")]
        tpot = st.median(tp) if tp else None
        checks = sorted({r["check"] for r in rs})
        ok = kind == "unconstrained" or checks == ["valid"] or checks == ["json ok (no jsonschema)"]
        agg[(srv, kind)] = (tps, tpot, ok)
        toks = sorted({r["completion_tokens"] for r in rs})
        fins = sorted({str(r["finish_reason"]) for r in rs})
        print(f"| {srv} | {kind} | {len(rs)} | {'/'.join(map(str, toks))} | {'/'.join(fins)} | {tps:.1f} "
              f"| {'-' if tpot is None else f'{tpot:.2f}'} | {', '.join(checks)}{'' if ok else ' (INVALID: speed not a result)'} |")
for r in recs:
    if r["warmup"] and r["kind"] == "structured":
        print(f"\n{r['server']} first structured request (warm-up, cold schema): {r['tok_s']:.1f} tok/s, "
              f"{r['completion_tokens']} tokens, {r['check']}; output: {r.get('text', '')[:160]!r}")
print()
def ratio(a, b):
    if a in agg and b in agg:
        v = agg[a][0] / agg[b][0]
        valid = agg[a][2] and agg[b][2]
        return f"{v:.2f}" + ("" if valid else " (an invalid output: not a result)")
    return "-"
print(f"osprey structured / osprey unconstrained tok/s: {ratio(('osprey', 'structured'), ('osprey', 'unconstrained'))}  (goal >= 0.9)")
print(f"osprey structured / llama-server structured tok/s: {ratio(('osprey', 'structured'), ('llama-server', 'structured'))}  (goal >= 1.5)")
if ("osprey-spec", "structured") in agg:
    print(f"osprey-spec structured / osprey structured tok/s: {ratio(('osprey-spec', 'structured'), ('osprey', 'structured'))}")
    print(f"osprey-spec structured / llama-server structured tok/s: {ratio(('osprey-spec', 'structured'), ('llama-server', 'structured'))}  (goal >= 1.5)")
print(f"llama-server structured / llama-server unconstrained tok/s: {ratio(('llama-server', 'structured'), ('llama-server', 'unconstrained'))}")
if gb:
    print()
    print("grammar_bench (mask_bench.c's 20-property schema, i.e. SCHEMA without its length caps; this model's vocabulary; one core; mask time per token):")
    print(gb.rstrip())
    m = re.search(r"^cold.*?median\s+([\d.]+) us", gb, re.M)
    w = re.search(r"^warm.*?median\s+([\d.]+) us", gb, re.M)
    u = agg.get(("osprey", "unconstrained"))
    if m and u and u[1]:
        print(f"mask median cold {m.group(1)} us, warm {w.group(1) if w else '-'} us (goal <= 50 us) beside osprey's "
              f"unconstrained step time {u[1] * 1e3:.0f} us/token (server side, this run)")
PY
echo "(raw: $OUT)" >&2
