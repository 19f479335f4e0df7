/* Sharded data parallelism beyond ZeRO-1, and hybrid sharding, in the GPU model
 * (Megatron-Core's data_parallel_sharding_strategy). `tripod train` runs all four strategies
 * over all of DP (a DiLoCo replica's DP refuses the two past optim), and their bytes are the
 * engine's buffer plan (tpd_plan_cpu_memory). Hybrid sharding (HSDP: a shard group of
 * data_parallel_shard_size ranks short of DP, replicated across DP / S groups) it does not
 * train: its bytes here are a later trainer's target, not an allocation.
 *
 * HSDP memory: over a shard group of S ranks each rank keeps 1/S of the optimizer state
 * (optim), of the fp32 main gradients too (optim_grads: each bucket is reduce-scattered
 * into the shard as soon as it is final, per micro-batch, as DeepSpeed's ZeRO-2 does, so
 * only two buckets of full-size gradients are staged), and of the parameters too
 * (optim_grads_params: FSDP's units of one layer each; fsdp_units_in_flight units hold their
 * full parameters at once, the prefetched one included, and two units' gradients wait for
 * their reduce-scatter).
 *
 * Time: the shard group's collectives run on its link (S ranks TP apart). optim_grads_params
 * gathers each unit before its forward and again before its backward and reduce-scatters
 * its gradients after it, every micro-batch; a pass is simulated unit by unit with the
 * link and the compute as two queues and fsdp_units_in_flight buffers: the first unit's
 * gather is never hidden, a unit whose gather outlasts the compute before it is exposed
 * for the difference. optim_grads reduce-scatters every micro-batch's gradients; those of
 * the earlier micro-batches are exposed for what outlasts their backward. HSDP (S < DP)
 * then all-reduces the shard over the DP / S replicas on theirs, once a step, exposed.
 * Under EP a layer's experts are a unit of their own over expert DP: their share of each
 * gather and reduce-scatter runs on the expert-DP ring (S / EP ranks of the shard group, TP
 * x EP apart), the rest of the layer's on the shard group's ring; a rank's shard is 1/S of
 * the dense elements and EP/S of its experts'. */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

tpd_dp_sharding tpd_plan_sharding(const tpd_plan_layout *lay) {
    if (lay->sharding > TPD_DP_SHARDING_OPTIM) return lay->sharding;
    return lay->distributed_optimizer || lay->sharding == TPD_DP_SHARDING_OPTIM
               ? TPD_DP_SHARDING_OPTIM
               : TPD_DP_SHARDING_NO_SHARD;
}

int tpd_plan_shard_group(const tpd_config *cfg, const tpd_plan_layout *lay) {
    int inner = tpd_plan_dp_inner(cfg, lay);
    return lay->shard_size > 0 && lay->shard_size < inner ? lay->shard_size : inner;
}

static double elem_bytes(const tpd_config *cfg) {
    return cfg->training.precision == TPD_PRECISION_BF16 ? 2.0 : 4.0;
}

static double largest_unit(const tpd_plan_units *u) {
    double m = 0.0;
    for (int i = 0; i < u->n; i++)
        if (u->elems[i] > m) m = u->elems[i];
    return m;
}

tpd_status tpd_plan_shard_memory(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                                 const tpd_plan_stage_mem *full, tpd_plan_stage_mem *out) {
    tpd_dp_sharding sh = tpd_plan_sharding(lay);
    int S = tpd_plan_shard_group(cfg, lay), inner = tpd_plan_dp_inner(cfg, lay);
    /* every strategy over all of DP is the engine's own buffer plan (tpd_plan_cpu_memory) */
    if (sh == TPD_DP_SHARDING_NO_SHARD || S <= 1 || S >= inner) return TPD_OK;
    out->params_full = full->params;
    out->grads_full = full->grads;
    out->optimizer_full = full->optimizer;
    out->gather = 0.0;
    double e = elem_bytes(cfg), g = tpd_config_grad_bytes(cfg);
    double n = full->params / e; /* the stage's padded elements */
    double shard = ceil(n / S);
    tpd_plan_stage_mem m = *out;
    m.total -= m.params + m.grads + m.optimizer + m.outer;
    m.params = full->params;
    m.grads = full->grads;
    m.optimizer = n > 0 ? full->optimizer / n * shard : 0.0;
    m.outer = n > 0 ? full->outer / n * shard : 0.0;
    if (sh >= TPD_DP_SHARDING_OPTIM_GRADS) {
        tpd_plan_units u;
        TPD_CHECK(tpd_plan_units_init(cfg, lay, stage, &u));
        m.grads = shard * g;
        if (sh == TPD_DP_SHARDING_OPTIM_GRADS) {
            m.gather = 2.0 * u.bucket * g; /* one bucket filling, one reduce-scattering */
        } else {
            int units = 0;
            for (int i = 0; i < u.n; i++)
                units += u.elems[i] > 0.0;
            int k = cfg->parallel.fsdp_units_in_flight > 0 ? cfg->parallel.fsdp_units_in_flight : 1;
            if (k > units) k = units;
            double big = largest_unit(&u);
            m.params = shard * e;
            m.gather = k * big * e + 2.0 * big * g;
        }
        tpd_plan_units_free(&u);
    }
    m.total += m.params + m.grads + m.optimizer + m.outer + m.gather;
    *out = m;
    return TPD_OK;
}

