/* Unit tests for the chat-template interpreter (include/osprey/chat_template.h): a table of small
 * templates with the output Python's jinja2 3.1.6 gives them in transformers' environment (NULL: jinja2
 * raises, so osprey must fail), then status codes and messages, inputs, and the resource limits. The
 * table was made with tests/golden/make_template_fixtures.py's make_env(); messages are
 * [system "sys", user "hi", assistant "yo"], d = {"a": null}, add_generation_prompt on, bos/eos
 * "<s>"/"</s>", strftime_now at 2025-06-15 12:00:00 UTC. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "osprey/chat_template.h"

#define MESSAGES                                                                                   \
    "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"hi\"},"          \
    "{\"role\":\"assistant\",\"content\":\"yo\"}]"

static const struct {
    const char *tmpl, *want;
} k_cases[] = {
    {"  {% if true %}\n  x\n  {% endif %}\n  {# c #}\n y {{- ' z ' -}} \n w",
     "  x\n y z w"},
    {"{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}",
     "1/3:system,2/3:user,3/3:assistant"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index0 }}{{ m['content'] }}{% else %}none{% endfor %}",
     "0hi1yo"},
    {"{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
     "02"},
    {"{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
     "3"},
    {"{% set c = 0 %}{% for i in range(3) %}{{c}}{% set c = c + 1 %}{{c}}{% endfor %}{{c}}",
     "0101010"},
    {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', punct='?') }}",
     "Hi a! Hi b?"},
    {"{% set x %}  block {{ 1 + 2 }}  {% endset %}[{{ x }}]{% filter upper %}up{% endfilter %}",
     "[  block 3  ]UP"},
    {"{{ [1,'a',none,true,1.5,{'a':1}] }}{{ (1,2) }}{{ 1e20 }} {{ 1e-5 }} {{ 10/4 }} {{ 7//2 }} {{ -7 % 3 }} {{ 2**10 }}",
     "[1, 'a', None, True, 1.5, {'a': 1}](1, 2)1e+20 1e-05 2.5 3 2 1024"},
    {"{{ 'abc'[::-1] }}|{{ 'h\303\251llo'|upper }}|{{ 'a b  c'.split() }}|{{ '{} {}'.format(1,'x') }}|{{ 'x,y'.split(',')[1] }}",
     "cba|H\303\211LLO|['a', 'b', 'c']|1 x|y"},
    {"{{ {'a':[1,2.0,'\303\251',None,True],'b':{}}|tojson }}|{{ {'a':[1,{'b':2}]}|tojson(indent=2) }}",
     "{\"a\": [1, 2.0, \"\303\251\", null, true], \"b\": {}}|{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ]\n}"},
    {"{{ messages|selectattr('role','equalto','user')|map(attribute='content')|join(',') }}|{{ messages|map(attribute='role')|list|length }}",
     "hi|3"},
    {"{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ 3 is odd }}{{ 4 is divisibleby 2 }}{{ {} is mapping }}",
     "FalseTrueTrueTrueTrueTrueTrue"},
    {"{{ '  pad  '|trim }}|{{ 'hello world'|title }}|{{ 'abc'|replace('b','X') }}|{{ [3,1,2]|sort|list }}|{{ [1,2,2,1]|unique|list }}|{{ {'b':1,'a':2}|dictsort }}",
     "pad|Hello World|aXc|[1, 2, 3]|[1, 2]|[('a', 2), ('b', 1)]"},
    {"{{ 'a\nb\n'|indent(2) }}|{{ 'a\nb'|indent(2, first=True) }}|{{ [1,2,3]|sum }}|{{ [4,2]|min }}{{ [4,2]|max }}|{{ -3|abs }}|{{ 2.5|round }}|{{ '42'|int + 1 }}|{{ '1.5'|float }}",
     "a\n  b\n|  a\n  b|6|24|3|2.0|43|1.5"},
    {"{{ d.get('a', 3) }}{{ d.get('z', 3) }}{{ d['zz'] is defined }}{% for k, v in d.items() %}{{ k }}={{ v }}{% endfor %}",
     "None3Falsea=None"},
    {"{{ 'yes' if add_generation_prompt else 'no' }}{{ bos_token }}{{ eos_token }}{{ strftime_now('%Y-%m-%d') }}",
     "yes<s></s>2025-06-15"},
    {"{% raw %}{{ not rendered }}{% endraw %}{{ '<b>'|e }}{{ 'x' ~ 1 ~ none }}{{ 'ab' in 'cabd' }}{{ 3 not in [1,2] }}",
     "{{ not rendered }}&lt;b&gt;x1NoneTrueTrue"},
    {"{%- for m in messages -%}\n  {{- m.role }}\n{%- endfor %}\n",
     "systemuserassistant"},
    {"{{ raise_exception('bad role') }}",
     NULL},
    {"{{ x.y }}",
     NULL},
    {"{{ [1].append(2) }}",
     NULL},
    {"{% if %}",
     NULL},
    {"{{ 'a' + 1 }}",
     NULL},
    {"{{ foo|nosuchfilter }}",
     NULL},
    {"{% for %}",
     NULL},
    {"{{ messages[1:]|length }}{{ messages[-1].content }}{{ messages|last|attr('x') }}",
     "2yo"},
    {"{{ \"Use '\"|safe + 'a<b' + \"'\"|safe }}",
     "Use 'a&lt;b'"},
};

/* Renders `tmpl`; returns the status and puts the output (or NULL) in *out. */
static osp_status render(const char *tmpl, const char *messages, const char *kwargs, char **out) {
    osp_chat_template *t = NULL;
    *out = NULL;
    osp_status s = osp_chat_template_parse(tmpl, strlen(tmpl), &t);
    if (s != OSP_OK) return s;
    osp_chat_template_inputs in = {.messages_json = messages, .kwargs_json = kwargs, .bos_token = "<s>",
                                   .eos_token = "</s>", .add_generation_prompt = 1, .now = 1749988800};
    s = osp_chat_template_render(t, &in, out, NULL);
    osp_chat_template_free(t);
    return s;
}

