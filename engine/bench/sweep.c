/* The sweep's trial loop: layouts, validation, one trainer per trial on the whole world,
 * measured steps gathered to rank 0, the planner's prediction beside them. */
#include "engine/bench/sweep.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/file.h"
#include "engine/bench/bench.h"
#include "engine/model/model_flops.h"
#include "engine/plan/plan.h"
#include "engine/trace/trace_run.h"
#include "engine/train/train.h"

/* Per measured step and rank, in this order (seconds). */
enum { F_ELAPSED, F_COMPUTE, F_TP, F_PIPE, F_REDUCE, F_OPTIM, F_PARAM, F_COUNT };

/* mkdir -p; rank 0 only. */
static tpd_status make_dirs(const char *path) {
    int e = 0;
    tpd_status st = tpd_file_mkdirs(path, &e);
    if (st != TPD_OK)
        tpd_log_error("sweep: cannot create directory '%s': %s", path, strerror(e ? e : ENOMEM));
    return st;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Quantile q of n values (sorted in place), linear between order statistics. */
static double quantile(double *v, int n, double q) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double pos = q * (n - 1);
    int i = (int)floor(pos);
    if (i >= n - 1) return v[n - 1];
    return v[i] + (pos - i) * (v[i + 1] - v[i]);
}

/* Reduces the gathered (ranks, steps, F_COUNT) samples into the trial (rank 0). */
static void summarize(const double *all, int ranks, int steps, tpd_sweep_trial *t) {
    double *step = calloc((size_t)steps * 9, sizeof *step);
    if (!step) return;
    double *comp = step + steps, *tpc = comp + steps, *wait = tpc + steps, *dp = wait + steps,
           *opt = dp + steps, *idle = opt + steps, *exposed = idle + steps,
           *pwait = exposed + steps;
    for (int s = 0; s < steps; s++) {
        double tmax = 0, best = -1, btp = 0, pipe = -1, red = 0, csum = 0, psum = 0;
        exposed[s] = pwait[s] = 0;
        for (int q = 0; q < ranks; q++) {
            const double *r = all + ((size_t)q * steps + s) * F_COUNT;
            csum += r[F_COMPUTE];
            psum += r[F_PIPE];
            if (r[F_REDUCE] > exposed[s]) exposed[s] = r[F_REDUCE];
            if (r[F_PARAM] > pwait[s]) pwait[s] = r[F_PARAM];
            if (r[F_ELAPSED] > tmax) tmax = r[F_ELAPSED];
            if (r[F_COMPUTE] - r[F_TP] > best) {
                best = r[F_COMPUTE] - r[F_TP];
                btp = r[F_TP];
            }
            /* The rank whose pipeline ends last is on the critical path: its reduction
             * follows, and the rest of the step is the optimizer's. */
            if (r[F_PIPE] > pipe) {
                pipe = r[F_PIPE];
                red = r[F_REDUCE];
            }
        }
        step[s] = tmax;
        comp[s] = best;
        tpc[s] = btp;
        wait[s] = fmax(0.0, pipe - best - btp);
        dp[s] = red;
        opt[s] = fmax(0.0, tmax - pipe - red);
        idle[s] = psum > 0 ? 1.0 - csum / psum : 0.0;
    }
    t->meas_ovl.idle_fraction = quantile(idle, steps, 0.5);
    t->meas_ovl.dp_exposed = quantile(exposed, steps, 0.5);
    t->meas_ovl.param_wait = quantile(pwait, steps, 0.5);
    t->meas.compute = quantile(comp, steps, 0.5);
    t->meas.tp_comm = quantile(tpc, steps, 0.5);
    t->meas.pp_wait = quantile(wait, steps, 0.5);
    t->meas.dp_comm = quantile(dp, steps, 0.5);
    t->meas.optimizer = quantile(opt, steps, 0.5);
    t->t_median = quantile(step, steps, 0.5);
    t->t_q1 = quantile(step, steps, 0.25);
    t->t_q3 = quantile(step, steps, 0.75);
    t->t_min = step[0];
    t->t_max = step[steps - 1];
    free(step);
}

/* The config of one layout, through tpd_config_load so its relation checks apply, then
 * the world checks. Returns 0 with the reason when the layout is invalid. */