tpd_plan_affine tpd_plan_shard_ring(const tpd_plan_cluster *cl, int n, long stride) {
    tpd_plan_affine a = {0.0, 0.0};
    if (n <= 1) return a;
    double bw, lat;
    tpd_plan_group_link(cl, n, stride, &bw, &lat);
    a.per_byte = (n - 1.0) / n / bw;
    a.fixed = (n - 1.0) * lat;
    return a;
}

/* One pass over n units in compute order: unit i computes comp[i] once its gather gat[i]
 * is done and unit i-1 computed; the link runs the gathers in order, each once one of the
 * k buffers is free (unit i-k computed), and after each unit's compute its reduce-scatter
 * rs[i] (rs NULL: a forward), the oldest ready operation first, a gather on a tie. Returns
 * the compute's end less the compute (exposed) and how long the link runs past it (tail). */
static void pass_sim(int n, const double *comp, const double *gat, const double *rs, int k,
                     double *cend, double *exposed_p, double *tail_p) {
    double link = 0.0, work = 0.0, last = 0.0;
    int ng = 0, nr = 0; /* gathers issued, reduce-scatters issued */
    while (ng < n || (rs && nr < n)) {
        double rg = INFINITY, rr = INFINITY;
        if (ng < n) rg = ng >= k ? cend[ng - k] : 0.0;
        if (rs && nr < ng) rr = cend[nr];
        double sg = rg > link ? rg : link, sr = rr > link ? rr : link;
        if (ng < n && sg <= sr) {
            link = sg + gat[ng];
            double start = link > last ? link : last;
            last = cend[ng] = start + comp[ng];
            work += comp[ng];
            ng++;
        } else {
            link = sr + rs[nr];
            nr++;
        }
    }
    *exposed_p = last - work;
    *tail_p = link > last ? link - last : 0.0;
}

/* A stage's optim_grads_params passes of one micro-batch, chunk by chunk: exposed forward
 * and backward time, and the longest reduce-scatter tail past a backward. */
/* A unit's collective of `elems` elements, `x` of them experts' (on the expert-DP ring xr),
 * the rest on the shard group's ring r, at `bytes` an element. */
static double unit_coll(tpd_plan_affine r, tpd_plan_affine xr, double elems, double x,
                        double bytes) {
    double t = r.per_byte * (elems - x) * bytes + r.fixed;
    return x > 0.0 ? t + xr.per_byte * x * bytes + xr.fixed : t;
}

static tpd_status stage_passes(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                               const tpd_plan_stage_cost *c, tpd_plan_affine ring,
                               tpd_plan_affine xring, double *ef, double *eb, double *tail) {
    tpd_plan_units u;
    TPD_CHECK(tpd_plan_units_init(cfg, lay, stage, &u));
    int n = u.n, v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    double *buf = calloc((size_t)n * 8, sizeof *buf);
    if (!buf) {
        tpd_plan_units_free(&u);
        tpd_log_error("plan: out of memory");
        return TPD_ERR_NOMEM;
    }
    double *cf = buf, *cb = buf + n, *ga = buf + 2 * n, *rs = buf + 3 * n, *cend = buf + 4 * n;
    double *tmp = buf + 5 * n, *rb = buf + 6 * n, *tx = buf + 7 * n; /* tx: of tmp, experts' */
    double e = elem_bytes(cfg), g = tpd_config_grad_bytes(cfg);
    int first = stage == 0, last = stage == lay->pp - 1;
    double Ls = u.Ls > 0 ? u.Ls : 1;
    double lf = (c->fwd - c->embed_fwd - c->head_fwd) / Ls;
    double lb = (c->bwd - c->embed_bwd - c->head_bwd) / Ls;
    *ef = *eb = *tail = 0.0;
    int l0 = 0;
    for (int ch = 0; ch < v; ch++) {
        int Lc = tpd_plan_chunk_layers(cfg, lay, stage, ch), m = 0;
        if (Lc < 0) Lc = 0;
        /* the chunk's units in forward order: embedding, layers, final norm and head */
        if (first && ch == 0 && u.elems[0] > 0.0) {
            cf[m] = c->embed_fwd, cb[m] = c->embed_bwd, tx[m] = 0.0, tmp[m++] = u.elems[0];
        }
        for (int i = 0; i < Lc; i++) /* EP: a layer's experts travel over expert DP */
            cf[m] = lf, cb[m] = lb, tx[m] = u.expert[1 + l0 + i], tmp[m++] = u.elems[1 + l0 + i];
        if (last && ch == v - 1) {
            double x = u.elems[u.Ls + 1] + (first ? 0.0 : u.elems[0]); /* a tied head's wte */
            cf[m] = c->head_fwd, cb[m] = c->head_bwd, tx[m] = 0.0, tmp[m++] = x;
        }
        l0 += Lc;
        if (m == 0) continue;
        int k = cfg->parallel.fsdp_units_in_flight > 0 ? cfg->parallel.fsdp_units_in_flight : 1;
        double x, t;
        for (int i = 0; i < m; i++)
            ga[i] = unit_coll(ring, xring, tmp[i], tx[i], e);
        pass_sim(m, cf, ga, NULL, k, cend, &x, &t);
        *ef += x;
        /* the backward walks the units in reverse */
        for (int i = 0; i < m; i++) {
            double w = tmp[m - 1 - i], wx = tx[m - 1 - i];
            ga[i] = unit_coll(ring, xring, w, wx, e);
            rs[i] = unit_coll(ring, xring, w, wx, g);
            rb[i] = cb[m - 1 - i];
        }
        pass_sim(m, rb, ga, rs, k, cend, &x, &t);
        *eb += x;
        if (t > *tail) *tail = t;
    }
    free(buf);
    tpd_plan_units_free(&u);
    return TPD_OK;
}

