#include "parallel/data/dp.h"

#include <stdlib.h>

size_t tpd_dp_padded_numel(size_t numel, int dp_size) {
    size_t d = (size_t)dp_size;
    return (numel + d - 1) / d * d;
}

size_t tpd_dp_shard_numel(size_t numel, int dp_size, int zero) {
    size_t padded = tpd_dp_padded_numel(numel, dp_size);
    return zero ? padded / (size_t)dp_size : padded;
}

tpd_status tpd_dp_plan_init(size_t numel, size_t bucket_elems, int dp_size, int dp_rank, int zero,
                            tpd_dp_plan *plan_p) {
    tpd_dp_plan p = {
        .dp_size = dp_size, .dp_rank = dp_rank, .zero = zero && dp_size > 1, .numel = numel};
    size_t d = (size_t)dp_size;
    p.numel_padded = tpd_dp_padded_numel(numel, dp_size);
    if (bucket_elems < d) bucket_elems = d;
    p.bucket = bucket_elems / d * d;
    if (p.bucket > p.numel_padded) p.bucket = p.numel_padded;
    p.nbuckets = p.bucket ? (int)((p.numel_padded + p.bucket - 1) / p.bucket) : 0;
    p.nranges = p.zero ? p.nbuckets : 1;
    p.ranges = calloc((size_t)(p.nranges ? p.nranges : 1), sizeof *p.ranges);
    if (!p.ranges)
        return tpd_fail_nomem("the DP ranges",
                              (size_t)(p.nranges ? p.nranges : 1) * sizeof *p.ranges);
    if (!p.zero) {
        p.ranges[0] = (tpd_dp_range){0, p.numel_padded, 0};
        p.shard_numel = p.numel_padded;
    } else {
        size_t state = 0;
        for (int b = 0; b < p.nbuckets; b++) {
            size_t b0 = (size_t)b * p.bucket;
            size_t len = (p.numel_padded - b0 < p.bucket ? p.numel_padded - b0 : p.bucket);
            size_t part = len / d; /* len is a multiple of d: both ends are */
            p.ranges[b] = (tpd_dp_range){b0 + part * (size_t)dp_rank,
                                         b0 + part * (size_t)(dp_rank + 1), state};
            state += part;
        }
        p.shard_numel = state;
    }
    *plan_p = p;
    return TPD_OK;
}

void tpd_dp_plan_free(tpd_dp_plan *plan) {
    free(plan->ranges);
    free(plan->bounds);
    free(plan->part);
    plan->ranges = NULL;
    plan->bounds = plan->part = NULL;
}

static size_t unit_part(size_t len, int dp_size) {
    return (len + (size_t)dp_size - 1) / (size_t)dp_size;
}

size_t tpd_dp_units_shard_numel(const size_t *bounds, int nunits, int dp_size) {
    size_t n = 0;
    for (int u = 0; u < nunits; u++)
        n +=
            dp_size > 1 ? unit_part(bounds[u + 1] - bounds[u], dp_size) : bounds[u + 1] - bounds[u];
    return n;
}

tpd_status tpd_dp_plan_init_units(const size_t *bounds, int nunits, int dp_size, int dp_rank,
                                  int gather_params, tpd_dp_plan *plan_p) {
    return tpd_dp_plan_init_units_ep(bounds, nunits, 0, dp_size, dp_rank, 1, gather_params, plan_p);
}

/* The ranks unit u is cut over and this rank's index among them: expert DP for an expert
 * unit (EP), else DP. */
static void unit_group(const tpd_dp_plan *p, int u, int *size_p, int *rank_p) {
    int ex = u < p->ebuckets;
    *size_p = ex ? p->edp_size : p->dp_size;
    *rank_p = ex ? p->dp_rank / (p->dp_size / p->edp_size) : p->dp_rank;
}