/* A trial's layout beyond TP and PP; -1 (or 0 for mbs and vp): the config's. */
typedef struct trial_axes {
    int mbs, zero, sp, rc, vp, sched, overlap;
} trial_axes;

static int trial_config(const char *path, int n_ovr, const char *const *ovr, int tp, int pp,
                        const trial_axes *ax, int world, tpd_config *cfg, char *why, size_t len) {
    /* the user's overrides, then the layout's, which win */
    const char **all = malloc(((size_t)n_ovr + 12) * sizeof *all);
    char o_tp[64], o_pp[64], o_mbs[64], o_zero[64], o_sp[64], o_rc[64], o_vp[80], o_sch[64],
        o_og[64], o_op[64];
    int mbs = ax->mbs, zero = ax->zero, sp = ax->sp, rc = ax->rc;
    int n = 0, ok = 0;
    if (!all) {
        snprintf(why, len, "out of memory");
        return 0;
    }
    for (int i = 0; i < n_ovr; i++)
        all[n++] = ovr[i];
    snprintf(o_tp, sizeof o_tp, "parallel.tensor_model_parallel_size=%d", tp);
    snprintf(o_pp, sizeof o_pp, "parallel.pipeline_model_parallel_size=%d", pp);
    all[n++] = o_tp;
    all[n++] = o_pp;
    all[n++] = "parallel.data_parallel_size=0";
    if (mbs > 0) {
        snprintf(o_mbs, sizeof o_mbs, "training.micro_batch_size=%d", mbs);
        all[n++] = o_mbs;
    }
    if (zero >= 0) {
        snprintf(o_zero, sizeof o_zero, "parallel.use_distributed_optimizer=%s",
                 zero ? "true" : "false");
        all[n++] = o_zero;
    }
    if (sp >= 0) {
        snprintf(o_sp, sizeof o_sp, "parallel.sequence_parallel=%s",
                 sp && tp > 1 ? "true" : "false");
        all[n++] = o_sp;
    }
    if (rc >= 0) {
        snprintf(o_rc, sizeof o_rc, "training.recompute=%s",
                 tpd_config_choice("training.recompute", rc));
        all[n++] = o_rc;
    }
    if (ax->vp > 0) {
        snprintf(o_vp, sizeof o_vp, "parallel.virtual_pipeline_model_parallel_size=%d", ax->vp);
        all[n++] = o_vp;
    }
    if (ax->sched >= 0) {
        snprintf(o_sch, sizeof o_sch, "parallel.pipeline_schedule=%s",
                 tpd_config_choice("parallel.pipeline_schedule", ax->sched));
        all[n++] = o_sch;
    }
    if (ax->overlap >= 0) {
        snprintf(o_og, sizeof o_og, "parallel.overlap_grad_reduce=%s",
                 ax->overlap ? "true" : "false");
        snprintf(o_op, sizeof o_op, "parallel.overlap_param_gather=%s",
                 ax->overlap ? "true" : "false");
        all[n++] = o_og;
        all[n++] = o_op;
    }
    if (sp == 1 && tp == 1)
        snprintf(why, len, "sequence parallel needs TP > 1");
    else if (world % (tp * pp) != 0)
        snprintf(why, len, "TP*PP = %d*%d = %d does not divide the world size %d", tp, pp, tp * pp,
                 world);
    else {
        /* a layout the config rules out is a row of failed.csv, not an error of the sweep */
        tpd_log_quiet_begin();
        ok = tpd_config_load(path, n, all, cfg) == TPD_OK &&
             tpd_config_check_world(cfg, world) == TPD_OK &&
             tpd_config_check_trainable(cfg) == TPD_OK;
        tpd_log_quiet_end();
        if (!ok) snprintf(why, len, "%s", tpd_last_error());
    }
    free(all);
    return ok;
}

/* The planner's prediction of the same layout (tpd_bench_predict: its schedule and overlap
 * flags are the config's, as the trial's). */
