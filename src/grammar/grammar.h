/* Grammar-constrained decoding: a GBNF grammar, an incremental matcher over it, and token masks.
 *
 * The pieces, in the order a request uses them:
 *
 *   GBNF text ──osp_grammar_parse──▶ osp_grammar (immutable, byte-level rules; share freely)
 *   JSON Schema ──osp_json_schema_to_gbnf──▶ GBNF text (then parse as above)
 *   tokenizer ──osp_token_trie_from_tokenizer──▶ osp_token_trie (immutable; once per tokenizer)
 *   osp_grammar ──osp_grammar_matcher_new──▶ matcher (per sequence; clone for n > 1)
 *   each step: osp_grammar_matcher_fill_mask(matcher, trie, bitset) → allowed tokens;
 *              osp_grammar_matcher_accept_token(matcher, trie, sampled id)
 *
 * The format. The grammar language is llama.cpp's GBNF (grammars/README.md in llama.cpp):
 *   rule      ::= name "::=" alternatives           (one rule per line; '|' may end a line, and
 *                                                    inside ( ) newlines are plain space)
 *   name      [A-Za-z0-9_-]+ ; the start rule is "root" (or the name given to parse)
 *   alternatives: sequences separated by '|'; a sequence may be empty
 *   elements  "literal" (UTF-8; escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH, each a code
 *             point), [class] / [^class] (chars and ranges a-z, same escapes; negation is over all
 *             code points but surrogates), '.' (any code point), name (a rule), ( group )
 *   postfix   * + ? {m} {m,} {m,n} on the element before it (a whole literal repeats, as llama.cpp)
 *   comments  '#' to the end of the line
 * Beyond llama.cpp: '_' in names, and a line that starts with '|' continues the rule above.
 * Not supported (an error): llama.cpp's token references <[id]> and <|token|>.
 * Rejected grammars: undefined or twice-defined rules, a missing start rule, left recursion (a rule
 * that can reach itself before consuming a byte), sizes beyond OSP_GRAMMAR_MAX_ELEMS.
 *
 * The representation. Everything is compiled down to bytes: a literal becomes its UTF-8 bytes, a
 * character class becomes alternatives of UTF-8 byte-range sequences (the classic split of a code
 * point range at encoding-length and continuation-byte boundaries), and repetition becomes helper
 * rules (x* → R ::= x R | ε, x{m,n} → m copies then nested optionals), so the matcher only ever
 * tests one byte against a 256-bit set. Helper rules are named "<rule>_<n>" in messages.
 *
 * The matcher (matcher.c has the details) is a pushdown recognizer over sets of stacks, as
 * llama.cpp's, with three changes: stacks are hash-consed nodes (pos, parent) so equal stacks are
 * one id and a state is a sorted set of top ids; a call in tail position pushes no frame (so x* and
 * right recursion run in constant stack); and states are interned with a lazily filled transition
 * table over byte classes — a DFA built on demand over the pushdown configurations actually met.
 * Masks walk a preorder token trie against that table (one table lookup per trie node, a whole
 * subtree skipped on a dead state) and are cached per state.
 *
 * Threads: osp_grammar and osp_token_trie are immutable after creation and may be shared. A matcher
 * and its clones share one mutable automaton behind a mutex: members of a family may live on different
 * threads (calls on one family run one at a time). */
#ifndef OSP_GRAMMAR_GRAMMAR_H
#define OSP_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/status.h"
#include "osprey/tokenizer.h"

/* Size limit of a compiled grammar (elements over all alternatives, helper rules included): repetition
 * counts multiply, and a small text can ask for gigabytes ("x{100000}{100000}"). */
#define OSP_GRAMMAR_MAX_ELEMS (1 << 20)
/* Largest m or n in {m,n}. */
#define OSP_GRAMMAR_MAX_REPEAT 100000

typedef struct osp_grammar osp_grammar;
typedef struct osp_token_trie osp_token_trie;
typedef struct osp_grammar_matcher osp_grammar_matcher;

/* ---- grammar ------------------------------------------------------------------------------------ */

/* Parses GBNF text src[0..len) (need not be NUL-terminated) with start rule `root` (NULL: "root").
 * On success *out is owned by the caller (osp_grammar_free).
 * Errors: OSP_ERR_FORMAT for a bad grammar, the message "grammar:LINE:COL: what" (1-based; the column
 * counts bytes) naming the first problem; OSP_ERR_INVALID_ARG for NULL arguments; OSP_ERR_NOMEM.
 * *out is left alone on failure. */
osp_status osp_grammar_parse(const char *src, size_t len, const char *root, osp_grammar **out);
void osp_grammar_free(osp_grammar *g); /* NULL is fine */

