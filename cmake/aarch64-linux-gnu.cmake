# Cross toolchain for aarch64 Linux (Debian's gcc-aarch64-linux-gnu, arm64 multiarch -dev packages,
# qemu-user): issue 21's portability check that the scalar (non-SIMD) path builds and passes the unit
# and golden tests on Arm. Used by scripts/test-aarch64.sh; configure with -DOSPREY_CUDA=OFF
# -DOSPREY_NATIVE=OFF (-march=native names the build machine's CPU, which the cross compiler rejects).
# CMAKE_CROSSCOMPILING_EMULATOR makes ctest run every test executable under qemu-aarch64.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(OSPREY_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${OSPREY_CROSS_TRIPLE}-gcc)

# Debian multiarch: the arm64 libraries live in /usr/lib/aarch64-linux-gnu and their headers in
# /usr/include (per-arch parts in /usr/include/aarch64-linux-gnu), which Debian's cross gcc searches
# by default; the toolchain's own libc is under /usr/aarch64-linux-gnu. No sysroot re-rooting: the
# library architecture makes find_library look in lib/aarch64-linux-gnu, never the host's x86_64 dir.
set(CMAKE_LIBRARY_ARCHITECTURE ${OSPREY_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)

# pkg-config: the arm64 .pc files only (PKG_CONFIG_LIBDIR replaces the host's default search path).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${OSPREY_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "")
set(PKG_CONFIG_EXECUTABLE pkg-config CACHE FILEPATH "pkg-config (searching the arm64 .pc files)")

# ctest (and add_test commands naming a target) run the aarch64 binaries under qemu-user; -L points
# qemu at the arm64 dynamic loader and libc. Multiarch libraries in /usr/lib/aarch64-linux-gnu are
# found by that loader's default path.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/${OSPREY_CROSS_TRIPLE})
