/* osprey generate: continue a prompt with the model, streaming the text as it is produced.
 *
 * One request through the engine (include/osprey/engine.h), stepped from this thread: the prompt in
 * prefill steps (chunked at the token budget), then one decode step per token, K/V in the engine's
 * paged cache (block size 16, f16 by default). Timings go to stderr: load time, prompt tokens/s
 * (prefill, up to the first token), generation tokens/s (decode: the tokens after the first over the
 * time after it). With --speculative-config a decode step may produce several tokens; the line then
 * also gives the steps, drafts, accepted drafts and the mean acceptance length (tokens per step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "osprey/engine.h"
#include "osprey/model.h"
#include "osprey/tokenizer.h"
#include "osprey_internal.h"

#define BLOCK_SIZE 16

typedef struct gen_args {
    cli_engine_args eng; /* -m, -t, --device, --kv-cache-dtype, --exact */
    const char *prompt;
    int n_predict;
    osp_sampling_params sp;
    bool seed_set;
} gen_args;

static const char k_help[] =
    "usage: osprey generate -m FILE -p TEXT [options]\n"
    "  continue TEXT with the model, streaming the tokens to stdout; load and speed figures on stderr\n"
    "\n"
    CLI_ENGINE_HELP
    "  -p, --prompt TEXT       the text to continue (required)\n"
    "  -n, --n-predict N       tokens to generate, 0..1048576 (default: 128)\n"
    "  --temp T                temperature, 0 = greedy (default: 0.8)\n"
    "  --top-k K               keep the K most likely tokens, -1 or 0 = all (default: 40)\n"
    "  --top-p P               nucleus sampling mass, 0..1 (default: 0.95)\n"
    "  --seed S                sampler seed, 0..4294967295 (default: from the clock, printed on stderr)\n"
    CLI_KV_DTYPE_HELP
    CLI_KV_SCALES_HELP
    "  --exact                 fp32 activations and an f32 KV cache (or f16 with --kv-cache-dtype f16;\n"
    "                          a quantized cache is refused) (the reference path; default: off)\n"
    "  -h, --help              this text\n";

static gen_args parse(int argc, char **argv) {
    gen_args a = {.eng = cli_engine_args_default(), .n_predict = 128, .sp = osp_sampling_default_params()};
    a.sp.temperature = 0.8f; /* llama.cpp's default */
    a.sp.top_k = 40;
    a.sp.top_p = 0.95f;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) cli_help(k_help);
        if (cli_engine_arg(&a.eng, CLI_ENGINE_KV_DTYPE | CLI_ENGINE_EXACT, argc, argv, &i)) continue;
        if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) a.prompt = v, i++;
        else if (!strcmp(f, "-n") || !strcmp(f, "--n-predict")) a.n_predict = (int)cli_int(f, v, 0, 1 << 20), i++;
        else if (!strcmp(f, "--temp")) a.sp.temperature = (float)cli_float(f, v, 0, 100), i++;
        else if (!strcmp(f, "--top-k")) a.sp.top_k = (int)cli_int(f, v, -1, 1 << 30), i++;
        else if (!strcmp(f, "--top-p")) a.sp.top_p = (float)cli_float(f, v, 0, 1), i++;
        else if (!strcmp(f, "--seed")) a.sp.seed = (uint64_t)cli_int(f, v, 0, (long long)UINT32_MAX), a.seed_set = true, i++;
        else cli_die(OSP_OK, "generate: unknown option '%s'", f);
    }
    if (!a.eng.model || !a.prompt) cli_die(OSP_OK, "generate needs -m FILE and -p TEXT");
    return a;
}

