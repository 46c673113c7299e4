/* Build information of this osprey build, kept in ONE place so that every surface that shows it agrees:
 * `osprey --version` (tools/osprey), `osprey serve`'s GET /version, the "version" of its /v1/models
 * entries and its start-up log line all read these functions and nothing else.
 *
 * Where the values come from (CMakeLists.txt: compile definitions of src/core/version.c only):
 *   version     project(osprey VERSION x.y.z)                       -> OSPREY_VERSION
 *   commit      `git rev-parse --short=12 HEAD` [+ "-dirty"], or "unknown" outside a git tree, from
 *               generated/osprey_commit.h (cmake/git_commit.cmake, refreshed at every build)
 *   build type  CMAKE_BUILD_TYPE                                     -> OSPREY_BUILD_TYPE
 *   C flags     CMAKE_C_FLAGS + the build type's flags               -> OSPREY_C_FLAGS
 *   options     the CMake options: "CUDA=ON NATIVE=ON SANITIZE=OFF WERROR=ON"  -> OSPREY_BUILD_OPTIONS
 *   CUDA        whether the CUDA backend is compiled in (OSPREY_HAVE_CUDA), its target and nvcc version
 * A build outside CMake (no definitions) still compiles: the values read "unknown".
 *
 * All functions are thread-safe, never fail and return pointers to static storage that lives as long as
 * the process (do not free them). Include it as "osprey/version.h"; the definitions are in
 * src/core/version.c, part of the osprey library. */
#ifndef OSPREY_VERSION_H
#define OSPREY_VERSION_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The release version, "MAJOR.MINOR.PATCH" (e.g. "0.1.0"). */
const char *osp_version_string(void);

/* The source commit: 12 lowercase hex digits, "-dirty" appended when the tree had uncommitted changes
 * at build time; "unknown" when not built from a git tree. */
const char *osp_version_commit(void);

/* True when the CUDA backend is compiled into this build (it may still find no device at run time). */
bool osp_build_has_cuda(void);

/* One human-readable line, no trailing newline, what `osprey --version` prints, e.g.
 * "osprey 0.1.0 (commit 0123456789ab, Release, CUDA on (sm_90a, nvcc 12.4), gcc 12.2.0)". */
const char *osp_version_line(void);

/* The same facts as one compact JSON object (what GET /version returns), keys:
 *   "version" (string), "commit" (string), "build_type" (string), "cuda" (bool),
 *   "cuda_arch" (string or null), "cuda_compiler" (string or null), "compiler" (string),
 *   "c_flags" (string), "options" (string, the CMake options as above).
 * Valid UTF-8 JSON; keys may be added later, never removed or retyped. */
const char *osp_build_info_json(void);

#ifdef __cplusplus
}
#endif

#endif
