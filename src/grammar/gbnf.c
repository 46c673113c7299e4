/* GBNF text -> osp_grammar: a recursive-descent parser over llama.cpp's grammar language that
 * compiles straight to byte-level rules (grammar.h has the format, grammar_internal.h the layout).
 *
 * Parsing builds rules as lists of alternatives (each a growable array of elements); groups and
 * repetitions become helper rules as they are read. Then: every referenced rule must be defined, the
 * start rule must exist, no rule may be left-recursive (it would loop the matcher's closure), and the
 * rules are flattened into one elems[] array. Character classes are sets of code point ranges, turned
 * into UTF-8 byte-range sequences by splitting each range until every byte position ranges
 * independently (the method of Russ Cox's RE2 / utf8-ranges, written here from its description). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "grammar/grammar_internal.h"

#define MAX_DEPTH 200 /* nesting of ( ) */

/* ---- growable arrays ------------------------------------------------------------------------- */

typedef struct ivec {
    int32_t *v;
    int32_t n, cap;
} ivec;

static int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        int32_t cap = a->cap ? a->cap * 2 : 8;
        int32_t *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        a->v = v, a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct brule {
    char *name;
    ivec *alts; /* [n_alts] */
    int32_t n_alts, cap_alts;
    int32_t n_helpers;     /* helper rules made for it so far (their names) */
    const char *first_ref; /* where it was first referenced (for "undefined rule") */
    int defined;
    int helper;
} brule;

typedef struct parser {
    const char *src, *p, *end;
    brule *rules;
    int32_t n_rules, cap_rules;
    uint32_t (*sets)[8];
    int32_t n_sets, cap_sets;
    int32_t *set_hash; /* open addressing, -1 empty; capacity set_hash_cap (power of 2) */
    int32_t set_hash_cap;
    int64_t n_elems; /* elements in all alternatives, for the size limit */
    int depth;
    osp_status st; /* first failure */
} parser;

/* ---- errors ---------------------------------------------------------------------------------- */

static osp_status fail_at(parser *ps, const char *at, const char *fmt, const char *arg) {
    if (ps->st != OSP_OK) return ps->st;
    int line = 1, col = 1;
    for (const char *q = ps->src; q < at && q < ps->end; q++) {
        if (*q == '\n') line++, col = 1;
        else col++;
    }
    char what[512];
    snprintf(what, sizeof what, fmt, arg ? arg : "");
    ps->st = osp_set_error(OSP_ERR_FORMAT, "grammar:%d:%d: %s", line, col, what);
    return ps->st;
}

static osp_status nomem(parser *ps) {
    if (ps->st == OSP_OK) ps->st = osp_set_error(OSP_ERR_NOMEM, "grammar: out of memory");
    return ps->st;
}

/* ---- rules and byte sets ----------------------------------------------------------------------- */

static int32_t new_rule(parser *ps, const char *name, size_t len, int helper) {
    if (ps->n_rules == ps->cap_rules) {
        int32_t cap = ps->cap_rules ? ps->cap_rules * 2 : 16;
        brule *r = realloc(ps->rules, (size_t)cap * sizeof *r);
        if (!r) return nomem(ps), -1;
        ps->rules = r, ps->cap_rules = cap;
    }
    brule *r = &ps->rules[ps->n_rules];
    memset(r, 0, sizeof *r);
    r->name = malloc(len + 1);
    if (!r->name) return nomem(ps), -1;
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->helper = helper;
    return ps->n_rules++;
}

static int32_t helper_rule(parser *ps, int32_t parent) {
    char name[96];
    const int n = snprintf(name, sizeof name, "%.64s_%d", ps->rules[parent].name, ++ps->rules[parent].n_helpers);
    const int32_t r = new_rule(ps, name, (size_t)n, 1);
    if (r >= 0) ps->rules[r].defined = 1;
    return r;
}

static int32_t find_rule(const parser *ps, const char *name, size_t len) {
    for (int32_t i = 0; i < ps->n_rules; i++)
        if (!ps->rules[i].helper && strlen(ps->rules[i].name) == len && memcmp(ps->rules[i].name, name, len) == 0)
            return i;
    return -1;
}

/* Starts a new (empty) alternative of rule r; returns it or NULL. */
static ivec *new_alt(parser *ps, int32_t r) {
    brule *b = &ps->rules[r];
    if (b->n_alts == b->cap_alts) {
        int32_t cap = b->cap_alts ? b->cap_alts * 2 : 4;
        ivec *a = realloc(b->alts, (size_t)cap * sizeof *a);
        if (!a) return nomem(ps), NULL;
        b->alts = a, b->cap_alts = cap;
    }
    ivec *a = &b->alts[b->n_alts++];
    memset(a, 0, sizeof *a);
    return a;
}

