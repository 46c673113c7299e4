/* libFuzzer target for the tool-call and reasoning parsers (tools/server/toolcall.c): arbitrary bytes
 * as a model's reply. The first byte picks the tool parser (hermes, llama3_json, mistral, none), the
 * forced choices (required, named) and the reasoning parser; the rest is the text. Whatever the text,
 * nothing may crash or leak, and what comes out must hold OpenAI's shapes: every call is {"id": str,
 * "type": "function", "function": {"name": str, "arguments": str}}, content is NULL or non-blank, the
 * streaming content prefix is within the text, and the <think> split of every prefix only grows (a
 * streamed delta is never taken back) and ends at the whole text's split. Seeds:
 * tests/fuzz/corpus/toolcall/. */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

static void check_result(const srv_tool_result *r) {
    if (r->content) {
        bool blank = true;
        for (const char *p = r->content; *p; p++) blank &= isspace((unsigned char)*p) != 0;
        if (blank) abort();
    }
    if (!r->calls) return;
    if (!json_is_array(r->calls) || json_array_size(r->calls) == 0) abort();
    size_t i;
    const json_t *c;
    json_array_foreach(r->calls, i, c) {
        const json_t *f = json_object_get(c, "function");
        if (!json_is_string(json_object_get(c, "id")) || strcmp(json_string_value(json_object_get(c, "type")), "function") ||
            !json_is_string(json_object_get(f, "name")) || !json_is_string(json_object_get(f, "arguments")))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const uint8_t sel = data[0];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    srv_tool_result r;
    switch (sel & 7) {
    case 0: case 1: case 2: case 3: {
        const srv_tool_parser p = (srv_tool_parser)((sel & 3) == 0 ? SRV_TOOL_PARSER_NONE : (sel & 3));
        if (srv_tool_parse(p, text, len, 42, &r)) abort();
        check_result(&r);
        srv_tool_result_free(&r);
        if (srv_tool_content_prefix(p, text, len) > len) abort();
        break;
    }
    case 4: case 5:
        if (srv_tool_parse_forced(SRV_TOOL_CHOICE_REQUIRED, NULL, text, len, 42, &r)) abort();
        check_result(&r);
        srv_tool_result_free(&r);
        break;
    default:
        if (srv_tool_parse_forced(SRV_TOOL_CHOICE_NAMED, "f", text, len, 42, &r)) abort();
        /* named: always its one call, unless the text is not UTF-8 (jansson refuses the string) */
        if (r.calls) check_result(&r);
        srv_tool_result_free(&r);
        break;
    }
    /* the reasoning split, whole and streamed */
    const srv_reasoning_parser rp = (srv_reasoning_parser)((sel >> 3) % 3);
    srv_span rs, cs, fr, fc;
    srv_reasoning_split(rp, text, len, true, &fr, &fc);
    if (fr.off + fr.len > len || fc.off + fc.len > len) abort();
    if (len <= 1024) {
        size_t r_prev = 0, c_prev = 0;
        for (size_t k = 0; k <= len; k++) {
            srv_reasoning_split(rp, text, k, k == len, &rs, &cs);
            if (rs.off + rs.len > k || cs.off + cs.len > k || rs.len < r_prev || cs.len < c_prev) abort();
            r_prev = rs.len;
            c_prev = cs.len;
        }
        if (rs.len != fr.len || cs.len != fc.len || (rs.len && rs.off != fr.off) || (cs.len && cs.off != fc.off)) abort();
    }
    return 0;
}
