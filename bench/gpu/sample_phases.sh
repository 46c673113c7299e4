#!/usr/bin/env bash
# Where the GPU sampler's time goes (bench/gpu/sample_phases.c): a profiling build of sample.cu with
# OSPREY_SAMPLE_PHASES, linked ahead of libosprey.a so its sampler replaces the library's.
#   bash bench/gpu/sample_phases.sh build     here, after the CUDA build in build/: writes build/bin/sample_phases
#   bash bench/gpu/sample_phases.sh run       on the device (G: the unpacked binaries, default /tmp/osprey-gpu/gpu;
#                                              the logits file sample_bench wrote, LOGITS_FILE, default /tmp/sample_logits.bin)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
case "${1:-run}" in
build)
    o=build/sample_phases && mkdir -p $o
    cmd=$(python3 -c "
import json
d = json.load(open('build/compile_commands.json'))
print([e['command'] for e in d if e['file'].endswith('src/backend/cuda/sample.cu')][0])")
    cmd=$(echo "$cmd" | sed "s| -o [^ ]*| -o $o/sample.o|; s| -MD -MT [^ ]* -MF [^ ]*||")
    eval "$cmd -DOSPREY_SAMPLE_PHASES"
    cc -O2 -std=c17 -Isrc -Iinclude -c bench/gpu/sample_phases.c -o $o/sample_phases.o
    /usr/local/cuda/bin/nvcc -o build/bin/sample_phases $o/sample_phases.o $o/sample.o build/libosprey.a \
        -L/usr/local/cuda/lib -lcudart -lpcre2-8 -lxxhash -ljansson -lzmq -lmsgpackc -lm -lpthread -ldl
    echo "built build/bin/sample_phases" ;;
run)
    G=${G:-/tmp/osprey-gpu/gpu}
    L=${LOGITS_FILE:-/tmp/sample_logits.bin}
    export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    [ -f "$L" ] || SAMPLE_SETTINGS=1 SAMPLE_BATCHES=1 LOGITS_FILE=$L "$G/bin/sample_bench" 128256 1 > /dev/null
    for b in ${BATCHES:-1 8 128}; do
        for v in "" OSPREY_SAMPLE_HIST_AGG=0 "OSPREY_SAMPLE_ONE_LAUNCH=0 OSPREY_SAMPLE_LIST_BITS=8 OSPREY_SAMPLE_HIST_AGG=0" \
            OSPREY_SAMPLE_PRELOAD=1 OSPREY_SAMPLE_ONE_PASS=1 "OSPREY_SAMPLE_ONE_PASS=1 OSPREY_SAMPLE_PRELOAD=1" \
            OSPREY_SAMPLE_TAU=1 "OSPREY_SAMPLE_TAU=1 OSPREY_SAMPLE_WARP_VIEW=512"; do
            echo "-- ${v:-default}"
            env $v "$G/bin/sample_phases" "$L" 128256 "$b" 50 0.9
        done
    done ;;
esac
