/* Every op kind on every available backend against the CPU reference (the model of llama.cpp's
 * test-backend-ops): for each kind, seeded random shapes and values, one small op list run through the
 * backend interface (src/backend/backend.h) exactly as a model runs it, and every output compared
 * element by element with the CPU backend in exact mode.
 *
 * Backends: "cpu" (the fast path: int8 activations against block-quantized weights; with fp32 weights
 * it is the reference code itself, so the matmul cases also use Q8_0 and Q4_0 weights there) and
 * "cuda" when a device is present (CI has none: the CPU half runs there, `make test-gpu` the rest).
 * Inputs are bf16-representable wherever an op reads a bf16 activation or a weight the GPU keeps in
 * bf16, so every backend sees the same numbers; against the GPU the CPU reference runs in its
 * emulate_bf16 mode (the intermediate bf16 activations, such as q between RoPE and attention, and the
 * bf16 copies of quantized weights rounded as the GPU rounds them). Outputs are poisoned with NaN before each run and a
 * comparison is written so that NaN never passes: !(|got - ref| <= tol).
 *
 * Tolerances, per output dtype (tol = rtol |ref| + atol max|ref| over the output):
 *   fp32 outputs of elementwise ops and gathers: 1e-6 (the same operations in another order at most);
 *   fp32 matmul outputs: rtol 1e-5, atol 1e-5 (fp32 accumulation in another order, K <= 512);
 *   bf16 outputs: rtol 2^-7, atol 1e-4 (one bf16 rounding, which may fall on either side);
 *   RoPE q and attention outputs: rtol 2^-6, atol 1e-3 (sin/cos of another libm, f16 K/V pages written
 *   from fp32 that may differ in the last ulp);
 *   CPU fast-path matmul (int8 activations): atol 3e-2 (per-block 8-bit quantization of the input). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/quantize.h"
#include "core/threadpool.h"
#include "kv/kv_cache.h"
#include "test_rng.h"

#define MAX_IO 8

static osp_threadpool *g_pool;
static bool g_act_q8; /* the CPU backend's one-level activations (osp_backend_params.act_q8) */

typedef struct backend_case {
    const char *name;
    osp_device device;
    bool exact;
} backend_case;

static const backend_case k_backends[] = {
    {"cpu", OSP_DEVICE_CPU, false},
    {"cuda", OSP_DEVICE_CUDA, false},
};

static float bf16r(float x) { return osp_bf16_to_fp32(osp_fp32_to_bf16(x)); }

static float *rand_vec(size_t n, float scale, bool bf16) {
    float *v = malloc(n * sizeof *v + 4);
    for (size_t i = 0; i < n; i++) v[i] = bf16 ? bf16r(scale * frand()) : scale * frand();
    return v;
}

/* One op case: the op list, the host inputs and weights it reads, the outputs to compare. */
typedef struct op_case {
    const char *what;
    char desc[160];
    osp_graph g;
    osp_batch b;
    /* step inputs (host) */
    int32_t ids[256], pos[256], slot[256], qsl[9], seq_lens[8], bt[8 * 32], lidx[256];
    /* activation io: inputs set before the run, outputs compared */
    int32_t n_io;
    int32_t io_act[MAX_IO];
    bool io_in[MAX_IO];
    float *io_host[MAX_IO]; /* inputs: values; outputs: unused (each backend gets its own buffer) */
    float rtol[MAX_IO], atol[MAX_IO];
    /* weights as stored parts (host) */
    int32_t n_w;
    struct {
        int32_t n_parts;
        osp_weight_src src[OSP_TENSOR_MAX_PARTS];
        int64_t cols;
        bool vec;
        int32_t op, slot; /* op index, which operand (0: w, 1: w1, 2: w2, 3: w3) */
    } w[8];
    void *owned[32];
    int32_t n_owned;
    bool kv; /* needs a KV cache (rope / attention) */
    osp_kv_shape cfg;
    int32_t block_size, num_blocks;
    /* a first run (prefill of earlier positions) before the compared one; NULL-free when n_pre == 0 */
    int32_t n_pre;
    osp_batch pre;
    int32_t pre_ids[256], pre_pos[256], pre_slot[256], pre_qsl[9], pre_lens[8], pre_lidx[1];
    float *pre_in[MAX_IO];
} op_case;

static void *own(op_case *c, void *p) {
    assert_true(c->n_owned < 32);
    c->owned[c->n_owned++] = p;
    return p;
}

static void free_case(op_case *c) {
    for (int i = 0; i < c->n_owned; i++) free(c->owned[i]);
    osp_graph_free(&c->g);
}

static int32_t act(op_case *c, const char *name, uint32_t type, int64_t cols, osp_act_rows rows) {
    int32_t id;
    assert_int_equal(osp_graph_act(&c->g, name, type, cols, rows, &id), OSP_OK);
    return id;
}

