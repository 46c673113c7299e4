/* osprey serve: who may call and from where, as pure functions the routes apply and the unit tests
 * check: the API key compared in constant time, and CORS as vLLM answers it (its --allowed-origins,
 * --allowed-methods, --allowed-headers, --allow-credentials feed Starlette's CORSMiddleware; the
 * headers below are that middleware's, starlette/middleware/cors.py).
 *
 * CORS: a request without Origin gets nothing. A preflight (OPTIONS with Origin and
 * Access-Control-Request-Method) is answered here, before the API key is checked (browsers send no
 * credentials on preflights): 200 "OK", or 400 "Disallowed CORS origin, method, headers" naming what
 * failed, with Access-Control-Allow-Origin ("*" when every origin is allowed and no credentials, else
 * the origin itself and Vary: Origin), -Allow-Methods (the list; "*" is every method), -Max-Age 600,
 * -Allow-Headers (the request's own list mirrored when "*", else the allowed list with the four
 * CORS-safelisted headers), -Allow-Credentials. Any other response to a request with an allowed
 * Origin gets Access-Control-Allow-Origin ("*", or the origin with Vary: Origin when origins are listed
 * or the request carries a cookie) and -Allow-Credentials when set. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

bool srv_secret_equal(const char *given, const char *secret) {
    const size_t n = strlen(secret), m = given ? strlen(given) : 0;
    /* every byte of the secret is looked at whatever matches: the time depends on its length only */
    volatile unsigned char diff = (unsigned char)(m != n) | (unsigned char)!given;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)((i < m ? (unsigned char)given[i] : 0u) ^ (unsigned char)secret[i]);
    return diff == 0;
}

bool srv_bearer_ok(const char *authorization, const char *api_key) {
    if (!api_key) return true;
    const bool bearer = authorization && !strncmp(authorization, "Bearer ", 7);
    return srv_secret_equal(bearer ? authorization + 7 : "", api_key) && bearer;
}

/* ---- CORS ---------------------------------------------------------------------------------- */

static const char *const k_all_methods[] = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"};
static const char *const k_safelisted[] = {"accept", "accept-language", "content-language", "content-type"};

static void list_free(char **v, int n) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

void srv_cors_free(srv_cors *c) {
    list_free(c->origins, c->n_origins);
    list_free(c->methods, c->n_methods);
    list_free(c->headers, c->n_headers);
    memset(c, 0, sizeof *c);
}

static int list_add(char ***v, int *n, const char *s, size_t len) {
    while (len && isspace((unsigned char)*s)) s++, len--;
    while (len && isspace((unsigned char)s[len - 1])) len--;
    if (!len) return 0;
    char **p = realloc(*v, sizeof(char *) * (size_t)(*n + 1));
    if (!p) return -1;
    *v = p;
    if (!(p[*n] = strndup(s, len))) return -1;
    (*n)++;
    return 0;
}

/* value: a JSON list of strings (vLLM's form, '["http://a.com","http://b.com"]') or comma-separated */
static int parse_list(const char *value, char ***v, int *n, char *why, size_t why_cap) {
    list_free(*v, *n);
    *v = NULL;
    *n = 0;
    const char *s = value;
    while (isspace((unsigned char)*s)) s++;
    if (*s == '[') {
        json_error_t je;
        json_t *a = json_loads(value, 0, &je);
        if (!json_is_array(a)) {
            snprintf(why, why_cap, "'%s' is not a JSON list of strings", value);
            json_decref(a);
            return -1;
        }
        for (size_t i = 0; i < json_array_size(a); i++) {
            const json_t *x = json_array_get(a, i);
            if (!json_is_string(x)) {
                snprintf(why, why_cap, "'%s' is not a JSON list of strings", value);
                json_decref(a);
                return -1;
            }
            if (list_add(v, n, json_string_value(x), json_string_length(x))) {
                json_decref(a);
                return snprintf(why, why_cap, "out of memory"), -1;
            }
        }
        json_decref(a);
        return 0;
    }
    while (*s) {
        const char *e = strchr(s, ',');
        const size_t len = e ? (size_t)(e - s) : strlen(s);
        if (list_add(v, n, s, len)) return snprintf(why, why_cap, "out of memory"), -1;
        s += len + (e ? 1 : 0);
    }
    return 0;
}

static bool has_star(char **v, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i], "*")) return true;
    return false;
}

int srv_cors_set(srv_cors *c, srv_cors_list which, const char *value, char *why, size_t why_cap) {
    char ***v = which == SRV_CORS_ORIGINS ? &c->origins : which == SRV_CORS_METHODS ? &c->methods : &c->headers;
    int *n = which == SRV_CORS_ORIGINS ? &c->n_origins : which == SRV_CORS_METHODS ? &c->n_methods : &c->n_headers;
    return parse_list(value, v, n, why, why_cap);
}

int srv_cors_default(srv_cors *c) {
    memset(c, 0, sizeof *c);
    char why[64];
    if (srv_cors_set(c, SRV_CORS_ORIGINS, "*", why, sizeof why) || srv_cors_set(c, SRV_CORS_METHODS, "*", why, sizeof why) ||
        srv_cors_set(c, SRV_CORS_HEADERS, "*", why, sizeof why)) {
        srv_cors_free(c);
        return -1;
    }
    return 0;
}

