#!/usr/bin/env bash
# The GPU tests, on the GPU machine, from the binaries scripts/gpu-pack.sh built (nothing is built
# or installed here). `make test-gpu` calls this when .carry/gpu.tar.xz is present.
#   ops    unpack; every CUDA op against its CPU reference (test_gpu_ops, test_gpu_attention,
#          test_gpu_sampler, test_gpu_qmatmul; test_gpu_gemm's batch invariance, cuBLASLt and the skinny kernel; ops, sampler and qmatmul again with OSPREY_CUDA_PDL=1, the
#          sampler under its other launch shapes),
#          then compute-sanitizer memcheck and racecheck over the op tests
#          (RACECHECK=0: memcheck only); test_ops (the backend op tests, when staged) and its memcheck
#   model  join the model halves; SmolLM2 on the GPU vs the CPU (test_gpu_model) and the engine tests
#          on the GPU (test_gpu_engine, test_gpu_engine_sampling, test_gpu_spec_engine, test_gpu_engine_grammar, test_gpu_kv_offload); then test_gpu_model on Gemma 3 270M
#          when all its chunks (.carry/g0 ..) are stashed (not on the tiny random gemma3 fixture:
#          its greedy picks are near-ties, top-1 under bf16 was 97% there; tests/ops covers its kernels)
#   cli    `osprey generate` and `osprey serve` with --device cuda (greedy text vs the CPU's; one
#          completion over HTTP)
#   all    all three (when the whole model is already in models/ or stashed)
#   stash  only keep what this call brought (binaries, a model half, a gemma chunk, the baseline CLI)
#          in /tmp/osprey-gpu for the next
#   ab     bench/gpu/ab.sh: decode tokens/s of the baseline CLI (base/bin/osprey) vs this tree's
#   sparse test_gpu_sparse (also under PDL, 2 K/V stages, memcheck and racecheck on its subset), then
#          bench/sparse/sparse_decode_bench (issue 15)
# The attention kernel follows OSPREY_CUDA_ATTENTION (v0, v1, v2, fold, split; unset: the default), so
# `OSPREY_CUDA_ATTENTION=v1 bash scripts/gpu-test.sh model` runs the model and engine tests under v1.
# Prints one line per test and a summary; exits non-zero if any failed. Logs under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what=${1:-all}
# The device machine keeps /tmp while warm (30 s after a call) but not the repository copy: what one
# call brings (binaries, a model half) is stashed there for the next.
STASH=/tmp/osprey-gpu
G=$STASH/gpu
LOG=${OUT:-/tmp}/gpu-test.log
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p $STASH
for h in m0 m1; do [ -f .carry/$h/model.part ] && cp .carry/$h/model.part $STASH/$h.part; done
[ -f .carry/m1/model.sha256 ] && cp .carry/m1/model.sha256 $STASH/model.sha256
for d in .carry/g[0-9]*; do # Gemma 3 270M chunks (GEMMA=1 scripts/gpu-pack.sh), one a call
    [ -f "$d/gemma.part" ] || continue
    cp "$d/gemma.part" "$STASH/${d#.carry/}.part"
    cp "$d/gemma.sha256" "$d/gemma.chunks" $STASH/
done
if [ -f .carry/gpu.tar.xz ]; then
    rm -rf $G && mkdir -p $G && xz -dc .carry/gpu.tar.xz | tar -C $G -xf - || { echo "gpu-test: cannot unpack .carry/gpu.tar.xz"; exit 1; }
fi
# the baseline CLI (bench/gpu/ab.sh's A): in the tarball under base/, or in its own .carry/base/
if [ -d $G/base ]; then rm -rf $STASH/base && mv $G/base $STASH/base; fi
# the libcurl-gnutls fallback (gpu-pack.sh: .carry/curl/), kept for the calls after this one
if [ -f .carry/curl/curl.tar.xz ]; then
    rm -rf $STASH/lib/curl
    xz -dc .carry/curl/curl.tar.xz | tar -C $STASH -xf - || { echo "gpu-test: cannot unpack .carry/curl/curl.tar.xz"; exit 1; }
fi
if [ -f .carry/base/base.tar.xz ]; then
    rm -rf $STASH/base
    xz -dc .carry/base/base.tar.xz | tar -C $STASH -xf - || { echo "gpu-test: cannot unpack .carry/base/base.tar.xz"; exit 1; }
