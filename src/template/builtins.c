/* Chat templates: filters, tests, str/dict/list methods, globals and attribute access, each as
 * jinja2 3.1 (filters.py, tests.py, sandbox.py) and Python 3 define them.
 *
 * Filters: abs attr batch capitalize count d default dictsort e escape first float format indent
 *   int items join last length list lower map max min reject rejectattr replace reverse round safe
 *   select selectattr sort string sum title tojson trim unique upper wordcount.
 *   jinja2's other filters (center, groupby, truncate, wordwrap, ...) parse, and fail with
 *   OSP_ERR_UNSUPPORTED when rendered.
 * Tests: all of jinja2's (defined undefined none boolean true false integer float number string
 *   mapping sequence iterable callable sameas escaped in odd even divisibleby lower upper
 *   eq/equalto/== ne/!= lt/</lessthan le/<= gt/>/greaterthan ge/>= filter test).
 * Methods: str strip lstrip rstrip split rsplit splitlines startswith endswith upper lower title
 *   capitalize replace format find rfind index rindex count join isdigit isalpha isalnum isspace
 *   isupper islower; dict get items keys values; list index count. Under the immutable sandbox
 *   the mutating ones (list.append, dict.pop, dict.update, ...) raise, as in transformers.
 * Globals: range (at most 100000 items, as the sandbox), namespace, dict, raise_exception,
 *   strftime_now.
 * Case mapping covers ASCII and Latin-1; other scripts pass through unchanged (Python would map
 * them too). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "template/template_internal.h"

tval tmpl_strftime_now(trender *r, tval fmt);

#define FAIL(...) tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, __VA_ARGS__)
#define UNSUP(...) tmpl_fail(r, 0, OSP_ERR_UNSUPPORTED, __VA_ARGS__)

// ---- names -------------------------------------------------------------------------------------
static const char *const k_filters[] = {
    "abs", "attr", "batch", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
    "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "unique", "upper", "wordcount",
    /* jinja2 has these; osprey does not implement them */
    "center", "filesizeformat", "forceescape", "groupby", "pprint", "random", "slice", "striptags", "truncate",
    "urlencode", "urlize", "wordwrap", "xmlattr", NULL};
static const char *const k_tests[] = {
    "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number", "string", "mapping",
    "sequence", "iterable", "callable", "sameas", "escaped", "in", "odd", "even", "divisibleby", "lower", "upper",
    "eq", "equalto", "ne", "lt", "lessthan", "le", "gt", "greaterthan", "ge", "filter", "test", NULL};

static bool in_list(const char *const *l, const char *s) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], s)) return true;
    return false;
}
bool tmpl_has_filter(const char *name) { return in_list(k_filters, name); }
bool tmpl_has_test(const char *name) { return in_list(k_tests, name); }

// ---- helpers -----------------------------------------------------------------------------------
static bool is_intlike(tval v) { return v.k == TV_INT || v.k == TV_BOOL; }
static bool is_number(tval v) { return v.k == TV_INT || v.k == TV_BOOL || v.k == TV_FLOAT; }

/* Keyword argument `name`, or positional `pos`, or NULL. */
static const tval *arg(int nargs, const tval *args, int nkw, const char **kwn, const tval *kwv, int pos,
                       const char *name) {
    for (int i = 0; i < nkw; i++)
        if (!strcmp(kwn[i], name)) return &kwv[i];
    return pos >= 0 && pos < nargs ? &args[pos] : NULL;
}
#define ARG(pos, name) arg(nargs, args, nkw, kwn, kwv, pos, name)

static tval str_of(trender *r, tval v) { return tv_stringify(r, v); }

static tval gen(tlist *l) {
    tval v = tv_list(l);
    v.flag = TVF_GEN;
    return v;
}

static size_t py_len(trender *r, tval v) {
    switch (v.k) {
    case TV_UNDEF: return 0;
    case TV_STR: return utf8_len(v.s.p, v.s.n);
    case TV_LIST:
        if (v.flag & TVF_GEN) FAIL("object of type 'generator' has no len()");
        return v.l->n;
    case TV_DICT: return v.d->n;
    default: FAIL("object of type '%s' has no len()", tv_type_name(v));
    }
}

/* Decodes one UTF-8 code point at p[*i] (invalid bytes map to themselves). */
static uint32_t cp_at(const char *p, size_t n, size_t *i) {
    unsigned char c = (unsigned char)p[*i];
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (*i + (size_t)extra >= n + (extra ? 0 : 1)) extra = 0;
    uint32_t cp = extra ? (c & (0x3F >> extra)) : c;
    for (int k = 1; k <= extra; k++) cp = cp << 6 | ((unsigned char)p[*i + (size_t)k] & 0x3F);
    *i += 1 + (size_t)extra;
    return cp;
}
static void put_cp(tbuf *b, uint32_t cp) {
    char o[4];
    size_t k = 0;
    if (cp < 0x80) o[k++] = (char)cp;
    else if (cp < 0x800) o[k++] = (char)(0xC0 | cp >> 6), o[k++] = (char)(0x80 | (cp & 63));
    else if (cp < 0x10000) o[k++] = (char)(0xE0 | cp >> 12), o[k++] = (char)(0x80 | (cp >> 6 & 63)), o[k++] = (char)(0x80 | (cp & 63));
    else o[k++] = (char)(0xF0 | cp >> 18), o[k++] = (char)(0x80 | (cp >> 12 & 63)), o[k++] = (char)(0x80 | (cp >> 6 & 63)), o[k++] = (char)(0x80 | (cp & 63));
    tb_put(b, o, k);
}

static bool py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
static uint32_t to_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c >= 0xe0 && c <= 0xfe && c != 0xf7) return c - 32;
    return c;
}
static uint32_t to_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
    return c;
}
static bool is_alpha_cp(uint32_t c) { return (c < 128 && isalpha((int)c)) || (c >= 0xc0 && c != 0xd7 && c != 0xf7); }
static bool is_cased(uint32_t c) { return to_upper(c) != c || to_lower(c) != c; }

enum { CASE_UPPER, CASE_LOWER, CASE_PYTITLE, CASE_CAPITALIZE, CASE_JTITLE };
static tval map_case(trender *r, tval s, int mode) {
    tbuf b = tb_make(r);
    bool prev_cased = false, first = true, word_start = true;
    for (size_t i = 0; i < s.s.n;) {
        const size_t i0 = i, o0 = b.n;
        uint32_t c = cp_at(s.s.p, s.s.n, &i), o = c;
        switch (mode) {
        case CASE_UPPER: o = to_upper(c); break;
        case CASE_LOWER: o = to_lower(c); break;
        case CASE_PYTITLE: o = prev_cased ? to_lower(c) : to_upper(c); break;
        case CASE_CAPITALIZE: o = first ? to_upper(c) : to_lower(c); break;
        case CASE_JTITLE: {
            const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_space(c);
            if (sep) {
                o = c;
                word_start = true;
            } else {
                o = word_start ? to_upper(c) : to_lower(c);
                word_start = false;
            }
            break;
        }
        }
        prev_cased = is_cased(c) || is_alpha_cp(c);
        first = false;
        put_cp(&b, o);
        if (s.taint) tb_taint_from(&b, o0, s, i0, i);
    }
    return tb_val(&b);
}