static void io(op_case *c, int32_t a, bool input, float *host, float rtol, float atol) {
    assert_true(c->n_io < MAX_IO);
    c->io_act[c->n_io] = a, c->io_in[c->n_io] = input, c->io_host[c->n_io] = host;
    c->rtol[c->n_io] = rtol, c->atol[c->n_io] = atol;
    c->n_io++;
}

/* A weight for operand `slot` of op `op`: n parts of `rows[i]` rows of `cols` values of `type`
 * (quantized from bf16-representable values), or an fp32 vector (vec). */
static void weight(op_case *c, int32_t op, int32_t slot, int32_t n, const int64_t *rows, int64_t cols, uint32_t type,
                   bool vec, float scale) {
    assert_true(c->n_w < 8);
    c->w[c->n_w].n_parts = n, c->w[c->n_w].cols = vec ? 0 : cols, c->w[c->n_w].vec = vec;
    c->w[c->n_w].op = op, c->w[c->n_w].slot = slot;
    int64_t vcols = 0;
    for (int32_t i = 0; i < n; i++) {
        const int64_t r = vec ? 1 : rows[i], cl = vec ? rows[i] : cols;
        float *v = own(c, rand_vec((size_t)(r * cl), scale, true));
        if (vec) /* norm weights near 1, biases as drawn */
            for (int64_t j = 0; j < cl; j++) v[j] = scale == 0.0f ? bf16r(1.0f + 0.1f * frand()) : v[j];
        void *data = v;
        size_t rb = (size_t)cl * 4;
        if (type != OSP_DTYPE_F32) {
            rb = osp_dtype_row_size(type, cl);
            data = own(c, malloc(rb * (size_t)r));
            for (int64_t k = 0; k < r; k++)
                assert_int_equal(osp_quantize_row(type, v + k * cl, (char *)data + (size_t)k * rb, cl), OSP_OK);
        }
        c->w[c->n_w].src[i] = (osp_weight_src){.data = data, .type = type, .rows = r, .row_bytes = rb};
        vcols += cl;
    }
    if (vec) c->w[c->n_w].cols = vcols;
    c->n_w++;
}

static void push(op_case *c, osp_op op) { assert_int_equal(osp_graph_push(&c->g, &op), OSP_OK); }

/* The batch of `n_seq` sequences: sequence s has new tokens [start[s], start[s] + len[s]) (positions),
 * blocks s * 32 + j of block_size 16; logits rows: n_logits random token rows. */
static void batch(op_case *c, int32_t n_seq, const int32_t *start, const int32_t *len, int32_t n_logits) {
    c->block_size = 16, c->num_blocks = 8 * 32;
    int32_t t = 0;
    c->qsl[0] = 0;
    for (int32_t s = 0; s < n_seq; s++) {
        for (int32_t j = 0; j < 32; j++) c->bt[s * 32 + j] = s * 32 + j;
        for (int32_t i = 0; i < len[s]; i++, t++) {
            c->ids[t] = (int32_t)(rnd() % 37);
            c->pos[t] = start[s] + i;
            c->slot[t] = c->bt[s * 32 + c->pos[t] / 16] * 16 + c->pos[t] % 16;
        }
        c->qsl[s + 1] = t;
        c->seq_lens[s] = start[s] + len[s];
    }
    for (int32_t i = 0; i < n_logits; i++) c->lidx[i] = (int32_t)(rnd() % (uint32_t)t);
    c->b = (osp_batch){.num_tokens = t, .token_ids = c->ids, .positions = c->pos, .slot_mapping = c->slot,
                       .num_seqs = n_seq, .query_start_loc = c->qsl, .seq_lens = c->seq_lens, .block_table = c->bt,
                       .max_blocks_per_seq = 32, .num_logits = n_logits, .logits_indices = c->lidx};
}

/* ---- the cases ----------------------------------------------------------------------------------- */

static int64_t pick(const int64_t *v, int n) { return v[rnd() % (uint32_t)n]; }

static void case_embed(op_case *c) {
    c->what = "embed";
    const int64_t E = pick((const int64_t[]){32, 64, 100, 640}, 4);
    const int32_t start[] = {0, 0}, len[] = {1 + (int32_t)(rnd() % 20), 1 + (int32_t)(rnd() % 5)};
    batch(c, 2, start, len, 0);
    const int32_t x = act(c, "x", OSP_DTYPE_F32, E, OSP_ROWS_TOKENS);
    const float scale = rnd() % 2 ? 1.0f : sqrtf((float)E);
    push(c, (osp_op){.kind = OSP_OP_EMBED, .dst = x, .src0 = -1, .src1 = -1, .p.embed.scale = scale});
    weight(c, 0, 0, 1, (const int64_t[]){37}, E, OSP_DTYPE_F32, false, 1.0f);
    io(c, x, false, NULL, 1e-6f, 1e-6f);
}

