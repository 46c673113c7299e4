#!/usr/bin/env bash
# The cost of the EngineCore process split (issue 23): osprey serve in-process vs --engine-process on
# the same model, threads and batch, runs interleaved (in-process, process, in-process, ...), medians.
# Each run: BATCH streamed chat completions of exactly MAX_TOKENS tokens sent at once (bench/serving.py
# with an arrival rate high enough that all arrive together), so every step decodes a full batch;
# output tokens/s over the run. Server (frontend and core alike) pinned to SERVER_CPU, client to
# CLIENT_CPU. Prints each run and the median ratio process / in-process.
#
# Usage: bench/engine_process.sh  (env: OSPREY_BIN [build/bin/osprey], MODEL [models/SmolLM2-135M-
#   Instruct.Q4_1.gguf], BATCH [64], MAX_TOKENS [64], REPS [3], THREADS [1], SERVER_CPU [0],
#   CLIENT_CPU [1], PORT [8392], PYTHON [.venv-it/bin/python])
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OSPREY_BIN=${OSPREY_BIN:-build/bin/osprey}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
BATCH=${BATCH:-64}
MAX_TOKENS=${MAX_TOKENS:-64}
REPS=${REPS:-3}
THREADS=${THREADS:-1}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PORT=${PORT:-8392}
PYTHON=${PYTHON:-.venv-it/bin/python}
[ -x "$PYTHON" ] || scripts/setup-integration.sh
OUT=$(mktemp -d /tmp/osprey-engine-process.XXXXXX)
SRV_PID=

stop_server() { if [ -n "$SRV_PID" ]; then kill "$SRV_PID" 2>/dev/null || true; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=; fi; }
trap stop_server EXIT

run_one() { # mode (inproc|process), rep
    local mode=$1 rep=$2 extra=()
    [ "$mode" = process ] && extra=(--engine-process)
    taskset -c "$SERVER_CPU" "$OSPREY_BIN" serve -m "$MODEL" --port "$PORT" -t "$THREADS" --max-num-seqs "$BATCH" \
        --served-model-name model --log-level warning "${extra[@]}" >"$OUT/$mode-$rep.log" 2>&1 &
    SRV_PID=$!
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
        kill -0 "$SRV_PID" 2>/dev/null || { echo "server died:" >&2; cat "$OUT/$mode-$rep.log" >&2; exit 1; }
        sleep 0.1
    done
    taskset -c "$CLIENT_CPU" "$PYTHON" bench/serving.py --base-url "http://127.0.0.1:$PORT/v1" --rate 100 \
        --num-requests 1 --max-tokens 4 --seed 99 >/dev/null # warm-up
    taskset -c "$CLIENT_CPU" "$PYTHON" bench/serving.py --base-url "http://127.0.0.1:$PORT/v1" --rate 100000 \
        --num-requests "$BATCH" --max-tokens "$MAX_TOKENS" --seed 1 | sed "s/^/$mode $rep /" >>"$OUT/results.txt"
    stop_server
}

: >"$OUT/results.txt"
echo "# model $MODEL, batch $BATCH x $MAX_TOKENS tokens, $THREADS thread(s), $REPS interleaved pairs" >&2
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
    run_one inproc "$rep"
    run_one process "$rep"
done
"$PYTHON" - "$OUT/results.txt" <<'PY'
import json, statistics, sys
rows = []
for line in open(sys.argv[1]):
    mode, rep, js = line.split(" ", 2)
    rows.append((mode, int(rep), json.loads(js)))
print("run      rep  done/sent  output tok/s  TTFT p50 (ms)  TPOT p50 (ms)")
for mode, rep, d in rows:
    print(f"{mode:8s} {rep:3d}  {d['completed']:4d}/{d['requests']:<4d}  {d['out_tok_s']:12.1f}  {d['ttft_p50_ms']:13.0f}  {d['tpot_p50_ms']:13.1f}")
med = {m: statistics.median(d["out_tok_s"] for mm, _, d in rows if mm == m) for m in ("inproc", "process")}
print(f"median output tok/s: in-process {med['inproc']:.1f}, --engine-process {med['process']:.1f}, "
      f"ratio {med['process'] / med['inproc']:.3f}")
PY
echo "(raw: $OUT)" >&2
