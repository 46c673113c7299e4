/* Chained block hashes for automatic prefix caching (see prefix_cache.h). For xxh3-128 and osprey's
 * sha256 the hashed message is seed (8 bytes LE) || parent flag and hash (1 + 16 bytes) || n (4) ||
 * tokens (4 each, LE) || extra keys, fed to xxh3-128 (seeded) or sha256 (first 16 bytes kept). For
 * sha256_cbor it is the canonical CBOR of [parent, [tokens], extra] (vLLM's message), streamed into
 * sha256 without building it whole. */
#include "kv/prefix_cache.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "core/le.h"

/* ---- sha256 (FIPS 180-4 §6.2) ---------------------------------------------------------------- */

typedef struct sha256_ctx {
    uint32_t h[8];
    uint8_t buf[64];
    size_t n;
    uint64_t total;
} sha256_ctx;

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int r) { return (x >> r) | (x << (32 - r)); }

static void sha256_block(sha256_ctx *c, const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        const uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        const uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4], f = c->h[5], g = c->h[6], h = c->h[7];
    for (int i = 0; i < 64; i++) {
        const uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        const uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g, g = f, f = e, e = d + t1, d = cc, cc = b, b = a, a = t1 + t2;
    }
    c->h[0] += a, c->h[1] += b, c->h[2] += cc, c->h[3] += d, c->h[4] += e, c->h[5] += f, c->h[6] += g, c->h[7] += h;
}

static void sha256_init(sha256_ctx *c) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof iv);
    c->n = 0;
    c->total = 0;
}

static void sha256_update(sha256_ctx *c, const void *data, size_t len) {
    const uint8_t *p = data;
    c->total += len;
    while (len > 0) {
        size_t take = 64 - c->n < len ? 64 - c->n : len;
        memcpy(c->buf + c->n, p, take);
        c->n += take, p += take, len -= take;
        if (c->n == 64) {
            sha256_block(c, c->buf);
            c->n = 0;
        }
    }
}

static void sha256_final(sha256_ctx *c, uint8_t out[32]) {
    const uint64_t bits = c->total * 8;
    const uint8_t one = 0x80, zero = 0;
    sha256_update(c, &one, 1);
    while (c->n != 56) sha256_update(c, &zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(c, len, 8);
    for (int i = 0; i < 8; i++)
        out[4 * i] = (uint8_t)(c->h[i] >> 24), out[4 * i + 1] = (uint8_t)(c->h[i] >> 16),
                out[4 * i + 2] = (uint8_t)(c->h[i] >> 8), out[4 * i + 3] = (uint8_t)c->h[i];
}

void osp_sha256(const void *data, size_t len, uint8_t out[32]) {
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, data, len);
    sha256_final(&c, out);
}

/* ---- block hashes ---------------------------------------------------------------------------- */

static uint64_t g_process_seed;
static pthread_once_t g_seed_once = PTHREAD_ONCE_INIT;

static void draw_process_seed(void) {
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
    }
    g_process_seed = s;
}

size_t osp_cbor_head(uint8_t out[9], unsigned major, uint64_t v) {
    const uint8_t m = (uint8_t)(major << 5);
    if (v < 24) {
        out[0] = m | (uint8_t)v;
        return 1;
    }
    int nb = v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffu ? 4 : 8;
    out[0] = m | (uint8_t)(nb == 1 ? 24 : nb == 2 ? 25 : nb == 4 ? 26 : 27);
    for (int i = 0; i < nb; i++) out[1 + i] = (uint8_t)(v >> (8 * (nb - 1 - i)));
    return 1 + (size_t)nb;
}

/* sha256 of cbor(text) for the decimal digits of seed: vLLM's NONE_HASH for PYTHONHASHSEED = seed. */
static void none_hash(uint64_t seed, uint8_t out[32]) {
    char dec[24];
    const int n = snprintf(dec, sizeof dec, "%llu", (unsigned long long)seed);
    uint8_t msg[9 + sizeof dec];
    const size_t hl = osp_cbor_head(msg, 3, (uint64_t)n);
    memcpy(msg + hl, dec, (size_t)n);
    osp_sha256(msg, hl + (size_t)n, out);
}

osp_prefix_hasher osp_prefix_hasher_make(osp_prefix_hash_algo algo, bool seed_set, uint64_t seed) {
    osp_prefix_hasher h = {.algo = algo, .seed = seed};
    if (!seed_set) {
        pthread_once(&g_seed_once, draw_process_seed);
        h.seed = g_process_seed;
    }
    if (algo == OSP_PREFIX_HASH_SHA256_CBOR) none_hash(h.seed, h.none_hash);
    return h;
}

static uint64_t bswap64(uint64_t v) { return __builtin_bswap64(v); }

uint64_t osp_block_hash_external(const osp_block_hash *h, osp_prefix_hash_algo algo) {
    switch (algo) {
    case OSP_PREFIX_HASH_SHA256: return bswap64(h->hi);          /* digest bytes 8..15 */
    case OSP_PREFIX_HASH_SHA256_CBOR: return bswap64(h->ext[1]); /* digest bytes 24..31 */
    default: return h->lo;                                       /* xxh3-128's low half */
    }
}

