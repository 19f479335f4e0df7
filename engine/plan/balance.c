/* Pipeline stages split by predicted time rather than by layer count.
 *
 * A stage's forward + backward time per micro-batch is affine in its layer count:
 * t_s(n) = n * tau_s + e_s, where e_s is the embedding on the first stage and the final
 * LayerNorm, head and loss on the last (both read off tpd_plan_stage_time at one and two
 * layers per stage). Giving each next layer to the stage whose time grows least minimizes
 * the slowest stage, which paces 1F1B. With v model chunks a stage's layers are spread over
 * its chunks, and parallel.pipeline_layers lists every virtual stage. With a large vocabulary the
 * last stage is worth a layer or more: BLOOM-176B put 5 layers on its end stages and 6 on the
 * others by hand; Megatron leaves the split to the user. */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tau[s] and e[s] of every stage of lay: its time with n layers is n*tau + e. The probe
 * configs list every virtual stage with 1, then 2 layers. */
static void stage_costs(const tpd_config *cfg, const tpd_plan_cluster *cl,
                        const tpd_plan_layout *lay, double *tau, double *e) {
    tpd_config c = *cfg;
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    c.parallel.num_pipeline_layers = lay->pp * v;
    double t1[TPD_CONFIG_MAX_STAGES];
    for (int n = 1; n <= 2; n++) {
        for (int i = 0; i < lay->pp * v; i++)
            c.parallel.pipeline_layers[i] = n;
        for (int s = 0; s < lay->pp; s++) {
            double f, b, comm;
            tpd_plan_stage_time(&c, cl, lay, s, &f, &b, &comm);
            if (n == 1) {
                t1[s] = f + b;
            } else {
                tau[s] = (f + b - t1[s]) / v;
                e[s] = t1[s] - v * tau[s];
            }
        }
    }
}

static double slowest(const double *tau, const double *e, const int *n, int pp) {
    double worst = 0;
    for (int s = 0; s < pp; s++) {
        double t = n[s] * tau[s] + e[s];
        if (t > worst) worst = t;
    }
    return worst;
}

/* The chunks of a stage share its n layers as evenly as they can; an extra layer goes
 * where the stage's ends are not: past the embedding's chunk 0 on the first stage, before
 * the head's last chunk on the last (the middle stages: from chunk 0). */
static void spread_chunks(int pp, int v, const int *stage_layers, int *chunk_layers) {
    for (int s = 0; s < pp; s++) {
        int base = stage_layers[s] / v, extra = stage_layers[s] % v;
        for (int c = 0; c < v; c++) {
            int rank = s == 0 && pp > 1 ? v - 1 - c : c; /* order that takes the extras */
            chunk_layers[c * pp + s] = base + (rank < extra);
        }
    }
}

/* 1 with layers[] (per stage) and chunks[] (per virtual stage) when the time-balanced split
 * of lay is faster than the default one. */
static int balanced_split(const tpd_config *cfg, const tpd_plan_cluster *cl,
                          const tpd_plan_layout *lay, int *layers, int *chunks) {
    int pp = lay->pp, L = cfg->model.num_layers;
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    /* a split the config lists for this pipeline is never changed (one for another PP, or
     * another v, does not apply to this layout) */
    if (pp < 2 || (long)pp * v > TPD_CONFIG_MAX_STAGES || L < pp * v ||
        cfg->parallel.num_pipeline_layers == pp * v)
        return 0;
    double tau[TPD_CONFIG_MAX_STAGES], e[TPD_CONFIG_MAX_STAGES];
    stage_costs(cfg, cl, lay, tau, e);
    int dflt[TPD_CONFIG_MAX_STAGES];
    for (int s = 0; s < pp; s++) {
        dflt[s] = tpd_plan_stage_layers(cfg, lay, s);
        layers[s] = v; /* every chunk needs a layer */
    }
    for (int left = L - pp * v; left > 0; left--) {
        int best = 0;
        for (int s = 1; s < pp; s++)
            if ((layers[s] + 1) * tau[s] + e[s] < (layers[best] + 1) * tau[best] + e[best])
                best = s;
        layers[best]++;
    }
    spread_chunks(pp, v, layers, chunks);
    /* only a real gain: equal stages keep the default split's order of extras */
    return slowest(tau, e, layers, pp) < slowest(tau, e, dflt, pp) * (1.0 - 1e-9) &&
           memcmp(layers, dflt, (size_t)pp * sizeof *layers) != 0;
}

