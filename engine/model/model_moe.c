/* The mixture-of-experts MLP (model.num_moe_experts > 0): a router, E experts and
 * optionally shared experts, in place of the dense MLP of every layer.
 *
 * Forward, on the N rows of the micro-batch (gathered under SP):
 *   logits = x routerw^T (N,E), fp32; p = softmax(logits) over all E;
 *   each token's k experts: the k largest logits (ties to the lower expert index, so that
 *   equal logits route alike on every layout), weighted by a softmax over those k logits
 *   (moe_router_pre_softmax false: Mixtral's weights), or by their p (pre_softmax true,
 *   renormalized to sum 1 under moe_norm_topk_prob: HF's norm_topk_prob);
 *   with moe_expert_capacity_factor > 0 an expert takes at most ceil(factor N k / E)
 *   assignments, first come in token order, and the rest are dropped (weight 0);
 *   the kept assignments are sorted by expert (then token), their rows gathered, and each
 *   expert's block runs its MLP (grouped matmuls: fc, GELU or SwiGLU, proj);
 *   y = sum over a token's kept assignments of weight x expert output, + the shared
 *   experts' MLP of x (times sigmoid(x gate) under moe_shared_expert_gate).
 * Each expert's MLP is split over TP like the dense one (expert TP = TP): the router is
 * replicated, every TP rank routes the same tokens the same way, computes its share of
 * every expert, and the partial y is summed over TP once (all-reduce, or reduce-scatter
 * under SP). The experts' second bias is added on TP rank 0 only, so the sum holds it once.
 *
 * Losses (per micro-batch and layer, over its N tokens; weighted like the lm loss's mean,
 * 1 / (micro-batches x DP) each): Switch's load balancing E coeff sum_e f_e P_e, f_e the
 * share of the N k assignments routed to e (before dropping), P_e the mean of p over the
 * tokens; ST-MoE's z-loss coeff mean_t logsumexp(logits_t)^2.
 *
 * Expert parallelism (EP > 1): the EP ranks of a group (consecutive DP ranks, each with
 * its own tokens) hold E / EP experts each, [e0, e0 + El). Each routes its own N tokens
 * over all E experts, and its kept rows, already in expert order, are blocks by the rank
 * that holds the expert. An all-to-all of the El counts per rank comes first, then the
 * rows (a variable all-to-all); each rank runs its experts over the rows it received,
 * source by source (a source's rows are in its expert order: El groups each), and a second
 * all-to-all sends the outputs back into the sources' expert order, where the weighting
 * and the scatter to tokens run as at EP 1. The backward sends the outputs' gradients the
 * same way, and the input gradients of the received rows back. An expert's weight
 * gradient so sums the rows of the whole EP group; the expert-DP group sums the rest
 * (engine/optim/grad_sync.c). Routing, and so the losses and what each token computes,
 * does not depend on EP: only where the rows are computed, and the order in which an
 * expert's weight gradient adds them, do.
 *
 * The routing runs on the host in fp32, one code path on both backends: over host mirrors
 * of the layer's routing regions (moe_host), which on the cpu backend are the regions
 * themselves. On a backend with device memory the router's logits (and the shared gate)
 * come to the host, and the whole routing goes back to the layer's block, where the
 * kernels read order, wperm and the gate, the EP count exchange runs, and the backward
 * finds it again (it copies it back to the host). The copies wait for their transfer. */
#include "engine/model/model_internal.h"

#include "base/bf16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The layer's MoE regions (tpd_act_layer's moe_*). */
typedef struct moe_acts {
    float *probs, *lse, *topw, *wperm, *gate;
    int32_t *topi, *pos, *order, *counts; /* counts[E]: the kept rows */
    int32_t *ecounts;                     /* EP: (EP, El) rows received per source, expert */
    void *x, *h, *hact, *y, *shout;
} moe_acts;

static moe_acts moe_view(const tpd_model *m, const tpd_model_acts *a) {
    const tpd_act_layer *o = &m->plan.layer;
    char *b = a->block;
    moe_acts v = {(float *)(b + o->moe_probs),
                  (float *)(b + o->moe_lse),
                  (float *)(b + o->moe_topw),
                  (float *)(b + o->moe_wperm),
                  m->d.shgate ? (float *)(b + o->moe_gate) : NULL,
                  (int32_t *)(b + o->moe_topi),
                  (int32_t *)(b + o->moe_pos),
                  (int32_t *)(b + o->moe_order),
                  (int32_t *)(b + o->moe_counts),
                  m->d.ep_size > 1 ? (int32_t *)(b + o->moe_ecounts) : NULL,
                  b + o->moe_x,
                  b + o->moe_h,
                  b + o->moe_hact,
                  b + o->moe_y,
                  m->d.Fs ? b + o->moe_shout : NULL};
    return v;
}

