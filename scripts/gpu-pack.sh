#!/usr/bin/env bash
# Builds here what the GPU machine runs, for `make test-gpu` and bench/gpu/run.sh there (it has no
# package registry, no libmicrohttpd and no cmocka; it has the CUDA driver and runtime, cuBLASLt,
# PCRE2, xxHash, jansson and libgomp). Stages under .carry/ (git-ignored through .git/info/exclude):
#   .carry/gpu.tar.xz   bin/osprey, the GPU test binaries, lib/ (libcmocka, libmicrohttpd)
#   .carry/m0/, m1/     the default model in two halves (one device call carries at most 64 MiB:
#                       the first call brings m0, the second, while the machine is still warm, m1)
# Then, on the device (one command each; see README "On the GPU"):
#   call 1 (carry .carry/gpu.tar.xz .carry/m0): bash scripts/gpu-test.sh ops    (or: stash)
#   call 2 (carry .carry/m1), within 30 s:      bash scripts/gpu-test.sh model
# (the device keeps /tmp between warm calls, not the repository copy: gpu-test.sh stashes there)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
command -v nvcc >/dev/null || { echo "gpu-pack: nvcc not found (the CUDA toolkit builds the GPU code)"; exit 1; }
cmake -S . -B build -G Ninja -DOSPREY_WERROR=ON -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON >/dev/null
cmake --build build -j "${JOBS:-2}"
rm -rf .carry/stage .carry/gpu.tar.xz .carry/m0 .carry/m1
mkdir -p .carry/stage/bin .carry/stage/lib .carry/m0 .carry/m1
cp build/bin/osprey build/tests/test_gpu_* .carry/stage/bin/
strip .carry/stage/bin/*
for lib in libcmocka.so.0 libmicrohttpd.so.12; do cp -L "/usr/lib/x86_64-linux-gnu/$lib" .carry/stage/lib/; done
tar -C .carry/stage -cf - bin lib | xz -T2 -6 > .carry/gpu.tar.xz
rm -rf .carry/stage
if [ -f "$MODEL" ]; then
    half=$(( ($(stat -c %s "$MODEL") + 1) / 2 ))
    head -c "$half" "$MODEL" > .carry/m0/model.part
    tail -c +"$((half + 1))" "$MODEL" > .carry/m1/model.part
    sha256sum "$MODEL" | cut -d' ' -f1 > .carry/m1/model.sha256
fi
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
du -sh .carry/gpu.tar.xz .carry/m0 .carry/m1
