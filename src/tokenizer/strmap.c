/* A small open-addressing hash map from byte strings to int32, for the vocabulary (~50k-150k
 * entries) and the BPE merge ranks. Linear probing over a power-of-two table kept at most half
 * full; FNV-1a hashes. Keys are copied into one pool, so lookups never allocate. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static bool grow_slots(osp_strmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = m->hash[i] & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = (uint32_t)i + 1;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return true;
}

static bool grow_entries(osp_strmap *m) {
    size_t cap = m->n_cap ? m->n_cap * 2 : 1024;
    uint64_t *ko = realloc(m->key_off, cap * sizeof *ko);
    if (!ko) return false;
    m->key_off = ko;
    uint32_t *kl = realloc(m->key_len, cap * sizeof *kl);
    if (!kl) return false;
    m->key_len = kl;
    uint32_t *h = realloc(m->hash, cap * sizeof *h);
    if (!h) return false;
    m->hash = h;
    int32_t *v = realloc(m->val, cap * sizeof *v);
    if (!v) return false;
    m->val = v;
    m->n_cap = cap;
    return true;
}

static uint32_t *find_slot(const osp_strmap *m, const char *key, size_t len, uint32_t h) {
    size_t j = h & (m->cap - 1);
    for (;;) {
        uint32_t e = m->slots[j];
        if (!e) return &m->slots[j];
        e--;
        if (m->hash[e] == h && m->key_len[e] == len && memcmp(m->pool + m->key_off[e], key, len) == 0)
            return &m->slots[j];
        j = (j + 1) & (m->cap - 1);
    }
}

bool osp_strmap_put(osp_strmap *m, const char *key, size_t len, int32_t val, bool overwrite) {
    if ((m->n + 1) * 2 > m->cap && !grow_slots(m)) return false;
    uint32_t h = hash_bytes(key, len);
    uint32_t *slot = find_slot(m, key, len, h);
    if (*slot) {
        if (overwrite) m->val[*slot - 1] = val;
        return true;
    }
    if (m->n == m->n_cap && !grow_entries(m)) return false;
    if (m->pool_len + len > m->pool_cap) {
        size_t cap = m->pool_cap ? m->pool_cap : 1 << 16;
        while (cap < m->pool_len + len) cap *= 2;
        char *pool = realloc(m->pool, cap);
        if (!pool) return false;
        m->pool = pool;
        m->pool_cap = cap;
    }
    if (len) memcpy(m->pool + m->pool_len, key, len);
    size_t e = m->n++;
    m->key_off[e] = m->pool_len;
    m->key_len[e] = (uint32_t)len;
    m->hash[e] = h;
    m->val[e] = val;
    m->pool_len += len;
    *slot = (uint32_t)e + 1;
    return true;
}

int32_t osp_strmap_get(const osp_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    uint32_t h = hash_bytes(key, len);
    uint32_t *slot = find_slot(m, key, len, h);
    return *slot ? m->val[*slot - 1] : -1;
}

void osp_strmap_free(osp_strmap *m) {
    free(m->slots);
    free(m->key_off);
    free(m->key_len);
    free(m->hash);
    free(m->val);
    free(m->pool);
    memset(m, 0, sizeof *m);
}
