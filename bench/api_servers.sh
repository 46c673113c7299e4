#!/usr/bin/env bash
# Long prompts at a high request rate with several API servers (issue 23): `osprey serve` with
# --api-server-count 1, then 4 (COUNTS), runs interleaved (1, 4, 1, 4, ...), medians. Each run:
# bench/api_servers.py (standard library only: no openai package needed) sends streamed chat
# completions of ~PROMPT_TOKENS tokens (MAX_TOKENS out) as a Poisson process at RATE req/s for DURATION
# s, on new connections (so SO_REUSEPORT spreads them over the servers), and reports TTFT p50/p90/p99,
# e2e latency, requests done/sent and errors. MODE=shared: one long prefix + a short unique suffix a
# request (the prefix cache serves the prefix; JSON parsing, the chat render and tokenization of the
# whole prompt in the API server is most of the work); MODE=distinct: every prompt different (the
# engine's prefill is the work). Prints one line a run and the median TTFT p50 ratio (first count /
# last count: > 1 means more API servers answered sooner).
#
# Usage: bench/api_servers.sh  (env: OSPREY_BIN [build/bin/osprey], MODEL [models/SmolLM2-135M-
#   Instruct.Q4_1.gguf], PYTHON [python3], REPS [3], COUNTS ["1 4"], MODE [shared], RATE [20],
#   DURATION [20], PROMPT_TOKENS [7500], MAX_TOKENS [4], THREADS [-t; the server's default],
#   DEVICE [cpu; cuda], HTTP_THREADS [--http-threads of each API server; the server's default],
#   ENGINE_PROCESS [0; 1: --engine-process in every run, so one API server also talks to a core process
#   (--api-server-count > 1 implies it; one server runs the engine in-process by default)],
#   MAX_NUM_SEQS [64], CLIENT_PROCS [4], DRAIN_S [120: after the last arrival, wait this long for
#   replies], SEED [0], PORT [8393], SERVER_CPUS / CLIENT_CPUS [taskset CPU
#   lists, e.g. 0-11 and 12-15; unset or no taskset: not pinned], SERVE_ARGS [more serve flags],
#   LOG_DIR [a new /tmp/osprey-api-servers.XXXXXX])
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OSPREY_BIN=${OSPREY_BIN:-build/bin/osprey}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PYTHON=${PYTHON:-python3}
REPS=${REPS:-3}
COUNTS=${COUNTS:-1 4}
MODE=${MODE:-shared}
RATE=${RATE:-20}
DURATION=${DURATION:-20}
PROMPT_TOKENS=${PROMPT_TOKENS:-7500}
MAX_TOKENS=${MAX_TOKENS:-4}
THREADS=${THREADS:-}
DEVICE=${DEVICE:-cpu}
HTTP_THREADS=${HTTP_THREADS:-}
ENGINE_PROCESS=${ENGINE_PROCESS:-0}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-64}
CLIENT_PROCS=${CLIENT_PROCS:-4}
SEED=${SEED:-0}
DRAIN_S=${DRAIN_S:-120}
PORT=${PORT:-8393}
SERVE_ARGS=${SERVE_ARGS:-}
LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/osprey-api-servers.XXXXXX)}
mkdir -p "$LOG_DIR"
SRV_PID=''
CLI_PID=''

# pinning only where taskset exists and a CPU list is given (a command prefix, not a function: the
# server's pid must be osprey's own, for stop_server)
PIN_SERVER=() PIN_CLIENT=()
if command -v taskset >/dev/null; then
    [ -n "${SERVER_CPUS:-}" ] && PIN_SERVER=(taskset -c "$SERVER_CPUS")
    [ -n "${CLIENT_CPUS:-}" ] && PIN_CLIENT=(taskset -c "$CLIENT_CPUS")
fi
health() { # the server's /health answers 200 (curl, else python)
    if command -v curl >/dev/null; then curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1
    else "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; fi
}
stop_server() {
    if [ -n "$CLI_PID" ]; then kill "$CLI_PID" 2>/dev/null || true; wait "$CLI_PID" 2>/dev/null || true; CLI_PID=; fi
    if [ -n "$SRV_PID" ]; then kill "$SRV_PID" 2>/dev/null || true; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=; fi
    rm -f "$LOG_DIR/server.pid"
}
trap stop_server EXIT
trap 'exit 143' TERM INT # through the EXIT trap: the server is stopped (and its API servers and core with it)
# every request is its own connection, all from 127.0.0.1: room for thousands at once (server and client)
ulimit -n "$(ulimit -Hn)" 2>/dev/null || ulimit -n 65536 2>/dev/null || true

