/* The one-rank reference of DiLoCo (verify.h): one single-rank trainer per replica and the
 * outer Nesterov step written out on their weights, apart from the trainer's own outer
 * step (engine/optim/diloco.c: kernels and a communicator). */
#include <stdlib.h>
#include <string.h>

#include "engine/verify/verify_internal.h"

typedef struct outer_ref {
    int R, overlap;
    float lr, mu;
    size_t numel, frag;        /* flat elements; elements of one fragment */
    float *sync, *mom, *delta; /* (numel) */
    tpd_trainer **tr;          /* (R) */
    int flight, started;       /* the fragment in flight and its step; -1: none */
} outer_ref;

static float *weights(const outer_ref *o, int k) {
    return tpd_trainer_model(o->tr[k])->params; /* fp32 on the cpu backend */
}

static void span(const outer_ref *o, int f, size_t *b, size_t *e) {
    *b = (size_t)f * o->frag < o->numel ? (size_t)f * o->frag : o->numel;
    *e = *b + o->frag < o->numel ? *b + o->frag : o->numel;
}

/* mom = mu mom + d; sync -= lr (d + mu mom) with d the replicas' mean pseudo-gradient;
 * every replica continues from sync */
static void apply(outer_ref *o) {
    size_t b, e;
    span(o, o->flight, &b, &e);
    for (size_t i = b; i < e; i++) {
        float d = o->delta[i] * (1.0f / (float)o->R);
        o->mom[i] = o->mu * o->mom[i] + d;
        o->sync[i] -= o->lr * (d + o->mu * o->mom[i]);
        for (int k = 0; k < o->R; k++) {
            tpd_model *m = tpd_trainer_model(o->tr[k]);
            weights(o, k)[i] = o->sync[i];
            if (m->master) m->master[i] = o->sync[i];
        }
    }
    o->flight = -1;
}

static void after_step(outer_ref *o, const tpd_config *cfg, int c, int last) {
    if (o->flight >= 0 && (c >= o->started + o->overlap || last)) apply(o);
    int f = tpd_diloco_sync_fragment(cfg, c);
    if (f < 0) return;
    size_t b, e;
    span(o, f, &b, &e);
    for (size_t i = b; i < e; i++) {
        float sum = 0;
        for (int k = 0; k < o->R; k++)
            sum += o->sync[i] - weights(o, k)[i];
        o->delta[i] = sum;
    }
    o->flight = f;
    o->started = c;
    if (o->overlap == 0 || last) apply(o);
}

int tpd_verify_diloco_has_reference(const tpd_config *cfg, int dp) {
    return cfg->diloco.fragments <= 1 ||
           (cfg->parallel.tensor_model_parallel_size == 1 &&
            cfg->parallel.pipeline_model_parallel_size == 1 &&
            !(cfg->parallel.use_distributed_optimizer && tpd_config_dp_inner(cfg, dp) > 1));
}

tpd_status tpd_verify_diloco_reference(const tpd_config *cfg, int dp, int steps, tpd_comm *one,
                                       double *loss, double *norm, float *params[TPD_P_COUNT]) {
    int R = tpd_config_dp_replicas(cfg, dp), inner = tpd_config_dp_inner(cfg, dp);
    int GB = cfg->training.global_batch_size;
    if (!tpd_verify_diloco_has_reference(cfg, dp))
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "verify: a one-rank reference of %d DiLoCo fragments exists only at TP = "
                        "PP = 1 without ZeRO-1 (fragments are spans of each rank's own shard)",
                        cfg->diloco.fragments);
    if (R < 1 || GB % R)
        return tpd_fail(TPD_ERR_INVALID,
                        "verify: %d DiLoCo replicas do not split the global batch of %d", R, GB);
    /* one replica on one rank: every-step, its share of the global batch */
    const tpd_config_layout lay1 = TPD_CONFIG_LAYOUT_INIT;
    tpd_config c1;
    tpd_config_relayout(cfg, &lay1, &c1);
    c1.parallel.dp_sync = TPD_DP_SYNC_EVERY_STEP;
    c1.parallel.data_parallel_size = 1;
    c1.training.global_batch_size = GB / R;
    c1.checkpoint.save[0] = c1.checkpoint.load[0] = 0;
    c1.logging.metrics_file[0] = c1.logging.tensorboard_dir[0] = c1.logging.trace_file[0] = 0;
    outer_ref o;
    memset(&o, 0, sizeof o);
    o.R = R;
    o.overlap = cfg->diloco.overlap_steps;
    o.lr = (float)cfg->diloco.outer_lr;
    o.mu = (float)cfg->diloco.outer_momentum;
    o.flight = -1;
    tpd_status st = TPD_OK;
    o.tr = calloc((size_t)R, sizeof *o.tr);
    if (!o.tr) return tpd_fail_nomem("the reference's trainers", (size_t)R * sizeof *o.tr);
    for (int k = 0; k < R && st == TPD_OK; k++) {
        st = tpd_trainer_create(&c1, one, &o.tr[k]);
        if (st == TPD_OK)
            tpd_trainer_set_samples(o.tr[k], (uint64_t)GB, (uint64_t)k * (uint64_t)(GB / R));
    }
    if (st == TPD_OK) {
        const tpd_model *m0 = tpd_trainer_model(o.tr[0]);
        o.numel = m0->plan.lay.numel;
        /* the parallel run's shard: the flat buffer padded to its inner DP */
        o.frag =
            tpd_diloco_fragment_numel(tpd_dp_padded_numel(o.numel, inner), cfg->diloco.fragments);
        o.sync = malloc(o.numel * sizeof *o.sync);
        o.mom = calloc(o.numel, sizeof *o.mom);
        o.delta = calloc(o.numel, sizeof *o.delta);
        if (!o.sync || !o.mom || !o.delta)
            st = tpd_fail_nomem("the reference's outer state", 3 * o.numel * sizeof(float));
        else
            memcpy(o.sync, m0->params, o.numel * sizeof *o.sync);
    }
    for (int c = 1; c <= steps && st == TPD_OK; c++) {
        double sum = 0;
        for (int k = 0; k < R && st == TPD_OK; k++) {
            tpd_step_stats s;
            st = tpd_trainer_step(o.tr[k], &s);
            sum += s.lm_loss;
            if (k == 0) norm[c - 1] = s.grad_norm;
        }
        loss[c - 1] = (double)(float)(sum / R);
        if (st == TPD_OK) after_step(&o, cfg, c, c == cfg->training.train_iters);
    }
    if (st == TPD_OK) st = tpd_verify_gather_params(o.tr[0], 1, params);
    for (int k = 0; k < R; k++)
        tpd_trainer_destroy(o.tr[k]);
    free(o.tr);
    free(o.sync);
    free(o.mom);
    free(o.delta);
    return st;
}
