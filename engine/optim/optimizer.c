#include "engine/optim/optimizer.h"

#include <math.h>

/* Calls fn for every intersection of an owned range with a parameter tensor. */
typedef tpd_status (*range_fn)(tpd_model *m, tpd_param p, size_t begin, size_t end, size_t state,
                               void *arg);

static tpd_status for_each_owned(tpd_model *m, const tpd_dp_plan *dpp, range_fn fn, void *arg) {
    const tpd_model_layout *lay = &m->plan.lay;
    for (int r = 0; r < dpp->nranges; r++) {
        const tpd_dp_range *rg = &dpp->ranges[r];
        for (int p = 0; p < TPD_P_COUNT; p++) {
            const tpd_param_slice *s = &lay->p[p];
            if (!s->present) continue;
            size_t piece = (size_t)s->rows * (size_t)s->cols;
            for (int l = 0; l < s->layers; l++) { /* the layer-major buffer's pieces */
                size_t s0 = tpd_model_layout_piece(lay, (tpd_param)p, l), s1 = s0 + piece;
                size_t b = s0 > rg->begin ? s0 : rg->begin;
                size_t e = s1 < rg->end ? s1 : rg->end;
                if (b >= e) continue;
                TPD_CHECK(fn(m, (tpd_param)p, b, e, rg->state + (b - rg->begin), arg));
            }
        }
    }
    return TPD_OK;
}

/* Adds a slice's sum of squares to the backend's accumulator: nothing waits per slice.
 * argp: 1 for the weights (fp32 masters where kept), 0 for the gradients. */
typedef struct sumsq_arg {
    int params;  /* 1: the weights; 0: the gradients */
    int experts; /* -1 every tensor; 1 only the experts' (EP); 0 all but them */
} sumsq_arg;

static tpd_status add_sumsq(tpd_model *m, tpd_param p, size_t b, size_t e, size_t state,
                            void *argp) {
    const sumsq_arg *a = argp;
    int params = a->params;
    if (!m->plan.lay.p[p].tp_counted) return TPD_OK;
    if (a->experts >= 0 && tpd_param_is_expert(p) != a->experts) return TPD_OK;
    if (params && m->master)
        return tpd_kern_sumsq_acc(m->kb, m->master + state, TPD_DTYPE_F32, e - b);
    if (params)
        return tpd_kern_sumsq_acc(m->kb, tpd_model_owned_param(m, b, state),
                                  tpd_kern_param_dtype(m->kb), e - b);
    return tpd_kern_sumsq_acc(m->kb, tpd_model_owned_grad(m, b, state), tpd_kern_grad_dtype(m->kb),
                              e - b);
}

/* The global norm of the gradients or the weights: every parameter once (TP-replicated
 * ones and the tied embedding counted on one rank). */
static tpd_status global_norm(tpd_model *m, const tpd_dp_plan *dpp, const tpd_mesh_comms *comms,
                              int params, double *norm_p) {
    double sum = 0;
    /* EP: each rank of an EP group holds other experts, so their part is summed over it
     * first */
    sumsq_arg a = {params, comms->ep && !dpp->zero ? 0 : -1}; /* ZeRO: every part once */
    tpd_status st = for_each_owned(m, dpp, add_sumsq, &a);
    /* one wait for all the slices; the accumulator is left empty whatever happened */
    tpd_status st2 = tpd_kern_sumsq_take(m->kb, &sum);
    TPD_CHECK(st);
    TPD_CHECK(st2);
    if (a.experts == 0) {
        double ex = 0;
        a.experts = 1;
        st = for_each_owned(m, dpp, add_sumsq, &a);
        st2 = tpd_kern_sumsq_take(m->kb, &ex);
        TPD_CHECK(st);
        TPD_CHECK(st2);
        TPD_CHECK(tpd_comm_allreduce(comms->ep, &ex, &ex, 1, TPD_DTYPE_F64, TPD_COMM_OP_SUM, NULL));
        sum += ex;
    }
    /* Without ZeRO every DP replica holds the same reduced gradients: sum over the
     * model-parallel group only. With ZeRO each DP rank owns a disjoint shard: sum over
     * the world. The partial sums stay in double on the wire too. */
    tpd_comm *c = dpp->zero ? comms->world : comms->mp;
    /* DiLoCo: a replica's own norm, its ZeRO shards summed over its inner DP group first;
     * HSDP: over the shard group (the groups hold the same shards) */
    if (dpp->zero && (comms->dp_outer || comms->dp_shard)) {
        tpd_comm *g = comms->dp_shard ? comms->dp_shard : comms->dp;
        TPD_CHECK(tpd_comm_allreduce(g, &sum, &sum, 1, TPD_DTYPE_F64, TPD_COMM_OP_SUM, NULL));
        c = comms->mp;
    }
    if (tpd_comm_size(c) > 1)
        TPD_CHECK(tpd_comm_allreduce(c, &sum, &sum, 1, TPD_DTYPE_F64, TPD_COMM_OP_SUM, NULL));
    *norm_p = sqrt(sum);
    return TPD_OK;
}

tpd_status tpd_optim_grad_norm(tpd_model *m, const tpd_dp_plan *dpp, const tpd_mesh_comms *comms,
                               double *norm_p) {
    return global_norm(m, dpp, comms, 0, norm_p);
}

tpd_status tpd_optim_params_norm(tpd_model *m, const tpd_dp_plan *dpp, const tpd_mesh_comms *comms,
                                 double *norm_p) {
    return global_norm(m, dpp, comms, 1, norm_p);
}

typedef struct adamw_arg {
    double lr, grad_scale;
    int step;
} adamw_arg;

static tpd_status apply_update(tpd_model *m, tpd_param p, size_t b, size_t e, size_t state,
                               void *argp) {
    const adamw_arg *a = argp;
    const tpd_config_optimizer *o = &m->cfg.optimizer;
    double wd = tpd_param_get_info(p)->is_matrix ? o->weight_decay : 0.0;
    if (o->type == TPD_OPTIM_SGD)
        return tpd_kern_sgd(m->kb, tpd_model_owned_param(m, b, state),
                            m->master ? m->master + state : NULL, tpd_model_owned_grad(m, b, state),
                            e - b, (float)a->lr, (float)wd, (float)a->grad_scale);
    return tpd_kern_adamw(m->kb, tpd_model_owned_param(m, b, state),
                          m->master ? m->master + state : NULL, tpd_model_owned_grad(m, b, state),
                          m->opt_m + state, m->opt_v + state, e - b, (float)a->lr,
                          (float)o->adam_beta1, (float)o->adam_beta2, (float)o->adam_eps, (float)wd,
                          a->step, (float)a->grad_scale);
}

tpd_status tpd_optim_update(tpd_model *m, const tpd_dp_plan *dpp, double lr, double grad_scale,
                            int step) {
    adamw_arg a = {lr, grad_scale, step};
    return for_each_owned(m, dpp, apply_update, &a);
}
