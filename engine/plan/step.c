/* One step after the stage times are known, the same for both backends: the pipeline is the
 * simulation of the very action lists the executor walks (parallel/pipeline/schedule.h),
 * and the DP communication follows the trainer's engine/optim/grad_sync.c:
 *
 * - The gradient buffer of a stage is layer-major (engine/model/model_layout.h): wte and
 *   wpe, then each local layer (chunk 0's first), then lnfw and lnfb (and an untied output
 *   layer), padded to a multiple of DP, cut into buckets of parallel.ddp_bucket_size
 *   elements.
 * - With overlap_grad_reduce, a layer's gradients are final once the step's last backward
 *   of its chunk (BWD of micro-batch M-1; W under zb-h1) has passed it; the layers run in
 *   reverse inside the action, so the time inside is split by each part's share of it. A
 *   bucket starts when all its units are final. The buckets holding the embedding wait for
 *   the pipeline's end and, when tied over pp > 1 stages, the embedding all-reduce between
 *   the first and last stage.
 *   Without overlap every bucket starts there.
 * - Buckets run one after another on the DP link, in the order they start (the higher
 *   bucket first on a tie, as the engine walks them). A stage's exposed time is how far the
 *   last one ends past its own pipeline end.
 * - ZeRO-1: after the optimizer the parameters are all-gathered bucket by bucket in buffer
 *   order. With overlap_param_gather each bucket is waited for at the first forward of its
 *   units in the next step (the simulation's start times); the wait is the largest lateness.
 *   Without it all of them are waited for at once.
 * The step is the slowest stage's pipeline end plus its exposed reduction, then the
 * optimizer, then the exposed gathers; and the terms of scale and of the host that the
 * backend's model set (straggler, global_sync, step_host). */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void tpd_plan_pipe_free(tpd_plan_pipe *p) {
    if (!p) return;
    for (int s = 0; p->sched && s < p->stages; s++)
        tpd_pp_schedule_free(&p->sched[s]);
    for (int s = 0; p->t0 && s < p->stages; s++)
        free(p->t0[s]);
    for (int s = 0; p->t1 && s < p->stages; s++)
        free(p->t1[s]);
    free(p->sched);
    free(p->t0);
    free(p->t1);
    memset(p, 0, sizeof *p);
}

tpd_status tpd_plan_pipe_simulate(const tpd_plan_layout *lay, int micro_batches,
                                  const tpd_pp_sim_times *times, tpd_plan_pipe *pipe_p) {
    tpd_status st = TPD_OK;
    int p = lay->pp, v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    tpd_plan_pipe r;
    memset(&r, 0, sizeof r);
    if (p < 1 || p > TPD_CONFIG_MAX_STAGES || micro_batches < 1) {
        tpd_log_error("plan: cannot simulate %d stages of %d micro-batches", p, micro_batches);
        return TPD_ERR_INVALID;
    }
    r.sched = calloc((size_t)p, sizeof *r.sched);
    r.t0 = calloc((size_t)p, sizeof *r.t0);
    r.t1 = calloc((size_t)p, sizeof *r.t1);
    if (!r.sched || !r.t0 || !r.t1) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, fail, "plan: out of memory");
    for (; r.stages < p; r.stages++)
        TPD_CHECK_GOTO(tpd_pp_schedule_make(tpd_plan_layout_pp_kind(lay), p, r.stages,
                                            micro_batches, v, &r.sched[r.stages]),
                       st, fail);
    tpd_pp_sim_result sim;
    TPD_CHECK_GOTO(tpd_pp_simulate(r.sched, p, times, r.t0, r.t1, &sim), st, fail);
    r.makespan = sim.makespan;
    double busy = 0.0, total = 0.0;
    for (int s = 0; s < p; s++) {
        const tpd_pp_schedule *sc = &r.sched[s];
        double end = 0.0, b = 0.0;
        for (int i = 0; i < sc->count; i++) {
            tpd_pp_action_kind k = sc->actions[i].kind;
            double t = r.t1[s][i];
            /* the list's end also waits for its sends to arrive */
            if (k == TPD_PP_SEND_ACT || k == TPD_PP_SEND_GRAD) t += times[s].p2p;
            if (t > end) end = t;
            if (k == TPD_PP_FWD || k == TPD_PP_BWD || k == TPD_PP_WGRAD)
                b += r.t1[s][i] - r.t0[s][i];
        }
        r.end[s] = end;
        r.busy[s] = b;
        busy += b;
        total += end;
        if (end > r.makespan) r.makespan = end;
    }
    r.idle_fraction = total > 0.0 ? 1.0 - busy / total : 0.0;
    *pipe_p = r;
    return TPD_OK;
