#include "engine/optim/grad_shard.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/fault.h"

enum { NO_UNIT = -2 }; /* units are -1 .. Ls */
enum { G_FREE, G_OPEN, G_REDUCING };

typedef struct pslot {
    int unit;          /* NO_UNIT: empty */
    int refs;          /* calls reading it now */
    tpd_comm_req *req; /* its gather, until the first reader waits for it */
    uint64_t stamp;    /* last release: the least recent empty-handed slot is reused */
} pslot;

typedef struct gslot {
    int unit, state;
    int opens;         /* G_OPEN: calls whose gradients are not final yet (ZB-H1: B to W) */
    tpd_comm_req *req; /* G_REDUCING: the reduce-scatter */
    uint64_t seq;      /* issue order of the reduce-scatter */
} gslot;

struct tpd_grad_shard {
    tpd_model *m;
    const tpd_dp_plan *dpp;
    tpd_comm *dp, *emb; /* dp: the shard group (HSDP's, or the DP group) */
    tpd_comm *rep;      /* HSDP: the shard's replicas in the other groups; NULL otherwise */
    int params;         /* optim_grads_params */
    int np, ng;
    pslot *ps;
    gslot *gs; /* ng pooled slots, then the embedding's */
    uint64_t clock, seq;
    double exposed;
};

static size_t unit_len(const tpd_grad_shard *sh, int i) {
    return sh->m->ubound[i + 1] - sh->m->ubound[i];
}

static char *pslot_mem(const tpd_grad_shard *sh, int k) {
    const tpd_buffer_plan *b = &sh->m->plan;
    return (char *)sh->m->pool_p + (size_t)k * b->pslot_numel * b->param_size;
}

/* k = ng: the embedding's slot */
static char *gslot_mem(const tpd_grad_shard *sh, int k) {
    const tpd_buffer_plan *b = &sh->m->plan;
    return (char *)sh->m->pool_g + (size_t)k * b->gslot_numel * b->grad_size;
}

static tpd_status wait_req(tpd_grad_shard *sh, tpd_comm_req **req, int exposed) {
    if (!*req) return TPD_OK;
    double t0 = tpd_clock_s();
    tpd_status st = tpd_comm_wait(sh->dp, *req);
    *req = NULL;
    if (exposed) sh->exposed += tpd_clock_s() - t0;
    return st;
}

tpd_status tpd_grad_shard_create(tpd_model *m, const tpd_dp_plan *dpp, const tpd_mesh_comms *comms,
                                 tpd_grad_shard **sh_p) {
    const tpd_buffer_plan *b = &m->plan;
    if (!dpp->bounds || dpp->nbuckets != m->nunits)
        return tpd_fail(TPD_ERR_INTERNAL, "grad shard: the DP plan is not aligned to the units");
    tpd_grad_shard *sh = calloc(1, sizeof *sh);
    if (!sh) return tpd_fail_nomem("the sharded gradient sync", sizeof *sh);
    sh->m = m;
    sh->dpp = dpp;
    sh->dp = comms->dp_shard ? comms->dp_shard : comms->dp;
    sh->rep = comms->dp_rep;
    sh->emb = comms->emb;
    sh->params = b->sharding == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS;
    sh->np = b->pool_params;
    sh->ng = b->pool_grads;
    sh->ps = calloc((size_t)sh->np + 1, sizeof *sh->ps);
    sh->gs = calloc((size_t)sh->ng + 1, sizeof *sh->gs);
    if (!sh->ps || !sh->gs) {
        tpd_grad_shard_destroy(sh);
        return tpd_fail_nomem("the staging slots", (size_t)(sh->np + sh->ng + 2) * sizeof *sh->ps);
    }
    for (int k = 0; k < sh->np; k++)
        sh->ps[k].unit = NO_UNIT;
    for (int k = 0; k <= sh->ng; k++)
        sh->gs[k].unit = NO_UNIT;
    *sh_p = sh;
    return TPD_OK;
}

