/* `tripod verify --device cuda`: the shrunken layout trained on the cuda backend with its
 * bf16 recipe and on the cpu backend in fp32, in one job from the same weights and tokens,
 * and held to the bf16 budget (verify_budget.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "engine/verify/verify_internal.h"

/* The device run's config: the rehearsal's on the cuda backend in bf16 (the recipe `train`
 * runs there: fp32 masters, the config's main-gradient dtype and attention path), or the
 * cpu in fp32 standing in for it (TPD_VERIFY_DEVICE_ENV). */
static tpd_config device_config(const tpd_config *small, int stand_in) {
    tpd_config c = *small;
    c.training.device = stand_in ? TPD_DEVICE_CPU : TPD_DEVICE_CUDA;
    c.training.precision = stand_in ? TPD_PRECISION_FP32 : TPD_PRECISION_BF16;
    return c;
}

static void skip(tpd_verify_report *rep, const char *name, const char *why) {
    tpd_verify_check *c = tpd_verify_add(rep, name, 0);
    if (!c) return;
    c->verdict = TPD_VERIFY_SKIP;
    snprintf(c->detail, sizeof c->detail, "not run: %s", why);
}

tpd_status tpd_verify_rehearse_device(tpd_comm *world, tpd_verify_report *rep) {
    int me = tpd_comm_rank(world), K = rep->steps;
    const tpd_config *small = &rep->small;
    tpd_verify_job ref, dev;
    memset(&ref, 0, sizeof ref);
    memset(&dev, 0, sizeof dev);
    ref.cfg = *small;
    ref.ranks = rep->ranks;
    ref.steps = K;
    ref.masters = 1;
    dev.cfg = device_config(small, rep->device_stand_in);
    dev.ranks = rep->ranks;
    dev.steps = K;
    dev.masters = 1;
    dev.check_layout = 1;
    dev.no_memory = 1;
    tpd_verify_budget_in in;
    tpd_verify_budget_shape(&dev.cfg, K, rep->dp, &in);
    tpd_verify_budget_compute(&in, &rep->budget);

    /* the reference first, with no planted fault: it is the truth the device is held to */
    char fault[256] = "";
    const char *f = getenv(TPD_FAULT_ENV);
    if (f) {
        snprintf(fault, sizeof fault, "%s", f);
        unsetenv(TPD_FAULT_ENV);
    }
    tpd_status st = tpd_verify_job_run(&ref, world, rep);
    if (fault[0]) setenv(TPD_FAULT_ENV, fault, 1);
    if (st == TPD_OK) st = tpd_verify_job_run(&dev, world, rep);

    const char *name_init = "cuda: initial weights", *name_loss = "cuda: loss",
               *name_norm = "cuda: grad norm", *name_params = "cuda: params";
    if (st == TPD_OK && me == 0 && !dev.structure_ok) {
        skip(rep, name_init, "the structure check failed");
        skip(rep, name_loss, "the structure check failed");
        skip(rep, name_norm, "the structure check failed");
        skip(rep, name_params, "the structure check failed");
    } else if (st == TPD_OK && me == 0) {
        const tpd_verify_budget *b = &rep->budget;
        /* both runs start from the counter-based initialization: the same bits */
        tpd_verify_check *c = tpd_verify_add(rep, name_init, 0);
        tpd_verify_cmp_params(c, small, dev.initial, ref.initial, "before the first step");
        if (c && c->verdict == TPD_VERIFY_PASS)
            snprintf(c->detail, sizeof c->detail,
                     "the device's fp32 master weights before step 1 bit-identical to the cpu's");
        c = tpd_verify_add(rep, name_loss, tpd_verify_budget_loss(b, K));
        tpd_verify_cmp_budget(c, "loss", dev.loss, ref.loss, K, b, tpd_verify_budget_loss);
        c = tpd_verify_add(rep, name_norm, tpd_verify_budget_norm(b, K));
        tpd_verify_cmp_budget(c, "grad norm", dev.norm, ref.norm, K, b, tpd_verify_budget_norm);
        c = tpd_verify_add(rep, name_params, b->params);
        char when[64];
        snprintf(when, sizeof when, "after step %d", K);
        tpd_verify_cmp_moved(c, small, dev.at_save, ref.at_save, ref.initial, when);
        if (dev.tied_differ)
            tpd_verify_fail(c,
                            "the tied embedding's copies on stage 0 and stage %d differ in %d "
                            "elements after step %d",
                            small->parallel.pipeline_model_parallel_size - 1, (int)dev.tied_differ,
                            K);
        if (c && c->verdict == TPD_VERIFY_PASS)
            snprintf(c->detail, sizeof c->detail,
                     "every tensor of every layer after step %d (the fp32 master weights): "
                     "||w_cuda - w_cpu|| / ||w_cpu - w_0||%s%s",
                     K,
                     small->model.untie_embeddings_and_output_weights ||
                             small->parallel.pipeline_model_parallel_size == 1
                         ? ""
                         : "; both copies of the tied embedding bit-identical",
                     b->params >= 1 ? "; a budget of 1 or more cannot tell a tensor that did "
                                      "not move (fewer --steps or layers make it smaller)"
                                    : "");
    }
    tpd_verify_job_free(&ref);
    tpd_verify_job_free(&dev);
    return st;
}