/* The host mirror of v's routing regions (moe_host): v itself where the backend's memory is
 * the host's; the rows (x, h, hact, y, shout) stay v's. */
static tpd_status moe_host_view(const tpd_model *m, const moe_acts *v, moe_acts *h_p) {
    const tpd_buffer_plan *pl = &m->plan;
    const tpd_act_layer *o = &pl->layer;
    *h_p = *v;
    if (!tpd_kern_device_memory(m->kb)) return TPD_OK;
    if (!pl->moe_host)
        return tpd_fail(TPD_ERR_INTERNAL,
                        "model: backend %s keeps device memory, but the memory plan has no host "
                        "mirror of the experts' routing (training.device is not cuda)",
                        tpd_kern_name(m->kb));
    char *r = (char *)m->host_tokens + pl->h_moe_route;
    h_p->probs = (float *)r;
    h_p->lse = (float *)(r + (o->moe_lse - o->moe_probs));
    h_p->topi = (int32_t *)(r + (o->moe_topi - o->moe_probs));
    h_p->topw = (float *)(r + (o->moe_topw - o->moe_probs));
    h_p->pos = (int32_t *)(r + (o->moe_pos - o->moe_probs));
    h_p->order = (int32_t *)(r + (o->moe_order - o->moe_probs));
    h_p->wperm = (float *)(r + (o->moe_wperm - o->moe_probs));
    h_p->counts = (int32_t *)(r + (o->moe_counts - o->moe_probs));
    h_p->gate = v->gate ? (float *)((char *)m->host_tokens + pl->h_moe_gate) : NULL;
    h_p->ecounts = v->ecounts ? (int32_t *)((char *)m->host_tokens + pl->h_moe_ecounts) : NULL;
    return TPD_OK;
}

/* Bytes of the routing regions, moe_probs up to the end of moe_counts (one copy). */
static size_t route_bytes(const tpd_model *m) {
    const tpd_act_layer *o = &m->plan.layer;
    return o->moe_counts + ((size_t)m->d.E + 1) * 4 - o->moe_probs;
}

/* host <- backend and backend <- host; nothing where they are the same memory */
static tpd_status to_host(const tpd_model *m, void *host, const void *buf, size_t bytes) {
    return host == buf ? TPD_OK : tpd_kern_copy_to_host(m->kb, host, buf, bytes);
}

static tpd_status to_backend(const tpd_model *m, void *buf, const void *host, size_t bytes) {
    return host == buf ? TPD_OK : tpd_kern_copy_to_device(m->kb, buf, host, bytes);
}

/* The router's logits and the shared gate are fp32 on the host (the routing runs there), but
 * a matmul writes the activation dtype: under bf16 the n bf16 results at the start of an
 * fp32 buffer are widened in place, last first (element i's float covers only the bf16
 * elements 2i and 2i+1, read before it), and fp32 gradients are narrowed in place for the
 * matmul's backward, first first. No-ops under fp32. */
static void widen_in_place(const tpd_model *m, float *x, size_t n) {
    if (m->plan.act_size != 2) return;
    const uint16_t *h = (const uint16_t *)x;
    for (size_t i = n; i-- > 0;)
        x[i] = tpd_bf16_to_f32(h[i]);
}

static void narrow_in_place(const tpd_model *m, float *x, size_t n) {
    if (m->plan.act_size != 2) return;
    uint16_t *h = (uint16_t *)x;
    for (size_t i = 0; i < n; i++)
        h[i] = tpd_bf16_from_f32(x[i]);
}

