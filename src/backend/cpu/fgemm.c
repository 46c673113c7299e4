/* fp32 GEMM tiles with osp_cpu_dot's bits (see fgemm.h).
 *
 * Why the sums match: osp_cpu_dot (n % 16 == 0) keeps 16 partial sums, lane j adding the rounded
 * products a[i] * b[i] for i = j mod 16 in increasing i, then folds them 8, 4, 2, 1. The lanes never
 * meet before the fold, so a tile can hold one 16-lane accumulator per (row, token) in a 512-bit
 * register, or two 8-lane halves run one after the other (AVX2), and do the same adds in the same
 * order. Widening F16 (vcvtph2ps) and BF16 (a 16-bit shift) is exact, as osp_dequant_row's is.
 *
 * Tile shape (AVX512): 4 rows x 6 tokens keeps 24 accumulators, 4 weight vectors, a token vector and a
 * product in 30 of the 32 registers, and issues 10 loads per 24 multiplies and 24 adds (4 x 4: 8 per
 * 16). Zen 4 runs a 512-bit multiply and a 512-bit add each cycle on separate pipes, so the unfused
 * product costs no throughput against an FMA there. Measured on the Zen 4 dev box (bench/cpu/NOTES.md,
 * fgemm pass): 4 x 6 against 4 x 4 within the box's noise on F16 and up to ~1.2x on F32 rows; what
 * mattered was keeping each loaded vector in a register (below) and the one-token prefetch. AVX2 has
 * 16 registers: 4 rows x 2 tokens x one 8-lane half (8 + 4 + 1). */
#include "backend/cpu/fgemm.h"

#include <stdbool.h>

#include "backend/cpu/qdot.h"
#include "core/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define OSP_X86 1
#endif

#define FG_ROWS 4             /* weight rows per tile */
#define FG_TOKENS512 6        /* tokens per AVX512 tile */
#define FG_BLOCK (256 * 1024) /* a row block's bytes as fp32 (its weights read in place, or its panel) */
#define FG_PREFETCH (16 * 1024) /* bytes ahead a one-token tile prefetches its rows */
#define FG_WIDEN_MAX_TOKENS 8  /* F16 / BF16 widened in the tile up to this many tokens, else once into the panel */

enum { W_F32, W_F16, W_BF16, W_PANEL_KINDS }; /* how a tile reads its weight rows (a panel is F32) */

int64_t osp_cpu_fgemm_panel_floats(int64_t cols) {
    int64_t n = FG_BLOCK / (int64_t)sizeof(float);
    if (n < FG_ROWS * cols) n = FG_ROWS * cols;
    return n;
}

#ifdef OSP_X86
#define FORCE_INLINE inline __attribute__((always_inline))
#define TGT_512 __attribute__((target("avx512f,avx512vl,avx2,fma,f16c")))
#define TGT_AVX2 __attribute__((target("avx2,fma,f16c")))

/* ---- AVX512: 16 lanes per (row, token) in one register ----------------------------------------- */

TGT_512 static FORCE_INLINE __m512 load512(int kind, const uint8_t *row, int64_t k) {
    switch (kind) {
    case W_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * k)));
    case W_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * k))), 16));
    default: return _mm512_loadu_ps((const float *)(const void *)row + k);
    }
}

