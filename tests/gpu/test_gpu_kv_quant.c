/* Quantized KV pages on the GPU (issue 13): the CUDA KV write (osp_cuda_rope_kv_write_q) and the CUDA
 * attention read (osp_cuda_paged_attention_q) of FP8 E4M3 and NVFP4 pages, against the CPU's
 * (src/backend/cpu/kv_quant.c, the reference for the formats).
 *
 * Asserts:
 *  - write: the page bytes and micro-block scales the GPU writes are bit-identical to the CPU's write of
 *    the same fp32 rows (osp_cpu_kv_write_quant), on random rows of mixed magnitudes and on edge rows
 *    (zeros, +-448, +-464, +-480, huge, infinities, NaN of both signs, fp32 subnormals, exact E4M3 and
 *    E2M1 rounding ties, micro-blocks with one outlier, all-tiny and saturating micro-blocks), for
 *    head_dim 32/64/128/256, several KV head counts and per-head / tensor scales; bytes of slots no token
 *    writes (and padding rows, slot -1) stay untouched. The fp32 rows the CPU quantizes are the GPU's
 *    own: the same launch with f32 pages (same kernel, same arithmetic up to the page store), so RoPE and
 *    the q/k norm, whose sin/cos and sums need not match the CPU's to the bit, are covered too; with
 *    n_rot 0 and no norm those rows are also asserted equal to qkv + bias.
 *  - read: attention over quantized pages equals the CPU's attention over the same pages
 *    (osp_cpu_paged_attention_kv) within test_gpu_attention.c's fp32 tolerance (|gpu - cpu| <= 2^-8
 *    |cpu| + 2^-12 vmax, and its mean-error bound; the decoded values are the same on both sides, only
 *    the order of the fp32 sums and the bf16 output rounding differ); and it is bit-identical to the
 *    same kernel over the dequantized copy in f32 pages wherever that launch is not split over the KV
 *    length (max_seq_len <= 256): the tile decode gives exactly the dequantized values. head_dim
 *    32/64/128/256, GQA 1/3/4/8, block sizes 16 and 32 (and 7), decodes at contexts 1..5000, prefill
 *    chunks with partial last blocks, sliding windows, unwritten slots NaN-poisoned (E4M3 NaN codes,
 *    NaN micro-block scales) so a key outside a row's range poisons its output.
 *  - routing: under OSPREY_CUDA_ATTENTION-style forced modes, fp8 at D 64 / 128 under wgmma runs the
 *    tensor-core kernels (v2, and v4 for decode: checked against the CPU within the tensor-core bound,
 *    fold mode's bits = split mode's = v4's), nvfp4 at D 64 / 128 runs v4 in every mode but v0 (the same
 *    checks); the other launches give v0's bits.
 *  - batch invariance: a sequence's rows give the same bits as one prefill, as decodes alone or beside
 *    others, and in prefill chunks beside other sequences (v0's quantized launches never split over the
 *    KV length, attention.cu says why; the tensor-core kernels' chunked reduction follows the row).
 * Skipped (77) without a CUDA device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention_v1.h"
#include "backend/cuda/cuda_ops.h"
#include "core/dtype.h"
#include "gpu_test_mem.h"
#include "gpu_test_rng.h"
#include "osprey/batch.h"

#define MAX_SEQS 32
#define MAX_KV 16

/* ---- random numbers: gpu_test_rng.h (g_rng, rnd64, rnd_int, rnd_unit) ---------------------------- */


static const char *kv_name(uint32_t kvt) { return kvt == OSP_KV_PAGE_FP8 ? "fp8" : "nvfp4"; }

/* fixed scales of a test cache: fp8 one per kv head, nvfp4 the tensor scale (one for K, one for V) */
static void fixed_scales(uint32_t kvt, int n_kv, float *kfix, float *vfix) {
    static const float per_head[] = {1.0f, 0.5f, 2.75f, 0.0625f, 3.0f, 0.125f, 1.5f, 0.2f};
    if (kvt == OSP_KV_PAGE_FP8) {
        for (int h = 0; h < n_kv; h++) kfix[h] = per_head[h % 8], vfix[h] = per_head[(h + 3) % 8];
    } else {
        kfix[0] = 0.0625f; /* kv_cache.h's default tensor scale */
        vfix[0] = 0.37f;
    }
}

/* ---- (a) the write ------------------------------------------------------------------------------ */

/* One fp32 value of "edge" row kind `kind` at column i of a row (see the header). */
static float edge_value(int kind, int64_t i, float s) {
    static const float big[] = {448.0f, -448.0f, 464.0f, -464.0f, 480.0f, -480.0f, 1e30f, -1e30f, 447.9f, 460.0f};
    switch (kind) {
    case 0: return (i & 1) ? -0.0f : 0.0f;
    case 1: return big[i % 10] * s;
    case 2: return (i % 4 == 0) ? INFINITY : (i % 4 == 1) ? -INFINITY : (i % 4 == 2) ? NAN : -NAN;
    case 3: return (i % 16 == 5) ? 1000.0f : 0.01f * rnd_unit(); /* one outlier per micro-block */
    case 4: return (i % 3 == 0) ? 1e-40f * rnd_unit() : 1e-6f * rnd_unit(); /* fp32 subnormals, tiny blocks */
    case 5: { /* the midpoint of two neighbouring E4M3 codes (a tie), times the scale */
        const uint8_t c = (uint8_t)rnd_int(0x7D);
        const float m = 0.5f * (osp_e4m3_to_fp32(c) + osp_e4m3_to_fp32((uint8_t)(c + 1)));
        return (i & 1 ? -m : m) * s;
    }
    case 6: { /* E2M1 ties inside a micro-block whose amax is 6 grid units: 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 */
        static const float ties[] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
        const float v = ties[i % 8] * s;
        return (i / 8) & 1 ? -v : v;
    }
    case 7: return 1e4f * rnd_unit(); /* saturating micro-blocks (nvfp4) and codes (fp8) */
    default: return rnd_unit() * ldexpf(1.0f, rnd_int(24) - 12); /* random, mixed magnitudes */
    }
}

typedef struct {
    int n_head, n_kv, D, n_rot;
    bool bias, norm, neox;
} wcase;

