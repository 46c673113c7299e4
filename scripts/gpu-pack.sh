#!/usr/bin/env bash
# Builds here what the GPU machine runs, for `make test-gpu` and bench/gpu/run.sh there (it has no
# package registry, no libmicrohttpd and no cmocka; it has the CUDA driver and runtime, cuBLASLt,
# PCRE2, xxHash, jansson and libgomp). Stages under .carry/ (git-ignored through .git/info/exclude):
#   .carry/gpu.tar.xz   bin/osprey, bin/offline_throughput, the GPU test binaries (and test_ops when built), lib/ (libcmocka,
#                       libmicrohttpd; libzmq, msgpack-c and libzmq's own dependencies; libedit), base/bin/osprey: the baseline CLI for bench/gpu/ab.sh (a CUDA
#                       build of bb1ad02, BASE_BIN, default /work/base-src/build-cuda/bin/osprey;
#                       skipped with a warning when absent; in .carry/base/base.tar.xz instead when the
#                       tarball with it would not fit one call beside a model half)
#   .carry/curl/        when the CLI links libcurl-gnutls (the router's client): curl.tar.xz, lib/curl/ with
#                       libcurl-gnutls.so.4 and every library it pulls in but glibc's (~5 MB), a fallback
#                       that gpu-test.sh uses only where the machine has no libcurl-gnutls.so.4 of its own
#                       (Ubuntu 24.04's libcurl3t64-gnutls has it); carried with call 2, which runs bin/osprey
#   .carry/m0/, m1/     the default model in two halves (one device call carries at most 64 MiB, the
#                       working tree included: the first call brings m0, the second, while the machine
#                       is still warm, m1)
#   .carry/g0/ .. g4/   with GEMMA=1 only: Gemma 3 270M (GEMMA_MODEL, default
#                       models/gemma-3-270m-q4_k_m.gguf) in chunks of at most 60 MB, one call each, every
#                       chunk dir with the whole file's sha256 and the number of chunks
# Then, on the device (one command each; see README "On the GPU"):
#   call 1 (carry .carry/gpu.tar.xz .carry/m0): bash scripts/gpu-test.sh ops    (or: stash)
#   call 2 (carry .carry/m1 [.carry/curl]), within 30 s: bash scripts/gpu-test.sh model
#   (with .carry/base/: call 2 carries it too; GEMMA=1: call 2 runs `stash`, then one call per chunk,
#   .carry/g0 .. g3 with `stash`, the last, .carry/g4, with `model`)
#   same machine, no carry:                     bash scripts/gpu-test.sh ab     (bench/gpu/ab.sh)
# (the device keeps /tmp between warm calls, not the repository copy: gpu-test.sh stashes there)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
GEMMA_MODEL=${GEMMA_MODEL:-models/gemma-3-270m-q4_k_m.gguf}
BASE_BIN=${BASE_BIN:-/work/base-src/build-cuda/bin/osprey}
LIMIT=$((64 * 1024 * 1024))  # one device call: working tree + carried paths
CHUNK_MAX=$((60 * 1000 * 1000)) # one gemma chunk
command -v nvcc >/dev/null || { echo "gpu-pack: nvcc not found (the CUDA toolkit builds the GPU code)"; exit 1; }
cmake -S . -B build -G Ninja -DOSPREY_WERROR=ON -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON >/dev/null
cmake --build build -j "${JOBS:-2}"
rm -rf .carry/stage .carry/gpu.tar.xz .carry/m0 .carry/m1 .carry/base .carry/curl
mkdir -p .carry/stage/bin .carry/stage/lib .carry/m0 .carry/m1
cp build/bin/osprey build/bin/attn_bench build/bin/qmatmul_bench build/bin/gemm_bench build/bin/sample_bench build/bin/sparse_decode_bench build/bin/offline_throughput build/tests/test_gpu_* .carry/stage/bin/
if [ -f build/tests/test_ops ]; then cp build/tests/test_ops .carry/stage/bin/; else echo "gpu-pack: no build/tests/test_ops (not staged)"; fi
if [ -f "$BASE_BIN" ]; then
    mkdir -p .carry/stage/base/bin
    cp "$BASE_BIN" .carry/stage/base/bin/osprey
    strip .carry/stage/base/bin/osprey
else
    echo "gpu-pack: warning: no baseline CLI at $BASE_BIN: base/bin/osprey not staged (bench/gpu/ab.sh needs it)"