/* Python str.strip family: chars NULL = whitespace. which: 1 left, 2 right, 3 both. */
static tval py_strip(trender *r, tval s, const tval *chars, int which) {
    if (chars && chars->k != TV_NONE && chars->k != TV_STR) FAIL("strip arg must be None or str");
    const bool ws = !chars || chars->k == TV_NONE;
    size_t a = 0, b = s.s.n;
    if (which & 1)
        while (a < b) {
            size_t j = a;
            uint32_t c = cp_at(s.s.p, b, &j);
            bool hit;
            if (ws) hit = py_space(c);
            else {
                hit = false;
                for (size_t k = 0; k < chars->s.n;) {
                    if (cp_at(chars->s.p, chars->s.n, &k) == c) hit = true;
                }
            }
            if (!hit) break;
            a = j;
        }
    if (which & 2)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)s.s.p[st] & 0xC0) == 0x80) st--;
            size_t j = st;
            uint32_t c = cp_at(s.s.p, b, &j);
            bool hit;
            if (ws) hit = py_space(c);
            else {
                hit = false;
                for (size_t k = 0; k < chars->s.n;) {
                    if (cp_at(chars->s.p, chars->s.n, &k) == c) hit = true;
                }
            }
            if (!hit) break;
            b = st;
        }
    tval o = {.k = TV_STR};
    o.s.p = s.s.p + a;
    o.s.n = b - a;
    o.taint = taint_slice(r, s, a, b);
    return o;
}

/* s[a..b) as a value of its own, with its provenance. */
static tval substr(trender *r, tval s, size_t a, size_t b) {
    tval o = {.k = TV_STR};
    o.s.p = s.s.p + a;
    o.s.n = b - a;
    o.taint = taint_slice(r, s, a, b);
    return o;
}

static const char *find_sub(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, nd, nn);
}

static tval py_split(trender *r, tval s, const tval *sep, const tval *maxsplit, bool from_right) {
    int64_t maxs = maxsplit && is_intlike(*maxsplit) ? maxsplit->i : -1;
    tlist *out = tl_new(r, 0);
    if (!sep || sep->k == TV_NONE) {
        /* runs of whitespace; leading/trailing ignored */
        if (from_right) {
            size_t e = s.s.n;
            tlist *rev = tl_new(r, 0);
            for (;;) {
                while (e > 0 && py_space((unsigned char)s.s.p[e - 1])) e--;
                if (e == 0) break;
                size_t st = e;
                if (maxs >= 0 && (int64_t)rev->n == maxs) {
                    tl_push(r, rev, substr(r, s, 0, e));
                    break;
                }
                while (st > 0 && !py_space((unsigned char)s.s.p[st - 1])) st--;
                tl_push(r, rev, substr(r, s, st, e));
                e = st;
            }
            for (size_t i = rev->n; i-- > 0;) tl_push(r, out, rev->v[i]);
            return tv_list(out);
        }
        size_t i = 0;
        for (;;) {
            while (i < s.s.n) {
                size_t j = i;
                if (!py_space(cp_at(s.s.p, s.s.n, &j))) break;
                i = j;
            }
            if (i >= s.s.n) break;
            if (maxs >= 0 && (int64_t)out->n == maxs) {
                size_t e = s.s.n;
                while (e > i && py_space((unsigned char)s.s.p[e - 1])) e--;
                tl_push(r, out, substr(r, s, i, e));
                break;
            }
            size_t st = i;
            while (i < s.s.n) {
                size_t j = i;
                if (py_space(cp_at(s.s.p, s.s.n, &j))) break;
                i = j;
            }
            tl_push(r, out, substr(r, s, st, i));
        }
        return tv_list(out);
    }
    if (sep->k != TV_STR) FAIL("split: separator must be str or None");
    if (!sep->s.n) FAIL("split: empty separator");
    if (from_right && maxs >= 0) {
        tlist *rev = tl_new(r, 0);
        size_t e = s.s.n;
        while ((int64_t)rev->n < maxs) {
            const char *hit = NULL;
            for (size_t k = e; k >= sep->s.n; k--)
                if (!memcmp(s.s.p + k - sep->s.n, sep->s.p, sep->s.n)) {
                    hit = s.s.p + k - sep->s.n;
                    break;
                }
            if (!hit) break;
            tl_push(r, rev, substr(r, s, (size_t)(hit - s.s.p) + sep->s.n, e));
            e = (size_t)(hit - s.s.p);
        }
        tl_push(r, rev, substr(r, s, 0, e));
        for (size_t i = rev->n; i-- > 0;) tl_push(r, out, rev->v[i]);
        return tv_list(out);
    }
    size_t i = 0;
    for (;;) {
        tmpl_tick(r, 1);
        const char *hit = (maxs < 0 || (int64_t)out->n < maxs) ? find_sub(s.s.p + i, s.s.n - i, sep->s.p, sep->s.n) : NULL;
        if (!hit) {
            tl_push(r, out, substr(r, s, i, s.s.n));
            break;
        }
        size_t at = (size_t)(hit - s.s.p);
        tl_push(r, out, substr(r, s, i, at));
        i = at + sep->s.n;
    }
    return tv_list(out);
}

static tval py_replace(trender *r, tval s, tval old, tval nw, int64_t count) {
    if (old.k != TV_STR || nw.k != TV_STR) FAIL("replace() arguments must be str");
    tbuf b = tb_make(r);
    size_t i = 0;
    int64_t done = 0;
    if (!old.s.n) {
        for (;;) {
            if (count < 0 || done < count) {
                tb_put_val(&b, nw);
                done++;
            }
            if (i >= s.s.n) break;
            size_t j = i;
            cp_at(s.s.p, s.s.n, &j);
            tb_put_sub(&b, s, i, j - i);
            i = j;
        }
        return tb_val(&b);
    }
    while (i <= s.s.n) {
        tmpl_tick(r, 1);
        const char *hit = (count < 0 || done < count) ? find_sub(s.s.p + i, s.s.n - i, old.s.p, old.s.n) : NULL;
        if (!hit) {
            tb_put_sub(&b, s, i, s.s.n - i);
            break;
        }
        size_t at = (size_t)(hit - s.s.p);
        tb_put_sub(&b, s, i, at - i);
        tb_put_val(&b, nw);
        i = at + old.s.n;
        done++;
    }
    return tb_val(&b);
}

static bool affix(trender *r, tval s, tval a, bool end) {
    if (a.k == TV_LIST && a.is_tuple) {
        for (size_t i = 0; i < a.l->n; i++)
            if (affix(r, s, a.l->v[i], end)) return true;
        return false;
    }
    if (a.k != TV_STR) FAIL("%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith", tv_type_name(a));
    if (a.s.n > s.s.n) return false;
    return !memcmp(end ? s.s.p + s.s.n - a.s.n : s.s.p, a.s.p, a.s.n);
}