static void write_case(uint32_t kvt, const wcase *wc, int64_t T, uint64_t seed) {
    g_rng = seed;
    const int D = wc->D, n_kv = wc->n_kv;
    const int64_t QD = (int64_t)wc->n_head * D, KD = (int64_t)n_kv * D, row = QD + 2 * KD;
    const int64_t num_slots = T + 9;
    float kfix[MAX_KV], vfix[MAX_KV];
    fixed_scales(kvt, n_kv, kfix, vfix);
    const int nfix = kvt == OSP_KV_PAGE_FP8 ? n_kv : 1;

    /* inputs: token t's row kind is t % 10 (8, 9: random); the K and V columns get edge values scaled
     * by their head's scale (fp8) or by 6 x micro-block scale's worth (nvfp4) */
    float *qkv = xmalloc(sizeof(float) * (size_t)(T * row));
    float *bias = xmalloc(sizeof(float) * (size_t)row);
    float *norm = xmalloc(sizeof(float) * (size_t)D);
    for (int64_t t = 0; t < T; t++) {
        const int kind = (int)(t % 10);
        for (int64_t c = 0; c < row; c++) {
            float s = 1.0f;
            if (c >= QD) {
                const int64_t kc = (c - QD) % KD;
                const bool is_v = c >= QD + KD;
                s = kvt == OSP_KV_PAGE_FP8 ? (is_v ? vfix : kfix)[kc / D] : (is_v ? vfix[0] : kfix[0]) * 4.0f;
            }
            qkv[t * row + c] = c < QD ? rnd_unit() : edge_value(kind, c, s);
        }
    }
    for (int64_t c = 0; c < row; c++) bias[c] = wc->bias ? 0.01f * rnd_unit() : 0.0f;
    for (int d = 0; d < D; d++) norm[d] = 1.0f + 0.1f * rnd_unit();
    /* slots: a random injective map into [0, num_slots), every 7th token a padding row (-1) */
    int32_t *slot = xmalloc(sizeof(int32_t) * (size_t)T), *pos = xmalloc(sizeof(int32_t) * (size_t)T);
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)num_slots);
    for (int64_t i = 0; i < num_slots; i++) perm[i] = (int32_t)i;
    for (int64_t i = num_slots - 1; i > 0; i--) {
        const int64_t j = rnd_int((int)i + 1);
        const int32_t tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    for (int64_t t = 0; t < T; t++) slot[t] = t % 7 == 6 ? -1 : perm[t], pos[t] = rnd_int(4000);
    float *inv_freq = xmalloc(sizeof(float) * (size_t)(wc->n_rot / 2 + 1));
    for (int i = 0; i < wc->n_rot / 2; i++) inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)wc->n_rot);

    /* the page sizes */
    const size_t page_bytes = (size_t)num_slots * (size_t)(kvt == OSP_KV_PAGE_FP8 ? KD : KD / 2);
    const size_t sc_bytes = kvt == OSP_KV_PAGE_NVFP4 ? (size_t)num_slots * (size_t)(KD / 16) : 0;
    const size_t f32_bytes = sizeof(float) * (size_t)(num_slots * KD);

    void *d_qkv = dev_put(qkv, sizeof(float) * (size_t)(T * row)), *d_bias = dev_put(bias, sizeof(float) * (size_t)row);
    void *d_norm = dev_put(norm, sizeof(float) * (size_t)D), *d_slot = dev_put(slot, sizeof(int32_t) * (size_t)T);
    void *d_pos = dev_put(pos, sizeof(int32_t) * (size_t)T);
    void *d_freq = dev_put(inv_freq, sizeof(float) * (size_t)(wc->n_rot / 2 + 1));
    void *d_q = dev_alloc_fill(sizeof(uint16_t) * (size_t)(T * QD), 0);
    void *d_kp = dev_alloc_fill(page_bytes, 0xA5), *d_vp = dev_alloc_fill(page_bytes, 0xA5);
    void *d_ks = dev_alloc_fill(sc_bytes, 0xA5), *d_vs = dev_alloc_fill(sc_bytes, 0xA5);
    void *d_kf32 = dev_alloc_fill(f32_bytes, 0xFF), *d_vf32 = dev_alloc_fill(f32_bytes, 0xFF);
    void *d_kfix = dev_put(kfix, sizeof(float) * (size_t)nfix), *d_vfix = dev_put(vfix, sizeof(float) * (size_t)nfix);
    osp_cuda_kv_quant kq = {d_kfix, d_vfix, kvt == OSP_KV_PAGE_NVFP4 ? d_ks : NULL, kvt == OSP_KV_PAGE_NVFP4 ? d_vs : NULL,
                           false, 0};

    const float *qn = wc->norm ? d_norm : NULL, *kn = wc->norm ? d_norm : NULL;
    osp_status st = osp_cuda_rope_kv_write_q(d_qkv, wc->bias ? d_bias : NULL, qn, kn, d_pos, d_freq, d_slot, d_q, d_kp,
                                             d_vp, kvt, &kq, T, wc->n_head, n_kv, D, wc->n_rot, wc->neox, 1e-6f, NULL);
    if (st != OSP_OK) printf("  write: %s\n", osp_last_error());
    assert_int_equal(st, OSP_OK);
    st = osp_cuda_rope_kv_write_q(d_qkv, wc->bias ? d_bias : NULL, qn, kn, d_pos, d_freq, d_slot, d_q, d_kf32, d_vf32,
                                  OSP_KV_PAGE_F32, NULL, T, wc->n_head, n_kv, D, wc->n_rot, wc->neox, 1e-6f, NULL);
    assert_int_equal(st, OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(NULL), OSP_OK);

    uint8_t *gk = xmalloc(page_bytes), *gv = xmalloc(page_bytes), *gks = xmalloc(sc_bytes), *gvs = xmalloc(sc_bytes);
    float *kf = xmalloc(f32_bytes), *vf = xmalloc(f32_bytes);
    dev_get(gk, d_kp, page_bytes), dev_get(gv, d_vp, page_bytes), dev_get(kf, d_kf32, f32_bytes), dev_get(vf, d_vf32, f32_bytes);
    if (sc_bytes) dev_get(gks, d_ks, sc_bytes), dev_get(gvs, d_vs, sc_bytes);

    /* the CPU's write of the GPU's fp32 rows, into pages that start with the same fill */
    uint8_t *ck = xmalloc(page_bytes), *cv = xmalloc(page_bytes), *cks = xmalloc(sc_bytes), *cvs = xmalloc(sc_bytes);
    memset(ck, 0xA5, page_bytes), memset(cv, 0xA5, page_bytes), memset(cks, 0xA5, sc_bytes), memset(cvs, 0xA5, sc_bytes);
    osp_cpu_kv_pages cp = {.k_type = kvt, .v_type = kvt, .k_fixed = kfix, .v_fixed = vfix};
    int64_t raw_bad = 0;
    for (int64_t t = 0; t < T; t++) {
        if (slot[t] < 0) continue;
        const float *kr = kf + (int64_t)slot[t] * KD, *vr = vf + (int64_t)slot[t] * KD;
        osp_cpu_kv_write_quant(&cp, ck, cv, cks, cvs, kr, vr, slot[t], n_kv, D);
        if (wc->n_rot == 0 && !wc->norm) /* then the rows are qkv + bias, exactly */
            for (int64_t c = 0; c < 2 * KD; c++) {
                const float x = qkv[t * row + QD + c], want = wc->bias ? x + bias[QD + c] : x, got = c < KD ? kr[c] : vr[c - KD];
                raw_bad += memcmp(&want, &got, 4) != 0 && !(isnan(want) && isnan(got));
            }
    }
    int64_t bad = 0;
    const char *what[4] = {"K pages", "V pages", "K scales", "V scales"};
    const uint8_t *g4[4] = {gk, gv, gks, gvs}, *c4[4] = {ck, cv, cks, cvs};
    const size_t n4[4] = {page_bytes, page_bytes, sc_bytes, sc_bytes};
    for (int m = 0; m < 4; m++)
        for (size_t i = 0; i < n4[m]; i++)
            if (g4[m][i] != c4[m][i]) {
                if (bad++ < 6) {
                    const size_t per_slot = m < 2 ? (size_t)(kvt == OSP_KV_PAGE_FP8 ? KD : KD / 2) : (size_t)(KD / 16);
                    const size_t s = i / per_slot;
                    int64_t tok = -1;
                    for (int64_t t = 0; t < T; t++) tok = slot[t] == (int32_t)s ? t : tok;
                    printf("  %s %s D %d: %s byte %zu (slot %zu, token %lld, row kind %lld): gpu %02x cpu %02x\n",
                           kv_name(kvt), "write", D, what[m], i, s, (long long)tok, (long long)(tok >= 0 ? tok % 10 : -1),
                           g4[m][i], c4[m][i]);
                }
            }
    printf("write %-5s heads %2d/%2d D %3d n_rot %3d bias %d norm %d T %3lld: %lld bytes differ (%zu page + %zu scale "
           "bytes per matrix)%s\n",
           kv_name(kvt), wc->n_head, n_kv, D, wc->n_rot, wc->bias, wc->norm, (long long)T, (long long)bad, page_bytes,
           sc_bytes, bad || raw_bad ? "  FAILED" : "");
    assert_int_equal(raw_bad, 0);
    assert_int_equal(bad, 0);

    void *dev[] = {d_qkv, d_bias, d_norm, d_slot, d_pos, d_freq, d_q, d_kp, d_vp, d_ks, d_vs, d_kf32, d_vf32, d_kfix, d_vfix};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) osp_cuda_free(dev[i]);
    void *host[] = {qkv, bias, norm, slot, pos, perm, inv_freq, gk, gv, gks, gvs, kf, vf, ck, cv, cks, cvs};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

static void test_write(void **state) {
    (void)state;
    static const wcase cases[] = {
        {4, 4, 64, 0, false, false, false},  {8, 2, 128, 0, true, false, false}, {9, 3, 64, 0, true, false, false},
        {8, 1, 32, 0, false, false, false},  {4, 2, 256, 0, true, false, false}, {32, 8, 128, 128, false, false, true},
        {9, 3, 64, 64, true, false, false},  {16, 2, 128, 64, false, true, true}, {8, 8, 64, 32, true, true, false},
    };
    const uint32_t kvts[2] = {OSP_KV_PAGE_FP8, OSP_KV_PAGE_NVFP4};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            write_case(kvts[k], &cases[i], i % 2 ? 61 : 200, 100u + i * 7u + (uint64_t)k);
}