/* osp_cpu_dot16_avx512's fold */
TGT_512 static FORCE_INLINE float fold512(__m512 acc) {
    const __m256 lo = _mm512_castps512_ps256(acc);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    const __m256 t8 = _mm256_add_ps(lo, hi);
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

/* One step of a one-token tile: ask for the `step` bytes FG_PREFETCH past this step's (the tile's rows
 * are contiguous, so the tile streams one region; an address past the matrix is harmless). */
static FORCE_INLINE void prefetch_ahead(const uint8_t **pf, int64_t step) {
    for (int64_t l = 0; l < step; l += 64) _mm_prefetch((const char *)(*pf + l), _MM_HINT_T1);
    *pf += step;
}

/* nr rows (ws bytes apart) x nt tokens (x rows K floats apart) -> y[t * ldy + r]. */
TGT_512 static FORCE_INLINE void tile512(int kind, int nr, int nt, const uint8_t *w, size_t ws, const float *x,
                                         int64_t K, float *y, int64_t ldy) {
    __m512 acc[FG_ROWS][FG_TOKENS512];
#pragma GCC unroll 6
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 6
        for (int t = 0; t < nt; t++) acc[r][t] = _mm512_setzero_ps();
    /* one token (a decode step): the rows stream from memory once, so they are prefetched */
    const int64_t step = (int64_t)nr * (kind == W_F32 ? 4 : 2) * 16;
    const uint8_t *pf = w + FG_PREFETCH;
    for (int64_t k = 0; k < K; k += 16) {
        if (nt == 1) prefetch_ahead(&pf, step);
        __m512 wv[FG_ROWS];
#pragma GCC unroll 6
        for (int r = 0; r < nr; r++) {
            wv[r] = load512(kind, w + (size_t)r * ws, k);
            __asm__("" : "+v"(wv[r])); /* one load each, kept in a register */
        }
#pragma GCC unroll 6
        for (int t = 0; t < nt; t++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)t * (size_t)K + k);
            __asm__("" : "+v"(xv)); /* likewise (else GCC folds it into every multiply: 4x the loads) */
#pragma GCC unroll 6
            for (int r = 0; r < nr; r++) acc[r][t] = _mm512_add_ps(acc[r][t], _mm512_mul_ps(wv[r], xv));
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 6
        for (int t = 0; t < nt; t++) y[(size_t)t * (size_t)ldy + (size_t)r] = fold512(acc[r][t]);
}

/* ---- AVX2: the low 8 lanes through all of K, then the high 8, then osp_cpu_dot's fold ------------ */

TGT_AVX2 static FORCE_INLINE __m256 load256(int kind, const uint8_t *row, int64_t k) {
    switch (kind) {
    case W_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * k)));
    case W_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * k))), 16));
    default: return _mm256_loadu_ps((const float *)(const void *)row + k);
    }
}

TGT_AVX2 static FORCE_INLINE void tile256(int kind, int nr, int nt, const uint8_t *w, size_t ws, const float *x,
                                          int64_t K, float *y, int64_t ldy) {
    __m256 half[2][FG_ROWS][2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m256 acc[FG_ROWS][2];
#pragma GCC unroll 6
        for (int r = 0; r < nr; r++)
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++) acc[r][t] = _mm256_setzero_ps();
        const int64_t step = (int64_t)nr * (kind == W_F32 ? 4 : 2) * 16;
        const uint8_t *pf = w + FG_PREFETCH;
        for (int64_t k = 8 * h; k < K; k += 16) {
            if (nt == 1 && h == 0) prefetch_ahead(&pf, step); /* as tile512's */
            __m256 wv[FG_ROWS];
#pragma GCC unroll 6
            for (int r = 0; r < nr; r++) {
                wv[r] = load256(kind, w + (size_t)r * ws, k);
                __asm__("" : "+v"(wv[r]));
            }
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++) {
                __m256 xv = _mm256_loadu_ps(x + (size_t)t * (size_t)K + k);
                __asm__("" : "+v"(xv));
#pragma GCC unroll 6
                for (int r = 0; r < nr; r++) acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_mul_ps(wv[r], xv));
            }
        }
#pragma GCC unroll 6
        for (int r = 0; r < nr; r++)
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++) half[h][r][t] = acc[r][t];
    }
#pragma GCC unroll 6
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 2
        for (int t = 0; t < nt; t++) {
            const __m256 t8 = _mm256_add_ps(half[0][r][t], half[1][r][t]);
            const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
            const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
            y[(size_t)t * (size_t)ldy + (size_t)r] = _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
        }
}

/* One function per (ISA, kind, rows, tokens): the loops above unroll into registers. */
typedef void (*tile_fn)(const uint8_t *w, size_t ws, const float *x, int64_t K, float *y, int64_t ldy);

#define TILE_FN(isa, tgt, KIND, NR, NT)                                                                       \
    tgt static void fg##isa##_##KIND##_##NR##x##NT(const uint8_t *w, size_t ws, const float *x, int64_t K, float *y, \
                                               int64_t ldy) {                                                 \
        tile##isa(KIND, NR, NT, w, ws, x, K, y, ldy);                                                          \
    }