/* str.format under jinja2's sandbox: {} {0} {name} and {{ }}; a format spec is not supported. */
static tval py_format(trender *r, tval s, int nargs, const tval *args, int nkw, const char **kwn, const tval *kwv) {
    tbuf b = tb_make(r);
    int auto_idx = 0;
    for (size_t i = 0; i < s.s.n; i++) {
        char c = s.s.p[i];
        if (c == '{' && i + 1 < s.s.n && s.s.p[i + 1] == '{') {
            tb_put_sub(&b, s, i, 1);
            i++;
        } else if (c == '}' && i + 1 < s.s.n && s.s.p[i + 1] == '}') {
            tb_put_sub(&b, s, i, 1);
            i++;
        } else if (c == '{') {
            size_t j = i + 1;
            while (j < s.s.n && s.s.p[j] != '}') j++;
            if (j >= s.s.n) FAIL("str.format: single '{' encountered in format string");
            const char *f = s.s.p + i + 1;
            size_t fl = j - i - 1;
            if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) || memchr(f, '[', fl))
                UNSUP("str.format field '{%.*s}' (conversions, specs and lookups are not supported)", (int)fl, f);
            tval v;
            if (fl == 0) {
                if (auto_idx >= nargs) FAIL("str.format: replacement index %d out of range", auto_idx);
                v = args[auto_idx++];
            } else if (isdigit((unsigned char)f[0])) {
                long idx = 0;
                for (size_t q = 0; q < fl; q++) {
                    if (!isdigit((unsigned char)f[q])) UNSUP("str.format field '{%.*s}'", (int)fl, f);
                    if (idx < 100000) idx = idx * 10 + (f[q] - '0');
                }
                if (idx >= nargs) FAIL("str.format: replacement index %ld out of range", idx);
                v = args[idx];
            } else {
                const tval *kv = NULL;
                for (int k = 0; k < nkw; k++)
                    if (strlen(kwn[k]) == fl && !memcmp(kwn[k], f, fl)) kv = &kwv[k];
                if (!kv) FAIL("str.format: missing key '%.*s'", (int)fl, f);
                v = *kv;
            }
            tv_to_str(r, &b, v);
            i = j;
        } else if (c == '}') {
            FAIL("str.format: single '}' encountered in format string");
        } else {
            tb_put_sub(&b, s, i, 1);
        }
    }
    return tb_val(&b);
}

// ---- attribute and item access -----------------------------------------------------------------
static const char *const k_str_methods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower", "title",
    "capitalize", "replace", "format", "find", "rfind", "index", "rindex", "count", "join", "isdigit", "isalpha",
    "isalnum", "isspace", "isupper", "islower", "center", "ljust", "rjust", "zfill", "swapcase", "partition",
    "rpartition", "casefold", "expandtabs", "encode", "format_map", "isnumeric", "isdecimal", "istitle",
    "isidentifier", "isprintable", "isascii", "removeprefix", "removesuffix", "translate", "maketrans", NULL};
static const char *const k_dict_methods[] = {"get", "items", "keys", "values", "copy", "pop", "popitem",
                                             "update", "setdefault", "clear", "fromkeys", NULL};
static const char *const k_list_methods[] = {"index", "count", "copy", "append", "extend", "insert", "pop",
                                             "remove", "reverse", "sort", "clear", NULL};

static tval method(trender *r, tval self, const char *name) {
    tfunc *f = tmpl_alloc(r, sizeof *f);
    memset(f, 0, sizeof *f);
    f->kind = TF_METHOD;
    f->name = name;
    f->self = self;
    return (tval){.k = TV_FUNC, .fn = f};
}

tval tmpl_getattr(trender *r, tval obj, const char *name) {
    if (name[0] == '_') return tv_undef(name);
    switch (obj.k) {
    case TV_DICT: {
        for (int i = 0; k_dict_methods[i]; i++)
            if (!strcmp(name, k_dict_methods[i])) return method(r, obj, k_dict_methods[i]);
        const tval *v = td_getc(obj.d, name);
        return v ? *v : tv_undef(name);
    }
    case TV_NS: {
        const tval *v = td_getc(obj.d, name);
        return v ? *v : tv_undef(name);
    }
    case TV_STR:
        for (int i = 0; k_str_methods[i]; i++)
            if (!strcmp(name, k_str_methods[i])) return method(r, obj, k_str_methods[i]);
        return tv_undef(name);
    case TV_LIST:
        for (int i = 0; k_list_methods[i]; i++)
            if (!strcmp(name, k_list_methods[i])) return method(r, obj, k_list_methods[i]);
        return tv_undef(name);
    default: return tv_undef(name);
    }
}

tval tmpl_getitem(trender *r, tval obj, tval key) {
    switch (obj.k) {
    case TV_DICT: {
        if (key.k == TV_LIST && !key.is_tuple) FAIL("unhashable type: 'list'");
        const tval *v = td_get(obj.d, key);
        if (v) return *v;
        break;
    }
    case TV_LIST:
    case TV_STR:
        if (is_intlike(key)) {
            int64_t n = obj.k == TV_LIST ? (int64_t)obj.l->n : (int64_t)utf8_len(obj.s.p, obj.s.n), i = key.i;
            if (i < 0) i += n;
            if (i < 0 || i >= n) return tv_undef("index");
            if (obj.k == TV_LIST) return obj.l->v[i];
            size_t a = utf8_offset(obj.s.p, obj.s.n, (size_t)i), b = utf8_offset(obj.s.p, obj.s.n, (size_t)i + 1);
            return substr(r, obj, a, b);
        }
        break;
    default: break;
    }
    if (key.k == TV_STR) {
        char *nm = tmpl_alloc(r, key.s.n + 1);
        memcpy(nm, key.s.p, key.s.n);
        nm[key.s.n] = 0;
        if (strlen(nm) == key.s.n) return tmpl_getattr(r, obj, nm);
    }
    return tv_undef("item");
}

/* jinja2's make_attrgetter: "a.b.0" walks items; integers in the path are indices. */
static tval attr_path(trender *r, tval v, tval path) {
    if (path.k == TV_INT) return tmpl_getitem(r, v, path);
    if (path.k != TV_STR) FAIL("attribute must be a string");
    size_t i = 0;
    while (i <= path.s.n) {
        size_t j = i;
        while (j < path.s.n && path.s.p[j] != '.') j++;
        tval part = substr(r, path, i, j);
        bool digits = j > i;
        for (size_t k = i; k < j; k++)
            if (!isdigit((unsigned char)path.s.p[k])) digits = false;
        if (v.k == TV_UNDEF) FAIL("'%s' is undefined", v.s.p ? v.s.p : "value");
        v = digits ? tmpl_getitem(r, v, tv_int(strtoll(part.s.p, NULL, 10))) : tmpl_getitem(r, v, tv_str(r, part.s.p, part.s.n));
        i = j + 1;
    }
    return v;
}

