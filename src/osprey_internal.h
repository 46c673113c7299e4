/* The one internal header the tools (tools/osprey, tools/server) may include beside include/osprey/:
 * what a tool needs of the library that is not public API, each entry with the reason it is here.
 * Nothing else under src/ is included by tools/ (grep -rn '#include "' tools | grep -v osprey/
 * finds only this file and the tools' own headers). */
#ifndef OSPREY_INTERNAL_H
#define OSPREY_INTERNAL_H

/* osp_sampling_params / osp_sampler_row (sample/sampler.h): `generate` and `chat` fill sampling
 * parameters for the engine; `bench` samples on the device the way the engine does. */
#include "sample/sampler.h"
/* osp_model_sample (model/model_exec.h): `bench` times decode steps with device-side sampling, as
 * the engine runs them, without an engine. */
#include "model/model_exec.h"
/* osp_dtype_name / osp_dtype_row_size (core/dtype.h): `info` names tensor types; `make-random-model`
 * sizes rows. osp_quantize_row (core/quantize.h): `make-random-model` writes quantized types. */
#include "core/dtype.h"
#include "core/quantize.h"
/* the presets and their seeded random streams (model/presets.h): `make-random-model` writes them as
 * GGUF, bit-identical to what --random-weights draws on the GPU. */
#include "model/presets.h"
/* the thread pool (core/threadpool.h): `make-random-model` draws and quantizes rows on it, the one
 * threading model of the CPU side (no OpenMP). */
#include "core/threadpool.h"
/* bounded whole-file reads (core/file.h): the CLI's text corpora, templates and JSON files are read
 * with the library's one reader, under the same size limits and errors. */
#include "core/file.h"
/* the grammar engine (grammar/grammar.h): serve turns response_format / guided_* into GBNF and checks
 * it compiles, so a bad schema or grammar is a 400 before the engine sees it. */
#include "grammar/grammar.h"
/* the KL-divergence base file (format/kl_base.h): `perplexity` saves and compares base runs. */
#include "format/kl_base.h"
/* the KV scales file (format/kv_scales.h): `perplexity` and `bench` create their own caches with
 * --kv-scales; `calibrate-kv` writes the file. The calibrator (kv/kv_calib.h): `calibrate-kv` feeds
 * it the rows of an f32 cache after each forward pass. */
#include "format/kv_scales.h"
#include "kv/kv_calib.h"
/* the paged KV cache's internals (kv/kv_cache.h): `perplexity --kv-draft-view` sets QuantSpec's draft
 * view of int8_hier pages on its own cache (osp_kv_cache_set_hier_view). */
#include "kv/kv_cache.h"
/* the prefix-cache block hashes (kv/prefix_cache.h): `router` hashes a request's tokens as its
 * backends do (same algorithm and seed) to look them up in the index built from their KV events. */
#include "kv/prefix_cache.h"
/* the EngineCore's process split (engine/core_client.h, core_server.h, ipc.h): `serve
 * --engine-process` talks to its core through the client, and the hidden `__engine-core` command
 * runs the core's loop. */
#include "engine/core_client.h"
#include "engine/core_server.h"
/* the step timeline's writer (engine/timeline.h): `bench --trace` writes its own steps in the engine's
 * trace format (the same phases and device spans), so one viewer and one summary serve both. */
#include "engine/timeline.h"

#endif