/* Routes the N tokens from the logits in v.probs (overwritten by the softmax). */
static void route(tpd_model *m, const moe_acts *v, int N) {
    const tpd_model_dims *d = &m->d;
    const tpd_config_model *c = &m->cfg.model;
    const int E = d->E, k = d->topk;
    int32_t *counts = v->counts;
    memset(counts, 0, (size_t)(E + 1) * sizeof *counts);
    double *f = calloc((size_t)E, sizeof *f), *P = calloc((size_t)E, sizeof *P);
    double z = 0.0;
    int cap = INT32_MAX;
    if (c->moe_expert_capacity_factor > 0)
        cap = (int)ceil(c->moe_expert_capacity_factor * (double)N * k / E);
    int dropped = 0;
    for (int t = 0; t < N; t++) {
        float *p = v->probs + (size_t)t * E, mx = -INFINITY;
        int32_t *ti = v->topi + (size_t)t * k;
        float *tw = v->topw + (size_t)t * k;
        /* top-k of the logits, ties to the lower index */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < j; q++)
                    taken |= ti[q] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ti[j] = best;
        }
        for (int e = 0; e < E; e++)
            if (p[e] > mx) mx = p[e];
        double sum = 0.0;
        for (int e = 0; e < E; e++)
            sum += exp((double)p[e] - mx);
        double lse = mx + log(sum);
        v->lse[t] = (float)lse;
        z += lse * lse;
        float logit_sel[64];
        for (int j = 0; j < k; j++)
            logit_sel[j] = p[ti[j]];
        for (int e = 0; e < E; e++)
            p[e] = (float)exp((double)p[e] - lse);
        if (c->moe_router_pre_softmax) {
            double s = 0.0;
            for (int j = 0; j < k; j++)
                s += p[ti[j]];
            for (int j = 0; j < k; j++)
                tw[j] = c->moe_norm_topk_prob ? (float)(p[ti[j]] / s) : p[ti[j]];
        } else { /* softmax over the k chosen logits (the first is the largest) */
            double s = 0.0;
            for (int j = 0; j < k; j++)
                s += exp((double)logit_sel[j] - logit_sel[0]);
            for (int j = 0; j < k; j++)
                tw[j] = (float)(exp((double)logit_sel[j] - logit_sel[0]) / s);
        }
        for (int e = 0; e < E; e++)
            P[e] += p[e];
        for (int j = 0; j < k; j++) {
            f[ti[j]] += 1.0;
            /* capacity: first come, in token order */
            if (counts[ti[j]] < cap) {
                v->pos[(size_t)t * k + j] = counts[ti[j]]++; /* rank within its expert */
            } else {
                v->pos[(size_t)t * k + j] = -1;
                dropped++;
            }
        }
    }
    /* expert order: expert e's rows start after the experts before it */
    int32_t start[4097];
    int kept = 0;
    for (int e = 0; e < E; e++) {
        start[e] = kept;
        kept += counts[e];
    }
    counts[E] = kept;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int32_t *ps = &v->pos[(size_t)t * k + j];
            if (*ps < 0) continue;
            *ps += start[v->topi[(size_t)t * k + j]];
            v->order[*ps] = t;
            v->wperm[*ps] = v->topw[(size_t)t * k + j];
        }
    /* the step's statistics: TP rank 0 counts each token once, a recompute not again */
    if (d->tp_rank == 0 && !m->moe_quiet) {
        double aux = 0.0;
        for (int e = 0; e < E; e++)
            aux += (f[e] / ((double)N * k)) * (P[e] / N);
        m->moe.aux += c->moe_aux_loss_coeff * E * aux;
        m->moe.z += c->moe_z_loss_coeff * z / N;
        m->moe.aux_raw += E * aux;
        m->moe.dropped += dropped;
        m->moe.assigned += (double)N * k;
        for (int e = 0; e < E && m->moe.load; e++)
            m->moe.load[e] += f[e];
    }
    free(f);
    free(P);
}

/* ---- expert parallelism: the token all-to-alls ---- */

enum { TAG_MOE_COUNTS = 0x4d30, TAG_MOE_ROWS = 0x4d31 };

tpd_status tpd_model_set_ep(tpd_model *m, tpd_comm *ep_comm, int ep_rank) {
    tpd_model_dims *d = &m->d;
    if (d->ep_size <= 1) return TPD_OK;
    if (!ep_comm || tpd_comm_size(ep_comm) != d->ep_size || tpd_comm_rank(ep_comm) != ep_rank)
        return tpd_fail(TPD_ERR_INTERNAL,
                        "model: the EP communicator (size %d, rank %d) is not the layout's (EP "
                        "%d, rank %d)",
                        ep_comm ? tpd_comm_size(ep_comm) : 0, ep_comm ? tpd_comm_rank(ep_comm) : -1,
                        d->ep_size, ep_rank);
    size_t *a2a = calloc(4 * (size_t)d->ep_size, sizeof *a2a);
    if (!a2a) return tpd_fail_nomem("the EP all-to-all counts", 4 * (size_t)d->ep_size * 8);
    free(m->moe_a2a);
    m->moe_a2a = a2a;
    m->ep_comm = ep_comm;
    /* the experts this rank holds: offsets do not depend on the EP rank, the global rows do */
    d->ep_rank = ep_rank;
    d->e0 = ep_rank * d->El;
    m->plan.lay.d = *d;
    return TPD_OK;
}

