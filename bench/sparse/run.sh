#!/usr/bin/env bash
# On the GPU machine, from bench/sparse/pack.sh's .carry/sparse.tar.xz (nothing built here; unpacked
# into /tmp/osprey-sparse, which later calls on the warm machine reuse without carrying it again):
#   run.sh [test]   the block-sparse decode kernel's and Quest's tests (default; programmatic dependent
#                   launch on; 3 K/V stages), then sparse_decode_bench (issue 15's timings)
#   run.sh sanitize compute-sanitizer memcheck and racecheck on the test's OSPREY_TEST_SANITIZER_SUBSET cases
#   run.sh bench2   sparse_decode_bench with 3 K/V stages (OSPREY_SPARSE_STAGES=3)
#   run.sh dsa      the DSA lightning indexer's test (test_gpu_dsa, then with programmatic dependent launch)
#                   and `sparse_decode_bench dsa` (indexer + sparse attention vs dense at 128k, batch 1 and 8;
#                   again with PDL), then `sparse_decode_bench tokens`
#   run.sh dsa-sanitize  compute-sanitizer memcheck and racecheck on test_gpu_dsa's small cases
# (split so each fits one 10-minute device call). One line a step, the bench's table, a summary; full
# output in $OUT/sparse.log when OUT is set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
G=/tmp/osprey-sparse
if [ -f .carry/sparse.tar.xz ]; then rm -rf $G && mkdir -p $G && xz -dc .carry/sparse.tar.xz | tar -C $G -xf -; fi
[ -x $G/bin/test_gpu_sparse ] || { echo "sparse run: carry .carry/sparse.tar.xz (bench/sparse/pack.sh)"; exit 1; }
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} OMP_WAIT_POLICY=passive
LOG=${OUT:-/tmp}/sparse.log
: >"$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
fails=0
step() { # name, command...
    local name=$1 rc
    shift
    echo "==== $name" >>"$LOG"
    timeout -k 5 "${TEST_TIMEOUT:-400}" "$@" >>"$LOG" 2>&1
    rc=$?
    case $rc in 0) r=ok ;; 77) r="skipped (no device)" ;; *) r="FAILED ($rc)"; fails=$((fails + 1)) ;; esac
    printf '%-48s %s\n' "$name" "$r"
}
what=${1:-test}
if [ "$what" = test ]; then
    step test_gpu_sparse $G/bin/test_gpu_sparse
    [ $fails = 0 ] || { echo "---- test_gpu_sparse output (tail):"; tail -60 "$LOG"; }
    step "test_gpu_sparse (OSPREY_CUDA_PDL=1)" env OSPREY_CUDA_PDL=1 $G/bin/test_gpu_sparse
    step "test_gpu_sparse (OSPREY_SPARSE_STAGES=3)" env OSPREY_SPARSE_STAGES=3 $G/bin/test_gpu_sparse
    echo "==== sparse_decode_bench" | tee -a "$LOG"
    $G/bin/sparse_decode_bench all 2>&1 | tee -a "$LOG" | grep -v '^json '
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "sparse_decode_bench FAILED"; fails=$((fails + 1)); }
elif [ "$what" = sanitize ]; then
    command -v compute-sanitizer >/dev/null || { echo "sparse run: no compute-sanitizer"; exit 1; }
    step "memcheck test_gpu_sparse (subset)" env OSPREY_TEST_SANITIZER_SUBSET=1 compute-sanitizer --tool memcheck --error-exitcode 9 $G/bin/test_gpu_sparse
    step "racecheck test_gpu_sparse (subset)" env OSPREY_TEST_SANITIZER_SUBSET=1 compute-sanitizer --tool racecheck --error-exitcode 9 $G/bin/test_gpu_sparse
    [ $fails = 0 ] || { echo "---- sanitizer output (tail):"; tail -40 "$LOG"; }
elif [ "$what" = bench2 ]; then
    echo "==== sparse_decode_bench (OSPREY_SPARSE_STAGES=3)" | tee -a "$LOG"
    OSPREY_SPARSE_STAGES=3 $G/bin/sparse_decode_bench all 2>&1 | tee -a "$LOG" | grep -v '^json '
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "sparse_decode_bench FAILED"; fails=$((fails + 1)); }
elif [ "$what" = dsa ]; then
    [ -x $G/bin/test_gpu_dsa ] || { echo "sparse run: no test_gpu_dsa in the tarball (bench/sparse/pack.sh)"; exit 1; }
    step test_gpu_dsa $G/bin/test_gpu_dsa
    [ $fails = 0 ] || { echo "---- test_gpu_dsa output (tail):"; tail -80 "$LOG"; }
    step "test_gpu_dsa (OSPREY_CUDA_PDL=1)" env OSPREY_CUDA_PDL=1 $G/bin/test_gpu_dsa
    grep -E '^test_gpu_dsa: top-k|FAIL|DIFFERS|e2e:|PASSED|^  (random 64x128 bs16|3 distinct keys) +t ' "$LOG" | head -80
    echo "==== sparse_decode_bench dsa" | tee -a "$LOG"
    $G/bin/sparse_decode_bench dsa 2>&1 | tee -a "$LOG" | grep -v '^json '
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "sparse_decode_bench FAILED"; fails=$((fails + 1)); }
    echo "==== sparse_decode_bench dsa (OSPREY_CUDA_PDL=1)" | tee -a "$LOG"
    OSPREY_CUDA_PDL=1 $G/bin/sparse_decode_bench dsa 2>&1 | tee -a "$LOG" | grep -v '^json '
    echo "==== sparse_decode_bench tokens (the sparse kernel on a host-built table)" | tee -a "$LOG"
    $G/bin/sparse_decode_bench tokens 2>&1 | tee -a "$LOG" | grep -v '^json '
elif [ "$what" = dsa-sanitize ]; then
    command -v compute-sanitizer >/dev/null || { echo "sparse run: no compute-sanitizer"; exit 1; }
    step "memcheck test_gpu_dsa (subset)" env OSPREY_TEST_SANITIZER_SUBSET=1 compute-sanitizer --tool memcheck --error-exitcode 9 $G/bin/test_gpu_dsa
    step "racecheck test_gpu_dsa (subset)" env OSPREY_TEST_SANITIZER_SUBSET=1 compute-sanitizer --tool racecheck --error-exitcode 9 $G/bin/test_gpu_dsa
    [ $fails = 0 ] || { echo "---- sanitizer output (tail):"; tail -40 "$LOG"; }
else
    echo "sparse run: test, sanitize, bench2, dsa or dsa-sanitize"; exit 2
fi
echo "sparse run: $fails failed (log: $LOG)"
exit $((fails > 0))
