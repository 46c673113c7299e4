/* Byte-level BPE and SentencePiece tokenizers built from GGUF metadata, and an incremental
 * UTF-8-safe detokenizer.
 *
 * The reference is llama.cpp's tokenizer (src/llama-vocab.cpp, src/unicode.cpp): for every
 * `tokenizer.ggml.model = gpt2` vocabulary and every pre-tokenizer osprey supports, and for
 * `tokenizer.ggml.model = llama` (SentencePiece, llama.cpp's LLAMA_VOCAB_TYPE_SPM), encode()
 * returns the ids llama_tokenize() returns, token for token. The BPE pipeline is:
 *
 *   text ─▶ special/added-token partition (longest token first, as llama.cpp's
 *           tokenizer_st_partition) ─▶ pre-tokenizer (the regexes `tokenizer.ggml.pre` names,
 *           run with PCRE2 or the hand-written splitters llama.cpp uses for GPT-2/Llama-3/Qwen2)
 *   ─▶ GPT-2 byte-to-unicode mapping ─▶ BPE merges by rank (`tokenizer.ggml.merges`, rank = index)
 *   ─▶ ids, with BOS/EOS around them as the metadata says.
 *
 * SentencePiece (`llama`) shares the partition and BOS/EOS steps; each raw fragment has its spaces
 * written as U+2581 '▁', gets one more '▁' in front when add_space_prefix is on (the default) and it
 * starts the text or follows a special token, and is merged character by character, highest
 * tokenizer.ggml.scores piece first; characters with no piece become <0xXX> byte tokens. BOS is
 * added by default (add_bos_token defaults to true, BOS = 1, EOS = 2, UNK = 0).
 *
 * Known differences from llama.cpp, all deliberate or unreachable in practice:
 *  - with add_special, BOS/EOS are not doubled when the text already starts/ends with them
 *    (llama.cpp doubles and warns);
 *  - special tokens of equal length are tried in id order (llama.cpp's std::sort leaves their order
 *    unspecified); this matters only if two such token texts overlap in the input;
 *  - a 4-byte sequence decoding past U+10FFFF (F4 90.., F5..F7 leads) is read as U+FFFD plus
 *    continuation bytes; llama.cpp throws on it;
 *  - decoding never applies llama_detokenize's clean_spaces pass (token_to_piece does not either);
 *  - SentencePiece: a byte with neither a <0xXX> nor a one-byte token is dropped (llama.cpp throws;
 *    every real SPM vocabulary has all 256 byte tokens).
 *
 * SentencePiece decode(encode(s)) == s holds once the first token's leading space is dropped
 * (osp_detokenizer_lstrip_first), except that a space is also put in front of text following a
 * special token ("a</s>b" comes back as "a</s> b"), and tokens with RSTRIP/LSTRIP eat the spaces
 * next to them (Phi-3's specials).
 *
 * Tokenizers are immutable after load and safe to share between threads; a detokenizer is
 * per-sequence state and belongs to one thread at a time. */
#ifndef OSPREY_TOKENIZER_H
#define OSPREY_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/gguf.h"
#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct osp_tokenizer osp_tokenizer;

/* Token attributes (bit flags), as llama.cpp derives them from `tokenizer.ggml.token_type` and its
 * name-based fix-ups (e.g. "<|im_end|>" is made CONTROL). Values are llama.cpp's llama_token_attr. */
enum {
    OSP_TOKEN_ATTR_UNDEFINED = 0,
    OSP_TOKEN_ATTR_UNKNOWN = 1 << 0,
    OSP_TOKEN_ATTR_UNUSED = 1 << 1,
    OSP_TOKEN_ATTR_NORMAL = 1 << 2,
    OSP_TOKEN_ATTR_CONTROL = 1 << 3,
    OSP_TOKEN_ATTR_USER_DEFINED = 1 << 4,
    OSP_TOKEN_ATTR_BYTE = 1 << 5,
    OSP_TOKEN_ATTR_LSTRIP = 1 << 7,
    OSP_TOKEN_ATTR_RSTRIP = 1 << 8,
};

/* Builds a tokenizer from the `tokenizer.*` metadata of `g`: tokens, token_type, merges, pre,
 * bos/eos/eot/eom/unk/pad ids, add_bos_token, add_eos_token. Everything needed is copied, so `g`
 * may be closed afterwards. On success *out is owned by the caller (osp_tokenizer_free).
 * For "llama" vocabularies also tokenizer.ggml.scores (float32 or int32; absent = all 0) and
 * add_space_prefix; merges and pre are not used.
 * Errors: OSP_ERR_UNSUPPORTED when tokenizer.ggml.model is neither "gpt2" nor "llama", or a gpt2
 * tokenizer.ggml.pre names a pre-tokenizer osprey does not implement (the message names it);
 * OSP_ERR_NOT_FOUND when tokens (or gpt2 merges) are missing; OSP_ERR_FORMAT for mistyped arrays;
 * OSP_ERR_NOMEM.
 * Source: llama_vocab::impl::load (special-token defaults, EOG set, attribute fix-ups). */