/* vLLM's sha256_cbor block hash (prefix_cache.h). */
static osp_block_hash hash_cbor(const osp_prefix_hasher *h, const osp_block_hash *parent, const int32_t *tokens,
                                int32_t n, const void *extra, size_t extra_len) {
    sha256_ctx c;
    sha256_init(&c);
    uint8_t buf[9 * 64 + 64];
    size_t k = osp_cbor_head(buf, 4, 3);  /* [parent, tokens, extra] */
    k += osp_cbor_head(buf + k, 2, 32);  /* parent: a 32-byte byte string */
    if (parent) {
        osp_put_le64(buf + k, parent->lo), osp_put_le64(buf + k + 8, parent->hi);
        osp_put_le64(buf + k + 16, parent->ext[0]), osp_put_le64(buf + k + 24, parent->ext[1]);
    } else memcpy(buf + k, h->none_hash, 32);
    k += 32;
    k += osp_cbor_head(buf + k, 4, (uint64_t)n);
    for (int32_t i = 0; i < n; i++) {
        if (k > sizeof buf - 9) {
            sha256_update(&c, buf, k);
            k = 0;
        }
        /* token ids are >= 0 (major 0); a negative one would be CBOR's major 1, -1 - v */
        k += tokens[i] >= 0 ? osp_cbor_head(buf + k, 0, (uint64_t)tokens[i])
                            : osp_cbor_head(buf + k, 1, (uint64_t)(-1 - (int64_t)tokens[i]));
    }
    if (k > sizeof buf - 20) { /* room for the extra keys' heads (at most 1 + 9) or null */
        sha256_update(&c, buf, k);
        k = 0;
    }
    if (extra_len) {
        k += osp_cbor_head(buf + k, 4, 1);
        k += osp_cbor_head(buf + k, 2, extra_len);
        sha256_update(&c, buf, k);
        sha256_update(&c, extra, extra_len);
    } else {
        buf[k++] = 0xf6; /* null */
        sha256_update(&c, buf, k);
    }
    uint8_t d[32];
    sha256_final(&c, d);
    return (osp_block_hash){.lo = osp_get_le64(d), .hi = osp_get_le64(d + 8), .ext = {osp_get_le64(d + 16), osp_get_le64(d + 24)}};
}

osp_block_hash osp_prefix_hash_block(const osp_prefix_hasher *h, const osp_block_hash *parent,
                                     const int32_t *tokens, int32_t n, const void *extra, size_t extra_len) {
    if (h->algo == OSP_PREFIX_HASH_SHA256_CBOR) return hash_cbor(h, parent, tokens, n, extra, extra_len);
    uint8_t head[8 + 1 + 16 + 4] = {0};
    osp_put_le64(head, h->seed);
    if (parent) {
        head[8] = 1;
        osp_put_le64(head + 9, parent->lo);
        osp_put_le64(head + 17, parent->hi);
    }
    for (int i = 0; i < 4; i++) head[25 + i] = (uint8_t)((uint32_t)n >> (8 * i));
    uint8_t tok[4 * 64];
    osp_block_hash out = {0};
    if (h->algo == OSP_PREFIX_HASH_SHA256) {
        sha256_ctx c;
        sha256_init(&c);
        sha256_update(&c, head, sizeof head);
        for (int32_t i = 0; i < n; i += 64) {
            const int32_t m = n - i < 64 ? n - i : 64;
            for (int32_t j = 0; j < m; j++)
                for (int b = 0; b < 4; b++) tok[4 * j + b] = (uint8_t)((uint32_t)tokens[i + j] >> (8 * b));
            sha256_update(&c, tok, (size_t)m * 4);
        }
        if (extra_len) sha256_update(&c, extra, extra_len);
        uint8_t d[32];
        sha256_final(&c, d);
        out.lo = out.hi = 0;
        for (int i = 0; i < 8; i++) out.lo |= (uint64_t)d[i] << (8 * i), out.hi |= (uint64_t)d[8 + i] << (8 * i);
        return out;
    }
    XXH3_state_t st;
    XXH3_128bits_reset_withSeed(&st, h->seed);
    XXH3_128bits_update(&st, head, sizeof head);
    for (int32_t i = 0; i < n; i += 64) {
        const int32_t m = n - i < 64 ? n - i : 64;
        for (int32_t j = 0; j < m; j++)
            for (int b = 0; b < 4; b++) tok[4 * j + b] = (uint8_t)((uint32_t)tokens[i + j] >> (8 * b));
        XXH3_128bits_update(&st, tok, (size_t)m * 4);
    }
    if (extra_len) XXH3_128bits_update(&st, extra, extra_len);
    const XXH128_hash_t r = XXH3_128bits_digest(&st);
    out.lo = r.low64;
    out.hi = r.high64;
    return out;
}

int32_t osp_prefix_cache_match(const osp_block_pool *p, const osp_block_hash *hashes, int32_t n, int32_t *ids) {
    int32_t i = 0;
    for (; i < n; i++) {
        const int32_t id = osp_block_pool_lookup(p, &hashes[i]);
        if (id < 0) break;
        ids[i] = id;
    }
    return i;
}
