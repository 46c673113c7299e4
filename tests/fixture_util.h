/* Small helpers shared by the tests that read the text fixtures under tests/golden/fixtures/
 * (header-only, static: each test executable gets its own copy). */
#ifndef OSPREY_TESTS_FIXTURE_UTIL_H
#define OSPREY_TESTS_FIXTURE_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"

/* Decodes hex digits from h (up to a space, newline or NUL) into out[cap]; returns the byte count. */
static inline size_t fixture_unhex(const char *h, uint8_t *out, size_t cap) {
    size_t n = 0;
    while (h[0] && h[1] && n < cap && h[0] != ' ' && h[0] != '\n') {
        unsigned v;
        sscanf(h, "%2x", &v);
        out[n++] = (uint8_t)v;
        h += 2;
    }
    return n;
}

/* The ggml type id whose name is `name` ("Q4_1"), or UINT32_MAX. */
static inline uint32_t fixture_type_by_name(const char *name) {
    for (uint32_t t = 0; t < OSP_DTYPE_COUNT; t++)
        if (osp_dtype_name(t) && strcmp(osp_dtype_name(t), name) == 0) return t;
    return UINT32_MAX;
}

#endif
