/* `tripod sweep`: a benchmark sweep over TP/PP (DP derived) layouts inside one mpirun.
 *
 * Each trial loads the config with the layout as overrides (so every relation check of
 * tpd_config_load applies), checks it against the world, builds a trainer on the whole
 * world, runs warm-up and measured steps, and tears it down. Invalid layouts are listed
 * as skipped with the reason; a trial that fails is recorded with its error and the sweep
 * goes on (every rank agrees on failure through an all-reduce of a status flag, so none
 * hangs). Each trial is set beside the planner's prediction for the same layout.
 *
 * Measured split of one step (from tpd_step_stats, per step, over ranks):
 *   compute   = max over ranks of FWD+BWD time minus TP collectives (the slowest stage)
 *   tp_comm   = that rank's TP collective time
 *   pp_wait   = the pipeline's wall time on the rank whose pipeline ends last (the
 *               critical path), minus compute and tp_comm (bubble + p2p, as the
 *               planner's pp_bubble + pp_p2p)
 *   dp_comm   = that rank's embedding + DP gradient reduction after the pipeline (the part
 *               overlap_grad_reduce did not hide behind the last backward)
 *   optimizer = the rest of the step: norm, AdamW, ZeRO all-gather (the part waited for),
 *               zeroing gradients, the loss all-reduce (predicted: optimizer + the exposed
 *               gathers)
 * The five add up to the step time. Beside them, as the planner reports them:
 *   idle_fraction = 1 - (sum of pipeline compute) / (sum of pipeline time) over every rank
 *                   (tpd_trainer_job_timers' idle fraction; the planner's pp_idle_fraction)
 *   dp_exposed    = max over ranks of the reduction after the pipeline (t_reduce_s; the
 *                   planner's dp_exposed_max)
 *   param_wait    = max over ranks of the ZeRO gathers waited for (t_param_wait_s; the
 *                   planner's dp_gather_exposed)
 * Each component is the median over measured steps; the step time is the max over ranks
 * of tpd_step_stats.elapsed_s, median over steps. Units: seconds and bytes. */
#ifndef TPD_ENGINE_SWEEP_H
#define TPD_ENGINE_SWEEP_H

#include "base/status.h"
#include "engine/config/config.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPD_SWEEP_MAX_VALUES 16
#define TPD_SWEEP_MAX_STEPS 256 /* losses kept per trial (warm-up + measured) */

typedef struct tpd_sweep_options {
    int tp[TPD_SWEEP_MAX_VALUES], n_tp;
    int pp[TPD_SWEEP_MAX_VALUES], n_pp;
    int mbs[TPD_SWEEP_MAX_VALUES], n_mbs; /* 0 values: the config's micro_batch_size */
    int zero[2], n_zero;                  /* 0 values: the config's ZeRO-1 setting */
    int sp[2], n_sp;                      /* 0 values: the config's sequence_parallel */
    tpd_recompute recompute[3];
    int n_recompute; /* 0 values: the config's */
    int steps, warmup;
    char out_dir[TPD_CONFIG_STR];
    char cluster[TPD_CONFIG_STR]; /* planner profile: NAME or FILE */
    int plot;    /* 1: draw sweep.png with tools/plot_sweep.sh when gnuplot is on PATH */
    int traces;  /* 1: real and predicted Chrome traces of every trial in out_dir */
    int verbose; /* 1: progress lines on rank 0 */
    int vp[TPD_SWEEP_MAX_VALUES], n_vp; /* virtual_pipeline_model_parallel_size; 0 values:
                                           the config's */
    tpd_schedule schedule[3];
    int n_schedule;            /* parallel.pipeline_schedule; 0 values: the config's */
    int overlap[2], n_overlap; /* parallel.overlap_grad_reduce and overlap_param_gather
                                  together; 0 values: the config's */
} tpd_sweep_options;

