#!/usr/bin/env bash
# The HTTP event loop (issue 20) against the thread-per-connection server it replaced: threads and RSS
# with 1,000 idle connections (bench/idle_conns.py), then one 64-stream run of bench/serving.py
# against each build, both servers up and loaded at the same time (this box is shared: the pair sees
# the same load). usage: bench/evloop.sh OLD_BIN NEW_BIN [MODEL] [STREAMS] [TOKENS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OLD=$1 NEW=$2 MODEL=${3:-models/SmolLM2-135M-Instruct.Q4_1.gguf} N=${4:-64} T=${5:-32}
PY=.venv-it/bin/python
for b in "$OLD" "$NEW"; do $PY bench/idle_conns.py "$b" "$MODEL" 1000; done
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
PO=$(port) PN=$(port)
"$OLD" serve -m "$MODEL" --port "$PO" -t 2 --kv-cache-memory 256M --served-model-name m >/tmp/evloop-old.log 2>&1 & A=$!
"$NEW" serve -m "$MODEL" --port "$PN" -t 2 --kv-cache-memory 256M --served-model-name m >/tmp/evloop-new.log 2>&1 & B=$!
trap 'kill $A $B 2>/dev/null' EXIT
for _ in $(seq 300); do curl -sf "localhost:$PO/health" >/dev/null && curl -sf "localhost:$PN/health" >/dev/null && break; sleep 0.2; done
run() { $PY bench/serving.py --base-url "http://127.0.0.1:$1/v1" --model m --rate 1000 --num-requests "$N" --max-tokens "$T" --seed 0; }
run "$PO" >/tmp/evloop-old.json & C=$!
run "$PN" >/tmp/evloop-new.json & D=$!
wait $C $D
echo "old: $(cat /tmp/evloop-old.json)"
echo "new: $(cat /tmp/evloop-new.json)"