// ---- tests -------------------------------------------------------------------------------------
bool tmpl_test(trender *r, const char *name, tval v, int nargs, const tval *args) {
    const tval *a0 = nargs > 0 ? &args[0] : NULL;
#define NEED_ARG()                                                                                  \
    do {                                                                                            \
        if (!a0) FAIL("test '%s' needs an argument", name);                                         \
    } while (0)
    if (!strcmp(name, "defined")) return v.k != TV_UNDEF;
    if (!strcmp(name, "undefined")) return v.k == TV_UNDEF;
    if (!strcmp(name, "none")) return v.k == TV_NONE;
    if (!strcmp(name, "boolean")) return v.k == TV_BOOL;
    if (!strcmp(name, "true")) return v.k == TV_BOOL && v.i;
    if (!strcmp(name, "false")) return v.k == TV_BOOL && !v.i;
    if (!strcmp(name, "integer")) return v.k == TV_INT;
    if (!strcmp(name, "float")) return v.k == TV_FLOAT;
    if (!strcmp(name, "number")) return is_number(v);
    if (!strcmp(name, "string")) return v.k == TV_STR;
    if (!strcmp(name, "mapping")) return v.k == TV_DICT;
    if (!strcmp(name, "sequence")) return v.k == TV_STR || v.k == TV_LIST || v.k == TV_DICT || v.k == TV_UNDEF;
    if (!strcmp(name, "iterable")) return v.k == TV_STR || v.k == TV_LIST || v.k == TV_DICT || v.k == TV_UNDEF;
    if (!strcmp(name, "callable")) return v.k == TV_FUNC;
    if (!strcmp(name, "escaped")) return false;
    if (!strcmp(name, "sameas")) {
        NEED_ARG();
        if (v.k != a0->k) return false;
        if (v.k == TV_NONE || v.k == TV_BOOL) return tv_eq(v, *a0);
        if (v.k == TV_LIST) return v.l == a0->l;
        if (v.k == TV_DICT || v.k == TV_NS) return v.d == a0->d;
        return false;
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (!is_intlike(v)) FAIL("test '%s' needs an integer, not %s", name, tv_type_name(v));
        return ((v.i % 2 + 2) % 2 == 1) == (name[0] == 'o');
    }
    if (!strcmp(name, "divisibleby")) {
        NEED_ARG();
        if (!is_intlike(v) || !is_intlike(*a0)) FAIL("divisibleby needs integers");
        if (a0->i == 0) FAIL("integer division or modulo by zero");
        return v.i % a0->i == 0;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        tval s = str_of(r, v);
        tval m = map_case(r, s, name[0] == 'l' ? CASE_LOWER : CASE_UPPER);
        return tv_eq(s, m);
    }
    if (!strcmp(name, "in")) {
        NEED_ARG();
        tval c = *a0;
        if (c.k == TV_STR) {
            if (v.k != TV_STR) FAIL("'in <string>' requires string as left operand");
            return find_sub(c.s.p, c.s.n, v.s.p, v.s.n) != NULL;
        }
        if (c.k == TV_LIST) {
            for (size_t i = 0; i < c.l->n; i++)
                if (tv_eq(v, c.l->v[i])) return true;
            return false;
        }
        if (c.k == TV_DICT) return td_get(c.d, v) != NULL;
        if (c.k == TV_UNDEF) return false;
        FAIL("argument of type '%s' is not iterable", tv_type_name(c));
    }
    if (!strcmp(name, "eq") || !strcmp(name, "equalto")) {
        NEED_ARG();
        return tv_eq(v, *a0);
    }
    if (!strcmp(name, "ne")) {
        NEED_ARG();
        return !tv_eq(v, *a0);
    }
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan")) {
        NEED_ARG();
        return tv_cmp(r, v, *a0) < 0;
    }
    if (!strcmp(name, "le")) {
        NEED_ARG();
        return tv_cmp(r, v, *a0) <= 0;
    }
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan")) {
        NEED_ARG();
        return tv_cmp(r, v, *a0) > 0;
    }
    if (!strcmp(name, "ge")) {
        NEED_ARG();
        return tv_cmp(r, v, *a0) >= 0;
    }
    if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        if (v.k != TV_STR) return false;
        char nm[64];
        if (v.s.n >= sizeof nm) return false;
        memcpy(nm, v.s.p, v.s.n);
        nm[v.s.n] = 0;
        return name[0] == 'f' ? tmpl_has_filter(nm) : tmpl_has_test(nm);
    }
    UNSUP("the '%s' test", name);
#undef NEED_ARG
}

// ---- filters -----------------------------------------------------------------------------------
/* Sort key: strings lower-cased unless case_sensitive. */
static tval sort_key(trender *r, tval v, bool cs) { return !cs && v.k == TV_STR ? map_case(r, v, CASE_LOWER) : v; }

static void stable_sort(trender *r, tval *items, tval *keys, size_t n, bool reverse) {
    /* insertion sort keeps ties in order; lists in templates are short */
    tmpl_tick(r, n * n / 4 + 1);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            int c = tv_cmp(r, keys[j - 1], keys[j]);
            if (reverse ? c >= 0 : c <= 0) break;
            tval t = keys[j];
            keys[j] = keys[j - 1];
            keys[j - 1] = t;
            t = items[j];
            items[j] = items[j - 1];
            items[j - 1] = t;
        }
}

static tlist *copy_items(trender *r, tval v) {
    tlist *src = tmpl_iterate(r, v);
    tlist *l = tl_new(r, src->n);
    for (size_t i = 0; i < src->n; i++) tl_push(r, l, src->v[i]);
    return l;
}

static tval select_common(trender *r, tval in, int nargs, const tval *args, bool by_attr, bool keep) {
    if (!tv_truthy(in)) return gen(tl_new(r, 0)); /* jinja2: `if value:` around the loop */
    tlist *items = tmpl_iterate(r, in), *out = tl_new(r, 0);
    int k = 0;
    tval attr = {0};
    if (by_attr) {
        if (nargs < 1) FAIL("%sattr needs an attribute name", keep ? "select" : "reject");
        attr = args[k++];
    }
    const char *test = NULL;
    char tn[64];
    if (k < nargs) {
        if (args[k].k != TV_STR || args[k].s.n >= sizeof tn) FAIL("test name must be a string");
        memcpy(tn, args[k].s.p, args[k].s.n);
        tn[args[k].s.n] = 0;
        if (!tmpl_has_test(tn)) FAIL("no test named '%s'", tn);
        test = tn;
        k++;
    }
    for (size_t i = 0; i < items->n; i++) {
        tval x = by_attr ? attr_path(r, items->v[i], attr) : items->v[i];
        bool t = test ? tmpl_test(r, test, x, nargs - k, args + k) : tv_truthy(x);
        if (t == keep) tl_push(r, out, items->v[i]);
    }
    return gen(out);
}

tval tmpl_html_escape(trender *r, tval s) {
    if (s.flag & TVF_MARKUP) return s;
    tbuf b = tb_make(r);
    for (size_t i = 0; i < s.s.n; i++) {
        char c = s.s.p[i];
        const size_t o0 = b.n;
        switch (c) {
        case '&': tb_puts(&b, "&amp;"); break;
        case '<': tb_puts(&b, "&lt;"); break;
        case '>': tb_puts(&b, "&gt;"); break;
        case '"': tb_puts(&b, "&#34;"); break;
        case '\'': tb_puts(&b, "&#39;"); break;
        default: tb_putc(&b, c);
        }
        if (s.taint) tb_taint_from(&b, o0, s, i, i + 1);
    }
    tval v = tb_val(&b);
    v.flag = TVF_MARKUP;
    return v;
}

static bool parse_py_int(const char *p, size_t n, int64_t *out) {
    char buf[64];
    size_t k = 0;
    size_t a = 0, b = n;
    while (a < b && isspace((unsigned char)p[a])) a++;
    while (b > a && isspace((unsigned char)p[b - 1])) b--;
    if (a == b || b - a >= sizeof buf) return false;
    for (size_t i = a; i < b; i++) {
        if (p[i] == '_') continue;
        buf[k++] = p[i];
    }
    buf[k] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}