static void predict(const tpd_config *cfg, const tpd_plan_cluster *cl, int world,
                    tpd_sweep_trial *t, tpd_plan_result *res) {
    if (tpd_bench_predict(cfg, cl, world, res) != TPD_OK || res->stages == 0) return;
    t->have_pred = 1;
    t->pred_time = res->step_time_s;
    t->pred_mem = res->memory_bytes;
    t->pred.compute = res->time.compute - res->time.tp_comm;
    t->pred.tp_comm = res->time.tp_comm;
    t->pred.pp_wait = res->time.pp_bubble + res->time.pp_p2p;
    t->pred.dp_comm = res->time.dp_comm_exposed;
    t->pred.optimizer = res->time.optimizer + res->time.dp_gather_exposed;
    t->pred_ovl.idle_fraction = res->time.pp_idle_fraction;
    t->pred_ovl.dp_exposed = res->time.dp_exposed_max;
    t->pred_ovl.param_wait = res->time.dp_gather_exposed;
}

/* All ranks agree: 1 when every rank passes ok = 1. */
static int agree(tpd_comm *world, int ok) {
    int32_t all = ok;
    if (tpd_comm_allreduce(world, &all, &all, 1, TPD_DTYPE_I32, TPD_COMM_OP_MIN, NULL) != TPD_OK)
        return 0;
    return all;
}

/* Runs one valid trial. Collective. Fills the measured fields on rank 0. */
static void run_trial(const tpd_config *cfg, tpd_comm *world, const tpd_sweep_options *opt,
                      const char *trace_path, tpd_sweep_trial *t) {
    tpd_trainer *tr = NULL;
    tpd_trace_run *rec = NULL;
    int steps = opt->steps, total = opt->warmup + opt->steps;
    double *mine = calloc((size_t)steps * F_COUNT + 1, sizeof *mine);
    double *all = NULL;
    tpd_status st = mine ? tpd_trainer_create(cfg, world, &tr) : TPD_ERR_NOMEM;
    if (!agree(world, st == TPD_OK)) {
        snprintf(t->reason, sizeof t->reason,
                 "creating the trainer failed (%s on at least "
                 "one rank; see the log)",
                 tpd_status_str(st != TPD_OK ? st : TPD_ERR_COMM));
        t->state = TPD_SWEEP_FAILED;
        goto out;
    }
    if (trace_path) {
        const tpd_mesh *ms = tpd_trainer_mesh(tr);
        st = tpd_trace_run_create(world, ms->pp, ms->tp, ms->dp, steps, &rec);
        if (!agree(world, st == TPD_OK)) trace_path = NULL;
        if (rec) tpd_trainer_set_observer(tr, tpd_trace_run_on_action, rec);
        tpd_trace_run_pause(rec, 1);
    }
    for (int i = 0; i < total; i++) {
        tpd_step_stats s;
        if (rec && i == opt->warmup) tpd_trace_run_pause(rec, 0);
        st = tpd_trainer_step(tr, &s);
        /* A failed step on one rank must not leave the others in the next collective. */
        if (!agree(world, st == TPD_OK)) {
            snprintf(t->reason, sizeof t->reason,
                     "step %d failed (%s on at least one rank; "
                     "see the log)",
                     i + 1, tpd_status_str(st != TPD_OK ? st : TPD_ERR_COMM));
            t->state = TPD_SWEEP_FAILED;
            goto out;
        }
        if (rec) tpd_trace_run_step_end(rec, s.t_reduce_s, s.t_optim_s);
        if (t->n_loss < TPD_SWEEP_MAX_STEPS) t->loss[t->n_loss++] = s.lm_loss;
        if (i < opt->warmup) continue;
        double *r = mine + (size_t)(i - opt->warmup) * F_COUNT;
        r[F_ELAPSED] = s.elapsed_s;
        r[F_COMPUTE] = s.pipe.compute_s;
        r[F_TP] = s.t_tp_comm_s;
        r[F_PIPE] = s.pipe.total_s;
        r[F_REDUCE] = s.t_reduce_s;
        r[F_OPTIM] = s.t_optim_s;
        r[F_PARAM] = s.t_param_wait_s;
    }
    double mem = (double)tpd_trainer_model(tr)->plan.mem.total;
    int me = tpd_comm_rank(world), ranks = tpd_comm_size(world);
    st = tpd_comm_allreduce(world, &mem, &mem, 1, TPD_DTYPE_F64, TPD_COMM_OP_MAX, NULL);
    t->peak_mem = mem;
    if (me == 0) all = malloc((size_t)ranks * steps * F_COUNT * sizeof *all);
    int can = agree(world, st == TPD_OK && (me != 0 || all != NULL));
    if (can &&
        tpd_comm_gather(world, mine, all, (size_t)steps * F_COUNT, TPD_DTYPE_F64, 0) == TPD_OK) {
        if (me == 0) summarize(all, ranks, steps, t);
        t->steps = steps;
    }
    if (rec && trace_path && tpd_trace_run_write(rec, trace_path) != TPD_OK)
        tpd_log_warn("sweep: the trace %s was not written", trace_path);
out:
    if (rec) tpd_trainer_set_observer(tr, NULL, NULL);
    tpd_trace_run_destroy(rec);
    tpd_trainer_destroy(tr);
    free(all);
    free(mine);
}

