/* Chat templates: values, scopes and the evaluator.
 *
 * Scoping follows jinja2: `if` shares its scope; each for-loop iteration gets a fresh scope whose
 * parent is the enclosing one (a `set` inside a loop never leaks out, and every iteration starts
 * from the outer value); a macro call gets a scope whose parent is the scope the macro was defined
 * in, so it sees that scope's values at call time. namespace() objects are the only mutable values.
 *
 * Work and memory are bounded (a step budget and an arena limit, the caller's or 50M steps and
 * 512 MiB), so a template cannot hang or exhaust the host; hitting either is an OSP_ERR_UNSUPPORTED
 * error naming the budget. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status_internal.h"
#include "template/template_internal.h"

#define STEP_LIMIT 50000000ull        /* the default work budget */
#define MEMORY_LIMIT ((size_t)512 << 20) /* the default memory budget */
#define CALL_DEPTH_LIMIT 100

typedef struct tscope {
    struct tscope *parent;
    tdict *vars;
} tscope;

struct trender {
    tarena arena;
    jmp_buf jb;
    osp_status status;
    char msg[768];
    int line;
    uint64_t steps, max_steps;
    int call_depth, loop_depth;
    int ctl; /* 1 break, 2 continue */
    int64_t now;
    tscope *root;
    bool taint_inputs; /* mark the request's strings (render_spans) */
    bool prov_lost;    /* an operation dropped exact provenance */
};

const ttaint tmpl_taint_all = {0};

// ---- errors and allocation ---------------------------------------------------------------------
_Noreturn void tmpl_fail(trender *r, int line, int status, const char *fmt, ...) {
    int k = snprintf(r->msg, sizeof r->msg, "line %d: ", line > 0 ? line : r->line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg + k, sizeof r->msg - (size_t)k, fmt, ap);
    va_end(ap);
    r->status = (osp_status)status;
    longjmp(r->jb, 1);
}

void *tmpl_alloc(trender *r, size_t n) {
    void *p = tarena_alloc(&r->arena, n ? n : 1);
    if (!p) tmpl_fail(r, 0, OSP_ERR_UNSUPPORTED, "template exceeds its memory budget (%zu bytes)", r->arena.limit);
    return p;
}

void tmpl_tick(trender *r, size_t n) {
    r->steps += n;
    if (r->steps > r->max_steps)
        tmpl_fail(r, 0, OSP_ERR_UNSUPPORTED, "template exceeds its work budget (%llu steps)", (unsigned long long)r->max_steps);
}

int tmpl_line(trender *r) { return r->line; }

// ---- values ------------------------------------------------------------------------------------
tval tv_str(trender *r, const char *p, size_t n) {
    char *q = tmpl_alloc(r, n + 1);
    if (n) memcpy(q, p, n);
    q[n] = 0;
    tval v = {.k = TV_STR};
    v.s.p = q;
    v.s.n = n;
    return v;
}
tval tv_cstr(const char *p) {
    tval v = {.k = TV_STR};
    v.s.p = p;
    v.s.n = strlen(p);
    return v;
}
tval tv_int(int64_t i) { return (tval){.k = TV_INT, .i = i}; }
tval tv_float(double f) { return (tval){.k = TV_FLOAT, .f = f}; }
tval tv_bool(bool b) { return (tval){.k = TV_BOOL, .i = b}; }
tval tv_none(void) { return (tval){.k = TV_NONE}; }
tval tv_undef(const char *name) {
    tval v = {.k = TV_UNDEF};
    v.s.p = name;
    v.s.n = name ? strlen(name) : 0;
    return v;
}

tlist *tl_new(trender *r, size_t cap) {
    tlist *l = tmpl_alloc(r, sizeof *l);
    l->n = 0;
    l->cap = cap;
    l->v = cap ? tmpl_alloc(r, cap * sizeof *l->v) : NULL;
    return l;
}
void tl_push(trender *r, tlist *l, tval v) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        tval *a = tmpl_alloc(r, nc * sizeof *a);
        if (l->n) memcpy(a, l->v, l->n * sizeof *a);
        l->v = a;
        l->cap = nc;
    }
    l->v[l->n++] = v;
}
tval tv_list(tlist *l) { return (tval){.k = TV_LIST, .l = l}; }

tdict *td_new(trender *r, size_t cap) {
    tdict *d = tmpl_alloc(r, sizeof *d);
    d->n = 0;
    d->cap = cap;
    d->key = cap ? tmpl_alloc(r, cap * sizeof *d->key) : NULL;
    d->val = cap ? tmpl_alloc(r, cap * sizeof *d->val) : NULL;
    return d;
}
static ptrdiff_t td_find(const tdict *d, tval k) {
    for (size_t i = 0; i < d->n; i++)
        if (tv_eq(d->key[i], k)) return (ptrdiff_t)i;
    return -1;
}
void td_set(trender *r, tdict *d, tval k, tval v) {
    ptrdiff_t i = td_find(d, k);
    if (i >= 0) {
        d->val[i] = v;
        return;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        tval *a = tmpl_alloc(r, nc * sizeof *a), *b = tmpl_alloc(r, nc * sizeof *b);
        if (d->n) {
            memcpy(a, d->key, d->n * sizeof *a);
            memcpy(b, d->val, d->n * sizeof *b);
        }
        d->key = a;
        d->val = b;
        d->cap = nc;
    }
    d->key[d->n] = k;
    d->val[d->n++] = v;
}
const tval *td_get(const tdict *d, tval k) {
    ptrdiff_t i = td_find(d, k);
    return i >= 0 ? &d->val[i] : NULL;
}
const tval *td_getc(const tdict *d, const char *k) { return td_get(d, tv_cstr(k)); }

bool tv_truthy(tval v) {
    switch (v.k) {
    case TV_UNDEF:
    case TV_NONE: return false;
    case TV_BOOL:
    case TV_INT: return v.i != 0;
    case TV_FLOAT: return v.f != 0.0;
    case TV_STR: return v.s.n != 0;
    case TV_LIST: return (v.flag & TVF_GEN) || v.l->n != 0;
    case TV_DICT: return v.d->n != 0;
    default: return true;
    }
}

static bool is_num(tval v) { return v.k == TV_INT || v.k == TV_BOOL || v.k == TV_FLOAT; }
static double num_f(tval v) { return v.k == TV_FLOAT ? v.f : (double)v.i; }

bool tv_eq(tval a, tval b) {
    if (is_num(a) && is_num(b)) {
        if (a.k != TV_FLOAT && b.k != TV_FLOAT) return a.i == b.i;
        return num_f(a) == num_f(b);
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case TV_UNDEF:
    case TV_NONE: return true;
    case TV_STR: return a.s.n == b.s.n && !memcmp(a.s.p, b.s.p, a.s.n);
    case TV_LIST:
        if (a.is_tuple != b.is_tuple || a.l->n != b.l->n || ((a.flag | b.flag) & TVF_GEN)) return a.l == b.l;
        for (size_t i = 0; i < a.l->n; i++)
            if (!tv_eq(a.l->v[i], b.l->v[i])) return false;
        return true;
    case TV_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            const tval *o = td_get(b.d, a.d->key[i]);
            if (!o || !tv_eq(a.d->val[i], *o)) return false;
        }
        return true;
    case TV_NS: return a.d == b.d;
    case TV_FUNC: return a.fn == b.fn;
    }
    return false;
}