static int push_elem(parser *ps, ivec *a, int32_t e) {
    if (++ps->n_elems > OSP_GRAMMAR_MAX_ELEMS) {
        fail_at(ps, ps->p, "grammar too large (more than %s elements once repetitions are expanded)", "1048576");
        return -1;
    }
    if (ivec_push(a, e)) return nomem(ps), -1;
    return 0;
}

static uint32_t set_hash(const uint32_t *s) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < 8; i++) h = (h ^ s[i]) * 16777619u, h ^= h >> 15;
    return h;
}

/* The id of byte set s (added if new), or -1. */
static int32_t intern_set(parser *ps, const uint32_t *s) {
    if (ps->n_sets * 2 >= ps->set_hash_cap) {
        const int32_t cap = ps->set_hash_cap ? ps->set_hash_cap * 2 : 64;
        int32_t *h = malloc((size_t)cap * sizeof *h);
        if (!h) return nomem(ps), -1;
        for (int32_t i = 0; i < cap; i++) h[i] = -1;
        for (int32_t i = 0; i < ps->n_sets; i++) {
            uint32_t k = set_hash(ps->sets[i]) & (uint32_t)(cap - 1);
            while (h[k] >= 0) k = (k + 1) & (uint32_t)(cap - 1);
            h[k] = i;
        }
        free(ps->set_hash);
        ps->set_hash = h, ps->set_hash_cap = cap;
    }
    uint32_t k = set_hash(s) & (uint32_t)(ps->set_hash_cap - 1);
    for (; ps->set_hash[k] >= 0; k = (k + 1) & (uint32_t)(ps->set_hash_cap - 1))
        if (memcmp(ps->sets[ps->set_hash[k]], s, 32) == 0) return ps->set_hash[k];
    if (ps->n_sets == ps->cap_sets) {
        const int32_t cap = ps->cap_sets ? ps->cap_sets * 2 : 32;
        uint32_t(*ns)[8] = realloc(ps->sets, (size_t)cap * sizeof *ns);
        if (!ns) return nomem(ps), -1;
        ps->sets = ns, ps->cap_sets = cap;
    }
    memcpy(ps->sets[ps->n_sets], s, 32);
    ps->set_hash[k] = ps->n_sets;
    return ps->n_sets++;
}

static int32_t byte_range_set(parser *ps, unsigned lo, unsigned hi) {
    uint32_t s[8] = {0};
    for (unsigned b = lo; b <= hi; b++) s[b >> 5] |= 1u << (b & 31);
    return intern_set(ps, s);
}

/* ---- UTF-8 ----------------------------------------------------------------------------------- */

static int utf8_encode(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) return out[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return out[0] = (uint8_t)(0xC0 | cp >> 6), out[1] = (uint8_t)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12), out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18), out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)), out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes one well-formed UTF-8 character at p (before end); returns its length, 0 if malformed. */
static int utf8_decode(const char *p, const char *end, uint32_t *cp) {
    const uint8_t *s = (const uint8_t *)p;
    const size_t left = (size_t)(end - p);
    if (s[0] < 0x80) return *cp = s[0], 1;
    int n;
    uint32_t c, min;
    if ((s[0] & 0xE0) == 0xC0) n = 2, c = s[0] & 0x1F, min = 0x80;
    else if ((s[0] & 0xF0) == 0xE0) n = 3, c = s[0] & 0x0F, min = 0x800;
    else if ((s[0] & 0xF8) == 0xF0) n = 4, c = s[0] & 0x07, min = 0x10000;
    else return 0;
    if (left < (size_t)n) return 0;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    return *cp = c, n;
}

/* ---- character classes ------------------------------------------------------------------------- */

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

typedef struct crvec {
    cprange *v;
    int32_t n, cap;
} crvec;

static int cr_push(crvec *a, uint32_t lo, uint32_t hi) {
    if (a->n == a->cap) {
        int32_t cap = a->cap ? a->cap * 2 : 8;
        cprange *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        a->v = v, a->cap = cap;
    }
    a->v[a->n++] = (cprange){lo, hi};
    return 0;
}

