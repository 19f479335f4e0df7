#include "engine/optim/grad_sync.h"

#include <stdlib.h>

#include "base/clock.h"
#include "base/fault.h"
#include "engine/optim/grad_shard.h"

struct tpd_grad_sync {
    tpd_model *m;
    const tpd_dp_plan *dpp;
    tpd_comm *dp, *emb, *edp; /* edp: EP's expert-DP group (NULL at EP 1) */
    int overlap_grad, overlap_param;
    int nunits;          /* Ls + 2: unit u at index u + 1 (u = -1 .. Ls) */
    size_t *ubeg, *uend; /* element range of each unit; the last one takes the padding */
    int *final_;         /* per unit, this step */
    int *pending0;       /* per bucket: units that overlap it */
    int *pending;        /* per bucket: of those, not final yet this step */
    tpd_comm_req **greq; /* per bucket: gradient reduction in flight (started this step) */
    tpd_comm_req **ereq; /* per bucket: EP, its experts' part's reduction over expert DP */
    int *started;
    tpd_comm_req **preq; /* per bucket: parameter gather in flight */
    double exposed;
    tpd_grad_shard *sh; /* optim_grads(_params): the unit-by-unit engine (grad_shard.h) */
};

static int overlaps(const tpd_grad_sync *gs, int unit_index, int b) {
    size_t b0, len;
    tpd_dp_bucket(gs->dpp, b, &b0, &len);
    return gs->ubeg[unit_index] < b0 + len && b0 < gs->uend[unit_index];
}

tpd_status tpd_grad_sync_create(tpd_model *m, const tpd_dp_plan *dpp, const tpd_mesh_comms *comms,
                                int overlap_grad_reduce, int overlap_param_gather,
                                tpd_grad_sync **gs_p) {
    tpd_grad_sync *gs = calloc(1, sizeof *gs);
    if (!gs) return tpd_fail_nomem("the gradient sync", sizeof *gs);
    gs->m = m;
    gs->dpp = dpp;
    gs->dp = comms->dp;
    gs->emb = comms->emb;
    gs->edp = comms->edp;
    if (dpp->bounds) TPD_CHECK(tpd_grad_shard_create(m, dpp, comms, &gs->sh));
    gs->overlap_grad = overlap_grad_reduce;
    gs->overlap_param = overlap_param_gather;
    gs->nunits = m->d.Ls + 2;
    int nb = dpp->nbuckets > 0 ? dpp->nbuckets : 1;
    gs->ubeg = calloc((size_t)gs->nunits, sizeof *gs->ubeg);
    gs->uend = calloc((size_t)gs->nunits, sizeof *gs->uend);
    gs->final_ = calloc((size_t)gs->nunits, sizeof *gs->final_);
    gs->pending0 = calloc((size_t)nb, sizeof *gs->pending0);
    gs->pending = calloc((size_t)nb, sizeof *gs->pending);
    gs->started = calloc((size_t)nb, sizeof *gs->started);
    gs->greq = calloc((size_t)nb, sizeof *gs->greq);
    gs->ereq = calloc((size_t)nb, sizeof *gs->ereq);
    gs->preq = calloc((size_t)nb, sizeof *gs->preq);
    if (!gs->ubeg || !gs->uend || !gs->final_ || !gs->pending0 || !gs->pending || !gs->started ||
        !gs->greq || !gs->ereq || !gs->preq) {
        tpd_grad_sync_destroy(gs);
        tpd_log_error("grad sync: out of memory for %d buckets", nb);
        return TPD_ERR_NOMEM;
    }
    for (int i = 0; i < gs->nunits; i++)
        tpd_model_unit_range(m, i - 1, &gs->ubeg[i], &gs->uend[i]);
    gs->uend[gs->nunits - 1] = dpp->numel_padded; /* DP padding: with the highest unit */
    /* EP: the experts' region, before the embedding, final with it (at the step's end) */
    gs->ubeg[0] = 0;
    for (int b = 0; b < dpp->nbuckets; b++)
        for (int i = 0; i < gs->nunits; i++)
            gs->pending0[b] += overlaps(gs, i, b);
    *gs_p = gs;
    return TPD_OK;
}

/* Completes *req; its wait counts as exposed time when `exposed`. */
static tpd_status wait_on(tpd_grad_sync *gs, tpd_comm *c, tpd_comm_req **req, int exposed) {
    if (!*req) return TPD_OK;
    double t0 = tpd_clock_s();
    tpd_status st = tpd_comm_wait(c, *req);
    *req = NULL;
    if (exposed) gs->exposed += tpd_clock_s() - t0;
    return st;
}