const char *tv_type_name(tval v) {
    switch (v.k) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST: return v.is_tuple ? "tuple" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    default: return "function";
    }
}

int tv_cmp(trender *r, tval a, tval b) {
    if (is_num(a) && is_num(b)) {
        if (a.k != TV_FLOAT && b.k != TV_FLOAT) return a.i < b.i ? -1 : a.i > b.i;
        double x = num_f(a), y = num_f(b);
        return x < y ? -1 : x > y;
    }
    if (a.k == TV_STR && b.k == TV_STR) {
        size_t m = a.s.n < b.s.n ? a.s.n : b.s.n;
        int c = memcmp(a.s.p, b.s.p, m);
        if (c) return c < 0 ? -1 : 1;
        return a.s.n < b.s.n ? -1 : a.s.n > b.s.n;
    }
    if (a.k == TV_LIST && b.k == TV_LIST && a.is_tuple == b.is_tuple) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (tv_eq(a.l->v[i], b.l->v[i])) continue;
            return tv_cmp(r, a.l->v[i], b.l->v[i]);
        }
        return a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
    }
    if (a.k == TV_UNDEF || b.k == TV_UNDEF)
        tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "'%s' is undefined (compared with '<'/'>')",
                  a.k == TV_UNDEF ? (a.s.p ? a.s.p : "value") : (b.s.p ? b.s.p : "value"));
    tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "'<' not supported between '%s' and '%s'", tv_type_name(a), tv_type_name(b));
}

// ---- strings -----------------------------------------------------------------------------------
tbuf tb_make(trender *r) { return (tbuf){.r = r}; }
void tb_put(tbuf *b, const char *p, size_t n) {
    if (!n) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = tmpl_alloc(b->r, nc);
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}
void tb_putc(tbuf *b, char c) { tb_put(b, &c, 1); }
void tb_puts(tbuf *b, const char *s) { tb_put(b, s, strlen(s)); }
tval tb_val(tbuf *b) {
    tval v = {.k = TV_STR};
    v.s.p = b->p ? b->p : "";
    v.s.n = b->n;
    if (b->nsp == 1 && b->sp[0].a == 0 && b->sp[0].b == b->n) v.taint = TAINT_ALL;
    else if (b->nsp) { /* a copy: the buffer may grow (and merge its last range) afterwards */
        ttaint *t = tmpl_alloc(b->r, sizeof *t + b->nsp * sizeof(tspan));
        t->n = b->nsp;
        memcpy(t->s, b->sp, b->nsp * sizeof(tspan));
        v.taint = t;
    }
    return v;
}

// ---- provenance (taint) --------------------------------------------------------------------------
void tmpl_taint_lost(trender *r) { r->prov_lost = true; }

/* Marks output bytes [a, e) tainted; ranges arrive in increasing order (the buffer only grows). */
static void tb_taint(tbuf *b, size_t a, size_t e) {
    if (a >= e) return;
    if (b->nsp && b->sp[b->nsp - 1].b >= a) {
        if (e > b->sp[b->nsp - 1].b) b->sp[b->nsp - 1].b = e;
        return;
    }
    if (b->nsp == b->capsp) {
        size_t nc = b->capsp ? b->capsp * 2 : 8;
        tspan *q = tmpl_alloc(b->r, nc * sizeof *q);
        if (b->nsp) memcpy(q, b->sp, b->nsp * sizeof *q);
        b->sp = q;
        b->capsp = nc;
    }
    b->sp[b->nsp++] = (tspan){a, e};
}

/* First range of t whose end is past `a` (binary search). */
static size_t span_from(const ttaint *t, size_t a) {
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->s[mid].b <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

bool taint_any(tval s, size_t a, size_t e) {
    if (!s.taint || a >= e) return false;
    if (s.taint == TAINT_ALL) return true;
    size_t i = span_from(s.taint, a);
    return i < s.taint->n && s.taint->s[i].a < e;
}

void tb_taint_from(tbuf *b, size_t o0, tval s, size_t a, size_t e) {
    if (taint_any(s, a, e)) tb_taint(b, o0, b->n);
}

void tb_put_sub(tbuf *b, tval s, size_t off, size_t n) {
    const size_t o0 = b->n;
    tb_put(b, s.s.p + off, n);
    if (!s.taint || !n) return;
    if (s.taint == TAINT_ALL) {
        tb_taint(b, o0, o0 + n);
        return;
    }
    for (size_t i = span_from(s.taint, off); i < s.taint->n && s.taint->s[i].a < off + n; i++) {
        size_t x = s.taint->s[i].a > off ? s.taint->s[i].a : off, y = s.taint->s[i].b < off + n ? s.taint->s[i].b : off + n;
        tb_taint(b, o0 + (x - off), o0 + (y - off));
    }
}
void tb_put_val(tbuf *b, tval s) { tb_put_sub(b, s, 0, s.s.n); }

const ttaint *taint_slice(trender *r, tval s, size_t a, size_t e) {
    if (!s.taint || a >= e) return NULL;
    if (s.taint == TAINT_ALL) return TAINT_ALL;
    size_t i = span_from(s.taint, a), j = i;
    while (j < s.taint->n && s.taint->s[j].a < e) j++;
    if (i == j) return NULL;
    if (j - i == 1 && s.taint->s[i].a <= a && s.taint->s[i].b >= e) return TAINT_ALL;
    ttaint *t = tmpl_alloc(r, sizeof *t + (j - i) * sizeof(tspan));
    t->n = j - i;
    for (size_t k = i; k < j; k++) {
        size_t x = s.taint->s[k].a > a ? s.taint->s[k].a : a, y = s.taint->s[k].b < e ? s.taint->s[k].b : e;
        t->s[k - i] = (tspan){x - a, y - a};
    }
    return t;
}

size_t utf8_len(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}
size_t utf8_offset(const char *p, size_t n, size_t cp) {
    size_t i = 0, c = 0;
    while (i < n) {
        if (((unsigned char)p[i] & 0xC0) != 0x80) {
            if (c == cp) return i;
            c++;
        }
        i++;
    }
    return n;
}

/* Python's repr(float): the shortest digits that round-trip, fixed notation for exponents in
 * [-4, 16), else d.ddde+XX. */
static void float_repr(tbuf *b, double x) {
    if (isnan(x)) {
        tb_puts(b, "nan");
        return;
    }
    if (isinf(x)) {
        tb_puts(b, x < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    const char *s = e;
    bool neg = *s == '-';
    if (neg) s++;
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    int exp = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[64];
    int k = 0;
    if (neg) out[k++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[k++] = i < nd ? digits[i] : '0';
            out[k++] = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++) out[k++] = digits[i];
            else
                out[k++] = '0';
        }
        out[k] = 0;
    } else {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        snprintf(out + k, sizeof out - (size_t)k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    tb_puts(b, out);
}

static void str_repr(tbuf *b, tval s) {
    const char *p = s.s.p;
    const size_t n = s.s.n;
    bool has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    tb_putc(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        const size_t o0 = b->n;
        if (c == '\\') tb_puts(b, "\\\\");
        else if (c == (unsigned char)q) {
            tb_putc(b, '\\');
            tb_putc(b, (char)c);
        } else if (c == '\n') tb_puts(b, "\\n");
        else if (c == '\r') tb_puts(b, "\\r");
        else if (c == '\t') tb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            char h[8];
            snprintf(h, sizeof h, "\\x%02x", c);
            tb_puts(b, h);
        } else tb_putc(b, (char)c);
        if (s.taint) tb_taint_from(b, o0, s, i, i + 1);
    }
    tb_putc(b, q);
}

void tv_repr(trender *r, tbuf *b, tval v) {
    tmpl_tick(r, 1);
    switch (v.k) {
    case TV_STR: str_repr(b, v); return;
    case TV_LIST:
        if (v.flag & TVF_GEN) tmpl_fail(r, 0, OSP_ERR_UNSUPPORTED, "printing a generator object (add '|list')");
        tb_putc(b, v.is_tuple ? '(' : '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) tb_puts(b, ", ");
            tv_repr(r, b, v.l->v[i]);
        }
        if (v.is_tuple && v.l->n == 1) tb_putc(b, ',');
        tb_putc(b, v.is_tuple ? ')' : ']');
        return;
    case TV_DICT:
        tb_putc(b, '{');
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) tb_puts(b, ", ");
            tv_repr(r, b, v.d->key[i]);
            tb_puts(b, ": ");
            tv_repr(r, b, v.d->val[i]);
        }
        tb_putc(b, '}');
        return;
    default: tv_to_str(r, b, v); return;
    }
}