/* ---- parameters (optim_grads_params) ---- */

static int find_pslot(const tpd_grad_shard *sh, int unit) {
    for (int k = 0; k < sh->np; k++)
        if (sh->ps[k].unit == unit) return k;
    return -1;
}

/* A slot for a new unit: an empty one, else the least recently released one that nobody
 * reads and whose gather was waited for (`evict_pending`: or one still in flight, waited
 * for here); -1 when every slot is in use. */
static int room(const tpd_grad_shard *sh, int evict_pending) {
    int best = -1;
    for (int k = 0; k < sh->np; k++) {
        const pslot *s = &sh->ps[k];
        if (s->unit == NO_UNIT) return k;
        if (s->refs > 0 || (s->req && !evict_pending)) continue;
        if (best < 0 || s->stamp < sh->ps[best].stamp) best = k;
    }
    return best;
}

static tpd_status start_gather(tpd_grad_shard *sh, int unit, int k) {
    tpd_model *m = sh->m;
    int i = unit + 1;
    pslot *s = &sh->ps[k];
    TPD_CHECK(wait_req(sh, &s->req, 1)); /* an evicted prefetch */
    s->unit = unit;
    s->refs = 0;
    s->stamp = ++sh->clock;
    const char *mine = (const char *)m->params + sh->dpp->ranges[i].state * m->plan.param_size;
    return tpd_comm_iallgather(sh->dp, mine, pslot_mem(sh, k), sh->dpp->part[i],
                               tpd_kern_param_dtype(m->kb), tpd_kern_stream(m->kb), &s->req);
}

static tpd_status acquire_params(tpd_grad_shard *sh, int unit) {
    int i = unit + 1;
    if (unit_len(sh, i) == 0) return TPD_OK;
    int k = find_pslot(sh, unit);
    if (k < 0) {
        k = room(sh, 1);
        if (k < 0)
            return tpd_fail(TPD_ERR_INTERNAL,
                            "grad shard: all %d parameter slots are in use "
                            "(parallel.fsdp_units_in_flight)",
                            sh->np);
        TPD_CHECK(start_gather(sh, unit, k));
    }
    pslot *s = &sh->ps[k];
    TPD_CHECK(wait_req(sh, &s->req, 1));
    s->refs++;
    sh->m->ubase_p[i] = pslot_mem(sh, k);
    return TPD_OK;
}

static void release_params(tpd_grad_shard *sh, int unit) {
    int k = find_pslot(sh, unit);
    if (k < 0 || sh->ps[k].refs == 0) return;
    if (--sh->ps[k].refs == 0) {
        sh->ps[k].stamp = ++sh->clock;
        sh->m->ubase_p[unit + 1] = NULL;
    }
}

/* The unit after `unit` in a pass in direction dir (+1 forward, -1 backward) on this
 * stage, skipping empty ones; NO_UNIT at the end. */
static int next_unit(const tpd_grad_shard *sh, int unit, int dir) {
    int Ls = sh->m->d.Ls;
    for (int u = unit + dir; u >= 0 && u <= Ls; u += dir)
        if (unit_len(sh, u + 1) > 0) return u;
    return NO_UNIT;
}

static tpd_status prefetch(tpd_grad_shard *sh, int unit) {
    if (unit == NO_UNIT || find_pslot(sh, unit) >= 0) return TPD_OK;
    int k = room(sh, 0);
    return k < 0 ? TPD_OK : start_gather(sh, unit, k);
}

/* ---- gradients ---- */

static int gslot_of(const tpd_grad_shard *sh, int unit) {
    if (unit == TPD_MODEL_UNIT_EMBED) return sh->ng;
    for (int k = 0; k < sh->ng; k++)
        if (sh->gs[k].unit == unit && sh->gs[k].state == G_OPEN) return k;
    return -1;
}