/* The counts: source s's El counts for this rank's experts land in ecounts[s El ..]. */
static tpd_status ep_counts(tpd_model *m, const moe_acts *v) {
    const int EP = m->d.ep_size, El = m->d.El;
    size_t *c = m->moe_a2a, *dsp = c + EP;
    for (int p = 0; p < EP; p++) {
        c[p] = (size_t)El;
        dsp[p] = (size_t)p * El;
    }
    return tpd_comm_alltoallv(m->ep_comm, v->counts, c, dsp, v->ecounts, c, dsp, TPD_DTYPE_I32,
                              TAG_MOE_COUNTS, tpd_kern_stream(m->kb));
}

/* The rows' all-to-all plan, `width` elements a row: this rank's rows for rank p (its
 * experts' kept rows, consecutive in the expert order) and rank p's rows for this one
 * (source-major, each source's in its expert order). Returns the rows received. */
static int ep_plan(tpd_model *m, const moe_acts *v, size_t width) {
    const int EP = m->d.ep_size, El = m->d.El;
    size_t *sc = m->moe_a2a, *sd = sc + EP, *rc = sd + EP, *rd = rc + EP;
    size_t s0 = 0, r0 = 0;
    for (int p = 0; p < EP; p++) {
        size_t ns = 0, nr = 0;
        for (int j = 0; j < El; j++) {
            ns += (size_t)v->counts[p * El + j];
            nr += (size_t)v->ecounts[p * El + j];
        }
        sd[p] = s0 * width;
        sc[p] = ns * width;
        rd[p] = r0 * width;
        rc[p] = nr * width;
        s0 += ns;
        r0 += nr;
    }
    return (int)r0;
}

/* Sends rows to the experts (fwd: the sources' blocks to the experts' side) or back. */
static tpd_status ep_rows(tpd_model *m, const void *send, void *recv, int to_experts) {
    const int EP = m->d.ep_size;
    size_t *sc = m->moe_a2a, *sd = sc + EP, *rc = sd + EP, *rd = rc + EP;
    if (!to_experts)
        return tpd_comm_alltoallv(m->ep_comm, send, rc, rd, recv, sc, sd, tpd_kern_act_dtype(m->kb),
                                  TAG_MOE_ROWS, tpd_kern_stream(m->kb));
    return tpd_comm_alltoallv(m->ep_comm, send, sc, sd, recv, rc, rd, tpd_kern_act_dtype(m->kb),
                              TAG_MOE_ROWS, tpd_kern_stream(m->kb));
}

/* The experts' side: `nsrc` blocks of rows (one per EP source; one at EP 1), block s with
 * counts cnt + s G for the G local experts, starting at row row0[s]. */
typedef struct moe_side {
    int nsrc, G, rows;
    const int32_t *cnt;
    int row0[TPD_MOE_MAX_EP + 1];
} moe_side;

static tpd_status side_of(const tpd_model *m, const moe_acts *v, moe_side *sd) {
    const tpd_model_dims *d = &m->d;
    sd->nsrc = d->ep_size > 1 ? d->ep_size : 1;
    sd->G = d->El;
    sd->cnt = d->ep_size > 1 ? v->ecounts : v->counts;
    if (sd->nsrc > TPD_MOE_MAX_EP)
        return tpd_fail(TPD_ERR_UNSUPPORTED, "model: expert_model_parallel_size %d is above %d",
                        sd->nsrc, TPD_MOE_MAX_EP);
    int r = 0;
    for (int s = 0; s < sd->nsrc; s++) {
        sd->row0[s] = r;
        for (int j = 0; j < sd->G; j++)
            r += sd->cnt[s * sd->G + j];
    }
    sd->row0[sd->nsrc] = r;
    sd->rows = r;
    if ((size_t)r > tpd_model_moe_recv_rows(d))
        return tpd_fail(TPD_ERR_INTERNAL, "model: %d expert rows exceed the planned %zu", r,
                        tpd_model_moe_recv_rows(d));
    return TPD_OK;
}

#define ROWS(p, r, w) ((char *)(p) + (size_t)(r) * (size_t)(w)*pl->act_size)

