/* Inside the proving ground (bench/kernels/): what the op-kind adapters (kb_ops.c) tell the
 * definition loader and the solutions. */
#ifndef OSP_BENCH_KERNELS_KB_INTERNAL_H
#define OSP_BENCH_KERNELS_KB_INTERNAL_H

#include "bench/kernels/kbench.h"

/* An op kind the proving ground knows: the names of its dimensions, inputs and outputs, in the order
 * a definition must declare them. */
typedef struct kb_kind {
    osp_op_kind kind;
    const char *dims[KB_MAX_DIMS];
    int n_dims;
    const char *in[KB_MAX_IO];
    int n_in;
    const char *out[KB_MAX_IO];
    int n_out;
    const char *in_shape[KB_MAX_IO]; /* "T,E": the shape each must declare */
    const char *out_shape[KB_MAX_IO];
    const char *may_be_zero; /* the one dimension allowed to be 0 (attention's cached prefix P), or NULL */
} kb_kind;

/* NULL: the kind has no adapter yet */
const kb_kind *kb_kind_of(osp_op_kind k);
/* x made representable in dtype t (bf16, f16; others: x) */
float kb_representable(uint32_t t, float x);
/* n values of generator g times scale, each representable in dtype, from the stream s */
void kb_fill(float *v, size_t n, kb_gen g, double scale, uint32_t dtype, uint64_t *s);
/* rope_kv_write's rotated dimensions per head */
int64_t rope_n_rot(const kb_case *c);
/* the attention's softmax scale: the definition's, or 1 / sqrt(D) */
double attn_scale(const kb_case *c);
/* The elements of every input and output of d's kind at dimensions dim (a case holds each in fp32 and
 * the outputs' reference in fp64): at most KB_MAX_CASE_ELEMENTS, checked when a definition is loaded
 * (listed workloads) and when a case is made (any). */
#define KB_MAX_CASE_ELEMENTS ((double)(1 << 28))
double kb_case_elements(const kb_def *d, const int64_t *dim);
/* c->ref from c->in (and c->ids, c->lidx); matmul and attention on every CPU when large */
void kb_reference(kb_case *c);
/* the message fmt into err (n bytes); false, for `return kb_fail(...)` in the loaders */
bool kb_fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
