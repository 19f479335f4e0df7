/* `tripod bench`: measured steps of one configuration on one trainer. */
#ifndef TPD_ENGINE_BENCH_BENCH_H
#define TPD_ENGINE_BENCH_BENCH_H

#include "engine/config/config.h"
#include "engine/plan/plan.h"
#include "engine/train/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_bench_report {
    int steps;             /* measured (after the warm-up) */
    double step_s;         /* mean over the measured steps, this rank */
    double tokens_per_s;   /* the global batch's tokens per step / step_s */
    double flops_per_step; /* model FLOPs (engine/model/model_flops.h) */
    int world, tp, pp, dp, micro_batches;
    /* pipelines: compute, wait and pipeline time summed over every rank and step, and each
     * stage's compute per step (s, per rank) */
    double pipe_compute_s, pipe_wait_s, pipe_total_s;
    double stage_compute_s[TPD_CONFIG_MAX_STAGES];
    /* 1 - pipe_compute_s / pipe_total_s: the share of the ranks' pipeline time spent
     * waiting (bubble and p2p), tpd_trainer_job_timers' and the planner's pp_idle_fraction */
    double idle_fraction;
    /* max over ranks of the mean per step: the embedding and DP reduction after the
     * pipeline (t_reduce_s, the exposed part; the planner's dp_exposed_max) and the ZeRO
     * gathers waited for (t_param_wait_s; the planner's dp_gather_exposed), s */
    double reduce_s, param_wait_s;
} tpd_bench_report;

/* Runs warmup + steps training steps and measures the last `steps`. Collective over the
 * trainer's world; every rank gets the report. */
tpd_status tpd_bench_measure(tpd_trainer *tr, int warmup, int steps, tpd_bench_report *r_p);

/* The planner's prediction of what `tripod train` runs for cfg on `world` ranks: the layout
 * the config states (its schedule, virtual stages, overlap flags and stage split; never
 * rebalanced), evaluated on cluster cl. res_p->stages is 0 (with reject_reason) when the
 * planner finds the layout invalid. */
tpd_status tpd_bench_predict(const tpd_config *cfg, const tpd_plan_cluster *cl, int world,
                             tpd_plan_result *res_p);

#ifdef __cplusplus
}
#endif
#endif