static int cr_cmp(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges overlapping or touching ranges in place. */
static void cr_normalize(crvec *a) {
    if (a->n == 0) return;
    qsort(a->v, (size_t)a->n, sizeof *a->v, cr_cmp);
    int32_t w = 0;
    for (int32_t i = 1; i < a->n; i++) {
        if (a->v[i].lo <= a->v[w].hi + 1) {
            if (a->v[i].hi > a->v[w].hi) a->v[w].hi = a->v[i].hi;
        } else a->v[++w] = a->v[i];
    }
    a->n = w + 1;
}

/* One UTF-8 byte-range sequence: byte i of an encoded char lies in [lo[i], hi[i]]. */
typedef struct useq {
    uint8_t lo[4], hi[4];
    int n;
} useq;

typedef struct usvec {
    useq *v;
    int32_t n, cap;
} usvec;

/* Appends the byte-range sequences of code points [lo, hi] (no surrogates inside) to out. */
static int utf8_split(uint32_t lo, uint32_t hi, usvec *out) {
    static const uint32_t len_max[3] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= len_max[i] && hi > len_max[i])
            return utf8_split(lo, len_max[i], out) || utf8_split(len_max[i] + 1, hi, out) ? -1 : 0;
    uint8_t a[4], b[4];
    const int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) return utf8_split(lo, lo | m, out) || utf8_split((lo | m) + 1, hi, out) ? -1 : 0;
            if ((hi & m) != m) return utf8_split(lo, (hi & ~m) - 1, out) || utf8_split(hi & ~m, hi, out) ? -1 : 0;
        }
    }
    utf8_encode(hi, b);
    if (out->n == out->cap) {
        int32_t cap = out->cap ? out->cap * 2 : 8;
        useq *v = realloc(out->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        out->v = v, out->cap = cap;
    }
    useq *s = &out->v[out->n++];
    s->n = n;
    memcpy(s->lo, a, 4), memcpy(s->hi, b, 4);
    return 0;
}

/* Appends to `seq` of rule r the elements matching one code point of `cls` (normalized): one byte
 * set when every range is ASCII, else a helper rule with one alternative per UTF-8 sequence. */
static int emit_class(parser *ps, int32_t r, ivec *seq, crvec *cls, int negate) {
    crvec use = {0};
    if (negate) {
        uint32_t next = 0;
        for (int32_t i = 0; i < cls->n; i++) {
            if (cls->v[i].lo > next && cr_push(&use, next, cls->v[i].lo - 1)) goto oom;
            next = cls->v[i].hi + 1;
        }
        if (next <= 0x10FFFF && cr_push(&use, next, 0x10FFFF)) goto oom;
    } else {
        for (int32_t i = 0; i < cls->n; i++)
            if (cr_push(&use, cls->v[i].lo, cls->v[i].hi)) goto oom;
    }
    /* cut out the surrogates (no UTF-8 encoding) */
    usvec seqs = {0};
    uint32_t ascii[8] = {0};
    int has_ascii = 0;
    for (int32_t i = 0; i < use.n; i++) {
        uint32_t lo = use.v[i].lo, hi = use.v[i].hi;
        for (; lo <= hi && lo < 0x80; lo++) ascii[lo >> 5] |= 1u << (lo & 31), has_ascii = 1;
        if (lo > hi) continue;
        if (lo < 0xD800 && hi >= 0xD800) {
            if (utf8_split(lo, 0xD7FF, &seqs)) goto oom2;
            lo = 0xE000;
        }
        if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
        if (lo <= hi && utf8_split(lo, hi, &seqs)) goto oom2;
    }
    free(use.v);
    int rc = 0;
    if (seqs.n == 0 && has_ascii) {
        const int32_t s = intern_set(ps, ascii);
        rc = s < 0 ? -1 : push_elem(ps, seq, s);
    } else {
        /* a helper rule; with no alternative at all when the class is empty (it never matches) */
        const int32_t h = helper_rule(ps, r);
        if (h < 0) rc = -1;
        if (!rc && has_ascii) {
            ivec *a = new_alt(ps, h);
            const int32_t s = a ? intern_set(ps, ascii) : -1;
            rc = s < 0 ? -1 : push_elem(ps, a, s);
        }
        for (int32_t i = 0; !rc && i < seqs.n; i++) {
            ivec *a = new_alt(ps, h);
            if (!a) rc = -1;
            for (int k = 0; !rc && k < seqs.v[i].n; k++) {
                const int32_t s = byte_range_set(ps, seqs.v[i].lo[k], seqs.v[i].hi[k]);
                rc = s < 0 ? -1 : push_elem(ps, a, s);
            }
        }
        if (!rc) rc = push_elem(ps, seq, GR_REF(h));
    }
    free(seqs.v);
    return rc;
oom2:
    free(seqs.v);
oom:
    free(use.v);
    nomem(ps);
    return -1;
}

/* ---- lexing ---------------------------------------------------------------------------------- */