static void case_add_rmsnorm(op_case *c) {
    c->what = "add_rmsnorm";
    const int64_t E = pick((const int64_t[]){32, 64, 576, 1000}, 4);
    const int32_t start[] = {0}, len[] = {1 + (int32_t)(rnd() % 40)};
    batch(c, 1, start, len, 0);
    const int64_t T = c->b.num_tokens;
    const int32_t x = act(c, "x", OSP_DTYPE_F32, E, OSP_ROWS_TOKENS);
    const int32_t d = act(c, "d", OSP_DTYPE_BF16, E, OSP_ROWS_TOKENS);
    const int32_t y = act(c, "y", OSP_DTYPE_BF16, E, OSP_ROWS_TOKENS);
    const bool add = rnd() % 4 != 0;
    push(c, (osp_op){.kind = OSP_OP_ADD_RMSNORM, .dst = y, .src0 = add ? d : -1, .src1 = x, .p.norm.eps = 1e-6f});
    weight(c, 0, 0, 1, &E, 0, OSP_DTYPE_F32, true, 0.0f);
    io(c, x, true, own(c, rand_vec((size_t)(T * E), 3.0f, false)), 0, 0);
    io(c, d, true, own(c, rand_vec((size_t)(T * E), 1.0f, true)), 0, 0);
    io(c, x, false, NULL, 1e-6f, 1e-6f); /* the residual stream after the add */
    io(c, y, false, NULL, 0.0078125f, 1e-4f);
}

static void case_gather_rmsnorm(op_case *c) {
    c->what = "gather_rmsnorm";
    const int64_t E = pick((const int64_t[]){32, 64, 576}, 3);
    const int32_t start[] = {0, 5}, len[] = {1 + (int32_t)(rnd() % 30), 1};
    batch(c, 2, start, len, 1 + (int32_t)(rnd() % 6));
    const int64_t T = c->b.num_tokens;
    const int32_t x = act(c, "x", OSP_DTYPE_F32, E, OSP_ROWS_TOKENS);
    const int32_t y = act(c, "y", OSP_DTYPE_BF16, E, OSP_ROWS_LOGITS);
    push(c, (osp_op){.kind = OSP_OP_GATHER_RMSNORM, .dst = y, .src0 = -1, .src1 = x, .p.norm.eps = 1e-5f});
    weight(c, 0, 0, 1, &E, 0, OSP_DTYPE_F32, true, 0.0f);
    io(c, x, true, own(c, rand_vec((size_t)(T * E), 2.0f, false)), 0, 0);
    io(c, y, false, NULL, 0.0078125f, 1e-4f);
}

static void case_matmul(op_case *c, uint32_t wtype) {
    c->what = wtype == OSP_DTYPE_F32 ? "matmul" : wtype == OSP_DTYPE_Q8_0 ? "matmul q8_0" : "matmul q4_0";
    const int64_t K = pick((const int64_t[]){64, 128, 256, 512}, 4);
    const int32_t np = 1 + (int32_t)(rnd() % 3);
    int64_t rows[3], N = 0;
    for (int32_t i = 0; i < np; i++) N += rows[i] = 8 * (1 + (int64_t)(rnd() % 16));
    const bool logits_rows = rnd() % 3 == 0;
    const int32_t start[] = {0}, len[] = {1 + (int32_t)(rnd() % 48)};
    batch(c, 1, start, len, logits_rows ? 1 + (int32_t)(rnd() % 4) : 0);
    const osp_act_rows rk = logits_rows ? OSP_ROWS_LOGITS : OSP_ROWS_TOKENS;
    const int64_t R = logits_rows ? c->b.num_logits : c->b.num_tokens;
    const bool f32_out = rnd() % 2;
    const int32_t x = act(c, "x", OSP_DTYPE_BF16, K, rk);
    const int32_t y = act(c, "y", f32_out ? OSP_DTYPE_F32 : OSP_DTYPE_BF16, N, rk);
    push(c, (osp_op){.kind = OSP_OP_MATMUL, .dst = y, .src0 = x, .src1 = -1});
    weight(c, 0, 0, np, rows, K, wtype, false, 0.2f);
    io(c, x, true, own(c, rand_vec((size_t)(R * K), 1.0f, true)), 0, 0);
    if (wtype != OSP_DTYPE_F32) io(c, y, false, NULL, 0.0078125f, 3e-2f); /* the CPU's int8 fast path */
    else if (f32_out) io(c, y, false, NULL, 1e-5f, 1e-5f);
    else io(c, y, false, NULL, 0.0078125f, 1e-4f);
}

/* RoPE + KV write, then attention over the pages, after a first run that prefilled earlier positions
 * of some sequences: a mixed batch of prefill chunks and decodes. */
