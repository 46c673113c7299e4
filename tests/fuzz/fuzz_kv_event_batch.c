/* libFuzzer target for the router's KV-event batch decoder (tools/router/kv_index.c: vLLM's
 * EventBatch in msgpack, maps or positional arrays, from a backend's ZeroMQ stream).
 *
 * Input: the bytes as one payload, applied to backend 0 of a two-backend index without sockets. It is
 * accepted or refused; a refused payload changes nothing; backend 1's set never changes; afterwards a
 * clear empties backend 0. A crash, a sanitizer report, a leak or a change on refusal is a bug.
 * Seeds: tests/fuzz/corpus/kv_event_batch/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "kv_index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *eps[2] = {NULL, NULL};
    char why[64];
    rt_kv_index *x = rt_kv_index_start(eps, NULL, 2, why, sizeof why);
    if (!x) return 0;
    const int64_t before = rt_kv_index_size(x, 0);
    if (!rt_kv_index_apply(x, 0, (const char *)data, size) && rt_kv_index_size(x, 0) != before) abort();
    if (rt_kv_index_size(x, 1) != 0 || rt_kv_index_size(x, 0) < 0) abort();
    static const char clear[] = "\x92\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\x91\x91\xb0" "AllBlocksCleared";
    if (!rt_kv_index_apply(x, 0, clear, sizeof clear - 1) || rt_kv_index_size(x, 0) != 0) abort();
    rt_kv_index_stop(x);
    return 0;
}