fail:
    tpd_plan_pipe_free(&r);
    return st;
}

/* ---- the stage's buffer ---- */

tpd_status tpd_plan_units_init(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                               tpd_plan_units *u) {
    const tpd_config_model *m = &cfg->model;
    memset(u, 0, sizeof *u);
    int Ls = tpd_plan_stage_layers(cfg, lay, stage);
    if (Ls < 0) {
        tpd_log_error("plan: stage %d has no layers in this layout", stage);
        return TPD_ERR_INVALID;
    }
    u->Ls = Ls;
    u->n = Ls + 2;
    u->elems = calloc((size_t)u->n * 2, sizeof *u->elems);
    if (!u->elems) {
        tpd_log_error("plan: out of memory");
        return TPD_ERR_NOMEM;
    }
    u->expert = u->elems + u->n;
    double h = m->hidden_size;
    double pos = m->max_position_embeddings;
    double vl = (double)tpd_config_padded_vocab(cfg, lay->tp) / lay->tp;
    int first = stage == 0, last = stage == lay->pp - 1;
    int untied = m->untie_embeddings_and_output_weights;
    if (first) u->elems[0] = vl * h + (m->position_embedding_type == TPD_POS_LEARNED ? pos * h : 0);
    if (last && !first && !untied) u->elems[0] = vl * h; /* the tied head's copy of wte */
    /* under EP a layer holds E / EP experts, whose gradients are summed over expert-DP */
    int ep = tpd_plan_ep(lay);
    double layer = tpd_plan_layer_params_ep(cfg, lay->tp, ep), n = u->elems[0];
    double dense = tpd_plan_layer_kind_params(cfg, lay->tp, ep, 0);
    double expert = ep > 1 ? tpd_plan_layer_expert_params(cfg, lay->tp, ep) : 0.0;
    /* the stage's layers in buffer order (chunk by chunk), each MoE or dense */
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1, l = 0;
    for (int c = 0; c < v; c++) {
        int lc = tpd_plan_chunk_layers(cfg, lay, stage, c), g0 = 0; /* its first layer */
        if (tpd_config_moe(cfg) && cfg->model.moe_layer_freq > 1)
            tpd_config_stage_layers(cfg, lay->pp, v, stage, c, &g0);
        for (int i = 0; i < lc && l < Ls; i++, l++) {
            int moe = tpd_config_layer_moe(cfg, g0 + i);
            u->elems[1 + l] = moe ? layer : dense;
            u->expert[1 + l] = moe ? expert : 0.0;
            n += u->elems[1 + l];
        }
    }
    /* the final norm, and after it an untied output layer: final once the head's backward
     * is done, read first by the head's forward */
    if (last) u->elems[Ls + 1] = tpd_plan_norm_params(cfg) + (untied ? vl * h : 0.0);
    n += u->elems[Ls + 1];
    double dp = tpd_plan_dp_inner(cfg, lay); /* the ranks that sum each step's grads */
    u->padded = ceil(n / dp) * dp;
    u->elems[Ls + 1] += u->padded - n; /* the padding goes with the highest unit */
    /* tpd_dp_plan_init: a multiple of DP, at least DP, at most the buffer */
    double bucket = cfg->parallel.ddp_bucket_size > 0 ? (double)cfg->parallel.ddp_bucket_size : 1.0;
    if (bucket < dp) bucket = dp;
    bucket = floor(bucket / dp) * dp;
    if (bucket > u->padded) bucket = u->padded;
    u->bucket = bucket;
    u->nbuckets = bucket > 0 ? (int)ceil(u->padded / bucket) : 0;
    return TPD_OK;
}

void tpd_plan_units_free(tpd_plan_units *u) {
    free(u->elems);
    u->elems = NULL;
    u->expert = NULL;
}

void tpd_plan_units_bucket(const tpd_plan_units *u, int b, double *begin_p, double *len_p) {
    double b0 = b * u->bucket;
    *begin_p = b0;
    *len_p = u->padded - b0 < u->bucket ? u->padded - b0 : u->bucket;
}

/* ---- where the step's last backward and the next first forward reach each unit ---- */