tpd_status tpd_dp_plan_init_units_ep(const size_t *bounds, int nunits, int eunits, int dp_size,
                                     int dp_rank, int ep_size, int gather_params,
                                     tpd_dp_plan *plan_p) {
    if (ep_size < 1 || dp_size % ep_size || eunits < 0 || eunits > nunits)
        return tpd_fail(TPD_ERR_INTERNAL, "dp: %d expert units of %d over EP %d do not split DP %d",
                        eunits, nunits, ep_size, dp_size);
    tpd_dp_plan p = {.dp_size = dp_size,
                     .dp_rank = dp_rank,
                     .zero = dp_size > 1,
                     .numel = bounds[nunits],
                     .numel_padded = bounds[nunits],
                     .nbuckets = nunits,
                     .nranges = nunits,
                     .micro_batches = 1,
                     .gather_params = gather_params,
                     .expert_end = bounds[eunits],
                     .edp_size = eunits > 0 ? dp_size / ep_size : 1,
                     .ebuckets = eunits};
    size_t n = nunits > 0 ? (size_t)nunits : 1;
    p.ranges = calloc(n, sizeof *p.ranges);
    p.bounds = calloc(n + 1, sizeof *p.bounds);
    p.part = calloc(n, sizeof *p.part);
    if (!p.ranges || !p.bounds || !p.part) {
        tpd_dp_plan_free(&p);
        return tpd_fail_nomem("the DP unit ranges", n * (2 * sizeof *p.part + sizeof *p.ranges));
    }
    size_t state = 0;
    for (int u = 0; u <= nunits; u++)
        p.bounds[u] = bounds[u];
    for (int u = 0; u < nunits; u++) {
        int g, r;
        unit_group(&p, u, &g, &r);
        size_t b0 = bounds[u], len = bounds[u + 1] - b0;
        size_t part = g > 1 ? unit_part(len, g) : len;
        size_t lo = b0 + part * (size_t)r, hi = lo + part;
        if (lo > b0 + len) lo = b0 + len;
        if (hi > b0 + len) hi = b0 + len;
        p.part[u] = part;
        p.ranges[u] = (tpd_dp_range){lo, hi, state};
        state += part;
        if (part * (size_t)g > p.bucket) p.bucket = part * (size_t)g; /* the largest slot */
    }
    p.shard_numel = state;
    *plan_p = p;
    return TPD_OK;
}

size_t tpd_dp_unit_slot_numel(const tpd_dp_plan *plan, int u) {
    if (!plan->part) return 0;
    int g, r;
    unit_group(plan, u, &g, &r);
    return plan->part[u] * (size_t)g;
}

int tpd_dp_unit_rank(const tpd_dp_plan *plan, int u) {
    int g, r;
    unit_group(plan, u, &g, &r);
    return r;
}

tpd_status tpd_dp_plan_set_reduce_dtype(tpd_dp_plan *plan, tpd_dtype wire, tpd_dtype grad_dt) {
    if (wire != TPD_DTYPE_F32 && wire != TPD_DTYPE_BF16)
        return tpd_fail(TPD_ERR_INVALID, "parallel.grad_reduce_dtype: must be fp32 or bf16");
    if (wire == TPD_DTYPE_BF16 && grad_dt != TPD_DTYPE_F32)
        return tpd_fail(TPD_ERR_INVALID,
                        "parallel.grad_reduce_dtype: bf16 (bf16 on the wire, fp32 sums) needs "
                        "fp32 gradients; these are %s (set it to fp32)",
                        grad_dt == TPD_DTYPE_BF16 ? "bf16" : "not fp32");
    plan->wire = wire;
    return TPD_OK;
}

void tpd_dp_bucket(const tpd_dp_plan *plan, int b, size_t *begin_p, size_t *len_p) {
    if (plan->bounds) {
        *begin_p = plan->bounds[b];
        *len_p = plan->bounds[b + 1] - plan->bounds[b];
        return;
    }
    size_t b0 = (size_t)b * plan->bucket, end = plan->numel_padded;
    if (plan->ebuckets > 0) { /* the experts' buckets, then the rest's from expert_end */
        if (b < plan->ebuckets)
            end = plan->expert_end;
        else
            b0 = plan->expert_end + (size_t)(b - plan->ebuckets) * plan->bucket;
    }
    *begin_p = b0;
    *len_p = end - b0 < plan->bucket ? end - b0 : plan->bucket;
}

