/* The compiled grammar as gbnf.c writes it and matcher.c reads it (see grammar.h for the format).
 *
 * Every alternative is a run of elements in elems[] ended by GR_END; an element is a byte-set id
 * (>= 0: sets[id] is a 256-bit set, the element matches one byte in it) or a rule reference
 * (GR_REF(rule) <= -2). A "position" is an index into elems[]. */
#ifndef OSP_GRAMMAR_INTERNAL_H
#define OSP_GRAMMAR_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

#define GR_END (-1)
#define GR_REF(r) (-(r) - 2)
#define GR_IS_REF(e) ((e) <= -2)
#define GR_REF_RULE(e) (-(e) - 2)

struct osp_grammar {
    int32_t n_rules, n_alts, n_elems, n_sets;
    int32_t root;
    int32_t *rule_alt;  /* [n_rules + 1]: rule r's alternatives are alt_start[rule_alt[r] .. rule_alt[r + 1]) */
    int32_t *alt_start; /* [n_alts]: position of each alternative's first element */
    int32_t *elems;     /* [n_elems]: set id, GR_REF(rule) or GR_END */
    uint32_t (*sets)[8]; /* [n_sets]: bit b of word b / 32 set when the byte matches */
    char **names;       /* [n_rules]: "name", or "name_N" for helper rules */
    /* Byte classes: bytes no set tells apart share a class, so tables indexed by byte class are
     * n_classes wide instead of 256. class_rep[c] is one byte of class c. */
    uint8_t byte_class[256];
    uint8_t class_rep[256];
    int32_t n_classes;
};

static inline int gr_set_has(const uint32_t *set, unsigned b) { return (set[b >> 5] >> (b & 31)) & 1; }

/* A growing NUL-terminated string (the GBNF text json_schema.c writes, gbnf.c's dump); oom sticks once
 * an allocation failed, so callers check it once at the end. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static inline void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static inline void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

#endif