/* Index of the action (kind, micro-batch, chunk) in a stage's list; -1 if absent. */
static int find_action(const tpd_pp_schedule *sc, tpd_pp_action_kind kind, int mb, int chunk) {
    for (int i = sc->count - 1; i >= 0; i--)
        if (sc->actions[i].kind == kind && sc->actions[i].micro_batch == mb &&
            sc->actions[i].chunk == chunk)
            return i;
    return -1;
}

/* Times, within the simulated step, at which each unit's gradients are final (`final_t`,
 * < 0: only after the pipeline) and at which a forward first reads it (`use_t`, +inf: never;
 * the unit holds only padding). Inside an action of duration D, a part of share w of the
 * action's work W ends at t0 + D * (cumulative w) / W. */
static void unit_times(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                       const tpd_plan_pipe *pipe, const tpd_plan_stage_cost *cost,
                       const tpd_plan_units *u, double *final_t, double *use_t) {
    const tpd_pp_schedule *sc = &pipe->sched[stage];
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1, M = sc->micro_batches;
    int first = stage == 0, last = stage == lay->pp - 1, split = sc->split_backward;
    double Ls = u->Ls > 0 ? u->Ls : 1;
    /* per layer: the stage's layer work over its layers */
    double lf = (cost->fwd - cost->embed_fwd - cost->head_fwd) / Ls;
    double lb = (cost->bwd - cost->embed_bwd - cost->head_bwd) / Ls;
    double lw = cost->wgrad / Ls;
    for (int i = 0; i < u->n; i++) {
        final_t[i] = -1.0;
        use_t[i] = INFINITY;
    }
    int l0 = 0;
    for (int c = 0; c < v; c++) {
        int Lc = tpd_plan_chunk_layers(cfg, lay, stage, c);
        if (Lc < 0) Lc = 0;
        int has_embed = first && c == 0, has_head = last && c == v - 1;
        double e_f = has_embed ? cost->embed_fwd : 0.0, h_f = has_head ? cost->head_fwd : 0.0;
        double e_b = has_embed ? cost->embed_bwd : 0.0, h_b = has_head ? cost->head_bwd : 0.0;
        /* the next step's first forward of this chunk: embedding, layers, final LN, head */
        int fi = find_action(sc, TPD_PP_FWD, 0, c);
        if (fi >= 0) {
            double t0 = pipe->t0[stage][fi], D = pipe->t1[stage][fi] - t0;
            double W = e_f + Lc * lf + h_f;
            double k = W > 0 ? D / W : 0.0;
            if (has_embed) use_t[0] = t0;
            for (int i = 0; i < Lc; i++)
                use_t[1 + l0 + i] = t0 + k * (e_f + i * lf);
            if (has_head) {
                use_t[u->Ls + 1] = t0 + k * (e_f + Lc * lf);
                if (!first) use_t[0] = use_t[u->Ls + 1]; /* a tied head reads wte */
            }
        }
        /* the last backward of this chunk: the head first (B), then the layers in reverse */
        int bi = find_action(sc, TPD_PP_BWD, M - 1, c);
        if (bi >= 0 && has_head) {
            double t0 = pipe->t0[stage][bi], D = pipe->t1[stage][bi] - t0;
            double W = h_b + Lc * (split ? lb - lw : lb) + e_b;
            final_t[u->Ls + 1] = t0 + (W > 0 ? D * h_b / W : 0.0);
        }
        int wi = split ? find_action(sc, TPD_PP_WGRAD, M - 1, c) : bi;
        if (wi >= 0) {
            double t0 = pipe->t0[stage][wi], D = pipe->t1[stage][wi] - t0;
            double hw = split ? 0.0 : h_b, per = split ? lw : lb;
            double W = hw + Lc * per + (split ? 0.0 : e_b);
            double k = W > 0 ? D / W : 0.0;
            for (int i = Lc - 1; i >= 0; i--)
                final_t[1 + l0 + i] = t0 + k * (hw + (Lc - i) * per);
        }
        l0 += Lc;
    }
    /* a stage without the head: its last unit holds only padding, final with the last
     * layer */
    if (!last && u->Ls > 0) final_t[u->Ls + 1] = final_t[u->Ls];
    if (!last && u->Ls == 0) final_t[u->Ls + 1] = -1.0;
}

/* ---- the stage's DP communication ---- */