static int is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments; newlines too when newline_ok. */
static void skip_space(parser *ps, int newline_ok) {
    while (ps->p < ps->end) {
        const char c = *ps->p;
        if (c == ' ' || c == '\t' || c == '\r') ps->p++;
        else if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n') ps->p++;
        } else if (c == '\n' && newline_ok) ps->p++;
        else break;
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads one character of a literal or class at ps->p (escapes decoded) into *cp. */
static int read_char(parser *ps, uint32_t *cp) {
    const char *at = ps->p;
    if (ps->p >= ps->end) return fail_at(ps, at, "unexpected end of grammar%s", NULL), -1;
    if (*ps->p != '\\') {
        const int n = utf8_decode(ps->p, ps->end, cp);
        if (n == 0) return fail_at(ps, at, "malformed UTF-8%s", NULL), -1;
        ps->p += n;
        return 0;
    }
    if (ps->p + 1 >= ps->end) return fail_at(ps, at, "unfinished escape%s", NULL), -1;
    const char e = ps->p[1];
    ps->p += 2;
    int digits = 0;
    switch (e) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '/': *cp = (uint8_t)e; return 0;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default: {
        char s[2] = {e, 0};
        return fail_at(ps, at, "unknown escape '\\%s'", s), -1;
    }
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        const int h = ps->p < ps->end ? hexval(*ps->p) : -1;
        if (h < 0) return fail_at(ps, at, "escape needs %s hex digits", digits == 2 ? "2" : digits == 4 ? "4" : "8"), -1;
        v = v << 4 | (uint32_t)h;
        ps->p++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return fail_at(ps, at, "escape is not a Unicode scalar value%s", NULL), -1;
    *cp = v;
    return 0;
}

/* ---- the grammar ----------------------------------------------------------------------------- */

static int parse_alts(parser *ps, int32_t r, int nested);

/* x{m,n} with n < 0 meaning unbounded; X = the slice [start, seq->n) of seq. */
static int repeat(parser *ps, int32_t r, ivec *seq, int32_t start, long m, long n, const char *at) {
    const int32_t len = seq->n - start;
    if (len == 0) return 0; /* "" and the like: nothing to repeat */
    const long copies = n < 0 ? m + 1 : n;
    if ((int64_t)copies * len + ps->n_elems > OSP_GRAMMAR_MAX_ELEMS)
        return fail_at(ps, at, "grammar too large (more than %s elements once repetitions are expanded)", "1048576"), -1;
    int32_t *x = malloc((size_t)len * sizeof *x);
    if (!x) return nomem(ps), -1;
    memcpy(x, seq->v + start, (size_t)len * sizeof *x);
    seq->n = start;
    ps->n_elems -= len;
    int rc = 0;
    for (long i = 0; !rc && i < m; i++)
        for (int32_t k = 0; !rc && k < len; k++) rc = push_elem(ps, seq, x[k]);
    if (!rc && n < 0) { /* R ::= X R | ε */
        const int32_t h = helper_rule(ps, r);
        ivec *a = h >= 0 ? new_alt(ps, h) : NULL;
        if (!a) rc = -1;
        for (int32_t k = 0; !rc && k < len; k++) rc = push_elem(ps, a, x[k]);
        if (!rc) rc = push_elem(ps, a, GR_REF(h));
        if (!rc && !new_alt(ps, h)) rc = -1;
        if (!rc) rc = push_elem(ps, seq, GR_REF(h));
    } else if (!rc && n > m) { /* O_1 ::= X | ε ; O_k ::= X O_{k-1} | ε */
        int32_t prev = -1;
        for (long i = 0; !rc && i < n - m; i++) {
            const int32_t h = helper_rule(ps, r);
            ivec *a = h >= 0 ? new_alt(ps, h) : NULL;
            if (!a) rc = -1;
            for (int32_t k = 0; !rc && k < len; k++) rc = push_elem(ps, a, x[k]);
            if (!rc && prev >= 0) rc = push_elem(ps, a, GR_REF(prev));
            if (!rc && !new_alt(ps, h)) rc = -1;
            prev = h;
        }
        if (!rc) rc = push_elem(ps, seq, GR_REF(prev));
    }
    free(x);
    return rc;
}

static int parse_int(parser *ps, long *v) {
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return -1;
    long x = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        x = x * 10 + (*ps->p++ - '0');
        if (x > OSP_GRAMMAR_MAX_REPEAT) x = OSP_GRAMMAR_MAX_REPEAT + 1;
    }
    *v = x;
    return 0;
}

