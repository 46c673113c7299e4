/* Chat templates: the arena, the lexer and the parser.
 *
 * The lexer follows jinja2's (lexer.py) with transformers' settings: newlines normalized to "\n",
 * one trailing newline dropped (keep_trailing_newline=False); trim_blocks drops the "\n" right after
 * a `%}` / `#}`; lstrip_blocks drops the spaces and tabs between the start of a line and a `{%` or
 * `{#`; `{%-`/`-%}` strip all whitespace on their side, `{%+`/`+%}` turn the two options off for
 * that tag. Inside a tag an end marker counts only outside brackets, as in jinja2.
 *
 * The parser is jinja2's parser.py: statements, then expressions by precedence
 *   ternary < or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary - + < primary
 * with postfix attribute/subscript/call and then filters `|` and tests `is` on a unary operand. */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "template/template_internal.h"

// ---- arena -------------------------------------------------------------------------------------
struct tarena_chunk {
    tarena_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void *tarena_alloc(tarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n > a->limit || a->used_total > a->limit - n) return NULL;
    tarena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > 65536 ? n : 65536;
        if (c && c->size * 2 > sz && c->size < (64u << 20)) sz = c->size * 2;
        c = malloc(sizeof *c + sz);
        if (!c) return NULL;
        c->next = a->head;
        c->size = sz;
        c->used = 0;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used_total += n;
    return p;
}

void tarena_free(tarena *a) {
    for (tarena_chunk *c = a->head, *nx; c; c = nx) {
        nx = c->next;
        free(c);
    }
    a->head = NULL;
    a->used_total = 0;
}

// ---- lexer -------------------------------------------------------------------------------------
typedef struct ttok {
    int type, line;
    const char *p; /* TEXT/NAME/STRING: the (unescaped) text */
    size_t n;
    int64_t i;
    double f;
} ttok;

typedef struct tparser {
    tarena *arena;
    jmp_buf jb;
    osp_status status;
    char msg[512];
    const char *src;
    size_t len, pos;
    int line;
    ttok *toks;
    size_t ntok, cap, at;
    int depth;
    int soft; /* inside an if body: jinja2 defers unknown filters/tests to run time there */
} tparser;

