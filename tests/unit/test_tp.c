/* Tensor parallelism on the CPU backend (osp_model_params.tensor_parallel_size, the local communicator of
 * src/backend/comm.h), the sharding math issue 22 asks CI to hold without several GPUs:
 *   - the communicator sums in rank order (every rank the same bits, whatever the threads' timing), refuses
 *     ranks that disagree on the length, and an abort wakes every waiting rank with an error (no hang);
 *   - a model split over 2 ranks, each rank's forward on its own thread, gives the logits of the whole
 *     model within fp32 rounding (exact mode: only the order of the row-parallel sums differs) and its
 *     greedy tokens, on llama (F32, Q8_0: the split columns are whole Q8_0 blocks) and qwen2 (q/k/v biases),
 *     for a prompt and one-token decode steps over the ranks' own KV caches (their KV heads only); every rank
 *     gets the same logits bit for bit (the all-reduce hands each the same sum);
 *   - the all-gather joins the ranks' columns (uneven shares) in rank order, and the lm_head is split by
 *     vocabulary rows with the logits gathered (every split test runs it);
 *   - an n_ff of three Q8_0 blocks splits 32 + 64 over 2 ranks (whole blocks, unequal shares);
 *   - 4 ranks over 2 KV heads copy each KV head to the ranks whose query heads read it (F32 llama, qwen3);
 *   - one model that drives its ranks on threads of its own (no communicator given) looks like any model to
 *     its caller (one model, one KV cache holding the ranks' caches) and gives the same bits;
 *   - the engine with tensor_parallel_size 2 gives the unsplit engine's greedy tokens for a batch of requests,
 *     and each request alone what it gets in the batch;
 *   - the rank's config is its share (n_head, n_head_kv, n_ff divided), and shapes that do not split, a
 *     missing communicator, a rank out of range, the GPU and QuantSpec's draft weights are refused with a
 *     message. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/comm.h"
#include "model/model_exec.h"
#include "osprey/engine.h"
#include "osprey/model.h"

static const char *g_root;

enum { NB = 8, BS = 16, N_PROMPT = 9, N_DECODE = 4, MAX_RANKS = 4 };

/* ---- the communicator ------------------------------------------------------------------------------ */

typedef struct comm_job {
    osp_comm *c;
    int32_t rank, n, calls;
    float *buf;
    osp_status st;
} comm_job;

/* rank r's element i in call k (one function for the workers and the expected sums: the same bits under any
 * compiler's contraction of the expression) */
static float value(int32_t r, int32_t i, int32_t k) { return (float)(r + 1) * 0.1f + (float)i * 1e-3f + (float)k; }

static void *comm_worker(void *arg) {
    comm_job *j = arg;
    j->st = OSP_OK;
    for (int32_t k = 0; k < j->calls && j->st == OSP_OK; k++) {
        for (int32_t i = 0; i < j->n; i++) j->buf[i] = value(j->rank, i, k);
        j->st = osp_comm_all_reduce_f32(j->c, j->rank, j->buf, j->n);
    }
    return NULL;
}

/* one all-reduce call without filling buf (which may be NULL: the rank's bad argument under test) */
static void *comm_worker_null_ok(void *arg) {
    comm_job *j = arg;
    j->st = osp_comm_all_reduce_f32(j->c, j->rank, j->buf, j->n);
    return NULL;
}