const tpd_config *tpd_plan_result_config(const tpd_config *cfg, const tpd_plan_result *res,
                                         tpd_config *scratch) {
    if (!res->balanced && !res->recompute_layers) return cfg;
    *scratch = *cfg;
    if (res->balanced) {
        int n = res->layout.pp * (res->layout.virtual_stages > 0 ? res->layout.virtual_stages : 1);
        scratch->parallel.num_pipeline_layers = n;
        for (int i = 0; i < n; i++)
            scratch->parallel.pipeline_layers[i] = res->chunk_layers[i];
    }
    if (res->recompute_layers) scratch->training.recompute_num_layers = res->recompute_layers;
    return scratch;
}

tpd_status tpd_plan_fit_recompute_layers(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                         tpd_plan_result *res, tpd_config *scratch) {
    const tpd_plan_layout *lay = &res->layout;
    if (lay->recompute != TPD_RECOMPUTE_FULL || cfg->training.recompute_num_layers || !res->fits)
        return TPD_OK;
    /* recompute_num_layers counts the layers of each model chunk */
    int most = 0, v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    for (int i = 0; i < lay->pp * v && i < TPD_CONFIG_MAX_STAGES; i++)
        if (res->chunk_layers[i] > most) most = res->chunk_layers[i];
    tpd_plan_result *probe = malloc(sizeof *probe);
    if (!probe) {
        tpd_log_error("plan: out of memory");
        return TPD_ERR_NOMEM;
    }
    /* memory falls as n grows: the smallest n that fits, by bisection over [1, most) */
    int lo = 1, hi = most; /* hi fits (all layers) */
    tpd_status st = TPD_OK;
    while (lo < hi && st == TPD_OK) {
        int mid = lo + (hi - lo) / 2;
        *probe = *res;
        probe->recompute_layers = mid;
        st = tpd_plan_memory(tpd_plan_result_config(cfg, probe, scratch), cl, probe);
        if (probe->fits)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (st == TPD_OK && hi < most) {
        res->recompute_layers = hi;
        st = tpd_plan_memory(tpd_plan_result_config(cfg, res, scratch), cl, res);
    }
    free(probe);
    return st;
}

tpd_status tpd_plan_memory_split(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                 const tpd_plan_options *opt, tpd_plan_result *res,
                                 tpd_config *scratch, const tpd_config **cfg_p) {
    int layers[TPD_CONFIG_MAX_STAGES], chunks[TPD_CONFIG_MAX_STAGES];
    res->balanced = 0;
    if (opt->balance_stages && balanced_split(cfg, cl, &res->layout, layers, chunks)) {
        int v = res->layout.virtual_stages > 0 ? res->layout.virtual_stages : 1;
        for (int s = 0; s < res->layout.pp; s++)
            res->stage_layers[s] = layers[s];
        for (int i = 0; i < res->layout.pp * v; i++)
            res->chunk_layers[i] = chunks[i];
        res->balanced = 1;
        const tpd_config *c = tpd_plan_result_config(cfg, res, scratch);
        TPD_CHECK(tpd_plan_memory(c, cl, res));
        if (res->fits) {
            *cfg_p = c;
            return TPD_OK;
        }
        res->balanced = 0; /* the even split may still fit */
    }
    TPD_CHECK(tpd_plan_memory(cfg, cl, res));
    *cfg_p = cfg;
    return TPD_OK;
}

tpd_status tpd_plan_time_split(const tpd_config *cfg, const tpd_plan_cluster *cl,
                               const tpd_plan_options *opt, int split_bubble, tpd_plan_result *res,
                               tpd_config *scratch) {
    const tpd_config *c = tpd_plan_result_config(cfg, res, scratch);
    tpd_plan_heldout_band(cl, &res->heldout); /* the band the reports print beside the time */
    snprintf(res->framework, sizeof res->framework, "%s", cl->framework);
    TPD_CHECK(tpd_plan_time_evaluate(c, cl, opt, split_bubble, res));
    if (!res->balanced) return TPD_OK;
    /* the slowest stage is only a proxy for the step: keep the split the full model
     * prefers */
    tpd_plan_result *even = malloc(sizeof *even);
    if (!even) {
        tpd_log_error("plan: out of memory");
        return TPD_ERR_NOMEM;
    }
    *even = *res;
    even->balanced = 0;
    tpd_config even_cfg; /* the even split, with the result's recompute layers if any */
    const tpd_config *ec = tpd_plan_result_config(cfg, even, &even_cfg);
    tpd_status st = tpd_plan_memory(ec, cl, even);
    if (st == TPD_OK && even->fits) st = tpd_plan_time_evaluate(ec, cl, opt, split_bubble, even);
    if (st == TPD_OK && even->fits && even->step_time_s <= res->step_time_s) *res = *even;
    free(even);
    return st;
}