#define TILE_ROWS4(isa, tgt, KIND, NT) \
    TILE_FN(isa, tgt, KIND, 1, NT) TILE_FN(isa, tgt, KIND, 2, NT) TILE_FN(isa, tgt, KIND, 3, NT) TILE_FN(isa, tgt, KIND, 4, NT)
#define TILES512(KIND) \
    TILE_ROWS4(512, TGT_512, KIND, 1) TILE_ROWS4(512, TGT_512, KIND, 2) TILE_ROWS4(512, TGT_512, KIND, 3) TILE_ROWS4(512, TGT_512, KIND, 4) \
    TILE_ROWS4(512, TGT_512, KIND, 5) TILE_ROWS4(512, TGT_512, KIND, 6)
#define TILES256(KIND) TILE_ROWS4(256, TGT_AVX2, KIND, 1) TILE_ROWS4(256, TGT_AVX2, KIND, 2)
TILES512(W_F32)
TILES512(W_F16)
TILES512(W_BF16)
TILES256(W_F32)
TILES256(W_F16)
TILES256(W_BF16)

#define ROW_TABLE(isa, KIND, NT) {fg##isa##_##KIND##_1x##NT, fg##isa##_##KIND##_2x##NT, fg##isa##_##KIND##_3x##NT, fg##isa##_##KIND##_4x##NT}
/* [kind][tokens - 1][rows - 1] */
#define TOKEN_TABLE(KIND) \
    {ROW_TABLE(512, KIND, 1), ROW_TABLE(512, KIND, 2), ROW_TABLE(512, KIND, 3), ROW_TABLE(512, KIND, 4), \
     ROW_TABLE(512, KIND, 5), ROW_TABLE(512, KIND, 6)}
static const tile_fn g_tiles512[W_PANEL_KINDS][FG_TOKENS512][FG_ROWS] = {TOKEN_TABLE(W_F32), TOKEN_TABLE(W_F16), TOKEN_TABLE(W_BF16)};
static const tile_fn g_tiles256[W_PANEL_KINDS][FG_TOKENS512][FG_ROWS] = {
    {ROW_TABLE(256, W_F32, 1), ROW_TABLE(256, W_F32, 2)},
    {ROW_TABLE(256, W_F16, 1), ROW_TABLE(256, W_F16, 2)},
    {ROW_TABLE(256, W_BF16, 1), ROW_TABLE(256, W_BF16, 2)},
};

/* Rows [0, nrows) of a block (rows ws bytes apart from w) against all n_tokens tokens, `tt` tokens per
 * tile: token groups outer, so a group's vectors stay in L1 while the block's rows (L2) pass. */
static void block_tiles(const tile_fn (*tiles)[FG_ROWS], int tt, const uint8_t *w, size_t ws, int64_t nrows,
                        const float *x, int64_t K, int64_t n_tokens, float *y, int64_t ldy) {
    for (int64_t t = 0; t < n_tokens; t += tt) {
        const int nt = (int)(n_tokens - t < tt ? n_tokens - t : tt);
        for (int64_t r = 0; r < nrows; r += FG_ROWS) {
            const int nr = (int)(nrows - r < FG_ROWS ? nrows - r : FG_ROWS);
            tiles[nt - 1][nr - 1](w + (size_t)r * ws, ws, x + (size_t)t * (size_t)K, K, y + (size_t)t * (size_t)ldy + r, ldy);
        }
    }
}
#endif