/* Reads one sequence into a new alternative of rule r. */
static int parse_seq(parser *ps, int32_t r, int nested) {
    ivec *seq = new_alt(ps, r);
    if (!seq) return -1;
    const int32_t alt_index = ps->rules[r].n_alts - 1;
    int32_t last = -1; /* start of the last element in seq */
    while (ps->p < ps->end) {
        /* new_alt of helper rules may move ps->rules (and so this rule's alts): re-fetch */
        seq = &ps->rules[r].alts[alt_index];
        const char *at = ps->p;
        const char c = *ps->p;
        if (c == '"') {
            ps->p++;
            last = seq->n;
            for (;;) {
                if (ps->p >= ps->end) return fail_at(ps, at, "unterminated literal%s", NULL), -1;
                if (*ps->p == '"') break;
                uint32_t cp;
                if (read_char(ps, &cp)) return -1;
                uint8_t b[4];
                const int n = utf8_encode(cp, b);
                for (int i = 0; i < n; i++) {
                    const int32_t s = byte_range_set(ps, b[i], b[i]);
                    if (s < 0 || push_elem(ps, seq, s)) return -1;
                }
            }
            ps->p++;
        } else if (c == '[' || c == '.') {
            crvec cls = {0};
            int negate = 0;
            if (c == '.') {
                ps->p++;
                negate = 1; /* the complement of nothing */
            } else {
                ps->p++;
                if (ps->p < ps->end && *ps->p == '^') negate = 1, ps->p++;
                while (1) {
                    if (ps->p >= ps->end) return free(cls.v), fail_at(ps, at, "unterminated character class%s", NULL), -1;
                    if (*ps->p == ']') break;
                    uint32_t lo, hi;
                    if (read_char(ps, &lo)) return free(cls.v), -1;
                    hi = lo;
                    if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
                        const char *rat = ps->p;
                        ps->p++;
                        if (read_char(ps, &hi)) return free(cls.v), -1;
                        if (hi < lo) return free(cls.v), fail_at(ps, rat, "range end before its start%s", NULL), -1;
                    }
                    if (cr_push(&cls, lo, hi)) return free(cls.v), nomem(ps), -1;
                }
                ps->p++;
            }
            cr_normalize(&cls);
            last = seq->n;
            const int rc = emit_class(ps, r, seq, &cls, negate);
            free(cls.v);
            if (rc) return -1;
        } else if (is_word(c)) {
            const char *name = ps->p;
            while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
            const size_t len = (size_t)(ps->p - name);
            int32_t id = find_rule(ps, name, len);
            if (id < 0) {
                id = new_rule(ps, name, len, 0);
                if (id < 0) return -1;
                ps->rules[id].first_ref = name;
            }
            seq = &ps->rules[r].alts[alt_index];
            last = seq->n;
            if (push_elem(ps, seq, GR_REF(id))) return -1;
        } else if (c == '(') {
            if (++ps->depth > MAX_DEPTH) return fail_at(ps, at, "groups nested too deep%s", NULL), -1;
            ps->p++;
            const int32_t h = helper_rule(ps, r);
            if (h < 0) return -1;
            skip_space(ps, 1);
            if (parse_alts(ps, h, 1)) return -1;
            if (ps->p >= ps->end || *ps->p != ')') return fail_at(ps, at, "'(' without its ')'%s", NULL), -1;
            ps->p++;
            ps->depth--;
            seq = &ps->rules[r].alts[alt_index];
            last = seq->n;
            if (push_elem(ps, seq, GR_REF(h))) return -1;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last < 0) return fail_at(ps, at, "'%s' with nothing before it to repeat", c == '*' ? "*" : c == '+' ? "+" : c == '?' ? "?" : "{"), -1;
            long m = 0, n = -1;
            ps->p++;
            if (c == '+') m = 1;
            else if (c == '?') n = 1;
            else if (c == '{') {
                skip_space(ps, 0);
                if (parse_int(ps, &m)) return fail_at(ps, ps->p, "expected a number after '{'%s", NULL), -1;
                skip_space(ps, 0);
                n = m;
                if (ps->p < ps->end && *ps->p == ',') {
                    ps->p++;
                    skip_space(ps, 0);
                    n = -1;
                    if (ps->p < ps->end && *ps->p != '}' && parse_int(ps, &n))
                        return fail_at(ps, ps->p, "expected a number or '}'%s", NULL), -1;
                    skip_space(ps, 0);
                }
                if (ps->p >= ps->end || *ps->p != '}') return fail_at(ps, ps->p, "expected '}'%s", NULL), -1;
                ps->p++;
                if (m > OSP_GRAMMAR_MAX_REPEAT || n > OSP_GRAMMAR_MAX_REPEAT)
                    return fail_at(ps, at, "repetition count above %s", "100000"), -1;
                if (n >= 0 && n < m) return fail_at(ps, at, "repetition {m,n} with n < m%s", NULL), -1;
            }
            if (repeat(ps, r, &ps->rules[r].alts[alt_index], last, m, n, at)) return -1;
        } else if (c == '<') {
            return fail_at(ps, at, "token references (<...>) are not supported%s", NULL), -1;
        } else break;
        skip_space(ps, nested);
    }
    return 0;
}