/* The experts' MLPs over the side's rows x: h, hact (kept for the backward) and y. */
static tpd_status experts_fwd(tpd_model *m, const tpd_model_views *w, const moe_side *sd,
                              const void *x, void *h, void *hact, void *y) {
    const tpd_model_dims *d = &m->d;
    const tpd_buffer_plan *pl = &m->plan;
    const int C = d->C;
    for (int s = 0; s < sd->nsrc; s++) {
        int r = sd->row0[s];
        TPD_CHECK(tpd_kern_grouped_matmul_fwd(m->kb, ROWS(h, r, d->FCel), ROWS(x, r, C), w->expfcw,
                                              w->expfcb, sd->cnt + s * sd->G, sd->G, C, d->FCel));
    }
    if (d->glu)
        TPD_CHECK(tpd_kern_swiglu_fwd(m->kb, hact, h, sd->rows, d->Fel));
    else
        TPD_CHECK(tpd_kern_gelu_fwd(m->kb, hact, h, (size_t)sd->rows * d->Fel));
    for (int s = 0; s < sd->nsrc; s++) {
        int r = sd->row0[s];
        TPD_CHECK(tpd_kern_grouped_matmul_fwd(m->kb, ROWS(y, r, C), ROWS(hact, r, d->Fel),
                                              w->expprojw, d->tp_rank == 0 ? w->expprojb : NULL,
                                              sd->cnt + s * sd->G, sd->G, d->Fel, C));
    }
    return TPD_OK;
}

/* Backwards: dy of the side's rows in, their dx out (dy is clobbered only where dx
 * aliases it). */
static tpd_status experts_bwd(tpd_model *m, const tpd_model_views *w, const tpd_model_views *g,
                              const moe_side *sd, const moe_acts *v, const void *dy, void *dx) {
    const tpd_model_dims *d = &m->d;
    const tpd_buffer_plan *pl = &m->plan;
    const int C = d->C;
    char *dh = m->ws + pl->w_moe_dh, *dhact = m->ws + pl->w_moe_dhact;
    for (int s = 0; s < sd->nsrc; s++) {
        int r = sd->row0[s];
        TPD_CHECK(tpd_kern_grouped_matmul_bwd(m->kb, ROWS(dhact, r, d->Fel), g->expprojw,
                                              g->expprojb, ROWS(dy, r, C), ROWS(v->hact, r, d->Fel),
                                              w->expprojw, sd->cnt + s * sd->G, sd->G, d->Fel, C));
    }
    if (d->glu)
        TPD_CHECK(tpd_kern_swiglu_bwd(m->kb, dh, v->h, dhact, sd->rows, d->Fel));
    else
        TPD_CHECK(tpd_kern_gelu_bwd(m->kb, dh, v->h, dhact, (size_t)sd->rows * d->Fel));
    for (int s = 0; s < sd->nsrc; s++) {
        int r = sd->row0[s];
        TPD_CHECK(tpd_kern_grouped_matmul_bwd(m->kb, ROWS(dx, r, C), g->expfcw, g->expfcb,
                                              ROWS(dh, r, d->FCel), ROWS(v->x, r, C), w->expfcw,
                                              sd->cnt + s * sd->G, sd->G, C, d->FCel));
    }
    return TPD_OK;
}

