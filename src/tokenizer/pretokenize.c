/* Pre-tokenization for byte-level BPE, reproducing llama.cpp's unicode_regex_split.
 *
 * A pre-tokenizer is a list of steps; each step refines the current list of pieces (every piece is
 * split on its own, the gaps between matches become pieces too). A step is either one of the four
 * hand-written splitters llama.cpp uses for the GPT-2, Llama-3, Qwen2 and Qwen3.5 regexes (their
 * behaviour differs from a real regex engine in small ways, which we copy), or a regex run with
 * PCRE2 (JIT-compiled when possible) in one of llama.cpp's two modes:
 *
 *  - "collapsed" (the regex uses \p{..}): every code point becomes one byte: ASCII stays, other
 *    White_Space becomes \v, letters/numbers/punctuation/marks/symbols become the sentinel bytes
 *    D2/D1/D3/D4/D5 and everything else D0; \p{L} in the regex becomes [\xD2A-Za-z] and so on. The
 *    categories come from our UCD 15.1 table, the same data llama.cpp uses, so results do not depend
 *    on the Unicode version PCRE2 was built with.
 *  - "utf" (no \p{..}; literal non-ASCII ranges such as DeepSeek's CJK classes): the text itself in
 *    UTF mode, with non-ASCII White_Space replaced by \v as llama.cpp does for std::wregex.
 *
 * \s means ASCII white space in both modes, as in llama.cpp's std::regex with the C locale. */
#include "tokenizer/pretokenize.h"

#include <stdlib.h>
#include <string.h>

#include <pcre2.h>

#include "core/status_internal.h"
#include "tokenizer/unicode.h"

/* ---------------------------------------------------------------------------------------------- */
/* configurations                                                                                 */

/* STEP_END (zero) ends a list, so unused slots of a zero-initialised table stop it */
typedef enum step_kind { STEP_END = 0, STEP_GPT2, STEP_LLAMA3, STEP_QWEN2, STEP_QWEN35, STEP_REGEX } step_kind;

typedef struct step_def {
    step_kind kind;
    const char *re; /* STEP_REGEX only */
} step_def;

#define MAX_STEPS 6

typedef struct pre_def {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    osp_pretok_flags flags;
    step_def steps[MAX_STEPS];
} pre_def;

#define GPT2 {STEP_GPT2, NULL}
#define LLAMA3 {STEP_LLAMA3, NULL}
#define QWEN2 {STEP_QWEN2, NULL}
#define QWEN35 {STEP_QWEN35, NULL}
#define RE(s) {STEP_REGEX, s}

/* The regexes are the models' own tokenizer.json pre-tokenizer patterns, in the adapted form
 * llama.cpp runs (llm_tokenizer_bpe constructor). */