static bool origin_allowed(const srv_cors *c, const char *origin) {
    if (has_star(c->origins, c->n_origins)) return true;
    for (int i = 0; i < c->n_origins; i++)
        if (!strcmp(c->origins[i], origin)) return true;
    return false;
}

static bool method_allowed(const srv_cors *c, const char *method) {
    if (has_star(c->methods, c->n_methods)) {
        for (size_t i = 0; i < sizeof k_all_methods / sizeof *k_all_methods; i++)
            if (!strcmp(k_all_methods[i], method)) return true;
        return false;
    }
    for (int i = 0; i < c->n_methods; i++)
        if (!strcmp(c->methods[i], method)) return true;
    return false;
}

static bool header_allowed(const srv_cors *c, const char *h, size_t len) {
    for (size_t i = 0; i < sizeof k_safelisted / sizeof *k_safelisted; i++)
        if (strlen(k_safelisted[i]) == len && !strncasecmp(k_safelisted[i], h, len)) return true;
    for (int i = 0; i < c->n_headers; i++)
        if (strlen(c->headers[i]) == len && !strncasecmp(c->headers[i], h, len)) return true;
    return false;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int srv_cors_preflight(const srv_cors *c, const char *origin, const char *method, const char *req_headers,
                       srv_header_fn add, void *ctx, char *body, size_t body_cap) {
    const bool any_origin = has_star(c->origins, c->n_origins), any_header = has_star(c->headers, c->n_headers);
    const bool explicit_origin = !any_origin || c->credentials;
    bool bad_origin = false, bad_method = false, bad_headers = false;
    if (explicit_origin) add(ctx, "Vary", "Origin");
    else add(ctx, "Access-Control-Allow-Origin", "*");
    if (origin_allowed(c, origin)) {
        if (explicit_origin) add(ctx, "Access-Control-Allow-Origin", origin);
    } else bad_origin = true;
    char buf[1024];
    size_t len = 0;
    buf[0] = 0;
    const bool all_methods = has_star(c->methods, c->n_methods);
    const int n_methods = all_methods ? (int)(sizeof k_all_methods / sizeof *k_all_methods) : c->n_methods;
    for (int i = 0; i < n_methods && len < sizeof buf; i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", i ? ", " : "", all_methods ? k_all_methods[i] : c->methods[i]);
    add(ctx, "Access-Control-Allow-Methods", buf);
    add(ctx, "Access-Control-Max-Age", "600");
    if (!any_header) { /* sorted(SAFELISTED | allowed), as given (Starlette keeps the flag's spelling here) */
        const char *names[4 + 64];
        int k = 0;
        static const char *const safelisted_cased[] = {"Accept", "Accept-Language", "Content-Language", "Content-Type"};
        for (int i = 0; i < 4; i++) names[k++] = safelisted_cased[i];
        for (int i = 0; i < c->n_headers && k < (int)(sizeof names / sizeof *names); i++) {
            bool dup = false;
            for (int j = 0; j < k; j++) dup |= !strcmp(names[j], c->headers[i]);
            if (!dup) names[k++] = c->headers[i];
        }
        qsort(names, (size_t)k, sizeof *names, cmp_str);
        len = 0;
        buf[0] = 0;
        for (int i = 0; i < k && len < sizeof buf; i++) len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", i ? ", " : "", names[i]);
        add(ctx, "Access-Control-Allow-Headers", buf);
    }
    if (c->credentials) add(ctx, "Access-Control-Allow-Credentials", "true");
    if (!method_allowed(c, method)) bad_method = true;
    if (req_headers) {
        if (any_header) add(ctx, "Access-Control-Allow-Headers", req_headers);
        else
            for (const char *s = req_headers; *s;) {
                const char *e = strchr(s, ',');
                size_t n = e ? (size_t)(e - s) : strlen(s);
                const char *h = s;
                while (n && isspace((unsigned char)*h)) h++, n--;
                while (n && isspace((unsigned char)h[n - 1])) n--;
                if (!header_allowed(c, h, n)) {
                    bad_headers = true;
                    break;
                }
                if (!e) break;
                s = e + 1;
            }
    }
    if (!bad_origin && !bad_method && !bad_headers) {
        snprintf(body, body_cap, "OK");
        return 200;
    }
    snprintf(body, body_cap, "Disallowed CORS %s%s%s%s%s", bad_origin ? "origin" : "", bad_origin && bad_method ? ", " : "",
             bad_method ? "method" : "", (bad_origin || bad_method) && bad_headers ? ", " : "", bad_headers ? "headers" : "");
    return 400;
}

void srv_cors_simple(const srv_cors *c, const char *origin, bool has_cookie, srv_header_fn add, void *ctx) {
    if (!origin) return;
    const bool any_origin = has_star(c->origins, c->n_origins);
    if ((any_origin && has_cookie) || (!any_origin && origin_allowed(c, origin))) {
        add(ctx, "Access-Control-Allow-Origin", origin);
        add(ctx, "Vary", "Origin");
    } else if (any_origin) add(ctx, "Access-Control-Allow-Origin", "*");
    if (c->credentials) add(ctx, "Access-Control-Allow-Credentials", "true");
}
