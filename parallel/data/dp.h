/* Data parallelism over the flat gradient buffer.
 *
 * The buffer is padded to a multiple of DP and cut into buckets of `bucket` elements
 * (a multiple of DP; the last one shorter). Without ZeRO-1 each bucket is all-reduced.
 * With ZeRO-1 (Megatron's distributed optimizer) each bucket is reduce-scattered: DP rank
 * d owns the d-th 1/DP of every bucket, keeps AdamW state (and master weights) only for
 * those ranges, updates them, and all-gathers the parameters bucket by bucket. */
#ifndef TPD_PARALLEL_DATA_DP_H
#define TPD_PARALLEL_DATA_DP_H

#include <stddef.h>

#include "kernels/kernels.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_dp_range {
    size_t begin, end; /* flat element range of the parameter buffer */
    size_t state;      /* offset of `begin` in this rank's optimizer-state shard */
} tpd_dp_range;

typedef struct tpd_dp_plan {
    int dp_size, dp_rank, zero;
    size_t numel;        /* real elements */
    size_t numel_padded; /* multiple of dp_size */
    size_t bucket;       /* elements per bucket, multiple of dp_size */
    int nbuckets;
    int nranges;
    tpd_dp_range *ranges; /* owned: one per bucket with ZeRO, [0, numel_padded) without */
    size_t shard_numel;   /* optimizer-state elements on this rank */
    tpd_dtype wire;       /* what the gradient reductions carry (tpd_dp_plan_set_reduce_dtype);
                             TPD_DTYPE_F32 after init: the gradients' own dtype */
} tpd_dp_plan;

size_t tpd_dp_padded_numel(size_t numel, int dp_size);
/* State elements a rank keeps: numel_padded / dp with ZeRO, numel_padded without. */
size_t tpd_dp_shard_numel(size_t numel, int dp_size, int zero);

tpd_status tpd_dp_plan_init(size_t numel, size_t bucket_elems, int dp_size, int dp_rank, int zero,
                            tpd_dp_plan *plan_p);
void tpd_dp_plan_free(tpd_dp_plan *plan);
/* parallel.grad_reduce_dtype: wire TPD_DTYPE_BF16 sends the gradient reductions of
 * tpd_dp_reduce_bucket (the all-reduce, and ZeRO-1's reduce-scatter) as bf16 with fp32 sums
 * at the receiver (tpd_comm_iallreduce_wire: about 2^-7 relative error, 2^-8 under
 * ZeRO-1, whatever DP is); TPD_DTYPE_F32 is the gradients' own dtype. bf16 needs fp32
 * gradients (grad_dt), else a config error naming the key. */
tpd_status tpd_dp_plan_set_reduce_dtype(tpd_dp_plan *plan, tpd_dtype wire, tpd_dtype grad_dt);

/* Wire bytes one rank sends for a step's DP communication under this plan, by the ring's
 * count: the all-reduce 2 (DP-1)/DP of the buffer, or under ZeRO-1 the reduce-scatter and
 * the parameters' all-gather (DP-1)/DP each. grad_size, param_size: the dtypes' bytes (the
 * gradient reduction carries `wire` where it is bf16). */
double tpd_dp_plan_step_bytes(const tpd_dp_plan *plan, size_t grad_size, size_t param_size);

/* Element range [begin, begin + len) of bucket b (0 .. nbuckets-1). */
void tpd_dp_bucket(const tpd_dp_plan *plan, int b, size_t *begin_p, size_t *len_p);
/* Starts the sum over DP of bucket b of the gradients: a non-blocking all-reduce, or under
 * ZeRO a reduce-scatter after which only this rank's part of the bucket holds the sum.
 * *req_p (NULL with one DP rank) is completed with tpd_comm_wait. */
tpd_status tpd_dp_reduce_bucket(const tpd_dp_plan *plan, tpd_comm *dp, int b, void *grads,
                                tpd_dtype dt, void *stream, tpd_comm_req **req_p);
/* ZeRO: starts the all-gather of bucket b of the parameters from each rank's updated part
 * (*req_p = NULL without ZeRO or with one DP rank). */
tpd_status tpd_dp_gather_bucket(const tpd_dp_plan *plan, tpd_comm *dp, int b, void *params,
                                tpd_dtype dt, void *stream, tpd_comm_req **req_p);

#ifdef __cplusplus
}
#endif
#endif
