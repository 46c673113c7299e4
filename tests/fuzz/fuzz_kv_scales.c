/* libFuzzer target for the KV cache scales file parser (src/format/kv_scales.c, `--kv-scales FILE`).
 * Any input either parses, and then its size is exactly what its counts need, every scale is finite
 * and in range, and saving it back gives the same bytes; or it is refused with OSP_ERR_FORMAT (or
 * OSP_ERR_NOMEM) and a message, leaving the output zeroed. A crash, a sanitizer report or a silent
 * rejection is a bug. Seeds: tests/fuzz/corpus/kv_scales/. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status_internal.h"
#include "format/kv_scales.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i]) || a[i] < OSP_KVS_MIN_SCALE || a[i] > OSP_KVS_MAX_SCALE) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    osp_kv_scales s;
    const osp_status st = osp_kv_scales_parse(data, size, &s);
    if (st != OSP_OK) {
        if (st != OSP_ERR_FORMAT && st != OSP_ERR_NOMEM) abort();
        if (s.fp8_k || s.fp8_v || s.nvfp4_k || s.nvfp4_v || s.n_layer || !osp_last_error()[0]) abort();
        return 0;
    }
    if (osp_kv_scales_file_bytes(s.n_layer, s.n_head_kv, s.head_dim) != size) abort();
    check(s.fp8_k, (size_t)s.n_layer * s.n_head_kv), check(s.fp8_v, (size_t)s.n_layer * s.n_head_kv);
    check(s.nvfp4_k, s.n_layer), check(s.nvfp4_v, s.n_layer);
    char path[] = "/tmp/fuzz_kvs_XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) {
        close(fd);
        if (osp_kv_scales_save(path, &s) != OSP_OK) abort(); /* a parsed file is always savable */
        FILE *f = fopen(path, "rb");
        uint8_t *back = malloc(size);
        if (!f || !back || fread(back, 1, size, f) != size || memcmp(back, data, size) != 0) abort();
        free(back);
        fclose(f);
        remove(path);
    }
    osp_kv_scales_free(&s);
    return 0;
}