tpd_status tpd_dp_plan_init_ep(size_t numel, size_t expert_end, size_t bucket_elems, int dp_size,
                               int dp_rank, int ep_size, tpd_dp_plan *plan_p) {
    size_t d = (size_t)dp_size;
    if (dp_size < 2 || ep_size < 1 || dp_size % ep_size || expert_end % d || expert_end > numel)
        return tpd_fail(TPD_ERR_INTERNAL,
                        "dp: the experts' range (%zu elements) of a ZeRO-1 plan must end on a "
                        "multiple of DP %d, which EP %d divides",
                        expert_end, dp_size, ep_size);
    tpd_dp_plan p = {.dp_size = dp_size, .dp_rank = dp_rank, .zero = 1, .numel = numel};
    p.numel_padded = tpd_dp_padded_numel(numel, dp_size);
    p.bucket = (bucket_elems < d ? d : bucket_elems) / d * d;
    p.expert_end = expert_end;
    p.edp_size = dp_size / ep_size;
    size_t dense = p.numel_padded - expert_end;
    int eb = (int)((expert_end + p.bucket - 1) / p.bucket);
    p.nbuckets = eb + (int)((dense + p.bucket - 1) / p.bucket);
    p.ebuckets = eb;
    p.nranges = p.nbuckets;
    p.ranges = calloc((size_t)(p.nranges ? p.nranges : 1), sizeof *p.ranges);
    if (!p.ranges)
        return tpd_fail_nomem("the DP ranges",
                              (size_t)(p.nranges ? p.nranges : 1) * sizeof *p.ranges);
    size_t state = 0;
    for (int b = 0; b < p.nbuckets; b++) {
        size_t b0, len;
        tpd_dp_bucket(&p, b, &b0, &len);
        int ex = b < eb, n = ex ? p.edp_size : dp_size;
        int r = ex ? dp_rank / ep_size : dp_rank;
        size_t part = len / (size_t)n; /* len is a multiple of DP, and of expert DP */
        p.ranges[b] = (tpd_dp_range){b0 + part * (size_t)r, b0 + part * (size_t)(r + 1), state};
        state += part;
    }
    p.shard_numel = state;
    *plan_p = p;
    return TPD_OK;
}

tpd_status tpd_dp_reduce_bucket(const tpd_dp_plan *plan, tpd_comm *dp, int b, void *grads,
                                tpd_dtype dt, void *stream, tpd_comm_req **req_p) {
    *req_p = NULL;
    if (!dp || tpd_comm_size(dp) == 1) return TPD_OK;
    if (plan->bounds)
        return tpd_fail(TPD_ERR_INTERNAL, "dp: a unit-aligned plan reduces from staging slots");
    size_t b0, len, es = tpd_dtype_size(dt);
    tpd_dp_bucket(plan, b, &b0, &len);
    char *base = (char *)grads + b0 * es;
    /* the plain reduction unless the plan puts bf16 on the wire for fp32 gradients */
    tpd_dtype wire = plan->wire == TPD_DTYPE_BF16 ? TPD_DTYPE_BF16 : dt;
    if (plan->zero) {
        size_t part = len / (size_t)tpd_comm_size(dp);
        return tpd_comm_ireduce_scatter_wire(dp, base, base + part * (size_t)tpd_comm_rank(dp) * es,
                                             part, dt, wire, TPD_COMM_OP_SUM, stream, req_p);
    }
    return tpd_comm_iallreduce_wire(dp, base, base, len, dt, wire, TPD_COMM_OP_SUM, stream, req_p);
}

tpd_status tpd_dp_plan_set_experts(tpd_dp_plan *plan, size_t expert_end, int edp_size) {
    if (expert_end > 0 && (plan->bounds || (plan->zero && !plan->ebuckets)))
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "dp: the experts' gradients are summed over their own group, which a "
                        "sharded plan (ZeRO) does not split by");
    plan->expert_end = expert_end;
    plan->edp_size = edp_size > 0 ? edp_size : 1;
    return TPD_OK;
}

