/* Where the GPU sampler's time goes, from a profiling build of sample.cu (OSPREY_SAMPLE_PHASES: clock64
 * marks in the finisher, globaltimer marks around the sliced passes' CTAs): one setting of
 * sample_bench's logits at batch B, one call after warm-up. Prints the scan and select passes' spans
 * (first CTA start to last CTA end) and mean CTA time, and the finisher's phases (preamble, gather of the
 * slices' lists, the draw, the rest) averaged over rows, with U's size and the path taken.
 * Built and run by bench/gpu/sample_phases.sh (not by CMake: it needs sample.cu compiled with the macro).
 * Usage: sample_phases LOGITS_FILE vocab B top_k top_p [temperature] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sample.h"

void osp_cuda_sample_phases(long long *fin, long long *cta);
void osp_cuda_sample_phases_clear(void);
int osp_cuda_sample_phases_clock_khz(void);

static long long fin[256][16], cta[2][8192][4];

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if ((x) != OSP_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, osp_last_error());                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: sample_phases LOGITS_FILE vocab B top_k top_p [temperature]\n");
        return 2;
    }
    const int32_t vocab = atoi(argv[2]), B = atoi(argv[3]), k = atoi(argv[4]);
    const float p = (float)atof(argv[5]), t = argc > 6 ? (float)atof(argv[6]) : 1.0f;
    if (vocab <= 0 || B <= 0 || B > 256) return 2;
    const size_t n = (size_t)B * (size_t)vocab;
    float *h = malloc(n * sizeof(float));
    FILE *f = fopen(argv[1], "rb");
    if (!h || !f || fread(h, sizeof(float), n, f) != n) {
        fprintf(stderr, "sample_phases: cannot read %zu logits from %s\n", n, argv[1]);
        return 1;
    }
    fclose(f);
    void *stream, *d_logits, *d_rows, *d_scratch, *d_tok, *d_st;
    CHECK(osp_cuda_stream_create(&stream));
    CHECK(osp_cuda_malloc(&d_logits, n * sizeof(float), "logits"));
    CHECK(osp_cuda_malloc(&d_rows, (size_t)B * sizeof(osp_cuda_sample_row), "rows"));
    const size_t scratch = osp_cuda_sample_scratch_bytes(B, vocab);
    CHECK(osp_cuda_malloc(&d_scratch, scratch, "scratch"));
    CHECK(osp_cuda_malloc(&d_tok, (size_t)B * sizeof(int32_t), "tokens"));
    CHECK(osp_cuda_malloc(&d_st, (size_t)B * sizeof(osp_status), "status"));
    CHECK(osp_cuda_h2d(d_logits, h, n * sizeof(float), stream));
    CHECK(osp_cuda_memset(d_scratch, 0, scratch, stream));
    osp_cuda_sample_row rows[256];
    memset(rows, 0, sizeof rows);
    for (int r = 0; r < B; r++) {
        rows[r].temperature = t, rows[r].top_p = p, rows[r].top_k = k, rows[r].repetition_penalty = 1.0f;
        rows[r].num_logprobs = -1, rows[r].seed = 1000 + (uint64_t)r, rows[r].output_pos = 7 + (uint64_t)r;
        rows[r].logits_row = r;
    }
    CHECK(osp_cuda_h2d(d_rows, rows, (size_t)B * sizeof rows[0], stream));
    for (int i = 0; i < 5; i++)
        CHECK(osp_cuda_sample(d_logits, vocab, d_rows, B, NULL, NULL, NULL, d_scratch, d_tok, d_st, NULL, stream));
    CHECK(osp_cuda_stream_sync(stream));
    osp_cuda_sample_phases_clear();
    CHECK(osp_cuda_sample(d_logits, vocab, d_rows, B, NULL, NULL, NULL, d_scratch, d_tok, d_st, NULL, stream));
    CHECK(osp_cuda_stream_sync(stream));
    osp_cuda_sample_phases(&fin[0][0], &cta[0][0][0]);
    const double khz = osp_cuda_sample_phases_clock_khz();
    printf("B %d top_k %d top_p %.2f T %.2f\n", B, k, p, t);
    static const char *pass[2] = {"scan (one launch: to the row barrier's exit)", "select"};
    for (int q = 0; q < 2; q++) {
        long long lo = 0, hi = 0, sum = 0;
        int m = 0;
        for (int c = 0; c < 8192; c++)
            if (cta[q][c][0] && cta[q][c][1]) {
                if (!m || cta[q][c][0] < lo) lo = cta[q][c][0];
                if (cta[q][c][1] > hi) hi = cta[q][c][1];
                sum += cta[q][c][1] - cta[q][c][0];
                m++;
            }
        if (m) printf("  %-46s %5d CTAs, span %8.1f us, mean CTA %7.2f us\n", pass[q], m, (hi - lo) / 1e3, sum / 1e3 / m);
    }
    { /* select's first slice a CTA: weights and their aggregate, the list threshold, the rest */
        double w = 0, th = 0, rest = 0;
        int m = 0;
        for (int c = 0; c < 8192; c++)
            if (cta[1][c][0] && cta[1][c][1] && cta[1][c][2] && cta[1][c][3]) {
                w += (double)(cta[1][c][2] - cta[1][c][0]), th += (double)(cta[1][c][3] - cta[1][c][2]);
                rest += (double)(cta[1][c][1] - cta[1][c][3]);
                m++;
            }
        if (m)
            printf("  select, first slice of a CTA (mean): weights + aggregate %.2f us, list threshold %.2f us, "
                   "the rest of the CTA %.2f us\n", w / 1e3 / m, th / 1e3 / m, rest / 1e3 / m);
    }
    double ph[4] = {0}, nu = 0, rd = 0, sub[4] = {0};
    int msub = 0;
    int paths[5] = {0}, m = 0;
    for (int r = 0; r < B && r < 256; r++) {
        const long long *e = fin[r];
        paths[e[6] >= 0 && e[6] < 5 ? e[6] : 0]++;
        if (e[6] != 1 && e[6] != 2) continue;
        ph[0] += (double)(e[1] - e[0]), ph[1] += (double)(e[2] - e[1]), ph[2] += (double)(e[3] - e[2]);
        ph[3] += (double)(e[4] - e[3]), nu += (double)e[5], rd += (double)e[7];
        m++;
        if (e[8] && e[9] && e[10] && e[11]) { /* top-k with top-p on U: the draw's parts */
            sub[0] += (double)(e[11] - e[2]), sub[1] += (double)(e[8] - e[11]), sub[2] += (double)(e[9] - e[8]);
            sub[3] += (double)(e[10] - e[9]);
            msub++;
        }
    }
    printf("  finisher paths: greedy/failed %d, U on a warp %d, U on the block %d, one draw %d, one block %d\n",
           paths[0], paths[1], paths[2], paths[3], paths[4]);
    if (m)
        printf("  finisher (rows over U, mean): preamble %.2f us, gather %.2f us, draw %.2f us, rest %.2f us; U %.0f, "
               "rounds %.2f\n",
               ph[0] / m / khz * 1e3, ph[1] / m / khz * 1e3, ph[2] / m / khz * 1e3, ph[3] / m / khz * 1e3, nu / m,
               rd / m);
    if (msub)
        printf("  draw's parts (mean): top-k select level 0 + compaction %.2f us, levels 1-2 %.2f us, aggregate "
               "%.2f us, round 0's draw %.2f us\n",
               sub[0] / msub / khz * 1e3, sub[1] / msub / khz * 1e3, sub[2] / msub / khz * 1e3,
               sub[3] / msub / khz * 1e3);
    return 0;
}