static void derive_rates(const tpd_config *cfg, const tpd_plan_cluster *cl, int world,
                         tpd_sweep_trial *t) {
    if (t->state != TPD_SWEEP_OK || !(t->t_median > 0)) return;
    double sec = t->t_median;
    double flops = tpd_model_flops(cfg, t->gbs, tpd_config_padded_vocab(cfg, t->tp));
    t->samples_per_s = t->gbs / sec;
    t->tokens_per_s = (double)t->gbs * cfg->model.seq_length / sec;
    t->tflops_per_rank = flops / sec / world / 1e12;
    /* A device peak is known for GPU profiles; on cpu only a calibrated profile has a
     * measured one. */
    t->mfu = (cl->backend == TPD_PLAN_BACKEND_CUDA || cl->calibrated)
                 ? flops / sec / world / cl->peak_flops
                 : -1.0;
    if (t->have_pred && sec > 0) t->err_pct = 100.0 * (t->pred_time - sec) / sec;
}

/* "tp2_pp1_dp2_mbs1_zero0", then "_sp", "_rc-full", "_v2", "_zb-h1" and "_noovl" where
 * they are not off/none/1/1f1b/on. */
static void layout_tag(const tpd_sweep_trial *t, char *buf, size_t len) {
    char v[16] = "";
    if (t->vp > 1) snprintf(v, sizeof v, "_v%d", t->vp);
    snprintf(buf, len, "tp%d_pp%d_dp%d_mbs%d_zero%d%s%s%s%s%s%s", t->tp, t->pp, t->dp, t->mbs,
             t->zero, t->sp ? "_sp" : "", t->recompute ? "_rc-" : "",
             t->recompute ? tpd_config_choice("training.recompute", t->recompute) : "", v,
             t->schedule == TPD_SCHEDULE_ZB_H1 ? "_zb-h1" : "", t->overlap ? "" : "_noovl");
}

void tpd_sweep_layout_str(const tpd_sweep_trial *t, char *buf, size_t len) {
    char dp[16] = "-", v[16] = ""; /* no DP degree when TP*PP exceeds the world */
    if (t->dp > 0) snprintf(dp, sizeof dp, "%d", t->dp);
    if (t->vp > 1) snprintf(v, sizeof v, " v=%d", t->vp);
    snprintf(buf, len, "TP=%d PP=%d DP=%s mbs=%d ZeRO=%d%s%s%s%s%s%s", t->tp, t->pp, dp, t->mbs,
             t->zero, t->sp ? " SP" : "", t->recompute ? " recompute=" : "",
             t->recompute ? tpd_config_choice("training.recompute", t->recompute) : "", v,
             t->schedule != TPD_SCHEDULE_1F1B
                 ? (t->schedule == TPD_SCHEDULE_ZB_H1 ? " zb-h1" : " interleaved")
                 : "",
             t->overlap ? "" : " overlap=off");
}

static void print_progress(int k, int n, const tpd_sweep_trial *t, double elapsed) {
    double eta = k > 0 ? elapsed / k * (n - k) : 0;
    char lay[128];
    tpd_sweep_layout_str(t, lay, sizeof lay);
    printf("sweep: trial %d/%d %s: ", k, n, lay);
    if (t->state == TPD_SWEEP_SKIPPED)
        printf("skipped: %s", t->reason);
    else if (t->state == TPD_SWEEP_FAILED)
        printf("failed: %s", t->reason);
    else {
        printf("%.2f ms/step (min %.2f, max %.2f), loss %.4f", 1e3 * t->t_median, 1e3 * t->t_min,
               1e3 * t->t_max, t->n_loss ? t->loss[t->n_loss - 1] : NAN);
        if (t->have_pred) printf(", predicted %.2f ms (%+.1f%%)", 1e3 * t->pred_time, t->err_pct);
        /* the pipeline's idle fraction and the exposed DP reduction: measured, predicted */
        printf(" | idle %.3f", t->meas_ovl.idle_fraction);
        if (t->have_pred) printf(" (pred %.3f)", t->pred_ovl.idle_fraction);
        printf(", DP exposed %.2f ms", 1e3 * t->meas_ovl.dp_exposed);
        if (t->have_pred) printf(" (pred %.2f)", 1e3 * t->pred_ovl.dp_exposed);
    }
    printf(" | elapsed %.1f s, ETA %.1f s\n", elapsed, eta);
    fflush(stdout);
}