static int parse_alts(parser *ps, int32_t r, int nested) {
    for (;;) {
        if (parse_seq(ps, r, nested)) return -1;
        if (ps->p < ps->end && *ps->p == '|') {
            ps->p++;
            skip_space(ps, 1);
            continue;
        }
        if (!nested) { /* a following line that starts with '|' continues this rule */
            const char *save = ps->p;
            skip_space(ps, 1);
            if (ps->p < ps->end && *ps->p == '|') {
                ps->p++;
                skip_space(ps, 1);
                continue;
            }
            ps->p = save;
        }
        return 0;
    }
}

static int parse_rule(parser *ps) {
    const char *at = ps->p;
    if (!is_word(*ps->p)) {
        char s[8];
        snprintf(s, sizeof s, (unsigned char)*ps->p >= 0x20 && (unsigned char)*ps->p < 0x7F ? "'%c'" : "0x%02x",
                 (unsigned char)*ps->p);
        return fail_at(ps, at, "expected a rule name, found %s", s), -1;
    }
    while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
    const size_t len = (size_t)(ps->p - at);
    skip_space(ps, 0);
    if (ps->end - ps->p < 3 || memcmp(ps->p, "::=", 3) != 0) return fail_at(ps, ps->p, "expected '::=' after the rule name%s", NULL), -1;
    ps->p += 3;
    int32_t id = find_rule(ps, at, len);
    if (id >= 0 && ps->rules[id].defined) {
        char name[72];
        snprintf(name, sizeof name, "%.*s", (int)(len > 64 ? 64 : len), at);
        return fail_at(ps, at, "rule '%s' defined twice", name), -1;
    }
    if (id < 0 && (id = new_rule(ps, at, len, 0)) < 0) return -1;
    ps->rules[id].defined = 1;
    skip_space(ps, 1);
    if (parse_alts(ps, id, 0)) return -1;
    if (ps->p < ps->end && *ps->p != '\n') {
        const char *bad = ps->p;
        char s[8];
        snprintf(s, sizeof s, (unsigned char)*bad >= 0x20 && (unsigned char)*bad < 0x7F ? "'%c'" : "0x%02x", (unsigned char)*bad);
        return fail_at(ps, bad, *bad == ')' ? "unmatched %s" : "unexpected %s", s), -1;
    }
    return 0;
}

/* ---- checks ---------------------------------------------------------------------------------- */

/* nullable[r]: rule r can match the empty string. */
static void compute_nullable(const parser *ps, uint8_t *nullable) {
    memset(nullable, 0, (size_t)ps->n_rules);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t r = 0; r < ps->n_rules; r++) {
            if (nullable[r]) continue;
            for (int32_t a = 0; a < ps->rules[r].n_alts && !nullable[r]; a++) {
                const ivec *s = &ps->rules[r].alts[a];
                int32_t k = 0;
                while (k < s->n && GR_IS_REF(s->v[k]) && nullable[GR_REF_RULE(s->v[k])]) k++;
                if (k == s->n) nullable[r] = 1, changed = 1;
            }
        }
    }
}

/* Fails if some rule reaches itself through leading (nullable-prefixed) references. Iterative DFS. */
static int check_left_recursion(parser *ps, const uint8_t *nullable) {
    const int32_t n = ps->n_rules;
    if (n <= 0) return 0;
    uint8_t *color = calloc((size_t)n, 1); /* 0 new, 1 on the path, 2 done */
    int32_t *stk = malloc((size_t)n * 3 * sizeof *stk); /* (rule, alt, elem) frames */
    if (!color || !stk) return free(color), free(stk), nomem(ps), -1;
    int rc = 0;
    for (int32_t s0 = 0; s0 < n && !rc; s0++) {
        if (color[s0]) continue;
        int32_t sp = 0;
        stk[0] = s0, stk[1] = 0, stk[2] = 0, sp = 1, color[s0] = 1;
        while (sp > 0 && !rc) {
            int32_t *f = &stk[(sp - 1) * 3];
            const brule *b = &ps->rules[f[0]];
            if (f[1] >= b->n_alts) {
                color[f[0]] = 2, sp--;
                continue;
            }
            const ivec *s = &b->alts[f[1]];
            if (f[2] >= s->n || !GR_IS_REF(s->v[f[2]]) || (f[2] > 0 && !nullable[GR_REF_RULE(s->v[f[2] - 1])])) {
                f[1]++, f[2] = 0;
                continue;
            }
            const int32_t t = GR_REF_RULE(s->v[f[2]]);
            f[2]++;
            if (color[t] == 1) {
                char what[200];
                snprintf(what, sizeof what, "rule '%.64s' is left-recursive (through '%.64s')", ps->rules[t].name,
                         b->name);
                ps->st = osp_set_error(OSP_ERR_FORMAT, "grammar: %s%s", what,
                                       ps->rules[t].helper ? " (a repeated part that can match nothing?)" : "");
                rc = -1;
            } else if (color[t] == 0) {
                color[t] = 1;
                int32_t *g = &stk[sp * 3];
                g[0] = t, g[1] = 0, g[2] = 0, sp++;
            }
        }
    }
    free(color);
    free(stk);
    return rc;
}