/* Counts, for tests and logs: rules (helper rules included), elements, distinct byte sets. */
int32_t osp_grammar_n_rules(const osp_grammar *g);
int32_t osp_grammar_n_elems(const osp_grammar *g);
int32_t osp_grammar_n_byte_sets(const osp_grammar *g);

/* Prints the compiled rules (byte level) to a malloc'd string the caller frees, or NULL on NOMEM. */
char *osp_grammar_dump(const osp_grammar *g);

/* ---- token trie --------------------------------------------------------------------------------- */

/* A trie over the byte strings of a vocabulary, laid out in preorder (node, then its subtree, then
 * its next sibling), built once per tokenizer.
 *   n_vocab    ids are [0, n_vocab)
 *   bytes      [n_vocab] pointers, lens [n_vocab]: each token's bytes (copied). A token with len 0
 *              or excluded[id] is never allowed by a mask (control tokens, unused slots).
 *   excluded   [n_vocab] or NULL
 *   eog        [n_eog] ids that end generation: allowed exactly when the grammar is complete
 * On success *out is owned by the caller (osp_token_trie_free). Errors: OSP_ERR_INVALID_ARG,
 * OSP_ERR_NOMEM. */
osp_status osp_token_trie_new(int32_t n_vocab, const uint8_t *const *bytes, const size_t *lens, const bool *excluded,
                              const int32_t *eog, int32_t n_eog, osp_token_trie **out);

/* The same from a tokenizer: the bytes of osp_tokenizer_token_bytes; CONTROL, UNKNOWN, UNUSED and
 * UNDEFINED tokens are excluded (their text is not output text), the EOG set is osp_tokenizer_is_eog.
 * Errors as above. */
osp_status osp_token_trie_from_tokenizer(const osp_tokenizer *t, osp_token_trie **out);
void osp_token_trie_free(osp_token_trie *t); /* NULL is fine */
int32_t osp_token_trie_n_vocab(const osp_token_trie *t);
int32_t osp_token_trie_n_nodes(const osp_token_trie *t);
bool osp_token_trie_is_eog(const osp_token_trie *t, int32_t id);

/* ---- matcher ------------------------------------------------------------------------------------ */

/* A matcher at the start of `g`'s root rule. `g` must outlive the matcher and every clone of it.
 * Errors: OSP_ERR_INVALID_ARG, OSP_ERR_NOMEM, OSP_ERR_UNSUPPORTED (too ambiguous, as below). */
osp_status osp_grammar_matcher_new(const osp_grammar *g, osp_grammar_matcher **out);

/* The same, taking ownership of g: it is freed with the last matcher of the family (the matcher and
 * its clones), so a request can hand its children clones without tracking the grammar. On failure g
 * is freed too. */
osp_status osp_grammar_matcher_new_owning(osp_grammar *g, osp_grammar_matcher **out);

/* A second matcher in the same state, sharing the automaton (cheap: no copy of any table); the two
 * then move independently. For n > 1 and speculative drafts. Errors: OSP_ERR_NOMEM. */
osp_status osp_grammar_matcher_clone(const osp_grammar_matcher *m, osp_grammar_matcher **out);
void osp_grammar_matcher_free(osp_grammar_matcher *m); /* NULL is fine */

/* Feeds bytes data[0..n). All or nothing: when some prefix leaves no way to continue the grammar,
 * returns OSP_ERR_INVALID_ARG (message: the byte offset) and the state is unchanged. A terminated
 * matcher (EOG accepted) rejects everything. Errors also OSP_ERR_NOMEM, and OSP_ERR_UNSUPPORTED when
 * one byte would expand more than 65536 parse stacks (a very ambiguous grammar: stacks are not merged
 * by top; that step is dead from then on, so a later try is OSP_ERR_INVALID_ARG); the state is
 * unchanged then too. */
osp_status osp_grammar_matcher_accept_bytes(osp_grammar_matcher *m, const uint8_t *data, size_t n);

/* Feeds one sampled token: an EOG token is accepted only when the grammar is complete (and then the
 * matcher is terminated); an excluded token never; others as accept_bytes of its bytes.
 * Returns OSP_OK, OSP_ERR_INVALID_ARG (rejected; state unchanged) or OSP_ERR_NOMEM. */
osp_status osp_grammar_matcher_accept_token(osp_grammar_matcher *m, const osp_token_trie *t, int32_t id);

/* True when the bytes so far are a whole sentence of the grammar (EOG would be allowed now). */
bool osp_grammar_matcher_is_complete(const osp_grammar_matcher *m);
/* True once an EOG token was accepted. */
bool osp_grammar_matcher_is_terminated(const osp_grammar_matcher *m);
/* True when some continuation exists besides stopping (some byte is still allowed). */
bool osp_grammar_matcher_can_continue(const osp_grammar_matcher *m);

