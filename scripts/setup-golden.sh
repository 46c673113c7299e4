#!/usr/bin/env bash
# Installs what regenerating golden fixtures needs; `make test` never calls it (the fixtures under
# tests/golden/ are committed, and the golden tests only read them).
#
#   1. A Python venv (default .venv-golden/, gitignored) with jinja2 (chat templates, configured as
#      transformers configures it), gguf (reading GGUF metadata the way llama.cpp's tools do) and
#      numpy. Activate it or call .venv-golden/bin/python directly.
#   The reference tools themselves (llama.cpp's llama-tokenize, llama-simple, ...) are built by you,
#   from llama.cpp's public source, outside this repository; no recipe for them is kept here. Fixture
#   scripts find them through LLAMA_CPP_BIN (the build's bin/ directory).
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