static void test_comm_sum(void **state) {
    (void)state;
    for (int32_t world = 1; world <= MAX_RANKS; world++) {
        osp_comm *c;
        assert_int_equal(osp_comm_local_create(world, &c), OSP_OK);
        assert_int_equal(osp_comm_world(c), world);
        const int32_t n = 1000;
        comm_job jobs[MAX_RANKS];
        pthread_t th[MAX_RANKS];
        for (int32_t r = 0; r < world; r++) {
            jobs[r] = (comm_job){.c = c, .rank = r, .n = n, .calls = 5, .buf = malloc(sizeof(float) * n)};
            assert_int_equal(pthread_create(&th[r], NULL, comm_worker, &jobs[r]), 0);
        }
        for (int32_t r = 0; r < world; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
        for (int32_t r = 0; r < world; r++) {
            assert_int_equal(jobs[r].st, OSP_OK);
            for (int32_t i = 0; i < n; i++) { /* the last call's sum, fp32 adds in rank order */
                float want = value(0, i, 4);
                for (int32_t q = 1; q < world; q++) want += value(q, i, 4);
                if (memcmp(&want, &jobs[r].buf[i], sizeof want) != 0)
                    fail_msg("%d ranks: rank %d element %d is %.9g, rank-order sum %.9g", world, r, i,
                             (double)jobs[r].buf[i], (double)want);
            }
            free(jobs[r].buf);
        }
        osp_comm_free(c);
    }
}

/* The all-gather: R rows of each rank's share (uneven: rank r has r + 1 columns, or a disagreeing share for
 * `bad`), joined side by side in rank order, the same bits on every rank; repeated calls reuse nothing. */
typedef struct gather_job {
    osp_comm *c;
    int32_t rank, rows, cols_r, cols, calls;
    float *src, *dst;
    osp_status st;
} gather_job;

static void *gather_worker(void *arg) {
    gather_job *j = arg;
    j->st = OSP_OK;
    for (int32_t k = 0; k < j->calls && j->st == OSP_OK; k++) {
        for (int32_t t = 0; t < j->rows; t++)
            for (int32_t i = 0; i < j->cols_r; i++) j->src[t * j->cols_r + i] = value(j->rank, t * 100 + i, k);
        j->st = osp_comm_all_gather_f32(j->c, j->rank, j->src, j->rows, j->cols_r, j->dst, j->cols);
    }
    return NULL;
}

static void test_comm_gather(void **state) {
    (void)state;
    for (int32_t world = 1; world <= MAX_RANKS; world++)
        for (int bad = 0; bad < (world > 1 ? 2 : 1); bad++) {
            osp_comm *c;
            assert_int_equal(osp_comm_local_create(world, &c), OSP_OK);
            const int32_t rows = 3, cols = world * (world + 1) / 2; /* shares 1, 2, .., world */
            gather_job jobs[MAX_RANKS];
            pthread_t th[MAX_RANKS];
            for (int32_t r = 0; r < world; r++) {
                const int32_t share = r + 1 + (bad && r == world - 1); /* bad: the shares sum past cols */
                jobs[r] = (gather_job){.c = c, .rank = r, .rows = rows, .cols_r = share, .cols = cols, .calls = 3,
                                       .src = malloc(sizeof(float) * (size_t)(rows * share)),
                                       .dst = malloc(sizeof(float) * (size_t)(rows * cols + 1))};
                assert_int_equal(pthread_create(&th[r], NULL, gather_worker, &jobs[r]), 0);
            }
            for (int32_t r = 0; r < world; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
            for (int32_t r = 0; r < world; r++) {
                if (bad) { /* shares that do not sum to cols: every rank gets the error, none hangs */
                    assert_int_equal(jobs[r].st, OSP_ERR_INVALID_ARG);
                } else {
                    assert_int_equal(jobs[r].st, OSP_OK);
                    for (int32_t t = 0; t < rows; t++)
                        for (int32_t q = 0, off = 0; q < world; off += q + 1, q++)
                            for (int32_t i = 0; i <= q; i++) {
                                const float want = value(q, t * 100 + i, 2), got = jobs[r].dst[t * cols + off + i];
                                if (memcmp(&want, &got, sizeof want) != 0)
                                    fail_msg("%d ranks: rank %d row %d column %d is %.9g, rank %d's %.9g", world, r, t,
                                             off + i, (double)got, q, (double)want);
                            }
                }
                free(jobs[r].src);
                free(jobs[r].dst);
            }
            osp_comm_free(c);
        }
}

static void test_comm_errors(void **state) {
    (void)state;
    osp_comm *c;
    assert_int_equal(osp_comm_local_create(0, &c), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_comm_local_create(65, &c), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_comm_local_create(2, &c), OSP_OK);
    float x[4] = {0};
    assert_int_equal(osp_comm_all_reduce_f32(c, 2, x, 4), OSP_ERR_INVALID_ARG); /* not a rank: returns alone */
    /* ranks that disagree on the length: both get the error, neither hangs */
    comm_job a = {.c = c, .rank = 0, .n = 3, .calls = 1, .buf = malloc(sizeof(float) * 4)};
    comm_job b = {.c = c, .rank = 1, .n = 4, .calls = 1, .buf = malloc(sizeof(float) * 4)};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, comm_worker, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, comm_worker, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.st, OSP_ERR_INVALID_ARG);
    assert_int_equal(b.st, OSP_ERR_INVALID_ARG);
    /* one rank's own bad arguments (a NULL buffer, a negative length): it still meets the others (a
       collective: every rank calls), and all get the error, none waits forever */
    for (int k = 0; k < 2; k++) {
        comm_job nb = {.c = c, .rank = 1, .n = k ? -1 : 4, .calls = 1, .buf = k ? b.buf : NULL};
        a.n = 4;
        assert_int_equal(pthread_create(&ta, NULL, comm_worker_null_ok, &a), 0);
        assert_int_equal(pthread_create(&tb, NULL, comm_worker_null_ok, &nb), 0);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        assert_int_equal(a.st, OSP_ERR_INVALID_ARG);
        assert_int_equal(nb.st, OSP_ERR_INVALID_ARG);
    }
    /* the same for the all-gather: rank 1's share is wider than the whole */
    {
        float src[8] = {0}, dst0[8], dst1[8];
        gather_job g0 = {.c = c, .rank = 0, .rows = 1, .cols_r = 2, .cols = 4, .calls = 1, .src = src, .dst = dst0};
        gather_job g1 = {.c = c, .rank = 1, .rows = 1, .cols_r = 5, .cols = 4, .calls = 1, .src = src, .dst = dst1};
        assert_int_equal(pthread_create(&ta, NULL, gather_worker, &g0), 0);
        assert_int_equal(pthread_create(&tb, NULL, gather_worker, &g1), 0);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        assert_int_equal(g0.st, OSP_ERR_INVALID_ARG);
        assert_int_equal(g1.st, OSP_ERR_INVALID_ARG);
    }
    /* a rank that never comes: the abort wakes the one waiting */
    a.n = 4;
    assert_int_equal(pthread_create(&ta, NULL, comm_worker, &a), 0);
    osp_comm_abort(c);
    pthread_join(ta, NULL);
    assert_int_equal(a.st, OSP_ERR_INTERNAL);
    assert_int_equal(osp_comm_all_reduce_f32(c, 1, b.buf, 4), OSP_ERR_INTERNAL); /* stays aborted */
    free(a.buf);
    free(b.buf);
    osp_comm_free(c);
    osp_comm_free(NULL);
}

/* The watchdog: rank 1 never comes, nobody aborts; the waiting rank 0 gives up after the timeout with the
 * watchdog's error, and the communicator stays aborted for rank 1 too. Timeouts below 0 or not finite are
 * refused; 0 is none (the test does not wait on it). */
static void test_comm_watchdog(void **state) {
    (void)state;
    for (int which = 0; which < 2; which++) {
        osp_comm *c;
        assert_int_equal(osp_comm_local_create(2, &c), OSP_OK);
        assert_int_equal(osp_comm_set_timeout(c, -1.0), OSP_ERR_INVALID_ARG);
        assert_int_equal(osp_comm_set_timeout(c, NAN), OSP_ERR_INVALID_ARG);
        assert_int_equal(osp_comm_set_timeout(c, 0.0), OSP_OK);
        assert_int_equal(osp_comm_set_timeout(c, 1e30), OSP_OK); /* past a deadline's range: none */
        assert_int_equal(osp_comm_set_timeout(c, 0.05), OSP_OK);
        float buf[4] = {1, 2, 3, 4}, src[2] = {1, 2}, dst[4];
        const osp_status st = which == 0 ? osp_comm_all_reduce_f32(c, 0, buf, 4)
                                         : osp_comm_all_gather_f32(c, 0, src, 1, 2, dst, 4);
        assert_int_equal(st, OSP_ERR_INTERNAL);
        assert_non_null(strstr(osp_last_error(), "watchdog"));
        assert_int_equal(osp_comm_all_reduce_f32(c, 1, buf, 4), OSP_ERR_INTERNAL); /* stays aborted */
        assert_non_null(strstr(osp_last_error(), "watchdog"));
        osp_comm_free(c);
    }
    assert_int_equal(osp_comm_set_timeout(NULL, 1.0), OSP_ERR_INVALID_ARG);
}

/* ---- a model split over ranks ---------------------------------------------------------------------- */

/* A prompt of N_PROMPT tokens, then N_DECODE one-token steps of the greedy token; the last row's logits of
 * each forward, in order, into out [(1 + N_DECODE) x n_vocab]. On error the rank aborts the communicator
 * (the others' collectives return) and records it. */
typedef struct rank_job {
    osp_model *m;
    osp_comm *c; /* NULL: one rank */
    float *out;
    osp_status st;
} rank_job;

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void *run_rank(void *arg) {
    rank_job *j = arg;
    const int32_t V = osp_model_config_get(j->m)->n_vocab;
    osp_kv_cache *kv = NULL;
    j->st = osp_kv_cache_create(j->m, NB, BS, OSP_KV_DTYPE_F32, &kv);
    int32_t ids[N_PROMPT], pos[N_PROMPT], bt[NB];
    for (int i = 0; i < NB; i++) bt[i] = i;
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (i * 37 + 5) % V, pos[i] = i;
    int32_t next = 0;
    for (int step = 0; step <= N_DECODE && j->st == OSP_OK; step++) {
        const int32_t n = step == 0 ? N_PROMPT : 1, p0 = step == 0 ? 0 : N_PROMPT + step - 1;
        int32_t qsl[2] = {0, n}, sl[1] = {p0 + n}, li[1] = {n - 1}, one_id[1] = {next}, one_pos[1] = {p0};
        osp_batch b = {.num_tokens = n, .token_ids = step == 0 ? ids : one_id, .positions = step == 0 ? pos : one_pos,
                       .slot_mapping = step == 0 ? pos : one_pos, .num_seqs = 1, .query_start_loc = qsl,
                       .seq_lens = sl, .block_table = bt, .max_blocks_per_seq = NB, .num_logits = 1,
                       .logits_indices = li};
        float *lg = j->out + (size_t)step * (size_t)V;
        j->st = osp_model_forward(j->m, kv, &b, lg);
        next = argmax(lg, V);
    }
    if (j->st != OSP_OK && j->c) osp_comm_abort(j->c);
    osp_kv_cache_free(kv);
    return NULL;
}

static osp_model_params params(bool q8) {
    osp_model_params mp = osp_model_default_params();
    mp.n_threads = 1;
    mp.exact = !q8;
    mp.cpu_activations = q8 ? OSP_CPU_ACT_Q8 : OSP_CPU_ACT_TWO_LEVEL;
    return mp;
}

/* Rank r's FFN columns: whole blocks of 32 (the tiny quantized models' down matrices) or single columns (F32),
 * r n / W .. (r + 1) n / W of n units */
static int32_t ff_share(const char *path, int32_t F, int32_t r, int32_t world) {
    const int32_t U = strstr(path, "f32") ? 1 : 32, n = F / U;
    return (n * (r + 1) / world - n * r / world) * U;
}

/* Logits of the whole model vs. the ranks' (world ranks on their own threads). */
static void check_split(const char *name, int32_t world, bool q8, double tol) {
    char path[600];
    snprintf(path, sizeof path, "%s/tests/models/%s", g_root, name);
    osp_model_params mp = params(q8);
    osp_model *whole;
    assert_int_equal(osp_model_load(path, &mp, &whole), OSP_OK);
    const osp_model_config *cw = osp_model_config_get(whole);
    const int32_t V = cw->n_vocab;
    const size_t n = (size_t)(1 + N_DECODE) * (size_t)V;
    rank_job ref = {.m = whole, .out = malloc(sizeof(float) * n)};
    run_rank(&ref);
    assert_int_equal(ref.st, OSP_OK);

    osp_comm *c;
    assert_int_equal(osp_comm_local_create(world, &c), OSP_OK);
    rank_job jobs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int32_t r = 0; r < world; r++) {
        mp.tensor_parallel_size = world, mp.tensor_parallel_rank = r, mp.comm = c;
        osp_model *m;
        assert_int_equal(osp_model_load(path, &mp, &m), OSP_OK);
        const osp_model_config *cr = osp_model_config_get(m);
        assert_int_equal(cr->n_head, cw->n_head / world);
        /* fewer KV heads than ranks: each rank a copy of its group's one */
        assert_int_equal(cr->n_head_kv, world > cw->n_head_kv ? 1 : cw->n_head_kv / world);
        assert_int_equal(cr->n_ff, ff_share(path, cw->n_ff, r, world));
        assert_int_equal(cr->n_embd, cw->n_embd);
        assert_int_equal(cr->n_vocab, V);
        jobs[r] = (rank_job){.m = m, .c = c, .out = malloc(sizeof(float) * n)};
    }
    for (int32_t r = 0; r < world; r++) assert_int_equal(pthread_create(&th[r], NULL, run_rank, &jobs[r]), 0);
    for (int32_t r = 0; r < world; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
    double max_abs = 0.0, max_ref = 0.0;
    for (int32_t r = 0; r < world; r++) {
        assert_int_equal(jobs[r].st, OSP_OK);
        if (r > 0 && memcmp(jobs[r].out, jobs[0].out, sizeof(float) * n) != 0)
            fail_msg("%s over %d ranks: rank %d's logits differ from rank 0's", name, world, r);
    }
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)jobs[0].out[i] - (double)ref.out[i]);
        max_abs = d > max_abs ? d : max_abs;
        max_ref = fabs((double)ref.out[i]) > max_ref ? fabs((double)ref.out[i]) : max_ref;
    }
    for (int step = 0; step <= N_DECODE; step++)
        assert_int_equal(argmax(jobs[0].out + (size_t)step * V, V), argmax(ref.out + (size_t)step * V, V));
    printf("%s, %s, %d ranks: max |logit - whole model's| %.3g (largest logit %.3g), greedy tokens equal\n", name,
           q8 ? "q8 activations" : "exact", world, max_abs, max_ref);
    if (!(max_abs <= tol * (max_ref > 1.0 ? max_ref : 1.0)))
        fail_msg("%s over %d ranks: logits %.3g from the whole model's (tolerance %.3g)", name, world, max_abs, tol);
    for (int32_t r = 0; r < world; r++) {
        osp_model_free(jobs[r].m);
        free(jobs[r].out);
    }
    osp_comm_free(c);
    osp_model_free(whole);
    free(ref.out);
}