void tv_to_str(trender *r, tbuf *b, tval v) {
    char tmp[32];
    switch (v.k) {
    case TV_UNDEF: return;
    case TV_NONE: tb_puts(b, "None"); return;
    case TV_BOOL: tb_puts(b, v.i ? "True" : "False"); return;
    case TV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        tb_puts(b, tmp);
        return;
    case TV_FLOAT: float_repr(b, v.f); return;
    case TV_STR: tb_put_val(b, v); return;
    case TV_LIST:
    case TV_DICT: tv_repr(r, b, v); return;
    case TV_NS: tb_puts(b, "<Namespace>"); return;
    case TV_FUNC:
        if (v.fn->kind == TF_MACRO) tmpl_fail(r, 0, OSP_ERR_UNSUPPORTED, "printing a macro object");
        tmpl_fail(r, 0, OSP_ERR_UNSUPPORTED, "printing the function object '%s' (call it with '()')",
                  v.fn->name ? v.fn->name : "?");
    }
}

tval tv_stringify(trender *r, tval v) {
    if (v.k == TV_STR) return v;
    tbuf b = tb_make(r);
    tv_to_str(r, &b, v);
    return tb_val(&b);
}

// ---- JSON out (transformers' tojson = json.dumps(ensure_ascii=False)) ------------------------
static void json_str(tbuf *b, tval s, bool ascii) {
    const char *p = s.s.p;
    const size_t n = s.s.n;
    tb_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        const char *esc = NULL;
        char h[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            snprintf(h, sizeof h, "\\u%04x", c);
            esc = h;
        } else if (c >= 0x80 && ascii) { /* ensure_ascii: \uXXXX, surrogate pairs above U+FFFF */
            tb_put_sub(b, s, run, i - run);
            const size_t o0 = b->n, i0 = i;
            int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
            if (i + (size_t)extra >= n) extra = 0;
            uint32_t cp = extra ? (c & (0x3F >> extra)) : c;
            for (int k = 1; k <= extra; k++) cp = cp << 6 | ((unsigned char)p[i + (size_t)k] & 0x3F);
            char u[16];
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(u, sizeof u, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(u, sizeof u, "\\u%04x", cp);
            }
            tb_puts(b, u);
            i += (size_t)extra;
            if (s.taint) tb_taint_from(b, o0, s, i0, i + 1);
            run = i + 1;
            continue;
        }
        if (esc) {
            tb_put_sub(b, s, run, i - run);
            const size_t o0 = b->n;
            tb_puts(b, esc);
            if (s.taint) tb_taint_from(b, o0, s, i, i + 1);
            run = i + 1;
        }
    }
    tb_put_sub(b, s, run, n - run);
    tb_putc(b, '"');
}

static void json_newline(tbuf *b, int indent, int depth) {
    tb_putc(b, '\n');
    for (int i = 0; i < indent * depth; i++) tb_putc(b, ' ');
}

void tv_tojson(trender *r, tbuf *b, tval v, int indent, const char *item_sep, const char *key_sep, bool sort_keys,
               bool ascii, int depth) {
    tmpl_tick(r, 1);
    if (depth > 200) tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "tojson: value nested too deeply");
    switch (v.k) {
    case TV_NONE: tb_puts(b, "null"); return;
    case TV_BOOL: tb_puts(b, v.i ? "true" : "false"); return;
    case TV_INT: tv_to_str(r, b, v); return;
    case TV_FLOAT:
        if (isnan(v.f)) tb_puts(b, "NaN");
        else if (isinf(v.f)) tb_puts(b, v.f < 0 ? "-Infinity" : "Infinity");
        else float_repr(b, v.f);
        return;
    case TV_STR: json_str(b, v, ascii); return;
    case TV_LIST:
        if (v.flag & TVF_GEN) tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "tojson: Object of type generator is not JSON serializable");
        if (!v.l->n) {
            tb_puts(b, "[]");
            return;
        }
        tb_putc(b, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) tb_puts(b, item_sep);
            if (indent >= 0) json_newline(b, indent, depth + 1);
            tv_tojson(r, b, v.l->v[i], indent, item_sep, key_sep, sort_keys, ascii, depth + 1);
        }
        if (indent >= 0) json_newline(b, indent, depth);
        tb_putc(b, ']');
        return;
    case TV_DICT: {
        if (!v.d->n) {
            tb_puts(b, "{}");
            return;
        }
        size_t *ord = tmpl_alloc(r, v.d->n * sizeof *ord);
        for (size_t i = 0; i < v.d->n; i++) ord[i] = i;
        if (sort_keys) /* insertion sort: dicts in templates are small */
            for (size_t i = 1; i < v.d->n; i++)
                for (size_t j = i; j > 0 && tv_cmp(r, v.d->key[ord[j - 1]], v.d->key[ord[j]]) > 0; j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        tb_putc(b, '{');
        for (size_t k = 0; k < v.d->n; k++) {
            size_t i = ord[k];
            if (k) tb_puts(b, item_sep);
            if (indent >= 0) json_newline(b, indent, depth + 1);
            tval key = v.d->key[i];
            if (key.k == TV_STR) json_str(b, key, ascii);
            else if (key.k == TV_INT || key.k == TV_FLOAT) {
                tb_putc(b, '"');
                tv_to_str(r, b, key);
                tb_putc(b, '"');
            } else if (key.k == TV_BOOL) tb_puts(b, key.i ? "\"true\"" : "\"false\"");
            else if (key.k == TV_NONE) tb_puts(b, "\"null\"");
            else tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "tojson: keys must be str, int, float, bool or None, not %s", tv_type_name(key));
            tb_puts(b, key_sep);
            tv_tojson(r, b, v.d->val[i], indent, item_sep, key_sep, sort_keys, ascii, depth + 1);
        }
        if (indent >= 0) json_newline(b, indent, depth);
        tb_putc(b, '}');
        return;
    }
    default:
        tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "tojson: Object of type %s is not JSON serializable", tv_type_name(v));
    }
}

