#include "engine/optim/diloco.h"

#include <stdlib.h>

#include "base/clock.h"

struct tpd_diloco {
    tpd_model *m;
    const tpd_dp_plan *dpp;
    tpd_comm *outer; /* NULL: one replica */
    int replicas;
    size_t frag_numel;  /* state elements of one fragment (the last one may be shorter) */
    tpd_dtype wire;     /* diloco.reduce_dtype */
    float lr, momentum; /* diloco.outer_lr, outer_momentum */
    /* the all-reduce in flight */
    int flight; /* its fragment, -1: none */
    tpd_comm_req *req;
};

/* Fragment f's state elements [f * frag_numel, ...) of the owned shard. */
static void fragment_span(const tpd_diloco *d, int f, size_t *b_p, size_t *e_p) {
    size_t shard = d->m->plan.shard_numel;
    size_t b = (size_t)f * d->frag_numel, e = b + d->frag_numel;
    *b_p = b < shard ? b : shard;
    *e_p = e < shard ? e : shard;
}

/* Calls fn for each piece of fragment f: an owned range's intersection with the
 * fragment's state span, as (flat begin, state begin, count). */
typedef tpd_status (*piece_fn)(tpd_diloco *d, size_t flat, size_t state, size_t n, size_t f0);

static tpd_status for_each_piece(tpd_diloco *d, int f, piece_fn fn) {
    size_t f0, f1;
    fragment_span(d, f, &f0, &f1);
    for (int r = 0; r < d->dpp->nranges; r++) {
        const tpd_dp_range *rg = &d->dpp->ranges[r];
        size_t s0 = rg->state, s1 = rg->state + (rg->end - rg->begin);
        size_t b = s0 > f0 ? s0 : f0, e = s1 < f1 ? s1 : f1;
        if (b >= e) continue;
        TPD_CHECK(fn(d, rg->begin + (b - s0), b, e - b, f0));
    }
    return TPD_OK;
}

/* The weights the pseudo-gradient is taken of: fp32 masters where kept, else the fp32
 * parameters themselves (a bf16 parameter always has a master). */
static tpd_status take_delta(tpd_diloco *d, size_t flat, size_t state, size_t n, size_t f0) {
    tpd_model *m = d->m;
    const float *w =
        m->master ? m->master + state : (const float *)tpd_model_owned_param(m, flat, state);
    return tpd_kern_outer_delta(m->kb, m->outer_delta + (state - f0), m->outer_sync + state, w, n);
}

static tpd_status apply_piece(tpd_diloco *d, size_t flat, size_t state, size_t n, size_t f0) {
    tpd_model *m = d->m;
    return tpd_kern_outer_nesterov(m->kb, tpd_model_owned_param(m, flat, state),
                                   m->master ? m->master + state : NULL, m->outer_sync + state,
                                   m->outer_mom + state, m->outer_delta + (state - f0), n, d->lr,
                                   d->momentum, 1.0f / (float)d->replicas);
}

tpd_status tpd_diloco_create(tpd_model *m, const tpd_dp_plan *dpp, const tpd_config *cfg,
                             tpd_comm *outer, tpd_diloco **d_p) {
    if (!m->outer_sync || !m->outer_mom || !m->outer_delta)
        return tpd_fail(TPD_ERR_INTERNAL,
                        "diloco: the model has no outer state (parallel.dp_sync is not diloco)");
    tpd_diloco *d = calloc(1, sizeof *d);
    if (!d) return tpd_fail_nomem("DiLoCo's outer step", sizeof *d);
    d->m = m;
    d->dpp = dpp;
    d->outer = outer && tpd_comm_size(outer) > 1 ? outer : NULL;
    d->replicas = d->outer ? tpd_comm_size(outer) : 1;
    d->frag_numel = tpd_diloco_fragment_numel(m->plan.shard_numel, cfg->diloco.fragments);
    d->wire = cfg->diloco.reduce_dtype == TPD_REDUCE_BF16 ? TPD_DTYPE_BF16 : TPD_DTYPE_F32;
    d->lr = (float)cfg->diloco.outer_lr;
    d->momentum = (float)cfg->diloco.outer_momentum;
    d->flight = -1;
    *d_p = d;
    return TPD_OK;
}

