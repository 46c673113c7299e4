/* libFuzzer target for the JSON Schema compiler (src/grammar/json_schema.c).
 *
 * Input: schema text. Either it compiles to GBNF that the grammar parser accepts (or refuses only as
 * left-recursive: a schema that is a $ref cycle with nothing in between), or it fails with
 * OSP_ERR_UNSUPPORTED / OSP_ERR_INVALID_ARG and a "json_schema: ..." message, leaving the output
 * NULL. An accepted grammar gets a matcher and a first step. Seeds: tests/fuzz/corpus/json_schema/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *gbnf = NULL;
    const osp_status st = osp_json_schema_to_gbnf((const char *)data, size, &gbnf);
    if (st != OSP_OK) {
        if ((st != OSP_ERR_UNSUPPORTED && st != OSP_ERR_INVALID_ARG) || gbnf) abort();
        if (strncmp(osp_last_error(), "json_schema: ", 13) != 0) abort();
        return 0;
    }
    osp_grammar *g = NULL;
    const osp_status ps = osp_grammar_parse(gbnf, strlen(gbnf), NULL, &g);
    if (ps != OSP_OK && !(ps == OSP_ERR_FORMAT && strstr(osp_last_error(), "left-recursive"))) abort();
    if (g) {
        osp_grammar_matcher *m;
        if (osp_grammar_matcher_new(g, &m) != OSP_OK) abort();
        (void)osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"{\"", 2);
        osp_grammar_matcher_free(m);
    }
    osp_grammar_free(g);
    free(gbnf);
    return 0;
}