// ---- scopes ------------------------------------------------------------------------------------
static tscope *scope_new(trender *r, tscope *parent) {
    tscope *s = tmpl_alloc(r, sizeof *s);
    s->parent = parent;
    s->vars = td_new(r, 0);
    return s;
}

static const char *const k_globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};

static tval scope_get(trender *r, tscope *s, const char *name) {
    tval k = tv_cstr(name);
    for (; s; s = s->parent) {
        const tval *v = td_get(s->vars, k);
        if (v) return *v;
    }
    for (int i = 0; k_globals[i]; i++)
        if (!strcmp(k_globals[i], name)) {
            tfunc *f = tmpl_alloc(r, sizeof *f);
            memset(f, 0, sizeof *f);
            f->kind = TF_BUILTIN;
            f->name = k_globals[i];
            return (tval){.k = TV_FUNC, .fn = f};
        }
    return tv_undef(name);
}

static void scope_set(trender *r, tscope *s, const char *name, tval v) { td_set(r, s->vars, tv_cstr(name), v); }

// ---- expressions -------------------------------------------------------------------------------
static tval eval(trender *r, const tnode *n, tscope *sc);
static void exec(trender *r, const tnode *n, tscope *sc, tbuf *out);

static const char *undef_name(tval v) { return v.s.p ? v.s.p : "value"; }

static _Noreturn void fail_undef(trender *r, const tnode *n, tval v) {
    tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "'%s' is undefined", undef_name(v));
}

static int64_t checked(trender *r, const tnode *n, bool ovf, int64_t x) {
    if (ovf) tmpl_fail(r, n->line, OSP_ERR_UNSUPPORTED, "integer overflow (osprey's integers are 64-bit)");
    return x;
}
static int64_t add_ck(trender *r, const tnode *n, int64_t a, int64_t b) {
    int64_t x = 0;
    bool o = __builtin_add_overflow(a, b, &x);
    return checked(r, n, o, x);
}
static int64_t sub_ck(trender *r, const tnode *n, int64_t a, int64_t b) {
    int64_t x = 0;
    bool o = __builtin_sub_overflow(a, b, &x);
    return checked(r, n, o, x);
}
static int64_t mul_ck(trender *r, const tnode *n, int64_t a, int64_t b) {
    int64_t x = 0;
    bool o = __builtin_mul_overflow(a, b, &x);
    return checked(r, n, o, x);
}

static tval arith(trender *r, const tnode *n, int op, tval a, tval b) {
    if (a.k == TV_UNDEF) fail_undef(r, n, a);
    if (b.k == TV_UNDEF) fail_undef(r, n, b);
    const bool ints = (a.k == TV_INT || a.k == TV_BOOL) && (b.k == TV_INT || b.k == TV_BOOL);
    if (is_num(a) && is_num(b)) {
        switch (op) {
        case TOK_ADD:
            if (ints) return tv_int(add_ck(r, n, a.i, b.i));
            return tv_float(num_f(a) + num_f(b));
        case TOK_SUB:
            if (ints) return tv_int(sub_ck(r, n, a.i, b.i));
            return tv_float(num_f(a) - num_f(b));
        case TOK_MUL:
            if (ints) return tv_int(mul_ck(r, n, a.i, b.i));
            return tv_float(num_f(a) * num_f(b));
        case TOK_DIV:
            if (num_f(b) == 0.0) tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "division by zero");
            return tv_float(num_f(a) / num_f(b));
        case TOK_FLOORDIV:
        case TOK_MOD:
            if (ints) {
                if (b.i == 0) tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "integer division or modulo by zero");
                if (a.i == INT64_MIN && b.i == -1) checked(r, n, true, 0);
                int64_t q = a.i / b.i, m = a.i % b.i;
                if (m != 0 && ((m < 0) != (b.i < 0))) q--, m += b.i;
                return tv_int(op == TOK_MOD ? m : q);
            } else {
                double x1 = num_f(a), y = num_f(b);
                if (y == 0.0) tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "float division or modulo by zero");
                double m = fmod(x1, y);
                if (m != 0 && ((m < 0) != (y < 0))) m += y;
                return tv_float(op == TOK_MOD ? m : floor(x1 / y));
            }
        case TOK_POW:
            if (ints && b.i >= 0) {
                int64_t res = 1, base = a.i, e = b.i;
                while (e > 0) {
                    if (e & 1) res = mul_ck(r, n, res, base);
                    e >>= 1;
                    if (e) base = mul_ck(r, n, base, base);
                }
                return tv_int(res);
            }
            return tv_float(pow(num_f(a), num_f(b)));
        }
    }
    if (op == TOK_ADD && a.k == TV_STR && b.k == TV_STR) {
        const bool ma = a.flag & TVF_MARKUP, mb = b.flag & TVF_MARKUP;
        if (ma != mb) { /* Markup + str escapes the str */
            if (ma) b = tmpl_html_escape(r, b);
            else a = tmpl_html_escape(r, a);
        }
        tbuf t = tb_make(r);
        tb_put_val(&t, a);
        tb_put_val(&t, b);
        tval v = tb_val(&t);
        v.flag = (ma || mb) ? TVF_MARKUP : 0;
        return v;
    }
    if (op == TOK_ADD && ((a.k == TV_STR && (a.flag & TVF_MARKUP)) || (b.k == TV_STR && (b.flag & TVF_MARKUP))))
        tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "unsupported operand types for +: '%s' and '%s'",
                  a.k == TV_STR ? "Markup" : tv_type_name(a), b.k == TV_STR ? "Markup" : tv_type_name(b));
    if (op == TOK_ADD && a.k == TV_LIST && b.k == TV_LIST && a.is_tuple == b.is_tuple && !((a.flag | b.flag) & TVF_GEN)) {
        tlist *l = tl_new(r, a.l->n + b.l->n);
        for (size_t i = 0; i < a.l->n; i++) tl_push(r, l, a.l->v[i]);
        for (size_t i = 0; i < b.l->n; i++) tl_push(r, l, b.l->v[i]);
        tval v = tv_list(l);
        v.is_tuple = a.is_tuple;
        return v;
    }
    if (op == TOK_MUL && (a.k == TV_STR || a.k == TV_LIST) && (b.k == TV_INT || b.k == TV_BOOL)) {
        int64_t times = b.i < 0 ? 0 : b.i;
        size_t unit = a.k == TV_STR ? a.s.n : a.l->n;
        if (unit && (uint64_t)times > (uint64_t)(64u << 20) / unit)
            tmpl_fail(r, n->line, OSP_ERR_UNSUPPORTED, "repetition result too large");
        tmpl_tick(r, (size_t)times * (unit + 1));
        if (a.k == TV_STR) {
            tbuf t = tb_make(r);
            for (int64_t i = 0; i < times; i++) tb_put_val(&t, a);
            return tb_val(&t);
        }
        tlist *l = tl_new(r, unit * (size_t)times);
        for (int64_t i = 0; i < times; i++)
            for (size_t j = 0; j < unit; j++) tl_push(r, l, a.l->v[j]);
        tval v = tv_list(l);
        v.is_tuple = a.is_tuple;
        return v;
    }
    if (op == TOK_MUL && (b.k == TV_STR || b.k == TV_LIST) && (a.k == TV_INT || a.k == TV_BOOL))
        return arith(r, n, op, b, a);
    if (op == TOK_MOD && a.k == TV_STR)
        tmpl_fail(r, n->line, OSP_ERR_UNSUPPORTED, "printf-style string formatting with '%%'");
    static const char *const names[] = {[TOK_ADD] = "+", [TOK_SUB] = "-", [TOK_MUL] = "*", [TOK_DIV] = "/",
                                        [TOK_FLOORDIV] = "//", [TOK_MOD] = "%", [TOK_POW] = "**"};
    tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "unsupported operand types for %s: '%s' and '%s'", names[op],
              tv_type_name(a), tv_type_name(b));
}

