/* Internals of the chat-template interpreter (include/osprey/chat_template.h).
 *
 * Why its own value type and not jansson's json_t: templates need values JSON has no room for
 * (jinja2's Undefined, which remembers its name for error messages; tuples, which print as (a, b);
 * namespaces; macros and bound methods as callables), Python's int/float distinction and Python's
 * equality and ordering, and a whole render's values are short-lived, so they live in one arena
 * that is dropped at the end (no reference counts). jansson is used only to read the input JSON.
 *
 * Errors inside the parser and the evaluator longjmp() to the entry point, which frees the arena
 * and reports one message; nothing is allocated outside the arena while a jump can happen.
 *
 *   source ─▶ lexer (trim_blocks / lstrip_blocks / '-' '+' as jinja2's lexer) ─▶ tokens
 *          ─▶ recursive-descent parser (jinja2's grammar and precedence) ─▶ AST (tnode)
 *          ─▶ evaluator (scopes, loop object, macros) + builtins (filters, tests, methods) ─▶ text */
#ifndef OSP_TEMPLATE_INTERNAL_H
#define OSP_TEMPLATE_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/chat_template.h"

// ---- arena -------------------------------------------------------------------------------------
typedef struct tarena_chunk tarena_chunk;
typedef struct tarena {
    tarena_chunk *head;
    size_t used_total, limit; /* bytes handed out; a request past `limit` fails */
} tarena;

// ---- values ------------------------------------------------------------------------------------
typedef enum tkind {
    TV_UNDEF, /* jinja2 Undefined; s holds the name for messages */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST, /* list or tuple (is_tuple) */
    TV_DICT,
    TV_NS, /* namespace(): a mutable dict with attribute access */
    TV_FUNC,
} tkind;

/* tval.flag: a TV_STR that is Markup (from |safe or |escape: `+` with a plain str escapes the
 * other side); a TV_LIST that is a generator (map/select/...: always truthy, no len(), not JSON);
 * a TV_NS that is the loop object (read-only). */
enum { TVF_MARKUP = 1, TVF_GEN = 2, TVF_LOOP = 4 };

typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tfunc tfunc;

/* Provenance ("taint") of a TV_STR's bytes: which of them came from the request's data (messages,
 * tools, documents, chat_template_kwargs) rather than from the template. NULL: none (template
 * literals, bos/eos, numbers printed); TAINT_ALL: every byte, whatever the length (input strings,
 * and their substrings, cost no allocation); otherwise a list of byte ranges [a, b) relative to the
 * value's own bytes, sorted, non-overlapping and non-adjacent (merged), allocated in the render's
 * arena. Every operation that builds a string from another one's bytes carries the ranges along
 * (tb_put_sub, taint_slice, tb_taint_from); the render's output ends with the tainted spans of the
 * whole text (osp_chat_template_render_spans). */
typedef struct tspan {
    size_t a, b;
} tspan;
typedef struct ttaint {
    size_t n;
    tspan s[];
} ttaint;
extern const ttaint tmpl_taint_all;
#define TAINT_ALL (&tmpl_taint_all)

typedef struct tval {
    uint8_t k;        /* tkind */
    uint8_t is_tuple; /* TV_LIST printed as (a, b) */
    uint8_t flag;     /* TVF_*: jinja2 types that behave like another one with a twist */
    union {
        int64_t i; /* TV_INT, TV_BOOL */
        double f;
        struct {
            const char *p;
            size_t n;
        } s; /* TV_STR, and TV_UNDEF's name (p may be NULL) */
        tlist *l;
        tdict *d; /* TV_DICT, TV_NS */
        tfunc *fn;
    };
    const ttaint *taint; /* TV_STR: which bytes came from the request (NULL: none) */
} tval;

struct tlist {
    size_t n, cap;
    tval *v;
};
struct tdict {
    size_t n, cap;
    tval *key, *val;
};

typedef struct tnode tnode;
typedef enum tfunc_kind { TF_BUILTIN, TF_MACRO, TF_METHOD } tfunc_kind;
struct tfunc {
    int kind;
    const char *name; /* builtin/method name */
    const tnode *macro;
    tval self;           /* method receiver */
    struct tscope *defs; /* macro: scope it resolves free names in */
    const tnode *caller; /* a call block's body, when this is `caller` */
    struct tscope *caller_scope;
};

// ---- AST ---------------------------------------------------------------------------------------
typedef enum tnode_type {
    /* statements */
    N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK,
    N_BREAK, N_CONTINUE,
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_BIN, N_NEG, N_POS, N_NOT,
    N_AND, N_OR, N_COND, N_LIST, N_TUPLE, N_DICT, N_CONCAT,
} tnode_type;

struct tnode {
    uint8_t type;
    uint8_t neg; /* N_TEST: `is not`; N_FOR: recursive */
    int op;      /* N_BIN: operator code (TOK_*) */
    int line;
    tnode *a, *b, *c, *d;
    tnode **kid; /* body statements, call args, list items, dict k/v pairs */
    int nkid;
    const char **kwname; /* keyword arguments (calls, filters, macro defaults) */
    tnode **kwval;
    int nkw;
    const char *name; /* variable, attribute, filter, test, macro, target names */
    const char **names; /* tuple targets, macro parameters */
    int nnames;
    tval lit;
};