#define TPD_SWEEP_OPTIONS_INIT                                                                     \
    {                                                                                              \
        {1}, 1, {1}, 1, {0}, 0, {0}, 0, {0}, 0, {TPD_RECOMPUTE_NONE}, 0, 5, 2, "sweep_out", "cpu", \
            1, 1, 1, {0}, 0, {TPD_SCHEDULE_1F1B}, 0, {0}, 0                                        \
    }

typedef enum tpd_sweep_state {
    TPD_SWEEP_OK = 0,
    TPD_SWEEP_SKIPPED = 1, /* invalid layout, never started */
    TPD_SWEEP_FAILED = 2,  /* started and failed: error recorded */
} tpd_sweep_state;

/* Seconds of one step split as described above. */
typedef struct tpd_sweep_split {
    double compute, tp_comm, pp_wait, dp_comm, optimizer;
} tpd_sweep_split;

/* The pipeline and DP overlap beside the split (as the header comment says), s. */
typedef struct tpd_sweep_overlap {
    double idle_fraction, dp_exposed, param_wait;
} tpd_sweep_overlap;

typedef struct tpd_sweep_trial {
    int tp, pp, dp, mbs, zero, gbs, world, micro_batches;
    int sp; /* parallel.sequence_parallel (1 only with TP > 1) */
    tpd_recompute recompute;
    int vp;                /* virtual_pipeline_model_parallel_size */
    tpd_schedule schedule; /* the schedule it runs (interleaved when vp > 1) */
    int overlap;           /* overlap_grad_reduce (and overlap_param_gather) */
    tpd_sweep_state state;
    char reason[320];                          /* why skipped or failed */
    int steps;                                 /* measured */
    double t_median, t_min, t_max, t_q1, t_q3; /* step time, s */
    double samples_per_s, tokens_per_s, tflops_per_rank;
    double mfu;                 /* < 0: unknown (no device peak) */
    double peak_mem;            /* bytes: max over ranks of the model's allocation */
    tpd_sweep_split meas, pred; /* measured medians and the planner's prediction */
    tpd_sweep_overlap meas_ovl, pred_ovl;
    int have_pred;
    double pred_time; /* s */
    double pred_mem;  /* bytes, max over ranks */
    double err_pct;   /* 100 (pred - meas) / meas */
    int n_loss;       /* losses of every step run, warm-up included */
    double loss[TPD_SWEEP_MAX_STEPS];
} tpd_sweep_trial;

typedef struct tpd_sweep_result {
    tpd_sweep_trial *trials; /* owned */
    int n;
    int best;         /* index of the fastest successful trial, -1 when none */
    char model[128];  /* the config's base name, for the CSV's model column */
    char cluster[64]; /* name of the planner profile used */
    double wall_s;
} tpd_sweep_result;

/* Runs every layout of the option lists on `world` (MPI). Collective: call on every rank
 * with the same arguments. The result is complete on every rank. A failing trial is
 * not an error; the status is for the sweep itself (bad config file, unknown cluster). */
tpd_status tpd_sweep_run(const char *config_path, int n_overrides, const char *const *overrides,
                         tpd_comm *world, const tpd_sweep_options *opt, tpd_sweep_result *res_p);
void tpd_sweep_result_free(tpd_sweep_result *r);

/* summary.csv, failed.csv and summary.json in opt->out_dir, then sweep.png through
 * tools/plot_sweep.sh when opt->plot and gnuplot is on PATH (otherwise the command is
 * printed). Rank 0 only. */
tpd_status tpd_sweep_write(const tpd_sweep_result *r, const tpd_sweep_options *opt);
/* "Best layout: TP=.. PP=.. DP=.. mbs=.. ZeRO=..: X s/step, ..." into buf. */
void tpd_sweep_best_line(const tpd_sweep_result *r, char *buf, size_t len);

/* "TP=2 PP=1 DP=2 mbs=1 ZeRO=0", then " SP", " recompute=full", " v=2", " interleaved" (or
 * " zb-h1") and " overlap=off" where they apply; DP is "-" for a layout that does not fit
 * the world. */
void tpd_sweep_layout_str(const tpd_sweep_trial *t, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
