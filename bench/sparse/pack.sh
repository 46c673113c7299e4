#!/usr/bin/env bash
# Stages issue 15's GPU binaries for one device call (bench/sparse/run.sh there): test_gpu_sparse,
# test_gpu_dsa and sparse_decode_bench, stripped, with libcmocka (the GPU machine has the CUDA runtime, not cmocka), into
# .carry/sparse.tar.xz (git-ignored; ~5 MB, so the call fits 64 MiB with the working tree; the full
# scripts/gpu-pack.sh tarball with every GPU test no longer does beside a model half).
# Then, on the device: `bash bench/sparse/run.sh` carrying .carry/sparse.tar.xz; then, same warm machine,
# `bash bench/sparse/run.sh sanitize`, `bash bench/sparse/run.sh bench2`, `bash bench/sparse/run.sh dsa` and
# `bash bench/sparse/run.sh dsa-sanitize` (no carry).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
command -v nvcc >/dev/null || { echo "sparse pack: nvcc not found"; exit 1; }
cmake -S . -B build -G Ninja -DOSPREY_WERROR=ON -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON >/dev/null
cmake --build build -j "${JOBS:-2}" --target test_gpu_sparse test_gpu_dsa sparse_decode_bench
rm -rf .carry/sparse-stage && mkdir -p .carry/sparse-stage/bin .carry/sparse-stage/lib
cp build/tests/test_gpu_sparse build/tests/test_gpu_dsa build/bin/sparse_decode_bench .carry/sparse-stage/bin/
strip .carry/sparse-stage/bin/*
cp -L /usr/lib/x86_64-linux-gnu/libcmocka.so.0 .carry/sparse-stage/lib/
tar -C .carry/sparse-stage -cf - bin lib | xz -T2 -6 > .carry/sparse.tar.xz
rm -rf .carry/sparse-stage
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.carry/' "$exclude" 2>/dev/null || echo '/.carry/' >> "$exclude"
ls -la .carry/sparse.tar.xz