static tpd_status wait_req(tpd_grad_sync *gs, tpd_comm_req **req, int exposed) {
    return wait_on(gs, gs->dp, req, exposed);
}

/* The group bucket b's parameters are gathered over: expert DP for an expert bucket (EP),
 * else DP. */
static tpd_comm *gather_comm(const tpd_grad_sync *gs, int b) {
    return b < gs->dpp->ebuckets ? gs->edp : gs->dp;
}

static tpd_status wait_gather(tpd_grad_sync *gs, int b, int exposed) {
    return wait_on(gs, gather_comm(gs, b), &gs->preq[b], exposed);
}

tpd_status tpd_grad_sync_destroy(tpd_grad_sync *gs) {
    if (!gs) return TPD_OK;
    tpd_status st = tpd_grad_shard_destroy(gs->sh);
    for (int b = 0; gs->greq && gs->preq && b < gs->dpp->nbuckets; b++) {
        TPD_CHECK_KEEP(wait_req(gs, &gs->greq[b], 0), st);
        if (gs->ereq) TPD_CHECK_KEEP(wait_on(gs, gs->edp, &gs->ereq[b], 0), st);
        TPD_CHECK_KEEP(wait_gather(gs, b, 0), st);
    }
    free(gs->preq);
    free(gs->ereq);
    free(gs->greq);
    free(gs->started);
    free(gs->pending);
    free(gs->pending0);
    free(gs->final_);
    free(gs->uend);
    free(gs->ubeg);
    free(gs);
    return st;
}

void tpd_grad_sync_begin(tpd_grad_sync *gs) {
    for (int i = 0; i < gs->nunits; i++)
        gs->final_[i] = 0;
    for (int b = 0; b < gs->dpp->nbuckets; b++) {
        gs->pending[b] = gs->pending0[b];
        gs->started[b] = 0;
    }
}

/* Bucket b's gradients are final: the TP sums of its replicated parts (tpd_model_tp_reduce_grads),
 * then its DP reduction. */
static tpd_status start_bucket(tpd_grad_sync *gs, int b) {
    size_t b0, len;
    tpd_dp_bucket(gs->dpp, b, &b0, &len);
    gs->started[b] = 1;
    TPD_CHECK(tpd_model_tp_reduce_grads(gs->m, b0, b0 + len));
    int skip; /* test-only (base/fault.h): a bucket whose reduction is lost */
    if (tpd_fault("skip-dp-bucket", 0, &skip) && skip == b) return TPD_OK;
    tpd_comm *edp = gs->edp; /* test-only: the experts' copies never summed */
    if (tpd_fault("ep-skip-expert-reduce", 0, &skip)) edp = NULL;
    return tpd_dp_reduce_bucket_ep(gs->dpp, gs->dp, edp, b, gs->m->grads,
                                   tpd_kern_grad_dtype(gs->m->kb), tpd_kern_stream(gs->m->kb),
                                   &gs->greq[b], &gs->ereq[b]);
}

static tpd_status mark_final(tpd_grad_sync *gs, int unit) {
    int i = unit + 1;
    if (i < 0 || i >= gs->nunits || gs->final_[i]) return TPD_OK;
    gs->final_[i] = 1;
    for (int b = gs->dpp->nbuckets - 1; b >= 0; b--)
        if (overlaps(gs, i, b) && --gs->pending[b] == 0) TPD_CHECK(start_bucket(gs, b));
    /* a stage without the head: its last unit holds only padding, final with the last
     * layer */
    if (unit == gs->m->d.Ls - 1 && !gs->m->d.last) TPD_CHECK(mark_final(gs, gs->m->d.Ls));
    return TPD_OK;
}

tpd_status tpd_grad_sync_unit_final(tpd_grad_sync *gs, int unit) {
    /* the embedding's buckets wait for the tied-embedding sum after the pipeline */
    if (!gs->overlap_grad || unit == TPD_MODEL_UNIT_EMBED) return TPD_OK;
    return mark_final(gs, unit);
}

tpd_status tpd_grad_sync_event(tpd_grad_sync *gs, int unit, int event, int final_mb) {
    if (gs->sh) return tpd_grad_shard_event(gs->sh, unit, event);
    if (event == TPD_HOOK_FWD) return tpd_grad_sync_params_ready(gs, unit);
    if (event != TPD_HOOK_GRAD_DONE) return TPD_OK;
    if (event == TPD_HOOK_GRAD_DONE && final_mb) TPD_CHECK(tpd_grad_sync_unit_final(gs, unit));
    return tpd_grad_sync_poll(gs);
}

