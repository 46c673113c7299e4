/* libFuzzer target for the --sparse-attention parser (osprey/sparse.h, src/sparse/config.c).
 *
 * Input: the bytes are the value (cut at 127 bytes, NUL-terminated; an embedded NUL ends it early).
 * An accepted value must pass osp_sparse_config_check, and its canonical spelling must parse back to
 * the same config; a rejected one must say why and leave the output alone. A crash, a sanitizer
 * report or a silent rejection is a bug. Seeds: tests/fuzz/corpus/sparse_config/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "osprey/sparse.h"
#include "osprey/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char value[128];
    const size_t n = size < sizeof value - 1 ? size : sizeof value - 1;
    memcpy(value, data, n);
    value[n] = 0;
    const osp_sparse_config sentinel = {.method = (osp_sparse_method)7, .topk_pages = -5, .recent_pages = -6,
                                        .sink_pages = -7};
    osp_sparse_config c = sentinel;
    if (osp_sparse_config_parse(value, &c) != OSP_OK) {
        if (!osp_last_error()[0] || memcmp(&c, &sentinel, sizeof c)) abort();
        return 0;
    }
    if (osp_sparse_config_check(&c) != OSP_OK) abort();
    if (c.method == OSP_SPARSE_TOPK && (c.topk_pages < 1 || c.recent_pages + c.sink_pages > c.topk_pages)) abort();
    char canon[96];
    osp_sparse_config_format(&c, canon, sizeof canon);
    osp_sparse_config back = sentinel;
    if (osp_sparse_config_parse(canon, &back) != OSP_OK || memcmp(&back, &c, sizeof c)) abort();
    return 0;
}
