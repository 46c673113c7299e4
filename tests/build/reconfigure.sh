#!/usr/bin/env bash
# ctest entry (build_reconfigure_stable): configures this source tree twice into one fresh directory
# and checks that the second configure changed no compile or link command. The Makefile configures on
# every `make`, so a command that differs between a first and a later configure rebuilds every object
# it touches (it did: FindPkgConfig put libzmq's -isystem among the include directories on the first
# run and among the compile options on later ones, and `make test` after `make run` rebuilt all ~400
# targets; CMakeLists.txt's osprey_pkg says why). Configure only, nothing is built: a few seconds.
#
# usage: reconfigure.sh <cmake> <source dir> <generator> [-D options of the build under test...]
set -uo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 <cmake> <source dir> <generator> [-DNAME=VALUE...]" >&2
    exit 2
fi
cmake_bin="$1"
src="$2"
gen="$3"
shift 3

dir="$(mktemp -d "${TMPDIR:-/tmp}/osprey-reconfigure.XXXXXX")" || exit 1
trap 'rm -rf -- "$dir"' EXIT

# What the build would run: every compile command (compile_commands.json, any generator) and, under
# Ninja, every command of every edge, links and custom commands included (ninja -t commands).
snapshot() {
    cp "$dir/build/compile_commands.json" "$dir/$1.compile_commands.json" || return 1
    if [ "$gen" = "Ninja" ]; then
        (cd "$dir/build" && ninja -t commands) > "$dir/$1.commands" || return 1
    else
        : > "$dir/$1.commands"
    fi
}

for pass in first second; do
    if ! "$cmake_bin" -S "$src" -B "$dir/build" -G "$gen" "$@" > "$dir/$pass.log" 2>&1; then
        echo "reconfigure: the $pass configure failed:" >&2
        cat "$dir/$pass.log" >&2
        exit 1
    fi
    snapshot "$pass" || { echo "reconfigure: no commands after the $pass configure" >&2; exit 1; }
done

n=$(grep -c '"command"' "$dir/first.compile_commands.json")
if [ "$n" -eq 0 ]; then
    echo "reconfigure: compile_commands.json lists no compile command" >&2
    exit 1
fi
rc=0
for what in compile_commands.json commands; do
    if ! diff -u "$dir/first.$what" "$dir/second.$what" > "$dir/$what.diff"; then
        echo "reconfigure: the second configure changed $(grep -c '^+[^+]' "$dir/$what.diff") line(s) of $what" \
             "(each changed compile command rebuilds its object on the next make); first lines of the diff:" >&2
        head -20 "$dir/$what.diff" >&2
        rc=1
    fi
done
[ $rc -eq 0 ] && echo "reconfigure: $n compile commands, the same after a second configure"
exit $rc