tpd_status tpd_model_moe_fwd(tpd_model *m, const tpd_model_rows *r, const tpd_model_views *w,
                             const tpd_model_acts *a, const void *full) {
    const tpd_model_dims *d = &m->d;
    const tpd_buffer_plan *pl = &m->plan;
    int N = r->B * r->T, C = d->C, E = d->E;
    moe_acts v = moe_view(m, a), h;
    TPD_CHECK(moe_host_view(m, &v, &h));
    /* logits = x routerw^T, routed on the host; the routing kept in the layer's block */
    TPD_CHECK(tpd_kern_matmul_fwd(m->kb, v.probs, full, w->routerw, NULL, N, C, E));
    TPD_CHECK(tpd_kern_synchronize(m->kb));
    TPD_CHECK(to_host(m, h.probs, v.probs, (size_t)N * E * pl->act_size));
    widen_in_place(m, h.probs, (size_t)N * E);
    route(m, &h, N);
    TPD_CHECK(to_backend(m, v.probs, h.probs, route_bytes(m)));
    int kept = h.counts[E];
    char *ys = m->ws + pl->w_moe_perm, *y = m->ws + pl->w_moe_y;
    moe_side sd;
    if (d->ep_size > 1) {
        /* the kept rows in expert order to the ranks of their experts, the MLPs there, and
         * the outputs back into this rank's expert order (v.y) */
        char *ea = m->ws + pl->w_moe_ea;
        TPD_CHECK(tpd_kern_gather_rows(m->kb, ys, full, v.order, kept, C));
        TPD_CHECK(ep_counts(m, &v));
        TPD_CHECK(to_host(m, h.ecounts, v.ecounts, (size_t)d->ep_size * d->El * 4));
        (void)ep_plan(m, &h, (size_t)C);
        TPD_CHECK(side_of(m, &h, &sd));
        TPD_CHECK(ep_rows(m, ys, v.x, 1));
        TPD_CHECK(experts_fwd(m, w, &sd, v.x, v.h, v.hact, ea));
        TPD_CHECK(ep_rows(m, ea, v.y, 0));
    } else {
        /* the kept rows in expert order, each expert's MLP on its block */
        TPD_CHECK(tpd_kern_gather_rows(m->kb, v.x, full, v.order, kept, C));
        TPD_CHECK(side_of(m, &h, &sd));
        TPD_CHECK(experts_fwd(m, w, &sd, v.x, v.h, v.hact, v.y));
    }
    /* y = sum of weight x expert output per token (+ the shared experts) */
    TPD_CHECK(tpd_kern_scale_rows(m->kb, ys, v.y, v.wperm, kept, C));
    TPD_CHECK(tpd_kern_zero(m->kb, y, (size_t)N * C * pl->act_size));
    TPD_CHECK(tpd_kern_scatter_add_rows(m->kb, y, ys, v.order, kept, C, N));
    if (d->Fs) {
        if (d->glu) {
            TPD_CHECK(tpd_kern_matmul_fwd(m->kb, a->fch, full, w->shfcw, w->shfcb, N, C, d->FCsl));
            TPD_CHECK(tpd_kern_swiglu_fwd(m->kb, a->fch_gelu, a->fch, N, d->Fsl));
        } else {
            TPD_CHECK(tpd_kern_matmul_gelu_fwd(m->kb, a->fch_gelu, a->fch, full, w->shfcw, w->shfcb,
                                               N, C, d->Fsl));
        }
        TPD_CHECK(tpd_kern_matmul_fwd(m->kb, v.shout, a->fch_gelu, w->shprojw,
                                      d->tp_rank == 0 ? w->shprojb : NULL, N, d->Fsl, C));
        if (d->shgate) { /* gate = sigmoid(x shgatew^T), on the host */
            TPD_CHECK(tpd_kern_matmul_fwd(m->kb, v.gate, full, w->shgatew, NULL, N, C, 1));
            TPD_CHECK(tpd_kern_synchronize(m->kb));
            TPD_CHECK(to_host(m, h.gate, v.gate, (size_t)N * pl->act_size));
            widen_in_place(m, h.gate, (size_t)N);
            for (int t = 0; t < N; t++)
                h.gate[t] = (float)(1.0 / (1.0 + exp(-(double)h.gate[t])));
            TPD_CHECK(to_backend(m, v.gate, h.gate, (size_t)N * 4));
            TPD_CHECK(tpd_kern_scale_rows(m->kb, ys, v.shout, v.gate, N, C));
            TPD_CHECK(tpd_kern_add(m->kb, y, y, ys, (size_t)N * C));
        } else {
            TPD_CHECK(tpd_kern_add(m->kb, y, y, v.shout, (size_t)N * C));
        }
    }
    /* out = x1 + the TP sum of y (this rank's rows under SP) */
    TPD_CHECK(tpd_tp_reduce_rows(&m->tp, a->out, y, N, C, d->sp));
    return tpd_kern_add(m->kb, a->out, a->out, a->x1, (size_t)r->Nl * C);
}

/* dlogits (N,E) of the router from the assignments' weight gradients dw (per expert-order
 * row), and the two losses, scaled by `scale` (a micro-batch loss's weight). */
