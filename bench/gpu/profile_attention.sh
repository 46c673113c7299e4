#!/usr/bin/env bash
# ncu on the attention kernels at issue 12's shapes (8B: 32/8 heads, D = 128), one launch each:
# causal prefill of 16k tokens and batch-1 decode at 32k, for v2 (others with KERNELS="v2 v1 v0").
# Sections: SpeedOfLight, MemoryWorkloadAnalysis, Occupancy, WarpStateStats, LaunchStats,
# ComputeWorkloadAnalysis. Reports under $OUT (ncu-*.txt). Run after scripts/gpu-test.sh unpacked the
# binaries into /tmp/osprey-gpu/gpu (same warm machine). ncu locks the SM clock at its base, so its
# durations run longer than attention.sh's.
set -uo pipefail
G=/tmp/osprey-gpu/gpu
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
dir=${OUT:-/tmp}
secs="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis_Tables"
for k in ${KERNELS:-v2}; do
    for c in "prefill 1 16384" "decode 1 32768" "decode 64 8192"; do
        tag="ncu-$k-$(echo "$c" | tr ' ' '-')"
        # skip the warm-up launch; profile the next one (its attention kernel, not the merge)
        ncu --kernel-name regex:'attn_mma_kernel|paged_attention_kernel' --launch-skip 1 --launch-count 1 $secs \
            $G/bin/attn_bench one $c $k > "$dir/$tag.txt" 2>&1
        echo "== $tag"
        grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Stall|Executed Ipc|Shared|Bank" "$dir/$tag.txt" | head -24
    done
done