/* The reduce-scatter of slot k is done: this rank's part into the shard, the slot zeroed. */
static tpd_status land(tpd_grad_shard *sh, int k) {
    tpd_model *m = sh->m;
    gslot *g = &sh->gs[k];
    TPD_CHECK(wait_req(sh, &g->req, 1));
    int i = g->unit + 1;
    size_t part = sh->dpp->part[i], gs = m->plan.grad_size;
    char *slot = gslot_mem(sh, k);
    int skip; /* test-only (base/fault.h): a unit whose reduction is lost */
    if (!(tpd_fault("skip-dp-bucket", 0, &skip) && skip == i))
        TPD_CHECK(tpd_kern_grad_acc(m->kb, (char *)m->grads + sh->dpp->ranges[i].state * gs,
                                    slot + part * (size_t)sh->dpp->dp_rank * gs, part));
    TPD_CHECK(tpd_kern_zero(m->kb, slot, part * (size_t)sh->dpp->dp_size * gs));
    g->unit = NO_UNIT;
    g->state = G_FREE;
    g->opens = 0;
    return TPD_OK;
}

/* The oldest reduction in flight, or -1. */
static int oldest(const tpd_grad_shard *sh) {
    int best = -1;
    for (int k = 0; k <= sh->ng; k++)
        if (sh->gs[k].state == G_REDUCING && (best < 0 || sh->gs[k].seq < sh->gs[best].seq))
            best = k;
    return best;
}

static tpd_status open_grads(tpd_grad_shard *sh, int unit) {
    int i = unit + 1;
    if (unit_len(sh, i) == 0) return TPD_OK;
    int k = gslot_of(sh, unit);
    if (k < 0) {
        for (int j = 0; j < sh->ng && k < 0; j++)
            if (sh->gs[j].state == G_FREE) k = j;
        while (k < 0) { /* both slots reducing: the oldest lands first */
            int o = oldest(sh);
            if (o < 0)
                return tpd_fail(TPD_ERR_INTERNAL, "grad shard: no gradient slot for unit %d", unit);
            TPD_CHECK(land(sh, o));
            if (o < sh->ng) k = o;
        }
    }
    gslot *g = &sh->gs[k];
    if (g->state == G_OPEN && g->unit == unit) {
        g->opens++;
        return TPD_OK;
    }
    g->unit = unit;
    g->state = G_OPEN;
    g->opens = 1;
    sh->m->ubase_g[i] = gslot_mem(sh, k);
    return TPD_OK;
}

/* Starts the reduce-scatter of slot k (its unit's gradients of this call are final). */
static tpd_status reduce(tpd_grad_shard *sh, int k) {
    tpd_model *m = sh->m;
    gslot *g = &sh->gs[k];
    int i = g->unit + 1;
    /* the replicated gradients each TP rank computed a part of (SP norms, QK norm) */
    TPD_CHECK(tpd_model_tp_reduce_grads(m, m->ubound[i], m->ubound[i + 1]));
    size_t part = sh->dpp->part[i], gs = m->plan.grad_size;
    char *slot = gslot_mem(sh, k);
    tpd_dtype dt = tpd_kern_grad_dtype(m->kb);
    tpd_dtype wire = sh->dpp->wire == TPD_DTYPE_BF16 ? TPD_DTYPE_BF16 : dt;
    g->state = G_REDUCING;
    g->seq = ++sh->seq;
    m->ubase_g[i] = NULL;
    return tpd_comm_ireduce_scatter_wire(sh->dp, slot, slot + part * (size_t)sh->dpp->dp_rank * gs,
                                         part, dt, wire, TPD_COMM_OP_SUM, tpd_kern_stream(m->kb),
                                         &g->req);
}

/* ---- the step ---- */

