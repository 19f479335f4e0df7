/* `tripod bench`: measured steps of one configuration on one trainer. */
#ifndef TPD_ENGINE_BENCH_BENCH_H
#define TPD_ENGINE_BENCH_BENCH_H

#include "engine/config/config.h"
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
    /* pipelines: compute and wait summed over every rank and step, for the idle fraction
     * wait / (compute + wait), and each stage's compute per step (s, per rank) */
    double pipe_compute_s, pipe_wait_s;
    double stage_compute_s[TPD_CONFIG_MAX_STAGES];
} tpd_bench_report;

/* Runs warmup + steps training steps and measures the last `steps`. Collective over the
 * trainer's world; every rank gets the report. */
tpd_status tpd_bench_measure(tpd_trainer *tr, int warmup, int steps, tpd_bench_report *r_p);

#ifdef __cplusplus
}
#endif
#endif
