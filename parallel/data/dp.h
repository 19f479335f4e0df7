/* Data parallelism over the flat gradient buffer.
 *
 * The buffer is padded to a multiple of DP and cut into buckets of `bucket` elements
 * (a multiple of DP; the last one shorter). Without ZeRO-1 each bucket is all-reduced.
 * With ZeRO-1 (Megatron's distributed optimizer) each bucket is reduce-scattered: DP rank
 * d owns the d-th 1/DP of every bucket, keeps AdamW state (and master weights) only for
 * those ranges, updates them, and all-gathers the parameters bucket by bucket.
 *
 * ZeRO-2 and ZeRO-3 (data_parallel_sharding_strategy optim_grads, optim_grads_params) cut
 * along the model's units instead (tpd_dp_plan_init_units): bucket u is unit u's element
 * range [bounds[u], bounds[u+1]), not padded in the flat buffer; its part is
 * ceil(len / DP) elements and DP rank d owns [bounds[u] + d * part, + part) clipped to the
 * unit (a short or empty range for the last ranks of a small unit). The shard keeps `part`
 * elements per unit, the clipped tail as zeros, so that every rank's piece of a unit's
 * collective is the same size: a unit travels as part * DP elements in a staging slot of
 * that size (tpd_dp_unit_slot_numel), never in place in the flat buffer. */
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
    /* unit-aligned plans (tpd_dp_plan_init_units; NULL otherwise): */
    size_t *bounds;    /* (nbuckets + 1) element bounds of the units */
    size_t *part;      /* (nbuckets) elements of each rank's part of unit u */
    int micro_batches; /* ZeRO-2/3 reduce every micro-batch: tpd_dp_plan_step_bytes counts
                          them (1 after init) */
    int gather_params; /* ZeRO-3: the parameters travel before every forward and backward */
    /* expert parallelism (tpd_dp_plan_set_experts; 0 and 1 otherwise): the flat range
     * [0, expert_end) holds the experts, which only the expert-DP group's edp_size ranks
     * share; its gradients are summed over that group, the rest over DP */
    size_t expert_end;
    int edp_size;
    int ebuckets; /* ZeRO-1 under EP (tpd_dp_plan_init_ep): buckets [0, ebuckets) cut the
                     experts' range and shard over expert DP, the rest the others over DP;
                     a unit-aligned plan under EP (tpd_dp_plan_init_units_ep): its expert
                     units */
} tpd_dp_plan;

size_t tpd_dp_padded_numel(size_t numel, int dp_size);
/* State elements a rank keeps: numel_padded / dp with ZeRO, numel_padded without. */
size_t tpd_dp_shard_numel(size_t numel, int dp_size, int zero);

tpd_status tpd_dp_plan_init(size_t numel, size_t bucket_elems, int dp_size, int dp_rank, int zero,
                            tpd_dp_plan *plan_p);
void tpd_dp_plan_free(tpd_dp_plan *plan);
/* The unit-aligned plan of ZeRO-2 (gather_params 0) or ZeRO-3 (1) over nunits units with
 * element bounds bounds[0 .. nunits] (bounds[0] = 0, bounds[nunits] = numel), sharded over
 * dp_size ranks (zero is 1 whenever dp_size > 1). */
tpd_status tpd_dp_plan_init_units(const size_t *bounds, int nunits, int dp_size, int dp_rank,
                                  int gather_params, tpd_dp_plan *plan_p);
/* tpd_dp_plan_init_units under EP: units [0, eunits) are expert units (the experts'
 * region, [0, expert_end = bounds[eunits])), each cut over the expert-DP group (dp_size /
 * ep_size ranks; this rank's index dp_rank / ep_size) and staged in slots of part * that
 * group's size; the rest over DP. eunits 0 is tpd_dp_plan_init_units. */
tpd_status tpd_dp_plan_init_units_ep(const size_t *bounds, int nunits, int eunits, int dp_size,
                                     int dp_rank, int ep_size, int gather_params,
                                     tpd_dp_plan *plan_p);
/* Elements a rank's shard of a unit-aligned plan keeps: the sum over units of
 * ceil(len / dp_size). */
size_t tpd_dp_units_shard_numel(const size_t *bounds, int nunits, int dp_size);
/* Staging elements of unit u of a unit-aligned plan: part * DP (an expert unit: part *
 * expert DP). */
