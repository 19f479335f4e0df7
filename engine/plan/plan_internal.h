/* Helpers shared by the planner's files; not part of its public API. */
#ifndef TPD_ENGINE_PLAN_PLAN_INTERNAL_H
#define TPD_ENGINE_PLAN_PLAN_INTERNAL_H

#include "engine/plan/plan.h"

/* Per-layer parameters on one TP rank (h hidden, f ffn). */
double tpd_plan_layer_params(double h, double f, int tp);
/* Parameters of one rank of `stage`. */
double tpd_plan_stage_params(const tpd_config *cfg, const tpd_plan_layout *lay, int stage);
int tpd_plan_uses_flash(const tpd_config *cfg);

/* The cpu backend's per-micro-batch stage time (plan/timing_cpu.c); same contract as
 * tpd_plan_stage_time. */
void tpd_plan_cpu_stage_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, int stage, double *fwd_p, double *bwd_p,
                             double *tp_comm_p);
/* The cpu backend's whole-step model (pipeline simulated as on cuda). */
tpd_status tpd_plan_cpu_time_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                      const tpd_plan_options *opt, int split_bubble,
                                      tpd_plan_result *res);

#endif
