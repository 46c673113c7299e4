/* A small engine harness shared by the engine tests that compare whole runs (tests/unit/test_sparse_engine.c
 * on the CPU, tests/gpu/test_gpu_sparse_engine.c on the GPU): jobs of random prompts, every job run through
 * one engine to the end (greedy, ignore_eos) with the pool checked empty afterwards, and token agreement
 * between two runs. Header-only, static: each test executable gets its own copy; include after cmocka.h. */
#ifndef OSPREY_TESTS_ENGINE_JOBS_H
#define OSPREY_TESTS_ENGINE_JOBS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "osprey/engine.h"

#define JOB_MAXOUT 32

typedef struct job {
    int32_t prompt[512];
    int32_t n_prompt, max_tokens;
    int32_t out[JOB_MAXOUT];
    int32_t n_out;
} job;

/* n jobs: prompts of base_len + 37 i random ids in [3, vocab), 12 + 3 i tokens to generate (seeded). */
static void make_jobs(job *j, int n, int32_t vocab, int32_t base_len) {
    srand(7);
    memset(j, 0, sizeof *j * (size_t)n);
    for (int i = 0; i < n; i++) {
        j[i].n_prompt = base_len + i * 37;
        for (int t = 0; t < j[i].n_prompt; t++) j[i].prompt[t] = 3 + rand() % (vocab - 3);
        j[i].max_tokens = 12 + i * 3;
    }
}

/* Runs the n jobs together through one engine made from *p; fills their outputs; returns its stats (every
 * block free again is asserted). */
static osp_engine_stats run_jobs(const osp_engine_params *p, job *j, int n) {
    osp_engine *e;
    if (osp_engine_create(p, &e) != OSP_OK) fail_msg("create: %s", osp_last_error());
    for (int i = 0; i < n; i++) {
        osp_request_params rp = osp_request_default_params();
        rp.request_id = (uint64_t)i;
        rp.prompt = j[i].prompt;
        rp.num_prompt = j[i].n_prompt;
        rp.max_tokens = j[i].max_tokens;
        rp.ignore_eos = true;
        j[i].n_out = 0;
        if (osp_engine_add(e, &rp) != OSP_OK) fail_msg("add: %s", osp_last_error());
    }
    while (osp_engine_has_unfinished(e))
        if (osp_engine_step(e, NULL) != OSP_OK) fail_msg("step: %s", osp_last_error());
    for (int i = 0; i < n; i++) {
        osp_request_output o;
        assert_int_equal(osp_engine_poll(e, (uint64_t)i, j[i].out, JOB_MAXOUT, &o, 0), OSP_OK);
        assert_true(o.finished);
        if (o.finish_reason == OSP_FINISH_ERROR) fail_msg("request %d: %s", i, o.error);
        j[i].n_out = o.num_output_tokens;
    }
    const osp_engine_stats st = osp_engine_get_stats(e);
    assert_int_equal(st.num_free_blocks, st.num_blocks);
    osp_engine_free(e);
    return st;
}

/* Tokens the two runs agree on, each job counted up to its first difference. */
static int same_tokens(const job *a, const job *b, int n) {
    int agree = 0;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < a[i].n_out && t < b[i].n_out && a[i].out[t] == b[i].out[t]; t++) agree++;
    return agree;
}

static int total_tokens(const job *a, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += a[i].n_out;
    return s;
}

#endif
