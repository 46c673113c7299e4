#!/usr/bin/env bash
# Installs what regenerating golden fixtures needs; `make test` never calls it (the fixtures under
# tests/golden/ are committed, and the golden tests only read them).
#
#   1. A Python venv (default .venv-golden/, gitignored) with jinja2 (chat templates, configured as
#      transformers configures it), gguf (reading GGUF metadata the way llama.cpp's tools do) and
#      numpy. Activate it or call .venv-golden/bin/python directly.
#   2. Optionally, reference binaries built from llama.cpp's public source, OUTSIDE the repo: set
#      OSPREY_LLAMA_CPP_SRC to a llama.cpp checkout and they are built (CPU only) into
#      OSPREY_REF_DIR (default ~/.cache/osprey-ref/llama.cpp). Fixture scripts in tests/golden/ find
#      them through OSPREY_REF_DIR; nothing built from it is ever committed.
#
# Idempotent: an existing venv is reused (pip skips what is installed), an existing build is updated.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${OSPREY_GOLDEN_VENV:-$ROOT/.venv-golden}"
PYTHON="${PYTHON:-python3}"

bash "$ROOT/scripts/setup.sh"

if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
        # Debian's python3 needs python3-venv for `-m venv`.
        if [ "$(id -u)" -eq 0 ]; then SUDO=(); else SUDO=(sudo); fi
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
        "$PYTHON" -m venv "$VENV"
    fi
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
    'jinja2>=3.1' 'gguf>=0.10' 'numpy>=1.24'
echo "setup-golden: venv $VENV ($("$VENV/bin/python" -c 'import jinja2, gguf, numpy; print("jinja2", jinja2.__version__, "numpy", numpy.__version__)'))"

if [ -n "${OSPREY_LLAMA_CPP_SRC:-}" ]; then
    REF="${OSPREY_REF_DIR:-$HOME/.cache/osprey-ref}/llama.cpp"
    echo "setup-golden: building llama.cpp from $OSPREY_LLAMA_CPP_SRC into $REF"
    cmake -S "$OSPREY_LLAMA_CPP_SRC" -B "$REF" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
    cmake --build "$REF" -j "${JOBS:-2}" --target llama-tokenize llama-cli
    echo "setup-golden: reference binaries in $REF/bin (export OSPREY_REF_DIR=$(dirname "$REF"))"
fi