int cmd_generate(int argc, char **argv) {
    gen_args a = parse(argc, argv);
    if (!a.seed_set) {
        /* a seed within --seed's range, printed so the run can be repeated */
        a.sp.seed = (uint64_t)(cli_now_s() * 1e6) % ((uint64_t)UINT32_MAX + 1);
    }

    double t0 = cli_now_s();
    osp_engine_params ep = cli_engine_params(&a.eng);
    ep.block_size = BLOCK_SIZE;
    ep.max_num_seqs = 1;
    osp_engine *e;
    osp_status s = osp_engine_create(&ep, &e);
    if (s != OSP_OK) cli_die(s, "cannot start the engine");
    if (!a.seed_set && a.sp.temperature > 0.0f) /* printed once the run can happen */
        fprintf(stderr, "seed: %llu (repeat with --seed)\n", (unsigned long long)a.sp.seed);
    cli_report_device(e);
    osp_tokenizer *tok;
    s = osp_tokenizer_load(osp_model_gguf(osp_engine_model(e)), &tok);
    if (s != OSP_OK) cli_die(s, "cannot load tokenizer");
    const double t_load = cli_now_s() - t0;

    int32_t *prompt_ids;
    size_t n_prompt;
    s = osp_tokenizer_encode(tok, a.prompt, strlen(a.prompt), true, true, &prompt_ids, &n_prompt);
    if (s != OSP_OK) cli_die(s, "cannot tokenize the prompt");
    if (n_prompt == 0) cli_die(OSP_OK, "the prompt is empty after tokenization");
    const int32_t cap = a.n_predict > 0 ? a.n_predict : 1;
    int32_t *out = malloc(sizeof(int32_t) * (size_t)cap);
    osp_detokenizer *dt;
    const size_t text_cap = 3 * (osp_tokenizer_max_token_bytes(tok) + 4) + 1;
    char *text = malloc(text_cap);
    if (!out || !text || osp_detokenizer_new(tok, &dt) != OSP_OK) cli_die(OSP_OK, "out of memory");

    fputs(a.prompt, stdout);
    fflush(stdout);
    int32_t n_gen = 0, n_steps = 0;
    double t_prompt = 0, t2 = cli_now_s();
    if (a.n_predict > 0) {
        osp_request_params rp = osp_request_default_params();
        rp.prompt = prompt_ids;
        rp.num_prompt = (int32_t)n_prompt;
        rp.max_tokens = a.n_predict;
        rp.temperature = a.sp.temperature;
        rp.top_k = a.sp.top_k;
        rp.top_p = a.sp.top_p;
        rp.seed = a.sp.seed;
        rp.has_seed = true;
        s = osp_engine_add(e, &rp);
        if (s != OSP_OK) cli_die(s, "cannot run the prompt");
        const double t1 = cli_now_s();
        bool finished = false;
        size_t len;
        while (!finished) {
            s = osp_engine_step(e, NULL);
            if (s != OSP_OK) cli_die(s, "step failed");
            if (n_gen > 0) n_steps++;
            osp_request_output o;
            s = osp_engine_poll(e, rp.request_id, out + n_gen, cap - n_gen, &o, 0);
            if (s != OSP_OK) cli_die(s, "poll failed");
            if (n_gen == 0 && o.num_tokens > 0) {
                t_prompt = cli_now_s() - t1;
                t2 = cli_now_s();
            }
            for (int32_t i = 0; i < o.num_tokens; i++) {
                const int32_t next = out[n_gen + i];
                if (osp_tokenizer_is_eog(tok, next)) continue; /* the engine stops after it */
                if (osp_detokenizer_push(dt, next, text, text_cap, &len) == OSP_OK && len) {
                    fwrite(text, 1, len, stdout);
                    fflush(stdout);
                }
            }
            n_gen += o.num_tokens;
            finished = o.finished;
        }
        size_t flen;
        if (osp_detokenizer_flush(dt, text, text_cap, &flen) == OSP_OK && flen) fwrite(text, 1, flen, stdout);
    }
    free(prompt_ids);
    const int32_t n_decode = n_gen > 0 ? n_gen - 1 : 0;
    const double t_gen = cli_now_s() - t2;
    putchar('\n');
    fflush(stdout);
    fprintf(stderr, "\nload: %.0f ms | prompt: %zu token%s, %.0f ms, %.1f tokens/s | generation: %d tokens, %d decode steps in %.0f ms, %.1f tokens/s\n",
            t_load * 1e3, n_prompt, n_prompt == 1 ? "" : "s", t_prompt * 1e3, t_prompt > 0 ? (double)n_prompt / t_prompt : 0.0, n_gen, n_steps,
            t_gen * 1e3, n_decode > 0 ? (double)n_decode / t_gen : 0.0);
    if (ep.speculative.method != OSP_SPEC_NONE) {
        const osp_engine_stats st = osp_engine_get_stats(e);
        /* vLLM's mean acceptance length: 1 + accepted per verification row; and over every decode step */
        fprintf(stderr, "speculative (%s, k %d): %lld verification rows, %lld draft tokens, %lld accepted, mean "
                        "acceptance length %.2f, %.2f tokens per decode step\n",
                osp_spec_method_name(ep.speculative.method), ep.speculative.num_speculative_tokens,
                (long long)st.spec_num_drafts, (long long)st.spec_num_draft_tokens, (long long)st.spec_num_accepted_tokens,
                st.spec_num_drafts ? 1.0 + (double)st.spec_num_accepted_tokens / (double)st.spec_num_drafts : 1.0,
                n_steps > 0 ? (double)n_decode / n_steps : 0.0);
        /* what a round costs: drafting (the proposer's calls) and verifying (the steps with drafts) */
        if (st.spec_propose_calls > 0 && st.spec_verify_steps > 0)
            fprintf(stderr, "speculative cost: draft %.1f ms a call (proposer calls: %lld), verify %.1f ms a step with "
                            "drafts (such steps: %lld)\n",
                    1e3 * st.spec_propose_seconds / (double)st.spec_propose_calls, (long long)st.spec_propose_calls,
                    1e3 * st.spec_verify_seconds / (double)st.spec_verify_steps, (long long)st.spec_verify_steps);
    }

    osp_detokenizer_free(dt);
    free(text);
    free(out);
    osp_tokenizer_free(tok);
    osp_engine_free(e);
    return 0;
}