/* Exact mode: fp32 everywhere, only the row-parallel sums' order differs from the whole model's. The
 * one-level mode quantizes each rank's half of o's and down's inputs per block of 32 as the whole model
 * does (the split falls on block edges), so it stays close too. */
static void test_llama_f32(void **state) {
    (void)state;
    check_split("tiny-llama-f32.gguf", 2, false, 1e-5);
}

static void test_llama_q8_0(void **state) {
    (void)state;
    check_split("tiny-llama-q8_0.gguf", 2, false, 1e-5);
    check_split("tiny-llama-q8_0.gguf", 2, true, 1e-5);
}

static void test_qwen2_bias(void **state) {
    (void)state;
    check_split("tiny-qwen2-q4_1.gguf", 2, false, 1e-5);
}

/* n_ff 96 in Q8_0 (three blocks of 32) over 2 ranks: 32 and 64 columns, each rank's gate / up rows and down
 * columns at the same block edge; the logits are the whole model's all the same. */
static void test_unequal_ffn(void **state) {
    (void)state;
    assert_int_equal(ff_share("q8_0", 96, 0, 2), 32);
    assert_int_equal(ff_share("q8_0", 96, 1, 2), 64);
    check_split("tiny-llama-ffn96-q8_0.gguf", 2, false, 1e-5);
    check_split("tiny-llama-ffn96-q8_0.gguf", 2, true, 1e-5);
}

