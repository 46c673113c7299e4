/* libFuzzer target for the --kv-events-config parser (vLLM's KVEventsConfig JSON, src/kv/kv_events.c).
 *
 * Input: the bytes as the config text (NUL-terminated copy). A parse either succeeds with every field
 * in range (non-empty NUL-terminated endpoint, buffer_steps >= 1, hwm >= 0, max_queue_size >= 1, a
 * publisher only when events are on or asked for) or fails with a message and leaves the output
 * untouched. A crash, a sanitizer report, a silent rejection or a changed output on error is a bug.
 * Seeds: tests/fuzz/corpus/kv_events_config/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "osprey/kv_events.h"
#include "osprey/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    osp_kv_events_config c, before;
    memset(&c, 0x5a, sizeof c);
    before = c;
    const osp_status s = osp_kv_events_config_parse(text, &c);
    if (s != OSP_OK) {
        if (!osp_last_error()[0] || memcmp(&c, &before, sizeof c) != 0) abort();
    } else {
        if (!memchr(c.endpoint, 0, sizeof c.endpoint) || !c.endpoint[0]) abort();
        if (!memchr(c.replay_endpoint, 0, sizeof c.replay_endpoint) || !memchr(c.topic, 0, sizeof c.topic)) abort();
        if (c.buffer_steps < 1 || c.hwm < 0 || c.max_queue_size < 1) abort();
    }
    free(text);
    return 0;
}