/* All-reduces [b0, b0 + len) of the gradients over c (nothing for one rank or none). */
static tpd_status allreduce_range(const tpd_dp_plan *plan, tpd_comm *c, void *grads, size_t b0,
                                  size_t len, tpd_dtype dt, void *stream, tpd_comm_req **req_p) {
    *req_p = NULL;
    if (!c || tpd_comm_size(c) == 1 || len == 0) return TPD_OK;
    char *base = (char *)grads + b0 * tpd_dtype_size(dt);
    tpd_dtype wire = plan->wire == TPD_DTYPE_BF16 ? TPD_DTYPE_BF16 : dt;
    return tpd_comm_iallreduce_wire(c, base, base, len, dt, wire, TPD_COMM_OP_SUM, stream, req_p);
}

tpd_status tpd_dp_reduce_bucket_ep(const tpd_dp_plan *plan, tpd_comm *dp, tpd_comm *edp, int b,
                                   void *grads, tpd_dtype dt, void *stream, tpd_comm_req **req_p,
                                   tpd_comm_req **ereq_p) {
    *req_p = *ereq_p = NULL;
    if (plan->expert_end == 0) return tpd_dp_reduce_bucket(plan, dp, b, grads, dt, stream, req_p);
    if (plan->zero) /* ZeRO-1: an expert bucket is reduce-scattered over expert DP */
        return b < plan->ebuckets ? tpd_dp_reduce_bucket(plan, edp, b, grads, dt, stream, ereq_p)
                                  : tpd_dp_reduce_bucket(plan, dp, b, grads, dt, stream, req_p);
    size_t b0, len;
    tpd_dp_bucket(plan, b, &b0, &len);
    size_t cut =
        plan->expert_end < b0 ? b0 : (plan->expert_end > b0 + len ? b0 + len : plan->expert_end);
    TPD_CHECK(allreduce_range(plan, edp, grads, b0, cut - b0, dt, stream, ereq_p));
    return allreduce_range(plan, dp, grads, cut, b0 + len - cut, dt, stream, req_p);
}

tpd_status tpd_dp_gather_bucket(const tpd_dp_plan *plan, tpd_comm *dp, int b, void *params,
                                tpd_dtype dt, void *stream, tpd_comm_req **req_p) {
    *req_p = NULL;
    if (!plan->zero || !dp || tpd_comm_size(dp) == 1) return TPD_OK;
    if (plan->bounds)
        return tpd_fail(TPD_ERR_INTERNAL, "dp: a unit-aligned plan gathers into staging slots");
    size_t b0, len, es = tpd_dtype_size(dt);
    tpd_dp_bucket(plan, b, &b0, &len);
    size_t part = len / (size_t)tpd_comm_size(dp); /* under EP an expert bucket: expert DP */
    char *base = (char *)params + b0 * es;
    return tpd_comm_iallgather(dp, base + part * (size_t)tpd_comm_rank(dp) * es, base, part, dt,
                               stream, req_p);
}

double tpd_dp_plan_step_bytes(const tpd_dp_plan *plan, size_t grad_size, size_t param_size) {
    if (plan->dp_size < 2) return 0.0;
    double n = plan->dp_size, ring = (n - 1.0) / n * (double)plan->numel_padded;
    double wire = plan->wire == TPD_DTYPE_BF16 ? 2.0 : (double)grad_size;
    if (plan->bounds) { /* over the padded slots, each on its group's ring */
        double r = 0.0, M = plan->micro_batches;
        for (int u = 0; u < plan->nbuckets; u++) {
            int g, k;
            unit_group(plan, u, &g, &k);
            r += (g - 1.0) / g * (double)tpd_dp_unit_slot_numel(plan, u);
        }
        return plan->gather_params ? M * r * (wire + 2.0 * (double)param_size)
                                   : r * (M * wire + (double)param_size);
    }
    if (plan->expert_end > 0) { /* EP: the experts' range over the expert-DP group */
        double e = plan->edp_size, x = (double)plan->expert_end;
        ring = (n - 1.0) / n * ((double)plan->numel_padded - x) + (e - 1.0) / e * x;
    }
    return plan->zero ? ring * (wire + (double)param_size) : 2.0 * ring * wire;
}