/* Four ranks over 2 KV heads (4 query heads): each rank one query head and a copy of its group's KV head
 * (k / v rows cut at that head, its own cache pages), ranks 0-1 holding KV head 0, 2-3 head 1; llama and
 * qwen3 (per-head q / k norms). F32 only: a rank's 16 or 32 columns of o are not whole blocks of the tiny
 * quantized models (refused, as checked in test_refusals). */
static void test_kv_head_replication(void **state) {
    (void)state;
    check_split("tiny-llama-f32.gguf", 4, false, 1e-5);
    check_split("tiny-qwen3-f32.gguf", 4, false, 1e-5);
}

/* One model that drives its ranks (tensor_parallel_size 2, no communicator): the caller sees one model and one
 * KV cache; the logits are the ranks' (bit for bit those of ranks run by hand) and the whole model's within
 * rounding; a bad batch is refused before any rank starts and the model keeps working. */
static void test_driver(void **state) {
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/tests/models/tiny-qwen2-q4_1.gguf", g_root);
    osp_model_params mp = params(false);
    osp_model *whole;
    assert_int_equal(osp_model_load(path, &mp, &whole), OSP_OK);
    const int32_t V = osp_model_config_get(whole)->n_vocab;
    const size_t n = (size_t)(1 + N_DECODE) * (size_t)V;
    rank_job ref = {.m = whole, .out = malloc(sizeof(float) * n)}, drv = {.out = malloc(sizeof(float) * n)};
    run_rank(&ref);
    assert_int_equal(ref.st, OSP_OK);
    mp.n_threads = 2;
    mp.tensor_parallel_size = 2;
    assert_int_equal(osp_model_load(path, &mp, &drv.m), OSP_OK);
    assert_int_equal(osp_model_config_get(drv.m)->n_head, osp_model_config_get(whole)->n_head / 2);
    /* ranks by hand, for the bits */
    osp_comm *c;
    assert_int_equal(osp_comm_local_create(2, &c), OSP_OK);
    rank_job jobs[2];
    pthread_t th[2];
    mp.n_threads = 1;
    for (int32_t r = 0; r < 2; r++) {
        mp.tensor_parallel_rank = r, mp.comm = c;
        jobs[r] = (rank_job){.c = c, .out = malloc(sizeof(float) * n)};
        assert_int_equal(osp_model_load(path, &mp, &jobs[r].m), OSP_OK);
    }
    for (int32_t r = 0; r < 2; r++) assert_int_equal(pthread_create(&th[r], NULL, run_rank, &jobs[r]), 0);
    for (int32_t r = 0; r < 2; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
    for (int round = 0; round < 2; round++) { /* twice: the rank threads serve one forward after another */
        run_rank(&drv);
        assert_int_equal(drv.st, OSP_OK);
        assert_memory_equal(drv.out, jobs[0].out, sizeof(float) * n);
    }
    double max_abs = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)drv.out[i] - (double)ref.out[i]);
        max_abs = d > max_abs ? d : max_abs;
    }
    assert_true(max_abs <= 1e-5);
    /* bad input: refused up front, nothing aborted */
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create(drv.m, NB, BS, OSP_KV_DTYPE_F32, &kv), OSP_OK);
    int32_t bad_id[1] = {V}, pos[1] = {0}, bt[NB] = {0}, qsl[2] = {0, 1}, sl[1] = {1}, li[1] = {0};
    osp_batch b = {.num_tokens = 1, .token_ids = bad_id, .positions = pos, .slot_mapping = pos, .num_seqs = 1,
                   .query_start_loc = qsl, .seq_lens = sl, .block_table = bt, .max_blocks_per_seq = NB,
                   .num_logits = 1, .logits_indices = li};
    float *lg = malloc(sizeof(float) * (size_t)V);
    assert_int_equal(osp_model_forward(drv.m, kv, &b, lg), OSP_ERR_INVALID_ARG);
    /* a cache made by another model (no ranks beside it) */
    osp_kv_cache *plain;
    assert_int_equal(osp_kv_cache_create(jobs[0].m, NB, BS, OSP_KV_DTYPE_F32, &plain), OSP_OK);
    bad_id[0] = 1;
    assert_int_equal(osp_model_forward(drv.m, plain, &b, lg), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_model_forward(drv.m, kv, &b, lg), OSP_OK);
    osp_kv_cache_free(plain);
    osp_kv_cache_free(kv);
    free(lg);
    printf("driver model, 2 ranks: logits bit-identical to the hand-run ranks', %.3g from the whole model's\n", max_abs);
    for (int32_t r = 0; r < 2; r++) {
        osp_model_free(jobs[r].m);
        free(jobs[r].out);
    }
    osp_comm_free(c);
    osp_model_free(drv.m);
    osp_model_free(whole);
    free(drv.out);
    free(ref.out);
}

