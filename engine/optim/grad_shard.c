#include "engine/optim/grad_shard.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/fault.h"

enum { NO_UNIT = -1 }; /* slots hold a plan unit j (0 .. nbuckets-1) */
enum { G_FREE, G_OPEN, G_REDUCING };
enum { DENSE, EXPERT }; /* the two pools: hook units' slots, EP's expert units' */

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

/* Slots of one size: n of them (the dense grad pool has the embedding's after them). */
typedef struct ppool {
    pslot *s;
    int n;
    char *mem;
    size_t numel;
} ppool;

typedef struct gpool {
    gslot *s;
    int n;
    char *mem;
    size_t numel;
} gpool;

struct tpd_grad_shard {
    tpd_model *m;
    const tpd_dp_plan *dpp;
    tpd_comm *dp, *emb; /* dp: the shard group (HSDP's, or the DP group) */
    tpd_comm *edp;      /* EP: the expert units' group (expert DP; HSDP: its ranks in the
                           shard group); NULL otherwise */
    tpd_comm *rep;      /* HSDP: the shard's replicas in the other groups; NULL otherwise */
    int params;         /* optim_grads_params */
    int ne;             /* EP: the expert units, plan units [0, ne); 0 otherwise */
    ppool pp[2];
    gpool gp[2]; /* gp[DENSE].s[gp[DENSE].n]: the embedding's slot */
    uint64_t clock, seq;
    double exposed;
};

/* Plan unit j: EP's expert unit of layer j (j < ne), else hook unit j - ne - 1. */
static int of_hook(const tpd_grad_shard *sh, int unit) {
    return sh->ne + unit + 1;
}

static int is_expert(const tpd_grad_shard *sh, int j) {
    return j < sh->ne;
}

static size_t unit_len(const tpd_grad_shard *sh, int j) {
    return sh->dpp->bounds[j + 1] - sh->dpp->bounds[j];
}

static tpd_comm *comm_of(const tpd_grad_shard *sh, int j) {
    return is_expert(sh, j) ? sh->edp : sh->dp;
}

static char **pbase(const tpd_grad_shard *sh, int j) {
    return is_expert(sh, j) ? &sh->m->ebase_p[j] : &sh->m->ubase_p[j - sh->ne];
}

static char **gbase(const tpd_grad_shard *sh, int j) {
    return is_expert(sh, j) ? &sh->m->ebase_g[j] : &sh->m->ubase_g[j - sh->ne];
}

static ppool *ppool_of(tpd_grad_shard *sh, int j) {
    return &sh->pp[is_expert(sh, j) ? EXPERT : DENSE];
}

static gpool *gpool_of(tpd_grad_shard *sh, int j) {
    return &sh->gp[is_expert(sh, j) ? EXPERT : DENSE];
}

static char *pslot_mem(const tpd_grad_shard *sh, const ppool *pl, int k) {
    return pl->mem + (size_t)k * pl->numel * sh->m->plan.param_size;
}

/* k = n of the dense pool: the embedding's slot */
static char *gslot_mem(const tpd_grad_shard *sh, const gpool *pl, int k) {
    return pl->mem + (size_t)k * pl->numel * sh->m->plan.grad_size;
}

static char *embed_slot(const tpd_grad_shard *sh) {
    return gslot_mem(sh, &sh->gp[DENSE], sh->gp[DENSE].n);
}

/* Completes *req, a collective on unit j's group. */
static tpd_status wait_req(tpd_grad_shard *sh, int j, tpd_comm_req **req, int exposed) {
    if (!*req) return TPD_OK;
    double t0 = tpd_clock_s();
    tpd_status st = tpd_comm_wait(comm_of(sh, j), *req);
    *req = NULL;
    if (exposed) sh->exposed += tpd_clock_s() - t0;
    return st;
}

/* base + off bytes; NULL for a pool that was not allocated (no slots: optim_grads has no
 * parameter pool) */
static char *at(void *base, size_t off) {
    return base ? (char *)base + off : NULL;
}