static bool parse_py_float(const char *p, size_t n, double *out) {
    char buf[128];
    size_t a = 0, b = n;
    while (a < b && isspace((unsigned char)p[a])) a++;
    while (b > a && isspace((unsigned char)p[b - 1])) b--;
    if (a == b || b - a >= sizeof buf) return false;
    memcpy(buf, p + a, b - a);
    buf[b - a] = 0;
    if (strchr(buf, 'x') || strchr(buf, 'X')) return false;
    char *end;
    double v = strtod(buf, &end);
    if (*end) return false;
    *out = v;
    return true;
}

static tval do_indent(trender *r, tval s, tval width, bool first, bool blank) {
    tval ind;
    if (width.k == TV_STR) ind = width;
    else if (is_intlike(width)) {
        tbuf b = tb_make(r);
        for (int64_t i = 0; i < width.i && i < 4096; i++) tb_putc(&b, ' ');
        ind = tb_val(&b);
    } else FAIL("indent width must be an int or a string");
    /* (s + "\n").splitlines() == s split at every line end, all pieces kept */
    tlist *lines = tl_new(r, 0), *ends = tl_new(r, 0); /* ends: each line's terminator, for its provenance */
    const char *p = s.s.p;
    const size_t n = s.s.n;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != '\n' && p[j] != '\r' && p[j] != '\v' && p[j] != '\f') j++;
        tl_push(r, lines, substr(r, s, i, j));
        if (j >= n) break;
        const size_t e0 = j;
        if (p[j] == '\r' && j + 1 < n && p[j + 1] == '\n') j++;
        tl_push(r, ends, substr(r, s, e0, j + 1));
        i = j + 1;
    }
    tbuf b = tb_make(r);
    for (size_t k = 0; k < lines->n; k++) {
        tval ln = lines->v[k];
        if (k) { /* the line end is written as '\n', tainted when the one it replaces was */
            const size_t o0 = b.n;
            tb_putc(&b, '\n');
            tb_taint_from(&b, o0, ends->v[k - 1], 0, ends->v[k - 1].s.n);
        }
        if (k && (blank || ln.s.n)) tb_put_val(&b, ind);
        tb_put_val(&b, ln);
    }
    tval out = tb_val(&b);
    if (first) {
        tbuf c = tb_make(r);
        tb_put_val(&c, ind);
        tb_put_val(&c, out);
        out = tb_val(&c);
    }
    return out;
}