fi
strip .carry/stage/bin/*
# libzmq/msgpack-c and what libzmq pulls in (libsodium, OpenPGM, NORM, libbsd, Kerberos' GSSAPI):
# copied only when the CLI links them, so a tarball stays small until the IPC code is used
for lib in libcmocka.so.0 libmicrohttpd.so.12; do cp -L "/usr/lib/x86_64-linux-gnu/$lib" .carry/stage/lib/; done
if ldd .carry/stage/bin/osprey | grep 'libzmq\|libmsgpackc' >/dev/null; then
    for lib in libzmq.so.5 libmsgpackc.so.2 libsodium.so.23 libpgm-5.3.so.0 libnorm.so.1 libbsd.so.0 \
               libmd.so.0 libgssapi_krb5.so.2 libkrb5.so.3 libk5crypto.so.3 libkrb5support.so.0 \
               libcom_err.so.2 libkeyutils.so.1; do
        if [ -e "/usr/lib/x86_64-linux-gnu/$lib" ]; then cp -L "/usr/lib/x86_64-linux-gnu/$lib" .carry/stage/lib/; fi
    done
fi
# libedit (osprey chat's line editing) and what it pulls in beyond Ubuntu's base system (libbsd, libmd;
# libtinfo is there): Ubuntu 24.04's CUDA images have no libedit2
if ldd .carry/stage/bin/osprey | grep 'libedit' >/dev/null; then # not grep -q: its early exit fails ldd under pipefail
    for lib in libedit.so.2 libbsd.so.0 libmd.so.0; do
        if [ -e "/usr/lib/x86_64-linux-gnu/$lib" ]; then cp -L "/usr/lib/x86_64-linux-gnu/$lib" .carry/stage/lib/; fi
    done
fi
# libcurl-gnutls and its dependencies (GnuTLS, nettle, nghttp2, libssh2, LDAP, Kerberos, ...), found by
# ldd, as the fallback described above; glibc's own libraries stay the machine's
if ldd .carry/stage/bin/osprey | grep 'libcurl-gnutls' >/dev/null; then
    curl_so=$(ldd .carry/stage/bin/osprey | awk '$1 ~ /^libcurl-gnutls/ {print $3}')
    mkdir -p .carry/curlstage/lib/curl .carry/curl
    cp -L "$curl_so" .carry/curlstage/lib/curl/
    ldd "$curl_so" | awk '$3 ~ /^\// {print $3}' | while read -r dep; do
        case "$(basename "$dep")" in
            libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | ld-linux*) ;;
            *) cp -L "$dep" .carry/curlstage/lib/curl/ ;;
        esac
    done
    tar -C .carry/curlstage -cf - lib | xz -T2 -6 > .carry/curl/curl.tar.xz
    rm -rf .carry/curlstage
fi
parts=(bin lib)
if [ -d .carry/stage/base ]; then parts+=(base); fi
tar -C .carry/stage -cf - "${parts[@]}" | xz -T2 -6 > .carry/gpu.tar.xz
if [ -f "$MODEL" ]; then
    half=$(( ($(stat -c %s "$MODEL") + 1) / 2 ))
    head -c "$half" "$MODEL" > .carry/m0/model.part
    tail -c +"$((half + 1))" "$MODEL" > .carry/m1/model.part
    sha256sum "$MODEL" | cut -d' ' -f1 > .carry/m1/model.sha256
fi
if [ "${GEMMA:-0}" = 1 ]; then
    [ -f "$GEMMA_MODEL" ] || { echo "gpu-pack: GEMMA=1 but no $GEMMA_MODEL (scripts/fetch-model.sh gemma3)"; exit 1; }
    rm -rf .carry/g[0-9] .carry/g[0-9][0-9] .carry/gsplit
    gsize=$(stat -c %s "$GEMMA_MODEL")
    n=$(( (gsize + CHUNK_MAX - 1) / CHUNK_MAX ))
    mkdir -p .carry/gsplit
    split -n "$n" -d -a 2 "$GEMMA_MODEL" .carry/gsplit/part
    gsha=$(sha256sum "$GEMMA_MODEL" | cut -d' ' -f1)
    for ((i = 0; i < n; i++)); do
        mkdir -p ".carry/g$i"
        mv ".carry/gsplit/part$(printf %02d "$i")" ".carry/g$i/gemma.part"
        echo "$gsha" > ".carry/g$i/gemma.sha256"
        echo "$n" > ".carry/g$i/gemma.chunks"
    done
    rmdir .carry/gsplit
fi
# (in a git worktree .git is a file: the exclude list lives in the common git directory)
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.carry/' "$exclude" 2>/dev/null || echo '/.carry/' >> "$exclude"

# what one call carries: the working tree (tracked and untracked-not-ignored files) plus the carried paths
bytes() { { du -sb "$@" 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}'; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
tree=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null || true; } |
    awk '{s += $1} END {print s + 0}')
tar_b=$(bytes .carry/gpu.tar.xz)
half_b=$(bytes .carry/m0)
m1_b=$(bytes .carry/m1)
if [ "$m1_b" -gt "$half_b" ]; then half_b=$m1_b; fi
if [ -d .carry/stage/base ] && [ $((tree + tar_b + half_b)) -gt "$LIMIT" ]; then
    echo "gpu-pack: tarball + model half + working tree = $(mib $((tree + tar_b + half_b))) > 64 MiB: the baseline CLI goes to .carry/base/"
    tar -C .carry/stage -cf - bin lib | xz -T2 -6 > .carry/gpu.tar.xz
    mkdir -p .carry/base
    tar -C .carry/stage -cf - base | xz -T2 -6 > .carry/base/base.tar.xz
    tar_b=$(bytes .carry/gpu.tar.xz)
fi
rm -rf .carry/stage
{ du -sb .carry/gpu.tar.xz .carry/base .carry/curl .carry/m0 .carry/m1 .carry/g[0-9]* 2>/dev/null || true; } |
    awk '{printf "%-20s %11d bytes  %7.1f MiB\n", $2, $1, $1 / 1048576}'
echo "working tree (travels with every call): $tree bytes, $(mib "$tree")"
call() { # label, carried paths...
    local label=$1 b
    shift
    b=$((tree + $(bytes "$@")))
    printf 'call %-28s %s + tree = %s  %s\n' "$label" "$*" "$(mib "$b")" "$([ "$b" -le "$LIMIT" ] && echo ok || echo 'OVER 64 MiB')"
}
call "1 (ops)" .carry/gpu.tar.xz .carry/m0
call2=(.carry/m1)
if [ -d .carry/base ]; then call2+=(.carry/base); fi
if [ -d .carry/curl ]; then call2+=(.carry/curl); fi
call "2 (model)" "${call2[@]}"
for d in .carry/g[0-9]*; do if [ -d "$d" ]; then call "(gemma ${d#.carry/})" "$d"; fi; done
# the biggest call must fit
[ $((tree + tar_b + half_b)) -le "$LIMIT" ] || { echo "gpu-pack: the first call is over 64 MiB"; exit 1; }