fi
[ -x $G/bin/osprey ] || { echo "gpu-test: no binaries: carry .carry/gpu.tar.xz (scripts/gpu-pack.sh)"; exit 1; }
[ "$what" = stash ] && { ls -la $STASH $STASH/base/bin 2>/dev/null; exit 0; }
[ "$what" = ab ] && { bash bench/gpu/ab.sh; exit $?; }
if [ ! -f $MODEL ] && [ -f $STASH/model.gguf ]; then mkdir -p models && ln -s $STASH/model.gguf $MODEL; fi
# bin/osprey links libcurl-gnutls (the router): the machine's own when it has one, else the carried copy
CURL_LIB=
if ! ldconfig -p 2>/dev/null | grep -q 'libcurl-gnutls\.so\.4'; then
    if [ -d $STASH/lib/curl ]; then CURL_LIB=$STASH/lib/curl
    else echo "gpu-test: warning: no libcurl-gnutls.so.4 here and none carried (.carry/curl from gpu-pack.sh): bin/osprey cannot start"; fi
fi
export LD_LIBRARY_PATH=$G/lib${CURL_LIB:+:$CURL_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OSPREY_ROOT=$PWD OSPREY_MODEL=$PWD/$MODEL OSPREY_BIN=$G/bin/osprey OMP_WAIT_POLICY=passive
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
fails=0
results=()
run() { # name, command...
    local name=$1 t0 rc
    shift
    t0=$(date +%s%N)
    timeout -k 5 "${TEST_TIMEOUT:-400}" "$@" >>"$LOG" 2>&1 # a hung kernel fails its test, not the call
    rc=$?
    local dt
    dt=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
    case $rc in 0) r=ok ;; 77) r=skipped ;; 124 | 137) r="TIMED OUT (${TEST_TIMEOUT:-400} s)"; fails=$((fails + 1)) ;; *) r="FAILED ($rc)"; fails=$((fails + 1)) ;; esac
    results+=("$(printf '%-44s %8s s  %s' "$name" "$dt" "$r")")
    echo "---- $name: $r" >>"$LOG"
}
: >"$LOG"
if [ "$what" = sparse ]; then # issue 15: the block-sparse decode kernel, Quest on the GPU, then their bench
    run test_gpu_sparse $G/bin/test_gpu_sparse
    run "test_gpu_sparse (OSPREY_CUDA_PDL=1)" env OSPREY_CUDA_PDL=1 $G/bin/test_gpu_sparse
    run "test_gpu_sparse (2 K/V stages)" env OSPREY_SPARSE_STAGES=2 $G/bin/test_gpu_sparse
    if command -v compute-sanitizer >/dev/null; then
        run "memcheck test_gpu_sparse" env OSPREY_TEST_SANITIZER_SUBSET=1 compute-sanitizer --tool memcheck --error-exitcode 9 $G/bin/test_gpu_sparse
        [ "${RACECHECK:-1}" = 1 ] && run "racecheck test_gpu_sparse" env OSPREY_TEST_SANITIZER_SUBSET=1 compute-sanitizer --tool racecheck --error-exitcode 9 $G/bin/test_gpu_sparse
    fi
    echo "---- sparse_decode_bench" >>"$LOG"
    $G/bin/sparse_decode_bench all 2>&1 | tee -a "$LOG" | grep -v '^json '
    [ "${PIPESTATUS[0]}" = 0 ] || { results+=("sparse_decode_bench FAILED"); fails=$((fails + 1)); }