static bool contains(trender *r, const tnode *n, tval item, tval cont) {
    switch (cont.k) {
    case TV_UNDEF: return false;
    case TV_STR: {
        if (item.k != TV_STR)
            tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "'in <string>' requires string as left operand, not %s",
                      tv_type_name(item));
        if (!item.s.n) return true;
        if (item.s.n > cont.s.n) return false;
        return memmem(cont.s.p, cont.s.n, item.s.p, item.s.n) != NULL;
    }
    case TV_LIST:
        for (size_t i = 0; i < cont.l->n; i++)
            if (tv_eq(item, cont.l->v[i])) return true;
        return false;
    case TV_DICT: return td_get(cont.d, item) != NULL;
    default:
        tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "argument of type '%s' is not iterable", tv_type_name(cont));
    }
}

tlist *tmpl_iterate(trender *r, tval v) {
    switch (v.k) {
    case TV_UNDEF: return tl_new(r, 0);
    case TV_LIST: return v.l;
    case TV_DICT: {
        tlist *l = tl_new(r, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) tl_push(r, l, v.d->key[i]);
        return l;
    }
    case TV_STR: {
        tlist *l = tl_new(r, v.s.n);
        for (size_t i = 0; i < v.s.n;) {
            size_t j = i + 1;
            while (j < v.s.n && ((unsigned char)v.s.p[j] & 0xC0) == 0x80) j++;
            tval c = {.k = TV_STR};
            c.s.p = v.s.p + i;
            c.s.n = j - i;
            c.taint = taint_slice(r, v, i, j);
            tl_push(r, l, c);
            i = j;
        }
        return l;
    }
    default:
        tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "'%s' object is not iterable", tv_type_name(v));
    }
}

static int64_t slice_idx(trender *r, const tnode *n, tval v, int64_t dflt) {
    if (v.k == TV_NONE || v.k == TV_UNDEF) return dflt;
    if (v.k != TV_INT && v.k != TV_BOOL)
        tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "slice indices must be integers or None, not %s", tv_type_name(v));
    return v.i;
}

static tval do_slice(trender *r, const tnode *n, tval obj, tval a, tval b, tval c) {
    if (obj.k == TV_UNDEF) fail_undef(r, n, obj);
    if (obj.k != TV_STR && obj.k != TV_LIST) return tv_undef("slice");
    tlist *items = obj.k == TV_STR ? tmpl_iterate(r, obj) : obj.l;
    const int64_t len = (int64_t)items->n;
    const int64_t step = slice_idx(r, n, c, 1);
    if (step == 0) tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "slice step cannot be zero");
    int64_t lo, hi;
    if (step > 0) {
        lo = slice_idx(r, n, a, 0);
        hi = slice_idx(r, n, b, len);
        if (lo < 0) lo = lo + len < 0 ? 0 : lo + len;
        if (hi < 0) hi = hi + len < 0 ? 0 : hi + len;
        if (lo > len) lo = len;
        if (hi > len) hi = len;
    } else {
        lo = slice_idx(r, n, a, len - 1);
        hi = slice_idx(r, n, b, -len - 1);
        if (lo < 0) lo = lo + len < 0 ? -1 : lo + len;
        else if (lo >= len) lo = len - 1;
        if (hi < 0) hi = hi + len < 0 ? -1 : hi + len;
        else if (hi >= len) hi = len - 1;
    }
    tlist *out = tl_new(r, 0);
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) tl_push(r, out, items->v[i]);
    tmpl_tick(r, out->n);
    if (obj.k == TV_STR) {
        tbuf t = tb_make(r);
        for (size_t i = 0; i < out->n; i++) tb_put_val(&t, out->v[i]);
        return tb_val(&t);
    }
    tval v = tv_list(out);
    v.is_tuple = obj.is_tuple;
    return v;
}

typedef struct targs {
    int n, nkw;
    tval *v, *kwv;
    const char **kwn;
} targs;

static targs eval_args(trender *r, const tnode *n, tscope *sc, tval first, bool has_first) {
    targs a = {0};
    a.n = n->nkid + has_first;
    a.v = tmpl_alloc(r, (size_t)(a.n + 1) * sizeof *a.v);
    int k = 0;
    if (has_first) a.v[k++] = first;
    for (int i = 0; i < n->nkid; i++) a.v[k++] = eval(r, n->kid[i], sc);
    a.nkw = n->nkw;
    a.kwn = (const char **)n->kwname;
    a.kwv = tmpl_alloc(r, (size_t)(a.nkw + 1) * sizeof *a.kwv);
    for (int i = 0; i < n->nkw; i++) a.kwv[i] = eval(r, n->kwval[i], sc);
    return a;
}

