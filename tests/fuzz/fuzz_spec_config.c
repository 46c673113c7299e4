/* libFuzzer target for the --speculative-config parser (osprey/spec.h, src/spec/config.c): vLLM's
 * speculative_config JSON (ngram, draft_model, quantspec).
 *
 * Input: the bytes are the JSON text (cut at 4,095 bytes, NUL-terminated; an embedded NUL ends it
 * early). An accepted config must pass osp_spec_config_check, hold a method it names, and serialized
 * back to JSON (jansson) parse to the same config; a rejected one must say why and leave the output
 * alone. A crash, a sanitizer report or a silent rejection is a bug. Seeds: tests/fuzz/corpus/spec_config/. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "osprey/spec.h"
#include "osprey/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char text[4096];
    const size_t n = size < sizeof text - 1 ? size : sizeof text - 1;
    memcpy(text, data, n);
    text[n] = 0;
    static osp_spec_config sentinel, c, back;
    memset(&sentinel, 0x5a, sizeof sentinel);
    c = sentinel;
    if (osp_spec_config_parse(text, &c) != OSP_OK) {
        if (!osp_last_error()[0] || memcmp(&c, &sentinel, sizeof c)) abort();
        return 0;
    }
    if (osp_spec_config_check(&c) != OSP_OK || !osp_spec_method_name(c.method)) abort();
    if (c.method == OSP_SPEC_NONE) return 0; /* empty input */
    if (c.method == OSP_SPEC_DRAFT_MODEL && (!c.model[0] || !memchr(c.model, 0, sizeof c.model))) abort();
    if ((c.method == OSP_SPEC_NGRAM || c.method == OSP_SPEC_QUANTSPEC) && c.model[0]) abort();
    json_t *o = c.method == OSP_SPEC_NGRAM
                    ? json_pack("{s:s, s:i, s:i, s:i}", "method", "ngram", "num_speculative_tokens",
                                (json_int_t)c.num_speculative_tokens, "prompt_lookup_min", (json_int_t)c.prompt_lookup_min,
                                "prompt_lookup_max", (json_int_t)c.prompt_lookup_max)
                    : c.method == OSP_SPEC_QUANTSPEC
                    ? json_pack("{s:s, s:i}", "method", "quantspec", "num_speculative_tokens",
                                (json_int_t)c.num_speculative_tokens)
                    : json_pack("{s:s, s:s, s:i}", "method", "draft_model", "model", c.model, "num_speculative_tokens",
                                (json_int_t)c.num_speculative_tokens);
    if (!o) abort();
    char *canon = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!canon) abort();
    back = sentinel;
    if (osp_spec_config_parse(canon, &back) != OSP_OK) abort();
    free(canon);
    if (back.method != c.method || back.num_speculative_tokens != c.num_speculative_tokens ||
        back.prompt_lookup_min != c.prompt_lookup_min || back.prompt_lookup_max != c.prompt_lookup_max ||
        strcmp(back.model, c.model))
        abort();
    return 0;
}