tval tmpl_filter(trender *r, const char *name, tval in, int nargs, const tval *args, int nkw, const char **kwn,
                 const tval *kwv) {
    const tval *a;
    tmpl_tick(r, 1);
    if (!strcmp(name, "safe")) {
        tval v = str_of(r, in);
        v.flag = TVF_MARKUP;
        return v;
    }
    if (!strcmp(name, "string")) return str_of(r, in);
    if (!strcmp(name, "trim")) return py_strip(r, str_of(r, in), ARG(0, "chars"), 3);
    if (!strcmp(name, "upper")) return map_case(r, str_of(r, in), CASE_UPPER);
    if (!strcmp(name, "lower")) return map_case(r, str_of(r, in), CASE_LOWER);
    if (!strcmp(name, "title")) return map_case(r, str_of(r, in), CASE_JTITLE);
    if (!strcmp(name, "capitalize")) return map_case(r, str_of(r, in), CASE_CAPITALIZE);
    if (!strcmp(name, "e") || !strcmp(name, "escape")) return tmpl_html_escape(r, str_of(r, in));
    if (!strcmp(name, "length") || !strcmp(name, "count")) return tv_int((int64_t)py_len(r, in));
    if (!strcmp(name, "d") || !strcmp(name, "default")) {
        const tval *dv = ARG(0, "default_value"), *bo = ARG(1, "boolean");
        bool use = in.k == TV_UNDEF || (bo && tv_truthy(*bo) && !tv_truthy(in));
        return use ? (dv ? *dv : tv_cstr("")) : in;
    }
    if (!strcmp(name, "first")) {
        if (in.k == TV_UNDEF) return tv_undef("first");
        tlist *l = tmpl_iterate(r, in);
        return l->n ? l->v[0] : tv_undef("first");
    }
    if (!strcmp(name, "last")) {
        if ((in.k != TV_STR && in.k != TV_LIST) || (in.flag & TVF_GEN)) FAIL("last: '%s' object is not reversible", tv_type_name(in));
        tlist *l = tmpl_iterate(r, in);
        return l->n ? l->v[l->n - 1] : tv_undef("last");
    }
    if (!strcmp(name, "join")) {
        const tval *sep = ARG(0, "d"), *attr = ARG(1, "attribute");
        tval sp = sep ? str_of(r, *sep) : tv_cstr("");
        tlist *l = tmpl_iterate(r, in);
        tbuf b = tb_make(r);
        for (size_t i = 0; i < l->n; i++) {
            if (i) tb_put_val(&b, sp);
            tv_to_str(r, &b, attr && attr->k != TV_NONE ? attr_path(r, l->v[i], *attr) : l->v[i]);
        }
        return tb_val(&b);
    }
    if (!strcmp(name, "replace")) {
        const tval *o = ARG(0, "old"), *nw = ARG(1, "new"), *cnt = ARG(2, "count");
        if (!o || !nw) FAIL("replace needs old and new");
        return py_replace(r, str_of(r, in), str_of(r, *o), str_of(r, *nw), cnt && is_intlike(*cnt) ? cnt->i : -1);
    }
    if (!strcmp(name, "tojson")) {
        const tval *ea = ARG(0, "ensure_ascii"), *ind = ARG(1, "indent"), *sep = ARG(2, "separators"),
                   *sk = ARG(3, "sort_keys");
        int indent = -1;
        if (ind && ind->k != TV_NONE) {
            if (!is_intlike(*ind)) UNSUP("tojson indent that is not an integer");
            indent = ind->i < 0 ? 0 : ind->i > 64 ? 64 : (int)ind->i;
        }
        const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
        if (sep && sep->k != TV_NONE) {
            if (sep->k != TV_LIST || sep->l->n != 2 || sep->l->v[0].k != TV_STR || sep->l->v[1].k != TV_STR)
                FAIL("tojson separators must be a (item, key) pair of strings");
            if (sep->l->v[0].taint || sep->l->v[1].taint) tmpl_taint_lost(r); /* written as C strings */
            isep = tv_str(r, sep->l->v[0].s.p, sep->l->v[0].s.n).s.p;
            ksep = tv_str(r, sep->l->v[1].s.p, sep->l->v[1].s.n).s.p;
        }
        tbuf b = tb_make(r);
        tv_tojson(r, &b, in, indent, isep, ksep, sk && tv_truthy(*sk), ea && tv_truthy(*ea), 0);
        return tb_val(&b);
    }
    if (!strcmp(name, "int")) {
        const tval *dflt = ARG(0, "default");
        tval d = dflt ? *dflt : tv_int(0);
        if (ARG(1, "base") && !(is_intlike(*ARG(1, "base")) && ARG(1, "base")->i == 10)) UNSUP("int(base=...)");
        if (is_intlike(in)) return tv_int(in.i);
        if (in.k == TV_FLOAT) return isfinite(in.f) && fabs(in.f) < 9.2e18 ? tv_int((int64_t)in.f) : d;
        if (in.k == TV_STR) {
            int64_t x;
            double f;
            if (parse_py_int(in.s.p, in.s.n, &x)) return tv_int(x);
            if (parse_py_float(in.s.p, in.s.n, &f) && isfinite(f) && fabs(f) < 9.2e18) return tv_int((int64_t)f);
        }
        return d;
    }
    if (!strcmp(name, "float")) {
        const tval *dflt = ARG(0, "default");
        tval d = dflt ? *dflt : tv_float(0.0);
        if (is_intlike(in)) return tv_float((double)in.i);
        if (in.k == TV_FLOAT) return in;
        double f;
        if (in.k == TV_STR && parse_py_float(in.s.p, in.s.n, &f)) return tv_float(f);
        return d;
    }
    if (!strcmp(name, "abs")) {
        if (is_intlike(in)) {
            if (in.i == INT64_MIN) UNSUP("integer overflow");
            return tv_int(in.i < 0 ? -in.i : in.i);
        }
        if (in.k == TV_FLOAT) return tv_float(fabs(in.f));
        FAIL("bad operand type for abs(): '%s'", tv_type_name(in));
    }
    if (!strcmp(name, "round")) {
        const tval *pr = ARG(0, "precision"), *me = ARG(1, "method");
        int64_t p = pr && is_intlike(*pr) ? pr->i : 0;
        if (!is_number(in)) FAIL("round needs a number, not %s", tv_type_name(in));
        if (p < -20 || p > 20) UNSUP("round precision outside [-20, 20]");
        double x = in.k == TV_FLOAT ? in.f : (double)in.i, s = pow(10.0, (double)p);
        const char *m = me && me->k == TV_STR ? me->s.p : "common";
        double y = !strcmp(m, "ceil") ? ceil(x * s) / s : !strcmp(m, "floor") ? floor(x * s) / s : nearbyint(x * s) / s;
        if (strcmp(m, "common") && strcmp(m, "ceil") && strcmp(m, "floor")) FAIL("method must be common, ceil or floor");
        return tv_float(y);
    }
    if (!strcmp(name, "list")) return tv_list(copy_items(r, in));
    if (!strcmp(name, "items")) {
        if (in.k == TV_UNDEF) return gen(tl_new(r, 0));
        if (in.k != TV_DICT) FAIL("can only get item pairs from a mapping, not %s", tv_type_name(in));
        tlist *l = tl_new(r, in.d->n);
        for (size_t i = 0; i < in.d->n; i++) {
            tlist *p = tl_new(r, 2);
            tl_push(r, p, in.d->key[i]);
            tl_push(r, p, in.d->val[i]);
            tval t = tv_list(p);
            t.is_tuple = 1;
            tl_push(r, l, t);
        }
        return gen(l);
    }
    if (!strcmp(name, "dictsort")) {
        if (in.k != TV_DICT) FAIL("dictsort needs a mapping, not %s", tv_type_name(in));
        const tval *cs = ARG(0, "case_sensitive"), *by = ARG(1, "by"), *rv = ARG(2, "reverse");
        bool by_value = by && by->k == TV_STR && !strcmp(by->s.p, "value");
        tval pairs = tmpl_filter(r, "items", in, 0, NULL, 0, NULL, NULL);
        size_t n = pairs.l->n;
        tval *keys = tmpl_alloc(r, (n + 1) * sizeof *keys);
        for (size_t i = 0; i < n; i++) keys[i] = sort_key(r, pairs.l->v[i].l->v[by_value], cs && tv_truthy(*cs));
        stable_sort(r, pairs.l->v, keys, n, rv && tv_truthy(*rv));
        pairs.flag = 0;
        return pairs;
    }
    if (!strcmp(name, "sort")) {
        const tval *rv = ARG(0, "reverse"), *cs = ARG(1, "case_sensitive"), *at = ARG(2, "attribute");
        tlist *l = copy_items(r, in);
        tval *keys = tmpl_alloc(r, (l->n + 1) * sizeof *keys);
        for (size_t i = 0; i < l->n; i++)
            keys[i] = sort_key(r, at && at->k != TV_NONE ? attr_path(r, l->v[i], *at) : l->v[i], cs && tv_truthy(*cs));
        stable_sort(r, l->v, keys, l->n, rv && tv_truthy(*rv));
        return tv_list(l);
    }
    if (!strcmp(name, "reverse")) {
        if (in.k == TV_STR) {
            tlist *l = tmpl_iterate(r, in);
            tbuf b = tb_make(r);
            for (size_t i = l->n; i-- > 0;) tb_put_val(&b, l->v[i]);
            return tb_val(&b);
        }
        tlist *l = copy_items(r, in), *o = tl_new(r, l->n);
        for (size_t i = l->n; i-- > 0;) tl_push(r, o, l->v[i]);
        return gen(o);
    }
    if (!strcmp(name, "unique")) {
        const tval *cs = ARG(0, "case_sensitive"), *at = ARG(1, "attribute");
        tlist *l = tmpl_iterate(r, in), *o = tl_new(r, 0), *seen = tl_new(r, 0);
        for (size_t i = 0; i < l->n; i++) {
            tval k = sort_key(r, at && at->k != TV_NONE ? attr_path(r, l->v[i], *at) : l->v[i], cs && tv_truthy(*cs));
            bool dup = false;
            for (size_t j = 0; j < seen->n && !dup; j++) dup = tv_eq(seen->v[j], k);
            tmpl_tick(r, seen->n);
            if (!dup) {
                tl_push(r, seen, k);
                tl_push(r, o, l->v[i]);
            }
        }
        return gen(o);
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) {
        const tval *cs = ARG(0, "case_sensitive"), *at = ARG(1, "attribute");
        tlist *l = tmpl_iterate(r, in);
        if (!l->n) return tv_undef(name);
        size_t best = 0;
        tval bk = sort_key(r, at && at->k != TV_NONE ? attr_path(r, l->v[0], *at) : l->v[0], cs && tv_truthy(*cs));
        for (size_t i = 1; i < l->n; i++) {
            tval k = sort_key(r, at && at->k != TV_NONE ? attr_path(r, l->v[i], *at) : l->v[i], cs && tv_truthy(*cs));
            int c = tv_cmp(r, k, bk);
            if (name[1] == 'i' ? c < 0 : c > 0) best = i, bk = k;
        }
        return l->v[best];
    }
    if (!strcmp(name, "sum")) {
        const tval *at = ARG(0, "attribute"), *st = ARG(1, "start");
        tval acc = st ? *st : tv_int(0);
        tlist *l = tmpl_iterate(r, in);
        for (size_t i = 0; i < l->n; i++) {
            tval x = at && at->k != TV_NONE ? attr_path(r, l->v[i], *at) : l->v[i];
            if (!is_number(acc) || !is_number(x)) FAIL("sum: unsupported operand types '%s' and '%s'", tv_type_name(acc), tv_type_name(x));
            if (acc.k == TV_FLOAT || x.k == TV_FLOAT) acc = tv_float((acc.k == TV_FLOAT ? acc.f : (double)acc.i) + (x.k == TV_FLOAT ? x.f : (double)x.i));
            else {
                int64_t s;
                if (__builtin_add_overflow(acc.i, x.i, &s)) UNSUP("integer overflow");
                acc = tv_int(s);
            }
        }
        return acc;
    }
    if (!strcmp(name, "batch")) {
        const tval *cnt = ARG(0, "linecount"), *fill = ARG(1, "fill_with");
        if (!cnt || !is_intlike(*cnt) || cnt->i <= 0) FAIL("batch needs a positive line count");
        tlist *l = tmpl_iterate(r, in), *o = tl_new(r, 0), *cur = NULL;
        for (size_t i = 0; i < l->n; i++) {
            if (!cur || (int64_t)cur->n == cnt->i) {
                cur = tl_new(r, 0);
                tl_push(r, o, tv_list(cur));
            }
            tl_push(r, cur, l->v[i]);
        }
        if (cur && fill && fill->k != TV_NONE)
            while ((int64_t)cur->n < cnt->i) tl_push(r, cur, *fill);
        return gen(o);
    }
    if (!strcmp(name, "wordcount")) {
        tval s = str_of(r, in);
        int64_t c = 0;
        bool inw = false;
        for (size_t i = 0; i < s.s.n;) {
            uint32_t cp = cp_at(s.s.p, s.s.n, &i);
            bool w = cp == '_' || (cp < 128 ? isalnum((int)cp) != 0 : !py_space(cp));
            if (w && !inw) c++;
            inw = w;
        }
        return tv_int(c);
    }
    if (!strcmp(name, "indent")) {
        const tval *w = ARG(0, "width"), *fi = ARG(1, "first"), *bl = ARG(2, "blank");
        return do_indent(r, str_of(r, in), w ? *w : tv_int(4), fi && tv_truthy(*fi), bl && tv_truthy(*bl));
    }
    if (!strcmp(name, "attr")) {
        if ((a = ARG(0, "name")) == NULL || a->k != TV_STR) FAIL("attr needs a name");
        if (in.k == TV_UNDEF) FAIL("'%s' is undefined", in.s.p ? in.s.p : "value");
        tval nm = tv_str(r, a->s.p, a->s.n);
        if (in.k == TV_DICT) return tv_undef(nm.s.p); /* attr() never looks at items */
        return tmpl_getattr(r, in, nm.s.p);
    }
    if (!strcmp(name, "select") || !strcmp(name, "reject")) return select_common(r, in, nargs, args, false, name[0] == 's');
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return select_common(r, in, nargs, args, true, name[0] == 's');
    if (!strcmp(name, "map")) {
        if (!tv_truthy(in)) return gen(tl_new(r, 0));
        tlist *l = tmpl_iterate(r, in), *o = tl_new(r, l->n);
        const tval *at = NULL, *dflt = NULL;
        for (int i = 0; i < nkw; i++) {
            if (!strcmp(kwn[i], "attribute")) at = &kwv[i];
            else if (!strcmp(kwn[i], "default")) dflt = &kwv[i];
        }
        if (at) {
            for (size_t i = 0; i < l->n; i++) {
                tval x = attr_path(r, l->v[i], *at);
                tl_push(r, o, x.k == TV_UNDEF && dflt ? *dflt : x);
            }
            return gen(o);
        }
        if (nargs < 1 || args[0].k != TV_STR) FAIL("map needs a filter name or attribute=");
        char fn[64];
        if (args[0].s.n >= sizeof fn) FAIL("map: filter name too long");
        memcpy(fn, args[0].s.p, args[0].s.n);
        fn[args[0].s.n] = 0;
        if (!tmpl_has_filter(fn)) FAIL("map: no filter named '%s'", fn);
        for (size_t i = 0; i < l->n; i++) tl_push(r, o, tmpl_filter(r, fn, l->v[i], nargs - 1, args + 1, nkw, kwn, kwv));
        return gen(o);
    }
    if (!strcmp(name, "format")) {
        tval s = str_of(r, in);
        tbuf b = tb_make(r);
        int k = 0;
        for (size_t i = 0; i < s.s.n; i++) {
            if (s.s.p[i] != '%' || i + 1 >= s.s.n) {
                tb_put_sub(&b, s, i, 1);
                continue;
            }
            char c = s.s.p[++i];
            if (c == '%') tb_put_sub(&b, s, i, 1);
            else if (c == 's' || c == 'd' || c == 'r') {
                if (k >= nargs) FAIL("format: not enough arguments for format string");
                tval x = args[k++];
                if (c == 'd' && !is_number(x)) FAIL("format: %%d format: a number is required");
                if (c == 'd' && x.k == TV_FLOAT) x = tv_int((int64_t)x.f);
                if (c == 'r') tv_repr(r, &b, x);
                else tv_to_str(r, &b, x);
            } else UNSUP("format filter conversion '%%%c'", c);
        }
        return tb_val(&b);
    }
    UNSUP("the '%s' filter", name);
}