tpd_status tpd_grad_shard_poll(tpd_grad_shard *sh) {
    /* reductions land in issue order only, so the shard's sums do not depend on timing */
    for (;;) {
        int o = oldest(sh), done = 0;
        if (o < 0) break;
        TPD_CHECK(tpd_comm_test(sh->dp, sh->gs[o].req, &done));
        if (!done) break;
        TPD_CHECK(land(sh, o));
    }
    for (int k = 0; k < sh->np; k++) {
        int done;
        if (sh->ps[k].req) TPD_CHECK(tpd_comm_test(sh->dp, sh->ps[k].req, &done));
    }
    return TPD_OK;
}

tpd_status tpd_grad_shard_event(tpd_grad_shard *sh, int unit, int event) {
    int embed = unit == TPD_MODEL_UNIT_EMBED;
    switch (event) {
    case TPD_HOOK_FWD:
        if (sh->params) {
            TPD_CHECK(acquire_params(sh, unit));
            TPD_CHECK(prefetch(sh, next_unit(sh, unit, +1)));
        }
        break;
    case TPD_HOOK_FWD_DONE:
        if (sh->params) release_params(sh, unit);
        break;
    case TPD_HOOK_BWD:
        if (sh->params) {
            TPD_CHECK(acquire_params(sh, unit));
            if (!embed) TPD_CHECK(prefetch(sh, next_unit(sh, unit, -1)));
        }
        TPD_CHECK(open_grads(sh, unit));
        break;
    case TPD_HOOK_GRAD_DONE:
        if (!embed) { /* the embedding's gradients wait for the end of the step */
            int k = gslot_of(sh, unit);
            if (k >= 0 && --sh->gs[k].opens == 0) TPD_CHECK(reduce(sh, k));
        }
        if (sh->params) release_params(sh, unit);
        break;
    case TPD_HOOK_B_DONE:
        if (sh->params) release_params(sh, unit);
        break;
    default:
        return tpd_fail(TPD_ERR_INTERNAL, "grad shard: unknown hook event %d", event);
    }
    return tpd_grad_shard_poll(sh);
}

/* HSDP: the shard group's sums, summed over the groups (once a step) */
static tpd_status sum_replicas(tpd_grad_shard *sh) {
    if (!sh->rep || tpd_comm_size(sh->rep) < 2) return TPD_OK;
    tpd_model *m = sh->m;
    return tpd_comm_allreduce(sh->rep, m->grads, m->grads, m->plan.shard_numel,
                              tpd_kern_grad_dtype(m->kb), TPD_COMM_OP_SUM, tpd_kern_stream(m->kb));
}

tpd_status tpd_grad_shard_finish(tpd_grad_shard *sh) {
    tpd_model *m = sh->m;
    for (int o = oldest(sh); o >= 0; o = oldest(sh))
        TPD_CHECK(land(sh, o));
    if (unit_len(sh, 0) == 0) return sum_replicas(sh);
    /* the embedding's slot: the tied wte summed between the first and the last stage
     * (both hold its whole gradient here), then reduced like every other unit */
    char *slot = gslot_mem(sh, sh->ng);
    const tpd_param_slice *wte = &m->plan.lay.p[TPD_P_WTE];
    tpd_dtype dt = tpd_kern_grad_dtype(m->kb);
    if (sh->emb && tpd_comm_size(sh->emb) > 1 && wte->present && m->d.tied) {
        char *g = slot + (wte->offset - m->ubound[0]) * m->plan.grad_size;
        TPD_CHECK(tpd_comm_allreduce(sh->emb, g, g, wte->numel, dt, TPD_COMM_OP_SUM,
                                     tpd_kern_stream(m->kb)));
    }
    gslot *g = &sh->gs[sh->ng];
    g->unit = TPD_MODEL_UNIT_EMBED;
    m->ubase_g[0] = slot;
    TPD_CHECK(reduce(sh, sh->ng));
    TPD_CHECK(land(sh, sh->ng));
    return sum_replicas(sh);
}