/* Fills mask [(n_vocab + 31) / 32] words: bit (id & 31) of word id / 32 is set when token id may come
 * next (its bytes keep the grammar alive; EOG ids only when complete). A terminated matcher allows
 * nothing. The trie must come from the tokenizer whose ids are sampled. Allocates only to grow the
 * shared automaton and its per-state mask cache (bounded: OSP_GRAMMAR_MASK_CACHE entries).
 * A token whose bytes would make the parse too ambiguous (as above) is left out of the mask.
 * Errors: OSP_ERR_INVALID_ARG (NULL), OSP_ERR_NOMEM. */
#define OSP_GRAMMAR_MASK_CACHE 256
osp_status osp_grammar_matcher_fill_mask(osp_grammar_matcher *m, const osp_token_trie *t, uint32_t *mask);

/* Drafts for speculative decoding under a grammar (the forced continuation, lossless because the target
 * verifies every draft): while the input so far is not a whole sentence and the grammar allows exactly
 * one next byte, that byte is drafted; inside a run, a colon that is the only next byte besides optional
 * whitespace (space, tab, newline, return) is drafted too, the whitespace assumed left out (JSON's
 * "key":); those bytes (at most OSP_GRAMMAR_MAX_FORCED) are cut into tokens of the
 * trie by longest match, each token wholly inside them (so every draft is one the grammar accepts; the
 * model may still write the whitespace or cut the bytes otherwise, which verification rejects). Writes at most cap ids to out and returns how many (0: nothing
 * forced, or no whole token fits; also on NOMEM while extending the shared automaton, which is only a
 * missed draft). The matcher's state is unchanged. */
#define OSP_GRAMMAR_MAX_FORCED 256
int32_t osp_grammar_matcher_forced_tokens(osp_grammar_matcher *m, const osp_token_trie *t, int32_t *out, int32_t cap);

/* Sets every logit whose token the mask does not allow to -inf: logits [n_vocab], mask as above. */
void osp_grammar_apply_mask(float *logits, int32_t n_vocab, const uint32_t *mask);

/* Checks the shared automaton (for tests, fuzzing and debug builds): every node's parent is older than
 * it and its position inside the grammar; every state's tops are sorted, distinct and at byte sets;
 * state 0 is the empty dead state; transitions and cached masks point at existing entries; every
 * member of the family points back at it. OSP_OK, or OSP_ERR_INTERNAL naming the first violation. */
osp_status osp_grammar_matcher_check_invariants(const osp_grammar_matcher *m);

/* Automaton sizes, for tests and benchmarks: interned stack nodes, states, cached masks. */
void osp_grammar_matcher_stats(const osp_grammar_matcher *m, int32_t *n_nodes, int32_t *n_states, int32_t *n_masks);

/* ---- JSON Schema -------------------------------------------------------------------------------- */

/* Writes a GBNF grammar (start rule "root") whose sentences are JSON texts valid against the schema
 * text schema[0..len) (JSON; a schema object or a boolean). Supported: type (string, number,
 * integer, boolean, null, object, array, or a list of them), properties + required (properties in
 * the schema's order, optional ones may be left out), additionalProperties (false, or a schema for an
 * object without properties), items, minItems / maxItems, enum, const, anyOf / oneOf (oneOf's "only
 * one" is not enforced), allOf of one schema, $ref to "#", "#/$defs/..", "#/definitions/.." (any
 * JSON pointer into the document), minLength / maxLength. Annotations (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly, nullable=false) are ignored.
 * Keywords that only widen what is valid are honoured by generating a subset (an object with
 * "properties" never gets extra keys). Whitespace: at most 20 blanks after '{' '[' ',' ':' and
 * values, none before the first value. Numbers: integers up to 16 digits.
 * On success *gbnf is a malloc'd NUL-terminated string the caller frees.
 * Errors: OSP_ERR_UNSUPPORTED for a keyword or value this compiler cannot enforce (the message names
 * it and its place, "json_schema: #/properties/age: unsupported keyword 'minimum'");
 * OSP_ERR_INVALID_ARG for text that is not JSON or not a schema (a message saying why);
 * OSP_ERR_NOMEM. Source: JSON Schema 2020-12 core and validation vocabularies. */
osp_status osp_json_schema_to_gbnf(const char *schema, size_t len, char **gbnf);

/* The GBNF of "any JSON object" (OpenAI's response_format json_object), static. */
const char *osp_json_object_gbnf(void);

#endif