static const pre_def k_pres[] = {
    {"default", {0},
     {RE("[\\p{P}\\$\\+<=>\\^~\\|]+"), GPT2, RE("\\p{N}+"), RE("[0-9][0-9][0-9]")}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano",
     {.add_bos = true, .ignore_merges = true}, {LLAMA3}},
    {"dbrx|smaug-bpe", {0}, {LLAMA3}},
    {"chatglm-bpe", {.no_bos = true}, {LLAMA3}},
    {"glm4|glm5", {.no_bos = true, .ignore_merges = true}, {LLAMA3}},
    {"deepseek-llm", {0},
     {RE("[\r\n]"),
      RE("\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"),
      RE("\\s?[!-/:-~！-／：-～‘-‟　-。]+"), RE("\\s+$"), RE("[一-龥ࠀ-一가-퟿]+"), RE("\\p{N}+")}},
    {"deepseek-v3|hunyuan-dense|joyai-llm|hy_v4", {0},
     {RE("\\p{N}{1,3}"), RE("[一-龥぀-ゟ゠-ヿ]+"),
      RE("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
         "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")}},
    {"deepseek-coder", {0},
     {RE("[\r\n]"), RE("\\s?\\p{L}+"), RE("\\s?\\p{P}+"), RE("[一-龥ࠀ-一가-퟿]+"), RE("\\p{N}")}},
    {"falcon", {0}, {RE("[\\p{P}\\$\\+<=>\\^~\\|`]+"), GPT2, RE("[0-9][0-9][0-9]")}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", {0},
     {RE("\\p{N}"), GPT2}},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|"
     "jina-v1-en|jina-v2-code|roberta-bpe|mpt|olmo|jais|exaone4|trillion|granite-docling",
     {0}, {GPT2}},
    {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|stablelm2|hunyuan|solar-open|megrez|grok-2", {0}, {QWEN2}},
    {"qwen35", {0}, {QWEN35}},
    {"poro-chat|bloom|gpt3-finnish", {0}, {RE(" ?[^(\\s|.,!?…。，、।۔،)]+")}},
    {"viking", {0}, {RE(" ?[^(\\s|.,!?…。，、।۔،)]+"), RE("\\p{N}")}},
    {"tekken", {.add_bos = true, .ignore_merges = true},
     {RE("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=["
         "\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!"
         "\\S)|\\s+")}},
    {"gpt-4o|llama4|kanana2|talkie|minimax-m2", {0},
     {RE("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV]["
         "eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'["
         "sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*["
         "\\r\\n]+|\\s+(?!\\S)|\\s+")}},
    {"seed-coder", {0},
     {RE("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| "
         "?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")}},
    {"ufakzeka", {0},
     {RE("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")}},
    {"jais-2", {0},
     {RE("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}")}},
    {"youtu", {.ignore_merges = true},
     {RE("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+"),
      RE("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")}},
    {"spark2_5", {0},
     {RE("\\p{N}{1,3}"),
      RE("[一-龥぀-ゟ゠-ヿ]+"),
      RE("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+"),
      RE("\\p{N}")}},
    {"bailingmoe|bailingmoe2|llada-moe", {0},
     {RE("'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+")}},
    {"exaone-moe", {0},
     {RE("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+")}},
    {"granite-embed-multi-97m", {.ignore_merges = true},
     {RE("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")}},
    {"chameleon", {.add_bos = true},
     {RE("<sentinel:[0-9]+>"),
      RE("(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z"),
      RE("([\\t\\n]|    |  )"),
      RE("\\p{N}"),
      RE("[\\p{P}!-/:-@\\[-`{-~]"),
      GPT2}},
    {"laguna", {0}, {RE("[^\\n]+|[\\n]+"), QWEN2}},
    {"minicpm5", {.ignore_merges = true},
     {RE("\\p{N}{1,3}"),
      RE("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| "
         "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")}},
};

/* ---------------------------------------------------------------------------------------------- */
/* compiled form                                                                                  */

typedef struct step {
    step_kind kind;
    bool collapsed;    /* STEP_REGEX: runs on the collapsed text */
    pcre2_code *code;  /* STEP_REGEX */
} step;

struct osp_pretok {
    int n_steps;
    step steps[MAX_STEPS];
    bool need_collapsed, need_utf;
};

static bool name_in_list(const char *name, const char *list) {
    size_t n = strlen(name);
    for (const char *p = list;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0) return true;
        if (!bar) return false;
        p = bar + 1;
    }
}

/* \p{..} names llama.cpp collapses, and the class each becomes (sentinel byte + ASCII members). */
static const struct {
    const char *name;
    const char *cls;
} k_ucat[] = {
    {"\\p{N}", "\\xD10-9"},
    {"\\p{L}", "\\xD2A-Za-z"},
    {"\\p{P}", "\\xD3!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"},
    {"\\p{M}", "\\xD4"},
    {"\\p{S}", "\\xD5\\$\\+<->\\^`\\|~"},
    {"\\p{Lu}", "\\xD2A-Za-z"},
    {"\\p{Ll}", "\\xD2A-Za-z"},
    {"\\p{Lt}", "\\xD2A-Za-z"},
    {"\\p{Lm}", "\\xD2A-Za-z"},
    {"\\p{Lo}", "\\xD2A-Za-z"},
};

static bool uses_categories(const char *re) {
    for (size_t k = 0; k < sizeof k_ucat / sizeof k_ucat[0]; k++)
        if (strstr(re, k_ucat[k].name)) return true;
    return false;
}

