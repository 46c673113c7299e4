#!/usr/bin/env bash
# Online serving benchmark: osprey serve vs llama.cpp's llama-server on the same model, threads and
# slots, driven by bench/serving.py (the official `openai` client in an asyncio open-loop driver:
# Poisson arrivals at each rate, streamed chat completions of exactly MAX_TOKENS tokens).
# Server pinned to core SERVER_CPU, client to CLIENT_CPU (taskset). Prints TTFT p50/p99, TPOT p50,
# output tok/s and req/s per rate and server, and osprey/llama.cpp ratios.
#
# Usage: bench/serving.sh    (env: OSPREY_BIN [build/bin/osprey], LLAMA_CPP_BIN [dir with llama-server;
#   without it only osprey runs], MODEL [models/SmolLM2-135M-Instruct.Q4_1.gguf], RATES ["1 2 4"],
#   DURATION [30: seconds of arrivals per rate], MAX_TOKENS [32], SLOTS [4], CTX [2048 per slot],
#   THREADS [1], SERVER_CPU [0], CLIENT_CPU [1], PORT [8391], PYTHON [.venv-it/bin/python])
# The client venv is scripts/setup-integration.sh's (.venv-it: openai). llama-server is not built here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OSPREY_BIN=${OSPREY_BIN:-build/bin/osprey}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
RATES=${RATES:-"1 2 4"}
DURATION=${DURATION:-30}
MAX_TOKENS=${MAX_TOKENS:-32}
SLOTS=${SLOTS:-4}
CTX=${CTX:-2048}
THREADS=${THREADS:-1}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PORT=${PORT:-8391}
PYTHON=${PYTHON:-.venv-it/bin/python}
[ -x "$PYTHON" ] || scripts/setup-integration.sh
OUT=$(mktemp -d /tmp/osprey-serving.XXXXXX)
SRV_PID=

stop_server() { if [ -n "$SRV_PID" ]; then kill "$SRV_PID" 2>/dev/null || true; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=; fi; }
trap stop_server EXIT

wait_health() {
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        kill -0 "$SRV_PID" 2>/dev/null || { echo "server died; log: $1" >&2; cat "$1" >&2; exit 1; }
        sleep 0.1
    done
    echo "server not healthy after 60 s" >&2; exit 1
}

run_server() { # name, command...
    local name=$1; shift
    taskset -c "$SERVER_CPU" "$@" >"$OUT/$name.log" 2>&1 &
    SRV_PID=$!
    wait_health "$OUT/$name.log"
    # warm-up: one request, not measured
    taskset -c "$CLIENT_CPU" "$PYTHON" bench/serving.py --base-url "http://127.0.0.1:$PORT/v1" --rate 100 \
        --num-requests 1 --max-tokens 4 --seed 99 >/dev/null
    for r in $RATES; do
        n=$(awk -v r="$r" -v d="$DURATION" 'BEGIN { n = int(r * d + 0.5); print (n < 1 ? 1 : n) }')
        echo "  $name rate $r req/s, $n requests ..." >&2
        taskset -c "$CLIENT_CPU" "$PYTHON" bench/serving.py --base-url "http://127.0.0.1:$PORT/v1" --rate "$r" \
            --num-requests "$n" --max-tokens "$MAX_TOKENS" --seed 1 | sed "s/^/$name /" >>"$OUT/results.txt"
    done
    stop_server
}

: >"$OUT/results.txt"
run_server osprey "$OSPREY_BIN" serve -m "$MODEL" --port "$PORT" -t "$THREADS" --max-num-seqs "$SLOTS" \
    --max-model-len "$CTX" --served-model-name model --log-level warning
if [ -n "${LLAMA_CPP_BIN:-}" ]; then
    run_server llama.cpp "$LLAMA_CPP_BIN/llama-server" -m "$MODEL" --port "$PORT" -t "$THREADS" -tb "$THREADS" \
        -np "$SLOTS" -c $((CTX * SLOTS)) --alias model --log-disable
fi

"$PYTHON" - "$OUT/results.txt" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    name, js = line.split(" ", 1)
    d = json.loads(js)
    rows[(name, d["rate"])] = d
print("| server | rate (req/s) | done/sent | tokens/req | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | output tok/s | req/s |")
print("|---|---|---|---|---|---|---|---|---|")
for (name, rate), d in rows.items():
    print(f"| {name} | {rate:g} | {d['completed']}/{d['requests']} | {d['mean_out_tokens']:.1f} | {d['ttft_p50_ms']:.0f} | {d['ttft_p99_ms']:.0f} "
          f"| {d['tpot_p50_ms']:.1f} | {d['out_tok_s']:.1f} | {d['req_s']:.2f} |")
rates = sorted({r for (_, r) in rows})
if any(n == "llama.cpp" for (n, _) in rows):
    print()
    print("| rate (req/s) | TTFT p50 osprey/llama.cpp | TTFT p99 | TPOT p50 | output tok/s |")
    print("|---|---|---|---|---|")
    for r in rates:
        o, l = rows.get(("osprey", r)), rows.get(("llama.cpp", r))
        if o and l:
            print(f"| {r:g} | {o['ttft_p50_ms'] / l['ttft_p50_ms']:.2f} | {o['ttft_p99_ms'] / l['ttft_p99_ms']:.2f} "
                  f"| {o['tpot_p50_ms'] / l['tpot_p50_ms']:.2f} | {o['out_tok_s'] / l['out_tok_s']:.2f} |")
PY
echo "(raw: $OUT)" >&2
