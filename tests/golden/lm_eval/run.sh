#!/usr/bin/env bash
# The lm-evaluation-harness check of issue 20: scores one local multiple-choice task (items.jsonl,
# written by make_task.py) with lm-eval's `hf` backend (transformers, the GGUF dequantized to float32)
# and with lm-eval's `local-completions` backend against `osprey serve` on the same GGUF (echo +
# logprobs on /v1/completions, the requests tokenized by the same saved HF tokenizer), then compares
# acc / acc_norm, the option picked per item and the per-option loglikelihoods (compare.py).
#
# Run by hand; ctest and CI never call it (lm-eval and torch are too heavy). Needs PyPI once: it makes
# its own venv (default .venv-lmeval/, gitignored; not .venv-it) with lm-eval[api,hf], torch (PyPI's
# plain wheel; on x86-64 Linux it pulls the CUDA runtime wheels, about 3 GB, unused here), transformers
# and gguf. torch and osprey use 1 and 2 threads (the development machine is shared).
#
#   tests/golden/lm_eval/run.sh [WORK_DIR]     (default build/lm_eval; osprey from $OSPREY_BIN, else
#                                               build/bin/osprey; model from $OSPREY_MODEL, else
#                                               models/SmolLM2-135M-Instruct.Q4_1.gguf)
# Prints the comparison and exits 1 when the backends disagree beyond near-ties (compare.py); WORK_DIR
# keeps both runs' lm-eval outputs, compare.json and the server log. Knobs: OSPREY_LMEVAL_BATCH (8:
# lm-eval's batch_size, prompts per /v1/completions request), OSPREY_LMEVAL_TOKENIZED (True: token ids
# sent; False: text, osprey tokenizes it), OSPREY_LMEVAL_CONCURRENT (1: requests in flight at once),
# OSPREY_LMEVAL_HF=0 (keep WORK_DIR/out-hf from a former run).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
WORK="$(mkdir -p "${1:-$ROOT/build/lm_eval}" && cd "${1:-$ROOT/build/lm_eval}" && pwd)"
VENV="${OSPREY_LMEVAL_VENV:-$ROOT/.venv-lmeval}"
BIN="${OSPREY_BIN:-$ROOT/build/bin/osprey}"
MODEL="$(realpath "${OSPREY_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}")"
BATCH="${OSPREY_LMEVAL_BATCH:-8}"
TOKENIZED="${OSPREY_LMEVAL_TOKENIZED:-True}"
RUN_HF="${OSPREY_LMEVAL_HF:-1}"
CONCURRENT="${OSPREY_LMEVAL_CONCURRENT:-1}"
[ -x "$BIN" ] || { echo "run.sh: no osprey binary at $BIN (build it, or set OSPREY_BIN)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "run.sh: no model at $MODEL (scripts/fetch-model.sh, or set OSPREY_MODEL)" >&2; exit 1; }

# 1. the venv (pins: what RESULTS.md was measured with)
if ! [ -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import lm_eval, torch, transformers, gguf' 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check 'lm-eval[api,hf]==0.4.13' torch transformers gguf
fi
PY="$VENV/bin/python"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
export HF_HOME="$WORK/hf-home" HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$PY" -c 'import lm_eval, torch, transformers, gguf, sys; from importlib.metadata import version as v
print("versions: python", sys.version.split()[0], "lm-eval", v("lm-eval"), "torch", torch.__version__,
      "transformers", transformers.__version__, "gguf", v("gguf"))'

# 2. the task: the items, and a task config naming them by absolute path
mkdir -p "$WORK/task"
"$PY" "$HERE/make_task.py" "$WORK/task/items.jsonl"
cmp -s "$WORK/task/items.jsonl" "$HERE/items.jsonl" || { echo "run.sh: make_task.py no longer writes the committed items.jsonl" >&2; exit 1; }
cat > "$WORK/task/osprey_mc.yaml" <<YAML
task: osprey_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: $WORK/task/items.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
YAML

# 3. the reference: lm-eval's hf backend on the GGUF itself (transformers dequantizes it to float32)
[ -f "$WORK/tokenizer/tokenizer_config.json" ] || "$PY" "$HERE/save_tokenizer.py" "$MODEL" "$WORK/tokenizer"
rm -rf "$WORK/out-osprey"
if [ "$RUN_HF" != 0 ] || ! [ -d "$WORK/out-hf" ]; then
    rm -rf "$WORK/out-hf"
    "$PY" -m lm_eval --model hf --device cpu \
        --model_args "pretrained=$(dirname "$MODEL"),gguf_file=$(basename "$MODEL"),tokenizer=$WORK/tokenizer,dtype=float32" \
        --tasks osprey_mc --include_path "$WORK/task" --batch_size "$BATCH" \
        --output_path "$WORK/out-hf" --log_samples
fi

# 4. osprey serve on the same GGUF, lm-eval's local-completions against it
PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$BIN" serve -m "$MODEL" --port "$PORT" -t 2 --served-model-name smollm2 > "$WORK/serve.log" 2>&1 &
SRV=$!
trap 'kill "$SRV" 2>/dev/null || true; wait "$SRV" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 "$SRV" 2>/dev/null || { echo "run.sh: osprey serve exited:" >&2; tail -5 "$WORK/serve.log" >&2; exit 1; }
    sleep 0.2
done
"$PY" -m lm_eval --model local-completions \
    --model_args "model=smollm2,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=huggingface,tokenizer=$WORK/tokenizer,tokenized_requests=$TOKENIZED,num_concurrent=$CONCURRENT,max_retries=1" \
    --tasks osprey_mc --include_path "$WORK/task" --batch_size "$BATCH" \
    --output_path "$WORK/out-osprey" --log_samples

# 5. the comparison
echo "run.sh: outputs under $WORK (compare.json, out-hf/, out-osprey/, serve.log)"
"$PY" "$HERE/compare.py" --a "hf=$WORK/out-hf" --b "osprey=$WORK/out-osprey" --json "$WORK/compare.json"
