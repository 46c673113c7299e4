/* Engine internals that tests reach (not public API): a custom proposer in place of the configured
 * one, so the verification and rollback paths can be driven with drafts of any quality; the engine's
 * KV cache. */
#ifndef OSP_ENGINE_INTERNAL_H
#define OSP_ENGINE_INTERNAL_H

#include "osprey/engine.h"
#include "spec/proposer.h"

/* Replaces the engine's proposer by `p` (owned by the engine from now on; destroyed with it or by the
 * next call) drafting up to k tokens per step for requests added from now on. The engine must have
 * been created with a speculative config (that sizes its buffers) and k <= its num_speculative_tokens.
 * Errors: OSP_ERR_INVALID_ARG (no speculative config, k out of range); then the engine keeps its
 * proposer and p is not taken. Not while the loop thread runs. */
osp_status osp_engine_set_proposer(osp_engine *e, osp_proposer *p, int32_t k);

/* The engine's KV cache (owned by the engine), so tests can see what it was created with (its page
 * format, the fixed scales of a quantized cache from osp_engine_params.kv_scales_path). */
const osp_kv_cache *osp_engine_kv_cache(const osp_engine *e);

#endif
