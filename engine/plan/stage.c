/* A stage's cost whatever the backend: the backend's model (timing.c for cuda, timing_cpu.c
 * for the cpu), a stage that mixes dense and MoE layers as each kind's share, and the
 * per-chunk times the pipeline simulation and the report take from it. */
#include "engine/plan/plan_internal.h"

#include <stdlib.h>

void tpd_plan_stage_cost_kinds(const tpd_config *cfg, const tpd_plan_cluster *cl,
                               const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost_fn fn,
                               tpd_plan_stage_cost *out) {
    int Ls = tpd_plan_stage_layers(cfg, lay, stage),
        Lm = tpd_plan_stage_moe_layers(cfg, lay, stage);
    if (!tpd_config_moe(cfg) || Ls <= 0 || Lm == Ls) {
        fn(cfg, cl, lay, stage, out);
        return;
    }
    /* a stage with dense layers in a MoE model: its cost as if every layer were dense (the
     * model without experts) and as if every one were MoE, weighed by its layers of each kind;
     * the embedding's and the head's, the same in both, stay whole */
    tpd_config *dense = malloc(sizeof *dense);
    if (!dense) {
        fn(cfg, cl, lay, stage, out); /* the MoE price of every layer: an upper bound */
        return;
    }
    *dense = *cfg;
    dense->model.num_moe_experts = 0;
    tpd_plan_stage_cost a, b;
    fn(dense, cl, lay, stage, &b);
    free(dense);
    if (Lm == 0) {
        *out = b;
        return;
    }
    fn(cfg, cl, lay, stage, &a);
    double wm = (double)Lm / Ls, wd = 1.0 - wm;
#define TPD_MIX(f) out->f = wm * a.f + wd * b.f
    TPD_MIX(fwd);
    TPD_MIX(bwd);
    TPD_MIX(wgrad);
    TPD_MIX(tp_comm);
    TPD_MIX(tp_comm_hidden);
    TPD_MIX(cp_comm);
    TPD_MIX(cp_comm_hidden);
    TPD_MIX(ep_comm);
    TPD_MIX(embed_fwd);
    TPD_MIX(embed_bwd);
    TPD_MIX(head_fwd);
    TPD_MIX(head_bwd);
#undef TPD_MIX
}

void tpd_plan_stage_cost_of(const tpd_config *cfg, const tpd_plan_cluster *cl,
                            const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost *out) {
    if (cl->backend == TPD_PLAN_BACKEND_CPU)
        tpd_plan_cpu_stage_cost(cfg, cl, lay, stage, out);
    else
        tpd_plan_gpu_stage_cost(cfg, cl, lay, stage, out);
}

void tpd_plan_stage_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                         const tpd_plan_layout *lay, int stage, double *fwd_p, double *bwd_p,
                         double *tp_comm_p) {
    tpd_plan_stage_cost c;
    tpd_plan_stage_cost_of(cfg, cl, lay, stage, &c);
    *fwd_p = c.fwd;
    *bwd_p = c.bwd;
    *tp_comm_p = c.tp_comm;
}

double tpd_plan_stage_wgrad_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                 const tpd_plan_layout *lay, int stage) {
    tpd_plan_stage_cost c;
    tpd_plan_stage_cost_of(cfg, cl, lay, stage, &c);
    return c.wgrad;
}

void tpd_plan_sim_times(const tpd_plan_layout *lay, const tpd_plan_stage_cost *cost, double p2p,
                        tpd_pp_sim_times *times) {
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    int split = tpd_plan_layout_schedule(lay) == TPD_SCHEDULE_ZB_H1;
    for (int s = 0; s < lay->pp; s++)
        times[s] = (tpd_pp_sim_times){cost[s].fwd / v, cost[s].bwd / v,
                                      split ? cost[s].wgrad / v : 0.0, p2p};
}

void tpd_plan_set_times(const tpd_plan_layout *lay, const tpd_plan_stage_cost *cost, int slowest,
                        double p2p, tpd_plan_result *res) {
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    const tpd_plan_stage_cost *sc = &cost[slowest];
    res->t_fwd_chunk = sc->fwd / v;
    res->t_bwd_chunk = sc->bwd / v;
    res->t_wgrad_chunk = tpd_plan_layout_schedule(lay) == TPD_SCHEDULE_ZB_H1 ? sc->wgrad / v : 0.0;
    res->t_p2p = p2p;
    tpd_plan_sim_times(lay, cost, p2p, res->stage_times);
}
