#!/usr/bin/env bash
# The portable (non-SIMD) path on aarch64 (issue 21): cross-compiles osprey with Debian's
# gcc-aarch64-linux-gnu (cmake/aarch64-linux-gnu.cmake; CUDA off, no -march=native, -Werror) into
# build-aarch64/ and runs the unit tests (ctest label `unit`) and the golden tests (label `golden`,
# none of which needs Python) under qemu-user, printing one line per test and a summary.
#
# Needs, once, as root (Debian multiarch; scripts/setup.sh is not changed by this):
#   dpkg --add-architecture arm64 && apt-get update
#   apt-get install -y gcc-aarch64-linux-gnu qemu-user libc6:arm64 libc6-dev:arm64 libpcre2-dev:arm64 \
#       libxxhash-dev:arm64 libjansson-dev:arm64 libcmocka-dev:arm64 libmicrohttpd-dev:arm64 \
#       libzmq3-dev:arm64 libmsgpack-dev:arm64
#
# Left out under qemu (they build, and run on a real Arm machine): test_core_ipc and test_kv_events,
# whose ZeroMQ context never starts under qemu-user 7.2 (a four-line zmq_ctx_new + zmq_bind program
# hangs the same way there), and the integration (Python/server) and kbench suites.
# Usage: scripts/test-aarch64.sh [extra ctest args]; BUILD_DIR (build-aarch64), JOBS (2), TEST_TIMEOUT
# (seconds per test, 1500) override. Exits non-zero if the build or any test fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
B=${BUILD_DIR:-build-aarch64}
J=${JOBS:-2}
EXCLUDE='^(test_core_ipc|test_kv_events)$'

for t in aarch64-linux-gnu-gcc qemu-aarch64; do
    command -v $t >/dev/null || { echo "test-aarch64: $t not found (see the apt-get line at the top of this script)" >&2; exit 1; }
done
start=$(date +%s)
cmake -S . -B "$B" -G Ninja --toolchain cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
    -DOSPREY_CUDA=OFF -DOSPREY_NATIVE=OFF -DOSPREY_WERROR=ON >/dev/null
cmake --build "$B" -j"$J"
built=$(date +%s)
echo "test-aarch64: built in $((built - start)) s"

set +e
ctest --test-dir "$B" -L 'unit|golden' -E "$EXCLUDE" -j"$J" --timeout "${TEST_TIMEOUT:-1500}" --output-on-failure "$@" \
    | tee "$B/test-aarch64.log"
rc=${PIPESTATUS[0]}
set -e
echo "test-aarch64: left out under qemu: test_core_ipc test_kv_events (ZeroMQ does not start under qemu-user)"
echo "test-aarch64: tests took $(($(date +%s) - built)) s; ctest exit $rc (log: $B/test-aarch64.log)"
exit "$rc"