fi
if [ "$what" = ops ] || [ "$what" = all ]; then
    for t in test_gpu_ops test_gpu_attention test_gpu_sampler test_gpu_qmatmul; do run "$t" $G/bin/$t; done
    # programmatic dependent launch is on only where the backend's matrices are quantized: the kernels
    # again with it forced on (every kernel waits for its predecessor before touching memory)
    for t in test_gpu_ops test_gpu_qmatmul test_gpu_sampler; do run "$t (OSPREY_CUDA_PDL=1)" env OSPREY_CUDA_PDL=1 $G/bin/$t; done
    # the sampler's other launch shapes (sample.cu: select and finish apart, one slice a CTA; and slices
    # grouped from 256 CTAs on; the same bits as the default by design)
    run "test_gpu_sampler (unfused, one slice a CTA)" env OSPREY_SAMPLE_FUSED=0 OSPREY_SAMPLE_GRID_CTAS=0 $G/bin/test_gpu_sampler
    run "test_gpu_sampler (slices grouped from 256 CTAs)" env OSPREY_SAMPLE_GRID_CTAS=256 $G/bin/test_gpu_sampler
    run "test_gpu_sampler (U in global memory)" env OSPREY_SAMPLE_SMEM_U=0 $G/bin/test_gpu_sampler
    # the opt-in shapes (sample.cu): the finisher's rounds on one warp for small U, each next slice
    # preloaded; and the defaults before 2026-12-06 (small grids in two launches, 8-bit list levels, plain
    # atomics in top-k's histograms)
    run "test_gpu_sampler (warp finisher)" env OSPREY_SAMPLE_WARP_VIEW=3072 $G/bin/test_gpu_sampler
    run "test_gpu_sampler (preload)" env OSPREY_SAMPLE_PRELOAD=1 $G/bin/test_gpu_sampler
    run "test_gpu_sampler (two launches, 8-bit lists, plain histograms)" env OSPREY_SAMPLE_ONE_LAUNCH=0 OSPREY_SAMPLE_LIST_BITS=8 OSPREY_SAMPLE_HIST_AGG=0 $G/bin/test_gpu_sampler
    # one pass (the scan builds the lists): in one launch, in the scan kernel with one and several slices a CTA
    run "test_gpu_sampler (one pass)" env OSPREY_SAMPLE_ONE_PASS=1 $G/bin/test_gpu_sampler
    run "test_gpu_sampler (one pass, two launches, grouped slices)" env OSPREY_SAMPLE_ONE_PASS=1 OSPREY_SAMPLE_ONE_LAUNCH=0 OSPREY_SAMPLE_GRID_CTAS=256 $G/bin/test_gpu_sampler
    # tau lists (top-k + top-p rows cut at one row-wide threshold): one launch, then the scan kernel with
    # grouped slices, then with their views on warp 0 instead of the block
    run "test_gpu_sampler (tau lists)" env OSPREY_SAMPLE_TAU=1 $G/bin/test_gpu_sampler
    run "test_gpu_sampler (tau lists, two launches, grouped slices)" env OSPREY_SAMPLE_TAU=1 OSPREY_SAMPLE_ONE_LAUNCH=0 OSPREY_SAMPLE_GRID_CTAS=256 $G/bin/test_gpu_sampler
    run "test_gpu_sampler (tau lists on warp 0, unfused)" env OSPREY_SAMPLE_TAU=1 OSPREY_SAMPLE_WARP_VIEW=512 OSPREY_SAMPLE_FUSED=0 $G/bin/test_gpu_sampler
    run "test_gpu_sampler (tau lists, tau in every CTA, two launches)" env OSPREY_SAMPLE_TAU=1 OSPREY_SAMPLE_TAU_PRE=0 OSPREY_SAMPLE_ONE_LAUNCH=0 $G/bin/test_gpu_sampler
    # the bf16 GEMM's batch invariance: cuBLASLt (split-K by the T = 1 rule, the default), then the
    # skinny kernel for T <= 64 (opt-in until this passes) in its tile shapes and under PDL
    run test_gpu_gemm $G/bin/test_gpu_gemm
    run "test_gpu_gemm (OSPREY_CUDA_GEMM_SKINNY=64)" env OSPREY_CUDA_GEMM_SKINNY=64 $G/bin/test_gpu_gemm
    run "test_gpu_gemm (skinny, W=2, KC=128)" env OSPREY_CUDA_GEMM_SKINNY=64 OSPREY_CUDA_SKINNY_W=2 OSPREY_CUDA_SKINNY_KC=128 $G/bin/test_gpu_gemm
    run "test_gpu_gemm (skinny, W=4, 2 stages)" env OSPREY_CUDA_GEMM_SKINNY=64 OSPREY_CUDA_SKINNY_W=4 OSPREY_CUDA_SKINNY_STAGES=2 $G/bin/test_gpu_gemm
    run "test_gpu_gemm (skinny, OSPREY_CUDA_PDL=1)" env OSPREY_CUDA_GEMM_SKINNY=64 OSPREY_CUDA_PDL=1 $G/bin/test_gpu_gemm
    [ -x $G/bin/test_ops ] && run test_ops $G/bin/test_ops
    if command -v compute-sanitizer >/dev/null; then
        for t in test_gpu_ops test_gpu_attention test_gpu_sampler; do
            run "memcheck $t" compute-sanitizer --tool memcheck --error-exitcode 9 $G/bin/$t
            # racecheck is slow (attention's full set ran past 250 s on an H200); RACECHECK=0 skips it
            # (test_gpu_attention under racecheck: its sanitizer subset, OSPREY_TEST_SANITIZER_SUBSET)
            [ "${RACECHECK:-1}" = 1 ] && run "racecheck $t" env OSPREY_TEST_SANITIZER_SUBSET=1 compute-sanitizer --tool racecheck --error-exitcode 9 $G/bin/$t
        done
        [ -x $G/bin/test_ops ] && run "memcheck test_ops" compute-sanitizer --tool memcheck --error-exitcode 9 $G/bin/test_ops
    else
        results+=("compute-sanitizer: not found, memcheck/racecheck not run")
    fi