/* Launch arguments the write refuses on the host. */
static void test_write_arguments(void **state) {
    (void)state;
    void *d = dev_alloc_fill(1 << 16, 0);
    osp_cuda_kv_quant none = {0};
    /* a quantized type without its scales, nvfp4 with D % 16 != 0, an unknown type */
    assert_int_equal(osp_cuda_rope_kv_write_q(d, NULL, NULL, NULL, d, d, d, d, d, d, OSP_KV_PAGE_FP8, NULL, 1, 1, 1, 64,
                                              0, false, 1e-6f, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_rope_kv_write_q(d, NULL, NULL, NULL, d, d, d, d, d, d, OSP_KV_PAGE_NVFP4, &none, 1, 1, 1,
                                              64, 0, false, 1e-6f, NULL),
                     OSP_ERR_INVALID_ARG);
    osp_cuda_kv_quant kq = {d, d, d, d, false, 0};
    assert_int_equal(osp_cuda_rope_kv_write_q(d, NULL, NULL, NULL, d, d, d, d, d, d, OSP_KV_PAGE_NVFP4, &kq, 1, 1, 1, 40,
                                              0, false, 1e-6f, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_rope_kv_write_q(d, NULL, NULL, NULL, d, d, d, d, d, d, 30u, &kq, 1, 1, 1, 64, 0, false,
                                              1e-6f, NULL),
                     OSP_ERR_INVALID_ARG);
    /* the old entry points keep refusing quantized types (they have no scales to pass) */
    assert_int_equal(osp_cuda_rope_kv_write(d, NULL, NULL, NULL, d, d, d, d, d, d, OSP_KV_PAGE_FP8, 1, 1, 1, 64, 0, false,
                                            1e-6f, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_paged_attention(d, d, d, OSP_KV_PAGE_NVFP4, d, 1, d, d, d, 1, 16, 1, 4, 4, 64, 0.1f, 0, 16,
                                              NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_paged_attention_q(d, d, d, OSP_KV_PAGE_FP8, NULL, d, 1, d, d, d, 1, 16, 1, 4, 4, 64, 0.1f, 0,
                                                16, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_stream_sync(NULL), OSP_OK);
    osp_cuda_free(d);
}

/* ---- (b) the read ------------------------------------------------------------------------------- */

/* A pool of quantized pages on the host and the device, with its dequantized copy (f32 pages). */
typedef struct {
    uint32_t kvt;
    int n_kv, D, bs;
    int32_t num_blocks;
    int64_t KD;
    size_t qbytes, sbytes, fbytes;
    uint8_t *k, *v, *ks, *vs; /* quantized pages and scale pools */
    float *kf, *vf;           /* the dequantized copy (NaN where nothing is written) */
    float kfix[MAX_KV], vfix[MAX_KV];
    float vmax;
    void *d_k, *d_v, *d_ks, *d_vs, *d_kf, *d_vf, *d_kfix, *d_vfix;
} qpool;

static void pool_init(qpool *p, uint32_t kvt, int n_kv, int D, int bs, int32_t num_blocks) {
    memset(p, 0, sizeof *p);
    p->kvt = kvt, p->n_kv = n_kv, p->D = D, p->bs = bs, p->num_blocks = num_blocks;
    p->KD = (int64_t)n_kv * D;
    const int64_t slots = (int64_t)num_blocks * bs;
    p->qbytes = (size_t)(slots * (kvt == OSP_KV_PAGE_FP8 ? p->KD : p->KD / 2));
    p->sbytes = kvt == OSP_KV_PAGE_NVFP4 ? (size_t)(slots * (p->KD / 16)) : 0;
    p->fbytes = sizeof(float) * (size_t)(slots * p->KD);
    p->k = xmalloc(p->qbytes), p->v = xmalloc(p->qbytes), p->ks = xmalloc(p->sbytes), p->vs = xmalloc(p->sbytes);
    p->kf = xmalloc(p->fbytes), p->vf = xmalloc(p->fbytes);
    /* poison: E4M3 NaN codes (fp8), NaN micro-block scales (nvfp4); NaN in the copy */
    memset(p->k, kvt == OSP_KV_PAGE_FP8 ? 0x7F : 0x11, p->qbytes);
    memset(p->v, kvt == OSP_KV_PAGE_FP8 ? 0xFF : 0x11, p->qbytes);
    memset(p->ks, 0x7F, p->sbytes), memset(p->vs, 0xFF, p->sbytes);
    for (int64_t i = 0; i < slots * p->KD; i++) p->kf[i] = p->vf[i] = NAN;
    fixed_scales(kvt, n_kv, p->kfix, p->vfix);
}

/* Writes random K/V rows (keys of a few units, values below 2, an outlier now and then) at `slot`
 * through the CPU's write, and their dequantized values into the copy. */
static void pool_write(qpool *p, int64_t slot) {
    float k[MAX_KV * 256], v[MAX_KV * 256];
    for (int64_t i = 0; i < p->KD; i++) {
        k[i] = 3.0f * rnd_unit() * (rnd_int(64) == 0 ? 20.0f : 1.0f);
        v[i] = 1.5f * rnd_unit() * (rnd_int(64) == 0 ? 8.0f : 1.0f);
    }
    osp_cpu_kv_pages cp = {.k_type = p->kvt, .v_type = p->kvt, .k_fixed = p->kfix, .v_fixed = p->vfix};
    osp_cpu_kv_write_quant(&cp, p->k, p->v, p->ks, p->vs, k, v, (int32_t)slot, p->n_kv, p->D);
    float *kd = p->kf + slot * p->KD, *vd = p->vf + slot * p->KD;
    for (int64_t h = 0; h < p->n_kv; h++)
        for (int64_t d = 0; d < p->D; d++) {
            const int64_t i = h * p->D + d;
            if (p->kvt == OSP_KV_PAGE_FP8) {
                kd[i] = osp_e4m3_to_fp32(p->k[slot * p->KD + i]) * p->kfix[h];
                vd[i] = osp_e4m3_to_fp32(p->v[slot * p->KD + i]) * p->vfix[h];
            }
        }
    if (p->kvt == OSP_KV_PAGE_NVFP4)
        for (int64_t j = 0; j < p->KD / 16; j++) {
            osp_nvfp4_dequantize16(p->k + (slot * p->KD + 16 * j) / 2, p->ks[slot * (p->KD / 16) + j], p->kfix[0], kd + 16 * j);
            osp_nvfp4_dequantize16(p->v + (slot * p->KD + 16 * j) / 2, p->vs[slot * (p->KD / 16) + j], p->vfix[0], vd + 16 * j);
        }
    for (int64_t i = 0; i < p->KD; i++)
        if (fabsf(vd[i]) > p->vmax) p->vmax = fabsf(vd[i]);
}

static void pool_upload(qpool *p) {
    p->d_k = dev_put(p->k, p->qbytes), p->d_v = dev_put(p->v, p->qbytes);
    p->d_ks = dev_put(p->ks, p->sbytes), p->d_vs = dev_put(p->vs, p->sbytes);
    p->d_kf = dev_put(p->kf, p->fbytes), p->d_vf = dev_put(p->vf, p->fbytes);
    const int nfix = p->kvt == OSP_KV_PAGE_FP8 ? p->n_kv : 1;
    p->d_kfix = dev_put(p->kfix, sizeof(float) * (size_t)nfix), p->d_vfix = dev_put(p->vfix, sizeof(float) * (size_t)nfix);
}

static void pool_free(qpool *p) {
    free(p->k), free(p->v), free(p->ks), free(p->vs), free(p->kf), free(p->vf);
    void *dev[] = {p->d_k, p->d_v, p->d_ks, p->d_vs, p->d_kf, p->d_vf, p->d_kfix, p->d_vfix};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) osp_cuda_free(dev[i]);
    memset(p, 0, sizeof *p);
}

/* A batch of queries over a pool: sequence s has block table row s and tokens at positions
 * start[s] .. start[s] + count[s] - 1 (its keys: positions 0 .. its last). */
typedef struct {
    int n_head, num_seqs, window;
    int64_t T;
    int32_t qsl[MAX_SEQS + 1], max_blocks, max_seq_len, max_ctx;
    int32_t *positions, *bt;
    uint16_t *q;
    float *qf;
} qbatch;

static void qbatch_free(qbatch *b) {
    free(b->positions), free(b->bt), free(b->q), free(b->qf);
    memset(b, 0, sizeof *b);
}

/* GPU attention of batch b over pool p: quantized pages (f32 false) or the dequantized copy (true),
 * under force mode `mode`; returns the bf16 output [T, n_head, D] (caller frees). */
static uint16_t *gpu_attention(const qpool *p, const qbatch *b, bool f32, int mode) {
    const int64_t n = b->T * b->n_head * p->D;
    void *d_q = dev_put(b->q, sizeof(uint16_t) * (size_t)n);
    void *d_out = dev_alloc_fill(sizeof(uint16_t) * (size_t)(n + (int64_t)b->n_head * p->D), 0xFF); /* + a guard row */
    void *d_qsl = dev_put(b->qsl, sizeof(int32_t) * (size_t)(b->num_seqs + 1));
    void *d_pos = dev_put(b->positions, sizeof(int32_t) * (size_t)b->T);
    void *d_bt = dev_put(b->bt, sizeof(int32_t) * (size_t)b->num_seqs * (size_t)b->max_blocks);
    const size_t ws_bytes = osp_cuda_attention_workspace_bytes(b->T, b->n_head, p->D, b->max_seq_len);
    void *d_ws = dev_alloc_fill(ws_bytes + 256, 0);
    osp_cuda_kv_quant kq = {p->d_kfix, p->d_vfix, p->d_ks, p->d_vs, false, 0};
    if (p->kvt == OSP_KV_PAGE_FP8) kq.d_k_scale = kq.d_v_scale = NULL;
    osp_cuda_attention_force_mode(mode);
    const float scale = 1.0f / sqrtf((float)p->D);
    const osp_status st =
        f32 ? osp_cuda_paged_attention(d_q, p->d_kf, p->d_vf, OSP_KV_PAGE_F32, d_out, b->num_seqs, d_qsl, d_pos, d_bt,
                                       b->max_blocks, p->bs, b->T, b->n_head, p->n_kv, p->D, scale, b->window,
                                       b->max_seq_len, d_ws, NULL)
            : osp_cuda_paged_attention_q(d_q, p->d_k, p->d_v, p->kvt, &kq, d_out, b->num_seqs, d_qsl, d_pos, d_bt,
                                         b->max_blocks, p->bs, b->T, b->n_head, p->n_kv, p->D, scale, b->window,
                                         b->max_seq_len, d_ws, NULL);
    osp_cuda_attention_force_mode(OSP_CUDA_ATTN_V0);
    if (st != OSP_OK) printf("  attention: %s\n", osp_last_error());
    assert_int_equal(st, OSP_OK);
    uint16_t *out = xmalloc(sizeof(uint16_t) * (size_t)(n + (int64_t)b->n_head * p->D));
    dev_get(out, d_out, sizeof(uint16_t) * (size_t)(n + (int64_t)b->n_head * p->D));
    for (int64_t i = n; i < n + (int64_t)b->n_head * p->D; i++) assert_int_equal(out[i], 0xFFFF); /* guard row */
    void *dev[] = {d_q, d_out, d_qsl, d_pos, d_bt, d_ws};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) osp_cuda_free(dev[i]);
    return out;
}

/* The CPU's attention over the quantized pages (the reference), all items. */
static float *cpu_attention(const qpool *p, const qbatch *b) {
    const int64_t n = b->T * b->n_head * p->D;
    float *ref = xmalloc(sizeof(float) * (size_t)n);
    float *sc = xmalloc(sizeof(float) * (size_t)(b->max_ctx + 1));
    osp_cpu_kv_pages cp = {.k_type = p->kvt, .v_type = p->kvt, .k = p->k, .v = p->v, .k_scale = p->ks, .v_scale = p->vs,
                           .k_fixed = p->kfix, .v_fixed = p->vfix};
    if (p->kvt == OSP_KV_PAGE_FP8) cp.k_scale = cp.v_scale = NULL;
    osp_cpu_paged_attention_kv(b->qf, &cp, ref, b->num_seqs, b->qsl, b->positions, b->bt, b->max_blocks, p->bs,
                               b->n_head, p->n_kv, p->D, 1.0f / sqrtf((float)p->D), b->window, sc, 0, b->T * b->n_head);
    free(sc);
    return ref;
}

/* test_gpu_attention.c's bound: per element 2^-8 |ref| + 2^-12 vmax (tc, the tensor-core kernel, which
 * rounds q and P to f16: 2^-10 vmax, as test_gpu_attention allows v1), and the mean error */
static void check_close(const qpool *p, const qbatch *b, const uint16_t *got, const float *ref, const char *what,
                        bool tc) {
    const int64_t n = b->T * b->n_head * p->D;
    int64_t bad = 0;
    double err_sum = 0.0, ref_sum = 0.0;
    float worst = 0.0f;
    const float abs_tol = ldexpf(p->vmax, tc ? -10 : -12);
    for (int64_t i = 0; i < n; i++) {
        const float r = ref[i], g = osp_bf16_to_fp32(got[i]);
        const float tol = ldexpf(fabsf(r), -8) + abs_tol, err = fabsf(g - r);
        err_sum += fabs((double)g - (double)r), ref_sum += fabs((double)r);
        if (!isfinite(r) || !(err <= tol)) {
            if (bad++ < 6)
                printf("  %s: element %lld (token %lld): gpu %.6g cpu %.6g (tol %.3g)\n", what, (long long)i,
                       (long long)(i / ((int64_t)b->n_head * p->D)), (double)g, (double)r, (double)tol);
        } else if (err / tol > worst) {
            worst = err / tol;
        }
    }
    const double mean_err = n ? err_sum / (double)n : 0.0, mean_ref = n ? ref_sum / (double)n : 0.0;
    const bool mean_bad = !(mean_err <= ldexp(mean_ref, -8) + ldexp((double)p->vmax, -14));
    printf("read  %-5s %-2s %-28s T %5lld seqs %2d heads %2d/%d D %3d bs %2d win %3d max_seq_len %5d: err/tol %.3f, mean "
           "err/|ref| %.2e%s\n",
           kv_name(p->kvt), tc ? "tc" : "v0", what, (long long)b->T, b->num_seqs, b->n_head, p->n_kv, p->D, p->bs, b->window,
           (int)b->max_seq_len, (double)worst, mean_ref > 0 ? mean_err / mean_ref : 0.0,
           bad || mean_bad ? "  FAILED" : "");
    assert_int_equal(bad, 0);
    assert_false(mean_bad);
}

typedef struct {
    int n_head, n_kv, D, bs, window;
    int num_seqs;
    int32_t prefix[MAX_SEQS], nnew[MAX_SEQS];
    int32_t max_seq_len; /* 0: the longest context */
} rcase;

/* Builds pool + batch for case c (each sequence its own shuffled blocks), checks the read against the
 * CPU, against the dequantized copy (bits, when unsplit), and under forced tensor-core modes (bits). */
static void read_case(uint32_t kvt, const rcase *c, uint64_t seed, const char *what) {
    g_rng = seed;
    int32_t blocks = 0, max_nb = 1, max_ctx = 1;
    int64_t T = 0;
    for (int s = 0; s < c->num_seqs; s++) {
        const int32_t len = c->prefix[s] + c->nnew[s], nb = (len + c->bs - 1) / c->bs;
        blocks += nb, T += c->nnew[s];
        max_nb = nb > max_nb ? nb : max_nb;
        if (c->nnew[s] > 0 && len > max_ctx) max_ctx = len;
    }
    qpool p;
    pool_init(&p, kvt, c->n_kv, c->D, c->bs, blocks + 3);
    qbatch b = {0};
    b.n_head = c->n_head, b.num_seqs = c->num_seqs, b.window = c->window, b.T = T, b.max_ctx = max_ctx;
    b.max_blocks = max_nb + 1;
    b.max_seq_len = c->max_seq_len > 0 ? c->max_seq_len : max_ctx;
    b.positions = xmalloc(sizeof(int32_t) * (size_t)T);
    b.bt = xmalloc(sizeof(int32_t) * (size_t)c->num_seqs * (size_t)b.max_blocks);
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)p.num_blocks);
    for (int32_t i = 0; i < p.num_blocks; i++) perm[i] = i;
    for (int32_t i = p.num_blocks - 1; i > 0; i--) {
        const int32_t j = rnd_int(i + 1), tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    int32_t next = 0;
    b.qsl[0] = 0;
    for (int s = 0; s < c->num_seqs; s++) {
        const int32_t len = c->prefix[s] + c->nnew[s], nb = (len + c->bs - 1) / c->bs;
        for (int32_t i = 0; i < b.max_blocks; i++) b.bt[s * b.max_blocks + i] = i < nb ? perm[next + i] : -1;
        next += nb;
        for (int32_t i = 0; i < c->nnew[s]; i++) b.positions[b.qsl[s] + i] = c->prefix[s] + i;
        b.qsl[s + 1] = b.qsl[s] + c->nnew[s];
        for (int32_t pos = 0; pos < len; pos++) pool_write(&p, (int64_t)b.bt[s * b.max_blocks + pos / c->bs] * c->bs + pos % c->bs);
    }
    const int64_t nq = T * c->n_head * c->D;
    b.q = xmalloc(sizeof(uint16_t) * (size_t)nq), b.qf = xmalloc(sizeof(float) * (size_t)nq);
    for (int64_t i = 0; i < nq; i++) b.q[i] = osp_fp32_to_bf16(2.0f * rnd_unit()), b.qf[i] = osp_bf16_to_fp32(b.q[i]);
    pool_upload(&p);

    uint16_t *got = gpu_attention(&p, &b, false, OSP_CUDA_ATTN_V0);
    float *ref = cpu_attention(&p, &b);
    check_close(&p, &b, got, ref, what, false);
    const size_t bytes = sizeof(uint16_t) * (size_t)nq;
    if (b.max_seq_len <= 256) { /* one split for f32 pages too: the same kernel over the same values */
        uint16_t *deq = gpu_attention(&p, &b, true, OSP_CUDA_ATTN_V0);
        if (memcmp(got, deq, bytes)) printf("  %s: differs from the dequantized copy's bits\n", what);
        assert_memory_equal(got, deq, bytes);
        free(deq);
    }
    /* the tensor-core modes: E4M3 pages at D 64 / 128 under wgmma run the tensor-core kernel, NVFP4 pages
     * at D 64 / 128 (groups up to 16) v4 in every mode but v0 (checked against the CPU, and fold mode's
     * bits against split mode's); elsewhere they still run v0 (its bits) */
    const int modes[] = {OSP_CUDA_ATTN_V1, OSP_CUDA_ATTN_V2, OSP_CUDA_ATTN_AUTO, OSP_CUDA_ATTN_SPLIT, OSP_CUDA_ATTN_FOLD};
    uint16_t *split_bits = NULL;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        uint16_t *o = gpu_attention(&p, &b, false, modes[m]);
        if (osp_cuda_attention_uses_wgmma(modes[m], OSP_CUDA_ATTN_MMA_AUTO, kvt, c->D) ||
            (kvt == OSP_KV_PAGE_NVFP4 && osp_cuda_attention_v4_nvfp4(modes[m], c->D, c->n_head / c->n_kv))) {
            char w[96];
            snprintf(w, sizeof w, "%s (tensor cores, mode %d)", what, modes[m]);
            check_close(&p, &b, o, ref, w, true);
            if (modes[m] == OSP_CUDA_ATTN_SPLIT) split_bits = o, o = NULL;
            else if (modes[m] == OSP_CUDA_ATTN_FOLD && split_bits) {
                if (memcmp(o, split_bits, bytes)) printf("  %s: fold mode's bits differ from split mode's\n", what);
                assert_memory_equal(o, split_bits, bytes);
            }
        } else {
            assert_memory_equal(got, o, bytes);
        }
        free(o);
    }
    /* v4 (split mode with the keys on the long side, every launch it serves): split mode's bits */
    if (split_bits && osp_cuda_attention_uses_wgmma(OSP_CUDA_ATTN_AUTO, OSP_CUDA_ATTN_MMA_AUTO, kvt, c->D)) {
        for (int fold = 0; fold < 2; fold++) {
            osp_cuda_attention_dec(OSP_CUDA_ATTN_DEC_ALL);
            uint16_t *o = gpu_attention(&p, &b, false, fold ? OSP_CUDA_ATTN_FOLD : OSP_CUDA_ATTN_AUTO);
            osp_cuda_attention_dec(-1);
            char w[96];
            snprintf(w, sizeof w, "%s (v4%s)", what, fold ? ", fold mode" : "");
            check_close(&p, &b, o, ref, w, true);
            if (memcmp(o, split_bits, bytes)) printf("  %s: v4's bits differ from split mode's\n", w);
            assert_memory_equal(o, split_bits, bytes);
            free(o);
        }
    }
    free(split_bits);
    free(got), free(ref), free(perm);
    qbatch_free(&b);
    pool_free(&p);
}

typedef struct {
    int n_head, n_kv, D;
} hcfg;

/* Mixed batches: decodes at 1, 2, 17, 100, 1000, 3000 keys, prefill chunks from 0 and over a prefix
 * (partial last blocks), a zero-token sequence; GQA 1/4/8 (and 3), head_dim 64 and 128 (and 32, 256),
 * blocks of 16 and 32. */
static void test_read_mixed(void **state) {
    (void)state;
    /* {16, 1, 128} and {12, 1, 64}: groups of 16 and 12 (v4's 16-row tiles) */
    static const hcfg heads[] = {{8, 8, 64}, {16, 4, 64}, {32, 8, 128}, {16, 2, 128}, {8, 1, 128}, {9, 3, 64},
                                 {4, 4, 32}, {8, 2, 256}, {16, 1, 128}, {12, 1, 64}};
    static const int32_t prefix[] = {0, 1, 16, 99, 999, 2999, 0, 100, 37};
    static const int32_t nnew[] = {1, 1, 1, 1, 1, 1, 33, 20, 0};
    static const int bss[] = {16, 32};
    const uint32_t kvts[2] = {OSP_KV_PAGE_FP8, OSP_KV_PAGE_NVFP4};
    int n = 0;
    for (int k = 0; k < 2; k++)
        for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++)
            for (int bi = 0; bi < 2; bi++) {
                rcase c = {0};
                c.n_head = heads[h].n_head, c.n_kv = heads[h].n_kv, c.D = heads[h].D, c.bs = bss[bi];
                c.num_seqs = (int)(sizeof prefix / sizeof prefix[0]);
                memcpy(c.prefix, prefix, sizeof prefix), memcpy(c.nnew, nnew, sizeof nnew);
                c.window = (h + (size_t)bi) % 5 == 4 ? 300 : 0;
                read_case(kvts[k], &c, 9000u + (uint64_t)n++, "mixed");
            }
}

