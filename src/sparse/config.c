/* --sparse-attention: parsing and checking (osprey/sparse.h). A hand-written scanner over the few
 * tokens the grammar has: every byte is accounted for, numbers are bounded before they can overflow. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/status_internal.h"
#include "osprey/sparse.h"

osp_sparse_config osp_sparse_default_config(void) { return (osp_sparse_config){.method = OSP_SPARSE_NONE}; }

osp_status osp_sparse_config_check(const osp_sparse_config *c) {
    if (!c) return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: NULL config");
    if (c->method == OSP_SPARSE_NONE) return OSP_OK;
    if (c->method != OSP_SPARSE_TOPK) return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: unknown method %d", (int)c->method);
    if (c->topk_pages < 1)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: a budget of %d pages reads nothing; give topk >= 1",
                             c->topk_pages);
    if (c->topk_pages > OSP_SPARSE_MAX_PAGES || c->recent_pages < 0 || c->sink_pages < 0 ||
        c->recent_pages > OSP_SPARSE_MAX_PAGES || c->sink_pages > OSP_SPARSE_MAX_PAGES)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: page counts must lie in [0, %d] (topk >= 1)",
                             OSP_SPARSE_MAX_PAGES);
    if (c->recent_pages + c->sink_pages > c->topk_pages)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "sparse attention: recent %d + sink %d pages exceed the budget of %d pages", c->recent_pages,
                             c->sink_pages, c->topk_pages);
    return OSP_OK;
}

/* A decimal number at *p up to the next ',' or the end: digits only, no leading zero (but "0"),
 * at most OSP_SPARSE_MAX_PAGES. Moves *p past it. */
static osp_status number(const char **p, const char *key, int32_t *out) {
    const char *s = *p;
    int64_t v = 0;
    int n = 0;
    for (; *s >= '0' && *s <= '9'; s++, n++) {
        v = v * 10 + (*s - '0');
        if (v > OSP_SPARSE_MAX_PAGES)
            return osp_set_error(OSP_ERR_INVALID_ARG, "%s is above %d pages", key, OSP_SPARSE_MAX_PAGES);
    }
    if (n == 0 || (*s && *s != ','))
        return osp_set_error(OSP_ERR_INVALID_ARG, "%s needs a page count (decimal digits), got '%.*s'",
                             key, (int)strcspn(*p, ","), *p);
    if (n > 1 && **p == '0')
        return osp_set_error(OSP_ERR_INVALID_ARG, "%s '%.*s' has a leading zero", key, n, *p);
    *out = (int32_t)v;
    *p = s;
    return OSP_OK;
}

osp_status osp_sparse_config_parse(const char *value, osp_sparse_config *out) {
    if (!value || !out) return osp_set_error(OSP_ERR_INVALID_ARG, "no value");
    if (!strcmp(value, "off")) {
        *out = osp_sparse_default_config();
        return OSP_OK;
    }
    if (strncmp(value, "topk:", 5) != 0)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "'%.40s' is not 'off' or topk:PAGES[,recent:R][,sink:S]", value);
    osp_sparse_config c = {.method = OSP_SPARSE_TOPK, .recent_pages = 1, .sink_pages = 0};
    const char *p = value + 5;
    OSP_TRY(number(&p, "topk", &c.topk_pages));
    if (c.topk_pages == 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "a budget of zero pages reads nothing; give topk:N "
                                                  "with N >= 1 (or 'off')");
    bool seen_recent = false, seen_sink = false;
    while (*p == ',') {
        p++;
        if (!strncmp(p, "recent:", 7)) {
            if (seen_recent) return osp_set_error(OSP_ERR_INVALID_ARG, "recent given twice");
            seen_recent = true, p += 7;
            OSP_TRY(number(&p, "recent", &c.recent_pages));
        } else if (!strncmp(p, "sink:", 5)) {
            if (seen_sink) return osp_set_error(OSP_ERR_INVALID_ARG, "sink given twice");
            seen_sink = true, p += 5;
            OSP_TRY(number(&p, "sink", &c.sink_pages));
        } else
            return osp_set_error(OSP_ERR_INVALID_ARG, "unknown key '%.*s' (recent, sink)",
                                 (int)strcspn(p, ",:"), p);
    }
    if (*p) return osp_set_error(OSP_ERR_INVALID_ARG, "unexpected '%.20s'", p);
    OSP_TRY(osp_sparse_config_check(&c));
    *out = c;
    return OSP_OK;
}

void osp_sparse_config_format(const osp_sparse_config *c, char *buf, int32_t n) {
    if (!buf || n <= 0) return;
    if (!c || c->method != OSP_SPARSE_TOPK) snprintf(buf, (size_t)n, "off");
    else snprintf(buf, (size_t)n, "topk:%d,recent:%d,sink:%d", c->topk_pages, c->recent_pages, c->sink_pages);
}