static void case_rope_attention(op_case *c) {
    c->what = "rope_kv_write + attention";
    const int D = (int)pick((const int64_t[]){32, 64, 128, 256}, 4);
    const int HK = 1 + (int)(rnd() % 2), H = HK * (1 + (int)(rnd() % 4));
    const int64_t QD = (int64_t)H * D, KD = (int64_t)HK * D, W = QD + 2 * KD;
    const bool neox = rnd() % 2, bias = rnd() % 2, qkn = rnd() % 2;
    const int32_t window = rnd() % 3 == 0 ? 1 + (int32_t)(rnd() % 40) : 0;
    const int n_rot = rnd() % 4 == 0 ? D / 2 : D;
    c->kv = true;
    c->cfg = (osp_kv_shape){.n_layer = 1, .n_head_kv = HK, .head_dim = D};
    /* earlier positions first (run 1), then the compared step */
    const int32_t n_seq = 1 + (int32_t)(rnd() % 3);
    int32_t before[3], now[3];
    for (int32_t s = 0; s < n_seq; s++) {
        before[s] = rnd() % 2 ? (int32_t)(rnd() % 120) : 0;
        now[s] = rnd() % 2 ? 1 : 1 + (int32_t)(rnd() % 30);
    }
    batch(c, n_seq, before, now, 0);
    int32_t t = 0;
    c->pre_qsl[0] = 0;
    for (int32_t s = 0; s < n_seq; s++) {
        for (int32_t p = 0; p < before[s]; p++, t++) {
            c->pre_pos[t] = p;
            c->pre_slot[t] = c->bt[s * 32 + p / 16] * 16 + p % 16;
            c->pre_ids[t] = 0;
        }
        c->pre_qsl[s + 1] = t;
        c->pre_lens[s] = before[s];
    }
    c->n_pre = t;
    const int64_t T = c->b.num_tokens;
    const int32_t qkv = act(c, "qkv", OSP_DTYPE_F32, W, OSP_ROWS_TOKENS);
    const int32_t q = act(c, "q", OSP_DTYPE_BF16, QD, OSP_ROWS_TOKENS);
    const int32_t o = act(c, "o", OSP_DTYPE_BF16, QD, OSP_ROWS_TOKENS);
    const float scale = 1.0f / sqrtf((float)D);
    push(c, (osp_op){.kind = OSP_OP_ROPE_KV_WRITE, .dst = q, .src0 = qkv, .src1 = -1, .layer = 0,
                     .p.rope = {H, HK, D, n_rot, neox, 1e-6f}});
    push(c, (osp_op){.kind = OSP_OP_ATTENTION, .dst = o, .src0 = q, .src1 = -1, .layer = 0,
                     .p.attn = {H, HK, D, window, scale}});
    if (bias) weight(c, 0, 0, 1, &W, 0, OSP_DTYPE_F32, true, 0.5f);
    if (qkn) {
        const int64_t d = D;
        weight(c, 0, 1, 1, &d, 0, OSP_DTYPE_F32, true, 0.0f);
        weight(c, 0, 2, 1, &d, 0, OSP_DTYPE_F32, true, 0.0f);
    }
    /* inv_freq: theta 10000 (or 1e6) over n_rot */
    float *inv = own(c, malloc(sizeof(float) * (size_t)(n_rot / 2 + 1)));
    const double theta = rnd() % 2 ? 10000.0 : 1e6;
    for (int i = 0; i < n_rot / 2; i++) inv[i] = (float)(1.0 / pow(theta, 2.0 * i / n_rot));
    assert_true(c->n_w < 8);
    c->w[c->n_w].n_parts = 1, c->w[c->n_w].cols = n_rot / 2, c->w[c->n_w].vec = true;
    c->w[c->n_w].op = 0, c->w[c->n_w].slot = 3;
    c->w[c->n_w].src[0] = (osp_weight_src){.data = inv, .type = OSP_DTYPE_F32, .rows = 1,
                                           .row_bytes = sizeof(float) * (size_t)(n_rot / 2)};
    c->n_w++;
    /* |q|, |k| ~ 0.3 sqrt(D): scores of a few units, so the softmax is not so sharp that one f16
     * rounding of a key written by the other backend's RoPE moves the output past the tolerance */
    c->pre_in[0] = c->n_pre ? own(c, rand_vec((size_t)(c->n_pre * W), 0.5f, false)) : NULL;
    io(c, qkv, true, own(c, rand_vec((size_t)(T * W), 0.5f, false)), 0, 0);
    snprintf(c->desc, sizeof c->desc, "rope_kv_write + attention (D %d, heads %d/%d, window %d, n_rot %d, %s%s%s, %d seqs)",
             D, H, HK, window, n_rot, neox ? "neox" : "interleaved", bias ? ", bias" : "", qkn ? ", q/k norm" : "", n_seq);
    c->what = c->desc;
    io(c, q, false, NULL, 0.015625f, 1e-3f);
    io(c, o, false, NULL, 0.015625f, 1e-3f);
}