/* ---- the engine over a split model ----------------------------------------------------------------- */

enum { NREQ = 6, MAXOUT = 32 };

typedef struct req {
    int32_t prompt[40], n_prompt, out[MAXOUT], n_out;
} req;

/* run_engine with a KV memory budget (0: 64 blocks); the cache's bytes and blocks out. */
static void run_engine_sized(const char *path, int32_t tp, int64_t kv_memory, req *r, int n, size_t *kv_bytes,
                             int32_t *blocks);

/* Runs reqs [0, n) through one engine (prefix caching on, the scheduler's checks after every step), greedy,
 * 16 tokens each; the tokens into each req. */
static void run_engine(const char *path, int32_t tp, req *r, int n) {
    size_t kv_bytes;
    int32_t blocks;
    run_engine_sized(path, tp, 0, r, n, &kv_bytes, &blocks);
}

static void run_engine_sized(const char *path, int32_t tp, int64_t kv_memory, req *r, int n, size_t *kv_bytes,
                             int32_t *blocks) {
    osp_engine_params p = osp_engine_default_params();
    p.model_path = path;
    p.n_threads = 2;
    p.exact = true;
    p.kv_dtype = OSP_KV_DTYPE_F32;
    p.max_model_len = 128;
    p.num_blocks = kv_memory ? 0 : 64;
    p.kv_cache_memory = kv_memory;
    p.check_invariants = true;
    p.hash_seed_set = true;
    p.hash_seed = 5;
    p.tensor_parallel_size = tp;
    osp_engine *e;
    if (osp_engine_create(&p, &e) != OSP_OK) fail_msg("create (tp %d): %s", tp, osp_last_error());
    for (int i = 0; i < n; i++) {
        osp_request_params rp = osp_request_default_params();
        rp.request_id = (uint64_t)i;
        rp.prompt = r[i].prompt;
        rp.num_prompt = r[i].n_prompt;
        rp.max_tokens = 16;
        rp.ignore_eos = true;
        assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
        r[i].n_out = 0;
    }
    for (int step = 0; osp_engine_has_unfinished(e); step++) {
        assert_int_equal(osp_engine_step(e, NULL), OSP_OK);
        assert_true(step < 1000);
    }
    for (int i = 0; i < n; i++) {
        osp_request_output o;
        assert_int_equal(osp_engine_poll(e, (uint64_t)i, r[i].out, MAXOUT, &o, 0), OSP_OK);
        assert_true(o.finished);
        r[i].n_out = o.num_tokens;
        assert_int_equal(r[i].n_out, 16);
    }
    assert_int_equal(osp_engine_check_invariants(e), OSP_OK);
    *kv_bytes = osp_engine_kv_cache_bytes(e);
    *blocks = osp_engine_params_get(e)->num_blocks;
    osp_engine_free(e);
}