tpd_status tpd_grad_shard_create(tpd_model *m, const tpd_dp_plan *dpp, const tpd_mesh_comms *comms,
                                 tpd_grad_shard **sh_p) {
    const tpd_buffer_plan *b = &m->plan;
    int ne = dpp->ebuckets;
    if (!dpp->bounds || dpp->nbuckets != m->nunits + ne || ne != m->neunits)
        return tpd_fail(TPD_ERR_INTERNAL, "grad shard: the DP plan is not aligned to the units");
    tpd_comm *edp = comms->dp_shard ? comms->edp_shard : comms->edp; /* HSDP: in the group */
    if (ne && !edp)
        return tpd_fail(TPD_ERR_INTERNAL, "grad shard: expert units need the expert-DP group");
    tpd_grad_shard *sh = calloc(1, sizeof *sh);
    if (!sh) return tpd_fail_nomem("the sharded gradient sync", sizeof *sh);
    sh->m = m;
    sh->dpp = dpp;
    sh->dp = comms->dp_shard ? comms->dp_shard : comms->dp;
    sh->edp = edp;
    sh->rep = comms->dp_rep;
    sh->emb = comms->emb;
    sh->params = b->sharding == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS;
    sh->ne = ne;
    /* pool_p: the dense slots, then the expert slots; pool_g: the dense slots, the
     * embedding's, the expert slots (engine/model/model.h) */
    size_t ps = b->param_size, gs = b->grad_size;
    sh->pp[DENSE] = (ppool){NULL, b->pool_params, m->pool_p, b->pslot_numel};
    sh->pp[EXPERT] =
        (ppool){NULL, ne ? b->pool_params : 0,
                at(m->pool_p, (size_t)b->pool_params * b->pslot_numel * ps), b->xslot_numel};
    sh->gp[DENSE] = (gpool){NULL, b->pool_grads, m->pool_g, b->gslot_numel};
    sh->gp[EXPERT] =
        (gpool){NULL, ne ? b->pool_grads : 0,
                at(m->pool_g, ((size_t)b->pool_grads * b->gslot_numel + b->eslot_numel) * gs),
                b->xslot_numel};
    int ok = 1;
    for (int x = DENSE; x <= EXPERT; x++) {
        sh->pp[x].s = calloc((size_t)sh->pp[x].n + 1, sizeof *sh->pp[x].s);
        sh->gp[x].s = calloc((size_t)sh->gp[x].n + 1, sizeof *sh->gp[x].s);
        ok = ok && sh->pp[x].s && sh->gp[x].s;
    }
    if (!ok) {
        tpd_grad_shard_destroy(sh);
        return tpd_fail_nomem("the staging slots",
                              4 * (size_t)(b->pool_params + b->pool_grads + 2) * sizeof(gslot));
    }
    for (int x = DENSE; x <= EXPERT; x++) {
        for (int k = 0; k < sh->pp[x].n; k++)
            sh->pp[x].s[k].unit = NO_UNIT;
        for (int k = 0; k <= sh->gp[x].n; k++)
            sh->gp[x].s[k].unit = NO_UNIT;
    }
    *sh_p = sh;
    return TPD_OK;
}

/* ---- parameters (optim_grads_params) ---- */

static int find_pslot(const ppool *pl, int j) {
    for (int k = 0; k < pl->n; k++)
        if (pl->s[k].unit == j) return k;
    return -1;
}

/* A slot for a new unit: an empty one, else the least recently released one that nobody
 * reads and whose gather was waited for (`evict_pending`: or one still in flight, waited
 * for here); -1 when every slot is in use. */
static int room(const ppool *pl, int evict_pending) {
    int best = -1;
    for (int k = 0; k < pl->n; k++) {
        const pslot *s = &pl->s[k];
        if (s->unit == NO_UNIT) return k;
        if (s->refs > 0 || (s->req && !evict_pending)) continue;
        if (best < 0 || s->stamp < pl->s[best].stamp) best = k;
    }
    return best;
}

static tpd_status start_gather(tpd_grad_shard *sh, int j, int k) {
    tpd_model *m = sh->m;
    ppool *pl = ppool_of(sh, j);
    pslot *s = &pl->s[k];
    if (s->unit != NO_UNIT) TPD_CHECK(wait_req(sh, s->unit, &s->req, 1)); /* an evicted prefetch */
    s->unit = j;
    s->refs = 0;
    s->stamp = ++sh->clock;
    const char *mine = (const char *)m->params + sh->dpp->ranges[j].state * m->plan.param_size;
    return tpd_comm_iallgather(comm_of(sh, j), mine, pslot_mem(sh, pl, k), sh->dpp->part[j],
                               tpd_kern_param_dtype(m->kb), tpd_kern_stream(m->kb), &s->req);
}