tpd_status tpd_grad_shard_after_update(tpd_grad_shard *sh) {
    tpd_model *m = sh->m;
    if (sh->params) {
        int keep = NO_UNIT; /* test-only (base/fault.h): a unit whose stale copy is kept */
        if (!tpd_fault("stale-param-gather", 0, &keep)) keep = NO_UNIT;
        for (int k = 0; k < sh->np; k++) {
            TPD_CHECK(wait_req(sh, &sh->ps[k].req, 1));
            if (sh->ps[k].unit == keep) continue;
            sh->ps[k].unit = NO_UNIT;
            sh->ps[k].refs = 0;
        }
        return TPD_OK;
    }
    /* optim_grads: each unit's updated parts, through a staging slot of the grad pool
     * (free after the step; a parameter is never wider than its gradient) */
    size_t ps = m->plan.param_size;
    tpd_dtype pdt = tpd_kern_param_dtype(m->kb);
    double t0 = tpd_clock_s();
    for (int i = 0; i < m->nunits; i++) {
        size_t len = unit_len(sh, i), part = sh->dpp->part[i];
        if (len == 0) continue;
        const tpd_dp_range *rg = &sh->dpp->ranges[i];
        char *slot = gslot_mem(sh, i == 0 ? sh->ng : 0);
        char *mine = slot + part * (size_t)sh->dpp->dp_rank * ps;
        size_t own = rg->end - rg->begin;
        if (own)
            TPD_CHECK(tpd_kern_copy(m->kb, mine, (char *)m->params + rg->begin * ps, own * ps));
        if (own < part) TPD_CHECK(tpd_kern_zero(m->kb, mine + own * ps, (part - own) * ps));
        TPD_CHECK(tpd_comm_allgather(sh->dp, mine, slot, part, pdt, tpd_kern_stream(m->kb)));
        TPD_CHECK(tpd_kern_copy(m->kb, (char *)m->params + m->ubound[i] * ps, slot, len * ps));
        /* the slot is a gradient slot again: zero, as the next step expects */
        TPD_CHECK(tpd_kern_zero(m->kb, slot, part * (size_t)sh->dpp->dp_size * ps));
    }
    sh->exposed += tpd_clock_s() - t0;
    return TPD_OK;
}

tpd_status tpd_grad_shard_params_f32(tpd_grad_shard *sh, float *out) {
    tpd_model *m = sh->m;
    if (!sh->params) return tpd_model_params_f32(m, out);
    TPD_CHECK(tpd_grad_shard_after_update(sh)); /* an empty pool, slot 0 free */
    memset(out, 0, m->plan.numel_padded * sizeof *out);
    tpd_dtype pdt = tpd_kern_param_dtype(m->kb);
    char *slot = pslot_mem(sh, 0);
    for (int i = 0; i < m->nunits; i++) {
        size_t len = unit_len(sh, i);
        if (len == 0) continue;
        const char *mine = (const char *)m->params + sh->dpp->ranges[i].state * m->plan.param_size;
        TPD_CHECK(
            tpd_comm_allgather(sh->dp, mine, slot, sh->dpp->part[i], pdt, tpd_kern_stream(m->kb)));
        TPD_CHECK(tpd_model_to_host_f32(m->kb, out + m->ubound[i], slot, pdt, len, NULL));
    }
    return TPD_OK;
}

double tpd_grad_shard_take_exposed(tpd_grad_shard *sh) {
    double e = sh->exposed;
    sh->exposed = 0;
    return e;
}

tpd_status tpd_grad_shard_destroy(tpd_grad_shard *sh) {
    if (!sh) return TPD_OK;
    tpd_status st = TPD_OK;
    for (int k = 0; sh->ps && k < sh->np; k++)
        TPD_CHECK_KEEP(wait_req(sh, &sh->ps[k].req, 0), st);
    for (int k = 0; sh->gs && k <= sh->ng; k++)
        TPD_CHECK_KEEP(wait_req(sh, &sh->gs[k].req, 0), st);
    free(sh->gs);
    free(sh->ps);
    free(sh);
    return st;
}
