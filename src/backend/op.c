/* Op-list construction (see op.h). */
#include "backend/op.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/status_internal.h"

osp_status osp_graph_init(osp_graph *g) {
    memset(g, 0, sizeof *g);
    g->logits = -1;
    g->embd = -1;
    return OSP_OK;
}

void osp_graph_free(osp_graph *g) {
    if (!g) return;
    free(g->ops);
    memset(g, 0, sizeof *g);
    g->logits = -1;
    g->embd = -1;
}

osp_status osp_graph_act(osp_graph *g, const char *name, uint32_t type, int64_t cols, osp_act_rows rows, int32_t *id) {
    if (g->n_acts == OSP_GRAPH_MAX_ACTS)
        return osp_set_error(OSP_ERR_INTERNAL, "op list: more than %d activations", OSP_GRAPH_MAX_ACTS);
    g->acts[g->n_acts] = (osp_act){.name = name, .type = type, .cols = cols, .rows = rows};
    *id = g->n_acts++;
    return OSP_OK;
}

osp_status osp_graph_hidden(osp_graph *g, const osp_build_opts *o, int32_t layer, int32_t x, int64_t n_embd) {
    for (int32_t i = 0; o && i < o->n_hidden_layers; i++) {
        if (o->hidden_layers[i] != layer) continue;
        if (g->n_hidden == 8) return osp_set_error(OSP_ERR_INVALID_ARG, "op list: more than 8 hidden-state outputs");
        int32_t h = -1;
        OSP_TRY(osp_graph_act(g, "hidden", OSP_DTYPE_F32, n_embd, OSP_ROWS_TOKENS, &h));
        const osp_op op = {.kind = OSP_OP_COPY, .dst = h, .src0 = x, .src1 = -1};
        OSP_TRY(osp_graph_push(g, &op));
        g->hidden[g->n_hidden++] = h;
    }
    return OSP_OK;
}

osp_status osp_graph_final_norm(osp_graph *g, const osp_build_opts *o, int32_t x, int64_t n_embd,
                                const struct osp_tensor *out_norm, float eps) {
    if (!o || !o->final_norm) return OSP_OK;
    int32_t e = -1;
    OSP_TRY(osp_graph_act(g, "embd", OSP_DTYPE_BF16, n_embd, OSP_ROWS_TOKENS, &e));
    const osp_op op = {.kind = OSP_OP_ADD_RMSNORM, .dst = e, .src0 = -1, .src1 = x, .w = out_norm, .p.norm.eps = eps};
    OSP_TRY(osp_graph_push(g, &op));
    g->embd = e;
    return OSP_OK;
}

osp_status osp_graph_push(osp_graph *g, const osp_op *op) {
    if (g->n_ops == g->cap_ops) {
        const int32_t cap = g->cap_ops ? 2 * g->cap_ops : 64;
        osp_op *ops = realloc(g->ops, (size_t)cap * sizeof *ops);
        if (!ops) return osp_set_error(OSP_ERR_NOMEM, "op list: out of memory");
        g->ops = ops;
        g->cap_ops = cap;
    }
    g->ops[g->n_ops++] = *op;
    return OSP_OK;
}

const char *osp_op_name(osp_op_kind k) {
    static const char *const names[OSP_OP_COUNT] = {
        [OSP_OP_EMBED] = "embed",           [OSP_OP_ADD_RMSNORM] = "add_rmsnorm", [OSP_OP_GATHER_RMSNORM] = "gather_rmsnorm",
        [OSP_OP_MATMUL] = "matmul",         [OSP_OP_ROPE_KV_WRITE] = "rope_kv_write", [OSP_OP_ATTENTION] = "attention",
        [OSP_OP_GLU] = "glu",               [OSP_OP_ADD] = "add",                 [OSP_OP_COPY] = "copy",
        [OSP_OP_SCALE] = "scale",           [OSP_OP_SOFTCAP] = "softcap",     [OSP_OP_ALL_REDUCE] = "all_reduce",
        [OSP_OP_ALL_GATHER] = "all_gather",
    };
    return (unsigned)k < OSP_OP_COUNT ? names[k] : "?";
}