static void jinja2_table(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        char *out;
        osp_status s = render(k_cases[i].tmpl, MESSAGES, "{\"d\": {\"a\": null}}", &out);
        if (k_cases[i].want) {
            if (s != OSP_OK) fail_msg("case %zu %s: %s", i, k_cases[i].tmpl, osp_last_error());
            if (strcmp(out, k_cases[i].want))
                fail_msg("case %zu %s:\n want [%s]\n got  [%s]", i, k_cases[i].tmpl, k_cases[i].want, out);
        } else if (s == OSP_OK) {
            fail_msg("case %zu %s: jinja2 fails, osprey rendered [%s]", i, k_cases[i].tmpl, out);
        }
        free(out);
    }
}

static void statuses_and_messages(void **state) {
    (void)state;
    char *out;
    assert_int_equal(render("a\n{% if %}", MESSAGES, NULL, &out), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "line 2"));
    assert_int_equal(render("{% include 'x' %}", MESSAGES, NULL, &out), OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "include"));
    assert_int_equal(render("{{ x|nosuch }}", MESSAGES, NULL, &out), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "nosuch"));
    assert_int_equal(render("\n\n{{ raise_exception('Bad role') }}", MESSAGES, NULL, &out), OSP_ERR_INVALID_ARG);
    assert_non_null(strstr(osp_last_error(), "line 3"));
    assert_non_null(strstr(osp_last_error(), "Bad role"));
    assert_int_equal(render("{{ x|truncate(3) }}", MESSAGES, NULL, &out), OSP_ERR_UNSUPPORTED);
    assert_int_equal(render("{% for x in y %}", MESSAGES, NULL, &out), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "endfor"));
    assert_int_equal(render("{% break %}", MESSAGES, NULL, &out), OSP_ERR_FORMAT);
    assert_int_equal(render("{{ 'abc", MESSAGES, NULL, &out), OSP_ERR_FORMAT);
    assert_int_equal(render("{# open", MESSAGES, NULL, &out), OSP_ERR_FORMAT);
    /* an unknown filter inside an if body fails only when reached, as jinja2 defers it there */
    assert_int_equal(render("{% if false %}{{ x|from_json }}{% endif %}ok", MESSAGES, NULL, &out), OSP_OK);
    assert_string_equal(out, "ok");
    free(out);
}