static tpd_status acquire_params(tpd_grad_shard *sh, int j) {
    if (unit_len(sh, j) == 0) return TPD_OK;
    ppool *pl = ppool_of(sh, j);
    int k = find_pslot(pl, j);
    if (k < 0) {
        k = room(pl, 1);
        if (k < 0)
            return tpd_fail(TPD_ERR_INTERNAL,
                            "grad shard: all %d parameter slots are in use "
                            "(parallel.fsdp_units_in_flight)",
                            pl->n);
        TPD_CHECK(start_gather(sh, j, k));
    }
    pslot *s = &pl->s[k];
    TPD_CHECK(wait_req(sh, j, &s->req, 1));
    s->refs++;
    *pbase(sh, j) = pslot_mem(sh, pl, k);
    return TPD_OK;
}

static void release_params(tpd_grad_shard *sh, int j) {
    ppool *pl = ppool_of(sh, j);
    int k = find_pslot(pl, j);
    if (k < 0 || pl->s[k].refs == 0) return;
    if (--pl->s[k].refs == 0) {
        pl->s[k].stamp = ++sh->clock;
        *pbase(sh, j) = NULL;
    }
}

/* The hook unit after `unit` in a pass in direction dir (+1 forward, -1 backward) on this
 * stage, skipping empty ones; NO_HOOK at the end. */
enum { NO_HOOK = -2 };
static int next_unit(const tpd_grad_shard *sh, int unit, int dir) {
    int Ls = sh->m->d.Ls;
    for (int u = unit + dir; u >= 0 && u <= Ls; u += dir)
        if (unit_len(sh, of_hook(sh, u)) > 0) return u;
    return NO_HOOK;
}

static tpd_status prefetch_one(tpd_grad_shard *sh, int j) {
    ppool *pl = ppool_of(sh, j);
    if (unit_len(sh, j) == 0 || find_pslot(pl, j) >= 0) return TPD_OK;
    int k = room(pl, 0);
    return k < 0 ? TPD_OK : start_gather(sh, j, k);
}

/* Hook unit `unit`'s parameters gathered ahead, and (EP) its layer's experts. */
static tpd_status prefetch(tpd_grad_shard *sh, int unit) {
    if (unit == NO_HOOK) return TPD_OK;
    TPD_CHECK(prefetch_one(sh, of_hook(sh, unit)));
    return unit < sh->ne ? prefetch_one(sh, unit) : TPD_OK;
}

/* ---- gradients ---- */

static int gslot_of(const tpd_grad_shard *sh, int j) {
    if (j == of_hook(sh, TPD_MODEL_UNIT_EMBED)) return sh->gp[DENSE].n;
    const gpool *pl = &sh->gp[is_expert(sh, j) ? EXPERT : DENSE];
    for (int k = 0; k < pl->n; k++)
        if (pl->s[k].unit == j && pl->s[k].state == G_OPEN) return k;
    return -1;
}

/* The reduce-scatter of slot k of pool pl is done: this rank's part into the shard, the
 * slot zeroed. */
static tpd_status land(tpd_grad_shard *sh, gpool *pl, int k) {
    tpd_model *m = sh->m;
    gslot *g = &pl->s[k];
    int j = g->unit;
    TPD_CHECK(wait_req(sh, j, &g->req, 1));
    size_t part = sh->dpp->part[j], gs = m->plan.grad_size;
    char *slot = gslot_mem(sh, pl, k);
    int skip; /* test-only (base/fault.h): a unit whose reduction is lost */
    if (!(tpd_fault("skip-dp-bucket", 0, &skip) && skip == j))
        TPD_CHECK(tpd_kern_grad_acc(m->kb, (char *)m->grads + sh->dpp->ranges[j].state * gs,
                                    slot + part * (size_t)tpd_dp_unit_rank(sh->dpp, j) * gs, part));
    TPD_CHECK(tpd_kern_zero(m->kb, slot, tpd_dp_unit_slot_numel(sh->dpp, j) * gs));
    g->unit = NO_UNIT;
    g->state = G_FREE;
    g->opens = 0;
    return TPD_OK;
}

