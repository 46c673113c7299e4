#!/usr/bin/env bash
# Sampling benchmark (sampler issue): the rejection sampler vs a sort-based sampler, per row, in one
# run, for vocab 49,152 and 128,256 and batch 1..256; prints both and the ratio.
#
#   BUILD=/tmp/build bench/sampling.sh [MAX_BATCH] [MIN_SECONDS]
# The binary is compiled here against $BUILD/libosprey.a (build the `osprey` target first).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN="$BUILD/bench_sampling"
cc -O3 -march=native -std=c17 -D_GNU_SOURCE -Iinclude -Isrc bench/sampling.c "$BUILD/libosprey.a" \
    $(pkg-config --libs libpcre2-8 libxxhash 2>/dev/null || pkg-config --libs libpcre2-8) -fopenmp -lpthread -lm -o "$BIN"
echo "commit $(git rev-parse --short HEAD), $(date -u +%F), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load $(cut -d' ' -f1-3 /proc/loadavg)"
OMP_NUM_THREADS=1 "$BIN" "$@"