static void route_bwd(tpd_model *m, const moe_acts *v, const float *dw, float *dl, int N,
                      double scale) {
    const tpd_model_dims *d = &m->d;
    const tpd_config_model *c = &m->cfg.model;
    const int E = d->E, k = d->topk;
    double caux = c->moe_aux_loss_coeff * E / ((double)N * k) / N * scale;
    double cz = c->moe_z_loss_coeff * 2.0 / N * scale;
    double dp[4096];
    for (int t = 0; t < N; t++) {
        const float *p = v->probs + (size_t)t * E, *tw = v->topw + (size_t)t * k;
        const int32_t *ti = v->topi + (size_t)t * k, *ps = v->pos + (size_t)t * k;
        float *g = dl + (size_t)t * E;
        double dtw[64], s = 0.0;
        for (int j = 0; j < k; j++)
            dtw[j] = ps[j] >= 0 ? dw[ps[j]] : 0.0;
        for (int e = 0; e < E; e++) {
            dp[e] = caux * m->moe_f[e]; /* d aux / d p_{t,e} */
            g[e] = 0.0f;
        }
        for (int j = 0; j < k; j++)
            s += tw[j] * dtw[j];
        if (c->moe_router_pre_softmax) {
            double sel = 0.0;
            for (int j = 0; j < k; j++)
                sel += p[ti[j]];
            for (int j = 0; j < k; j++)
                dp[ti[j]] += c->moe_norm_topk_prob ? (dtw[j] - s) / sel : dtw[j];
        } else { /* the softmax over the chosen logits */
            for (int j = 0; j < k; j++)
                g[ti[j]] += (float)(tw[j] * (dtw[j] - s));
        }
        /* through the softmax over all experts: dl = p (dp - sum p dp), plus the z-loss */
        double pdp = 0.0;
        for (int e = 0; e < E; e++)
            pdp += p[e] * dp[e];
        for (int e = 0; e < E; e++)
            g[e] += (float)(p[e] * (dp[e] - pdp) + cz * v->lse[t] * p[e]);
    }
}