// ---- lexer/parser (parse.c) --------------------------------------------------------------------
enum {
    TOK_EOF, TOK_TEXT, TOK_VAR_BEGIN, TOK_VAR_END, TOK_BLOCK_BEGIN, TOK_BLOCK_END, TOK_NAME,
    TOK_STRING, TOK_INT, TOK_FLOAT,
    /* operators */
    TOK_ADD, TOK_SUB, TOK_MUL, TOK_DIV, TOK_FLOORDIV, TOK_MOD, TOK_POW, TOK_TILDE, TOK_LBRACKET,
    TOK_RBRACKET, TOK_LPAREN, TOK_RPAREN, TOK_LBRACE, TOK_RBRACE, TOK_EQ, TOK_NE, TOK_LT, TOK_LTEQ,
    TOK_GT, TOK_GTEQ, TOK_ASSIGN, TOK_DOT, TOK_COLON, TOK_PIPE, TOK_COMMA, TOK_SEMICOLON,
    TOK_IN, TOK_NOTIN, /* only as N_BIN ops */
};

/* The variable a filter block's / block set's filter chain reads its rendered body from (not an
 * identifier, so no template can name it). */
#define TMPL_HOLDER " body"

struct osp_chat_template {
    tarena arena; /* the AST and its strings */
    tnode *root;
};

/* Is `name` a filter / test osprey implements (builtins.c)? The parser rejects unknown ones up
 * front, as jinja2 does when it compiles a template. */
bool tmpl_has_filter(const char *name);
bool tmpl_has_test(const char *name);

// ---- shared helpers ----------------------------------------------------------------------------
typedef struct tbuf {
    char *p;
    size_t n, cap;
    struct trender *r; /* grows in the render's arena */
    tspan *sp;         /* tainted byte ranges of p[0..n), sorted and merged */
    size_t nsp, capsp;
} tbuf;

typedef struct trender trender;
void *tarena_alloc(tarena *a, size_t n); /* NULL when over the limit or out of memory */
void tarena_free(tarena *a);

/* Render-time state (eval.c); builtins.c uses these. */
_Noreturn void tmpl_fail(trender *r, int line, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void *tmpl_alloc(trender *r, size_t n);
void tmpl_tick(trender *r, size_t n); /* charges n units of work against the budget */
int tmpl_line(trender *r);            /* line of the construct being evaluated */
tval tv_str(trender *r, const char *p, size_t n);
tval tv_cstr(const char *p);
tval tv_int(int64_t i);
tval tv_float(double f);
tval tv_bool(bool b);
tval tv_none(void);
tval tv_undef(const char *name);
tlist *tl_new(trender *r, size_t cap);
void tl_push(trender *r, tlist *l, tval v);
tval tv_list(tlist *l);
tdict *td_new(trender *r, size_t cap);
void td_set(trender *r, tdict *d, tval k, tval v);
const tval *td_get(const tdict *d, tval k);
const tval *td_getc(const tdict *d, const char *k);
bool tv_truthy(tval v);
bool tv_eq(tval a, tval b);
int tv_cmp(trender *r, tval a, tval b); /* Python ordering; fails on mixed types */
void tb_put(tbuf *b, const char *p, size_t n);
void tb_putc(tbuf *b, char c);
void tb_puts(tbuf *b, const char *s);
tbuf tb_make(trender *r);
tval tb_val(tbuf *b); /* the text so far as a TV_STR, with its taint */
/* Taint-keeping writes: s's bytes [off, off + n) (or all of them) with their provenance. */
void tb_put_sub(tbuf *b, tval s, size_t off, size_t n);
void tb_put_val(tbuf *b, tval s);
/* Marks the output bytes written since `o0` tainted when any of s's bytes [a, e) is: for
 * transformations that turn each input piece into an output piece (escapes, case mapping). */
void tb_taint_from(tbuf *b, size_t o0, tval s, size_t a, size_t e);
bool taint_any(tval s, size_t a, size_t e);                       /* any tainted byte in [a, e)? */
const ttaint *taint_slice(trender *r, tval s, size_t a, size_t e); /* the taint of s[a..e) */
/* An operation could not keep exact provenance: the render reports it (provenance_lost) and the
 * caller falls back to treating the whole text as the template's. */
void tmpl_taint_lost(trender *r);
void tv_to_str(trender *r, tbuf *b, tval v);   /* Python str() */
void tv_repr(trender *r, tbuf *b, tval v);     /* Python repr() */
tval tv_stringify(trender *r, tval v);          /* str() as a TV_STR value */
tval tmpl_html_escape(trender *r, tval s);      /* markupsafe.escape (a Markup comes back as is) */
void tv_tojson(trender *r, tbuf *b, tval v, int indent, const char *item_sep, const char *key_sep,
               bool sort_keys, bool ascii, int depth);
const char *tv_type_name(tval v);
size_t utf8_len(const char *p, size_t n);            /* code points */
size_t utf8_offset(const char *p, size_t n, size_t cp); /* byte offset of code point cp (<= len) */

/* builtins.c: call a filter / test / method / global function. */
tval tmpl_filter(trender *r, const char *name, tval in, int nargs, const tval *args, int nkw,
                 const char **kwn, const tval *kwv);
bool tmpl_test(trender *r, const char *name, tval in, int nargs, const tval *args);
tval tmpl_call_method(trender *r, tval self, const char *name, int nargs, const tval *args, int nkw,
                      const char **kwn, const tval *kwv);
tval tmpl_call_global(trender *r, const char *name, int nargs, const tval *args, int nkw,
                      const char **kwn, const tval *kwv);
/* Attribute lookup as jinja2's sandboxed getattr: a dict method name gives a bound method, a dict
 * key its value, anything else Undefined. */
tval tmpl_getattr(trender *r, tval obj, const char *name);
tval tmpl_getitem(trender *r, tval obj, tval key);
/* Calls any callable value (macro, method, builtin). */
tval tmpl_call(trender *r, tval fn, int nargs, const tval *args, int nkw, const char **kwn,
               const tval *kwv);
/* Iterates a value as Python's iter() would (list items, dict keys, string characters). */
tlist *tmpl_iterate(trender *r, tval v);

#endif