typedef struct stage_dp {
    double exposed;       /* reduction past the stage's pipeline end */
    double gather;        /* gather the next step waits for */
    double total;         /* every collective of the stage, back to back */
    double unhidden;      /* what no overlap hides (lower bound) */
    double gather_serial; /* every gather */
} stage_dp;

static double affine(const tpd_plan_affine *a, double bytes) {
    return a->per_byte > 0.0 || a->fixed > 0.0 ? a->per_byte * bytes + a->fixed : 0.0;
}

/* A bucket of `len` elements, `xlen` of them local experts' (EP > 1): the rest over DP x CP,
 * those over expert-DP, two collectives; one when the bucket holds only one kind. */
static double bucket_reduce(const tpd_plan_dp_cost *dpc, double len, double xlen) {
    double dense = len - xlen, t = 0.0;
    if (dense > 0.0 || xlen <= 0.0) t += affine(&dpc->reduce, dense * dpc->grad_bytes);
    if (xlen > 0.0) t += affine(&dpc->reduce_ep, xlen * dpc->grad_bytes);
    return t;
}

typedef struct bucket_ev {
    double ready;
    int b;
    double reduce; /* its reduction, s */
} bucket_ev;

static int cmp_ready(const void *x, const void *y) {
    const bucket_ev *a = x, *b = y;
    if (a->ready != b->ready) return a->ready < b->ready ? -1 : 1;
    return b->b - a->b; /* the higher bucket first, as the engine's loops */
}

/* The stage's reduction and gathers. `end` is its pipeline end, `finish` when the tied
 * embedding's sum is done (end, or later on the first and last stage, whose all-reduce
 * takes `emb`); final_t/use_t as unit_times (final_t NULL: no overlap_grad_reduce). */
static tpd_status stage_comm(const tpd_plan_layout *lay, const tpd_plan_units *u,
                             const tpd_plan_dp_cost *dpc, double emb, double end, double finish,
                             const double *final_t, const double *use_t, stage_dp *out) {
    int nb = u->nbuckets;
    bucket_ev *ev = calloc((size_t)(nb > 0 ? nb : 1), sizeof *ev);
    if (!ev) {
        tpd_log_error("plan: out of memory");
        return TPD_ERR_NOMEM;
    }
    double total = 0.0, unhidden = 0.0, gsum = 0.0, lateness = 0.0;
    int first = 0;    /* the first unit that may overlap the next bucket */
    double ub0 = 0.0; /* its first element */
    for (int b = 0; b < nb; b++) {
        double b0, len;
        tpd_plan_units_bucket(u, b, &b0, &len);
        while (first < u->n - 1 && ub0 + u->elems[first] <= b0)
            ub0 += u->elems[first++];
        /* the units inside [b0, b0 + len): final when the last of them is, needed when
         * the first of them is read */
        double ready = -INFINITY, need = INFINITY, at = ub0, xlen = 0.0;
        int embed = 0;
        for (int i = first; i < u->n && at < b0 + len; at += u->elems[i++]) {
            if (u->elems[i] <= 0.0) continue;
            if (u->expert[i] > 0.0) { /* the unit's share inside the bucket, pro rata */
                double lo = at > b0 ? at : b0, hi = at + u->elems[i];
                if (hi > b0 + len) hi = b0 + len;
                if (hi > lo) xlen += (hi - lo) * u->expert[i] / u->elems[i];
            }
            double f = final_t && i > 0 && final_t[i] >= 0.0 ? final_t[i] : finish;
            if (f > ready) ready = f;
            if (use_t[i] < need) need = use_t[i];
            embed |= i == 0;
        }
        if (ready == -INFINITY) ready = finish;
        ev[b] = (bucket_ev){ready, b, bucket_reduce(dpc, len, xlen)};
        double d = ev[b].reduce;
        total += d;
        if (!final_t || embed) unhidden += d;
        /* gathers: serial from the optimizer's end, in buffer order */
        gsum += affine(&dpc->gather, len * dpc->param_bytes);
        if (gsum - need > lateness) lateness = gsum - need;
    }
    qsort(ev, (size_t)nb, sizeof *ev, cmp_ready);
    double link = 0.0, done = finish;
    for (int i = 0; i < nb; i++) {
        double start = ev[i].ready > link ? ev[i].ready : link;
        link = start + ev[i].reduce;
        if (link > done) done = link;
    }
    free(ev);
    out->exposed = done - end;
    out->total = total + emb;
    out->unhidden = unhidden + emb;
    out->gather_serial = gsum;
    out->gather = lay->overlap_param_gather ? lateness : gsum;
    return TPD_OK;
}