/* productive[r]: rule r matches at least one (finite) string: some alternative whose elements are all
 * non-empty byte sets or productive rules (the textbook fixpoint, e.g. Hopcroft & Ullman, "useless
 * symbols"). A start rule that is not productive accepts nothing: every output would be cut by
 * max_tokens or fail. */
static void compute_productive(const parser *ps, uint8_t *productive) {
    memset(productive, 0, (size_t)ps->n_rules);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t r = 0; r < ps->n_rules; r++) {
            if (productive[r]) continue;
            for (int32_t a = 0; a < ps->rules[r].n_alts && !productive[r]; a++) {
                const ivec *s = &ps->rules[r].alts[a];
                int ok = 1;
                for (int32_t k = 0; k < s->n && ok; k++) {
                    const int32_t e = s->v[k];
                    if (GR_IS_REF(e)) ok = productive[GR_REF_RULE(e)];
                    else {
                        int any = 0;
                        for (int w = 0; w < 8; w++) any |= ps->sets[e][w] != 0;
                        ok = any;
                    }
                }
                if (ok) productive[r] = 1, changed = 1;
            }
        }
    }
}

/* ---- flattening ------------------------------------------------------------------------------ */

static osp_status finish(parser *ps, const char *root, osp_grammar **out) {
    for (int32_t r = 0; r < ps->n_rules; r++)
        if (!ps->rules[r].defined) return fail_at(ps, ps->rules[r].first_ref, "undefined rule '%s'", ps->rules[r].name);
    const int32_t root_id = find_rule(ps, root, strlen(root));
    if (root_id < 0) return ps->st = osp_set_error(OSP_ERR_FORMAT, "grammar: no rule named '%s' (the start rule)", root);
    uint8_t *nullable = malloc((size_t)ps->n_rules + 1);
    if (!nullable) return nomem(ps);
    compute_nullable(ps, nullable);
    const int lr = check_left_recursion(ps, nullable);
    if (!lr) compute_productive(ps, nullable); /* the same scratch: productive[r] now */
    const int empty = !lr && !nullable[root_id];
    free(nullable);
    if (lr) return ps->st;
    if (empty)
        return ps->st = osp_set_error(OSP_ERR_FORMAT, "grammar: rule '%.64s' matches no string (a character class that "
                                                      "allows nothing, or recursion without an end)", root);

    osp_grammar *g = calloc(1, sizeof *g);
    if (!g) return nomem(ps);
    int64_t n_alts = 0, n_elems = 0;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        n_alts += ps->rules[r].n_alts;
        for (int32_t a = 0; a < ps->rules[r].n_alts; a++) n_elems += ps->rules[r].alts[a].n + 1;
    }
    g->n_rules = ps->n_rules, g->n_alts = (int32_t)n_alts, g->n_elems = (int32_t)n_elems, g->root = root_id;
    g->rule_alt = malloc(((size_t)g->n_rules + 1) * sizeof *g->rule_alt);
    g->alt_start = malloc(((size_t)n_alts + 1) * sizeof *g->alt_start);
    g->elems = malloc(((size_t)n_elems + 1) * sizeof *g->elems);
    g->names = calloc((size_t)g->n_rules, sizeof *g->names);
    g->sets = malloc(((size_t)ps->n_sets + 1) * sizeof *g->sets);
    if (!g->rule_alt || !g->alt_start || !g->elems || !g->names || !g->sets) {
        osp_grammar_free(g);
        return nomem(ps);
    }
    int32_t ai = 0, ei = 0;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        g->rule_alt[r] = ai;
        g->names[r] = ps->rules[r].name, ps->rules[r].name = NULL;
        for (int32_t a = 0; a < ps->rules[r].n_alts; a++) {
            const ivec *s = &ps->rules[r].alts[a];
            g->alt_start[ai++] = ei;
            if (s->n) memcpy(g->elems + ei, s->v, (size_t)s->n * sizeof *s->v);
            ei += s->n;
            g->elems[ei++] = GR_END;
        }
    }
    g->rule_alt[ps->n_rules] = ai;
    g->n_sets = ps->n_sets;
    if (ps->n_sets) memcpy(g->sets, ps->sets, (size_t)ps->n_sets * sizeof *g->sets);

    /* byte classes by partition refinement: split every class by membership in each set */
    int32_t n_cls = 1;
    memset(g->byte_class, 0, sizeof g->byte_class);
    for (int32_t s = 0; s < g->n_sets && n_cls < 256; s++) {
        int16_t remap[256][2];
        memset(remap, 0xff, sizeof remap);
        int32_t nn = 0;
        uint8_t next[256];
        for (int b = 0; b < 256; b++) {
            const int in = gr_set_has(g->sets[s], (unsigned)b);
            int16_t *slot = &remap[g->byte_class[b]][in];
            if (*slot < 0) *slot = (int16_t)nn++;
            next[b] = (uint8_t)*slot;
        }
        memcpy(g->byte_class, next, 256);
        n_cls = nn;
    }
    g->n_classes = n_cls;
    for (int b = 255; b >= 0; b--) g->class_rep[g->byte_class[b]] = (uint8_t)b;
    *out = g;
    return OSP_OK;
}

