/* The tensor-parallel communicator behind the ALL_REDUCE op kind (op.h): the collectives the ranks of
 * one model run in the same order (Megatron-LM's column / row split, Shoeybi et al. 2019, §3: an
 * all-reduce after each row-parallel projection). The public handle is osp_comm (osprey/model.h).
 *
 * Implementations: "local", N ranks as threads of one process sharing host memory (the CPU backend;
 * what the tests and CI run, since NCCL refuses two ranks on one GPU); NCCL for the CUDA backend is
 * not built yet. Every rank gets the same bits: the sum runs in rank order 0, 1, ..., N - 1 whatever the
 * threads' timing. An all-gather (the vocabulary-parallel lm_head's) concatenates the ranks' columns. */
#ifndef OSP_BACKEND_COMM_H
#define OSP_BACKEND_COMM_H

#include <stdint.h>

#include "osprey/model.h"

/* The watchdog's default (torch.distributed's NCCL default): a rank waiting this long at one collective
 * aborts the communicator. */
#define OSP_COMM_DEFAULT_TIMEOUT_S 600.0
/* longer timeouts (~31 years) mean none: a deadline past them would overflow time_t's arithmetic */
#define OSP_COMM_MAX_TIMEOUT_S 1e9

/* The number of ranks c serves. */
int32_t osp_comm_world(const osp_comm *c);

/* buf [n] of `rank` <- the sum over the ranks of their buf [n], fp32 adds in rank order. Every rank
 * calls it with the same n, each with its own buffer; returns when all have their result. Errors:
 * OSP_ERR_INVALID_ARG (rank out of range: that rank alone; n < 0 or a NULL buf on any rank, or the ranks'
 * n differ: every rank gets it),
 * OSP_ERR_NOMEM, OSP_ERR_INTERNAL once the communicator is aborted (osp_comm_abort): no rank waits
 * for a rank that failed. */
osp_status osp_comm_all_reduce_f32(osp_comm *c, int32_t rank, float *buf, int64_t n);

/* dst [rows, cols] of `rank` <- the ranks' src [rows, cols_r] side by side, rank 0's columns first (the
 * all-gather after a vocabulary-parallel lm_head: each rank's logits for its share of the vocabulary).
 * Every rank calls it with the same rows and cols, each with its own src (cols_r columns, any split
 * that sums to cols) and dst; copies only, so every rank gets the same bits. Returns when all have their
 * result (no rank's src is read after that). Errors: OSP_ERR_INVALID_ARG (rank out of range: that rank
 * alone; negative sizes, cols_r > cols or NULL buffers on any rank, the ranks' rows or cols differ or
 * their cols_r do not sum to cols: every rank gets it),
 * OSP_ERR_INTERNAL once the communicator is aborted. */
osp_status osp_comm_all_gather_f32(osp_comm *c, int32_t rank, const float *src, int64_t rows, int64_t cols_r, float *dst,
                                   int64_t cols);

#endif