/* The oldest reduction in flight, of pool x (or of both, x < 0): its pool and slot, or
 * *k_p = -1. */
static gpool *oldest(tpd_grad_shard *sh, int x, int *k_p) {
    gpool *best = NULL;
    *k_p = -1;
    for (int p = DENSE; p <= EXPERT; p++) {
        if (x >= 0 && p != x) continue;
        gpool *pl = &sh->gp[p];
        int n = p == DENSE ? pl->n + 1 : pl->n;
        for (int k = 0; k < n; k++)
            if (pl->s[k].state == G_REDUCING && (*k_p < 0 || pl->s[k].seq < best->s[*k_p].seq)) {
                best = pl;
                *k_p = k;
            }
    }
    return best;
}

static tpd_status open_grads(tpd_grad_shard *sh, int j) {
    if (unit_len(sh, j) == 0) return TPD_OK;
    gpool *pl = gpool_of(sh, j);
    int k = gslot_of(sh, j);
    if (k < 0) {
        for (int i = 0; i < pl->n && k < 0; i++)
            if (pl->s[i].state == G_FREE) k = i;
        while (k < 0) { /* every slot reducing: the pool's oldest lands first */
            int o;
            gpool *op = oldest(sh, is_expert(sh, j) ? EXPERT : DENSE, &o);
            if (o < 0)
                return tpd_fail(TPD_ERR_INTERNAL, "grad shard: no gradient slot for unit %d", j);
            TPD_CHECK(land(sh, op, o));
            if (o < pl->n) k = o;
        }
    }
    gslot *g = &pl->s[k];
    if (g->state == G_OPEN && g->unit == j) {
        g->opens++;
        return TPD_OK;
    }
    g->unit = j;
    g->state = G_OPEN;
    g->opens = 1;
    *gbase(sh, j) = gslot_mem(sh, pl, k);
    return TPD_OK;
}

/* Starts the reduce-scatter of slot k of pool pl (its unit's gradients of this call are
 * final). */
static tpd_status reduce(tpd_grad_shard *sh, gpool *pl, int k) {
    tpd_model *m = sh->m;
    gslot *g = &pl->s[k];
    int j = g->unit;
    /* the replicated gradients each TP rank computed a part of (SP norms, QK norm); an
     * expert unit has none */
    if (!is_expert(sh, j))
        TPD_CHECK(tpd_model_tp_reduce_grads(m, sh->dpp->bounds[j], sh->dpp->bounds[j + 1]));
    size_t part = sh->dpp->part[j], gs = m->plan.grad_size;
    char *slot = gslot_mem(sh, pl, k);
    char *mine = slot + part * (size_t)tpd_dp_unit_rank(sh->dpp, j) * gs;
    tpd_dtype dt = tpd_kern_grad_dtype(m->kb);
    tpd_dtype wire = sh->dpp->wire == TPD_DTYPE_BF16 ? TPD_DTYPE_BF16 : dt;
    g->state = G_REDUCING;
    g->seq = ++sh->seq;
    *gbase(sh, j) = NULL;
    int skip; /* test-only: the experts' copies never summed (this rank's part left alone) */
    if (is_expert(sh, j) && tpd_fault("ep-skip-expert-reduce", 0, &skip)) return TPD_OK;
    return tpd_comm_ireduce_scatter_wire(comm_of(sh, j), slot, mine, part, dt, wire,
                                         TPD_COMM_OP_SUM, tpd_kern_stream(m->kb), &g->req);
}

/* Unit j's gradients of this call are final: its slot is reduced once no call holds it
 * open. */
static tpd_status grad_done(tpd_grad_shard *sh, int j) {
    int k = gslot_of(sh, j);
    if (k >= 0 && --gpool_of(sh, j)->s[k].opens == 0) TPD_CHECK(reduce(sh, gpool_of(sh, j), k));
    return TPD_OK;
}

/* ---- the step ---- */

