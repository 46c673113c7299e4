/* The step timeline's writer (src/engine/timeline.h) on made-up steps: the file is one JSON array with
 * the track names, five host phases a step and the device spans given; the idle figure counts only pairs
 * of consecutive decode-only steps with device spans, as (next forward start - previous device end) +
 * (sampler start - forward end) over the period between the two ends; an unwritable path is an I/O
 * error. The engine's use of it (real steps, on the CPU and the GPU) is test_engine's
 * test_step_timeline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/timeline.h"

/* step k at 10 ms intervals: host phases of 1 ms each from 10 k ms; device forward [10 k + 1, 10 k + 7] ms,
 * sampler [10 k + 8, 10 k + 9] ms: 2 ms idle before the forward, 1 ms between forward and sampler */
static osp_timeline_step make_step(int k, bool decode) {
    osp_timeline_step s = {.step = k, .rows = 4, .tokens = decode ? 4 : 100, .decode_only = decode};
    const double b = 0.010 * k;
    for (int i = 0; i <= OSP_TL_PHASES; i++) s.host[i] = b + 0.001 * i;
    s.dev.run[0] = b + 0.001, s.dev.run[1] = b + 0.007;
    s.dev.sample[0] = b + 0.008, s.dev.sample[1] = b + 0.009;
    return s;
}

static void test_writer_and_summary(void **state) {
    (void)state;
    char path[] = "/tmp/osprey_tlXXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    osp_timeline *t = NULL;
    assert_int_equal(osp_timeline_open(path, true, NULL, 0, &t), OSP_OK);
    char line[512];
    osp_timeline_summary(t, line, sizeof line);
    assert_non_null(strstr(line, "no consecutive decode steps"));
    /* a prefill step first (not paired), then 4 decode steps: 3 pairs */
    for (int k = 0; k < 5; k++) {
        const osp_timeline_step s = make_step(k, k > 0);
        osp_timeline_add(t, &s);
    }
    osp_timeline_summary(t, line, sizeof line);
    assert_non_null(strstr(line, "5 steps"));
    assert_non_null(strstr(line, "3 consecutive decode steps"));
    assert_non_null(strstr(line, "period 10.000 ms"));
    assert_non_null(strstr(line, "device busy 7.000 ms"));
    assert_non_null(strstr(line, "idle 30.0%"));
    assert_non_null(strstr(line, "2.000 ms before the forward, 1.000 ms between"));
    /* a step without device spans (the CPU) ends the run of pairs */
    osp_timeline_step cpu = make_step(5, true);
    cpu.dev.run[0] = cpu.dev.run[1] = cpu.dev.sample[0] = cpu.dev.sample[1] = -1.0;
    osp_timeline_add(t, &cpu);
    const osp_timeline_step s6 = make_step(6, true);
    osp_timeline_add(t, &s6);
    osp_timeline_summary(t, line, sizeof line);
    assert_non_null(strstr(line, "3 consecutive decode steps"));
    assert_int_equal(osp_timeline_close(t), OSP_OK);

    json_error_t je;
    json_t *a = json_load_file(path, 0, &je);
    remove(path);
    assert_non_null(a);
    size_t meta = 0, host = 0, dev = 0;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *ev = json_array_get(a, i);
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        if (!strcmp(ph, "M")) meta++;
        else if (json_integer_value(json_object_get(ev, "tid")) == 1) host++;
        else dev++;
    }
    json_decref(a);
    assert_int_equal(meta, 3);
    assert_int_equal(host, 7 * OSP_TL_PHASES);
    assert_int_equal(dev, 6 * 2); /* the CPU step has none */
}

static void test_open_error(void **state) {
    (void)state;
    osp_timeline *t = (osp_timeline *)1;
    assert_int_equal(osp_timeline_open("/nonexistent-dir/t.json", false, NULL, 0, &t), OSP_ERR_IO);
    assert_null(t);
    assert_int_equal(osp_timeline_close(NULL), OSP_OK);
    /* a file the run reads (the model) is refused, untouched; another name for it too */
    char path[] = "/tmp/osprey_tl_keepXXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "GGUF", 4), 4);
    close(fd);
    char link[64];
    snprintf(link, sizeof link, "%s.lnk", path);
    assert_int_equal(symlink(path, link), 0);
    const char *keep[2] = {NULL, path};
    t = (osp_timeline *)1;
    assert_int_equal(osp_timeline_open(link, false, keep, 2, &t), OSP_ERR_INVALID_ARG);
    assert_null(t);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 4);
    remove(link);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_and_summary),
        cmocka_unit_test(test_open_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