/* The engine with tensor_parallel_size 2: greedy tokens of a batch of requests (some sharing a prefix) equal the
 * unsplit engine's, and each request alone gives what it gives in the batch (batch invariance holds across
 * ranks: every rank's matmuls are per row). A feature that would read one rank's pages is refused. */
static void test_engine_split(void **state) {
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/tests/models/tiny-qwen2-q4_1.gguf", g_root);
    req whole[NREQ], split[NREQ], alone[NREQ];
    for (int i = 0; i < NREQ; i++) {
        whole[i].n_prompt = 5 + 6 * i;
        for (int t = 0; t < whole[i].n_prompt; t++) whole[i].prompt[t] = 3 + (t * 31 + i * (t < 20 ? 0 : 7)) % 500;
    }
    memcpy(split, whole, sizeof whole);
    memcpy(alone, whole, sizeof whole);
    run_engine(path, 1, whole, NREQ);
    run_engine(path, 2, split, NREQ);
    for (int i = 0; i < NREQ; i++) run_engine(path, 2, &alone[i], 1);
    for (int i = 0; i < NREQ; i++) {
        if (memcmp(whole[i].out, split[i].out, sizeof(int32_t) * 16) != 0)
            fail_msg("request %d: the split engine's tokens differ from the whole model's", i);
        if (memcmp(alone[i].out, split[i].out, sizeof(int32_t) * 16) != 0)
            fail_msg("request %d: alone and in the batch differ on the split engine", i);
    }
    printf("engine, 2 ranks: %d requests, greedy tokens equal to the unsplit engine's, batch-invariant\n", NREQ);
    /* a memory budget holds as many blocks split as whole: every rank's cache lives on this host */
    size_t bytes1, bytes2;
    int32_t blocks1, blocks2;
    run_engine_sized(path, 1, 256 * 1024, alone, 1, &bytes1, &blocks1);
    run_engine_sized(path, 2, 256 * 1024, alone, 1, &bytes2, &blocks2);
    assert_int_equal(blocks1, blocks2);
    assert_true(bytes1 == bytes2 && bytes2 <= 256 * 1024);
    osp_engine_params p = osp_engine_default_params();
    p.model_path = path;
    p.tensor_parallel_size = 2;
    p.speculative.method = OSP_SPEC_QUANTSPEC;
    p.speculative.num_speculative_tokens = 2;
    osp_engine *e = NULL;
    assert_int_equal(osp_engine_create(&p, &e), OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "QuantSpec"));
    p.speculative = osp_spec_default_config();
    p.tensor_parallel_size = 65;
    assert_int_equal(osp_engine_create(&p, &e), OSP_ERR_INVALID_ARG);
    assert_null(e);
}