static _Noreturn void perr(tparser *P, int line, osp_status s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static _Noreturn void perr(tparser *P, int line, osp_status s, const char *fmt, ...) {
    int k = snprintf(P->msg, sizeof P->msg, "line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(P->msg + k, sizeof P->msg - (size_t)k, fmt, ap);
    va_end(ap);
    P->status = s;
    longjmp(P->jb, 1);
}

static void *palloc(tparser *P, size_t n) {
    void *p = tarena_alloc(P->arena, n);
    if (!p) perr(P, P->line, OSP_ERR_NOMEM, "template too large");
    memset(p, 0, n);
    return p;
}

static const char *pstrdup(tparser *P, const char *s, size_t n) {
    char *p = palloc(P, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static ttok *push_tok(tparser *P, int type) {
    if (P->ntok == P->cap) {
        size_t nc = P->cap ? P->cap * 2 : 256;
        ttok *nt = palloc(P, nc * sizeof *nt);
        if (P->ntok) memcpy(nt, P->toks, P->ntok * sizeof *nt);
        P->toks = nt;
        P->cap = nc;
    }
    ttok *t = &P->toks[P->ntok++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = P->line;
    return t;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static void count_lines(tparser *P, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (P->src[i] == '\n') P->line++;
}

static void emit_text(tparser *P, size_t a, size_t b) {
    if (b > a) {
        ttok *t = push_tok(P, TOK_TEXT);
        t->p = P->src + a;
        t->n = b - a;
    }
    count_lines(P, a, b);
}

/* After a `%}`/`#}` (or the endraw's): '-' strips all following whitespace, '+' nothing, plain
 * drops one "\n" (trim_blocks). Returns whether the consumed text ended with "\n". */
static bool after_block_end(tparser *P, char sign) {
    const size_t start = P->pos;
    if (sign == '-') {
        while (P->pos < P->len && is_ws(P->src[P->pos])) P->pos++;
    } else if (sign != '+' && P->pos < P->len && P->src[P->pos] == '\n') {
        P->pos++;
    }
    count_lines(P, start, P->pos);
    return P->pos > start ? P->src[P->pos - 1] == '\n' : false;
}

/* Python-style unescape of a string literal body (jinja2 decodes with "unicode-escape"). */
static const char *unescape(tparser *P, const char *s, size_t n, size_t *outn) {
    char *o = palloc(P, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            o[k++] = s[i];
            continue;
        }
        char c = s[++i];
        uint32_t cp = 0;
        int hex = 0;
        switch (c) {
        case 'n': o[k++] = '\n'; continue;
        case 't': o[k++] = '\t'; continue;
        case 'r': o[k++] = '\r'; continue;
        case '\\': o[k++] = '\\'; continue;
        case '\'': o[k++] = '\''; continue;
        case '"': o[k++] = '"'; continue;
        case 'a': o[k++] = '\a'; continue;
        case 'b': o[k++] = '\b'; continue;
        case 'f': o[k++] = '\f'; continue;
        case 'v': o[k++] = '\v'; continue;
        case '\n': continue;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                int d = 0;
                while (d < 3 && i < n && s[i] >= '0' && s[i] <= '7') cp = cp * 8 + (uint32_t)(s[i++] - '0'), d++;
                i--;
                goto put_cp;
            }
            o[k++] = '\\';
            o[k++] = c;
            continue;
        }
        if (i + (size_t)hex >= n) perr(P, P->line, OSP_ERR_FORMAT, "truncated \\%c escape in a string literal", c);
        for (int d = 0; d < hex; d++) {
            char h = s[i + 1 + (size_t)d];
            if (!isxdigit((unsigned char)h)) perr(P, P->line, OSP_ERR_FORMAT, "bad \\%c escape in a string literal", c);
            cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
        }
        i += (size_t)hex;
    put_cp:
        if (cp > 0x10FFFF) perr(P, P->line, OSP_ERR_FORMAT, "escape beyond U+10FFFF in a string literal");
        if (cp < 0x80) o[k++] = (char)cp;
        else if (cp < 0x800) o[k++] = (char)(0xC0 | cp >> 6), o[k++] = (char)(0x80 | (cp & 63));
        else if (cp < 0x10000) o[k++] = (char)(0xE0 | cp >> 12), o[k++] = (char)(0x80 | (cp >> 6 & 63)), o[k++] = (char)(0x80 | (cp & 63));
        else o[k++] = (char)(0xF0 | cp >> 18), o[k++] = (char)(0x80 | (cp >> 12 & 63)), o[k++] = (char)(0x80 | (cp >> 6 & 63)), o[k++] = (char)(0x80 | (cp & 63));
    }
    o[k] = 0;
    *outn = k;
    return o;
}

/* Lexes the inside of a tag up to its end marker ("}}" or "%}"). Returns the sign before it. */
static char lex_tag(tparser *P, bool block) {
    const char *s = P->src;
    int bal = 0;
    const int open_line = P->line;
    for (;;) {
        while (P->pos < P->len && is_ws(s[P->pos])) {
            if (s[P->pos] == '\n') P->line++;
            P->pos++;
        }
        if (P->pos >= P->len) perr(P, open_line, OSP_ERR_FORMAT, "unclosed %s tag", block ? "{%" : "{{");
        const size_t p = P->pos, rest = P->len - p;
        const char e0 = block ? '%' : '}';
        if (bal == 0) {
            if ((s[p] == '-' || s[p] == '+') && rest >= 3 && s[p + 1] == e0 && s[p + 2] == '}') {
                P->pos += 3;
                return s[p];
            }
            if (rest >= 2 && s[p] == e0 && s[p + 1] == '}') {
                P->pos += 2;
                return 0;
            }
        }
        const char c = s[p];
        if (isdigit((unsigned char)c)) {
            size_t q = p;
            while (q < P->len && (isdigit((unsigned char)s[q]) || s[q] == '_')) q++;
            bool isf = false;
            if (q + 1 < P->len && s[q] == '.' && isdigit((unsigned char)s[q + 1])) {
                isf = true;
                q++;
                while (q < P->len && (isdigit((unsigned char)s[q]) || s[q] == '_')) q++;
            }
            if (q < P->len && (s[q] == 'e' || s[q] == 'E')) {
                size_t r = q + 1;
                if (r < P->len && (s[r] == '+' || s[r] == '-')) r++;
                if (r < P->len && isdigit((unsigned char)s[r])) {
                    isf = true;
                    q = r;
                    while (q < P->len && isdigit((unsigned char)s[q])) q++;
                }
            }
            char num[64];
            size_t k = 0;
            for (size_t i = p; i < q && k < sizeof num - 1; i++)
                if (s[i] != '_') num[k++] = s[i];
            num[k] = 0;
            ttok *t = push_tok(P, isf ? TOK_FLOAT : TOK_INT);
            if (isf) t->f = strtod(num, NULL);
            else {
                if (k > 18) perr(P, P->line, OSP_ERR_UNSUPPORTED, "integer literal %s is too large", num);
                t->i = strtoll(num, NULL, 10);
            }
            P->pos = q;
            continue;
        }
        if (isalpha((unsigned char)c) || c == '_') {
            size_t q = p;
            while (q < P->len && (isalnum((unsigned char)s[q]) || s[q] == '_')) q++;
            ttok *t = push_tok(P, TOK_NAME);
            t->p = pstrdup(P, s + p, q - p);
            t->n = q - p;
            P->pos = q;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < P->len && s[q] != c) q += s[q] == '\\' ? 2 : 1;
            if (q >= P->len) perr(P, P->line, OSP_ERR_FORMAT, "unterminated string literal");
            ttok *t = push_tok(P, TOK_STRING);
            t->p = unescape(P, s + p + 1, q - p - 1, &t->n);
            count_lines(P, p, q);
            P->pos = q + 1;
            continue;
        }
        static const struct {
            const char *s;
            int t;
        } ops[] = {{"//", TOK_FLOORDIV}, {"**", TOK_POW}, {"==", TOK_EQ}, {"!=", TOK_NE}, {"<=", TOK_LTEQ},
                   {">=", TOK_GTEQ}, {"+", TOK_ADD}, {"-", TOK_SUB}, {"/", TOK_DIV}, {"*", TOK_MUL},
                   {"%", TOK_MOD}, {"~", TOK_TILDE}, {"[", TOK_LBRACKET}, {"]", TOK_RBRACKET},
                   {"(", TOK_LPAREN}, {")", TOK_RPAREN}, {"{", TOK_LBRACE}, {"}", TOK_RBRACE},
                   {"<", TOK_LT}, {">", TOK_GT}, {"=", TOK_ASSIGN}, {".", TOK_DOT}, {":", TOK_COLON},
                   {"|", TOK_PIPE}, {",", TOK_COMMA}, {";", TOK_SEMICOLON}};
        int found = -1;
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
            size_t ln = strlen(ops[i].s);
            if (rest >= ln && !memcmp(s + p, ops[i].s, ln)) {
                found = (int)i;
                break;
            }
        }
        if (found < 0) perr(P, P->line, OSP_ERR_FORMAT, "unexpected character '%c' in a tag", c);
        const int tt = ops[found].t;
        if (tt == TOK_LBRACKET || tt == TOK_LPAREN || tt == TOK_LBRACE) bal++;
        if (tt == TOK_RBRACKET || tt == TOK_RPAREN || tt == TOK_RBRACE) {
            if (bal == 0) perr(P, P->line, OSP_ERR_FORMAT, "unexpected '%c'", c);
            bal--;
        }
        push_tok(P, tt);
        P->pos += strlen(ops[found].s);
    }
}

/* Matches `{%[-+]? *raw *[-+]?%}` (or endraw) at s[p]; returns its length, 0 if none. */
static size_t match_raw(const char *s, size_t len, size_t p, const char *word, char *sign_open, char *sign_close) {
    size_t q = p + 2;
    *sign_open = 0;
    if (q < len && (s[q] == '-' || s[q] == '+')) *sign_open = s[q++];
    while (q < len && is_ws(s[q])) q++;
    size_t wl = strlen(word);
    if (q + wl > len || memcmp(s + q, word, wl)) return 0;
    q += wl;
    if (q < len && (isalnum((unsigned char)s[q]) || s[q] == '_')) return 0;
    while (q < len && is_ws(s[q])) q++;
    *sign_close = 0;
    if (q < len && (s[q] == '-' || s[q] == '+')) *sign_close = s[q++];
    if (q + 2 > len || s[q] != '%' || s[q + 1] != '}') return 0;
    return q + 2 - p;
}

static void lex(tparser *P) {
    const char *s = P->src;
    bool line_starting = true;
    P->line = 1;
    while (P->pos < P->len) {
        size_t t = P->pos;
        while (t + 1 < P->len && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= P->len) {
            emit_text(P, P->pos, P->len);
            P->pos = P->len;
            break;
        }
        const char kind = s[t + 1];
        const char sign = t + 2 < P->len ? s[t + 2] : 0;
        size_t text_end = t;
        if (sign == '-') {
            while (text_end > P->pos && is_ws(s[text_end - 1])) text_end--;
        } else if (sign != '+' && kind != '{') {
            size_t l = text_end;
            while (l > P->pos && s[l - 1] != '\n') l--;
            bool nl = l > P->pos;
            if (nl || line_starting) {
                size_t q = l;
                while (q < text_end && (s[q] == ' ' || s[q] == '\t' || s[q] == '\r' || s[q] == '\f' || s[q] == '\v')) q++;
                if (q == text_end) text_end = l;
            }
        }
        emit_text(P, P->pos, text_end);
        count_lines(P, text_end, t);
        P->pos = t;
        char so, sc;
        size_t rl;
        if (kind == '#') {
            size_t q = t + 2;
            while (q + 1 < P->len && !(s[q] == '#' && s[q + 1] == '}')) q++;
            if (q + 1 >= P->len) perr(P, P->line, OSP_ERR_FORMAT, "unclosed comment");
            char csign = q > t + 2 && (s[q - 1] == '-' || s[q - 1] == '+') ? s[q - 1] : 0;
            count_lines(P, t, q + 2);
            P->pos = q + 2;
            line_starting = after_block_end(P, csign);
            if (!line_starting && P->pos == q + 2) line_starting = false;
        } else if (kind == '%' && (rl = match_raw(s, P->len, t, "raw", &so, &sc)) != 0) {
            P->pos = t + rl;
            if (sc == '-')
                while (P->pos < P->len && is_ws(s[P->pos])) P->pos++;
            count_lines(P, t, P->pos);
            size_t q = P->pos, el = 0;
            char eo = 0, ec = 0;
            for (; q + 1 < P->len; q++)
                if (s[q] == '{' && s[q + 1] == '%' && (el = match_raw(s, P->len, q, "endraw", &eo, &ec)) != 0) break;
            if (!el) perr(P, P->line, OSP_ERR_FORMAT, "unclosed raw block");
            size_t body_end = q;
            if (eo == '-')
                while (body_end > P->pos && is_ws(s[body_end - 1])) body_end--;
            emit_text(P, P->pos, body_end);
            count_lines(P, body_end, q + el);
            P->pos = q + el;
            line_starting = after_block_end(P, ec);
        } else if (kind == '{') {
            push_tok(P, TOK_VAR_BEGIN);
            P->pos = t + 2 + (sign == '-' || sign == '+');
            const char es = lex_tag(P, false);
            push_tok(P, TOK_VAR_END);
            line_starting = false;
            if (es == '-') {
                size_t st = P->pos;
                while (P->pos < P->len && is_ws(s[P->pos])) P->pos++;
                count_lines(P, st, P->pos);
                line_starting = P->pos > st && s[P->pos - 1] == '\n';
            }
        } else {
            push_tok(P, TOK_BLOCK_BEGIN);
            P->pos = t + 2 + (sign == '-' || sign == '+');
            const char es = lex_tag(P, true);
            push_tok(P, TOK_BLOCK_END);
            line_starting = after_block_end(P, es);
        }
    }
    push_tok(P, TOK_EOF);
}

// ---- parser ------------------------------------------------------------------------------------
static ttok *cur(tparser *P) { return &P->toks[P->at]; }
static ttok *peek(tparser *P, size_t k) { return &P->toks[P->at + k < P->ntok ? P->at + k : P->ntok - 1]; }
static ttok *advance(tparser *P) {
    ttok *t = cur(P);
    if (t->type != TOK_EOF) P->at++;
    return t;
}
static bool is_name(const ttok *t, const char *n) { return t->type == TOK_NAME && !strcmp(t->p, n); }
static bool accept(tparser *P, int type) {
    if (cur(P)->type == type) {
        advance(P);
        return true;
    }
    return false;
}
static bool accept_name(tparser *P, const char *n) {
    if (is_name(cur(P), n)) {
        advance(P);
        return true;
    }
    return false;
}

static const char *tok_desc(const ttok *t) {
    switch (t->type) {
    case TOK_EOF: return "end of template";
    case TOK_TEXT: return "template text";
    case TOK_VAR_BEGIN: return "'{{'";
    case TOK_VAR_END: return "'}}'";
    case TOK_BLOCK_BEGIN: return "'{%'";
    case TOK_BLOCK_END: return "'%}'";
    case TOK_NAME: return t->p;
    case TOK_STRING: return "a string";
    case TOK_INT: return "an integer";
    case TOK_FLOAT: return "a float";
    default: return "an operator";
    }
}

static void expect(tparser *P, int type, const char *what) {
    if (!accept(P, type)) perr(P, cur(P)->line, OSP_ERR_FORMAT, "expected %s, got %s", what, tok_desc(cur(P)));
}

static const char *expect_name(tparser *P, const char *what) {
    ttok *t = cur(P);
    if (t->type != TOK_NAME) perr(P, t->line, OSP_ERR_FORMAT, "expected %s, got %s", what, tok_desc(t));
    advance(P);
    return t->p;
}

static tnode *mk(tparser *P, int type, int line) {
    tnode *n = palloc(P, sizeof *n);
    n->type = (uint8_t)type;
    n->line = line;
    return n;
}

/* A growable pointer array in the arena. */
typedef struct nvec {
    tnode **v;
    int n, cap;
} nvec;
static void nv_push(tparser *P, nvec *nv, tnode *x) {
    if (nv->n == nv->cap) {
        int nc = nv->cap ? nv->cap * 2 : 8;
        tnode **a = palloc(P, (size_t)nc * sizeof *a);
        if (nv->n) memcpy(a, nv->v, (size_t)nv->n * sizeof *a);
        nv->v = a;
        nv->cap = nc;
    }
    nv->v[nv->n++] = x;
}
typedef struct svec {
    const char **v;
    int n, cap;
} svec;
static void sv_push(tparser *P, svec *sv, const char *x) {
    if (sv->n == sv->cap) {
        int nc = sv->cap ? sv->cap * 2 : 8;
        const char **a = palloc(P, (size_t)nc * sizeof *a);
        if (sv->n) memcpy(a, sv->v, (size_t)sv->n * sizeof *a);
        sv->v = a;
        sv->cap = nc;
    }
    sv->v[sv->n++] = x;
}

static tnode *parse_expr(tparser *P, bool with_cond);
static tnode *parse_unary(tparser *P, bool with_filter);
static tnode *parse_primary(tparser *P);
static tnode *parse_postfix(tparser *P, tnode *n);

static void enter(tparser *P) {
    if (++P->depth > 200) perr(P, cur(P)->line, OSP_ERR_UNSUPPORTED, "template nested more than 200 levels deep");
}

/* Call arguments after '(' : positional and name=value. */
static void parse_args(tparser *P, tnode *n) {
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    while (cur(P)->type != TOK_RPAREN) {
        if (args.n + kwv.n) expect(P, TOK_COMMA, "','");
        if (cur(P)->type == TOK_RPAREN) break;
        if (cur(P)->type == TOK_MUL || cur(P)->type == TOK_POW)
            perr(P, cur(P)->line, OSP_ERR_UNSUPPORTED, "*args / **kwargs in a call");
        if (cur(P)->type == TOK_NAME && peek(P, 1)->type == TOK_ASSIGN) {
            sv_push(P, &kwn, advance(P)->p);
            advance(P);
            nv_push(P, &kwv, parse_expr(P, true));
        } else {
            if (kwv.n) perr(P, cur(P)->line, OSP_ERR_FORMAT, "positional argument after a keyword argument");
            nv_push(P, &args, parse_expr(P, true));
        }
    }
    expect(P, TOK_RPAREN, "')'");
    n->kid = args.v;
    n->nkid = args.n;
    n->kwname = kwn.v;
    n->kwval = kwv.v;
    n->nkw = kwv.n;
}

/* `(a, b)` / `(a)` / `()` after the '(' was consumed, or a bare tuple without parentheses. */
static tnode *parse_tuple_rest(tparser *P, tnode *first, int line, int close) {
    nvec items = {0};
    nv_push(P, &items, first);
    while (accept(P, TOK_COMMA)) {
        int t = cur(P)->type;
        if (t == close || t == TOK_BLOCK_END || t == TOK_VAR_END || t == TOK_ASSIGN || is_name(cur(P), "in") ||
            is_name(cur(P), "if"))
            break;
        nv_push(P, &items, parse_expr(P, close == TOK_RPAREN));
    }
    tnode *n = mk(P, N_TUPLE, line);
    n->kid = items.v;
    n->nkid = items.n;
    return n;
}

static tnode *parse_primary(tparser *P) {
    ttok *t = cur(P);
    tnode *n;
    switch (t->type) {
    case TOK_NAME:
        advance(P);
        if (!strcmp(t->p, "true") || !strcmp(t->p, "True") || !strcmp(t->p, "false") || !strcmp(t->p, "False")) {
            n = mk(P, N_LIT, t->line);
            n->lit = tv_bool(t->p[0] == 't' || t->p[0] == 'T');
        } else if (!strcmp(t->p, "none") || !strcmp(t->p, "None")) {
            n = mk(P, N_LIT, t->line);
            n->lit = tv_none();
        } else {
            n = mk(P, N_NAME, t->line);
            n->name = t->p;
        }
        return n;
    case TOK_STRING: {
        advance(P);
        n = mk(P, N_LIT, t->line);
        if (cur(P)->type != TOK_STRING) {
            n->lit.k = TV_STR;
            n->lit.s.p = t->p;
            n->lit.s.n = t->n;
            return n;
        }
        size_t total = t->n;
        for (size_t k = P->at; P->toks[k].type == TOK_STRING; k++) total += P->toks[k].n;
        char *buf = palloc(P, total + 1);
        memcpy(buf, t->p, t->n);
        size_t at = t->n;
        while (cur(P)->type == TOK_STRING) {
            ttok *u = advance(P);
            memcpy(buf + at, u->p, u->n);
            at += u->n;
        }
        n->lit.k = TV_STR;
        n->lit.s.p = buf;
        n->lit.s.n = total;
        return n;
    }
    case TOK_INT:
        advance(P);
        n = mk(P, N_LIT, t->line);
        n->lit = tv_int(t->i);
        return n;
    case TOK_FLOAT:
        advance(P);
        n = mk(P, N_LIT, t->line);
        n->lit = tv_float(t->f);
        return n;
    case TOK_LPAREN: {
        advance(P);
        if (accept(P, TOK_RPAREN)) {
            n = mk(P, N_TUPLE, t->line);
            return n;
        }
        tnode *e = parse_expr(P, true);
        if (cur(P)->type == TOK_COMMA) e = parse_tuple_rest(P, e, t->line, TOK_RPAREN);
        expect(P, TOK_RPAREN, "')'");
        return e;
    }
    case TOK_LBRACKET: {
        advance(P);
        nvec items = {0};
        while (cur(P)->type != TOK_RBRACKET) {
            if (items.n) expect(P, TOK_COMMA, "','");
            if (cur(P)->type == TOK_RBRACKET) break;
            nv_push(P, &items, parse_expr(P, true));
        }
        expect(P, TOK_RBRACKET, "']'");
        n = mk(P, N_LIST, t->line);
        n->kid = items.v;
        n->nkid = items.n;
        return n;
    }
    case TOK_LBRACE: {
        advance(P);
        nvec items = {0};
        while (cur(P)->type != TOK_RBRACE) {
            if (items.n) expect(P, TOK_COMMA, "','");
            if (cur(P)->type == TOK_RBRACE) break;
            nv_push(P, &items, parse_expr(P, true));
            expect(P, TOK_COLON, "':' in a dict literal");
            nv_push(P, &items, parse_expr(P, true));
        }
        expect(P, TOK_RBRACE, "'}'");
        n = mk(P, N_DICT, t->line);
        n->kid = items.v;
        n->nkid = items.n;
        return n;
    }
    default:
        perr(P, t->line, OSP_ERR_FORMAT, "unexpected %s in an expression", tok_desc(t));
    }
}

static tnode *parse_subscript_arg(tparser *P) {
    /* returns an N_SLICE node (a unused) or an expression */
    int line = cur(P)->line;
    tnode *parts[3] = {0};
    int nparts = 0;
    bool slice = false;
    for (;;) {
        int t = cur(P)->type;
        if (t == TOK_COLON) {
            slice = true;
            advance(P);
            if (++nparts > 2) perr(P, line, OSP_ERR_FORMAT, "too many ':' in a slice");
            continue;
        }
        if (t == TOK_RBRACKET) break;
        if (parts[nparts]) perr(P, line, OSP_ERR_FORMAT, "bad subscript");
        parts[nparts] = parse_expr(P, true);
    }
    if (!slice) {
        if (!parts[0]) perr(P, line, OSP_ERR_FORMAT, "empty subscript");
        return parts[0];
    }
    tnode *n = mk(P, N_SLICE, line);
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

static tnode *parse_postfix(tparser *P, tnode *n) {
    for (;;) {
        ttok *t = cur(P);
        if (t->type == TOK_DOT) {
            advance(P);
            ttok *a = cur(P);
            tnode *m;
            if (a->type == TOK_NAME) {
                advance(P);
                m = mk(P, N_ATTR, a->line);
                m->name = a->p;
            } else if (a->type == TOK_INT) {
                advance(P);
                m = mk(P, N_ITEM, a->line);
                m->b = mk(P, N_LIT, a->line);
                m->b->lit = tv_int(a->i);
            } else {
                perr(P, a->line, OSP_ERR_FORMAT, "expected an attribute name after '.'");
            }
            m->a = n;
            n = m;
        } else if (t->type == TOK_LBRACKET) {
            advance(P);
            tnode *arg = parse_subscript_arg(P);
            expect(P, TOK_RBRACKET, "']'");
            tnode *m;
            if (arg->type == N_SLICE) {
                m = arg;
            } else {
                m = mk(P, N_ITEM, t->line);
                m->b = arg;
            }
            m->a = n;
            n = m;
        } else if (t->type == TOK_LPAREN) {
            advance(P);
            tnode *m = mk(P, N_CALL, t->line);
            m->a = n;
            parse_args(P, m);
            n = m;
        } else {
            return n;
        }
    }
}

static tnode *parse_filter_expr(tparser *P, tnode *n) {
    for (;;) {
        ttok *t = cur(P);
        if (t->type == TOK_PIPE) {
            advance(P);
            tnode *f = mk(P, N_FILTER, t->line);
            f->name = expect_name(P, "a filter name");
            while (cur(P)->type == TOK_DOT) {
                advance(P);
                expect_name(P, "a filter name");
                perr(P, t->line, OSP_ERR_UNSUPPORTED, "dotted filter names");
            }
            if (!tmpl_has_filter(f->name) && !P->soft) perr(P, t->line, OSP_ERR_FORMAT, "unknown filter '%s'", f->name);
            if (accept(P, TOK_LPAREN)) parse_args(P, f);
            f->a = n;
            n = f;
        } else if (is_name(t, "is")) {
            advance(P);
            tnode *f = mk(P, N_TEST, t->line);
            if (accept_name(P, "not")) f->neg = 1;
            ttok *nm = cur(P);
            if (nm->type == TOK_NAME) {
                advance(P);
                f->name = nm->p;
            } else if (nm->type == TOK_EQ || nm->type == TOK_NE || nm->type == TOK_LT || nm->type == TOK_GT ||
                       nm->type == TOK_LTEQ || nm->type == TOK_GTEQ) {
                perr(P, t->line, OSP_ERR_UNSUPPORTED, "operator-named tests ('is ==')");
            } else {
                perr(P, t->line, OSP_ERR_FORMAT, "expected a test name after 'is'");
            }
            if (!tmpl_has_test(f->name) && !P->soft) perr(P, t->line, OSP_ERR_FORMAT, "unknown test '%s'", f->name);
            ttok *a = cur(P);
            if (a->type == TOK_LPAREN) {
                advance(P);
                parse_args(P, f);
            } else if ((a->type == TOK_NAME || a->type == TOK_STRING || a->type == TOK_INT || a->type == TOK_FLOAT ||
                        a->type == TOK_LBRACKET || a->type == TOK_LBRACE) &&
                       !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and") && !is_name(a, "if") &&
                       !is_name(a, "in") && !is_name(a, "not") && !is_name(a, "is") && !is_name(a, "recursive")) {
                tnode *arg = parse_postfix(P, parse_primary(P));
                f->kid = palloc(P, sizeof *f->kid);
                f->kid[0] = arg;
                f->nkid = 1;
            }
            f->a = n;
            n = f;
        } else if (t->type == TOK_LPAREN) {
            advance(P);
            tnode *m = mk(P, N_CALL, t->line);
            m->a = n;
            parse_args(P, m);
            n = m;
        } else {
            return n;
        }
    }
}

static tnode *parse_unary(tparser *P, bool with_filter) {
    ttok *t = cur(P);
    tnode *n;
    enter(P);
    if (t->type == TOK_SUB || t->type == TOK_ADD) {
        advance(P);
        n = mk(P, t->type == TOK_SUB ? N_NEG : N_POS, t->line);
        n->a = parse_unary(P, false);
    } else {
        n = parse_postfix(P, parse_primary(P));
    }
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static tnode *binop(tparser *P, int op, tnode *a, tnode *b, int line) {
    tnode *n = mk(P, N_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static tnode *parse_pow(tparser *P) {
    tnode *n = parse_unary(P, true);
    while (cur(P)->type == TOK_POW) {
        int line = advance(P)->line;
        n = binop(P, TOK_POW, n, parse_unary(P, true), line);
    }
    return n;
}

static tnode *parse_math2(tparser *P) {
    tnode *n = parse_pow(P);
    for (;;) {
        int t = cur(P)->type;
        if (t != TOK_MUL && t != TOK_DIV && t != TOK_FLOORDIV && t != TOK_MOD) return n;
        int line = advance(P)->line;
        n = binop(P, t, n, parse_pow(P), line);
    }
}

static tnode *parse_concat(tparser *P) {
    tnode *first = parse_math2(P);
    if (cur(P)->type != TOK_TILDE) return first;
    nvec items = {0};
    nv_push(P, &items, first);
    int line = cur(P)->line;
    while (accept(P, TOK_TILDE)) nv_push(P, &items, parse_math2(P));
    tnode *n = mk(P, N_CONCAT, line);
    n->kid = items.v;
    n->nkid = items.n;
    return n;
}

static tnode *parse_math1(tparser *P) {
    tnode *n = parse_concat(P);
    for (;;) {
        int t = cur(P)->type;
        if (t != TOK_ADD && t != TOK_SUB) return n;
        int line = advance(P)->line;
        n = binop(P, t, n, parse_concat(P), line);
    }
}

static tnode *parse_compare(tparser *P) {
    tnode *n = parse_math1(P);
    for (;;) {
        ttok *t = cur(P);
        int op;
        if (t->type == TOK_EQ || t->type == TOK_NE || t->type == TOK_LT || t->type == TOK_LTEQ || t->type == TOK_GT ||
            t->type == TOK_GTEQ) {
            op = t->type;
            advance(P);
        } else if (is_name(t, "in")) {
            op = TOK_IN;
            advance(P);
        } else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = TOK_NOTIN;
            advance(P);
            advance(P);
        } else {
            return n;
        }
        n = binop(P, op, n, parse_math1(P), t->line);
    }
}

static tnode *parse_not(tparser *P) {
    if (is_name(cur(P), "not")) {
        int line = advance(P)->line;
        enter(P);
        tnode *n = mk(P, N_NOT, line);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static tnode *parse_and(tparser *P) {
    tnode *n = parse_not(P);
    while (is_name(cur(P), "and")) {
        int line = advance(P)->line;
        tnode *m = mk(P, N_AND, line);
        m->a = n;
        m->b = parse_not(P);
        n = m;
    }
    return n;
}

static tnode *parse_or(tparser *P) {
    tnode *n = parse_and(P);
    while (is_name(cur(P), "or")) {
        int line = advance(P)->line;
        tnode *m = mk(P, N_OR, line);
        m->a = n;
        m->b = parse_and(P);
        n = m;
    }
    return n;
}

static tnode *parse_expr(tparser *P, bool with_cond) {
    enter(P);
    tnode *n = parse_or(P);
    while (with_cond && is_name(cur(P), "if")) {
        int line = advance(P)->line;
        tnode *m = mk(P, N_COND, line);
        m->a = parse_or(P); /* condition */
        m->b = n;           /* then */
        if (accept_name(P, "else")) m->c = parse_expr(P, true);
        n = m;
    }
    P->depth--;
    return n;
}

/* An expression that may be a bare tuple (`{{ a, b }}`, `set x = a, b`). */
static tnode *parse_expr_tuple(tparser *P, bool with_cond) {
    int line = cur(P)->line;
    tnode *e = parse_expr(P, with_cond);
    if (cur(P)->type == TOK_COMMA) e = parse_tuple_rest(P, e, line, TOK_BLOCK_END);
    return e;
}

// ---- statements --------------------------------------------------------------------------------
static tnode *parse_body(tparser *P, const char *const *ends);

static void expect_block_end(tparser *P) { expect(P, TOK_BLOCK_END, "'%}'"); }

/* Tuple or single name target for for/set: fills names. */
static void parse_targets(tparser *P, tnode *n) {
    svec names = {0};
    bool paren = accept(P, TOK_LPAREN);
    do {
        sv_push(P, &names, expect_name(P, "a variable name"));
    } while (accept(P, TOK_COMMA) && cur(P)->type == TOK_NAME);
    if (paren) expect(P, TOK_RPAREN, "')'");
    n->names = names.v;
    n->nnames = names.n;
}

static tnode *parse_statement(tparser *P) {
    ttok *t = cur(P);
    const int line = t->line;
    if (t->type != TOK_NAME) perr(P, line, OSP_ERR_FORMAT, "expected a statement name after '{%%'");
    const char *kw = advance(P)->p;
    enter(P);
    tnode *n;
    if (!strcmp(kw, "if")) {
        n = mk(P, N_IF, line);
        P->soft++;
        n->a = parse_expr(P, true);
        expect_block_end(P);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        n->b = parse_body(P, ends);
        tnode *tail = n;
        for (;;) {
            const char *e = advance(P)->p;
            if (!strcmp(e, "elif")) {
                tnode *m = mk(P, N_IF, cur(P)->line);
                m->a = parse_expr(P, true);
                expect_block_end(P);
                m->b = parse_body(P, ends);
                tail->c = m;
                tail = m;
            } else if (!strcmp(e, "else")) {
                expect_block_end(P);
                static const char *const ends2[] = {"endif", NULL};
                tail->c = parse_body(P, ends2);
                advance(P);
                break;
            } else {
                break;
            }
        }
        P->soft--;
        expect_block_end(P);
    } else if (!strcmp(kw, "for")) {
        n = mk(P, N_FOR, line);
        parse_targets(P, n);
        if (!accept_name(P, "in")) perr(P, line, OSP_ERR_FORMAT, "expected 'in' in a for statement");
        n->a = parse_expr(P, false);
        if (cur(P)->type == TOK_COMMA) n->a = parse_tuple_rest(P, n->a, line, TOK_BLOCK_END);
        if (accept_name(P, "if")) n->b = parse_expr(P, false);
        if (accept_name(P, "recursive")) perr(P, line, OSP_ERR_UNSUPPORTED, "recursive for loops");
        expect_block_end(P);
        static const char *const ends[] = {"else", "endfor", NULL};
        n->c = parse_body(P, ends);
        if (!strcmp(advance(P)->p, "else")) {
            expect_block_end(P);
            static const char *const ends2[] = {"endfor", NULL};
            n->d = parse_body(P, ends2);
            advance(P);
        }
        expect_block_end(P);
    } else if (!strcmp(kw, "set")) {
        if (cur(P)->type == TOK_NAME && peek(P, 1)->type == TOK_DOT) {
            n = mk(P, N_SET, line);
            tnode *obj = mk(P, N_NAME, line);
            obj->name = advance(P)->p;
            advance(P);
            n->b = obj;
            n->name = expect_name(P, "an attribute name");
            expect(P, TOK_ASSIGN, "'='");
            n->a = parse_expr_tuple(P, true);
            expect_block_end(P);
        } else {
            tnode tmp = {0};
            parse_targets(P, &tmp);
            if (accept(P, TOK_ASSIGN)) {
                n = mk(P, N_SET, line);
                n->names = tmp.names;
                n->nnames = tmp.nnames;
                n->a = parse_expr_tuple(P, true);
                expect_block_end(P);
            } else {
                if (tmp.nnames != 1) perr(P, line, OSP_ERR_FORMAT, "block set takes one name");
                n = mk(P, N_SETBLOCK, line);
                n->name = tmp.names[0];
                tnode *chain = NULL;
                if (cur(P)->type == TOK_PIPE) {
                    tnode *holder = mk(P, N_NAME, line);
                    holder->name = TMPL_HOLDER;
                    chain = parse_filter_expr(P, holder);
                }
                n->b = chain;
                expect_block_end(P);
                static const char *const ends[] = {"endset", NULL};
                n->a = parse_body(P, ends);
                advance(P);
                expect_block_end(P);
            }
        }
    } else if (!strcmp(kw, "macro") || !strcmp(kw, "call")) {
        const bool is_call = kw[0] == 'c';
        n = mk(P, is_call ? N_CALLBLOCK : N_MACRO, line);
        svec params = {0}, kwn = {0};
        nvec kwv = {0};
        if (!is_call) n->name = expect_name(P, "a macro name");
        if (!is_call || cur(P)->type == TOK_LPAREN) {
            expect(P, TOK_LPAREN, "'('");
            while (cur(P)->type != TOK_RPAREN) {
                if (params.n) expect(P, TOK_COMMA, "','");
                if (cur(P)->type == TOK_RPAREN) break;
                const char *pn = expect_name(P, "a parameter name");
                sv_push(P, &params, pn);
                if (accept(P, TOK_ASSIGN)) {
                    sv_push(P, &kwn, pn);
                    nv_push(P, &kwv, parse_expr(P, true));
                } else if (kwv.n) {
                    perr(P, line, OSP_ERR_FORMAT, "non-default parameter after a default one");
                }
            }
            expect(P, TOK_RPAREN, "')'");
        }
        n->names = params.v;
        n->nnames = params.n;
        n->kwname = kwn.v;
        n->kwval = kwv.v;
        n->nkw = kwv.n;
        if (is_call) {
            tnode *callee = parse_expr(P, true);
            if (callee->type != N_CALL) perr(P, line, OSP_ERR_FORMAT, "expected a macro call in a call block");
            n->a = callee;
        }
        expect_block_end(P);
        static const char *const ends_m[] = {"endmacro", NULL}, *const ends_c[] = {"endcall", NULL};
        n->b = parse_body(P, is_call ? ends_c : ends_m);
        advance(P);
        if (cur(P)->type == TOK_NAME) advance(P); /* {% endmacro name %} */
        expect_block_end(P);
    } else if (!strcmp(kw, "filter")) {
        n = mk(P, N_FILTERBLOCK, line);
        tnode *holder = mk(P, N_NAME, line);
        holder->name = TMPL_HOLDER;
        P->at--; /* reuse the filter-expression parser: pretend a '|' */
        P->toks[P->at].type = TOK_PIPE;
        n->b = parse_filter_expr(P, holder);
        expect_block_end(P);
        static const char *const ends[] = {"endfilter", NULL};
        n->a = parse_body(P, ends);
        advance(P);
        expect_block_end(P);
    } else if (!strcmp(kw, "generation")) {
        expect_block_end(P);
        static const char *const ends[] = {"endgeneration", NULL};
        n = parse_body(P, ends);
        advance(P);
        expect_block_end(P);
    } else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        n = mk(P, kw[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        expect_block_end(P);
    } else if (!strcmp(kw, "include") || !strcmp(kw, "import") || !strcmp(kw, "from") || !strcmp(kw, "extends") ||
               !strcmp(kw, "block") || !strcmp(kw, "with") || !strcmp(kw, "do") || !strcmp(kw, "autoescape") ||
               !strcmp(kw, "trans")) {
        perr(P, line, OSP_ERR_UNSUPPORTED, "the '%s' statement", kw);
    } else {
        perr(P, line, OSP_ERR_FORMAT, "unknown statement '%s'", kw);
    }
    P->depth--;
    return n;
}

/* Parses statements until a `{% <one of ends> ...`, leaving the parser on that name (or EOF when
 * ends is NULL). */
static tnode *parse_body(tparser *P, const char *const *ends) {
    nvec body = {0};
    const int line = cur(P)->line;
    for (;;) {
        ttok *t = cur(P);
        if (t->type == TOK_EOF) {
            if (ends) {
                int last = 0;
                while (ends[last + 1]) last++;
                perr(P, line, OSP_ERR_FORMAT, "missing '{%% %s %%}' for the block opened here", ends[last]);
            }
            break;
        }
        if (t->type == TOK_TEXT) {
            advance(P);
            tnode *n = mk(P, N_TEXT, t->line);
            n->lit.k = TV_STR;
            n->lit.s.p = t->p;
            n->lit.s.n = t->n;
            nv_push(P, &body, n);
        } else if (t->type == TOK_VAR_BEGIN) {
            advance(P);
            tnode *n = mk(P, N_OUT, t->line);
            n->a = parse_expr_tuple(P, true);
            expect(P, TOK_VAR_END, "'}}'");
            nv_push(P, &body, n);
        } else if (t->type == TOK_BLOCK_BEGIN) {
            ttok *nm = peek(P, 1);
            if (nm->type == TOK_NAME && ends) {
                bool is_end = false;
                for (int i = 0; ends[i]; i++)
                    if (!strcmp(nm->p, ends[i])) is_end = true;
                if (is_end) {
                    advance(P);
                    break;
                }
            }
            if (nm->type == TOK_NAME && (!strncmp(nm->p, "end", 3) || !strcmp(nm->p, "else") || !strcmp(nm->p, "elif")))
                perr(P, nm->line, OSP_ERR_FORMAT, "unexpected '%s'%s", nm->p,
                     ends ? "" : " outside any block");
            advance(P);
            nv_push(P, &body, parse_statement(P));
        } else {
            perr(P, t->line, OSP_ERR_FORMAT, "unexpected %s", tok_desc(t));
        }
    }
    tnode *n = mk(P, N_BODY, line);
    n->kid = body.v;
    n->nkid = body.n;
    return n;
}

osp_status osp_chat_template_parse(const char *src, size_t len, osp_chat_template **out) {
    if (!out || (!src && len)) return osp_set_error(OSP_ERR_INVALID_ARG, "chat template: NULL argument");
    *out = NULL;
    osp_chat_template *t = calloc(1, sizeof *t);
    if (!t) return osp_set_error(OSP_ERR_NOMEM, "chat template: out of memory");
    t->arena.limit = (size_t)256 << 20;
    tparser *P = calloc(1, sizeof *P);
    if (!P) {
        free(t);
        return osp_set_error(OSP_ERR_NOMEM, "chat template: out of memory");
    }
    P->arena = &t->arena;
    if (setjmp(P->jb)) {
        osp_status s = P->status;
        osp_set_error(s, "chat template: %s", P->msg);
        free(P);
        osp_chat_template_free(t);
        return s;
    }
    /* newlines to "\n", one trailing newline dropped */
    char *norm = palloc(P, len + 1);
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[k++] = src[i];
        }
    }
    if (k && norm[k - 1] == '\n') k--;
    norm[k] = 0;
    P->src = norm;
    P->len = k;
    lex(P);
    P->at = 0;
    t->root = parse_body(P, NULL);
    free(P);
    *out = t;
    return OSP_OK;
}

void osp_chat_template_free(osp_chat_template *t) {
    if (!t) return;
    tarena_free(&t->arena);
    free(t);
}