static tval call_macro(trender *r, const tfunc *f, int nargs, const tval *args, int nkw, const char **kwn,
                       const tval *kwv) {
    const tnode *m = f->macro;
    if (++r->call_depth > CALL_DEPTH_LIMIT)
        tmpl_fail(r, m->line, OSP_ERR_UNSUPPORTED, "macro calls nested more than %d deep", CALL_DEPTH_LIMIT);
    tscope *sc = scope_new(r, f->defs);
    tlist *varargs = tl_new(r, 0);
    tdict *kwargs = td_new(r, 0);
    for (int i = 0; i < nargs; i++) {
        if (i < m->nnames) scope_set(r, sc, m->names[i], args[i]);
        else tl_push(r, varargs, args[i]);
    }
    for (int i = 0; i < nkw; i++) {
        int p = -1;
        for (int j = 0; j < m->nnames; j++)
            if (!strcmp(m->names[j], kwn[i])) p = j;
        if (p >= 0 && p < nargs)
            tmpl_fail(r, m->line, OSP_ERR_INVALID_ARG, "macro '%s' got multiple values for argument '%s'",
                      m->name ? m->name : "caller", kwn[i]);
        if (p >= 0) scope_set(r, sc, kwn[i], kwv[i]);
        else if (!strcmp(kwn[i], "caller")) scope_set(r, sc, "caller", kwv[i]);
        else td_set(r, kwargs, tv_cstr(kwn[i]), kwv[i]);
    }
    for (int j = nargs; j < m->nnames; j++) {
        if (td_getc(sc->vars, m->names[j])) continue;
        tval v = tv_undef(m->names[j]);
        for (int d = 0; d < m->nkw; d++)
            if (!strcmp(m->kwname[d], m->names[j])) v = eval(r, m->kwval[d], sc);
        scope_set(r, sc, m->names[j], v);
    }
    if (varargs->n && m->type == N_MACRO)
        tmpl_fail(r, m->line, OSP_ERR_INVALID_ARG, "macro '%s' takes not more than %d argument(s)", m->name,
                  m->nnames);
    scope_set(r, sc, "varargs", tv_list(varargs));
    scope_set(r, sc, "kwargs", (tval){.k = TV_DICT, .d = kwargs});
    if (f->caller) {
        tfunc *c = tmpl_alloc(r, sizeof *c);
        memset(c, 0, sizeof *c);
        c->kind = TF_MACRO;
        c->macro = f->caller;
        c->defs = f->caller_scope;
        scope_set(r, sc, "caller", (tval){.k = TV_FUNC, .fn = c});
    }
    tbuf out = tb_make(r);
    const int saved_loop = r->loop_depth, saved_line = r->line;
    r->loop_depth = 0;
    exec(r, m->b, sc, &out);
    r->loop_depth = saved_loop;
    r->line = saved_line;
    r->ctl = 0;
    r->call_depth--;
    return tb_val(&out);
}

tval tmpl_call(trender *r, tval fn, int nargs, const tval *args, int nkw, const char **kwn, const tval *kwv) {
    if (fn.k == TV_UNDEF) tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "'%s' is undefined (called as a function)", undef_name(fn));
    if (fn.k != TV_FUNC) tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "'%s' object is not callable", tv_type_name(fn));
    switch (fn.fn->kind) {
    case TF_MACRO: return call_macro(r, fn.fn, nargs, args, nkw, kwn, kwv);
    case TF_METHOD: return tmpl_call_method(r, fn.fn->self, fn.fn->name, nargs, args, nkw, kwn, kwv);
    default: return tmpl_call_global(r, fn.fn->name, nargs, args, nkw, kwn, kwv);
    }
}

/* strftime_now and raise_exception need the render state, so they live here. */
tval tmpl_strftime_now(trender *r, tval fmt);
tval tmpl_strftime_now(trender *r, tval fmt) {
    if (fmt.k != TV_STR) tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "strftime_now() needs a format string");
    time_t t = r->now ? (time_t)r->now : time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    char fbuf[256], out[1024];
    if (fmt.s.n >= sizeof fbuf) tmpl_fail(r, 0, OSP_ERR_UNSUPPORTED, "strftime_now() format longer than 255 bytes");
    memcpy(fbuf, fmt.s.p, fmt.s.n);
    fbuf[fmt.s.n] = 0;
    size_t k = strftime(out, sizeof out, fbuf, &tm);
    if (fmt.taint) tmpl_taint_lost(r); /* the output's bytes cannot be traced to the format's */
    return tv_str(r, out, k);
}

static tval eval(trender *r, const tnode *n, tscope *sc) {
    r->line = n->line;
    tmpl_tick(r, 1);
    switch (n->type) {
    case N_LIT: return n->lit;
    case N_NAME: {
        tval v = scope_get(r, sc, n->name);
        return v;
    }
    case N_ATTR: {
        tval o = eval(r, n->a, sc);
        r->line = n->line;
        if (o.k == TV_UNDEF) fail_undef(r, n, o);
        return tmpl_getattr(r, o, n->name);
    }
    case N_ITEM: {
        tval o = eval(r, n->a, sc), k = eval(r, n->b, sc);
        r->line = n->line;
        if (o.k == TV_UNDEF) fail_undef(r, n, o);
        return tmpl_getitem(r, o, k);
    }
    case N_SLICE: {
        tval o = eval(r, n->a, sc);
        tval a = n->b ? eval(r, n->b, sc) : tv_none(), b = n->c ? eval(r, n->c, sc) : tv_none(),
             c = n->d ? eval(r, n->d, sc) : tv_none();
        r->line = n->line;
        return do_slice(r, n, o, a, b, c);
    }
    case N_CALL: {
        tval fn = eval(r, n->a, sc);
        targs a = eval_args(r, n, sc, tv_none(), false);
        r->line = n->line;
        return tmpl_call(r, fn, a.n, a.v, a.nkw, a.kwn, a.kwv);
    }
    case N_FILTER: {
        tval in = eval(r, n->a, sc);
        targs a = eval_args(r, n, sc, tv_none(), false);
        r->line = n->line;
        return tmpl_filter(r, n->name, in, a.n, a.v, a.nkw, a.kwn, a.kwv);
    }
    case N_TEST: {
        tval in = eval(r, n->a, sc);
        targs a = eval_args(r, n, sc, tv_none(), false);
        r->line = n->line;
        bool b = tmpl_test(r, n->name, in, a.n, a.v);
        return tv_bool(n->neg ? !b : b);
    }
    case N_BIN: {
        tval a = eval(r, n->a, sc), b = eval(r, n->b, sc);
        r->line = n->line;
        switch (n->op) {
        case TOK_EQ: return tv_bool(tv_eq(a, b));
        case TOK_NE: return tv_bool(!tv_eq(a, b));
        case TOK_LT: return tv_bool(tv_cmp(r, a, b) < 0);
        case TOK_LTEQ: return tv_bool(tv_cmp(r, a, b) <= 0);
        case TOK_GT: return tv_bool(tv_cmp(r, a, b) > 0);
        case TOK_GTEQ: return tv_bool(tv_cmp(r, a, b) >= 0);
        case TOK_IN: return tv_bool(contains(r, n, a, b));
        case TOK_NOTIN: return tv_bool(!contains(r, n, a, b));
        default: return arith(r, n, n->op, a, b);
        }
    }
    case N_NEG:
    case N_POS: {
        tval a = eval(r, n->a, sc);
        if (a.k == TV_UNDEF) fail_undef(r, n, a);
        if (a.k == TV_FLOAT) return tv_float(n->type == N_NEG ? -a.f : a.f);
        if (a.k == TV_INT || a.k == TV_BOOL) {
            if (n->type == N_POS) return tv_int(a.i);
            if (a.i == INT64_MIN) checked(r, n, true, 0);
            return tv_int(-a.i);
        }
        tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "bad operand type for unary %c: '%s'", n->type == N_NEG ? '-' : '+',
                  tv_type_name(a));
    }
    case N_NOT: return tv_bool(!tv_truthy(eval(r, n->a, sc)));
    case N_AND: {
        tval a = eval(r, n->a, sc);
        return tv_truthy(a) ? eval(r, n->b, sc) : a;
    }
    case N_OR: {
        tval a = eval(r, n->a, sc);
        return tv_truthy(a) ? a : eval(r, n->b, sc);
    }
    case N_COND:
        if (tv_truthy(eval(r, n->a, sc))) return eval(r, n->b, sc);
        return n->c ? eval(r, n->c, sc) : tv_undef("else");
    case N_LIST:
    case N_TUPLE: {
        tlist *l = tl_new(r, (size_t)n->nkid);
        for (int i = 0; i < n->nkid; i++) tl_push(r, l, eval(r, n->kid[i], sc));
        tval v = tv_list(l);
        v.is_tuple = n->type == N_TUPLE;
        return v;
    }
    case N_DICT: {
        tdict *d = td_new(r, (size_t)n->nkid / 2);
        for (int i = 0; i + 1 < n->nkid; i += 2) {
            tval k = eval(r, n->kid[i], sc);
            if (k.k == TV_LIST && !k.is_tuple) tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "unhashable type: 'list'");
            if (k.k == TV_DICT || k.k == TV_UNDEF)
                tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "unhashable type: '%s'", tv_type_name(k));
            td_set(r, d, k, eval(r, n->kid[i + 1], sc));
        }
        return (tval){.k = TV_DICT, .d = d};
    }
    case N_CONCAT: {
        tbuf t = tb_make(r);
        for (int i = 0; i < n->nkid; i++) tv_to_str(r, &t, eval(r, n->kid[i], sc));
        return tb_val(&t);
    }
    default: tmpl_fail(r, n->line, OSP_ERR_INTERNAL, "bad expression node %d", n->type);
    }
}