run_one() { # api server count, rep
    local n=$1 rep=$2 log="$LOG_DIR/n$1-$2.log" extra=()
    [ -n "$THREADS" ] && extra+=(-t "$THREADS")
    [ -n "$HTTP_THREADS" ] && extra+=(--http-threads "$HTTP_THREADS")
    [ "$ENGINE_PROCESS" = 1 ] && extra+=(--engine-process)
    # shellcheck disable=SC2206 # SERVE_ARGS is a list of flags
    [ -n "$SERVE_ARGS" ] && extra+=($SERVE_ARGS)
    ${PIN_SERVER[@]+"${PIN_SERVER[@]}"} "$OSPREY_BIN" serve "$MODEL" --port "$PORT" --device "$DEVICE" --api-server-count "$n" \
        --max-num-seqs "$MAX_NUM_SEQS" --served-model-name model --max-connections 16384 --max-connections-per-client 0 \
        --max-queued-requests 16384 --drain-timeout 5 ${extra[@]+"${extra[@]}"} >"$log" 2>&1 &
    SRV_PID=$!
    echo "$SRV_PID" >"$LOG_DIR/server.pid" # for a caller that has to clean up after a SIGKILL
    # ready: /health answers and all n API servers have bound the port (one "serving ... on" line each)
    local ok=
    for _ in $(seq 1 1200); do
        kill -0 "$SRV_PID" 2>/dev/null || { echo "server died:" >&2; tail -20 "$log" >&2; exit 1; }
        if [ "$(grep -c '^INFO .* serving model on ' "$log" || true)" -ge "$n" ] &&
            health; then ok=1 && break; fi
        sleep 0.1
    done
    [ -n "$ok" ] || { echo "server not ready after 120 s:" >&2; tail -20 "$log" >&2; exit 1; }
    ${PIN_CLIENT[@]+"${PIN_CLIENT[@]}"} "$PYTHON" bench/api_servers.py --base-url "http://127.0.0.1:$PORT/v1" --mode "$MODE" \
        --rate "$RATE" --duration "$DURATION" --prompt-tokens "$PROMPT_TOKENS" --max-tokens "$MAX_TOKENS" \
        --procs "$CLIENT_PROCS" --seed "$SEED" --drain-s "$DRAIN_S" 2>>"$LOG_DIR/client.log" >"$LOG_DIR/client.out" &
    CLI_PID=$! # in the background: a SIGTERM is taken at once (wait is interrupted), not after the run
    wait "$CLI_PID" || { echo "client failed (n=$n rep=$rep):" >&2; tail -5 "$LOG_DIR/client.log" >&2; exit 1; }
    CLI_PID=
    sed "s/^/$n $rep /" "$LOG_DIR/client.out" >>"$LOG_DIR/results.txt"
    stop_server
}

: >"$LOG_DIR/results.txt"
echo "# $MODE prompts of ~$PROMPT_TOKENS tokens, $MAX_TOKENS out, $RATE req/s for $DURATION s; model $MODEL," \
    "--device $DEVICE, -t ${THREADS:-default}, --http-threads ${HTTP_THREADS:-default}, --max-num-seqs $MAX_NUM_SEQS," \
    "engine $([ "$ENGINE_PROCESS" = 1 ] && echo "process always" || echo "in-process for 1 server");" \
    "API servers: $COUNTS; $REPS interleaved reps; server CPUs ${SERVER_CPUS:-any}, client CPUs ${CLIENT_CPUS:-any}" \
    "($CLIENT_PROCS processes); $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
    for n in $COUNTS; do run_one "$n" "$rep"; done
done
"$PYTHON" - "$LOG_DIR/results.txt" "$COUNTS" <<'PY'
import json, statistics, sys
rows = []
for line in open(sys.argv[1]):
    n, rep, js = line.split(" ", 2)
    rows.append((int(n), int(rep), json.loads(js)))
counts = [int(c) for c in sys.argv[2].split()]
print("servers rep  done/sent  err left  send/s  done/s   TTFT p50     p90     p99 (ms)  e2e p50 (ms)  prompt tok  prefix hit")
for n, rep, d in rows:
    hit = f"{100 * d['prefix_hit']:.0f}%" if d.get("prefix_hit") is not None else "-"
    print(f"{n:7d} {rep:3d}  {d['done']:5d}/{d['sent']:<5d} {d['errors']:3d} {d['unfinished']:4d}  {d['send_rate'] or 0:6.1f}  {d['done_req_s']:6.1f}"
          f"  {d['ttft_p50_ms']:9.0f} {d['ttft_p90_ms']:7.0f} {d['ttft_p99_ms']:7.0f}       {d['e2e_p50_ms']:7.0f}"
          f"  {d['prompt_tokens'] or 0:10.0f}  {hit:>10s}")
med = {c: statistics.median(d["ttft_p50_ms"] for n, _, d in rows if n == c) for c in counts}
a, b = counts[0], counts[-1]
print("median TTFT p50: " + ", ".join(f"{c} API server(s) {med[c]:.0f} ms" for c in counts) +
      f"; ratio {a} / {b}: {med[a] / med[b]:.2f}")
short = [(n, rep) for n, rep, d in rows if d["done"] != d["sent"]]
if short:  # the percentiles cover only the requests done: a run that lost its slow tail looks faster
    print("warning: runs with requests not done (errors or unfinished), their TTFT is over the done ones only: " +
          ", ".join(f"{n} servers rep {rep}" for n, rep in short))
PY
echo "(logs: $LOG_DIR)" >&2
