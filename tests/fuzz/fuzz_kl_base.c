/* libFuzzer target for the KL-divergence base file parser (src/format/kl_base.c, `osprey perplexity
 * --kl-base`). Any input either parses, and then every record satisfies the format's invariants (ids
 * in the vocabulary, log-probabilities finite, <= 0 and in order, the rest a log-probability or -inf,
 * the NLL finite and >= 0) and saving it back gives the same bytes, or is refused with OSP_ERR_FORMAT
 * and a message, leaving the output zeroed. A crash, a sanitizer report or a silent rejection is a
 * bug. Seeds: tests/fuzz/corpus/kl_base/. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status_internal.h"
#include "format/kl_base.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    osp_kl_base b;
    const osp_status s = osp_kl_base_parse(data, size, &b);
    if (s != OSP_OK) {
        if (s != OSP_ERR_FORMAT && s != OSP_ERR_NOMEM) abort();
        if (b.ids || b.logprob || b.nll || !osp_last_error()[0]) abort();
        return 0;
    }
    if (osp_kl_base_file_bytes(b.n_chunks, b.n_scored, b.k) != size) abort();
    const size_t n = (size_t)b.n_chunks * b.n_scored;
    for (size_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < b.k; j++) {
            const int32_t id = b.ids[i * b.k + j];
            const float lp = b.logprob[i * b.k + j];
            if (id < 0 || (uint32_t)id >= b.n_vocab || !(lp <= 0.0f) || !isfinite(lp)) abort();
            if (j && lp > b.logprob[i * b.k + j - 1]) abort();
        }
        if (isnan(b.logprob_rest[i]) || b.logprob_rest[i] > 0.0f) abort();
        if (!(b.nll[i] >= 0.0f) || !isfinite(b.nll[i])) abort();
    }
    /* the same bytes back */
    char path[] = "/tmp/fuzz_klb_XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) {
        close(fd);
        if (osp_kl_base_save(path, &b) == OSP_OK) {
            FILE *f = fopen(path, "rb");
            uint8_t *back = malloc(size);
            if (!f || !back || fread(back, 1, size, f) != size || memcmp(back, data, size) != 0) abort();
            free(back);
            fclose(f);
        }
        remove(path);
    }
    osp_kl_base_free(&b);
    return 0;
}
