/* Bounded whole-file reads (src/core/file.h): exact contents and a NUL after them, the size limit
 * enforced at max_bytes exactly, empty files, pipe-like files without a size, and errors that name
 * the file and leave nothing allocated. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/file.h"
#include "osprey/status.h"

static void write_file(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void test_contents_and_limit(void **state) {
    (void)state;
    char path[] = "/tmp/osprey-test-file-XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    /* 10,000 bytes with NULs inside: crosses the reader's first growth steps */
    size_t n = 10000;
    char *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (char)(i * 7 % 251);
    write_file(path, data, n);
    char *buf = (char *)1;
    size_t len = 1;
    assert_int_equal(osp_read_file(path, n, "test", &buf, &len), OSP_OK); /* exactly at the limit */
    assert_int_equal(len, n);
    assert_memory_equal(buf, data, n);
    assert_int_equal(buf[n], '\0');
    free(buf);
    assert_int_equal(osp_read_file(path, n - 1, "test", &buf, &len), OSP_ERR_IO); /* one byte over */
    assert_null(buf);
    assert_int_equal(len, 0);
    assert_non_null(strstr(osp_last_error(), "larger than 9999 bytes"));
    assert_non_null(strstr(osp_last_error(), path));
    write_file(path, "", 0); /* empty: a valid empty string */
    assert_int_equal(osp_read_file(path, 0, NULL, &buf, &len), OSP_OK);
    assert_int_equal(len, 0);
    assert_int_equal(buf[0], '\0');
    free(buf);
    unlink(path);
    free(data);
}

static void test_no_size_and_errors(void **state) {
    (void)state;
    char *buf;
    size_t len;
    /* /proc files report size 0: the reader must not trust stat */
    assert_int_equal(osp_read_file("/proc/self/status", 1 << 20, "proc", &buf, &len), OSP_OK);
    assert_true(len > 0 && strstr(buf, "Name:") == buf);
    assert_int_equal(strlen(buf), len);
    free(buf);
    assert_int_equal(osp_read_file("/nonexistent/x", 100, "scales file", &buf, &len), OSP_ERR_IO);
    assert_null(buf);
    assert_non_null(strstr(osp_last_error(), "cannot open scales file /nonexistent/x"));
    assert_int_equal(osp_read_file("/", 100, "dir", &buf, &len), OSP_ERR_IO); /* a directory: a read error */
    assert_null(buf);
    assert_int_equal(osp_read_file(NULL, 100, "none", &buf, &len), OSP_ERR_IO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contents_and_limit),
        cmocka_unit_test(test_no_size_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
