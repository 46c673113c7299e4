/* Unicode helpers for the tokenizer: llama.cpp-compatible UTF-8 decoding (lenient, U+FFFD for bytes
 * that do not start a sequence), code point classes (general category reduced to L/N/P/S/M/Z/C and
 * unassigned, from a generated range table), the White_Space set, and the GPT-2 byte<->unicode map.
 *
 * The class table is generated from UCD 15.1 (gen_unicode_table.py) because that is the version
 * llama.cpp's own tables use; PCRE2's built-in tables are older on most systems, and a code point
 * classified differently changes the pre-tokenization and therefore the ids. */
#ifndef OSP_TOKENIZER_UNICODE_H
#define OSP_TOKENIZER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    OSP_UCLASS_UNASSIGNED = 0x01, /* Cn, and anything past U+10FFFF */
    OSP_UCLASS_NUMBER = 0x02,     /* \p{N} */
    OSP_UCLASS_LETTER = 0x04,     /* \p{L} */
    OSP_UCLASS_SEPARATOR = 0x08,  /* \p{Z} */
    OSP_UCLASS_MARK = 0x10,       /* \p{M} */
    OSP_UCLASS_PUNCT = 0x20,      /* \p{P} */
    OSP_UCLASS_SYMBOL = 0x40,     /* \p{S} */
    OSP_UCLASS_CONTROL = 0x80,    /* \p{C} other than Cn */
};

typedef struct osp_unicode_range {
    uint32_t first;
    uint32_t cls;
} osp_unicode_range;

extern const uint32_t osp_unicode_n_ranges;
extern const osp_unicode_range osp_unicode_ranges[];

/* Class bits (OSP_UCLASS_*) of code point `cp`. */
uint32_t osp_unicode_class(uint32_t cp);

/* White_Space as llama.cpp defines it: U+0009-000D, U+0020, U+0085, U+00A0, U+1680, U+2000-200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000. */
bool osp_unicode_is_space(uint32_t cp);

/* Decodes s[0..len) into code points the way llama.cpp's unicode_cpts_from_utf8 does: lead bytes
 * decide the length, only the continuation bits of following bytes are checked (so overlong forms
 * and surrogates decode), and a byte that cannot start a sequence becomes U+FFFD and is skipped.
 * cps must hold len entries. Returns the number of code points. */
size_t osp_utf8_decode_lenient(const char *s, size_t len, uint32_t *cps);

/* Encodes cp (any value < 0x110000, surrogates included) as 1-4 bytes; returns the count, 0 if
 * cp >= 0x110000. */
int osp_utf8_encode(uint32_t cp, char *out);

/* GPT-2 byte-level BPE map (Radford et al. 2019, openai/gpt-2 encoder.py bytes_to_unicode): the
 * printable bytes map to themselves, the other 68 to U+0100.. in byte order. */
uint32_t osp_byte_to_unicode(uint8_t b);
/* The byte whose char is cp, or -1 if cp is not one of the 256. */
int osp_unicode_to_byte(uint32_t cp);

#endif