static void inputs(void **state) {
    (void)state;
    char *out;
    assert_int_equal(render("{{ messages }}", "{not json", NULL, &out), OSP_ERR_INVALID_ARG);
    assert_non_null(strstr(osp_last_error(), "messages"));
    assert_int_equal(render("{{ messages }}", "{}", NULL, &out), OSP_ERR_INVALID_ARG);
    assert_int_equal(render("{{ m }}", "[]", "[1]", &out), OSP_ERR_INVALID_ARG);
    /* kwargs become variables and win over the defaults; tools/documents are None when absent */
    assert_int_equal(render("{{ enable_thinking }} {{ bos_token }} {{ tools is none }} {{ documents is none }}", "[]",
                            "{\"enable_thinking\": false, \"bos_token\": \"B\"}", &out),
                     OSP_OK);
    assert_string_equal(out, "False B True True");
    free(out);
    /* content as a list of text parts, unicode kept byte for byte */
    assert_int_equal(render("{% for p in messages[0].content %}{{ p.text }}{% endfor %}|{{ messages[1].content|length }}",
                            "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"\\u00e9\\ud83e\\udd85\"}]},"
                            "{\"role\":\"user\",\"content\":\"\\u4f60\\u597d\"}]",
                            NULL, &out),
                     OSP_OK);
    assert_string_equal(out, "a\303\251\360\237\246\205|2");
    free(out);
}

static void limits(void **state) {
    (void)state;
    char *out;
    /* 10^10 iterations: stopped by the work limit, not run */
    assert_int_equal(render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                            "[]", NULL, &out),
                     OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "budget"));
    assert_int_equal(render("{{ range(1000000) }}", "[]", NULL, &out), OSP_ERR_INVALID_ARG);
    assert_int_equal(render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "[]", NULL, &out),
                     OSP_ERR_UNSUPPORTED);
    assert_int_equal(render("{{ 9223372036854775807 + 1 }}", "[]", NULL, &out), OSP_ERR_UNSUPPORTED);
    /* deep nesting in the parser */
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k] = 0;
    assert_int_not_equal(render(deep, "[]", NULL, &out), OSP_OK);
}

static osp_status render_budget(const char *tmpl, size_t max_memory, uint64_t max_steps, char **out) {
    osp_chat_template *t = NULL;
    *out = NULL;
    osp_status s = osp_chat_template_parse(tmpl, strlen(tmpl), &t);
    if (s != OSP_OK) return s;
    osp_chat_template_inputs in = {.messages_json = "[]", .max_memory = max_memory, .max_steps = max_steps};
    s = osp_chat_template_render(t, &in, out, NULL);
    osp_chat_template_free(t);
    return s;
}

/* The caller's budgets (what osprey serve gives a request's template): a render the defaults allow
 * stops at a small budget with the budget named, and one within it renders the same text. */
static void budgets(void **state) {
    (void)state;
    char *out;
    const char *loop = "{% for i in range(1000) %}{% for j in range(200) %}{% endfor %}{% endfor %}ok";
    assert_int_equal(render_budget(loop, 0, 0, &out), OSP_OK);
    assert_string_equal(out, "ok");
    free(out);
    assert_int_equal(render_budget(loop, 0, 100000, &out), OSP_ERR_UNSUPPORTED);
    assert_null(out);
    assert_non_null(strstr(osp_last_error(), "work budget (100000 steps)"));
    /* a string doubled 22 times: 4 MiB, then 8 MiB of copies; 1 MiB is not enough */
    const char *grow = "{% set ns = namespace(s='x') %}{% for i in range(22) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}";
    assert_int_equal(render_budget(grow, 0, 0, &out), OSP_OK);
    assert_string_equal(out, "4194304");
    free(out);
    assert_int_equal(render_budget(grow, (size_t)1 << 20, 0, &out), OSP_ERR_UNSUPPORTED);
    assert_null(out);
    assert_non_null(strstr(osp_last_error(), "memory budget (1048576 bytes)"));
}

// ---- provenance (osp_chat_template_render_spans) ----------------------------------------------
/* messages[0].content " Ab,c ", [1] "x\ny", [2] "<&>", [3] an assistant tool call {"q": "v"} */
#define TAINT_MESSAGES                                                                             \
    "[{\"role\":\"user\",\"content\":\" Ab,c \"},{\"role\":\"assistant\",\"content\":\"x\\ny\"},"  \
    "{\"role\":\"user\",\"content\":\"<&>\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":" \
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"q\":\"v\"}}}]}]"

/* Renders with provenance, checks the span invariants (inside the text, sorted, non-empty, neither
 * overlapping nor adjacent) and that the text is the plain render's, and returns the text with each
 * tainted span wrapped in [ ] (malloc'd). *lost: provenance_lost. */