// ---- statements --------------------------------------------------------------------------------
static void assign(trender *r, const tnode *n, tscope *sc, tval v) {
    if (n->nnames == 1) {
        scope_set(r, sc, n->names[0], v);
        return;
    }
    if (v.k == TV_UNDEF) fail_undef(r, n, v);
    tlist *items = tmpl_iterate(r, v);
    if (items->n != (size_t)n->nnames)
        tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "cannot unpack %zu values into %d names", items->n, n->nnames);
    for (int i = 0; i < n->nnames; i++) scope_set(r, sc, n->names[i], items->v[i]);
}

static tval apply_chain(trender *r, const tnode *chain, tscope *sc, tval body) {
    tscope *h = scope_new(r, sc);
    scope_set(r, h, TMPL_HOLDER, body);
    return eval(r, chain, h);
}

static void exec_for(trender *r, const tnode *n, tscope *sc, tbuf *out) {
    tval it = eval(r, n->a, sc);
    r->line = n->line;
    if (it.k == TV_NONE) tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "'NoneType' object is not iterable (for loop)");
    tlist *items = tmpl_iterate(r, it);
    if (n->b) { /* the filtering `if` sees the target bound */
        tlist *kept = tl_new(r, 0);
        for (size_t i = 0; i < items->n; i++) {
            tscope *t = scope_new(r, sc);
            assign(r, n, t, items->v[i]);
            if (tv_truthy(eval(r, n->b, t))) tl_push(r, kept, items->v[i]);
        }
        items = kept;
    }
    if (!items->n) {
        if (n->d) exec(r, n->d, sc, out);
        return;
    }
    const int64_t len = (int64_t)items->n;
    r->loop_depth++;
    for (int64_t i = 0; i < len; i++) {
        tmpl_tick(r, 1);
        tscope *t = scope_new(r, sc);
        assign(r, n, t, items->v[i]);
        tdict *loop = td_new(r, 12);
        td_set(r, loop, tv_cstr("index"), tv_int(i + 1));
        td_set(r, loop, tv_cstr("index0"), tv_int(i));
        td_set(r, loop, tv_cstr("revindex"), tv_int(len - i));
        td_set(r, loop, tv_cstr("revindex0"), tv_int(len - i - 1));
        td_set(r, loop, tv_cstr("first"), tv_bool(i == 0));
        td_set(r, loop, tv_cstr("last"), tv_bool(i == len - 1));
        td_set(r, loop, tv_cstr("length"), tv_int(len));
        td_set(r, loop, tv_cstr("depth"), tv_int(1));
        td_set(r, loop, tv_cstr("depth0"), tv_int(0));
        if (i > 0) td_set(r, loop, tv_cstr("previtem"), items->v[i - 1]);
        if (i + 1 < len) td_set(r, loop, tv_cstr("nextitem"), items->v[i + 1]);
        tval lv = {.k = TV_NS, .flag = TVF_LOOP, .d = loop};
        scope_set(r, t, "loop", lv);
        exec(r, n->c, t, out);
        if (r->ctl == 1) {
            r->ctl = 0;
            break;
        }
        r->ctl = 0;
    }
    r->loop_depth--;
}

static void exec(trender *r, const tnode *n, tscope *sc, tbuf *out) {
    r->line = n->line;
    tmpl_tick(r, 1);
    switch (n->type) {
    case N_BODY:
        for (int i = 0; i < n->nkid && !r->ctl; i++) exec(r, n->kid[i], sc, out);
        return;
    case N_TEXT: tb_put(out, n->lit.s.p, n->lit.s.n); return;
    case N_OUT: tv_to_str(r, out, eval(r, n->a, sc)); return;
    case N_IF:
        for (const tnode *b = n; b;) {
            if (b->type != N_IF) {
                exec(r, b, sc, out);
                return;
            }
            if (tv_truthy(eval(r, b->a, sc))) {
                exec(r, b->b, sc, out);
                return;
            }
            b = b->c;
        }
        return;
    case N_FOR: exec_for(r, n, sc, out); return;
    case N_SET: {
        tval v = eval(r, n->a, sc);
        r->line = n->line;
        if (n->b) {
            tval o = eval(r, n->b, sc);
            if (o.k != TV_NS || o.d == NULL)
                tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "cannot assign attribute on non-namespace object '%s'",
                          n->b->name);
            if (o.flag & TVF_LOOP)
                tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "cannot assign attribute on the loop object");
            td_set(r, o.d, tv_cstr(n->name), v);
            return;
        }
        assign(r, n, sc, v);
        return;
    }
    case N_SETBLOCK: {
        tbuf body = tb_make(r);
        exec(r, n->a, sc, &body);
        tval v = tb_val(&body);
        if (n->b) v = apply_chain(r, n->b, sc, v);
        scope_set(r, sc, n->name, v);
        return;
    }
    case N_FILTERBLOCK: {
        tbuf body = tb_make(r);
        exec(r, n->a, sc, &body);
        tv_to_str(r, out, apply_chain(r, n->b, sc, tb_val(&body)));
        return;
    }
    case N_MACRO: {
        tfunc *f = tmpl_alloc(r, sizeof *f);
        memset(f, 0, sizeof *f);
        f->kind = TF_MACRO;
        f->name = n->name;
        f->macro = n;
        f->defs = sc;
        scope_set(r, sc, n->name, (tval){.k = TV_FUNC, .fn = f});
        return;
    }
    case N_CALLBLOCK: {
        const tnode *call = n->a;
        tval fn = eval(r, call->a, sc);
        if (fn.k != TV_FUNC || fn.fn->kind != TF_MACRO)
            tmpl_fail(r, n->line, OSP_ERR_INVALID_ARG, "a call block needs a macro, got '%s'", tv_type_name(fn));
        targs a = eval_args(r, call, sc, tv_none(), false);
        tfunc *f = tmpl_alloc(r, sizeof *f);
        *f = *fn.fn;
        f->caller = n;
        f->caller_scope = sc;
        tv_to_str(r, out, call_macro(r, f, a.n, a.v, a.nkw, a.kwn, a.kwv));
        return;
    }
    case N_BREAK:
    case N_CONTINUE:
        if (!r->loop_depth) tmpl_fail(r, n->line, OSP_ERR_FORMAT, "'%s' outside a loop", n->type == N_BREAK ? "break" : "continue");
        r->ctl = n->type == N_BREAK ? 1 : 2;
        return;
    default: tmpl_fail(r, n->line, OSP_ERR_INTERNAL, "bad statement node %d", n->type);
    }
}

