/* Golden test for the chat-template interpreter: every template in
 * $OSPREY_SHARED/testdata/chat-templates, and the .jinja files committed in
 * tests/golden/fixtures/templates (templates the shared set lacks, e.g. Gemma 3's; their fixtures name
 * that "template_dir", relative to $OSPREY_ROOT), rendered for the conversations of
 * tests/golden/fixtures/templates/conversations.json (system and developer messages, multi-turn,
 * unicode, text parts, tools and a tool-call round, each with add_generation_prompt off and on),
 * compared with Python's jinja2 configured as transformers configures it
 * (tests/golden/make_template_fixtures.py writes one <template>.json per template).
 *
 * A case is identical when osprey renders the same text, or fails where jinja2 fails. The test
 * asserts that at least 90% of the cases are identical and that every other case is an osprey error
 * (never a silently different prompt), and prints the counts. A template whose FNV-1a 64 hash no
 * longer matches its fixture fails the test (regenerate the fixtures). Skips (77) without
 * ../shared. */
#include <dirent.h>
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

#include "osprey/chat_template.h"

static const char *g_root, *g_shared;

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

static uint64_t fnv1a64(const char *p, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

/* Prints where two renderings first differ. */
static void show_diff(const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "      first difference at byte %zu\n      want: %.100s\n      got:  %.100s\n", i, want + from,
            got + from);
}

static void golden_templates(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/fixtures/templates/conversations.json", g_root);
    json_error_t err;
    json_t *convs_doc = json_load_file(path, 0, &err);
    assert_non_null(convs_doc);
    json_t *convs = json_object_get(convs_doc, "conversations");
    const int64_t now = json_integer_value(json_object_get(convs_doc, "now"));
    const char *bos = json_string_value(json_object_get(convs_doc, "bos_token"));
    const char *eos = json_string_value(json_object_get(convs_doc, "eos_token"));
    const bool verbose = getenv("OSPREY_TEMPLATE_VERBOSE") != NULL;

    snprintf(path, sizeof path, "%s/testdata/chat-templates", g_shared);
    int total = 0, same_text = 0, same_error = 0, osprey_error = 0, different = 0, templates = 0;
    /* every fixture names one template */
    char fdir[4200];
    snprintf(fdir, sizeof fdir, "%s/tests/golden/fixtures/templates", g_root);
    struct dirent **ents = NULL;
    const int nents = scandir(fdir, &ents, NULL, alphasort);
    assert_true(nents > 0);
    for (int e = 0; e < nents; e++) {
        const char *name = ents[e]->d_name;
        if (!strcmp(name, "conversations.json") || !strstr(name, ".json")) continue;
        char fpath[4800];
        snprintf(fpath, sizeof fpath, "%s/tests/golden/fixtures/templates/%s", g_root, name);
        json_t *fx = json_load_file(fpath, 0, &err);
        assert_non_null(fx);
        const char *tname = json_string_value(json_object_get(fx, "template"));
        const char *tdir = json_string_value(json_object_get(fx, "template_dir")); /* NULL: shared */
        char tpath[4800];
        if (tdir)
            snprintf(tpath, sizeof tpath, "%s/%s/%s", g_root, tdir, tname);
        else
            snprintf(tpath, sizeof tpath, "%s/%s", path, tname);
        size_t tlen = 0;
        char *src = slurp(tpath, &tlen);
        if (!src) fail_msg("%s: template missing (fixture %s)", tpath, name);
        char hash[17];
        snprintf(hash, sizeof hash, "%016llx", (unsigned long long)fnv1a64(src, tlen));
        if (strcmp(hash, json_string_value(json_object_get(fx, "fnv1a64"))))
            fail_msg("%s changed since its fixture was made: run tests/golden/make_template_fixtures.py", tname);
        templates++;
        osp_chat_template *t = NULL;
        osp_status ps = osp_chat_template_parse(src, tlen, &t);
        char parse_err[1024] = "";
        if (ps != OSP_OK) snprintf(parse_err, sizeof parse_err, "%s", osp_last_error());
        json_t *cases = json_object_get(fx, "cases");
        size_t ci;
        json_t *c;
        int t_same = 0, t_total = 0;
        json_array_foreach(cases, ci, c) {
            const char *cname = json_string_value(json_object_get(c, "conv"));
            const bool agp = json_is_true(json_object_get(c, "add_generation_prompt"));
            json_t *conv = NULL, *cv;
            size_t k;
            json_array_foreach(convs, k, cv) if (!strcmp(json_string_value(json_object_get(cv, "name")), cname)) conv = cv;
            assert_non_null(conv);
            char *msgs = json_dumps(json_object_get(conv, "messages"), JSON_COMPACT);
            json_t *tools = json_object_get(conv, "tools");
            char *tools_s = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
            char *out = NULL;
            osp_status rs = ps;
            const char *why = parse_err;
            if (ps == OSP_OK) {
                osp_chat_template_inputs in = {.messages_json = msgs, .tools_json = tools_s, .bos_token = bos,
                                               .eos_token = eos, .add_generation_prompt = agp, .now = now};
                rs = osp_chat_template_render(t, &in, &out, NULL);
                why = osp_last_error();
            }
            json_t *want = json_object_get(c, "output");
            const char *want_s = json_string_value(want);
            total++;
            t_total++;
            if (want_s && rs == OSP_OK && !strcmp(want_s, out)) {
                same_text++;
                t_same++;
            } else if (!want_s && rs != OSP_OK) {
                same_error++;
                t_same++;
            } else if (rs != OSP_OK) {
                osprey_error++;
                fprintf(stderr, "  error     %s / %s%s: %s\n", tname, cname, agp ? " +agp" : "", why);
            } else {
                different++;
                fprintf(stderr, "  DIFFERENT %s / %s%s: %s\n", tname, cname, agp ? " +agp" : "",
                        want_s ? "text differs" : json_string_value(json_object_get(c, "error")));
                if (want_s) show_diff(want_s, out);
            }
            free(out);
            free(msgs);
            free(tools_s);
        }
        if (verbose) fprintf(stderr, "  %-55s %d/%d\n", tname, t_same, t_total);
        osp_chat_template_free(t);
        free(src);
        json_decref(fx);
    }
    for (int e = 0; e < nents; e++) free(ents[e]);
    free(ents);
    json_decref(convs_doc);
    fprintf(stderr,
            "chat templates: %d templates, %d cases: %d identical (%d same text, %d same error), %d osprey errors "
            "where jinja2 renders, %d different\n",
            templates, total, same_text + same_error, same_text, same_error, osprey_error, different);
    assert_true(templates >= 1);
    assert_int_equal(different, 0);
    assert_true((same_text + same_error) * 10 >= total * 9);
}

int main(void) {
    g_root = getenv("OSPREY_ROOT");
    g_shared = getenv("OSPREY_SHARED");
    if (!g_root) g_root = ".";
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/testdata/chat-templates", g_shared ? g_shared : "../shared");
    FILE *f = g_shared ? fopen(probe, "r") : NULL;
    if (!f) {
        fprintf(stderr, "test_chat_templates: %s absent, skipping\n", probe);
        return 77;
    }
    fclose(f);
    const struct CMUnitTest tests[] = {cmocka_unit_test(golden_templates)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