static void case_glu(op_case *c) {
    c->what = "glu";
    const int64_t F = pick((const int64_t[]){32, 64, 100, 1536}, 4);
    const int32_t start[] = {0}, len[] = {1 + (int32_t)(rnd() % 20)};
    batch(c, 1, start, len, 0);
    const int64_t T = c->b.num_tokens;
    const int32_t gu = act(c, "gu", OSP_DTYPE_BF16, 2 * F, OSP_ROWS_TOKENS);
    const int32_t y = act(c, "y", OSP_DTYPE_BF16, F, OSP_ROWS_TOKENS);
    push(c, (osp_op){.kind = OSP_OP_GLU, .dst = y, .src0 = gu, .src1 = -1,
                     .p.glu.act = rnd() % 2 ? OSP_GLU_GELU_TANH : OSP_GLU_SILU});
    io(c, gu, true, own(c, rand_vec((size_t)(T * 2 * F), 4.0f, true)), 0, 0);
    io(c, y, false, NULL, 0.0078125f, 1e-4f);
}

static void case_copy(op_case *c) {
    c->what = "copy";
    const int64_t E = pick((const int64_t[]){32, 64, 576}, 3);
    const int32_t start[] = {0}, len[] = {1 + (int32_t)(rnd() % 20)};
    batch(c, 1, start, len, 0);
    const int64_t T = c->b.num_tokens;
    const bool bf = rnd() % 2;
    const int32_t x = act(c, "x", bf ? OSP_DTYPE_BF16 : OSP_DTYPE_F32, E, OSP_ROWS_TOKENS);
    const int32_t y = act(c, "y", bf ? OSP_DTYPE_BF16 : OSP_DTYPE_F32, E, OSP_ROWS_TOKENS);
    push(c, (osp_op){.kind = OSP_OP_COPY, .dst = y, .src0 = x, .src1 = -1});
    io(c, x, true, own(c, rand_vec((size_t)(T * E), 3.0f, true)), 0, 0);
    io(c, y, false, NULL, 0.0f, 0.0f); /* bit-exact */
}

static void case_scale(op_case *c) {
    const bool soft = rnd() % 2;
    c->what = soft ? "softcap" : "scale";
    const int64_t V = pick((const int64_t[]){37, 512, 1000}, 3);
    const int32_t start[] = {0}, len[] = {1 + (int32_t)(rnd() % 20)};
    batch(c, 1, start, len, 1 + (int32_t)(rnd() % 4));
    const int64_t L = c->b.num_logits;
    const int32_t x = act(c, "logits", OSP_DTYPE_F32, V, OSP_ROWS_LOGITS);
    const int32_t y = rnd() % 2 ? x : act(c, "y", OSP_DTYPE_F32, V, OSP_ROWS_LOGITS); /* in place or not */
    const float s = soft ? 5.0f + 25.0f * (float)(rnd() % 100) / 100.0f : 0.5f + (float)(rnd() % 100) / 25.0f;
    push(c, (osp_op){.kind = soft ? OSP_OP_SOFTCAP : OSP_OP_SCALE, .dst = y, .src0 = x, .src1 = -1, .p.scale.s = s});
    io(c, x, true, own(c, rand_vec((size_t)(L * V), 40.0f, false)), 0, 0);
    io(c, y, false, NULL, 1e-5f, 1e-6f); /* tanhf of another libm: a few ulp */
}

static void case_add(op_case *c) {
    c->what = "add";
    const int64_t E = pick((const int64_t[]){32, 64, 576}, 3);
    const int32_t start[] = {0}, len[] = {1 + (int32_t)(rnd() % 20)};
    batch(c, 1, start, len, 0);
    const int64_t T = c->b.num_tokens;
    const int32_t x = act(c, "x", OSP_DTYPE_F32, E, OSP_ROWS_TOKENS);
    const int32_t d = act(c, "d", OSP_DTYPE_BF16, E, OSP_ROWS_TOKENS);
    push(c, (osp_op){.kind = OSP_OP_ADD, .dst = x, .src0 = d, .src1 = -1});
    io(c, x, true, own(c, rand_vec((size_t)(T * E), 3.0f, false)), 0, 0);
    io(c, d, true, own(c, rand_vec((size_t)(T * E), 1.0f, true)), 0, 0);
    io(c, x, false, NULL, 1e-6f, 1e-6f);
}

/* One rank (no communicator): the all-gather of logits rows is a copy on every backend, bit for bit.
 * Several ranks: tests/unit/test_tp.c (the vocabulary-parallel lm_head). */
static void case_all_gather(op_case *c) {
    c->what = "all_gather";
    const int64_t V = pick((const int64_t[]){37, 576, 49152}, 3);
    const int32_t start[] = {0}, len[] = {1 + (int32_t)(rnd() % 20)};
    batch(c, 1, start, len, 1 + (int32_t)(rnd() % 3));
    const int64_t L = c->b.num_logits;
    const int32_t x = act(c, "x", OSP_DTYPE_F32, V, OSP_ROWS_LOGITS), y = act(c, "y", OSP_DTYPE_F32, V, OSP_ROWS_LOGITS);
    push(c, (osp_op){.kind = OSP_OP_ALL_GATHER, .dst = y, .src0 = x, .src1 = -1});
    io(c, x, true, own(c, rand_vec((size_t)(L * V), 3.0f, false)), 0, 0);
    io(c, y, false, NULL, 0.0f, 0.0f); /* bit-exact */
}