// ---- inputs and the entry point ----------------------------------------------------------------
/* Request data: with taint on, every string (values and object keys) is marked TAINT_ALL. */
static tval from_json(trender *r, json_t *j, int depth, bool taint) {
    if (depth > 128) tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "input JSON nested more than 128 levels deep");
    switch (json_typeof(j)) {
    case JSON_NULL: return tv_none();
    case JSON_TRUE: return tv_bool(true);
    case JSON_FALSE: return tv_bool(false);
    case JSON_INTEGER: return tv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return tv_float(json_real_value(j));
    case JSON_STRING: {
        tval v = tv_str(r, json_string_value(j), json_string_length(j));
        if (taint) v.taint = TAINT_ALL;
        return v;
    }
    case JSON_ARRAY: {
        tlist *l = tl_new(r, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) tl_push(r, l, from_json(r, json_array_get(j, i), depth + 1, taint));
        return tv_list(l);
    }
    case JSON_OBJECT: {
        tdict *d = td_new(r, json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            tval key = tv_str(r, k, strlen(k));
            if (taint) key.taint = TAINT_ALL;
            td_set(r, d, key, from_json(r, v, depth + 1, taint));
        }
        return (tval){.k = TV_DICT, .d = d};
    }
    }
    return tv_none();
}

/* Parses one input; jansson's objects are freed before any jump can happen. */
static tval input_json(trender *r, const char *what, const char *text, int want) {
    json_error_t err;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!j) tmpl_fail(r, -1, OSP_ERR_INVALID_ARG, "%s: invalid JSON at line %d column %d: %s", what, err.line, err.column, err.text);
    if (want >= 0 && json_typeof(j) != (json_type)want) {
        json_decref(j);
        tmpl_fail(r, -1, OSP_ERR_INVALID_ARG, "%s must be a JSON %s", what, want == JSON_ARRAY ? "array" : "object");
    }
    /* from_json may jump (memory limit): keep the json_t reachable to free it on the error path */
    tval v;
    json_t *volatile hold = j;
    jmp_buf saved;
    memcpy(saved, r->jb, sizeof saved);
    if (setjmp(r->jb)) {
        json_decref(hold);
        memcpy(r->jb, saved, sizeof saved);
        longjmp(r->jb, 1);
    }
    v = from_json(r, j, 0, r->taint_inputs);
    memcpy(r->jb, saved, sizeof saved);
    json_decref(j);
    return v;
}

static osp_status render(const osp_chat_template *t, const osp_chat_template_inputs *in, bool spans,
                         osp_chat_template_output *o) {
    if (!t || !in || !o) return osp_set_error(OSP_ERR_INVALID_ARG, "chat template render: NULL argument");
    *o = (osp_chat_template_output){0};
    if (!in->messages_json) return osp_set_error(OSP_ERR_INVALID_ARG, "chat template render: messages are required");
    trender *r = calloc(1, sizeof *r);
    if (!r) return osp_set_error(OSP_ERR_NOMEM, "chat template render: out of memory");
    r->arena.limit = in->max_memory ? in->max_memory : MEMORY_LIMIT;
    r->max_steps = in->max_steps ? in->max_steps : STEP_LIMIT;
    r->now = in->now;
    r->taint_inputs = spans;
    if (setjmp(r->jb)) {
        osp_status s = r->status;
        if (r->msg[0] == 'l' && !strncmp(r->msg, "line -1: ", 9)) osp_set_error(s, "chat template: %s", r->msg + 9);
        else osp_set_error(s, "chat template: %s", r->msg);
        tarena_free(&r->arena);
        free(r);
        return s;
    }
    tscope *root = scope_new(r, NULL);
    r->root = root;
    scope_set(r, root, "messages", input_json(r, "messages", in->messages_json, JSON_ARRAY));
    scope_set(r, root, "tools", in->tools_json ? input_json(r, "tools", in->tools_json, JSON_ARRAY) : tv_none());
    scope_set(r, root, "documents",
              in->documents_json ? input_json(r, "documents", in->documents_json, JSON_ARRAY) : tv_none());
    scope_set(r, root, "add_generation_prompt", tv_bool(in->add_generation_prompt != 0));
    if (in->bos_token) scope_set(r, root, "bos_token", tv_cstr(in->bos_token));
    if (in->eos_token) scope_set(r, root, "eos_token", tv_cstr(in->eos_token));
    if (in->kwargs_json) {
        tval kw = input_json(r, "chat_template_kwargs", in->kwargs_json, JSON_OBJECT);
        for (size_t i = 0; i < kw.d->n; i++) td_set(r, root->vars, kw.d->key[i], kw.d->val[i]);
    }
    tbuf b = tb_make(r);
    r->line = 1;
    exec(r, t->root, root, &b);
    char *s = malloc(b.n + 1);
    osp_text_span *sp = spans && b.nsp ? malloc(b.nsp * sizeof *sp) : NULL;
    if (!s || (spans && b.nsp && !sp)) {
        free(s);
        free(sp);
        tarena_free(&r->arena);
        free(r);
        return osp_set_error(OSP_ERR_NOMEM, "chat template render: out of memory");
    }
    if (b.n) memcpy(s, b.p, b.n);
    s[b.n] = 0;
    o->text = s;
    o->len = b.n;
    if (sp) {
        for (size_t i = 0; i < b.nsp; i++) sp[i] = (osp_text_span){b.sp[i].a, b.sp[i].b - b.sp[i].a};
        o->tainted = sp;
        o->n_tainted = b.nsp;
    }
    o->provenance_lost = r->prov_lost;
    tarena_free(&r->arena);
    free(r);
    return OSP_OK;
}

osp_status osp_chat_template_render(const osp_chat_template *t, const osp_chat_template_inputs *in, char **out,
                                    size_t *out_len) {
    if (!out) return osp_set_error(OSP_ERR_INVALID_ARG, "chat template render: NULL argument");
    *out = NULL;
    osp_chat_template_output o;
    osp_status s = render(t, in, false, &o);
    if (s != OSP_OK) return s;
    *out = o.text;
    if (out_len) *out_len = o.len;
    return OSP_OK;
}

osp_status osp_chat_template_render_spans(const osp_chat_template *t, const osp_chat_template_inputs *in,
                                          osp_chat_template_output *out) {
    return render(t, in, true, out);
}

void osp_chat_template_output_free(osp_chat_template_output *o) {
    if (!o) return;
    free(o->text);
    free(o->tainted);
    *o = (osp_chat_template_output){0};
}
