/* The GPU sampler alone (src/backend/cuda/sample.cu, issue 17's sampling row): osp_cuda_sample on
 * [B, vocab] fp32 logits for B = 1, 8, 32, 128, 256 and a few sampler settings, timed with events
 * around `reps` back-to-back calls after 5 warm-up calls (the device's time per call, not the
 * enqueue's). Logits: a language-model-like row per batch entry (a Gaussian body, sd ~1.7, and about
 * 300 head tokens raised by 6..12, as test_gpu_sampler's large-vocabulary rows), written to
 * LOGITS_FILE (default /tmp/sample_logits.bin, [256, vocab] fp32) so bench/gpu/sample_torch.py times
 * PyTorch on the same values. Every row has its own seed and output position, fixed across calls.
 * One JSON line per (setting, B): {"sampler":"osprey","setting":...,"batch":B,"us":...}.
 * Usage: sample_bench [vocab reps]; SAMPLE_SETTINGS=i,j,... (indices into SETTINGS) and SAMPLE_BATCHES=b,...
 * (of the batch sizes above) run only those, e.g. under ncu. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sample.h"

bool osp_cuda_pdl_enabled(void); /* runtime.cu (cuda_common.cuh declares it for the kernels) */

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        osp_status s_ = (x);                                                                       \
        if (s_ != OSP_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, osp_last_error());                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { MAX_B = 256 };