fi
if [ "$what" = model ] || [ "$what" = all ]; then
    if [ ! -f $MODEL ] && [ -f $STASH/m0.part ] && [ -f $STASH/m1.part ]; then
        cat $STASH/m0.part $STASH/m1.part > $STASH/model.gguf
        if [ -f $STASH/model.sha256 ] && [ "$(sha256sum $STASH/model.gguf | cut -d' ' -f1)" != "$(cat $STASH/model.sha256)" ]; then
            echo "gpu-test: the joined model does not match its sha256"
            results+=("model halves: joined file does not match its sha256   FAILED"); fails=$((fails + 1))
        else
            mkdir -p models && ln -sf $STASH/model.gguf $MODEL
        fi
    fi
    run test_gpu_model $G/bin/test_gpu_model
    run test_gpu_engine $G/bin/test_gpu_engine
    run test_gpu_engine_quant $G/bin/test_gpu_engine_quant
    run test_gpu_engine_sampling $G/bin/test_gpu_engine_sampling
    run test_gpu_spec_engine $G/bin/test_gpu_spec_engine
    run test_gpu_engine_grammar $G/bin/test_gpu_engine_grammar
    run test_gpu_kv_offload $G/bin/test_gpu_kv_offload
    # Gemma 3 270M Q4_K_M, when every chunk of it is stashed: joined, checked against its sha256
    gn=$(cat $STASH/gemma.chunks 2>/dev/null || echo 0)
    missing=""
    for ((i = 0; i < gn; i++)); do [ -f $STASH/g$i.part ] || missing+=" g$i"; done
    if [ "$gn" -eq 0 ]; then
        results+=("$(printf '%-44s %8s    %s' "test_gpu_model (gemma3)" - "not run (no .carry/g* chunks stashed)")")
    elif [ -n "$missing" ]; then
        results+=("$(printf '%-44s %8s    %s' "test_gpu_model (gemma3)" - "not run (chunks not stashed:$missing)")")
    else
        for ((i = 0; i < gn; i++)); do cat $STASH/g$i.part; done > $STASH/gemma.gguf
        if [ "$(sha256sum $STASH/gemma.gguf | cut -d' ' -f1)" != "$(cat $STASH/gemma.sha256)" ]; then
            echo "gpu-test: the joined gemma model does not match its sha256"
            results+=("gemma chunks: joined file does not match its sha256   FAILED"); fails=$((fails + 1))
        else
            [ -f models/gemma-3-270m-q4_k_m.gguf ] || { mkdir -p models && ln -sf $STASH/gemma.gguf models/gemma-3-270m-q4_k_m.gguf; }
            run "test_gpu_model (gemma3)" env OSPREY_MODEL=$STASH/gemma.gguf $G/bin/test_gpu_model
        fi
    fi
fi
if [ "$what" = cli ] || [ "$what" = all ]; then
    # the CLI on the GPU: greedy text of `generate --device cuda` next to the CPU's, and one completion
    # through `serve --device cuda` (HTTP on loopback, python3's urllib as the client)
    if [ -f $MODEL ]; then
        P="The three primary colors are"
        run "generate --device cpu --exact" bash -c "$G/bin/osprey generate -m $MODEL --device cpu --exact -p '$P' -n 32 --temp 0 > $STASH/gen-cpu.txt"
        run "generate --device cuda" bash -c "$G/bin/osprey generate -m $MODEL --device cuda -p '$P' -n 32 --temp 0 > $STASH/gen-gpu.txt"
        { echo "cpu: $(tr '\n' ' ' < $STASH/gen-cpu.txt)"; echo "gpu: $(tr '\n' ' ' < $STASH/gen-gpu.txt)"; } >> "$LOG"
        run "generate: same greedy text" cmp -s $STASH/gen-cpu.txt $STASH/gen-gpu.txt
        $G/bin/osprey serve -m $MODEL --device cuda --port 8123 > $STASH/serve.log 2>&1 &
        spid=$!
        run "serve --device cuda: /v1/completions" python3 - <<'PY'
import json, time, urllib.request
for _ in range(120):
    try:
        urllib.request.urlopen("http://127.0.0.1:8123/health", timeout=1); break
    except Exception: time.sleep(0.5)
req = urllib.request.Request("http://127.0.0.1:8123/v1/completions", method="POST",
    headers={"Content-Type": "application/json"},
    data=json.dumps({"prompt": "The three primary colors are", "max_tokens": 24, "temperature": 0, "n": 2}).encode())
r = json.load(urllib.request.urlopen(req, timeout=60))
print("serve:", r["choices"][0]["text"].replace("\n", " "), "| usage:", r["usage"])
assert r["choices"][0]["text"] and r["choices"][0]["text"] == r["choices"][1]["text"]
PY
        kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
        grep -E "cuda:|loading" $STASH/serve.log | head -3 >> "$LOG"
    fi
fi
grep -E "^(cpu: |gpu: |serve: |cuda: |teacher forcing|top-1 differs|greedy|prompt [0-9]|gpu agreement|preemption|\[  (FAILED|PASSED) )|skipped|Error|error:|^---- test_gpu_model \(" "$LOG" | head -60
echo "==== gpu tests ($what)"
printf '%s\n' "${results[@]}"
[ $fails -eq 0 ]