/* 4 ranks of a model with 2 KV heads: KV-head replication is not built, so it is refused. */
static void test_refusals(void **state) {
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/tests/models/tiny-llama-f32.gguf", g_root);
    osp_comm *c2, *c4;
    assert_int_equal(osp_comm_local_create(2, &c2), OSP_OK);
    assert_int_equal(osp_comm_local_create(3, &c4), OSP_OK);
    osp_model *m = NULL;
    osp_model_params mp = params(false);
    mp.tensor_parallel_size = 3, mp.comm = c4; /* 4 query heads over 3 ranks */
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "n_head (4) does not fit"));
    mp.comm = c2; /* the communicator's size differs */
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_ERR_INVALID_ARG);
    mp.tensor_parallel_size = 2, mp.tensor_parallel_rank = 2;
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_ERR_INVALID_ARG);
    mp.tensor_parallel_rank = 1, mp.comm = NULL; /* without a communicator the model drives the ranks: rank 0 */
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_ERR_INVALID_ARG);
    mp.tensor_parallel_rank = 0, mp.tensor_parallel_size = 65;
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_ERR_INVALID_ARG);
    mp.tensor_parallel_size = 3; /* the driver's ranks are refused as the hand-made ones are */
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_ERR_UNSUPPORTED);
    { /* 4 ranks of tiny-llama-q8_0: each rank's 16 columns of o are half a Q8_0 block */
        osp_comm *c4b;
        char q8[600];
        snprintf(q8, sizeof q8, "%s/tests/models/tiny-llama-q8_0.gguf", g_root);
        assert_int_equal(osp_comm_local_create(4, &c4b), OSP_OK);
        osp_model_params mq = params(false);
        mq.tensor_parallel_size = 4, mq.comm = c4b;
        assert_int_equal(osp_model_load(q8, &mq, &m), OSP_ERR_UNSUPPORTED);
        assert_non_null(strstr(osp_last_error(), "not whole Q8_0 blocks"));
        osp_comm_free(c4b);
    }
    mp.tensor_parallel_size = 1, mp.comm = c2; /* a communicator without a split */
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_ERR_INVALID_ARG);
    mp.tensor_parallel_size = 2;
    mp.draft_4bit_weights = true;
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_ERR_UNSUPPORTED);
    mp.draft_4bit_weights = false;
    mp.no_mmap = true;
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_ERR_UNSUPPORTED);
    mp.no_mmap = false;
    mp.device = OSP_DEVICE_CUDA;
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_ERR_UNSUPPORTED);
    assert_null(m);
    osp_comm_free(c2);
    osp_comm_free(c4);
}

int main(void) {
    g_root = getenv("OSPREY_ROOT");
    if (!g_root) g_root = ".";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_comm_sum),    cmocka_unit_test(test_comm_gather), cmocka_unit_test(test_comm_errors),
        cmocka_unit_test(test_comm_watchdog),
        cmocka_unit_test(test_llama_f32),
        cmocka_unit_test(test_llama_q8_0),  cmocka_unit_test(test_qwen2_bias),  cmocka_unit_test(test_driver),
        cmocka_unit_test(test_unequal_ffn), cmocka_unit_test(test_kv_head_replication), cmocka_unit_test(test_engine_split),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