/* Short contexts (max_seq_len <= 256: the f32 launch is unsplit too, so the quantized read must give the
 * dequantized copy's bits) and a single long decode (5000 keys). */
static void test_read_short_and_long(void **state) {
    (void)state;
    static const hcfg heads[] = {{8, 8, 64}, {32, 8, 128}, {16, 4, 128}, {8, 2, 64}};
    const uint32_t kvts[2] = {OSP_KV_PAGE_FP8, OSP_KV_PAGE_NVFP4};
    int n = 0;
    for (int k = 0; k < 2; k++)
        for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++) {
            rcase c = {0};
            c.n_head = heads[h].n_head, c.n_kv = heads[h].n_kv, c.D = heads[h].D, c.bs = h % 2 ? 32 : 16;
            c.num_seqs = 5;
            const int32_t pf[] = {0, 15, 31, 200, 60}, nw[] = {47, 1, 2, 1, 17};
            memcpy(c.prefix, pf, sizeof pf), memcpy(c.nnew, nw, sizeof nw);
            c.max_seq_len = 256;
            read_case(kvts[k], &c, 9500u + (uint64_t)n++, "short (vs dequantized copy)");
            rcase l = {0};
            l.n_head = heads[h].n_head, l.n_kv = heads[h].n_kv, l.D = heads[h].D, l.bs = c.bs;
            l.num_seqs = 1, l.prefix[0] = 4999, l.nnew[0] = 1, l.max_seq_len = 8192;
            read_case(kvts[k], &l, 9600u + (uint64_t)n++, "decode at 5000");
        }
}

/* Batch invariance: sequence X (700 tokens) of one pool; X's rows from one prefill are the reference;
 * the same rows as decodes alone, decodes beside other sequences' decodes, and prefill chunks beside
 * another prefill (other sequences read X's pages through X's table, with their own queries). */
