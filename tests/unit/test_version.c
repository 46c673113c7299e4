/* Build information (include/osprey/version.h): the one source every surface prints (`osprey
 * --version`, serve's GET /version, /v1/models, the start-up log). Checks that the version is the one
 * CMakeLists.txt's project() declares, that the commit has git's short form (or "unknown"), that
 * the JSON parses and says exactly what the single functions say, that "cuda" follows the build, and
 * that the one-line form names the version, the commit and CUDA on/off. */
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "osprey/version.h"

static bool matches(const char *re, const char *s) {
    regex_t r;
    if (regcomp(&r, re, REG_EXTENDED | REG_NOSUB)) return false;
    const bool ok = regexec(&r, s, 0, NULL, 0) == 0;
    regfree(&r);
    return ok;
}

/* project(osprey VERSION x.y.z ...) of CMakeLists.txt under $OSPREY_ROOT (ctest sets it), or NULL */
static char *cmake_project_version(void) {
    const char *root = getenv("OSPREY_ROOT");
    char path[4096];
    snprintf(path, sizeof path, "%s/CMakeLists.txt", root ? root : ".");
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char line[1024], *out = NULL;
    while (!out && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "project(osprey VERSION ");
        if (!p) continue;
        p += strlen("project(osprey VERSION ");
        const size_t n = strspn(p, "0123456789.");
        out = strndup(p, n);
    }
    fclose(f);
    return out;
}

static void test_version_is_cmake_project_version(void **state) {
    (void)state;
    const char *v = osp_version_string();
    assert_non_null(v);
    assert_true(matches("^[0-9]+\\.[0-9]+\\.[0-9]+$", v));
    char *want = cmake_project_version();
    if (want) assert_string_equal(v, want);
    free(want);
}

static void test_commit_is_head(void **state) {
    (void)state;
    const char *c = osp_version_commit();
    assert_true(!strcmp(c, "unknown") || matches("^[0-9a-f]{12}(-dirty)?$", c));
    /* a build may predate a later commit of the same checkout, so a different HEAD is only noted */
    const char *root = getenv("OSPREY_ROOT");
    char cmd[4200], head[64] = {0};
    snprintf(cmd, sizeof cmd, "git -C '%s' rev-parse --short=12 HEAD 2>/dev/null", root ? root : ".");
    FILE *p = popen(cmd, "r");
    if (p) {
        if (!fgets(head, sizeof head, p)) head[0] = 0;
        pclose(p);
    }
    head[strcspn(head, "\n")] = 0;
    if (strcmp(c, "unknown") && strlen(head) == 12 && strncmp(c, head, 12))
        print_message("note: built at commit %s, HEAD is now %s (rebuild to refresh)\n", c, head);
}

static void test_json_matches_functions(void **state) {
    (void)state;
    const char *s = osp_build_info_json();
    assert_ptr_equal(s, osp_build_info_json()); /* built once */
    json_error_t e;
    json_t *o = json_loads(s, 0, &e);
    assert_non_null(o);
    assert_true(json_is_object(o));
    assert_string_equal(json_string_value(json_object_get(o, "version")), osp_version_string());
    assert_string_equal(json_string_value(json_object_get(o, "commit")), osp_version_commit());
    assert_true(json_is_boolean(json_object_get(o, "cuda")));
    assert_int_equal(json_is_true(json_object_get(o, "cuda")), osp_build_has_cuda());
#ifdef OSPREY_HAVE_CUDA
    assert_true(osp_build_has_cuda());
    assert_true(json_is_string(json_object_get(o, "cuda_arch")));
    assert_true(json_is_string(json_object_get(o, "cuda_compiler")));
#else
    assert_false(osp_build_has_cuda());
    assert_true(json_is_null(json_object_get(o, "cuda_arch")));
#endif
    const char *keys[] = {"build_type", "compiler", "c_flags", "options"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        assert_true(json_is_string(json_object_get(o, keys[i])));
        assert_string_not_equal(json_string_value(json_object_get(o, keys[i])), "unknown");
    }
    assert_non_null(strstr(json_string_value(json_object_get(o, "options")),
                           osp_build_has_cuda() ? "CUDA=ON" : "CUDA=OFF"));
    json_decref(o);
}

static void test_line(void **state) {
    (void)state;
    const char *l = osp_version_line();
    char want[256];
    snprintf(want, sizeof want, "osprey %s (commit %s, ", osp_version_string(), osp_version_commit());
    assert_true(!strncmp(l, want, strlen(want)));
    assert_non_null(strstr(l, osp_build_has_cuda() ? "CUDA on" : "CUDA off"));
    assert_null(strchr(l, '\n'));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_is_cmake_project_version),
        cmocka_unit_test(test_commit_is_head),
        cmocka_unit_test(test_json_matches_functions),
        cmocka_unit_test(test_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