tpd_status tpd_grad_sync_poll(tpd_grad_sync *gs) {
    if (gs->sh) return tpd_grad_shard_poll(gs->sh);
    for (int b = 0; b < gs->dpp->nbuckets; b++) {
        int done;
        if (gs->greq[b]) TPD_CHECK(tpd_comm_test(gs->dp, gs->greq[b], &done));
        if (gs->ereq[b]) TPD_CHECK(tpd_comm_test(gs->edp, gs->ereq[b], &done));
        if (gs->preq[b]) TPD_CHECK(tpd_comm_test(gather_comm(gs, b), gs->preq[b], &done));
    }
    return TPD_OK;
}

tpd_status tpd_grad_sync_finish(tpd_grad_sync *gs) {
    tpd_model *m = gs->m;
    double t0 = tpd_clock_s();
    if (gs->sh) {
        TPD_CHECK(tpd_grad_shard_finish(gs->sh));
        (void)tpd_grad_shard_take_exposed(gs->sh);
        gs->exposed += tpd_clock_s() - t0;
        return TPD_OK;
    }
    const tpd_param_slice *wte = &m->plan.lay.p[TPD_P_WTE];
    /* The head on the last stage and the embedding on the first share wte: their gradients
     * are summed so both copies take the same update and stay identical. */
    if (gs->emb && tpd_comm_size(gs->emb) > 1 && wte->present && m->d.tied)
        TPD_CHECK(tpd_comm_allreduce(
            gs->emb, tpd_model_grad(m, TPD_P_WTE), tpd_model_grad(m, TPD_P_WTE), wte->numel,
            tpd_kern_grad_dtype(m->kb), TPD_COMM_OP_SUM, tpd_kern_stream(m->kb)));
    /* whatever the backward has not started, from the top of the buffer down */
    for (int u = m->d.Ls; u >= TPD_MODEL_UNIT_EMBED; u--)
        TPD_CHECK(mark_final(gs, u));
    for (int b = gs->dpp->nbuckets - 1; b >= 0; b--) {
        TPD_CHECK(wait_req(gs, &gs->greq[b], 0));
        TPD_CHECK(wait_on(gs, gs->edp, &gs->ereq[b], 0));
    }
    gs->exposed += tpd_clock_s() - t0; /* all of it runs after the pipeline */
    return TPD_OK;
}

tpd_status tpd_grad_sync_gather_params(tpd_grad_sync *gs) {
    tpd_model *m = gs->m;
    if (gs->sh) return tpd_grad_shard_after_update(gs->sh);
    for (int b = 0; b < gs->dpp->nbuckets; b++) /* EP: an expert bucket over expert DP */
        TPD_CHECK(tpd_dp_gather_bucket(gs->dpp, gather_comm(gs, b), b, m->params,
                                       tpd_kern_param_dtype(m->kb), tpd_kern_stream(m->kb),
                                       &gs->preq[b]));
    return gs->overlap_param ? TPD_OK : tpd_grad_sync_params_all(gs);
}

tpd_status tpd_grad_sync_params_ready(tpd_grad_sync *gs, int unit) {
    int i = unit + 1;
    if (i < 0 || i >= gs->nunits) return TPD_OK;
    /* EP: every layer reads its experts from their own region (with the embedding's unit
     * here), so a layer's first use waits for the expert buckets too: on a stage without
     * the embedding nothing else would */
    int layer = unit >= 0 && unit < gs->m->d.Ls;
    for (int b = 0; b < gs->dpp->nbuckets; b++)
        if (gs->preq[b] && (overlaps(gs, i, b) || (layer && b < gs->dpp->ebuckets)))
            TPD_CHECK(wait_gather(gs, b, 1));
    return tpd_grad_sync_poll(gs);
}

tpd_status tpd_grad_sync_params_all(tpd_grad_sync *gs) {
    for (int b = 0; b < gs->dpp->nbuckets; b++)
        TPD_CHECK(wait_gather(gs, b, 1));
    return TPD_OK;
}

tpd_status tpd_grad_sync_params_f32(tpd_grad_sync *gs, float *out) {
    if (gs->sh) return tpd_grad_shard_params_f32(gs->sh, out);
    TPD_CHECK(tpd_grad_sync_params_all(gs));
    return tpd_model_params_f32(gs->m, out);
}

double tpd_grad_sync_take_exposed(tpd_grad_sync *gs) {
    if (gs->sh) gs->exposed += tpd_grad_shard_take_exposed(gs->sh);
    double e = gs->exposed;
    gs->exposed = 0;
    return e;
}