tpd_status tpd_model_moe_bwd(tpd_model *m, const tpd_model_views *w, const tpd_model_views *g,
                             const tpd_model_acts *a, const void *full, const void *dfull,
                             void *dpartial, float dloss) {
    const tpd_model_dims *d = &m->d;
    const tpd_buffer_plan *pl = &m->plan;
    int N = d->B * d->T, C = d->C, E = d->E;
    moe_acts v = moe_view(m, a), h;
    TPD_CHECK(moe_host_view(m, &v, &h));
    /* the routing is the forward's, kept in the layer's block (a recomputed layer's is the
     * recompute's, the same), on the host again */
    TPD_CHECK(to_host(m, h.probs, v.probs, route_bytes(m)));
    if (d->ep_size > 1) TPD_CHECK(to_host(m, h.ecounts, v.ecounts, (size_t)d->ep_size * d->El * 4));
    if (d->shgate) TPD_CHECK(to_host(m, h.gate, v.gate, (size_t)N * 4));
    int kept = h.counts[E];
    /* the expert frequencies of this layer and micro-batch, for the aux loss's gradient */
    for (int e = 0; e < E; e++)
        m->moe_f[e] = 0.0;
    for (int t = 0; t < N * d->topk; t++)
        m->moe_f[h.topi[t]] += 1.0;
    char *perm = m->ws + pl->w_moe_perm, *dx2 = m->ws + pl->w_moe_dx;
    float *dw = (float *)(m->ws + pl->w_moe_dw), *dl = (float *)(m->ws + pl->w_moe_dlogits);
    /* their host mirrors (the same buffers on cpu) */
    float *hdw = dw, *hdl = dl;
    if (pl->moe_host && tpd_kern_device_memory(m->kb)) {
        hdw = (float *)((char *)m->host_tokens + pl->h_moe_dw);
        hdl = (float *)((char *)m->host_tokens + pl->h_moe_dlogits);
    }
    /* y = sum_j w_j out_j: d out_j = w_j dy, d w_j = dy . out_j (summed over TP) */
    TPD_CHECK(tpd_kern_gather_rows(m->kb, perm, dfull, v.order, kept, C));
    TPD_CHECK(tpd_kern_row_dot(m->kb, dw, perm, v.y, kept, C));
    TPD_CHECK(tpd_tp_allreduce(&m->tp, dw, (size_t)kept, TPD_DTYPE_F32, TPD_COMM_OP_SUM));
    TPD_CHECK(tpd_kern_scale_rows(m->kb, perm, perm, v.wperm, kept, C));
    /* the experts' MLPs, backwards (under EP on the experts' ranks: the outputs' gradients
     * travel like the rows did, the inputs' come back) */
    moe_side sd;
    TPD_CHECK(side_of(m, &h, &sd));
    if (d->ep_size > 1) {
        char *ea = m->ws + pl->w_moe_ea, *eb = m->ws + pl->w_moe_eb;
        (void)ep_plan(m, &h, (size_t)C);
        TPD_CHECK(ep_rows(m, perm, ea, 1));
        TPD_CHECK(experts_bwd(m, w, g, &sd, &v, ea, eb));
        TPD_CHECK(ep_rows(m, eb, perm, 0));
    } else {
        TPD_CHECK(experts_bwd(m, w, g, &sd, &v, perm, perm));
    }
    /* the rows back to their tokens: dx (partial over TP) */
    TPD_CHECK(tpd_kern_zero(m->kb, dpartial, (size_t)N * C * pl->act_size));
    TPD_CHECK(tpd_kern_scatter_add_rows(m->kb, dpartial, perm, v.order, kept, C, N));
    /* the router: its logits' gradient from the weights and the two losses, each
     * micro-batch's losses weighted as its lm loss mean is (dloss x N) */
    TPD_CHECK(tpd_kern_synchronize(m->kb));
    TPD_CHECK(to_host(m, hdw, dw, (size_t)kept * 4));
    route_bwd(m, &h, hdw, hdl, N, (double)dloss * N);
    narrow_in_place(m, hdl, (size_t)N * E);
    TPD_CHECK(to_backend(m, dl, hdl, (size_t)N * E * pl->act_size));
    TPD_CHECK(tpd_kern_matmul_bwd(m->kb, d->tp_rank == 0 ? dx2 : NULL, g->routerw, NULL, dl, full,
                                  w->routerw, N, C, E));
    if (d->tp_rank == 0) TPD_CHECK(tpd_kern_add(m->kb, dpartial, dpartial, dx2, (size_t)N * C));
    /* the shared experts: y += gate * proj(act(fc(x))) */
    if (d->Fs) {
        void *dsh = m->ws + pl->w_moe_y; /* d of the shared output (N,C) */
        if (d->shgate) {
            /* d gate_t = dy_t . shout_t (summed over TP); d logit = d gate g (1 - g) */
            float *dg = (float *)(m->ws + pl->w_moe_dw), *hdg = hdw;
            TPD_CHECK(tpd_kern_row_dot(m->kb, dg, dfull, v.shout, N, C));
            TPD_CHECK(tpd_tp_allreduce(&m->tp, dg, (size_t)N, TPD_DTYPE_F32, TPD_COMM_OP_SUM));
            TPD_CHECK(tpd_kern_synchronize(m->kb));
            TPD_CHECK(to_host(m, hdg, dg, (size_t)N * 4));
            for (int t = 0; t < N; t++)
                hdg[t] *= h.gate[t] * (1.0f - h.gate[t]);
            narrow_in_place(m, hdg, (size_t)N);
            TPD_CHECK(to_backend(m, dg, hdg, (size_t)N * pl->act_size));
            /* the gate's weight and (on TP rank 0, the sum holding it once) input gradient */
            TPD_CHECK(tpd_kern_matmul_bwd(m->kb, d->tp_rank == 0 ? dx2 : NULL, g->shgatew, NULL, dg,
                                          full, w->shgatew, N, C, 1));
            if (d->tp_rank == 0)
                TPD_CHECK(tpd_kern_add(m->kb, dpartial, dpartial, dx2, (size_t)N * C));
            TPD_CHECK(tpd_kern_scale_rows(m->kb, dsh, dfull, v.gate, N, C));
        } else {
            dsh = (void *)dfull;
        }
        void *dfch = m->ws + pl->w_dfch, *dfc = d->glu ? m->ws + pl->w_dglu : dfch;
        TPD_CHECK(tpd_kern_matmul_bwd(m->kb, dfch, g->shprojw, g->shprojb, dsh, a->fch_gelu,
                                      w->shprojw, N, d->Fsl, C));
        if (d->glu)
            TPD_CHECK(tpd_kern_swiglu_bwd(m->kb, dfc, a->fch, dfch, N, d->Fsl));
        else
            TPD_CHECK(tpd_kern_gelu_bwd(m->kb, dfc, a->fch, dfch, (size_t)N * d->Fsl));
        TPD_CHECK(tpd_kern_matmul_bwd(m->kb, dx2, g->shfcw, g->shfcb, dfc, full, w->shfcw, N, C,
                                      d->FCsl));
        TPD_CHECK(tpd_kern_add(m->kb, dpartial, dpartial, dx2, (size_t)N * C));
    }
    return TPD_OK;
}