// ---- methods and globals -----------------------------------------------------------------------
static tval want_str(trender *r, const char *m, const tval *v) {
    if (!v || v->k != TV_STR) FAIL("%s() needs a string argument", m);
    return *v;
}

tval tmpl_call_method(trender *r, tval self, const char *name, int nargs, const tval *args, int nkw,
                      const char **kwn, const tval *kwv) {
    tmpl_tick(r, 1);
    if (self.k == TV_DICT) {
        if (!strcmp(name, "get")) {
            if (nargs < 1) FAIL("get expected at least 1 argument");
            const tval *v = td_get(self.d, args[0]);
            return v ? *v : nargs > 1 ? args[1] : tv_none();
        }
        if (!strcmp(name, "items")) {
            tval v = tmpl_filter(r, "items", self, 0, NULL, 0, NULL, NULL);
            v.flag = 0;
            return v;
        }
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            tlist *l = tl_new(r, self.d->n);
            for (size_t i = 0; i < self.d->n; i++) tl_push(r, l, name[0] == 'k' ? self.d->key[i] : self.d->val[i]);
            return tv_list(l);
        }
        if (!strcmp(name, "copy")) {
            tdict *d = td_new(r, self.d->n);
            for (size_t i = 0; i < self.d->n; i++) td_set(r, d, self.d->key[i], self.d->val[i]);
            return (tval){.k = TV_DICT, .d = d};
        }
        FAIL("access to attribute '%s' of 'dict' object is unsafe (immutable sandbox)", name);
    }
    if (self.k == TV_LIST) {
        if (!strcmp(name, "count") || !strcmp(name, "index")) {
            if (nargs < 1) FAIL("%s() takes exactly one argument", name);
            int64_t c = 0;
            for (size_t i = 0; i < self.l->n; i++)
                if (tv_eq(self.l->v[i], args[0])) {
                    if (name[0] == 'i') return tv_int((int64_t)i);
                    c++;
                }
            if (name[0] == 'i') FAIL("list.index(x): x not in list");
            return tv_int(c);
        }
        if (!strcmp(name, "copy")) return tv_list(copy_items(r, self));
        FAIL("access to attribute '%s' of '%s' object is unsafe (immutable sandbox)", name, tv_type_name(self));
    }
    if (self.k != TV_STR) FAIL("'%s' object has no method '%s'", tv_type_name(self), name);
    const tval *a0 = ARG(0, "__a0"), *a1 = ARG(1, "__a1");
    if (!strcmp(name, "strip")) return py_strip(r, self, a0, 3);
    if (!strcmp(name, "lstrip")) return py_strip(r, self, a0, 1);
    if (!strcmp(name, "rstrip")) return py_strip(r, self, a0, 2);
    if (!strcmp(name, "split") || !strcmp(name, "rsplit"))
        return py_split(r, self, ARG(0, "sep"), ARG(1, "maxsplit"), name[0] == 'r');
    if (!strcmp(name, "upper")) return map_case(r, self, CASE_UPPER);
    if (!strcmp(name, "lower") || !strcmp(name, "casefold")) return map_case(r, self, CASE_LOWER);
    if (!strcmp(name, "title")) return map_case(r, self, CASE_PYTITLE);
    if (!strcmp(name, "capitalize")) return map_case(r, self, CASE_CAPITALIZE);
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (!a0) FAIL("%s() takes at least 1 argument", name);
        if (nargs > 1) UNSUP("%s() with start/end arguments", name);
        return tv_bool(affix(r, self, *a0, name[0] == 'e'));
    }
    if (!strcmp(name, "replace")) {
        if (!a0 || !a1) FAIL("replace() takes at least 2 arguments");
        const tval *c = ARG(2, "count");
        return py_replace(r, self, *a0, *a1, c && is_intlike(*c) ? c->i : -1);
    }
    if (!strcmp(name, "format")) return py_format(r, self, nargs, args, nkw, kwn, kwv);
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "rindex") ||
        !strcmp(name, "count")) {
        tval sub = want_str(r, name, a0);
        if (nargs > 1) UNSUP("%s() with start/end arguments", name);
        if (!strcmp(name, "count")) {
            if (!sub.s.n) return tv_int((int64_t)utf8_len(self.s.p, self.s.n) + 1);
            int64_t c = 0;
            for (const char *p = self.s.p, *e = self.s.p + self.s.n; (p = find_sub(p, (size_t)(e - p), sub.s.p, sub.s.n)); p += sub.s.n) c++;
            return tv_int(c);
        }
        const char *hit = NULL;
        if (name[0] == 'r') {
            for (size_t k = self.s.n + 1; k-- > sub.s.n;)
                if (!memcmp(self.s.p + k - sub.s.n, sub.s.p, sub.s.n)) {
                    hit = self.s.p + k - sub.s.n;
                    break;
                }
        } else hit = find_sub(self.s.p, self.s.n, sub.s.p, sub.s.n);
        if (!hit) {
            if (strstr(name, "index")) FAIL("substring not found");
            return tv_int(-1);
        }
        return tv_int((int64_t)utf8_len(self.s.p, (size_t)(hit - self.s.p)));
    }
    if (!strcmp(name, "join")) {
        if (!a0) FAIL("join() takes exactly one argument");
        tlist *l = tmpl_iterate(r, *a0);
        tbuf b = tb_make(r);
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].k != TV_STR) FAIL("sequence item %zu: expected str instance, %s found", i, tv_type_name(l->v[i]));
            if (i) tb_put_val(&b, self);
            tb_put_val(&b, l->v[i]);
        }
        return tb_val(&b);
    }
    if (!strcmp(name, "splitlines")) {
        tlist *o = tl_new(r, 0);
        size_t i = 0;
        while (i < self.s.n) {
            size_t j = i;
            while (j < self.s.n && self.s.p[j] != '\n' && self.s.p[j] != '\r') j++;
            tl_push(r, o, substr(r, self, i, j));
            if (j < self.s.n && self.s.p[j] == '\r' && j + 1 < self.s.n && self.s.p[j + 1] == '\n') j++;
            i = j + 1;
        }
        return tv_list(o);
    }
    if (!strncmp(name, "is", 2)) {
        if (!self.s.n) return tv_bool(false);
        bool all = true, any_cased = false;
        for (size_t i = 0; i < self.s.n;) {
            uint32_t c = cp_at(self.s.p, self.s.n, &i);
            bool ok;
            if (!strcmp(name, "isdigit") || !strcmp(name, "isnumeric") || !strcmp(name, "isdecimal")) ok = c >= '0' && c <= '9';
            else if (!strcmp(name, "isalpha")) ok = is_alpha_cp(c);
            else if (!strcmp(name, "isalnum")) ok = is_alpha_cp(c) || (c >= '0' && c <= '9');
            else if (!strcmp(name, "isspace")) ok = py_space(c);
            else if (!strcmp(name, "isupper")) {
                ok = to_lower(c) == c || to_upper(c) == c ? to_upper(c) == c : true;
                any_cased |= is_cased(c);
            } else if (!strcmp(name, "islower")) {
                ok = to_upper(c) == c || to_lower(c) == c ? to_lower(c) == c : true;
                any_cased |= is_cased(c);
            } else UNSUP("str.%s()", name);
            all &= ok;
        }
        if (!strcmp(name, "isupper") || !strcmp(name, "islower")) return tv_bool(all && any_cased);
        return tv_bool(all);
    }
    UNSUP("str.%s()", name);
}