static void test_read_invariance(void **state) {
    (void)state;
    const uint32_t kvts[2] = {OSP_KV_PAGE_FP8, OSP_KV_PAGE_NVFP4};
    static const hcfg heads[] = {{32, 8, 128}, {9, 3, 64}};
    for (int k = 0; k < 2; k++)
        for (size_t h = 0; h < 2; h++) {
            const int32_t N = 700, bs = 16;
            g_rng = 777u + (uint64_t)k * 10u + h;
            qpool p;
            pool_init(&p, kvts[k], heads[h].n_kv, heads[h].D, bs, N / bs + 4);
            int32_t table[64];
            for (int32_t i = 0; i < 64; i++) table[i] = i < N / bs + 1 ? (i * 7 + 3) % (N / bs + 4) : -1;
            for (int32_t pos = 0; pos < N; pos++) pool_write(&p, (int64_t)table[pos / bs] * bs + pos % bs);
            pool_upload(&p);
            const int64_t hd = (int64_t)heads[h].n_head * heads[h].D;
            uint16_t *xq = xmalloc(sizeof(uint16_t) * (size_t)(N * hd));
            for (int64_t i = 0; i < N * hd; i++) xq[i] = osp_fp32_to_bf16(2.0f * rnd_unit());
            /* layouts: (start, count) per sequence, sequence 0 is X */
            typedef struct { int n; int32_t start[4], count[4]; } layout;
            static const layout lays[] = {{1, {0}, {700}},           {1, {699}, {1}},
                                          {4, {699, 10, 500, 0}, {1, 1, 1, 1}}, {3, {300, 0, 650}, {400, 64, 1}},
                                          {2, {640, 100}, {60, 200}}};
            uint16_t *ref = NULL;
            for (size_t li = 0; li < sizeof lays / sizeof lays[0]; li++) {
                qbatch b = {0};
                b.n_head = heads[h].n_head, b.num_seqs = lays[li].n, b.max_blocks = 64, b.max_seq_len = 4096;
                for (int s = 0; s < b.num_seqs; s++) b.T += lays[li].count[s];
                b.positions = xmalloc(sizeof(int32_t) * (size_t)b.T);
                b.bt = xmalloc(sizeof(int32_t) * 64u * (size_t)b.num_seqs);
                b.q = xmalloc(sizeof(uint16_t) * (size_t)(b.T * hd)), b.qf = xmalloc(sizeof(float) * (size_t)(b.T * hd));
                int64_t t = 0;
                b.max_ctx = N;
                for (int s = 0; s < b.num_seqs; s++) {
                    memcpy(b.bt + s * 64, table, sizeof table);
                    for (int32_t j = 0; j < lays[li].count[s]; j++, t++) {
                        b.positions[t] = lays[li].start[s] + j;
                        for (int64_t e = 0; e < hd; e++)
                            b.q[t * hd + e] = s == 0 ? xq[(int64_t)(lays[li].start[s] + j) * hd + e]
                                                     : osp_fp32_to_bf16(2.0f * rnd_unit());
                    }
                    b.qsl[s + 1] = (int32_t)t;
                }
                for (int64_t i = 0; i < b.T * hd; i++) b.qf[i] = osp_bf16_to_fp32(b.q[i]);
                uint16_t *got = gpu_attention(&p, &b, false, OSP_CUDA_ATTN_AUTO);
                if (li == 0) {
                    float *cref = cpu_attention(&p, &b);
                    check_close(&p, &b, got, cref, "invariance reference",
                                osp_cuda_attention_uses_wgmma(OSP_CUDA_ATTN_AUTO, OSP_CUDA_ATTN_MMA_AUTO, kvts[k], heads[h].D) ||
                                    (kvts[k] == OSP_KV_PAGE_NVFP4 &&
                                     osp_cuda_attention_v4_nvfp4(OSP_CUDA_ATTN_AUTO, heads[h].D, heads[h].n_head / heads[h].n_kv)));
                    free(cref);
                    ref = got;
                } else {
                    const int32_t x0 = lays[li].start[0], nx = lays[li].count[0];
                    const int diff = memcmp(got, ref + (int64_t)x0 * hd, sizeof(uint16_t) * (size_t)(nx * hd));
                    if (diff) printf("  invariance %s D %d layout %zu: X's rows differ from the one-prefill bits\n",
                                     kv_name(kvts[k]), heads[h].D, li);
                    assert_int_equal(diff, 0);
                    free(got);
                }
                qbatch_free(&b);
            }
            printf("invariance %-5s heads %2d/%d D %3d: X's rows bit-identical in %zu batchings\n", kv_name(kvts[k]),
                   heads[h].n_head, heads[h].n_kv, heads[h].D, sizeof lays / sizeof lays[0] - 1);
            free(ref), free(xq);
            pool_free(&p);
        }
}

/* ---- (c) int8_hier (QuantSpec's hierarchical INT8, issue 14) --------------------------------------- */

/* Bytes of one (slot, KV head) row of int8_hier pages: D / 2 upper-code bytes, then f16 S and M. */
static size_t h_rb(int D) { return (size_t)D / 2 + 4; }

/* One value of int8_hier write row kind `kind` (the header's list), column d of KV head h's row of token t;
 * base and step are the row's own (drawn once a row). */
static float h_value(int kind, int64_t t, int d, int h, float base, float step) {
    switch (kind) {
    case 0: return base;                                                   /* a constant row */
    case 1: return d % 7 == 3 ? 1e-3f * rnd_unit() : 1e4f * rnd_unit();    /* a large range */
    case 2: return -(0.5f + fabsf(rnd_unit())) * step;                     /* negative only */
    case 3: return 0.0f;                                                   /* all +0 */
    case 4: { /* non-negative with zeros of one sign a row (+0 on even tokens, -0 on odd ones) */
        const float u = rnd_unit();
        return u > 0.0f ? u * step : (t & 1) ? -0.0f : 0.0f;
    }
    case 5: return (d % 3 == 0 ? 1e-40f : 1e-6f) * rnd_unit();             /* fp32 subnormals, tiny ranges */
    case 6: return d % 5 == 0 ? 1e5f * rnd_unit() : rnd_unit();             /* beyond f16's range */
    case 7: return base + 0.125f * (float)rnd_int(31) * step;              /* on and between the grid */
    case 8: { /* specials: an infinity or a NaN here and there */
        static const float sp[] = {INFINITY, -INFINITY, NAN, 3.0f};
        return (d + h) % 9 == 4 ? sp[(t + d) % 4] : rnd_unit() * step;
    }
    default: return rnd_unit() * ldexpf(1.0f, rnd_int(24) - 12);           /* random, mixed magnitudes */
    }
}

/* The write: the GPU's int8_hier pages and lower-code pools against the CPU's write of the GPU's own fp32
 * rows (the same launch with f32 pages), byte for byte. */
static void h_write_case(const wcase *wc, int64_t T, uint64_t seed) {
    g_rng = seed;
    const int D = wc->D, n_kv = wc->n_kv;
    const int64_t QD = (int64_t)wc->n_head * D, KD = (int64_t)n_kv * D, row = QD + 2 * KD;
    const int64_t num_slots = T + 9;
    float *qkv = xmalloc(sizeof(float) * (size_t)(T * row));
    float *bias = xmalloc(sizeof(float) * (size_t)row);
    float *norm = xmalloc(sizeof(float) * (size_t)D);
    for (int64_t t = 0; t < T; t++) {
        const int kind = (int)(t % 12);
        for (int64_t c = 0; c < QD; c++) qkv[t * row + c] = rnd_unit();
        for (int64_t r = 0; r < 2 * n_kv; r++) { /* K heads then V heads: one row each */
            const float base = rnd_unit() * ldexpf(1.0f, rnd_int(12) - 6), step = ldexpf(1.0f, rnd_int(8) - 3);
            for (int d = 0; d < D; d++) qkv[t * row + QD + r * D + d] = h_value(kind, t, d, (int)r, base, step);
        }
    }
    for (int64_t c = 0; c < row; c++) bias[c] = wc->bias ? 0.01f * rnd_unit() : 0.0f;
    for (int d = 0; d < D; d++) norm[d] = 1.0f + 0.1f * rnd_unit();
    int32_t *slot = xmalloc(sizeof(int32_t) * (size_t)T), *pos = xmalloc(sizeof(int32_t) * (size_t)T);
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)num_slots);
    for (int64_t i = 0; i < num_slots; i++) perm[i] = (int32_t)i;
    for (int64_t i = num_slots - 1; i > 0; i--) {
        const int64_t j = rnd_int((int)i + 1);
        const int32_t tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    for (int64_t t = 0; t < T; t++) slot[t] = t % 7 == 6 ? -1 : perm[t], pos[t] = rnd_int(4000);
    float *inv_freq = xmalloc(sizeof(float) * (size_t)(wc->n_rot / 2 + 1));
    for (int i = 0; i < wc->n_rot / 2; i++) inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)wc->n_rot);

    const size_t page_bytes = (size_t)num_slots * (size_t)n_kv * h_rb(D), lo_bytes = (size_t)num_slots * (size_t)(KD / 2);
    const size_t f32_bytes = sizeof(float) * (size_t)(num_slots * KD);
    void *d_qkv = dev_put(qkv, sizeof(float) * (size_t)(T * row)), *d_bias = dev_put(bias, sizeof(float) * (size_t)row);
    void *d_norm = dev_put(norm, sizeof(float) * (size_t)D), *d_slot = dev_put(slot, sizeof(int32_t) * (size_t)T);
    void *d_pos = dev_put(pos, sizeof(int32_t) * (size_t)T);
    void *d_freq = dev_put(inv_freq, sizeof(float) * (size_t)(wc->n_rot / 2 + 1));
    void *d_q = dev_alloc_fill(sizeof(uint16_t) * (size_t)(T * QD), 0);
    void *d_kp = dev_alloc_fill(page_bytes, 0xA5), *d_vp = dev_alloc_fill(page_bytes, 0xA5);
    void *d_kl = dev_alloc_fill(lo_bytes, 0x5A), *d_vl = dev_alloc_fill(lo_bytes, 0x5A);
    void *d_kf32 = dev_alloc_fill(f32_bytes, 0xFF), *d_vf32 = dev_alloc_fill(f32_bytes, 0xFF);
    /* the hier view fields are read by attention only: set them to show the write ignores them */
    osp_cuda_kv_quant kq = {NULL, NULL, d_kl, d_vl, true, 3};
    const float *qn = wc->norm ? d_norm : NULL, *kn = wc->norm ? d_norm : NULL;
    osp_status st = osp_cuda_rope_kv_write_q(d_qkv, wc->bias ? d_bias : NULL, qn, kn, d_pos, d_freq, d_slot, d_q, d_kp,
                                             d_vp, OSP_KV_PAGE_INT8H, &kq, T, wc->n_head, n_kv, D, wc->n_rot, wc->neox,
                                             1e-6f, NULL);
    if (st != OSP_OK) printf("  write: %s\n", osp_last_error());
    assert_int_equal(st, OSP_OK);
    st = osp_cuda_rope_kv_write_q(d_qkv, wc->bias ? d_bias : NULL, qn, kn, d_pos, d_freq, d_slot, d_q, d_kf32, d_vf32,
                                  OSP_KV_PAGE_F32, NULL, T, wc->n_head, n_kv, D, wc->n_rot, wc->neox, 1e-6f, NULL);
    assert_int_equal(st, OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(NULL), OSP_OK);

    uint8_t *gk = xmalloc(page_bytes), *gv = xmalloc(page_bytes), *gkl = xmalloc(lo_bytes), *gvl = xmalloc(lo_bytes);
    float *kf = xmalloc(f32_bytes), *vf = xmalloc(f32_bytes);
    dev_get(gk, d_kp, page_bytes), dev_get(gv, d_vp, page_bytes), dev_get(gkl, d_kl, lo_bytes), dev_get(gvl, d_vl, lo_bytes);
    dev_get(kf, d_kf32, f32_bytes), dev_get(vf, d_vf32, f32_bytes);

    uint8_t *ck = xmalloc(page_bytes), *cv = xmalloc(page_bytes), *ckl = xmalloc(lo_bytes), *cvl = xmalloc(lo_bytes);
    memset(ck, 0xA5, page_bytes), memset(cv, 0xA5, page_bytes), memset(ckl, 0x5A, lo_bytes), memset(cvl, 0x5A, lo_bytes);
    osp_cpu_kv_pages cp = {.k_type = OSP_KV_DTYPE_INT8_HIER, .v_type = OSP_KV_DTYPE_INT8_HIER};
    int64_t raw_bad = 0;
    for (int64_t t = 0; t < T; t++) {
        if (slot[t] < 0) continue;
        const float *kr = kf + (int64_t)slot[t] * KD, *vr = vf + (int64_t)slot[t] * KD;
        osp_cpu_kv_write_quant(&cp, ck, cv, ckl, cvl, kr, vr, slot[t], n_kv, D);
        if (wc->n_rot == 0 && !wc->norm) /* then the rows are qkv + bias, exactly */
            for (int64_t c = 0; c < 2 * KD; c++) {
                const float x = qkv[t * row + QD + c], want = wc->bias ? x + bias[QD + c] : x, got = c < KD ? kr[c] : vr[c - KD];
                raw_bad += memcmp(&want, &got, 4) != 0 && !(isnan(want) && isnan(got));
            }
    }
    int64_t bad = 0;
    const char *what[4] = {"K pages", "V pages", "K lower codes", "V lower codes"};
    const uint8_t *g4[4] = {gk, gv, gkl, gvl}, *c4[4] = {ck, cv, ckl, cvl};
    const size_t n4[4] = {page_bytes, page_bytes, lo_bytes, lo_bytes};
    for (int m = 0; m < 4; m++)
        for (size_t i = 0; i < n4[m]; i++)
            if (g4[m][i] != c4[m][i]) {
                if (bad++ < 6) {
                    const size_t per_slot = m < 2 ? (size_t)n_kv * h_rb(D) : (size_t)(KD / 2);
                    const size_t s = i / per_slot, in_row = m < 2 ? (i % per_slot) % h_rb(D) : 0;
                    int64_t tok = -1;
                    for (int64_t t = 0; t < T; t++) tok = slot[t] == (int32_t)s ? t : tok;
                    printf("  int8_hier write D %d: %s byte %zu (slot %zu, token %lld, row kind %lld%s): gpu %02x cpu %02x\n",
                           D, what[m], i, s, (long long)tok, (long long)(tok >= 0 ? tok % 12 : -1),
                           m < 2 && in_row >= (size_t)D / 2 ? ", S/M" : "", g4[m][i], c4[m][i]);
                }
            }
    printf("write int8_hier heads %2d/%2d D %4d n_rot %3d bias %d norm %d T %3lld: %lld bytes differ (%zu page + %zu "
           "lower-code bytes per matrix)%s\n",
           wc->n_head, n_kv, D, wc->n_rot, wc->bias, wc->norm, (long long)T, (long long)bad, page_bytes, lo_bytes,
           bad || raw_bad ? "  FAILED" : "");
    assert_int_equal(raw_bad, 0);
    assert_int_equal(bad, 0);

    void *dev[] = {d_qkv, d_bias, d_norm, d_slot, d_pos, d_freq, d_q, d_kp, d_vp, d_kl, d_vl, d_kf32, d_vf32};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) osp_cuda_free(dev[i]);
    void *host[] = {qkv, bias, norm, slot, pos, perm, inv_freq, gk, gv, gkl, gvl, kf, vf, ck, cv, ckl, cvl};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