tpd_status tpd_plan_shard_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                               const tpd_plan_layout *lay, const tpd_plan_stage_cost *cost,
                               double *fwd_p, double *bwd_p, tpd_plan_result *res) {
    tpd_dp_sharding sh = tpd_plan_sharding(lay);
    int S = tpd_plan_shard_group(cfg, lay), inner = tpd_plan_dp_inner(cfg, lay);
    int R = S > 0 ? inner / S : 1, M = res->num_micro_batches;
    double g = tpd_config_grad_bytes(cfg), step_extra = 0.0, tail_max = 0.0, nmax = 0.0;
    res->time.dp_shard_exposed = res->time.dp_replica_allreduce = 0.0;
    res->hop_replica = TPD_PLAN_HOP_NONE;
    res->shard_group = S;
    tpd_plan_affine ring = tpd_plan_shard_ring(cl, S, lay->tp);
    /* EP: the experts' units over expert DP, S / EP ranks TP x EP apart */
    int ep = tpd_plan_ep(lay);
    tpd_plan_affine xring = ep > 1 ? tpd_plan_shard_ring(cl, S / ep, (long)lay->tp * ep) : ring;
    for (int s = 0; s < lay->pp; s++) {
        if (fwd_p) fwd_p[s] = 0.0;
        if (bwd_p) bwd_p[s] = 0.0;
        tpd_plan_units u;
        TPD_CHECK(tpd_plan_units_init(cfg, lay, s, &u));
        double padded = u.padded, xs = 0.0;
        for (int i = 0; i < u.n; i++)
            xs += u.expert[i];
        int nb = u.nbuckets;
        tpd_plan_units_free(&u);
        /* a rank's shard: 1/S of the dense elements, EP/S of its experts' */
        double mine = (padded - xs) / S + (ep > 1 ? xs * ep / S : xs / S);
        if (mine > nmax) nmax = mine;
        if (S <= 1) continue;
        if (sh == TPD_DP_SHARDING_OPTIM_GRADS && M > 1) {
            /* the earlier micro-batches' reduce-scatters, beside their own backward */
            double rs = unit_coll(ring, xring, padded, xs, g) + (nb - 1) * ring.fixed;
            double hide = lay->overlap_grad_reduce ? cost[s].bwd : 0.0;
            double extra = (M - 1) * (rs > hide ? rs - hide : 0.0);
            if (extra > step_extra) step_extra = extra;
        } else if (sh == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS) {
            double ef, eb, tail;
            TPD_CHECK(stage_passes(cfg, lay, s, &cost[s], ring, xring, &ef, &eb, &tail));
            if (fwd_p) fwd_p[s] = ef;
            if (bwd_p) bwd_p[s] = eb;
            if (tail > tail_max) tail_max = tail;
        }
    }
    res->time.dp_shard_exposed = step_extra + tail_max;
    if (R > 1 && sh != TPD_DP_SHARDING_NO_SHARD) {
        /* the shard's all-reduce over the replicas, S*TP ranks apart */
        double bw, lat, bytes = ceil(nmax) * tpd_plan_dp_wire_bytes(cfg);
        long stride = (long)lay->tp * S;
        tpd_plan_group_link(cl, R, stride, &bw, &lat);
        res->hop_replica = tpd_plan_group_hop(cl, R, stride);
        res->time.dp_replica_allreduce = 2.0 * (R - 1) / R * bytes / bw + 2.0 * (R - 1) * lat;
    }
    return TPD_OK;
}