/* splitmix64 -> [0, 1) */
static double uni(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t z = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c * 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct setting {
    const char *name;
    float t, p, minp;
    int32_t k;
} setting;

static const setting SETTINGS[] = {
    {"top_k=50 top_p=0.9", 1.0f, 0.9f, 0.0f, 50},
    {"greedy", 0.0f, 1.0f, 0.0f, 0},
    {"T=1 (plain)", 1.0f, 1.0f, 0.0f, 0},
    {"top_k=40 top_p=0.95 min_p=0.05 (llama.cpp defaults)", 0.8f, 0.95f, 0.05f, 40},
    {"top_p=0.9", 1.0f, 0.9f, 0.0f, 0},
    {"top_k=50", 1.0f, 1.0f, 0.0f, 50},
};

/* Whether v is one of the comma-separated integers in list. */
static int listed(const char *list, int v) {
    for (const char *p = list; *p;) {
        char *end;
        const long x = strtol(p, &end, 10);
        if (end == p) return 0;
        if (x == v) return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

int main(int argc, char **argv) {
    const int32_t vocab = argc > 1 ? atoi(argv[1]) : 128256;
    const int reps = argc > 2 ? atoi(argv[2]) : 200;
    if (vocab <= 0 || reps <= 0) {
        fprintf(stderr, "usage: sample_bench [vocab reps]\n");
        return 2;
    }
    const char *path = getenv("LOGITS_FILE") ? getenv("LOGITS_FILE") : "/tmp/sample_logits.bin";
    const size_t n = (size_t)MAX_B * (size_t)vocab;
    float *h = malloc(n * sizeof(float));
    if (!h) return 1;
    const double head = (vocab / 8 < 300 ? vocab / 8 : 300) / (double)vocab;
    for (int r = 0; r < MAX_B; r++)
        for (int32_t i = 0; i < vocab; i++) {
            double s = 0.0;
            for (uint64_t j = 0; j < 4; j++) s += uni((uint64_t)r + 11, (uint64_t)i, j);
            s = (s - 2.0) * 1.7;
            if (uni((uint64_t)r + 11, (uint64_t)i, 4) < head) s += 6.0 + 6.0 * uni((uint64_t)r + 11, (uint64_t)i, 5);
            h[(size_t)r * (size_t)vocab + (size_t)i] = (float)s;
        }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(h, sizeof(float), n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "sample_bench: cannot write %s\n", path);
        return 1;
    }
    void *stream, *ev0, *ev1, *d_logits, *d_rows, *d_scratch, *d_tok, *d_st;
    CHECK(osp_cuda_stream_create(&stream));
    CHECK(osp_cuda_event_create(&ev0));
    CHECK(osp_cuda_event_create(&ev1));
    const size_t scratch = osp_cuda_sample_scratch_bytes(MAX_B, vocab);
    CHECK(osp_cuda_malloc(&d_logits, n * sizeof(float), "logits"));
    CHECK(osp_cuda_malloc(&d_rows, MAX_B * sizeof(osp_cuda_sample_row), "rows"));
    CHECK(osp_cuda_malloc(&d_scratch, scratch, "scratch"));
    CHECK(osp_cuda_malloc(&d_tok, MAX_B * sizeof(int32_t), "tokens"));
    CHECK(osp_cuda_malloc(&d_st, MAX_B * sizeof(osp_status), "status"));
    CHECK(osp_cuda_h2d(d_logits, h, n * sizeof(float), stream));
    CHECK(osp_cuda_memset(d_scratch, 0, scratch, stream));
    fprintf(stderr, "sample_bench: vocab %d, %d calls a figure, scratch %.1f MiB for %d rows, PDL %s\n", vocab, reps,
            scratch / 1048576.0, MAX_B, osp_cuda_pdl_enabled() ? "on" : "off");
    static const int batches[] = {1, 8, 32, 128, 256};
    const char *only_s = getenv("SAMPLE_SETTINGS"), *only_b = getenv("SAMPLE_BATCHES");
    for (size_t si = 0; si < sizeof SETTINGS / sizeof SETTINGS[0]; si++) {
        const setting *S = &SETTINGS[si];
        if (only_s && !listed(only_s, (int)si)) continue;
        osp_cuda_sample_row rows[MAX_B];
        memset(rows, 0, sizeof rows);
        for (int r = 0; r < MAX_B; r++) {
            rows[r].temperature = S->t, rows[r].top_p = S->p, rows[r].min_p = S->minp, rows[r].top_k = S->k;
            rows[r].repetition_penalty = 1.0f;
            rows[r].num_logprobs = -1;
            rows[r].seed = 1000 + (uint64_t)r;
            rows[r].output_pos = 7 + (uint64_t)r;
            rows[r].logits_row = r;
        }
        CHECK(osp_cuda_h2d(d_rows, rows, sizeof rows, stream));
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            const int B = batches[bi];
            if (only_b && !listed(only_b, B)) continue;
            for (int i = 0; i < 5; i++)
                CHECK(osp_cuda_sample(d_logits, vocab, d_rows, B, NULL, NULL, NULL, d_scratch, d_tok, d_st, NULL,
                                      stream));
            CHECK(osp_cuda_stream_sync(stream));
            CHECK(osp_cuda_event_record(ev0, stream));
            for (int i = 0; i < reps; i++)
                CHECK(osp_cuda_sample(d_logits, vocab, d_rows, B, NULL, NULL, NULL, d_scratch, d_tok, d_st, NULL,
                                      stream));
            CHECK(osp_cuda_event_record(ev1, stream));
            CHECK(osp_cuda_stream_sync(stream));
            float ms;
            CHECK(osp_cuda_event_elapsed_ms(ev0, ev1, &ms));
            int32_t tok[MAX_B];
            osp_status st[MAX_B];
            CHECK(osp_cuda_d2h(tok, d_tok, sizeof(int32_t) * (size_t)B, stream));
            CHECK(osp_cuda_d2h(st, d_st, sizeof(osp_status) * (size_t)B, stream));
            CHECK(osp_cuda_stream_sync(stream));
            for (int r = 0; r < B; r++)
                if (st[r] != OSP_OK || tok[r] < 0 || tok[r] >= vocab) {
                    fprintf(stderr, "sample_bench: %s B=%d row %d: status %d token %d\n", S->name, B, r, (int)st[r],
                            tok[r]);
                    return 1;
                }
            printf("{\"sampler\": \"osprey\", \"setting\": \"%s\", \"batch\": %d, \"vocab\": %d, \"us\": %.2f, "
                   "\"token0\": %d}\n",
                   S->name, B, vocab, 1000.0 * ms / reps, tok[0]);
            fflush(stdout);
        }
    }
    free(h);
    return 0;
}