void osp_cpu_fgemm_rows(const osp_weight *w, const float *x, float *y, int64_t ldy, int64_t n_tokens, int64_t r0,
                        int64_t r1, float *panel) {
#ifdef OSP_X86
    const int64_t K = w->cols;
    const osp_qdot_isa_kind isa = osp_qdot_isa_family();
    if (K % 16 == 0 && K > 0 && isa != OSP_QDOT_ISA_SCALAR) {
        const tile_fn(*set)[FG_TOKENS512][FG_ROWS] = isa == OSP_QDOT_ISA_VNNI ? g_tiles512 : g_tiles256;
        const int tt = isa == OSP_QDOT_ISA_VNNI ? FG_TOKENS512 : 2;
        const uint8_t *base = w->data;
        int kind = -1; /* in place, or -1: through the panel */
        if (!w->round_bf16) kind = w->type == OSP_DTYPE_F32 ? W_F32 : w->type == OSP_DTYPE_F16 ? W_F16
                                 : w->type == OSP_DTYPE_BF16 ? W_BF16 : -1;
        if (kind > W_F32 && n_tokens > FG_WIDEN_MAX_TOKENS) kind = -1;
        if (kind >= 0) {
            int64_t rb = FG_BLOCK / (K * (int64_t)sizeof(float)) / FG_ROWS * FG_ROWS;
            if (rb < FG_ROWS) rb = FG_ROWS;
            for (int64_t r = r0; r < r1; r += rb) {
                const int64_t n = r1 - r < rb ? r1 - r : rb;
                block_tiles(set[kind], tt, base + (size_t)r * w->row_bytes, w->row_bytes, n, x, K, n_tokens, y + r, ldy);
            }
            return;
        }
        int64_t rb = osp_cpu_fgemm_panel_floats(K) / K / FG_ROWS * FG_ROWS;
        if (rb < FG_ROWS) rb = FG_ROWS; /* the panel holds at least FG_ROWS rows */
        for (int64_t r = r0; r < r1; r += rb) {
            const int64_t n = r1 - r < rb ? r1 - r : rb;
            for (int64_t i = 0; i < n; i++) {
                float *pr = panel + (size_t)i * (size_t)K;
                osp_dequant_row(w->type, base + (size_t)(r + i) * w->row_bytes, pr, K);
                if (w->round_bf16) osp_cpu_round_bf16(pr, K);
            }
            block_tiles(set[W_F32], tt, (const uint8_t *)panel, (size_t)K * sizeof(float), n, x, K, n_tokens, y + r, ldy);
        }
        return;
    }
#endif
    osp_cpu_matmul_rows(w, x, y, ldy, n_tokens, r0, r1, panel);
}

/* ---- BF16 weights x bf16-rounded activations (VDPBF16PS), the one-level mode's path ------------- */

#ifdef OSP_X86
#define TGT_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define BF_TOKENS 6

/* nr rows x nt tokens; xb: the tokens' rows already in bf16, K apart. Lane j of (row, token) adds, per
 * 32 values from k, the pair (k + 2j, k + 2j + 1) by one VDPBF16PS, then fold512. */
TGT_BF16 static FORCE_INLINE void tilebf(int nr, int nt, const uint8_t *w, size_t ws, const uint16_t *xb, int64_t K,
                                          float *y, int64_t ldy) {
    __m512 acc[FG_ROWS][BF_TOKENS];
#pragma GCC unroll 6
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 6
        for (int t = 0; t < nt; t++) acc[r][t] = _mm512_setzero_ps();
    const int64_t step = (int64_t)nr * 64; /* bytes of the rows a step reads */
    const uint8_t *pf = w + FG_PREFETCH;
    for (int64_t k = 0; k < K; k += 32) {
        if (nt == 1) prefetch_ahead(&pf, step); /* as tile512's */
        __m512i wv[FG_ROWS];
#pragma GCC unroll 6
        for (int r = 0; r < nr; r++) {
            wv[r] = _mm512_loadu_si512((const void *)(w + (size_t)r * ws + 2 * (size_t)k));
            __asm__("" : "+v"(wv[r]));
        }
#pragma GCC unroll 6
        for (int t = 0; t < nt; t++) {
            __m512i xv = _mm512_loadu_si512((const void *)(xb + (size_t)t * (size_t)K + k));
            __asm__("" : "+v"(xv));
#pragma GCC unroll 6
            for (int r = 0; r < nr; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)wv[r], (__m512bh)xv);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 6
        for (int t = 0; t < nt; t++) y[(size_t)t * (size_t)ldy + (size_t)r] = fold512(acc[r][t]);
}

typedef void (*tilebf_fn)(const uint8_t *w, size_t ws, const uint16_t *xb, int64_t K, float *y, int64_t ldy);
#define TILEBF_FN(NR, NT)                                                                                   \
    TGT_BF16 static void fgbf_##NR##x##NT(const uint8_t *w, size_t ws, const uint16_t *xb, int64_t K, float *y, \
                                         int64_t ldy) {                                                    \
        tilebf(NR, NT, w, ws, xb, K, y, ldy);                                                               \
    }