tpd_status tpd_grad_shard_poll(tpd_grad_shard *sh) {
    /* reductions land in issue order only (a pool's: a unit is in one), so the shard's sums
     * do not depend on timing */
    for (int x = DENSE; x <= EXPERT; x++)
        for (;;) {
            int o, done = 1;
            gpool *pl = oldest(sh, x, &o);
            if (o < 0) break;
            if (pl->s[o].req)
                TPD_CHECK(tpd_comm_test(comm_of(sh, pl->s[o].unit), pl->s[o].req, &done));
            if (!done) break;
            TPD_CHECK(land(sh, pl, o));
        }
    for (int x = DENSE; x <= EXPERT; x++)
        for (int k = 0; k < sh->pp[x].n; k++) {
            int done;
            pslot *s = &sh->pp[x].s[k];
            if (s->req) TPD_CHECK(tpd_comm_test(comm_of(sh, s->unit), s->req, &done));
        }
    return TPD_OK;
}

tpd_status tpd_grad_shard_event(tpd_grad_shard *sh, int unit, int event) {
    int embed = unit == TPD_MODEL_UNIT_EMBED;
    int j = of_hook(sh, unit);
    int x = unit >= 0 && unit < sh->ne ? unit : NO_UNIT; /* EP: the layer's expert unit */
    switch (event) {
    case TPD_HOOK_FWD:
        if (sh->params) {
            TPD_CHECK(acquire_params(sh, j));
            if (x != NO_UNIT) TPD_CHECK(acquire_params(sh, x));
            TPD_CHECK(prefetch(sh, next_unit(sh, unit, +1)));
        }
        break;
    case TPD_HOOK_FWD_DONE:
    case TPD_HOOK_B_DONE:
        if (sh->params) {
            release_params(sh, j);
            if (x != NO_UNIT) release_params(sh, x);
        }
        break;
    case TPD_HOOK_BWD:
        if (sh->params) {
            TPD_CHECK(acquire_params(sh, j));
            if (x != NO_UNIT) TPD_CHECK(acquire_params(sh, x));
            if (!embed) TPD_CHECK(prefetch(sh, next_unit(sh, unit, -1)));
        }
        TPD_CHECK(open_grads(sh, j));
        if (x != NO_UNIT) TPD_CHECK(open_grads(sh, x));
        break;
    case TPD_HOOK_GRAD_DONE:
        if (!embed) { /* the embedding's gradients wait for the end of the step */
            TPD_CHECK(grad_done(sh, j));
            if (x != NO_UNIT) TPD_CHECK(grad_done(sh, x));
        }
        if (sh->params) {
            release_params(sh, j);
            if (x != NO_UNIT) release_params(sh, x);
        }
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
    int o;
    for (gpool *pl = oldest(sh, -1, &o); o >= 0; pl = oldest(sh, -1, &o))
        TPD_CHECK(land(sh, pl, o));
    int je = of_hook(sh, TPD_MODEL_UNIT_EMBED);
    if (unit_len(sh, je) == 0) return sum_replicas(sh);
    /* the embedding's slot: the tied wte summed between the first and the last stage
     * (both hold its whole gradient here), then reduced like every other unit */
    char *slot = embed_slot(sh);
    const tpd_param_slice *wte = &m->plan.lay.p[TPD_P_WTE];
    tpd_dtype dt = tpd_kern_grad_dtype(m->kb);
    if (sh->emb && tpd_comm_size(sh->emb) > 1 && wte->present && m->d.tied) {
        char *g = slot + (wte->offset - m->ubound[0]) * m->plan.grad_size;
        TPD_CHECK(tpd_comm_allreduce(sh->emb, g, g, wte->numel, dt, TPD_COMM_OP_SUM,
                                     tpd_kern_stream(m->kb)));
    }
    gpool *dense = &sh->gp[DENSE];
    dense->s[dense->n].unit = je;
    m->ubase_g[0] = slot;
    TPD_CHECK(reduce(sh, dense, dense->n));
    TPD_CHECK(land(sh, dense, dense->n));
    return sum_replicas(sh);
}

/* A staging slot for all of unit j after the step (every pool is free then): the
 * embedding's, or the first of its grad pool's (a parameter is never wider than its
 * gradient). */
static char *after_slot(tpd_grad_shard *sh, int j) {
    if (j == of_hook(sh, TPD_MODEL_UNIT_EMBED)) return embed_slot(sh);
    return gslot_mem(sh, gpool_of(sh, j), 0);
}

tpd_status tpd_grad_shard_after_update(tpd_grad_shard *sh) {
    tpd_model *m = sh->m;
    if (sh->params) {
        int keep = NO_HOOK; /* test-only (base/fault.h): a unit whose stale copy is kept */
        if (!tpd_fault("stale-param-gather", 0, &keep)) keep = NO_HOOK;
        for (int x = DENSE; x <= EXPERT; x++)
            for (int k = 0; k < sh->pp[x].n; k++) {
                pslot *s = &sh->pp[x].s[k];
                if (s->unit != NO_UNIT) TPD_CHECK(wait_req(sh, s->unit, &s->req, 1));
                if (x == DENSE && keep != NO_HOOK && s->unit == of_hook(sh, keep)) continue;
                s->unit = NO_UNIT;
                s->refs = 0;
            }
        return TPD_OK;
    }
    /* optim_grads: each unit's updated parts, through a staging slot of the grad pool
     * (free after the step) */
    size_t ps = m->plan.param_size;
    tpd_dtype pdt = tpd_kern_param_dtype(m->kb);
    double t0 = tpd_clock_s();
    for (int j = 0; j < sh->dpp->nbuckets; j++) {
        size_t len = unit_len(sh, j), part = sh->dpp->part[j];
        if (len == 0) continue;
        const tpd_dp_range *rg = &sh->dpp->ranges[j];
        char *slot = after_slot(sh, j);
        char *mine = slot + part * (size_t)tpd_dp_unit_rank(sh->dpp, j) * ps;
        size_t own = rg->end - rg->begin;
        if (own)
            TPD_CHECK(tpd_kern_copy(m->kb, mine, (char *)m->params + rg->begin * ps, own * ps));
        if (own < part) TPD_CHECK(tpd_kern_zero(m->kb, mine + own * ps, (part - own) * ps));
        TPD_CHECK(
            tpd_comm_allgather(comm_of(sh, j), mine, slot, part, pdt, tpd_kern_stream(m->kb)));
        TPD_CHECK(
            tpd_kern_copy(m->kb, (char *)m->params + sh->dpp->bounds[j] * ps, slot, len * ps));
        /* the slot is a gradient slot again: zero, as the next step expects */
        TPD_CHECK(tpd_kern_zero(m->kb, slot, tpd_dp_unit_slot_numel(sh->dpp, j) * ps));
    }
    sh->exposed += tpd_clock_s() - t0;
    return TPD_OK;
}

tpd_status tpd_grad_shard_params_f32(tpd_grad_shard *sh, float *out) {
    tpd_model *m = sh->m;
    if (!sh->params) return tpd_model_params_f32(m, out);
    TPD_CHECK(tpd_grad_shard_after_update(sh)); /* empty pools, slot 0 of each free */
    memset(out, 0, m->plan.numel_padded * sizeof *out);
    tpd_dtype pdt = tpd_kern_param_dtype(m->kb);
    for (int j = 0; j < sh->dpp->nbuckets; j++) {
        size_t len = unit_len(sh, j);
        if (len == 0) continue;
        char *slot = pslot_mem(sh, ppool_of(sh, j), 0);
        const char *mine = (const char *)m->params + sh->dpp->ranges[j].state * m->plan.param_size;
        TPD_CHECK(tpd_comm_allgather(comm_of(sh, j), mine, slot, sh->dpp->part[j], pdt,
                                     tpd_kern_stream(m->kb)));
        TPD_CHECK(tpd_model_to_host_f32(m->kb, out + sh->dpp->bounds[j], slot, pdt, len, NULL));
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
    for (int x = DENSE; x <= EXPERT; x++) {
        for (int k = 0; sh->pp[x].s && k < sh->pp[x].n; k++)
            if (sh->pp[x].s[k].unit != NO_UNIT)
                TPD_CHECK_KEEP(wait_req(sh, sh->pp[x].s[k].unit, &sh->pp[x].s[k].req, 0), st);
        int n = x == DENSE ? sh->gp[x].n + 1 : sh->gp[x].n;
        for (int k = 0; sh->gp[x].s && k < n; k++)
            if (sh->gp[x].s[k].unit != NO_UNIT)
                TPD_CHECK_KEEP(wait_req(sh, sh->gp[x].s[k].unit, &sh->gp[x].s[k].req, 0), st);
        free(sh->gp[x].s);
        free(sh->pp[x].s);
    }
    free(sh);
    return st;
}