static char *render_marked(const char *tmpl, const char *tools, bool *lost) {
    osp_chat_template *t = NULL;
    assert_int_equal(osp_chat_template_parse(tmpl, strlen(tmpl), &t), OSP_OK);
    osp_chat_template_inputs in = {.messages_json = TAINT_MESSAGES, .tools_json = tools, .bos_token = "<s>",
                                   .now = 1749988800};
    osp_chat_template_output o;
    osp_status s = osp_chat_template_render_spans(t, &in, &o);
    if (s != OSP_OK) fprintf(stderr, "render_spans(%s): %s\n", tmpl, osp_last_error());
    assert_int_equal(s, OSP_OK);
    char *plain = NULL;
    size_t plain_n = 0;
    assert_int_equal(osp_chat_template_render(t, &in, &plain, &plain_n), OSP_OK);
    assert_int_equal(plain_n, o.len);
    assert_memory_equal(plain, o.text, o.len);
    free(plain);
    for (size_t i = 0; i < o.n_tainted; i++) {
        assert_true(o.tainted[i].len > 0);
        assert_true(o.tainted[i].off + o.tainted[i].len <= o.len);
        if (i) assert_true(o.tainted[i].off > o.tainted[i - 1].off + o.tainted[i - 1].len);
    }
    char *m = malloc(o.len + 2 * o.n_tainted + 1);
    size_t k = 0, sp = 0;
    for (size_t i = 0; i <= o.len; i++) {
        if (sp < o.n_tainted && i == o.tainted[sp].off + o.tainted[sp].len) m[k++] = ']', sp++;
        if (sp < o.n_tainted && i == o.tainted[sp].off) m[k++] = '[';
        if (i < o.len) m[k++] = o.text[i];
    }
    m[k] = 0;
    if (lost) *lost = o.provenance_lost;
    osp_chat_template_output_free(&o);
    osp_chat_template_free(t);
    return m;
}

/* Each operation keeps the provenance of the bytes it copies: the tainted ones are exactly those
 * that came from the request's strings. */
