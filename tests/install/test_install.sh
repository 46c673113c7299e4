#!/usr/bin/env bash
# `cmake --install BUILD --prefix DIR` (issue 20): installs bin/osprey, lib/libosprey.a, the public
# headers under include/osprey/ and lib/pkgconfig/osprey.pc; then a small C program
# (tests/install/app.c) is compiled in a temp dir with only the installed pkg-config flags, linked,
# and run. Usage: tests/install/test_install.sh BUILD_DIR (ctest's `install` entry passes it).
# Exit 77 (skipped) when pkg-config is absent; 1 on any failure.
set -euo pipefail
build=${1:?usage: test_install.sh BUILD_DIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d /tmp/osprey-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
p=$tmp/prefix
[ -x "$p/bin/osprey" ] || fail "no bin/osprey"
[ -f "$p/lib/libosprey.a" ] || fail "no lib/libosprey.a"
[ -f "$p/lib/pkgconfig/osprey.pc" ] || fail "no lib/pkgconfig/osprey.pc"
for h in "$src"/include/osprey/*.h; do
    cmp -s "$h" "$p/include/osprey/$(basename "$h")" || fail "include/osprey/$(basename "$h") not installed"
done
[ -z "$(ls "$p/include" | grep -v '^osprey$')" ] || fail "headers outside include/osprey: $(ls "$p/include")"
"$p/bin/osprey" --help >/dev/null || fail "the installed osprey --help"

if ! command -v pkg-config >/dev/null; then
    echo "SKIP: pkg-config is not installed: the install itself passed, the compile against osprey.pc is not checked"
    exit 77
fi
export PKG_CONFIG_PATH=$p/lib/pkgconfig
pkg-config --exists osprey || fail "pkg-config does not find osprey: $(pkg-config --print-errors --exists osprey 2>&1)"
[ "$(pkg-config --modversion osprey)" = "$(sed -n 's/^project(osprey VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")" ] ||
    fail "osprey.pc's version $(pkg-config --modversion osprey) is not the project's"
mkdir "$tmp/app"
cp "$src/tests/install/app.c" "$tmp/app/"
cd "$tmp/app"
cflags=$(pkg-config --cflags osprey)
libs=$(pkg-config --libs osprey)
case "$cflags" in *"$src"*) fail "the pkg-config flags point into the source tree: $cflags";; esac
${CC:-cc} -std=c17 -Wall -Wextra -Werror $cflags app.c -o app $libs || fail "app.c does not build with: $cflags ... $libs"
out=$(./app) || fail "app exited $?: $out"
echo "$out"
echo "OK: installed to $p; app.c built with: $cflags ... $libs"