static void parser_free(parser *ps) {
    for (int32_t r = 0; r < ps->n_rules; r++) {
        for (int32_t a = 0; a < ps->rules[r].n_alts; a++) free(ps->rules[r].alts[a].v);
        free(ps->rules[r].alts);
        free(ps->rules[r].name);
    }
    free(ps->rules);
    free(ps->sets);
    free(ps->set_hash);
}

osp_status osp_grammar_parse(const char *src, size_t len, const char *root, osp_grammar **out) {
    if ((!src && len) || !out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_grammar_parse: NULL argument");
    if (!root) root = "root";
    parser ps = {.src = src ? src : "", .p = src ? src : "", .end = (src ? src : "") + len, .st = OSP_OK};
    for (;;) {
        skip_space(&ps, 1);
        if (ps.p >= ps.end) break;
        if (parse_rule(&ps)) break;
    }
    osp_status st = ps.st;
    if (st == OSP_OK) st = finish(&ps, root, out);
    parser_free(&ps);
    return st;
}

void osp_grammar_free(osp_grammar *g) {
    if (!g) return;
    if (g->names)
        for (int32_t r = 0; r < g->n_rules; r++) free(g->names[r]);
    free(g->names);
    free(g->rule_alt);
    free(g->alt_start);
    free(g->elems);
    free(g->sets);
    free(g);
}

int32_t osp_grammar_n_rules(const osp_grammar *g) { return g ? g->n_rules : 0; }
int32_t osp_grammar_n_elems(const osp_grammar *g) { return g ? g->n_elems : 0; }
int32_t osp_grammar_n_byte_sets(const osp_grammar *g) { return g ? g->n_sets : 0; }

/* ---- dump ------------------------------------------------------------------------------------ */


static void dump_set(sbuf *b, const uint32_t *set) {
    char t[16];
    sb_str(b, "[");
    for (int lo = 0; lo < 256;) {
        if (!gr_set_has(set, (unsigned)lo)) {
            lo++;
            continue;
        }
        int hi = lo;
        while (hi + 1 < 256 && gr_set_has(set, (unsigned)hi + 1)) hi++;
        if (lo > 0x20 && lo < 0x7F && lo != '\\' && lo != ']' && lo != '-') snprintf(t, sizeof t, "%c", lo);
        else snprintf(t, sizeof t, "\\x%02X", lo);
        sb_str(b, t);
        if (hi > lo) {
            if (hi > 0x20 && hi < 0x7F && hi != '\\' && hi != ']' && hi != '-') snprintf(t, sizeof t, "-%c", hi);
            else snprintf(t, sizeof t, "-\\x%02X", hi);
            sb_str(b, t);
        }
        lo = hi + 1;
    }
    sb_str(b, "]");
}

char *osp_grammar_dump(const osp_grammar *g) {
    sbuf b = {0};
    sb_str(&b, "");
    for (int32_t r = 0; r < g->n_rules; r++) {
        sb_str(&b, g->names[r]);
        sb_str(&b, " ::=");
        for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            if (a > g->rule_alt[r]) sb_str(&b, " |");
            for (int32_t p = g->alt_start[a]; g->elems[p] != GR_END; p++) {
                sb_str(&b, " ");
                if (GR_IS_REF(g->elems[p])) sb_str(&b, g->names[GR_REF_RULE(g->elems[p])]);
                else dump_set(&b, g->sets[g->elems[p]]);
            }
        }
        sb_str(&b, "\n");
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