osp_status osp_tokenizer_load(const osp_gguf *g, osp_tokenizer **out);

/* Frees everything load() allocated. NULL is fine. */
void osp_tokenizer_free(osp_tokenizer *t);

int32_t osp_tokenizer_n_vocab(const osp_tokenizer *t);
int32_t osp_tokenizer_bos(const osp_tokenizer *t); /* -1 if none */
int32_t osp_tokenizer_eos(const osp_tokenizer *t); /* -1 if none */
int32_t osp_tokenizer_eot(const osp_tokenizer *t); /* -1 if none ("<|im_end|>", "<|eot_id|>", ...) */
bool osp_tokenizer_add_bos(const osp_tokenizer *t); /* tokenizer.ggml.add_bos_token (or pre default) */
bool osp_tokenizer_add_eos(const osp_tokenizer *t);
/* The pre-tokenizer name in use ("smollm", "default" when the metadata has none or for SPM). */
const char *osp_tokenizer_pre_name(const osp_tokenizer *t);
/* tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece). */
const char *osp_tokenizer_model_name(const osp_tokenizer *t);
/* SentencePiece: a space goes in front of the text (tokenizer.ggml.add_space_prefix, default true);
 * always false for BPE. */
bool osp_tokenizer_add_space_prefix(const osp_tokenizer *t);
/* Attribute bits of `id` (OSP_TOKEN_ATTR_*), 0 when out of range. */
uint32_t osp_tokenizer_attr(const osp_tokenizer *t, int32_t id);
/* The stored (byte-encoded) vocabulary string of `id`, NUL-terminated, or NULL if out of range. */
const char *osp_tokenizer_token_text(const osp_tokenizer *t, int32_t id);
/* The id whose stored vocabulary string is text[0..len) exactly (e.g. "<|im_start|>"), or -1. */
int32_t osp_tokenizer_token_id(const osp_tokenizer *t, const char *text, size_t len);
/* Length in bytes of the longest decoded token (osp_tokenizer_token_bytes). */
size_t osp_tokenizer_max_token_bytes(const osp_tokenizer *t);

/* End of generation: true for eos, eot, eom, the FIM pad/repo/sep tokens and every token whose text
 * llama.cpp lists as ending a turn ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>",
 * ...). Out-of-range ids are not EOG. Source: llama_vocab::impl::load, special_eog_ids. */
bool osp_tokenizer_is_eog(const osp_tokenizer *t, int32_t id);

/* Tokenizes text[0..len) (any bytes; invalid UTF-8 is read as llama.cpp reads it: each byte that
 * does not start a well-formed sequence becomes U+FFFD).
 *   add_special:   put BOS in front if add_bos_token and EOS at the end if add_eos_token. Unlike
 *                  llama.cpp (which warns), BOS/EOS are never doubled: if the text already begins
 *                  with BOS (or ends with EOS) as a parsed special token, none is added.
 *   parse_special: match CONTROL/UNKNOWN token texts ("<|im_start|>") in the text and emit their ids;
 *                  when false they are tokenized as plain text. USER_DEFINED (added) tokens are
 *                  matched in both cases, as llama.cpp and HF tokenizers do.
 * On success *ids is malloc'd (the caller frees it; NULL when *n_ids == 0).
 * Errors: OSP_ERR_INVALID_ARG (NULL arguments), OSP_ERR_NOMEM, OSP_ERR_INTERNAL (regex failure).
 * Source: llama_vocab::impl::tokenize, LLAMA_VOCAB_TYPE_BPE and LLAMA_VOCAB_TYPE_SPM branches. */
osp_status osp_tokenizer_encode(const osp_tokenizer *t, const char *text, size_t len, bool add_special,
                                bool parse_special, int32_t **ids, size_t *n_ids);

#ifndef OSP_TEXT_SPAN_DEFINED /* also in chat_template.h */
#define OSP_TEXT_SPAN_DEFINED
/* A byte range [off, off + len) of a text. */
typedef struct osp_text_span {
    size_t off, len;
} osp_text_span;
#endif