size_t tpd_dp_unit_slot_numel(const tpd_dp_plan *plan, int u);
/* This rank's part of unit u in its slot: the DP rank, or for an expert unit the index in
 * the expert-DP group. */
int tpd_dp_unit_rank(const tpd_dp_plan *plan, int u);
/* parallel.grad_reduce_dtype: wire TPD_DTYPE_BF16 sends the gradient reductions of
 * tpd_dp_reduce_bucket (the all-reduce, and ZeRO-1's reduce-scatter) as bf16 with fp32 sums
 * at the receiver (tpd_comm_iallreduce_wire: about 2^-7 relative error, 2^-8 under
 * ZeRO-1, whatever DP is); TPD_DTYPE_F32 is the gradients' own dtype. bf16 needs fp32
 * gradients (grad_dt), else a config error naming the key. */
tpd_status tpd_dp_plan_set_reduce_dtype(tpd_dp_plan *plan, tpd_dtype wire, tpd_dtype grad_dt);

/* Wire bytes one rank sends for a step's DP communication under this plan, by the ring's
 * count: the all-reduce 2 (DP-1)/DP of the buffer, or under ZeRO-1 the reduce-scatter and
 * the parameters' all-gather (DP-1)/DP each. ZeRO-2 reduce-scatters every micro-batch
 * (plan->micro_batches) and gathers once; ZeRO-3 gathers twice per micro-batch (forward
 * and backward) and reduce-scatters once, over the padded unit slots. grad_size, param_size: the
 * dtypes' bytes (the gradient reduction carries `wire` where it is bf16). */
double tpd_dp_plan_step_bytes(const tpd_dp_plan *plan, size_t grad_size, size_t param_size);

/* ZeRO-1 under EP: the experts' range [0, expert_end) (a multiple of dp_size) in buckets of
 * its own, each reduce-scattered over the expert-DP group (dp_size / ep_size ranks; this
 * rank's index dp_rank / ep_size) and its parts owned there; the rest over DP as
 * tpd_dp_plan_init cuts it. */
tpd_status tpd_dp_plan_init_ep(size_t numel, size_t expert_end, size_t bucket_elems, int dp_size,
                               int dp_rank, int ep_size, tpd_dp_plan *plan_p);
/* EP: the experts' range [0, expert_end) of the flat buffer is summed over an expert-DP
 * group of edp_size ranks (tpd_dp_reduce_bucket_ep). Fails (TPD_ERR_UNSUPPORTED) for a
 * plan that shards (ZeRO): its shards would cut across both groups. */
tpd_status tpd_dp_plan_set_experts(tpd_dp_plan *plan, size_t expert_end, int edp_size);
/* Element range [begin, begin + len) of bucket b (0 .. nbuckets-1). */
void tpd_dp_bucket(const tpd_dp_plan *plan, int b, size_t *begin_p, size_t *len_p);
/* Starts the sum over DP of bucket b of the gradients: a non-blocking all-reduce, or under
 * ZeRO a reduce-scatter after which only this rank's part of the bucket holds the sum
 * (a part is the bucket over dp's size: under EP an expert bucket goes over expert DP).
 * *req_p (NULL with one DP rank) is completed with tpd_comm_wait. */
tpd_status tpd_dp_reduce_bucket(const tpd_dp_plan *plan, tpd_comm *dp, int b, void *grads,
                                tpd_dtype dt, void *stream, tpd_comm_req **req_p);
/* tpd_dp_reduce_bucket with the experts' range: the part of bucket b below expert_end is
 * all-reduced over edp (*ereq_p), the rest over dp (*req_p); either request may be NULL. */
tpd_status tpd_dp_reduce_bucket_ep(const tpd_dp_plan *plan, tpd_comm *dp, tpd_comm *edp, int b,
                                   void *grads, tpd_dtype dt, void *stream, tpd_comm_req **req_p,
                                   tpd_comm_req **ereq_p);
/* ZeRO: starts the all-gather of bucket b of the parameters from each rank's updated part
 * (*req_p = NULL without ZeRO or with one DP rank). */
tpd_status tpd_dp_gather_bucket(const tpd_dp_plan *plan, tpd_comm *dp, int b, void *params,
                                tpd_dtype dt, void *stream, tpd_comm_req **req_p);

#ifdef __cplusplus
}
#endif
#endif
