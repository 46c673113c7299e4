/* osprey serve: the /v1/embeddings reply, as OpenAI's API (and vLLM's server) shape it.
 *
 * A /v1/embeddings request is a job like a completion (serve_jobs.c): one engine request per input,
 * each prefill-only with the server's pooling (osp_request_params.pooling); the engine hands each
 * input's vector to the job's callback when its prompt is computed. Once all are in, this file writes
 * the list object: "embedding" is an array of numbers (encoding_format "float") or the base64 of the
 * vector's bytes as little-endian float32 (encoding_format "base64", what the official openai client
 * asks for by default and decodes with numpy.frombuffer(..., dtype="float32")). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve_internal.h"

char *srv_embd_base64(const float *v, int32_t n) {
    static const char k_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t nb = (size_t)(n > 0 ? n : 0) * 4;
    uint8_t *b = malloc(nb + 1);
    char *out = malloc((nb + 2) / 3 * 4 + 1);
    if (!b || !out) {
        free(b);
        free(out);
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) { /* little-endian whatever the host's order */
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) b[(size_t)i * 4 + (size_t)k] = (uint8_t)(u >> (8 * k));
    }
    size_t o = 0, i = 0;
    for (; i + 3 <= nb; i += 3) {
        const uint32_t w = (uint32_t)b[i] << 16 | (uint32_t)b[i + 1] << 8 | b[i + 2];
        out[o++] = k_b64[w >> 18 & 63], out[o++] = k_b64[w >> 12 & 63];
        out[o++] = k_b64[w >> 6 & 63], out[o++] = k_b64[w & 63];
    }
    if (nb - i == 1) {
        const uint32_t w = (uint32_t)b[i] << 16;
        out[o++] = k_b64[w >> 18 & 63], out[o++] = k_b64[w >> 12 & 63], out[o++] = '=', out[o++] = '=';
    } else if (nb - i == 2) {
        const uint32_t w = (uint32_t)b[i] << 16 | (uint32_t)b[i + 1] << 8;
        out[o++] = k_b64[w >> 18 & 63], out[o++] = k_b64[w >> 12 & 63], out[o++] = k_b64[w >> 6 & 63], out[o++] = '=';
    }
    out[o] = 0;
    free(b);
    return out;
}

json_t *srv_json_embeddings(const srv_job *j) {
    json_t *data = json_array();
    json_int_t n_tokens = 0;
    for (int32_t i = 0; data && i < j->n_seqs; i++) {
        const srv_seq *s = &j->seqs[i];
        n_tokens += j->prompt_lens[s->prompt_idx];
        json_t *vec = NULL;
        if (j->req.embd_base64) {
            char *b = srv_embd_base64(s->embd, s->n_embd);
            vec = b ? json_string(b) : NULL;
            free(b);
        } else if ((vec = json_array())) {
            for (int32_t k = 0; k < s->n_embd; k++)
                if (json_array_append_new(vec, json_real((double)s->embd[k]))) {
                    json_decref(vec);
                    vec = NULL;
                    break;
                }
        }
        json_t *item = vec ? json_pack("{s:s, s:i, s:o}", "object", "embedding", "index", (int)i, "embedding", vec) : NULL;
        if (!item || json_array_append_new(data, item)) {
            json_decref(data);
            data = NULL;
        }
    }
    if (!data) return NULL;
    return json_pack("{s:s, s:s, s:I, s:o, s:s, s:{s:I, s:I}}", "id", j->id, "object", "list", "created",
                     (json_int_t)j->created, "data", data, "model", j->srv->model_name, "usage", "prompt_tokens", n_tokens,
                     "total_tokens", n_tokens);
}