/* Tokenizes a text in which some byte ranges are plain text whatever they contain: a rendered chat
 * prompt whose `plain` ranges came from the request (osp_chat_template_render_spans' tainted spans).
 * The rest is parsed with parse_special on, so the template's own markup keeps its control tokens,
 * while "<|im_end|>" typed in a message stays text. Precisely: the special-token partition is
 * osp_tokenizer_encode's, except that an occurrence of a CONTROL/UNKNOWN token text that overlaps a
 * plain byte is not cut out (USER_DEFINED tokens are matched everywhere, as with parse_special off).
 * The text is NOT cut at range boundaries: each raw fragment between special tokens goes to the
 * pre-tokenizer and BPE (or SentencePiece) whole, so merges and pre-tokenizer splits across a
 * boundary between template text and request text are the one-shot ones.
 * Guarantees: (1) if no occurrence of a CONTROL/UNKNOWN token text in `text` overlaps a plain
 * range, the ids are exactly osp_tokenizer_encode(text, len, add_special, parse_special = true)'s;
 * (2) no CONTROL/UNKNOWN id comes from matching text that overlaps a plain range; plain text is
 * merged as with parse_special off, which in the vocabularies tested (SmolLM2, Qwen2.5, Phi-3:
 * tests/golden/test_chat_provenance.c) never spells a control token. USER_DEFINED (added, non-special)
 * tokens such as Qwen's <tool_call> are still matched in plain ranges, as HF tokenizers match them.
 * plain: [n_plain] ranges sorted by off, non-overlapping, within [0, len) (NULL when n_plain = 0).
 * add_special, ids, n_ids as osp_tokenizer_encode. Errors: OSP_ERR_INVALID_ARG (NULL arguments,
 * ranges out of the text or out of order; nothing allocated), OSP_ERR_NOMEM, OSP_ERR_INTERNAL.
 * Source: issue 20 ("Chat turns forged through content"); the partition is llama.cpp's
 * tokenizer_st_partition. */
osp_status osp_tokenizer_encode_spans(const osp_tokenizer *t, const char *text, size_t len,
                                      const osp_text_span *plain, size_t n_plain, bool add_special, int32_t **ids,
                                      size_t *n_ids);

/* The bytes token `id` stands for: for normal tokens byte-level decoded (BPE: the GPT-2 unicode
 * chars mapped back to bytes; may be an incomplete UTF-8 sequence) or with '▁' written as ' '
 * (SPM: "▁Hello" is " Hello"), the byte of a <0xXX> BYTE token, the literal text for CONTROL,
 * USER_DEFINED and UNKNOWN tokens, nothing for UNUSED/UNDEFINED ones (llama_token_to_piece with
 * special=true). Writes at most `cap` bytes (no NUL) and sets *n to the full length.
 * Errors: OSP_ERR_INVALID_ARG for an out-of-range id, or when cap < *n (nothing useful written). */
osp_status osp_tokenizer_token_bytes(const osp_tokenizer *t, int32_t id, char *buf, size_t cap, size_t *n);

/* Incremental detokenizer: turns a stream of ids into UTF-8 text that never contains a partial
 * sequence. Bytes of a character split across tokens are held back until it is complete; a byte
 * that can no longer become part of a valid sequence is emitted as U+FFFD (one per maximal
 * ill-formed subpart, as the Unicode standard recommends and Python's errors="replace" does). */
typedef struct osp_detokenizer osp_detokenizer;

/* Creates a detokenizer over `t` (which must outlive it). Special tokens render their text unless
 * osp_detokenizer_skip_special() says otherwise. Errors: OSP_ERR_INVALID_ARG, OSP_ERR_NOMEM. */
osp_status osp_detokenizer_new(const osp_tokenizer *t, osp_detokenizer **out);
void osp_detokenizer_free(osp_detokenizer *d); /* NULL is fine */
/* When skip is true, CONTROL/UNKNOWN tokens (BOS, EOS, <|im_end|>, ...) produce no text. */
void osp_detokenizer_skip_special(osp_detokenizer *d, bool skip);
/* When on and the vocabulary adds a space prefix (SentencePiece), the first token pushed after
 * new/reset/flush loses one leading space, as llama_detokenize does for a whole sequence: that is
 * the space encode() put in front of the text. If the first token is BOS (rendered or skipped),
 * the space of the next token is kept, as in llama.cpp. Off by default, which is right for
 * streaming tokens generated after a prompt. */
void osp_detokenizer_lstrip_first(osp_detokenizer *d, bool on);
/* Drops pending bytes (start of a new sequence). */
void osp_detokenizer_reset(osp_detokenizer *d);

/* Feeds token `id`; writes the newly complete text to out (NUL-terminated, *n bytes without the
 * NUL). A cap of 3 * (osp_tokenizer_max_token_bytes(t) + 4) + 1 always suffices.
 * Errors: OSP_ERR_INVALID_ARG for an out-of-range id or when the text does not fit in cap; in both
 * cases the detokenizer is unchanged and *n is the size needed (without the NUL). */
osp_status osp_detokenizer_push(osp_detokenizer *d, int32_t id, char *out, size_t cap, size_t *n);

/* Ends the stream: pending bytes that never completed become U+FFFD. Writes as push() does
 * (cap >= 13 always suffices); afterwards the detokenizer is empty and reusable. */
osp_status osp_detokenizer_flush(osp_detokenizer *d, char *out, size_t cap, size_t *n);

#ifdef __cplusplus
}
#endif
#endif
