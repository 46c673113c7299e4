/* Build information (see include/osprey/version.h): the compile definitions CMakeLists.txt gives this file, the
 * generated commit header, and strings built once from them. */
#include "osprey/version.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__has_include)
#if __has_include("osprey_commit.h")
#include "osprey_commit.h" /* OSPREY_GIT_COMMIT, generated at build time (cmake/git_commit.cmake) */
#endif
#endif
#ifndef OSPREY_GIT_COMMIT
#define OSPREY_GIT_COMMIT "unknown"
#endif
#ifndef OSPREY_VERSION
#define OSPREY_VERSION "unknown"
#endif
#ifndef OSPREY_BUILD_TYPE
#define OSPREY_BUILD_TYPE "unknown"
#endif
#ifndef OSPREY_C_FLAGS
#define OSPREY_C_FLAGS "unknown"
#endif
#ifndef OSPREY_BUILD_OPTIONS
#define OSPREY_BUILD_OPTIONS "unknown"
#endif
#ifndef OSPREY_CUDA_ARCH
#define OSPREY_CUDA_ARCH "unknown"
#endif
#ifndef OSPREY_CUDA_COMPILER
#define OSPREY_CUDA_COMPILER "unknown"
#endif
#ifdef __clang__
#define OSP_COMPILER "clang " __clang_version__
#else
#define OSP_COMPILER "gcc " __VERSION__
#endif

const char *osp_version_string(void) { return OSPREY_VERSION; }
const char *osp_version_commit(void) { return OSPREY_GIT_COMMIT; }

bool osp_build_has_cuda(void) {
#ifdef OSPREY_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

static char g_line[512];
static char *g_json;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build_strings(void) {
    const bool cuda = osp_build_has_cuda();
    if (cuda)
        snprintf(g_line, sizeof g_line, "osprey %s (commit %s, %s, CUDA on (%s, %s), %s)", OSPREY_VERSION,
                 OSPREY_GIT_COMMIT, OSPREY_BUILD_TYPE, OSPREY_CUDA_ARCH, OSPREY_CUDA_COMPILER, OSP_COMPILER);
    else
        snprintf(g_line, sizeof g_line, "osprey %s (commit %s, %s, CUDA off, %s)", OSPREY_VERSION, OSPREY_GIT_COMMIT,
                 OSPREY_BUILD_TYPE, OSP_COMPILER);
    json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:s?, s:s?, s:s, s:s, s:s}", "version", OSPREY_VERSION, "commit",
                          OSPREY_GIT_COMMIT, "build_type", OSPREY_BUILD_TYPE, "cuda", cuda, "cuda_arch",
                          cuda ? OSPREY_CUDA_ARCH : NULL, "cuda_compiler", cuda ? OSPREY_CUDA_COMPILER : NULL,
                          "compiler", OSP_COMPILER, "c_flags", OSPREY_C_FLAGS, "options", OSPREY_BUILD_OPTIONS);
    g_json = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
}

const char *osp_version_line(void) {
    pthread_once(&g_once, build_strings);
    return g_line;
}

const char *osp_build_info_json(void) {
    pthread_once(&g_once, build_strings);
    /* out of memory at the first call: still valid JSON with the two facts that need no allocation */
    return g_json ? g_json : "{\"version\":\"" OSPREY_VERSION "\",\"commit\":\"" OSPREY_GIT_COMMIT "\"}";
}