double tpd_plan_dp_unhidden(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                            const tpd_plan_dp_cost *dpc) {
    tpd_plan_units u;
    int ends = tpd_plan_embedding_group(cfg, lay) && (stage == 0 || stage == lay->pp - 1);
    if (tpd_plan_units_init(cfg, lay, stage, &u) != TPD_OK) return 0.0;
    double *use_t = malloc((size_t)u.n * sizeof *use_t), *final_t = NULL;
    stage_dp sd = {0};
    if (use_t) {
        for (int i = 0; i < u.n; i++)
            use_t[i] = INFINITY; /* any gather lateness is not a bound */
        if (lay->overlap_grad_reduce) final_t = calloc((size_t)u.n, sizeof *final_t);
        if (!lay->overlap_grad_reduce || final_t)
            (void)stage_comm(lay, &u, dpc, ends ? dpc->emb_allreduce : 0.0, 0.0, 0.0, final_t,
                             use_t, &sd);
    }
    free(final_t);
    free(use_t);
    tpd_plan_units_free(&u);
    return sd.unhidden + (lay->overlap_param_gather ? 0.0 : sd.gather_serial);
}

tpd_status tpd_plan_step_finish(const tpd_config *cfg, const tpd_plan_layout *lay,
                                const tpd_plan_pipe *pipe, const tpd_plan_stage_cost *cost,
                                const tpd_plan_dp_cost *dpc, tpd_plan_result *res) {
    tpd_status st = TPD_OK;
    int p = lay->pp;
    tpd_plan_time *t = &res->time;
    /* the tied embedding's sum: both ends wait for each other (untied: no such sum) */
    int group = tpd_plan_embedding_group(cfg, lay);
    double emb_end = 0.0;
    if (group) {
        emb_end = pipe->end[0] > pipe->end[p - 1] ? pipe->end[0] : pipe->end[p - 1];
        emb_end += dpc->emb_allreduce;
    }
    double crit = 0.0, exposed_max = 0.0, gather = 0.0, total = 0.0;
    for (int s = 0; s < p; s++) {
        tpd_plan_units u;
        TPD_CHECK(tpd_plan_units_init(cfg, lay, s, &u));
        double *final_t = malloc((size_t)u.n * sizeof *final_t);
        double *use_t = malloc((size_t)u.n * sizeof *use_t);
        if (!final_t || !use_t) {
            free(final_t);
            free(use_t);
            tpd_plan_units_free(&u);
            tpd_log_error("plan: out of memory");
            return TPD_ERR_NOMEM;
        }
        unit_times(cfg, lay, s, pipe, &cost[s], &u, final_t, use_t);
        int ends = group && (s == 0 || s == p - 1);
        double finish = ends ? emb_end : pipe->end[s];
        stage_dp sd;
        st = stage_comm(lay, &u, dpc, ends ? dpc->emb_allreduce : 0.0, pipe->end[s], finish,
                        lay->overlap_grad_reduce ? final_t : NULL, use_t, &sd);
        free(final_t);
        free(use_t);
        tpd_plan_units_free(&u);
        TPD_CHECK(st);
        res->dp_exposed[s] = sd.exposed;
        if (pipe->end[s] + sd.exposed > crit) crit = pipe->end[s] + sd.exposed;
        if (sd.exposed > exposed_max) exposed_max = sd.exposed;
        if (sd.gather > gather) gather = sd.gather;
        if (sd.total + sd.gather_serial > total) total = sd.total + sd.gather_serial;
    }
    t->dp_comm_exposed = crit - pipe->makespan > 0.0 ? crit - pipe->makespan : 0.0;
    t->dp_exposed_max = exposed_max;
    t->dp_gather_exposed = gather;
    t->dp_comm_total = total;
    t->pp_idle_fraction = pipe->idle_fraction;
    res->step_time_s = t->compute + t->pp_bubble + t->pp_p2p + t->dp_comm_exposed + t->optimizer +
                       t->dp_gather_exposed + t->dp_shard_exposed + t->dp_replica_allreduce +
                       t->straggler + t->global_sync + t->step_host + t->dp_outer + t->outer_update;
    return TPD_OK;
}