/* Rewrites \p{X} into the collapsed classes, tracking [...] the way llama.cpp does (a '[' not
 * preceded by a backslash opens, a ']' not preceded by one closes). Returns malloc'd or NULL. */
static char *collapse_regex(const char *re) {
    size_t n = strlen(re);
    char *out = malloc(n * 16 + 1);
    if (!out) return NULL;
    size_t o = 0;
    bool inside = false;
    for (size_t i = 0; i < n; i++) {
        if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
            out[o++] = '[';
            inside = true;
            continue;
        }
        if (inside && re[i] == ']' && re[i - 1] != '\\') {
            out[o++] = ']';
            inside = false;
            continue;
        }
        if (re[i] == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
            const char *close = strchr(re + i + 3, '}');
            if (close && (size_t)(close - re) <= i + 10) {
                size_t plen = (size_t)(close - re) - i + 1;
                bool done = false;
                for (size_t k = 0; k < sizeof k_ucat / sizeof k_ucat[0]; k++) {
                    if (strlen(k_ucat[k].name) == plen && memcmp(k_ucat[k].name, re + i, plen) == 0) {
                        if (!inside) out[o++] = '[';
                        size_t cl = strlen(k_ucat[k].cls);
                        memcpy(out + o, k_ucat[k].cls, cl);
                        o += cl;
                        if (!inside) out[o++] = ']';
                        i += plen - 1;
                        done = true;
                        break;
                    }
                }
                if (done) continue;
            }
        }
        out[o++] = re[i];
    }
    out[o] = '\0';
    return out;
}

void osp_pretok_free(osp_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_steps; i++) pcre2_code_free(p->steps[i].code);
    free(p);
}