#define TILEBF_ROWS(NT) TILEBF_FN(1, NT) TILEBF_FN(2, NT) TILEBF_FN(3, NT) TILEBF_FN(4, NT)
TILEBF_ROWS(1) TILEBF_ROWS(2) TILEBF_ROWS(3) TILEBF_ROWS(4) TILEBF_ROWS(5) TILEBF_ROWS(6)
#define BF_ROW_TABLE(NT) {fgbf_1x##NT, fgbf_2x##NT, fgbf_3x##NT, fgbf_4x##NT}
static const tilebf_fn g_tilesbf[BF_TOKENS][FG_ROWS] = {BF_ROW_TABLE(1), BF_ROW_TABLE(2), BF_ROW_TABLE(3),
                                                        BF_ROW_TABLE(4), BF_ROW_TABLE(5), BF_ROW_TABLE(6)};

/* n rows of K floats -> bf16, round to nearest even (VCVTNE2PS2BF16: NaN stays NaN). */
TGT_BF16 static void to_bf16(const float *x, int64_t n, int64_t K, uint16_t *out) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < K; k += 32) {
            const float *p = x + (size_t)i * (size_t)K + k;
            const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
            _mm512_storeu_si512((void *)(out + (size_t)i * (size_t)K + k), (__m512i)b);
        }
}

static int g_bf16 = -1; /* the CPU has AVX512-BF16 (asked once) */
#endif

bool osp_cpu_fgemm_bf16_ok(const osp_weight *w) {
#ifdef OSP_X86
    if (g_bf16 < 0) {
        __builtin_cpu_init();
        g_bf16 = __builtin_cpu_supports("avx512bf16") ? 1 : 0;
    }
    return g_bf16 && osp_qdot_isa_family() == OSP_QDOT_ISA_VNNI && w->type == OSP_DTYPE_BF16 && !w->round_bf16 &&
           w->cols > 0 && w->cols % 32 == 0 && BF_TOKENS * w->cols * 2 <= osp_cpu_fgemm_panel_floats(w->cols) * 4;
#else
    (void)w;
    return false;
#endif
}

void osp_cpu_fgemm_bf16_rows(const osp_weight *w, const float *x, float *y, int64_t ldy, int64_t n_tokens, int64_t r0,
                             int64_t r1, float *panel) {
#ifdef OSP_X86
    const int64_t K = w->cols;
    uint16_t *xb = (uint16_t *)(void *)panel; /* a token group's rows in bf16 */
    int64_t rb = FG_BLOCK / (K * 2) / FG_ROWS * FG_ROWS; /* 256 KB of bf16 rows a block */
    if (rb < FG_ROWS) rb = FG_ROWS;
    const uint8_t *base = w->data;
    for (int64_t r = r0; r < r1; r += rb) {
        const int64_t nrows = r1 - r < rb ? r1 - r : rb;
        const uint8_t *wb = base + (size_t)r * w->row_bytes;
        for (int64_t t = 0; t < n_tokens; t += BF_TOKENS) {
            const int nt = (int)(n_tokens - t < BF_TOKENS ? n_tokens - t : BF_TOKENS);
            to_bf16(x + (size_t)t * (size_t)K, nt, K, xb);
            for (int64_t i = 0; i < nrows; i += FG_ROWS) {
                const int nr = (int)(nrows - i < FG_ROWS ? nrows - i : FG_ROWS);
                g_tilesbf[nt - 1][nr - 1](wb + (size_t)i * w->row_bytes, w->row_bytes, xb, K,
                                          y + (size_t)t * (size_t)ldy + r + i, ldy);
            }
        }
    }
#else
    (void)w, (void)x, (void)y, (void)ldy, (void)n_tokens, (void)r0, (void)r1, (void)panel;
#endif
}