/* One rank (no communicator): the in-place all-reduce is the identity on every backend, bit for bit.
 * Several ranks: tests/unit/test_tp.c. */
static void case_all_reduce(op_case *c) {
    c->what = "all_reduce";
    const int64_t E = pick((const int64_t[]){32, 64, 576}, 3);
    const int32_t start[] = {0}, len[] = {1 + (int32_t)(rnd() % 20)};
    batch(c, 1, start, len, 0);
    const int64_t T = c->b.num_tokens;
    const int32_t x = act(c, "x", OSP_DTYPE_F32, E, OSP_ROWS_TOKENS);
    push(c, (osp_op){.kind = OSP_OP_ALL_REDUCE, .dst = x, .src0 = x, .src1 = -1});
    io(c, x, true, own(c, rand_vec((size_t)(T * E), 3.0f, false)), 0, 0);
    io(c, x, false, NULL, 0.0f, 0.0f); /* bit-exact */
}

/* ---- running a case ------------------------------------------------------------------------------- */

/* Runs case c on a backend; out[i] receives output io i (fp32, rows x cols), NaN-poisoned first.
 * Returns false (with the reason printed) when the backend does not support an op. */
static bool run_case(op_case *c, osp_device dev, bool exact, bool emulate, float **out, size_t *n_out) {
    osp_backend_params bp = {.pool = g_pool, .exact = exact, .emulate_bf16 = emulate, .act_q8 = g_act_q8};
    osp_backend *be;
    assert_int_equal(osp_backend_create(dev, &bp, &be), OSP_OK);
    be->n_vocab = 1;
    osp_tensor t[8];
    for (int32_t i = 0; i < c->n_w; i++) {
        assert_int_equal(be->vt->place(be, c->w[i].src, c->w[i].n_parts, c->w[i].cols, c->w[i].vec, &t[i]), OSP_OK);
        osp_op *op = &c->g.ops[c->w[i].op];
        const osp_tensor **slot[4] = {&op->w, &op->w1, &op->w2, &op->w3};
        *slot[c->w[i].slot] = &t[i];
    }
    for (int32_t k = 0; k < c->g.n_ops; k++) {
        char why[256];
        if (!be->vt->supports_op(be, &c->g, &c->g.ops[k], why, sizeof why)) {
            printf("    %s: %s not supported: %s\n", be->vt->name, osp_op_name(c->g.ops[k].kind), why);
            osp_backend_free(be);
            return false;
        }
    }
    osp_kv_cache *kv = NULL;
    if (c->kv) {
        assert_int_equal(osp_kv_cache_create_on(be, &c->cfg, c->num_blocks, c->block_size, OSP_KV_DTYPE_F16, &kv),
                         OSP_OK);
    } else { /* ops without KV still get a cache (the interface takes one) */
        osp_kv_shape cfg = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32};
        assert_int_equal(osp_kv_cache_create_on(be, &cfg, 1, 16, OSP_KV_DTYPE_F32, &kv), OSP_OK);
    }
    if (c->n_pre > 0) { /* earlier positions: the same op list over them, outputs not compared */
        c->pre = c->b;
        c->pre.num_tokens = c->n_pre;
        c->pre.token_ids = c->pre_ids, c->pre.positions = c->pre_pos, c->pre.slot_mapping = c->pre_slot;
        c->pre.query_start_loc = c->pre_qsl, c->pre.seq_lens = c->pre_lens, c->pre.num_logits = 0;
        /* sequences with nothing before this step get one dummy token at a slot no one reads */
        osp_act_io in = {c->io_act[0], c->pre_in[0], true};
        bool empty = false;
        for (int32_t s = 0; s < c->b.num_seqs; s++) empty |= c->pre_qsl[s + 1] == c->pre_qsl[s];
        if (!empty) {
            osp_run_io rio = {.acts = &in, .n_acts = 1};
            assert_int_equal(be->vt->run(be, &c->g, kv, &c->pre, &rio), OSP_OK);
        } else { /* run the sequences that have earlier positions one at a time */
            for (int32_t s = 0; s < c->b.num_seqs; s++) {
                const int32_t lo = c->pre_qsl[s], n = c->pre_qsl[s + 1] - lo;
                if (n == 0) continue;
                int32_t qsl[2] = {0, n};
                osp_batch one = c->pre;
                one.num_tokens = n, one.num_seqs = 1;
                one.token_ids = c->pre_ids + lo, one.positions = c->pre_pos + lo, one.slot_mapping = c->pre_slot + lo;
                one.query_start_loc = qsl, one.seq_lens = &c->pre_lens[s], one.block_table = c->bt + s * 32;
                const int64_t w = c->g.acts[c->io_act[0]].cols;
                osp_act_io in1 = {c->io_act[0], c->pre_in[0] + (size_t)lo * (size_t)w, true};
                osp_run_io rio = {.acts = &in1, .n_acts = 1};
                assert_int_equal(be->vt->run(be, &c->g, kv, &one, &rio), OSP_OK);
            }
        }
    }
    osp_act_io ios[MAX_IO];
    for (int32_t i = 0; i < c->n_io; i++) {
        const osp_act *a = &c->g.acts[c->io_act[i]];
        n_out[i] = (size_t)(a->rows == OSP_ROWS_LOGITS ? c->b.num_logits : c->b.num_tokens) * (size_t)a->cols;
        out[i] = NULL;
        float *h = c->io_host[i];
        if (!c->io_in[i]) {
            h = out[i] = malloc(n_out[i] * sizeof(float) + 4);
            for (size_t k = 0; k < n_out[i]; k++) h[k] = NAN;
        }
        ios[i] = (osp_act_io){c->io_act[i], h, c->io_in[i]};
    }
    osp_run_io rio = {.acts = ios, .n_acts = c->n_io};
    osp_status s = be->vt->run(be, &c->g, kv, &c->b, &rio);
    if (s != OSP_OK) fail_msg("%s on %s: %s", c->what, be->vt->name, osp_last_error());
    osp_kv_cache_free(kv);
    osp_backend_free(be);
    return true;
}