tpd_status tpd_sweep_run(const char *config_path, int n_overrides, const char *const *overrides,
                         tpd_comm *world, const tpd_sweep_options *opt, tpd_sweep_result *res_p) {
    tpd_status st = TPD_OK;
    tpd_config base;
    int W = tpd_comm_size(world), me = tpd_comm_rank(world);
    memset(res_p, 0, sizeof *res_p);
    res_p->best = -1;
    if (!tpd_comm_is_host(world)) {
        tpd_log_error("sweep: needs a host (MPI) world communicator");
        return TPD_ERR_UNSUPPORTED;
    }
    if (opt->steps < 1 || opt->warmup < 0 || opt->warmup + opt->steps > TPD_SWEEP_MAX_STEPS) {
        tpd_log_error("sweep: --steps %d and --warmup %d: need steps >= 1, warmup >= 0 and "
                      "at most %d in all",
                      opt->steps, opt->warmup, TPD_SWEEP_MAX_STEPS);
        return TPD_ERR_INVALID;
    }
    /* an unreadable file is a config error here too (exit code 2) */
    if (tpd_config_load(config_path, n_overrides, overrides, &base) != TPD_OK)
        return TPD_ERR_INVALID;
    tpd_plan_cluster cl;
    TPD_CHECK(tpd_plan_cluster_load(opt->cluster, &cl));
    const char *b = config_path ? strrchr(config_path, '/') : NULL;
    snprintf(res_p->model, sizeof res_p->model, "%s",
             b ? b + 1 : (config_path ? config_path : "defaults"));
    char *dot = strrchr(res_p->model, '.');
    if (dot) *dot = '\0';
    snprintf(res_p->cluster, sizeof res_p->cluster, "%s", cl.name);

    /* the axes, the last one fastest: tp, pp, mbs, zero, sp, recompute, vp, schedule,
     * overlap; an axis with no values takes the config's */
    enum { A_TP, A_PP, A_MBS, A_ZERO, A_SP, A_RC, A_VP, A_SCHED, A_OVL, A_COUNT };
    const int len[A_COUNT] = {opt->n_tp,   opt->n_pp,       opt->n_mbs,
                              opt->n_zero, opt->n_sp,       opt->n_recompute,
                              opt->n_vp,   opt->n_schedule, opt->n_overlap};
    int n = 1;
    for (int i = 0; i < A_COUNT; i++)
        n *= len[i] > 0 ? len[i] : 1;
    res_p->trials = calloc((size_t)(n > 0 ? n : 1), sizeof *res_p->trials);
    if (!res_p->trials) {
        tpd_log_error("sweep: out of memory for %d trials", n);
        return TPD_ERR_NOMEM;
    }
    int ok_dir = 1;
    if (me == 0) ok_dir = make_dirs(opt->out_dir) == TPD_OK;
    if (!agree(world, ok_dir)) TPD_FAIL_GOTO(TPD_ERR_IO, st, fail, "sweep: no output directory");

    double t_start = tpd_clock_s();
    int k = 0;
    for (int idx = 0; idx < n; idx++, k++) {
        int at[A_COUNT], r = idx;
        for (int i = A_COUNT - 1; i >= 0; i--) {
            int m = len[i] > 0 ? len[i] : 1;
            at[i] = r % m;
            r /= m;
        }
        tpd_sweep_trial *t = &res_p->trials[k];
        trial_axes ax = {
            opt->n_mbs > 0 ? opt->mbs[at[A_MBS]] : 0,
            opt->n_zero > 0 ? opt->zero[at[A_ZERO]] : -1,
            opt->n_sp > 0 ? opt->sp[at[A_SP]] : -1,
            opt->n_recompute > 0 ? (int)opt->recompute[at[A_RC]] : -1,
            opt->n_vp > 0 ? opt->vp[at[A_VP]] : 0,
            opt->n_schedule > 0 ? (int)opt->schedule[at[A_SCHED]] : -1,
            opt->n_overlap > 0 ? opt->overlap[at[A_OVL]] : -1,
        };
        t->tp = opt->tp[at[A_TP]];
        t->pp = opt->pp[at[A_PP]];
        t->dp = t->tp * t->pp > 0 ? W / (t->tp * t->pp) : 0;
        t->world = W;
        t->mbs = ax.mbs > 0 ? ax.mbs : base.training.micro_batch_size;
        t->zero = ax.zero >= 0 ? ax.zero : base.parallel.use_distributed_optimizer;
        t->sp = (ax.sp >= 0 ? ax.sp : base.parallel.sequence_parallel) && t->tp > 1;
        t->recompute = ax.rc >= 0 ? (tpd_recompute)ax.rc : base.training.recompute;
        t->vp = ax.vp > 0 ? ax.vp : base.parallel.virtual_pipeline_model_parallel_size;
        t->schedule = ax.sched >= 0 ? (tpd_schedule)ax.sched : base.parallel.pipeline_schedule;
        if (t->vp > 1 && t->schedule == TPD_SCHEDULE_1F1B) t->schedule = TPD_SCHEDULE_INTERLEAVED;
        t->overlap = ax.overlap >= 0 ? ax.overlap : base.parallel.overlap_grad_reduce;
        t->gbs = base.training.global_batch_size;
        t->mfu = -1;
        tpd_config cfg;
        if (!trial_config(config_path, n_overrides, overrides, t->tp, t->pp, &ax, W, &cfg,
                          t->reason, sizeof t->reason)) {
            t->state = TPD_SWEEP_SKIPPED;
        } else {
            cfg.training.train_iters = opt->warmup + opt->steps;
            cfg.logging.eval_interval = 0;
            cfg.logging.metrics_file[0] = '\0';
            cfg.logging.trace_file[0] = '\0';
            t->dp = tpd_config_dp(&cfg, W);
            t->gbs = cfg.training.global_batch_size;
            t->micro_batches = tpd_config_num_micro_batches(&cfg, t->dp);
            t->schedule = tpd_config_schedule(&cfg);
            t->overlap = cfg.parallel.overlap_grad_reduce;
            tpd_plan_result pr;
            predict(&cfg, &cl, W, t, &pr);
            char tag[96], real[TPD_CONFIG_STR + 128], pred[TPD_CONFIG_STR + 128];
            layout_tag(t, tag, sizeof tag);
            snprintf(real, sizeof real, "%s/trace_%s.json", opt->out_dir, tag);
            snprintf(pred, sizeof pred, "%s/trace_%s_predicted.json", opt->out_dir, tag);
            run_trial(&cfg, world, opt, opt->traces ? real : NULL, t);
            if (opt->traces && t->have_pred && me == 0 && tpd_plan_write_trace(&pr, pred) != TPD_OK)
                tpd_log_warn("sweep: the predicted trace %s was not written", pred);
            derive_rates(&cfg, &cl, W, t);
        }
        /* Rank 0 holds the measurements: everyone gets the same record. */
        if (tpd_comm_broadcast(world, t, sizeof *t, TPD_DTYPE_U8, 0, NULL) != TPD_OK)
            TPD_FAIL_GOTO(TPD_ERR_COMM, st, fail,
                          "sweep: the trial record did not reach every rank");
        if (me == 0 && opt->verbose) print_progress(k + 1, n, t, tpd_clock_s() - t_start);
    }
    res_p->n = n;
    for (int i = 0; i < n; i++) {
        const tpd_sweep_trial *t = &res_p->trials[i];
        if (t->state != TPD_SWEEP_OK || !(t->t_median > 0)) continue;
        if (res_p->best < 0 || t->t_median < res_p->trials[res_p->best].t_median) res_p->best = i;
    }
    res_p->wall_s = tpd_clock_s() - t_start;
    return TPD_OK;
fail:
    tpd_sweep_result_free(res_p);
    return st;
}

void tpd_sweep_result_free(tpd_sweep_result *r) {
    if (!r) return;
    free(r->trials);
    r->trials = NULL;
    r->n = 0;
}
