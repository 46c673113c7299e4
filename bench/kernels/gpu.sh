#!/usr/bin/env bash
# The proving ground on the GPU machine, in one device call: every definition through the gate and
# the timing for the CUDA backend (its default kernels) and for the older attention versions
# (cuda:attention/v1: mma.sync, cuda:attention/v0: CUDA cores), the markdown table on stdout, the JSON
# report and the selection table it implies (--make-table) under $OUT; then the
# gate alone under compute-sanitizer memcheck on a sample (two hidden workloads a definition, one
# input each: the children are followed). Run after scripts/gpu-test.sh unpacked the binaries into
# /tmp/osprey-gpu/gpu (same warm machine). SEED fixes the hidden workloads (default: the clock).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
G=/tmp/osprey-gpu/gpu
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
O=$G/bin/osprey
[ -x "$O" ] || { echo "bench/kernels/gpu.sh: no $O: run scripts/gpu-test.sh first (on this warm machine)"; exit 1; }
dir=${OUT:-/tmp}
seed=${SEED:-$(date +%s)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | sed 's/^/gpu: /'
rc=0
$O bench-kernels --solution cuda --solution cuda:attention/v1 --solution cuda:attention/v0 --seed "$seed" --hidden 14 \
    --min-time 0.1 --timeout 300 --markdown --out "$dir/kbench_cuda.json" || rc=1
# the runtime selection table this report implies (per op kind, head_dim and KV dtype)
$O bench-kernels --make-table "$dir/kbench_cuda.json" -o "$dir/kernel_table.json" && cat "$dir/kernel_table.json"
if command -v compute-sanitizer >/dev/null; then
    compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
        $O bench-kernels --solution cuda --gate-only --seed "$seed" --hidden 2 --seeds 1 --timeout 600 \
        > "$dir/kbench_memcheck.txt" 2>&1 || rc=1
    tail -3 "$dir/kbench_memcheck.txt"
fi
exit $rc