typedef void (*case_fn)(op_case *c);

static int g_compared[2], g_cases[2];
static bool g_kind_seen[OSP_OP_COUNT]; /* op kinds some case compared (on the CPU run) */

/* Builds the case from `seed` (twice, so every backend gets a fresh copy of the same case), runs it on
 * the CPU reference and on backend bi, compares. */
static void check(case_fn make, uint64_t seed, int bi, uint32_t wtype) {
    float *ref[MAX_IO], *got[MAX_IO];
    size_t n_ref[MAX_IO], n_got[MAX_IO];
    op_case *c = calloc(1, sizeof *c);
    op_case *r = calloc(1, sizeof *r);
    osp_graph_init(&c->g);
    osp_graph_init(&r->g);
    test_rng_state = seed;
    if (make) make(c);
    else case_matmul(c, wtype);
    test_rng_state = seed;
    if (make) make(r);
    else case_matmul(r, wtype);
    const backend_case *bc = &k_backends[bi];
    /* against the GPU the reference emulates its bf16 storage (weights and bf16 activations rounded
     * where it rounds them: op.h), so the comparison measures its kernels, not its precision */
    const bool emulate = bc->device != OSP_DEVICE_CPU;
    assert_true(run_case(r, OSP_DEVICE_CPU, true, emulate, ref, n_ref));
    if (!run_case(c, bc->device, bc->exact, false, got, n_got)) fail_msg("%s: not supported on %s", c->what, bc->name);
    for (int32_t i = 0; i < c->n_io; i++) {
        if (c->io_in[i]) continue;
        assert_int_equal(n_ref[i], n_got[i]);
        float mx = 0.0f;
        for (size_t k = 0; k < n_ref[i]; k++) mx = fabsf(ref[i][k]) > mx ? fabsf(ref[i][k]) : mx;
        /* the fast path's int8 error applies only to the CPU with quantized weights; the GPU holds
         * bf16 weights and its tolerance is the bf16 one */
        float atol = c->atol[i], rtol = c->rtol[i];
        if (wtype != OSP_DTYPE_F32 && bc->device != OSP_DEVICE_CPU) atol = 1e-4f; /* bf16 weights, emulated */
        for (size_t k = 0; k < n_ref[i]; k++) {
            const float d = fabsf(got[i][k] - ref[i][k]);
            if (!(isfinite(ref[i][k]) && d <= rtol * fabsf(ref[i][k]) + atol * mx))
                fail_msg("%s on %s (seed %llu), output '%s' [%zu]: %.7g, reference %.7g (|d| %.3g, tol %.3g)", c->what,
                         bc->name, (unsigned long long)seed, c->g.acts[c->io_act[i]].name, k, (double)got[i][k],
                         (double)ref[i][k], (double)d, (double)(rtol * fabsf(ref[i][k]) + atol * mx));
        }
        g_compared[bi] += (int)n_ref[i];
        free(ref[i]);
        free(got[i]);
    }
    g_cases[bi]++;
    for (int32_t k = 0; k < c->g.n_ops; k++) g_kind_seen[c->g.ops[k].kind] = true;
    free_case(c);
    free_case(r);
    free(c);
    free(r);
}

#define SEEDS 12