osp_status osp_pretok_create(const char *name, osp_pretok **out, osp_pretok_flags *flags) {
    *out = NULL;
    const char *lookup = (name && name[0]) ? name : "default";
    const pre_def *def = NULL;
    for (size_t i = 0; i < sizeof k_pres / sizeof k_pres[0]; i++) {
        if (name_in_list(lookup, k_pres[i].names)) {
            def = &k_pres[i];
            break;
        }
    }
    if (!def)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "tokenizer: unsupported pre-tokenizer '%s' (tokenizer.ggml.pre)",
                             lookup);
    osp_pretok *p = calloc(1, sizeof *p);
    if (!p) return osp_set_error(OSP_ERR_NOMEM, "tokenizer: out of memory");
    *flags = def->flags;
    for (int i = 0; i < MAX_STEPS && def->steps[i].kind != STEP_END; i++) {
        const step_def *sd = &def->steps[i];
        step *s = &p->steps[p->n_steps++];
        s->kind = sd->kind;
        if (sd->kind != STEP_REGEX) continue;
        s->collapsed = uses_categories(sd->re);
        char *pat = s->collapsed ? collapse_regex(sd->re) : NULL;
        if (s->collapsed && !pat) {
            osp_pretok_free(p);
            return osp_set_error(OSP_ERR_NOMEM, "tokenizer: out of memory");
        }
        uint32_t opts = PCRE2_DOLLAR_ENDONLY | (s->collapsed ? 0 : PCRE2_UTF);
        int err = 0;
        PCRE2_SIZE erroff = 0;
        s->code = pcre2_compile((PCRE2_SPTR)(pat ? pat : sd->re), PCRE2_ZERO_TERMINATED, opts, &err, &erroff, NULL);
        free(pat);
        if (!s->code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            osp_pretok_free(p);
            return osp_set_error(OSP_ERR_INTERNAL, "tokenizer: pre-tokenizer '%s': regex %d does not compile: %s at %zu",
                                 lookup, i, (const char *)msg, (size_t)erroff);
        }
        (void)pcre2_jit_compile(s->code, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
        if (s->collapsed) p->need_collapsed = true;
        else p->need_utf = true;
    }
    *out = p;
    return OSP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* splitting                                                                                      */

typedef struct lenvec {
    size_t *v;
    size_t n, cap;
} lenvec;

static bool lv_push(lenvec *l, size_t x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        size_t *v = realloc(l->v, cap * sizeof *v);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return true;
}

#define F_SPACE 0x100u
#define OUT_OF_RANGE 0xFFFFFFFFu

/* The state of one hand-written splitter over the piece [ini, end). */
typedef struct splitter {
    const uint32_t *cps;
    size_t ini, end, prev_end;
    lenvec *out;
    bool oom;
} splitter;

static uint32_t sp_cpt(const splitter *s, size_t pos) {
    return (pos >= s->ini && pos < s->end) ? s->cps[pos] : OUT_OF_RANGE;
}

/* class bits plus F_SPACE; 0 outside the piece (llama.cpp's empty flags) */
static uint32_t sp_flags(const splitter *s, size_t pos) {
    if (pos < s->ini || pos >= s->end) return 0;
    uint32_t cp = s->cps[pos];
    return osp_unicode_class(cp) | (osp_unicode_is_space(cp) ? F_SPACE : 0);
}

/* ends the current word at `end`; returns its length */
static size_t sp_add(splitter *s, size_t end) {
    size_t len = end - s->prev_end;
    if (len > 0 && !lv_push(s->out, len)) s->oom = true;
    s->prev_end = end;
    return len;
}

static uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd at pos (case-insensitively if `icase`): length of the match or 0 */
static size_t contraction(const splitter *s, size_t pos, bool icase) {
    if (sp_cpt(s, pos) != '\'' || pos + 1 >= s->end) return 0;
    uint32_t a = sp_cpt(s, pos + 1);
    if (icase) a = ascii_lower(a);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 < s->end) {
        uint32_t b = sp_cpt(s, pos + 2);
        if (icase) b = ascii_lower(b);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    return 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (llama.cpp unicode_regex_split_custom_gpt2) */
static void split_gpt2(splitter *s) {
    const uint32_t L = OSP_UCLASS_LETTER, N = OSP_UCLASS_NUMBER;
    for (size_t pos = s->ini; pos < s->end && !s->oom;) {
        const uint32_t cpt = sp_cpt(s, pos);
        const uint32_t flags = sp_flags(s, pos);
        size_t c = contraction(s, pos, false);
        if (c) {
            pos += sp_add(s, pos + c);
            continue;
        }
        uint32_t f2 = (cpt == ' ') ? sp_flags(s, pos + 1) : flags;
        if (f2 & L) {
            pos += (cpt == ' ');
            while (f2 & L) f2 = sp_flags(s, ++pos);
            sp_add(s, pos);
            continue;
        }
        if (f2 & N) {
            pos += (cpt == ' ');
            while (f2 & N) f2 = sp_flags(s, ++pos);
            sp_add(s, pos);
            continue;
        }
        if (!(f2 & (F_SPACE | L | N)) && f2) {
            pos += (cpt == ' ');
            while (!(f2 & (F_SPACE | L | N)) && f2) f2 = sp_flags(s, ++pos);
            sp_add(s, pos);
            continue;
        }
        size_t nws = 0;
        while (sp_flags(s, pos + nws) & F_SPACE) nws++;
        if (nws > 1 && sp_cpt(s, pos + nws) != OUT_OF_RANGE) { /* \s+(?!\S) */
            pos += nws - 1;
            sp_add(s, pos);
            continue;
        }
        if (nws > 0) {
            pos += nws;
            sp_add(s, pos);
            continue;
        }
        sp_add(s, ++pos);
    }
}

/* The Llama-3 / Qwen2 / Qwen3.5 family (llama.cpp unicode_regex_split_custom_llama3, _qwen2,
 * _qwen35):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 * `max_digits` is 3 (Llama-3) or 1 (Qwen); `marks` adds \p{M} to the letter runs (Qwen3.5). */
static void split_llama3_like(splitter *s, size_t max_digits, bool marks) {
    const uint32_t L = OSP_UCLASS_LETTER | (marks ? OSP_UCLASS_MARK : 0), N = OSP_UCLASS_NUMBER;
    for (size_t pos = s->ini; pos < s->end && !s->oom;) {
        const uint32_t cpt = sp_cpt(s, pos);
        const uint32_t flags = sp_flags(s, pos);
        size_t c = contraction(s, pos, true);
        if (c) {
            pos += sp_add(s, pos + c);
            continue;
        }
        if (!(cpt == '\r' || cpt == '\n' || (flags & N))) {
            if ((flags & L) || (sp_flags(s, pos + 1) & L)) {
                pos++;
                while (sp_flags(s, pos) & L) pos++;
                sp_add(s, pos);
                continue;
            }
        }
        if (flags & N) {
            if (max_digits == 1) {
                pos++;
                sp_add(s, pos);
                continue;
            }
            size_t ini = pos;
            while (sp_flags(s, pos) & N) {
                if (++pos - ini >= max_digits) {
                    sp_add(s, pos);
                    ini = pos;
                }
            }
            sp_add(s, pos);
            continue;
        }
        uint32_t f2 = (cpt == ' ') ? sp_flags(s, pos + 1) : flags;
        if (!(f2 & (F_SPACE | L | N)) && flags) {
            pos += (cpt == ' ');
            while (!(f2 & (F_SPACE | L | N)) && f2) f2 = sp_flags(s, ++pos);
            uint32_t c2 = sp_cpt(s, pos);
            while (c2 == '\r' || c2 == '\n') c2 = sp_cpt(s, ++pos);
            sp_add(s, pos);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (sp_flags(s, pos + nws) & F_SPACE) {
            uint32_t c2 = sp_cpt(s, pos + nws);
            if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) { /* \s*[\r\n]+ */
            pos = last_rn;
            sp_add(s, pos);
            continue;
        }
        if (nws > 1 && sp_cpt(s, pos + nws) != OUT_OF_RANGE) {
            pos += nws - 1;
            sp_add(s, pos);
            continue;
        }
        if (nws > 0) {
            pos += nws;
            sp_add(s, pos);
            continue;
        }
        sp_add(s, ++pos);
    }
}

/* Runs `code` over subject[0..len) like std::regex_iterator: matches and the gaps between them
 * become pieces. `to_cp` maps subject offsets to code point offsets (NULL: identity). */
static bool split_regex(const pcre2_code *code, pcre2_match_data *md, pcre2_match_context *mc,
                        const unsigned char *subject, size_t len, const size_t *to_cp, bool utf,
                        lenvec *out, osp_status *st) {
#define CP(off) (to_cp ? to_cp[off] - to_cp[0] : (off))
    size_t start = 0, last = 0;
    uint32_t opts = utf ? PCRE2_NO_UTF_CHECK : 0;
    while (start <= len) {
        int rc = pcre2_match(code, subject, len, start, opts, md, mc);
        if (rc == PCRE2_ERROR_NOMATCH) {
            if (!(opts & PCRE2_NOTEMPTY_ATSTART)) break;
            /* an empty match at `start` had no non-empty alternative: step one character on */
            opts &= ~(uint32_t)(PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED);
            if (start >= len) break;
            start++;
            if (utf) while (start < len && (subject[start] & 0xC0) == 0x80) start++;
            continue;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            *st = osp_set_error(OSP_ERR_INTERNAL, "tokenizer: regex match failed: %s", (const char *)msg);
            return false;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > last && !lv_push(out, CP(ms) - CP(last))) goto oom;
        if (me > ms && !lv_push(out, CP(me) - CP(ms))) goto oom;
        last = me;
        start = me;
        opts = utf ? PCRE2_NO_UTF_CHECK : 0;
        if (me == ms) opts |= PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED;
    }
    if (last < len && !lv_push(out, CP(len) - CP(last))) goto oom;
    return true;
oom:
    *st = osp_set_error(OSP_ERR_NOMEM, "tokenizer: out of memory");
    return false;
#undef CP
}

osp_status osp_pretok_split(const osp_pretok *p, const uint32_t *cps, size_t n, size_t **lens,
                            size_t *n_words) {
    osp_status st = OSP_OK;
    lenvec cur = {0}, next = {0};
    unsigned char *collapsed = NULL, *utf = NULL;
    size_t *byte_to_cp = NULL, *cp_to_byte = NULL;
    pcre2_match_data *md = NULL;
    pcre2_match_context *mc = NULL;
    pcre2_jit_stack *js = NULL;
    *lens = NULL;
    *n_words = 0;
    if (n == 0) return OSP_OK;
    if (!lv_push(&cur, n)) goto oom;

    if (p->need_collapsed) {
        collapsed = malloc(n);
        if (!collapsed) goto oom;
        for (size_t i = 0; i < n; i++) {
            uint32_t cp = cps[i];
            unsigned char b;
            if (cp < 128) b = (unsigned char)cp;
            else if (osp_unicode_is_space(cp)) b = 0x0B;
            else {
                switch (osp_unicode_class(cp)) {
                case OSP_UCLASS_NUMBER: b = 0xD1; break;
                case OSP_UCLASS_LETTER: b = 0xD2; break;
                case OSP_UCLASS_PUNCT: b = 0xD3; break;
                case OSP_UCLASS_MARK: b = 0xD4; break;
                case OSP_UCLASS_SYMBOL: b = 0xD5; break;
                default: b = 0xD0; break;
                }
            }
            collapsed[i] = b;
        }
    }
    if (p->need_utf) {
        utf = malloc(n * 4);
        cp_to_byte = malloc((n + 1) * sizeof *cp_to_byte);
        byte_to_cp = malloc((n * 4 + 1) * sizeof *byte_to_cp);
        if (!utf || !cp_to_byte || !byte_to_cp) goto oom;
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t cp = cps[i];
            if (cp > 0x7F && osp_unicode_is_space(cp)) cp = 0x0B;
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFF; /* lone surrogate: a char no class names */
            cp_to_byte[i] = o;
            int k = osp_utf8_encode(cp, (char *)utf + o);
            for (int j = 0; j < k; j++) byte_to_cp[o + j] = i;
            o += (size_t)k;
        }
        cp_to_byte[n] = o;
        byte_to_cp[o] = n;
    }
    if (p->need_collapsed || p->need_utf) {
        md = pcre2_match_data_create(16, NULL);
        mc = pcre2_match_context_create(NULL);
        js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        if (!md || !mc || !js) goto oom;
        pcre2_jit_stack_assign(mc, NULL, js);
    }

    for (int k = 0; k < p->n_steps; k++) {
        const step *s = &p->steps[k];
        next.n = 0;
        size_t start = 0;
        for (size_t w = 0; w < cur.n; w++) {
            size_t len = cur.v[w];
            if (s->kind == STEP_REGEX) {
                bool ok;
                if (s->collapsed) {
                    ok = split_regex(s->code, md, mc, collapsed + start, len, NULL, false, &next, &st);
                } else {
                    size_t b0 = cp_to_byte[start], b1 = cp_to_byte[start + len];
                    ok = split_regex(s->code, md, mc, utf + b0, b1 - b0, byte_to_cp + b0, true, &next, &st);
                }
                if (!ok) goto done;
            } else {
                splitter sp = {.cps = cps, .ini = start, .end = start + len, .prev_end = start, .out = &next};
                if (s->kind == STEP_GPT2) split_gpt2(&sp);
                else if (s->kind == STEP_LLAMA3) split_llama3_like(&sp, 3, false);
                else if (s->kind == STEP_QWEN2) split_llama3_like(&sp, 1, false);
                else split_llama3_like(&sp, 1, true);
                if (sp.oom) goto oom;
            }
            start += len;
        }
        lenvec tmp = cur;
        cur = next;
        next = tmp;
    }
    *lens = cur.v;
    *n_words = cur.n;
    cur.v = NULL;
    goto done;
oom:
    st = osp_set_error(OSP_ERR_NOMEM, "tokenizer: out of memory");
done:
    free(cur.v);
    free(next.v);
    free(collapsed);
    free(utf);
    free(byte_to_cp);
    free(cp_to_byte);
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    pcre2_jit_stack_free(js);
    return st;
}