static tpd_status wait_flight(tpd_diloco *d, double *wait_s) {
    double t0 = tpd_clock_s();
    tpd_comm_req *req = d->req;
    d->req = NULL;
    tpd_status st = d->outer ? tpd_comm_wait(d->outer, req) : TPD_OK;
    if (wait_s) *wait_s += tpd_clock_s() - t0;
    return st;
}

tpd_status tpd_diloco_destroy(tpd_diloco *d) {
    if (!d) return TPD_OK;
    tpd_status st = wait_flight(d, NULL);
    free(d);
    return st;
}

static tpd_status start(tpd_diloco *d, int f, tpd_diloco_stats *s) {
    size_t f0, f1;
    fragment_span(d, f, &f0, &f1);
    TPD_CHECK(for_each_piece(d, f, take_delta));
    d->flight = f;
    s->started = f;
    s->bytes_sent = tpd_diloco_fragment_bytes(d, f);
    if (!d->outer || f1 == f0) return TPD_OK;
    void *stream = tpd_kern_stream(d->m->kb);
    float *x = d->m->outer_delta;
    if (d->wire != TPD_DTYPE_F32)
        return tpd_comm_iallreduce_wire(d->outer, x, x, f1 - f0, TPD_DTYPE_F32, d->wire,
                                        TPD_COMM_OP_SUM, stream, &d->req);
    return tpd_comm_iallreduce(d->outer, x, x, f1 - f0, TPD_DTYPE_F32, TPD_COMM_OP_SUM, stream,
                               &d->req);
}

static tpd_status apply(tpd_diloco *d, tpd_diloco_stats *s) {
    TPD_CHECK(wait_flight(d, &s->wait_s));
    TPD_CHECK(for_each_piece(d, d->flight, apply_piece));
    s->applied = d->flight;
    d->flight = -1;
    return TPD_OK;
}

tpd_status tpd_diloco_after_step(tpd_diloco *d, int completed, tpd_diloco_stats *s) {
    const tpd_config *cfg = &d->m->cfg;
    *s = (tpd_diloco_stats){.started = -1, .applied = -1};
    /* the schedule says what stays in flight after this step: a fragment it no longer
     * names is applied now (its overlap window ended, or the run did) */
    if (d->flight >= 0 && tpd_diloco_pending_fragment(cfg, completed) != d->flight)
        TPD_CHECK(apply(d, s));
    int f = tpd_diloco_sync_fragment(cfg, completed);
    if (f < 0) return TPD_OK;
    if (d->flight >= 0)
        return tpd_fail(TPD_ERR_INTERNAL,
                        "diloco: fragment %d starts after step %d while fragment %d is still in "
                        "flight",
                        f, completed, d->flight);
    TPD_CHECK(start(d, f, s));
    if (tpd_diloco_pending_fragment(cfg, completed) != f) TPD_CHECK(apply(d, s));
    return TPD_OK;
}

tpd_status tpd_diloco_poll(tpd_diloco *d) {
    int done = 0;
    if (!d || !d->req || !d->outer) return TPD_OK;
    return tpd_comm_test(d->outer, d->req, &done);
}

int tpd_diloco_in_flight(const tpd_diloco *d) {
    return d ? d->flight : -1;
}

double tpd_diloco_fragment_bytes(const tpd_diloco *d, int f) {
    if (!d->outer) return 0.0;
    size_t f0, f1;
    fragment_span(d, f, &f0, &f1);
    double R = d->replicas;
    return 2.0 * (R - 1.0) / R * (double)(f1 - f0) * (double)tpd_dtype_size(d->wire);
}