static void test_int8h_write(void **state) {
    (void)state;
    static const wcase cases[] = {
        {4, 4, 64, 0, false, false, false},   {8, 2, 128, 0, true, false, false},  {8, 1, 32, 0, false, false, false},
        {4, 2, 256, 0, true, false, false},   {32, 8, 128, 128, false, false, true}, {9, 3, 64, 64, true, false, false},
        {16, 2, 128, 64, false, true, true},  {8, 8, 64, 32, true, true, false},   {2, 1, 6, 0, false, false, false},
        {4, 1, 1024, 0, false, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        h_write_case(&cases[i], i % 2 ? 61 : 200, 300u + i * 7u);
}

/* Launch arguments the int8_hier write and read refuse on the host. */
static void test_int8h_arguments(void **state) {
    (void)state;
    void *d = dev_alloc_fill(1 << 16, 0);
    osp_cuda_kv_quant none = {0}, kq = {NULL, NULL, d, d, false, 0};
    /* the write: no pools, an odd head_dim */
    assert_int_equal(osp_cuda_rope_kv_write_q(d, NULL, NULL, NULL, d, d, d, d, d, d, OSP_KV_PAGE_INT8H, NULL, 1, 1, 1, 64,
                                              0, false, 1e-6f, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_rope_kv_write_q(d, NULL, NULL, NULL, d, d, d, d, d, d, OSP_KV_PAGE_INT8H, &none, 1, 1, 1,
                                              64, 0, false, 1e-6f, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_rope_kv_write_q(d, NULL, NULL, NULL, d, d, d, d, d, d, OSP_KV_PAGE_INT8H, &kq, 1, 1, 1, 63,
                                              0, false, 1e-6f, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_rope_kv_write(d, NULL, NULL, NULL, d, d, d, d, d, d, OSP_KV_PAGE_INT8H, 1, 1, 1, 64, 0,
                                            false, 1e-6f, NULL),
                     OSP_ERR_INVALID_ARG);
    /* the read: no pools, misaligned pools, a negative recent window in the draft's view, the plain entry */
    assert_int_equal(osp_cuda_paged_attention_q(d, d, d, OSP_KV_PAGE_INT8H, NULL, d, 1, d, d, d, 1, 16, 1, 4, 4, 64, 0.1f,
                                                0, 16, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_paged_attention_q(d, d, d, OSP_KV_PAGE_INT8H, &none, d, 1, d, d, d, 1, 16, 1, 4, 4, 64,
                                                0.1f, 0, 16, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    osp_cuda_kv_quant mis = {NULL, NULL, (uint8_t *)d + 8, d, false, 0}, neg = {NULL, NULL, d, d, true, -1};
    assert_int_equal(osp_cuda_paged_attention_q(d, d, d, OSP_KV_PAGE_INT8H, &mis, d, 1, d, d, d, 1, 16, 1, 4, 4, 64, 0.1f,
                                                0, 16, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_paged_attention_q(d, d, d, OSP_KV_PAGE_INT8H, &neg, d, 1, d, d, d, 1, 16, 1, 4, 4, 64, 0.1f,
                                                0, 16, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_paged_attention(d, d, d, OSP_KV_PAGE_INT8H, d, 1, d, d, d, 1, 16, 1, 4, 4, 64, 0.1f, 0, 16,
                                              NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_stream_sync(NULL), OSP_OK);
    osp_cuda_free(d);
}

/* A pool of int8_hier pages (the CPU's write) on the host and the device. Unwritten slots are poisoned:
 * every byte 0x7E, so S = M = 0x7E7E, an f16 NaN, and every value decoded from them NaN. */
typedef struct {
    int n_kv, D, bs;
    int32_t num_blocks;
    int64_t slots, KD;
    size_t pbytes, lbytes;
    uint8_t *k, *v, *kl, *vl; /* pages [slots, n_kv, D / 2 + 4], lower codes [slots, n_kv, D / 2] */
    bool *written;            /* [slots] */
    float vmax;
    void *d_k, *d_v, *d_kl, *d_vl;
} hpool;

static void hpool_init(hpool *p, int n_kv, int D, int bs, int32_t num_blocks) {
    memset(p, 0, sizeof *p);
    p->n_kv = n_kv, p->D = D, p->bs = bs, p->num_blocks = num_blocks;
    p->slots = (int64_t)num_blocks * bs, p->KD = (int64_t)n_kv * D;
    p->pbytes = (size_t)p->slots * (size_t)n_kv * h_rb(D), p->lbytes = (size_t)(p->slots * (p->KD / 2));
    p->k = xmalloc(p->pbytes), p->v = xmalloc(p->pbytes), p->kl = xmalloc(p->lbytes), p->vl = xmalloc(p->lbytes);
    memset(p->k, 0x7E, p->pbytes), memset(p->v, 0x7E, p->pbytes), memset(p->kl, 0x7E, p->lbytes), memset(p->vl, 0x7E, p->lbytes);
    p->written = calloc((size_t)p->slots, sizeof(bool));
    assert_non_null(p->written);
}

/* Row (slot, kvh) of K (which 0) or V (1) as osp_int8h_dequantize_row reads it: both halves (full) or the
 * upper ones alone. */
static void hpool_row(const hpool *p, int which, int64_t slot, int kvh, bool full, float *out) {
    const uint8_t *up = (which ? p->v : p->k) + ((size_t)slot * (size_t)p->n_kv + (size_t)kvh) * h_rb(p->D);
    const uint8_t *lo = (which ? p->vl : p->kl) + ((size_t)slot * (size_t)p->n_kv + (size_t)kvh) * (size_t)(p->D / 2);
    uint16_t sm[2];
    memcpy(sm, up + p->D / 2, sizeof sm);
    osp_int8h_dequantize_row(up, full ? lo : NULL, sm, out, p->D);
}

/* Random K/V rows (keys of a few units with an outlier now and then, values below 2; every 13th row a
 * constant one) written at `slot` by the CPU's write. */
static void hpool_write(hpool *p, int64_t slot) {
    float k[MAX_KV * 256], v[MAX_KV * 256], y[256];
    const bool constant = rnd_int(13) == 0;
    for (int64_t i = 0; i < p->KD; i++) {
        k[i] = constant ? 0.75f : 3.0f * rnd_unit() * (rnd_int(64) == 0 ? 20.0f : 1.0f);
        v[i] = constant ? -0.5f : 1.5f * rnd_unit() * (rnd_int(64) == 0 ? 8.0f : 1.0f);
    }
    osp_cpu_kv_pages cp = {.k_type = OSP_KV_DTYPE_INT8_HIER, .v_type = OSP_KV_DTYPE_INT8_HIER};
    osp_cpu_kv_write_quant(&cp, p->k, p->v, p->kl, p->vl, k, v, (int32_t)slot, p->n_kv, p->D);
    p->written[slot] = true;
    for (int h = 0; h < p->n_kv; h++)
        for (int full = 0; full < 2; full++) {
            hpool_row(p, 1, slot, h, full, y);
            for (int d = 0; d < p->D; d++)
                if (fabsf(y[d]) > p->vmax) p->vmax = fabsf(y[d]);
        }
}

static void hpool_upload(hpool *p) {
    p->d_k = dev_put(p->k, p->pbytes), p->d_v = dev_put(p->v, p->pbytes);
    p->d_kl = dev_put(p->kl, p->lbytes), p->d_vl = dev_put(p->vl, p->lbytes);
}

static void hpool_free(hpool *p) {
    free(p->k), free(p->v), free(p->kl), free(p->vl), free(p->written);
    void *dev[] = {p->d_k, p->d_v, p->d_kl, p->d_vl};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) osp_cuda_free(dev[i]);
    memset(p, 0, sizeof *p);
}

/* A read view: the target's (upper false: both halves everywhere) or the draft's (upper true: the upper
 * halves except keys at positions >= seq_len - recent of each sequence). */
typedef struct {
    bool upper;
    int32_t recent;
    const char *name;
} hview;

/* The first key position sequence s reads in full under view vw (attention.cu: seq_len - recent, seq_len
 * the sequence's last query token's position + 1; 0 in the full view). */
static int64_t h_full_from(const qbatch *b, int s, const hview *vw) {
    if (!vw->upper || b->qsl[s + 1] == b->qsl[s]) return 0;
    return (int64_t)b->positions[b->qsl[s + 1] - 1] + 1 - vw->recent;
}

/* GPU attention of batch b over pool p's int8_hier pages under view vw, forced mode `mode`, v4 choice `dec`
 * (-1: the default); or, f32 pages given, over those. Returns the bf16 output [T, n_head, D]. */
static uint16_t *h_gpu_attention(const hpool *p, const qbatch *b, const hview *vw, const void *d_kf, const void *d_vf,
                                 int mode, int dec) {
    const int64_t n = b->T * b->n_head * p->D, guard = (int64_t)b->n_head * p->D;
    void *d_q = dev_put(b->q, sizeof(uint16_t) * (size_t)n);
    void *d_out = dev_alloc_fill(sizeof(uint16_t) * (size_t)(n + guard), 0xFF);
    void *d_qsl = dev_put(b->qsl, sizeof(int32_t) * (size_t)(b->num_seqs + 1));
    void *d_pos = dev_put(b->positions, sizeof(int32_t) * (size_t)b->T);
    void *d_bt = dev_put(b->bt, sizeof(int32_t) * (size_t)b->num_seqs * (size_t)b->max_blocks);
    const size_t ws_bytes = osp_cuda_attention_workspace_bytes(b->T, b->n_head, p->D, b->max_seq_len);
    void *d_ws = dev_alloc_fill(ws_bytes + 256, 0);
    osp_cuda_kv_quant kq = {NULL, NULL, p->d_kl, p->d_vl, vw->upper, vw->recent};
    osp_cuda_attention_force_mode(mode);
    osp_cuda_attention_dec(dec);
    const float scale = 1.0f / sqrtf((float)p->D);
    const osp_status st =
        d_kf ? osp_cuda_paged_attention(d_q, d_kf, d_vf, OSP_KV_PAGE_F32, d_out, b->num_seqs, d_qsl, d_pos, d_bt,
                                        b->max_blocks, p->bs, b->T, b->n_head, p->n_kv, p->D, scale, b->window,
                                        b->max_seq_len, d_ws, NULL)
             : osp_cuda_paged_attention_q(d_q, p->d_k, p->d_v, OSP_KV_PAGE_INT8H, &kq, d_out, b->num_seqs, d_qsl, d_pos,
                                          d_bt, b->max_blocks, p->bs, b->T, b->n_head, p->n_kv, p->D, scale, b->window,
                                          b->max_seq_len, d_ws, NULL);
    osp_cuda_attention_force_mode(OSP_CUDA_ATTN_V0);
    osp_cuda_attention_dec(-1);
    if (st != OSP_OK) printf("  attention: %s\n", osp_last_error());
    assert_int_equal(st, OSP_OK);
    uint16_t *out = xmalloc(sizeof(uint16_t) * (size_t)(n + guard));
    dev_get(out, d_out, sizeof(uint16_t) * (size_t)(n + guard));
    for (int64_t i = n; i < n + guard; i++) assert_int_equal(out[i], 0xFFFF); /* guard row */
    void *dev[] = {d_q, d_out, d_qsl, d_pos, d_bt, d_ws};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) osp_cuda_free(dev[i]);
    return out;
}

/* The host reference under view vw: each key's K and V rows from osp_int8h_dequantize_row (full or upper
 * per h_full_from), softmax and the weighted sum in double. */
static float *h_ref_attention(const hpool *p, const qbatch *b, const hview *vw) {
    const int D = p->D, group = b->n_head / p->n_kv;
    const int64_t n = b->T * b->n_head * D;
    float *ref = xmalloc(sizeof(float) * (size_t)n);
    double *sc = xmalloc(sizeof(double) * (size_t)(b->max_ctx + 1)), *acc = xmalloc(sizeof(double) * (size_t)D);
    float *kr = xmalloc(sizeof(float) * (size_t)D), *vr = xmalloc(sizeof(float) * (size_t)D);
    const double scale = 1.0 / sqrt((double)D);
    for (int s = 0; s < b->num_seqs; s++) {
        const int64_t full_from = h_full_from(b, s, vw);
        for (int32_t t = b->qsl[s]; t < b->qsl[s + 1]; t++) {
            const int32_t lim = b->positions[t] + 1, first = b->window > 0 && lim > b->window ? lim - b->window : 0;
            for (int h = 0; h < b->n_head; h++) {
                const int kvh = h / group;
                const float *q = b->qf + ((int64_t)t * b->n_head + h) * D;
                double mx = -INFINITY, sum = 0.0;
                for (int32_t key = first; key < lim; key++) {
                    const int64_t slot = (int64_t)b->bt[s * b->max_blocks + key / p->bs] * p->bs + key % p->bs;
                    hpool_row(p, 0, slot, kvh, key >= full_from, kr);
                    double dot = 0.0;
                    for (int d = 0; d < D; d++) dot += (double)q[d] * (double)kr[d];
                    sc[key] = dot * scale;
                    if (sc[key] > mx) mx = sc[key];
                }
                for (int d = 0; d < D; d++) acc[d] = 0.0;
                for (int32_t key = first; key < lim; key++) {
                    const int64_t slot = (int64_t)b->bt[s * b->max_blocks + key / p->bs] * p->bs + key % p->bs;
                    hpool_row(p, 1, slot, kvh, key >= full_from, vr);
                    const double w = exp(sc[key] - mx);
                    sum += w;
                    for (int d = 0; d < D; d++) acc[d] += w * (double)vr[d];
                }
                float *o = ref + ((int64_t)t * b->n_head + h) * D;
                for (int d = 0; d < D; d++) o[d] = (float)(acc[d] / sum);
            }
        }
    }
    free(sc), free(acc), free(kr), free(vr);
    return ref;
}

/* Elements of got outside test_gpu_attention.c's v0 bound around ref (2^-8 |ref| + 2^-12 vmax, and the
 * mean error); prints the first few when verbose. Returns the count (mean-error failure counts as one). */
static int64_t h_count_far(const hpool *p, const qbatch *b, const uint16_t *got, const float *ref, const char *what,
                           bool verbose) {
    const int64_t n = b->T * b->n_head * p->D;
    int64_t bad = 0;
    double err_sum = 0.0, ref_sum = 0.0;
    float worst = 0.0f;
    const float abs_tol = ldexpf(p->vmax, -12);
    for (int64_t i = 0; i < n; i++) {
        const float r = ref[i], g = osp_bf16_to_fp32(got[i]);
        const float tol = ldexpf(fabsf(r), -8) + abs_tol, err = fabsf(g - r);
        err_sum += fabs((double)g - (double)r), ref_sum += fabs((double)r);
        if (!isfinite(r) || !(err <= tol)) {
            if (verbose && bad < 6)
                printf("  %s: element %lld (token %lld): gpu %.6g ref %.6g (tol %.3g)\n", what, (long long)i,
                       (long long)(i / ((int64_t)b->n_head * p->D)), (double)g, (double)r, (double)tol);
            bad++;
        } else if (err / tol > worst) {
            worst = err / tol;
        }
    }
    const double mean_err = n ? err_sum / (double)n : 0.0, mean_ref = n ? ref_sum / (double)n : 0.0;
    const bool mean_bad = !(mean_err <= ldexp(mean_ref, -8) + ldexp((double)p->vmax, -14));
    if (verbose)
        printf("read  int8_hier %-58s T %5lld seqs %2d heads %2d/%d D %3d bs %2d win %3d: err/tol %.3f, mean "
               "err/|ref| %.2e%s\n",
               what, (long long)b->T, b->num_seqs, b->n_head, p->n_kv, p->D, p->bs, b->window, (double)worst,
               mean_ref > 0 ? mean_err / mean_ref : 0.0, bad || mean_bad ? "  FAILED" : "");
    return bad + (mean_bad ? 1 : 0);
}

/* The view's dequantized copy in f32 pages (NaN where nothing is written), on the device. */
static void h_f32_copy(const hpool *p, const qbatch *b, const hview *vw, void **d_kf, void **d_vf) {
    const size_t bytes = sizeof(float) * (size_t)(p->slots * p->KD);
    float *kf = xmalloc(bytes), *vf = xmalloc(bytes);
    for (int64_t i = 0; i < p->slots * p->KD; i++) kf[i] = vf[i] = NAN;
    for (int s = 0; s < b->num_seqs; s++) {
        if (b->qsl[s + 1] == b->qsl[s]) continue;
        const int64_t full_from = h_full_from(b, s, vw);
        for (int32_t key = 0; key <= b->positions[b->qsl[s + 1] - 1]; key++) {
            const int64_t slot = (int64_t)b->bt[s * b->max_blocks + key / p->bs] * p->bs + key % p->bs;
            for (int h = 0; h < p->n_kv; h++) {
                hpool_row(p, 0, slot, h, key >= full_from, kf + slot * p->KD + (int64_t)h * p->D);
                hpool_row(p, 1, slot, h, key >= full_from, vf + slot * p->KD + (int64_t)h * p->D);
            }
        }
    }
    *d_kf = dev_put(kf, bytes), *d_vf = dev_put(vf, bytes);
    free(kf), free(vf);
}

/* Builds pool + batch for case c (each sequence its own shuffled blocks; zero-token sequences allowed) and
 * checks every view: against the double reference; the bits of the dequantized copy of the view under v0
 * when unsplit (max_seq_len <= 256); the same bits under every forced mode and v4 choice (int8_hier always
 * runs v0); against the CPU's attention (osp_cpu_paged_attention_kv with the view) where the CPU's
 * per-query window is the sequence's (the full view, or one query token a sequence); a view of a recent
 * window longer than any sequence gives the full view's bits; the draft's views differ from the full one
 * (bits, and beyond the tolerance of the full view's reference: the check is not vacuous); and decode rows
 * run alone give their bits in the batch. */
static void h_read_case(const rcase *c, uint64_t seed, const char *what) {
    g_rng = seed;
    int32_t blocks = 0, max_nb = 1, max_ctx = 1;
    int64_t T = 0;
    bool decode_only = true;
    for (int s = 0; s < c->num_seqs; s++) {
        const int32_t len = c->prefix[s] + c->nnew[s], nb = (len + c->bs - 1) / c->bs;
        blocks += nb, T += c->nnew[s];
        max_nb = nb > max_nb ? nb : max_nb;
        if (c->nnew[s] > 0 && len > max_ctx) max_ctx = len;
        if (c->nnew[s] > 1) decode_only = false;
    }
    hpool p;
    hpool_init(&p, c->n_kv, c->D, c->bs, blocks + 3);
    qbatch b = {0};
    b.n_head = c->n_head, b.num_seqs = c->num_seqs, b.window = c->window, b.T = T, b.max_ctx = max_ctx;
    b.max_blocks = max_nb + 1;
    b.max_seq_len = c->max_seq_len > 0 ? c->max_seq_len : max_ctx;
    b.positions = xmalloc(sizeof(int32_t) * (size_t)T);
    b.bt = xmalloc(sizeof(int32_t) * (size_t)c->num_seqs * (size_t)b.max_blocks);
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)p.num_blocks);
    for (int32_t i = 0; i < p.num_blocks; i++) perm[i] = i;
    for (int32_t i = p.num_blocks - 1; i > 0; i--) {
        const int32_t j = rnd_int(i + 1), tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    int32_t next = 0;
    b.qsl[0] = 0;
    for (int s = 0; s < c->num_seqs; s++) {
        const int32_t len = c->prefix[s] + c->nnew[s], nb = (len + c->bs - 1) / c->bs;
        for (int32_t i = 0; i < b.max_blocks; i++) b.bt[s * b.max_blocks + i] = i < nb ? perm[next + i] : -1;
        next += nb;
        for (int32_t i = 0; i < c->nnew[s]; i++) b.positions[b.qsl[s] + i] = c->prefix[s] + i;
        b.qsl[s + 1] = b.qsl[s] + c->nnew[s];
        for (int32_t pos = 0; pos < len; pos++) hpool_write(&p, (int64_t)b.bt[s * b.max_blocks + pos / c->bs] * c->bs + pos % c->bs);
    }
    const int64_t nq = T * c->n_head * c->D;
    b.q = xmalloc(sizeof(uint16_t) * (size_t)nq), b.qf = xmalloc(sizeof(float) * (size_t)nq);
    for (int64_t i = 0; i < nq; i++) b.q[i] = osp_fp32_to_bf16(2.0f * rnd_unit()), b.qf[i] = osp_bf16_to_fp32(b.q[i]);
    hpool_upload(&p);
    const size_t bytes = sizeof(uint16_t) * (size_t)nq;

    const hview views[] = {{false, 0, "full"}, {true, 0, "upper, recent 0"}, {true, 3, "upper, recent 3"},
                           {true, 1 << 20, "upper, recent > seq_len"}};
    const int nv = (int)(sizeof views / sizeof views[0]);
    uint16_t *bits[4] = {NULL};
    float *full_ref = NULL;
    for (int v = 0; v < nv; v++) {
        const hview *vw = &views[v];
        char w[160];
        snprintf(w, sizeof w, "%s, %s", what, vw->name);
        uint16_t *got = h_gpu_attention(&p, &b, vw, NULL, NULL, OSP_CUDA_ATTN_V0, -1);
        float *ref = h_ref_attention(&p, &b, vw);
        assert_int_equal(h_count_far(&p, &b, got, ref, w, true), 0);
        if (b.max_seq_len <= 256) { /* one split for f32 pages too: the same kernel over the same values */
            void *d_kf, *d_vf;
            h_f32_copy(&p, &b, vw, &d_kf, &d_vf);
            uint16_t *deq = h_gpu_attention(&p, &b, vw, d_kf, d_vf, OSP_CUDA_ATTN_V0, -1);
            if (memcmp(got, deq, bytes)) printf("  %s: differs from the view's dequantized copy's bits\n", w);
            assert_memory_equal(got, deq, bytes);
            free(deq);
            osp_cuda_free(d_kf), osp_cuda_free(d_vf);
        }
        /* routing: whatever mode is forced, the CUDA-core kernel's bits (fold and split forced: its two
         * modes, where the launch has two chunks or more) */
        const int modes[] = {OSP_CUDA_ATTN_AUTO, OSP_CUDA_ATTN_V1, OSP_CUDA_ATTN_V2, OSP_CUDA_ATTN_SPLIT, OSP_CUDA_ATTN_FOLD};
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            uint16_t *o = h_gpu_attention(&p, &b, vw, NULL, NULL, modes[m], m % 2 ? OSP_CUDA_ATTN_DEC_ALL : -1);
            if (memcmp(got, o, bytes)) printf("  %s: mode %d's bits differ from v0's\n", w, modes[m]);
            assert_memory_equal(got, o, bytes);
            free(o);
        }
        /* the CPU's attention over the same pages, where its window rule is the GPU's */
        if (!vw->upper || decode_only) {
            float *cref = xmalloc(sizeof(float) * (size_t)nq), *scr = xmalloc(sizeof(float) * (size_t)(max_ctx + 1));
            osp_cpu_kv_pages cp = {.k_type = OSP_KV_DTYPE_INT8_HIER, .v_type = OSP_KV_DTYPE_INT8_HIER, .k = p.k, .v = p.v,
                                   .k_scale = p.kl, .v_scale = p.vl, .hier_upper_only = vw->upper,
                                   .hier_full_recent = vw->recent};
            osp_cpu_paged_attention_kv(b.qf, &cp, cref, b.num_seqs, b.qsl, b.positions, b.bt, b.max_blocks, c->bs,
                                       c->n_head, c->n_kv, c->D, 1.0f / sqrtf((float)c->D), b.window, scr, 0,
                                       T * c->n_head);
            char wc[180];
            snprintf(wc, sizeof wc, "%s (vs CPU)", w);
            assert_int_equal(h_count_far(&p, &b, got, cref, wc, true), 0);
            free(cref), free(scr);
        }
        if (v == 0) full_ref = ref;
        else free(ref);
        bits[v] = got;
    }
    /* a recent window past every sequence is the full view; the draft's other views are not */
    if (memcmp(bits[3], bits[0], bytes)) printf("  %s: recent > seq_len differs from the full view\n", what);
    assert_memory_equal(bits[3], bits[0], bytes);
    int64_t far[3] = {0};
    for (int v = 1; v < 3; v++) far[v] = h_count_far(&p, &b, bits[v], full_ref, "", false);
    printf("views int8_hier %-34s: upper (recent 0) / (recent 3) outputs outside the full view's tolerance: %lld / %lld "
           "of %lld\n",
           what, (long long)far[1], (long long)far[2], (long long)nq);
    assert_true(memcmp(bits[1], bits[0], bytes) != 0);
    assert_true(far[1] > 0);
    /* batch invariance: each decode sequence alone gives its rows' bits in the batch (the draft's view,
     * recent 3: full_from depends on the sequence only) */
    for (int s = 0; s < c->num_seqs; s++) {
        if (c->nnew[s] != 1) continue;
        qbatch one = b;
        one.num_seqs = 1, one.T = 1, one.qsl[0] = 0, one.qsl[1] = 1;
        one.positions = b.positions + b.qsl[s], one.bt = b.bt + (int64_t)s * b.max_blocks;
        one.q = b.q + (int64_t)b.qsl[s] * c->n_head * c->D;
        uint16_t *o = h_gpu_attention(&p, &one, &views[2], NULL, NULL, OSP_CUDA_ATTN_AUTO, -1);
        const size_t rb = sizeof(uint16_t) * (size_t)c->n_head * (size_t)c->D;
        if (memcmp(o, bits[2] + (int64_t)b.qsl[s] * c->n_head * c->D, rb))
            printf("  %s: sequence %d alone differs from its rows in the batch\n", what, s);
        assert_memory_equal(o, bits[2] + (int64_t)b.qsl[s] * c->n_head * c->D, rb);
        free(o);
    }
    for (int v = 0; v < nv; v++) free(bits[v]);
    free(full_ref), free(perm);
    qbatch_free(&b);
    hpool_free(&p);
}

/* Decodes at 1, 2, 3, 4, 17, 100, 300 and 1000 keys, a prefill chunk over a prefix and one from 0 (partial
 * blocks), a zero-token sequence; GQA 1 / 3 / 4 / 8 and groups of 16; head_dim 64 and 128 (and 32, 256);
 * blocks of 16 and 32 (and 7); a sliding window; then decode-only batches (the CPU comparison for every
 * view) and long decodes (3000 and 701 keys at max_seq_len 8192: split mode under the default, fold mode
 * forced, the same bits). */
static void test_int8h_read(void **state) {
    (void)state;
    static const hcfg heads[] = {{8, 8, 64}, {16, 4, 64}, {32, 8, 128}, {16, 2, 128}, {9, 3, 64},
                                 {4, 4, 32}, {8, 2, 256}, {16, 1, 128}};
    static const int32_t prefix[] = {0, 1, 2, 3, 16, 99, 299, 999, 50, 0, 37};
    static const int32_t nnew[] = {1, 1, 1, 1, 1, 1, 1, 1, 20, 33, 0};
    int n = 0;
    for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++) {
        rcase c = {0};
        c.n_head = heads[h].n_head, c.n_kv = heads[h].n_kv, c.D = heads[h].D, c.bs = h == 5 ? 7 : h % 2 ? 32 : 16;
        c.num_seqs = (int)(sizeof prefix / sizeof prefix[0]);
        memcpy(c.prefix, prefix, sizeof prefix), memcpy(c.nnew, nnew, sizeof nnew);
        c.window = h == 4 ? 64 : 0;
        h_read_case(&c, 12000u + (uint64_t)n++, "mixed");
        /* decodes only (max_seq_len 256: also the dequantized copy's bits) */
        rcase d = {0};
        d.n_head = c.n_head, d.n_kv = c.n_kv, d.D = c.D, d.bs = c.bs, d.num_seqs = 6, d.max_seq_len = 256;
        const int32_t pf[] = {0, 2, 3, 40, 130, 255};
        for (int s = 0; s < 6; s++) d.prefix[s] = pf[s], d.nnew[s] = 1;
        h_read_case(&d, 12000u + (uint64_t)n++, "decodes (vs dequantized copy)");
    }
    static const hcfg longs[] = {{32, 8, 128}, {16, 4, 64}};
    for (size_t h = 0; h < 2; h++) {
        rcase l = {0};
        l.n_head = longs[h].n_head, l.n_kv = longs[h].n_kv, l.D = longs[h].D, l.bs = 16, l.num_seqs = 2;
        l.prefix[0] = 2999, l.nnew[0] = 1, l.prefix[1] = 700, l.nnew[1] = 1, l.max_seq_len = 8192;
        h_read_case(&l, 12500u + (uint64_t)h, "decodes at 3000 and 701");
    }
}

int main(void) {
    if (osp_cuda_device_count() == 0) {
        printf("test_gpu_kv_quant: skipped: no CUDA device\n");
        return 77;
    }
    char name[256];
    if (osp_cuda_device_name(name, sizeof name) == OSP_OK) printf("device: %s\n", name);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_arguments),     cmocka_unit_test(test_write),
        cmocka_unit_test(test_read_mixed),          cmocka_unit_test(test_read_short_and_long),
        cmocka_unit_test(test_read_invariance),     cmocka_unit_test(test_int8h_arguments),
        cmocka_unit_test(test_int8h_write),         cmocka_unit_test(test_int8h_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
