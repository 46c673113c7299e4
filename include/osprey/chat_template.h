/* Chat templates: a Jinja-subset interpreter that renders a model's `tokenizer.chat_template`
 * the way transformers' apply_chat_template does.
 *
 * The environment is transformers' (chat_template_utils.py): jinja2's ImmutableSandboxedEnvironment
 * with trim_blocks=True, lstrip_blocks=True and the loopcontrols extension ({% break %},
 * {% continue %}), its {% generation %} tag (renders its body), a `tojson` filter that is
 * json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=False), and the globals
 * raise_exception(msg) and strftime_now(fmt). The variables are messages, tools, documents (None
 * when not given, as transformers passes them), add_generation_prompt, bos_token, eos_token and
 * every key of the extra kwargs object (chat_template_kwargs).
 *
 * Supported: text, {{ }}, {% %} and {# #} with '-'/'+' whitespace control and raw blocks; if/elif/
 * else, for (tuple targets, filtering `if`, else branch, the loop object), set (plain, tuple,
 * namespace attribute, block set with filters), macro (defaults, caller), call blocks, filter
 * blocks; the expression grammar of jinja2 (literals, attribute/subscript/slices, calls, filters,
 * tests, arithmetic, comparisons, `in`, `not in`, `is`, `~`, ternaries); the filters, tests and
 * str/dict methods real templates use (see src/template/builtins.c for the list). What jinja2 would
 * refuse (list.append under the immutable sandbox, unknown filters, undefined attribute chains)
 * fails here too; what osprey does not implement fails with OSP_ERR_UNSUPPORTED naming the construct.
 *
 * Errors name the construct and the template line: "line 12: unknown filter 'from_json'". Status
 * codes: OSP_ERR_FORMAT for syntax errors, OSP_ERR_UNSUPPORTED for constructs osprey does not
 * implement, OSP_ERR_INVALID_ARG for render-time errors (raise_exception, a type error, an undefined
 * value used where jinja2 raises, bad input JSON), OSP_ERR_NOMEM, and OSP_ERR_UNSUPPORTED when a
 * render exceeds its work or memory budget (osp_chat_template_inputs.max_steps / max_memory: a
 * template cannot loop forever or exhaust memory). */
#ifndef OSPREY_CHAT_TEMPLATE_H
#define OSPREY_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct osp_chat_template osp_chat_template;

/* Parses `len` bytes of template source (need not be NUL-terminated). On success *out is owned by
 * the caller (osp_chat_template_free). A parsed template is immutable and may be rendered from
 * several threads at once. */
osp_status osp_chat_template_parse(const char *src, size_t len, osp_chat_template **out);
void osp_chat_template_free(osp_chat_template *t); /* NULL is fine */

typedef struct osp_chat_template_inputs {
    const char *messages_json;  /* JSON array of {role, content, ...}; required */
    const char *tools_json;     /* JSON array or NULL (then `tools` is None) */
    const char *documents_json; /* JSON array or NULL (then `documents` is None) */
    const char *kwargs_json;    /* JSON object of extra variables or NULL; its keys win */
    const char *bos_token;      /* NULL: bos_token is undefined */
    const char *eos_token;      /* NULL: eos_token is undefined */
    int add_generation_prompt;
    int64_t now; /* strftime_now's time, Unix seconds UTC; 0 = the current time */
    /* The render's budgets (0: the defaults, 512 MiB and 50,000,000 steps): bytes the render may
     * allocate (values, scopes, the output) and interpreter steps (nodes evaluated, bytes copied).
     * Past either the render stops with OSP_ERR_UNSUPPORTED, "template exceeds its memory budget
     * (N bytes)" / "template exceeds its work budget (N steps)". A server sets them small for
     * templates that come with requests. */
    size_t max_memory;
    uint64_t max_steps;
} osp_chat_template_inputs;

/* Renders the template. On success *out is a NUL-terminated malloc'd string (free() it) and
 * *out_len its length (out_len may be NULL). */
osp_status osp_chat_template_render(const osp_chat_template *t, const osp_chat_template_inputs *in,
                                    char **out, size_t *out_len);

#ifndef OSP_TEXT_SPAN_DEFINED /* also in tokenizer.h */
#define OSP_TEXT_SPAN_DEFINED
/* A byte range [off, off + len) of a text. */
typedef struct osp_text_span {
    size_t off, len;
} osp_text_span;
#endif

/* A render with provenance: the text, and which of its bytes came from the request's data rather
 * than from the template ("tainted"). Owned by the caller: osp_chat_template_output_free. */
typedef struct osp_chat_template_output {
    char *text; /* NUL-terminated, malloc'd */
    size_t len; /* bytes of text without the NUL */
    /* [n_tainted] byte ranges of text that came from the request: sorted by off, within
     * [0, len), non-empty, non-overlapping and non-adjacent (merged). NULL when n_tainted == 0. */
    osp_text_span *tainted;
    size_t n_tainted;
    /* true when some operation could not keep exact provenance (today: strftime_now with a format
     * string from the request, tojson separators from the request); then `tainted` is incomplete
     * and the caller must not rely on it (the server falls back to the old behaviour: the whole
     * prompt tokenized with special-token parsing, and counts it). */
    bool provenance_lost;
} osp_chat_template_output;

/* Renders as osp_chat_template_render does (the same text, the same errors) and reports the
 * provenance of the output's bytes. Tainted ("user-controlled") inputs: every string (values and
 * object keys) of messages_json (content strings and text parts, roles, names, tool-call names
 * and arguments, tool results, reasoning), tools_json, documents_json and kwargs_json; template
 * literals, bos_token and eos_token are the template's own. The taint follows the bytes through
 * concatenation (`~`, `+`, string repetition), output ({{ }}, set blocks, filter blocks, macros),
 * slicing and indexing, iteration over characters, filters and methods (trim/strip, split,
 * splitlines, replace, upper/lower/title/capitalize, indent, join, reverse, escape, tojson and
 * repr, format, printf-style `format`, first/last, ...): a byte written by the render is tainted
 * exactly when it was copied or derived byte-for-byte from a tainted byte (an escape such as
 * `\n` from a tainted newline is tainted; the quotes tojson adds are not). Values computed from
 * request strings (lengths, comparisons, numbers parsed from them) carry no taint.
 * On success *out is filled (free with osp_chat_template_output_free); on error *out is zeroed.
 * Source: issue 20 ("Chat turns forged through content"); the provenance idea is classic taint
 * tracking (Perl's taint mode) applied to template output. */
osp_status osp_chat_template_render_spans(const osp_chat_template *t, const osp_chat_template_inputs *in,
                                          osp_chat_template_output *out);
void osp_chat_template_output_free(osp_chat_template_output *o); /* NULL and zeroed are fine */

#ifdef __cplusplus
}
#endif
#endif
