#!/usr/bin/env bash
# The proving ground on the GPU machine, in one device call: every definition through the gate and
# the timing for the CUDA backend (its default kernels) and for the older attention versions
# (cuda:attention/v1: mma.sync, cuda:attention/v0: CUDA cores), the markdown table on stdout (each
# timed workload's fraction of its binding ceiling: the copy bandwidth "bw" or the bf16 cuBLASLt GEMM
# rate "gemm", both measured in the same run; then a per-definition summary), the JSON report and the
# selection table it implies (--make-table) under $OUT; then the gate alone under compute-sanitizer
# memcheck on a sample (the listed workloads but the big ones, two hidden a definition, one input
# each: the children are followed), and under racecheck on the attention definitions only (their two
# hidden workloads, no listed ones; the default kernels and v1). The timed run includes the big listed
# workloads (8B prefill and long-decode shapes, one input each; their fp64 references run on every
# host core); its times are the device's (CUDA events around each op). Run after scripts/gpu-test.sh
# unpacked the binaries into /tmp/osprey-gpu/gpu (same warm machine). SEED fixes the hidden workloads (default: the clock).
# Each sanitizer stage is cut off after SAN_LIMIT seconds (default 200: the whole script stays within
# one 10-minute device call); a cut-off stage fails the run and says so.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
G=/tmp/osprey-gpu/gpu
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
O=$G/bin/osprey
[ -x "$O" ] || { echo "bench/kernels/gpu.sh: no $O: run scripts/gpu-test.sh first (on this warm machine)"; exit 1; }
dir=${OUT:-/tmp}
seed=${SEED:-$(date +%s)}
lim=${SAN_LIMIT:-200}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | sed 's/^/gpu: /'
rc=0
stage() { echo "# stage $1: $(( SECONDS - t0 )) s"; }
t0=$SECONDS
$O bench-kernels --solution cuda --solution cuda:attention/v1 --solution cuda:attention/v0 --seed "$seed" --hidden 14 \
    --min-time 0.05 --timeout 300 --markdown --out "$dir/kbench_cuda.json" || rc=1
stage "timed run"
# the runtime selection table this report implies (per op kind, head_dim and KV dtype)
$O bench-kernels --make-table "$dir/kbench_cuda.json" -o "$dir/kernel_table.json" && cat "$dir/kernel_table.json"
# a sanitizer stage: its output in $dir/$1, the tail printed; fails rc on errors or when cut off
san() {
    local out=$1 tool=$2
    shift 2
    t0=$SECONDS
    timeout "$lim" compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 9 "$@" > "$dir/$out" 2>&1
    local r=$?
    tail -3 "$dir/$out"
    if [ $r = 124 ]; then echo "# $tool: cut off after $lim s (incomplete: raise SAN_LIMIT)"; rc=1
    elif [ $r != 0 ]; then echo "# $tool: exit $r (9: the tool found errors; 1: a gate failed)"; rc=1; fi
    stage "$tool"
}
if command -v compute-sanitizer >/dev/null; then
    san kbench_memcheck.txt memcheck \
        $O bench-kernels --solution cuda --gate-only --no-big --seed "$seed" --hidden 2 --seeds 1 --timeout 600
    san kbench_racecheck.txt racecheck \
        $O bench-kernels --solution cuda --solution cuda:attention/v1 --op attention --no-listed --gate-only \
        --seed "$seed" --hidden 2 --seeds 1 --timeout 600
else
    echo "# no compute-sanitizer: the memcheck and racecheck samples did not run"
fi
exit $rc