static void run_all(int bi) {
    static const struct {
        case_fn fn;
        uint32_t wtype;
    } cases[] = {
        {case_embed, 0},       {case_add_rmsnorm, 0}, {case_gather_rmsnorm, 0},     {NULL, OSP_DTYPE_F32},
        {NULL, OSP_DTYPE_Q8_0}, {NULL, OSP_DTYPE_Q4_0}, {case_rope_attention, 0}, {case_glu, 0},
        {case_add, 0},         {case_copy, 0},          {case_scale, 0},          {case_all_reduce, 0}, {case_all_gather, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (uint64_t s = 1; s <= SEEDS; s++) check(cases[k].fn, 0x1234567ull * s + k, bi, cases[k].wtype);
    printf("%s: %d cases of %d op kinds, %d outputs within tolerance of the CPU reference\n", k_backends[bi].name,
           g_cases[bi], (int)OSP_OP_COUNT, g_compared[bi]);
}

static void test_cpu(void **state) { (void)state; run_all(0); }

static void test_cuda(void **state) {
    (void)state;
    if (osp_backend_device_count(OSP_DEVICE_CUDA) == 0) {
        printf("cuda: no device (or built without CUDA): skipped\n");
        skip();
    }
    run_all(1);
}

/* A one-token matmul's rows are split among threads in chunks claimed at run time (backend_cpu.c,
 * mm_take): which thread computes a row, and in which call, varies from run to run. Every row must come
 * out with the same bits as on one thread, for each weight type with a fast kernel, in both activation
 * modes, on 2 and 3 threads (3 on a 2-core box: the threads are preempted mid-slice and steal more). */
static void one_token_matmul(op_case *c, uint32_t wtype) {
    c->what = "one-token matmul";
    const int64_t K = 512, rows[2] = {1037, 211}; /* stacked parts, neither a multiple of 16 */
    const int32_t start[] = {0}, len[] = {1};
    batch(c, 1, start, len, 0);
    const int32_t x = act(c, "x", OSP_DTYPE_BF16, K, OSP_ROWS_TOKENS);
    const int32_t y = act(c, "y", OSP_DTYPE_F32, rows[0] + rows[1], OSP_ROWS_TOKENS);
    push(c, (osp_op){.kind = OSP_OP_MATMUL, .dst = y, .src0 = x, .src1 = -1});
    weight(c, 0, 0, 2, rows, K, wtype, false, 0.2f);
    io(c, x, true, own(c, rand_vec((size_t)K, 1.0f, true)), 0, 0);
    io(c, y, false, NULL, 0, 0);
}

static void test_cpu_matmul_thread_split(void **state) {
    (void)state;
    static const uint32_t types[] = {OSP_DTYPE_Q8_0, OSP_DTYPE_Q4_0, OSP_DTYPE_Q4_1, OSP_DTYPE_Q5_0,
                                     OSP_DTYPE_Q5_1, OSP_DTYPE_Q4_K, OSP_DTYPE_Q6_K, OSP_DTYPE_F32};
    osp_threadpool *two = g_pool, *pools[3];
    assert_int_equal(osp_threadpool_create(1, &pools[0]), OSP_OK);
    pools[1] = two;
    assert_int_equal(osp_threadpool_create(3, &pools[2]), OSP_OK);
    int compared = 0;
    for (int q8 = 0; q8 < 2; q8++)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
            for (int rep = 0; rep < 3; rep++) {
                float *ref = NULL;
                size_t n_ref = 0;
                for (int pi = 0; pi < 3; pi++) {
                    op_case *c = calloc(1, sizeof *c);
                    osp_graph_init(&c->g);
                    test_rng_state = 0xabcdefull + ti;
                    one_token_matmul(c, types[ti]);
                    float *out[MAX_IO];
                    size_t n_out[MAX_IO];
                    g_pool = pools[pi], g_act_q8 = q8;
                    assert_true(run_case(c, OSP_DEVICE_CPU, false, false, out, n_out));
                    g_pool = two, g_act_q8 = false;
                    if (pi == 0) {
                        ref = out[1], n_ref = n_out[1];
                    } else {
                        assert_int_equal(n_out[1], n_ref);
                        for (size_t k = 0; k < n_ref; k++)
                            if (memcmp(&out[1][k], &ref[k], sizeof(float)) != 0)
                                fail_msg("%s, %s activations, %d threads: row %zu is %.9g, on one thread %.9g",
                                         osp_dtype_name(types[ti]), q8 ? "q8" : "default", pi + 1, k,
                                         (double)out[1][k], (double)ref[k]);
                        compared += (int)n_ref;
                        free(out[1]);
                    }
                    free_case(c);
                    free(c);
                }
                free(ref);
            }
    osp_threadpool_free(pools[0]);
    osp_threadpool_free(pools[2]);
    printf("one-token matmuls: %d rows on 2 and 3 threads, the same bits as on one\n", compared);
}

/* Every op kind has a case above: a new kind must come with one. */
static void test_every_kind_covered(void **state) {
    (void)state;
    for (int k = 0; k < OSP_OP_COUNT; k++)
        if (!g_kind_seen[k]) fail_msg("op kind %s has no case in tests/ops", osp_op_name((osp_op_kind)k));
}

int main(void) {
    if (osp_threadpool_create(2, &g_pool) != OSP_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_every_kind_covered), /* after test_cpu, which marks the kinds it ran */
        cmocka_unit_test(test_cpu_matmul_thread_split),
        cmocka_unit_test(test_cuda),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    osp_threadpool_free(g_pool);
    return rc;
}