static void provenance(void **state) {
    (void)state;
    static const struct {
        const char *tmpl, *want;
    } cases[] = {
        {"<{{ messages[0].content }}>", "<[ Ab,c ]>"},
        {"{{ bos_token }}{{ 'lit' }}{% if messages %}x{% endif %}{{ messages[0].content|length }}", "<s>litx6"},
        {"{% set c = messages[0].content %}{{ 'L' ~ c ~ 'R' }}|{{ 'L' + c + 'R' }}|{{ c * 2 }}", "L[ Ab,c ]R|L[ Ab,c ]R|[ Ab,c  Ab,c ]"},
        {"{% set c = messages[0].content %}{{ c[1:3] }}|{{ c[1] }}|{{ c[::-1] }}|{{ ('ab' ~ c)[1:4] }}", "[Ab]|[A]|[ c,bA ]|b[ A]"},
        {"{% set c = messages[0].content %}{{ c|trim }}|{{ c.strip() }}|{{ c.lstrip() }}|{{ c.rstrip(' c') }}", "[Ab,c]|[Ab,c]|[Ab,c ]|[ Ab,]"},
        {"{% set c = messages[0].content %}{{ c.split(',')|join('-') }}|{{ c.split()|join('+') }}|{{ c.split(',')[1] }}", "[ Ab]-[c ]|[Ab,c]|[c ]"},
        {"{{ messages[1].content.splitlines()|join('/') }}", "[x]/[y]"},
        {"{% set c = messages[0].content %}{{ c.replace('b', 'X') }}|{{ 'a-b'.replace('-', c) }}|{{ c|replace(',', ';') }}", "[ A]X[,c ]|a[ Ab,c ]b|[ Ab];[c ]"},
        {"{% set c = messages[0].content %}{{ c|upper }}|{{ c.lower() }}|{{ c|title }}|{{ c|capitalize }}", "[ AB,C ]|[ ab,c ]|[ Ab,c ]|[ ab,c ]"},
        {"{{ messages[0].content|tojson }}|{{ messages[1].content|tojson }}|{{ [messages[0].content] }}", "\"[ Ab,c ]\"|\"[x\\ny]\"|['[ Ab,c ]']"},
        {"{{ messages[3].tool_calls[0].function.arguments|tojson }}|{% for k, v in messages[3].tool_calls[0].function.arguments.items() %}{{ k }}={{ v }}{% endfor %}", "{\"[q]\": \"[v]\"}|[q]=[v]"},
        {"{{ messages[2].content|e }}|{{ messages[2].content|safe }}", "[&lt;&amp;&gt;]|[<&>]"},
        {"{{ messages[1].content|indent(2) }}|{{ messages[1].content|indent(2, first=True) }}", "[x\n]  [y]|  [x\n]  [y]"},
        {"{% for ch in messages[0].content %}{{ ch }}.{% endfor %}|{{ messages[0].content|first }}{{ 'a' }}{{ messages[0].content|last }}", "[ ].[A].[b].[,].[c].[ ].|[ ]a[ ]"},
        {"{% set c = messages[0].content %}{{ '<{}>'.format(c) }}|{{ '%s!'|format(c) }}|{{ c ~ '{}' }}", "<[ Ab,c ]>|[ Ab,c ]!|[ Ab,c ]{}"},
        {"{% macro m(x) %}({{ x }}){% endmacro %}{{ m(messages[2].content) }}|{% set s %}-{{ messages[2].content }}-{% endset %}{{ s|trim('-') }}|{% filter upper %}a{{ messages[1].content }}{% endfilter %}", "([<&>])|[<&>]|A[X\nY]"},
        {"{% set ns = namespace(t='') %}{% for m in messages if m.content is string %}{% set ns.t = ns.t ~ m.content[:1] ~ '|' %}{% endfor %}{{ ns.t }}", "[ ]|[x]|[<]|"},
        {"{{ messages[0].role }}:{{ tools[0].function.name }}", "[user]:[f]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool lost = true;
        char *got = render_marked(cases[i].tmpl, "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", &lost);
        if (strcmp(got, cases[i].want)) fprintf(stderr, "case %zu: %s\n  want %s\n  got  %s\n", i, cases[i].tmpl, cases[i].want, got);
        assert_string_equal(got, cases[i].want);
        assert_false(lost);
        free(got);
    }
    /* strftime_now with a format from the request cannot say which output bytes are whose */
    bool lost = false;
    char *got = render_marked("{{ strftime_now('%Y') }}", NULL, &lost);
    assert_string_equal(got, "2025");
    assert_false(lost);
    free(got);
    got = render_marked("{{ strftime_now(messages[0].content) }}", NULL, &lost);
    assert_true(lost);
    free(got);
    /* the old entry point renders the same text; a failing render leaves the output zeroed */
    osp_chat_template *t = NULL;
    assert_int_equal(osp_chat_template_parse("{{ raise_exception('no') }}", 27, &t), OSP_OK);
    osp_chat_template_inputs in = {.messages_json = "[]"};
    osp_chat_template_output o;
    assert_int_equal(osp_chat_template_render_spans(t, &in, &o), OSP_ERR_INVALID_ARG);
    assert_null(o.text);
    assert_null(o.tainted);
    osp_chat_template_output_free(&o);
    osp_chat_template_free(t);
}

/* osprey render-template (OSPREY_BIN): a template file and --messages as @FILE, --kwargs, and a
 * template error exiting 1 with the message on stderr. Skipped without the binary. */
static void cli(void **state) {
    (void)state;
    const char *bin = getenv("OSPREY_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        fprintf(stderr, "  cli: OSPREY_BIN not built, skipped\n");
        return;
    }
    char dir[] = "/tmp/osprey-tmpl-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char tpath[64], mpath[64], cmd[1024], got[256];
    snprintf(tpath, sizeof tpath, "%s/t.jinja", dir);
    snprintf(mpath, sizeof mpath, "%s/m.json", dir);
    FILE *f = fopen(tpath, "w");
    fputs("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
          "{% if add_generation_prompt %}[assistant]{% endif %}{{ x }}\n",
          f);
    fclose(f);
    f = fopen(mpath, "w");
    fputs("[{\"role\": \"user\", \"content\": \"h\\u00e9\"}]", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' render-template --template %s --messages @%s --add-generation-prompt --bos B --kwargs '{\"x\": 1}'",
             bin, tpath, mpath);
    FILE *p = popen(cmd, "r");
    size_t n = fread(got, 1, sizeof got - 1, p);
    got[n] = 0;
    assert_int_equal(pclose(p), 0);
    assert_string_equal(got, "B[user]h\303\251\n[assistant]1");
    snprintf(cmd, sizeof cmd, "'%s' render-template --template %s --messages '[]' --kwargs '[1]' 2>&1", bin, tpath);
    p = popen(cmd, "r");
    n = fread(got, 1, sizeof got - 1, p);
    got[n] = 0;
    assert_int_not_equal(pclose(p), 0);
    assert_non_null(strstr(got, "chat_template_kwargs"));
    remove(tpath);
    remove(mpath);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cli),
        cmocka_unit_test(jinja2_table),
        cmocka_unit_test(statuses_and_messages),
        cmocka_unit_test(inputs),
        cmocka_unit_test(limits),
        cmocka_unit_test(budgets),
        cmocka_unit_test(provenance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