tval tmpl_call_global(trender *r, const char *name, int nargs, const tval *args, int nkw, const char **kwn,
                      const tval *kwv) {
    if (!strcmp(name, "raise_exception")) {
        tval m = nargs ? str_of(r, args[0]) : tv_cstr("");
        tmpl_fail(r, 0, OSP_ERR_INVALID_ARG, "raise_exception: %.*s", (int)(m.s.n > 400 ? 400 : m.s.n), m.s.p);
    }
    if (!strcmp(name, "strftime_now")) {
        if (nargs < 1) FAIL("strftime_now() needs a format");
        return tmpl_strftime_now(r, args[0]);
    }
    if (!strcmp(name, "range")) {
        int64_t lo = 0, hi, step = 1;
        for (int i = 0; i < nargs; i++)
            if (!is_intlike(args[i])) FAIL("range() arguments must be integers, not %s", tv_type_name(args[i]));
        if (nargs == 1) hi = args[0].i;
        else if (nargs == 2 || nargs == 3) {
            lo = args[0].i;
            hi = args[1].i;
            if (nargs == 3) step = args[2].i;
        } else FAIL("range expected 1 to 3 arguments, got %d", nargs);
        if (step == 0) FAIL("range() arg 3 must not be zero");
        double cnt = step > 0 ? ceil(((double)hi - (double)lo) / (double)step) : ceil(((double)lo - (double)hi) / (double)-step);
        if (cnt > 100000) FAIL("range too big (the sandbox allows at most 100000 items)");
        tlist *l = tl_new(r, cnt > 0 ? (size_t)cnt : 0);
        for (int64_t x = lo; step > 0 ? x < hi : x > hi; x += step) tl_push(r, l, tv_int(x));
        return tv_list(l);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        tdict *d = td_new(r, 0);
        if (nargs > 1) FAIL("%s expected at most 1 positional argument", name);
        if (nargs == 1) {
            if (args[0].k != TV_DICT) UNSUP("%s() from a non-mapping positional argument", name);
            for (size_t i = 0; i < args[0].d->n; i++) td_set(r, d, args[0].d->key[i], args[0].d->val[i]);
        }
        for (int i = 0; i < nkw; i++) td_set(r, d, tv_cstr(kwn[i]), kwv[i]);
        return (tval){.k = name[0] == 'n' ? TV_NS : TV_DICT, .d = d};
    }
    UNSUP("the global function '%s'", name);
}
