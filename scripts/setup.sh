#!/usr/bin/env bash
# Installs the Debian packages that building osprey, `make run` and `make test` need: the C
# toolchain, CMake + Ninja, the libraries libosprey links (PCRE2, xxHash, jansson, OpenMP, and
# ZeroMQ + msgpack-c for engine IPC and KV events, libcurl for the router's client, libedit for
# `osprey chat`'s line editing), cmocka for the tests, clang with its
# sanitizer/libFuzzer runtimes for `make test-asan` and `make fuzz`, pip + unzip for
# scripts/fetch-model.sh, and chromium + chromium-driver for the web page's headless-browser test
# (tests/integration/test_webui_browser.py; selenium itself comes from scripts/setup-integration.sh).
#
# Idempotent and non-interactive: when every package is already installed it does nothing (no apt
# run at all), so `make` can call it on every invocation. Runs as root, or through sudo otherwise.
# Tools that are needed only to regenerate golden fixtures live in scripts/setup-golden.sh.
set -euo pipefail

PACKAGES=(
    build-essential cmake ninja-build pkg-config git
    libpcre2-dev libxxhash-dev libjansson-dev libcmocka-dev libmicrohttpd-dev
    libzmq3-dev libmsgpack-dev libcurl4-gnutls-dev libedit-dev
    clang libclang-rt-dev libomp-dev
    python3 python3-pip unzip ca-certificates
    chromium chromium-driver
)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all ${#PACKAGES[@]} packages present"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo -n)
    if ! sudo -n true 2>/dev/null; then SUDO=(sudo); fi
else
    echo "setup: need root or sudo to install: ${missing[*]}" >&2
    exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
echo "setup: done"
