/* The KL-divergence base file (kl_base.h says the layout). */
#include "format/kl_base.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/status_internal.h"

/* far above any real base: a 1M-token corpus at top-32 is 264 MB (8 k + 8 bytes a position) */
#define MAX_FILE_BYTES ((size_t)4 << 30)

static const char kMagic[8] = {'O', 'S', 'P', 'K', 'L', 'B', '0', '1'};

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static float rdf(const uint8_t *p) {
    const uint32_t u = rd32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void wr32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}
static void wr64(uint8_t *p, uint64_t v) { wr32(p, (uint32_t)v), wr32(p + 4, (uint32_t)(v >> 32)); }
static void wrf(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    wr32(p, u);
}

uint64_t osp_fnv1a64_ids(uint64_t h, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)ids[i];
        for (int b = 0; b < 4; b++) {
            h ^= (u >> (8 * b)) & 0xffu;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

size_t osp_kl_base_file_bytes(uint32_t n_chunks, uint32_t n_scored, uint32_t k) {
    if (n_chunks == 0 || n_scored == 0 || k == 0 || k > OSP_KLB_MAX_TOP) return 0;
    const uint64_t recs = (uint64_t)n_chunks * n_scored;
    const uint64_t rec_bytes = 8ull * k + 8ull;
    if (recs > (UINT64_MAX - OSP_KLB_HEADER_BYTES) / rec_bytes) return 0;
    const uint64_t total = OSP_KLB_HEADER_BYTES + recs * rec_bytes;
    if (total > (uint64_t)SIZE_MAX) return 0;
    return (size_t)total;
}

void osp_kl_base_free(osp_kl_base *b) {
    if (!b) return;
    free(b->ids), free(b->logprob), free(b->logprob_rest), free(b->nll);
    memset(b, 0, sizeof *b);
}

osp_status osp_kl_base_parse(const void *buf, size_t len, osp_kl_base *out) {
    memset(out, 0, sizeof *out);
    const uint8_t *p = buf;
    if (!buf || len < OSP_KLB_HEADER_BYTES) return osp_set_error(OSP_ERR_FORMAT, "KL base: %zu bytes, shorter than the header", len);
    if (memcmp(p, kMagic, 8)) return osp_set_error(OSP_ERR_FORMAT, "KL base: not an osprey KL base file (magic)");
    osp_kl_base b = {.n_vocab = rd32(p + 8), .ctx = rd32(p + 12), .n_chunks = rd32(p + 16), .n_scored = rd32(p + 20),
                     .k = rd32(p + 24), .tokens_hash = rd64(p + 32)};
    if (rd32(p + 28) || rd64(p + 40)) return osp_set_error(OSP_ERR_FORMAT, "KL base: reserved header fields are not 0");
    if (b.n_vocab == 0 || b.n_vocab > (uint32_t)INT32_MAX)
        return osp_set_error(OSP_ERR_FORMAT, "KL base: vocabulary %u out of range", b.n_vocab);
    if (b.ctx < 2 || b.ctx > (uint32_t)INT32_MAX) return osp_set_error(OSP_ERR_FORMAT, "KL base: ctx %u out of range", b.ctx);
    if (b.n_scored == 0 || b.n_scored >= b.ctx)
        return osp_set_error(OSP_ERR_FORMAT, "KL base: %u scored positions a chunk of %u", b.n_scored, b.ctx);
    if (b.k == 0 || b.k > OSP_KLB_MAX_TOP || b.k > b.n_vocab)
        return osp_set_error(OSP_ERR_FORMAT, "KL base: k %u out of range (1 .. %d, <= vocabulary)", b.k, OSP_KLB_MAX_TOP);
    const size_t want = osp_kl_base_file_bytes(b.n_chunks, b.n_scored, b.k);
    if (want == 0 || want != len)
        return osp_set_error(OSP_ERR_FORMAT, "KL base: %zu bytes, the header's counts need %zu", len, want);
    const size_t n = (size_t)b.n_chunks * b.n_scored;
    b.ids = malloc(n * b.k * sizeof *b.ids);
    b.logprob = malloc(n * b.k * sizeof *b.logprob);
    b.logprob_rest = malloc(n * sizeof *b.logprob_rest);
    b.nll = malloc(n * sizeof *b.nll);
    if (!b.ids || !b.logprob || !b.logprob_rest || !b.nll) {
        osp_kl_base_free(&b);
        return osp_set_error(OSP_ERR_NOMEM, "KL base: %zu records", n);
    }
    const uint8_t *r = p + OSP_KLB_HEADER_BYTES;
    for (size_t i = 0; i < n; i++) {
        int32_t *ids = b.ids + i * b.k;
        float *lp = b.logprob + i * b.k;
        for (uint32_t j = 0; j < b.k; j++) ids[j] = (int32_t)rd32(r + 4 * j);
        for (uint32_t j = 0; j < b.k; j++) lp[j] = rdf(r + 4 * (b.k + j));
        b.logprob_rest[i] = rdf(r + 8 * b.k);
        b.nll[i] = rdf(r + 8 * b.k + 4);
        r += 8 * (size_t)b.k + 8;
        const char *bad = NULL;
        for (uint32_t j = 0; j < b.k && !bad; j++) {
            if (ids[j] < 0 || (uint32_t)ids[j] >= b.n_vocab) bad = "an id outside the vocabulary";
            else if (!(lp[j] <= 0.0f) || isinf(lp[j])) bad = "a log-probability that is not finite and <= 0";
            else if (j > 0 && (lp[j] > lp[j - 1] || (lp[j] == lp[j - 1] && ids[j] <= ids[j - 1])))
                bad = "top entries out of order (log-probability descending, lower id first, no repeats)";
        }
        /* duplicate ids with distinct log-probabilities are caught by a scan: k <= 64 */
        for (uint32_t j = 0; j < b.k && !bad; j++)
            for (uint32_t j2 = j + 1; j2 < b.k && !bad; j2++)
                if (ids[j] == ids[j2]) bad = "a repeated id";
        /* the rest: finite and <= 0, or -inf (nothing left) */
        if (!bad && (isnan(b.logprob_rest[i]) || b.logprob_rest[i] > 0.0f)) bad = "a rest mass that is not a log-probability";
        if (!bad && !(b.nll[i] >= 0.0f && isfinite(b.nll[i]))) bad = "an NLL that is not finite and >= 0";
        if (bad) {
            osp_kl_base_free(&b);
            return osp_set_error(OSP_ERR_FORMAT, "KL base: record %zu: %s", i, bad);
        }
    }
    *out = b;
    return OSP_OK;
}

osp_status osp_kl_base_load(const char *path, osp_kl_base *out) {
    memset(out, 0, sizeof *out);
    char *buf;
    size_t len;
    OSP_TRY(osp_read_file(path, MAX_FILE_BYTES, "KL base", &buf, &len));
    const osp_status s = osp_kl_base_parse(buf, len, out);
    free(buf);
    if (s != OSP_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", osp_last_error());
        return osp_set_error(s, "%s: %s", path, msg);
    }
    return OSP_OK;
}

void osp_kl_base_order_ties(int32_t *ids, const float *logprob, uint32_t k) {
    for (uint32_t j = 1; j < k; j++) /* equal values only swap ids: an insertion sort within each tie run */
        for (uint32_t i = j; i > 0 && logprob[i] == logprob[i - 1] && ids[i] < ids[i - 1]; i--) {
            const int32_t t = ids[i];
            ids[i] = ids[i - 1], ids[i - 1] = t;
        }
}

osp_status osp_kl_base_save(const char *path, const osp_kl_base *b) {
    const size_t bytes = osp_kl_base_file_bytes(b->n_chunks, b->n_scored, b->k);
    if (!bytes) return osp_set_error(OSP_ERR_INVALID_ARG, "KL base: bad counts");
    FILE *f = fopen(path, "wb");
    if (!f) return osp_set_error(OSP_ERR_IO, "cannot create KL base %s", path);
    uint8_t h[OSP_KLB_HEADER_BYTES] = {0};
    memcpy(h, kMagic, 8);
    wr32(h + 8, b->n_vocab), wr32(h + 12, b->ctx), wr32(h + 16, b->n_chunks), wr32(h + 20, b->n_scored);
    wr32(h + 24, b->k), wr64(h + 32, b->tokens_hash);
    bool ok = fwrite(h, 1, sizeof h, f) == sizeof h;
    const size_t n = (size_t)b->n_chunks * b->n_scored, rb = 8 * (size_t)b->k + 8;
    uint8_t *rec = malloc(rb);
    if (!rec) ok = false;
    for (size_t i = 0; i < n && ok; i++) {
        for (uint32_t j = 0; j < b->k; j++) wr32(rec + 4 * j, (uint32_t)b->ids[i * b->k + j]);
        for (uint32_t j = 0; j < b->k; j++) wrf(rec + 4 * (b->k + j), b->logprob[i * b->k + j]);
        wrf(rec + 8 * b->k, b->logprob_rest[i]);
        wrf(rec + 8 * b->k + 4, b->nll[i]);
        ok = fwrite(rec, 1, rb, f) == rb;
    }
    free(rec);
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        remove(path);
        return osp_set_error(OSP_ERR_IO, "cannot write KL base %s", path);
    }
    return OSP_OK;
}
