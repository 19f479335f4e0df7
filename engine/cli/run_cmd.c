/* `tripod train`, `tripod bench` (measured steps) and `tripod eval`: the commands that run
 * the trainer on a run configuration. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/fault.h"
#include "engine/bench/bench.h"
#include "engine/cli/args.h"
#include "engine/cli/cli.h"
#include "engine/config/config.h"
#include "engine/plan/plan.h"
#include "engine/train/train.h"
#include "parallel/comm.h"

static void usage(FILE *f, tpd_cli_run_mode mode) {
    if (mode == TPD_CLI_BENCH)
        fprintf(f, "usage: tripod bench CONFIG.yaml [section.key=value ...] [--steps N]\n"
                   "                    [--warmup W] [--peak-tflops P] [--cluster NAME|FILE]\n"
                   "  Trains warm-up then measured steps from fresh weights (nothing is read or\n"
                   "  written) and prints ms/step, tokens/s, GFLOP/s, MFU against the dense peak\n"
                   "  P per device when given, the pipeline's idle fraction and the exposed DP\n"
                   "  time, each beside the planner's prediction for the cluster profile\n"
                   "  (default: cpu, or h200 for training.device=cuda; a profile from\n"
                   "  `tripod bench --calibrate` predicts this machine).\n"
                   "       tripod bench --calibrate --out PROFILE.yaml [CONFIG.yaml ...]\n"
                   "  Measures this machine into a cluster profile for the planner.\n");
    else if (mode == TPD_CLI_EVAL)
        fprintf(f, "usage: tripod eval CONFIG.yaml checkpoint.load=PATH|auto [key=value ...]\n"
                   "                   [--split valid|test] [--iters N]\n"
                   "  Loss and perplexity of the checkpoint on N global batches of the split\n"
                   "  (default logging.eval_iters), on any layout.\n");
    else
        fprintf(f, "usage: [mpirun -np N] tripod train CONFIG.yaml [section.key=value ...]\n"
                   "  Trains as the configuration says; `tripod config show CONFIG` lists every\n"
                   "  key with its default.\n");
}

static const tpd_cli_opt k_train_opts[] = {{NULL, 0}};
static const tpd_cli_opt k_bench_opts[] = {
    {"--steps", 1}, {"--warmup", 1}, {"--peak-tflops", 1}, {"--cluster", 1}, {NULL, 0}};
static const tpd_cli_opt k_eval_opts[] = {{"--split", 1}, {"--iters", 1}, {NULL, 0}};

/* The options of bench and eval. */
typedef struct run_opts {
    int steps, warmup, eval_iters;
    tpd_split eval_split;
    double peak_tflops;  /* per device, dense; > 0 enables the MFU figure */
    const char *cluster; /* bench: the planner's profile; NULL: by training.device */
} run_opts;

static tpd_status parse_opts(const char *cmd, const tpd_cli_args *a, run_opts *o) {
    for (int i = 0; i < a->n_opts; i++) {
        const char *n = a->opt_name[i], *v = a->opt_value[i];
        if (!strcmp(n, "--steps"))
            TPD_CHECK(tpd_cli_int(cmd, n, v, 1, 1000000, &o->steps));
        else if (!strcmp(n, "--warmup"))
            TPD_CHECK(tpd_cli_int(cmd, n, v, 0, 1000000, &o->warmup));
        else if (!strcmp(n, "--peak-tflops"))
            TPD_CHECK(tpd_cli_double(cmd, n, v, 1e-9, 1e9, &o->peak_tflops));
        else if (!strcmp(n, "--cluster"))
            o->cluster = v;
        else if (!strcmp(n, "--iters"))
            TPD_CHECK(tpd_cli_int(cmd, n, v, 1, 1000000, &o->eval_iters));
        else if (!strcmp(n, "--split")) {
            if (strcmp(v, "valid") && strcmp(v, "test")) {
                tpd_log_error("%s: --split takes valid or test (got '%s')", cmd, v);
                return TPD_ERR_INVALID;
            }
            o->eval_split = strcmp(v, "test") ? TPD_SPLIT_VALID : TPD_SPLIT_TEST;
        }
    }
    return TPD_OK;
}

/* `tripod bench`: the logging rank prints throughput, MFU when the device peak is given,
 * for pipelines the idle fraction beside the planner's and (PP-1)/(M+PP-1) and each
 * stage's compute time (stage balance explains the rest), and the exposed DP time beside
 * the planner's. Both idle fractions are 1 - compute / pipeline time summed over the ranks
 * (the planner's over the stages, which is the same quantity: a stage's ranks are alike);
 * both exposed times are the largest over the ranks (stages) of the reduction after the
 * pipeline. */
static tpd_status run_bench(tpd_trainer *tr, const run_opts *o, const tpd_plan_cluster *cl) {
    tpd_bench_report r;
    TPD_CHECK(tpd_bench_measure(tr, o->warmup, o->steps, &r));
    if (!tpd_trainer_is_logger(tr) || r.steps == 0) return TPD_OK;
    const tpd_config *cfg = tpd_trainer_config(tr);
    double t = r.step_s, fl = r.flops_per_step;
    printf("bench: layout TP %d PP %d DP %d | %d steps | %.1f ms/step | %.0f tokens/s | "
           "%.2f GFLOP/s (all ranks) | %.3f GFLOP/s per rank\n",
           r.tp, r.pp, r.dp, r.steps, 1e3 * t, r.tokens_per_s, fl / t / 1e9,
           fl / t / 1e9 / r.world);
    if (o->peak_tflops > 0)
        printf("bench: MFU %.1f%% of %.0f TFLOP/s per device (model FLOPs, Megatron's "
               "formula)\n",
               100.0 * fl / t / r.world / (o->peak_tflops * 1e12), o->peak_tflops);
    tpd_plan_result *pred = malloc(sizeof *pred);
    int have = pred && tpd_bench_predict(cfg, cl, r.world, pred) == TPD_OK && pred->stages > 0;
    if (!have) printf("bench: no prediction (the planner cannot evaluate this layout)\n");
    if (have)
        printf("bench: predicted by the planner (cluster %s): %.1f ms/step (%+.1f%%)\n", cl->name,
               1e3 * pred->step_time_s, 100.0 * (pred->step_time_s - t) / t);
    if (r.pp > 1) {
        int P = r.pp, M = r.micro_batches;
        printf("bench: pipeline (%s, v=%d) idle fraction %.3f measured",
               tpd_config_choice("parallel.pipeline_schedule", tpd_config_schedule(cfg)),
               cfg->parallel.virtual_pipeline_model_parallel_size, r.idle_fraction);
        if (have) printf(", %.3f predicted", pred->time.pp_idle_fraction);
        printf(" (1 - compute/time over all ranks), (PP-1)/(M+PP-1) = %.3f for PP %d, M %d | "
               "compute per step by stage (ms):",
               (double)(P - 1) / (M + P - 1), P, M);
        for (int s = 0; s < P; s++)
            printf(" %.1f", 1e3 * r.stage_compute_s[s]);
        printf("\n");
    }
    printf("bench: DP reduction after the pipeline (max over ranks) %.3f ms measured",
           1e3 * r.reduce_s);
    if (have) printf(", %.3f ms predicted", 1e3 * pred->time.dp_exposed_max);
    printf(" | ZeRO gathers waited %.3f ms measured", 1e3 * r.param_wait_s);
    if (have)
        printf(", %.3f ms predicted | all DP communication %.3f ms predicted",
               1e3 * pred->time.dp_gather_exposed, 1e3 * pred->time.dp_comm_total);
    printf(" (overlap_grad_reduce %s, overlap_param_gather %s)\n",
           cfg->parallel.overlap_grad_reduce ? "on" : "off",
           cfg->parallel.overlap_param_gather ? "on" : "off");
    free(pred);
    fflush(stdout);
    return TPD_OK;
}

/* Whether checkpoint.load=auto finds something in a save folder: its `latest`, or a
 * checkpoint folder iter_* (not a save's unfinished iter_*.tmp). */
static int save_dir_has_checkpoint(const char *save) {
    DIR *d = opendir(save);
    int found = 0;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        found = !strcmp(e->d_name, "latest") ||
                (!strncmp(e->d_name, "iter_", 5) && !(n > 4 && !strcmp(e->d_name + n - 4, ".tmp")));
    }
    if (d) closedir(d);
    return found;
}

/* `tripod eval`: the loss of checkpoint.load over global batches of a split, printed by
 * the logging rank. */
static tpd_status run_eval(tpd_trainer *tr, const run_opts *o) {
    const tpd_config *cfg = tpd_trainer_config(tr);
    int iters = o->eval_iters;
    if (iters <= 0) iters = cfg->logging.eval_iters > 0 ? cfg->logging.eval_iters : 1;
    double loss = NAN;
    double t0 = tpd_clock_s();
    TPD_CHECK(tpd_trainer_evaluate_split(tr, o->eval_split, iters, &loss));
    if (tpd_trainer_is_logger(tr))
        printf("eval: checkpoint.load=%s, iteration %d | %s split, %d global batches of %d "
               "sequences | lm loss: %.6E | perplexity: %.4f | %.1f s\n",
               cfg->checkpoint.load, tpd_trainer_iteration(tr),
               o->eval_split == TPD_SPLIT_TEST ? "test" : "valid", iters,
               cfg->training.global_batch_size, loss, exp(loss), tpd_clock_s() - t0);
    return TPD_OK;
}

int tpd_cli_run(int argc, char **argv, tpd_cli_run_mode mode) {
    const char *cmd = argv[0];
    const tpd_cli_opt *opts = mode == TPD_CLI_BENCH  ? k_bench_opts
                              : mode == TPD_CLI_EVAL ? k_eval_opts
                                                     : k_train_opts;
    tpd_cli_args a;
    if (tpd_cli_args_parse(cmd, argc - 1, argv + 1, opts, &a) != TPD_OK) return TPD_EXIT_CONFIG;
    if (a.help) {
        usage(stdout, mode);
        tpd_cli_args_free(&a);
        return TPD_EXIT_OK;
    }
    run_opts o = {10, 2, 0, TPD_SPLIT_VALID, 0, NULL};
    int rc = parse_opts(cmd, &a, &o) == TPD_OK ? TPD_EXIT_OK : TPD_EXIT_CONFIG;

    tpd_comm *world = NULL;
    tpd_status st = tpd_comm_mpi_start(&world);
    if (st != TPD_OK) {
        tpd_cli_args_free(&a);
        return TPD_EXIT_COMM;
    }
    /* Every rank loads and checks the config on its own and prints its (identical) error;
     * only then do the ranks agree, with one reduction, whether to go on. So each rank's
     * message is out before any rank leaves. */
    tpd_config cfg;
    tpd_plan_cluster cluster;
    if (rc == TPD_EXIT_OK && tpd_cli_args_load_config(cmd, &a, &cfg) != TPD_OK)
        rc = TPD_EXIT_CONFIG;
    if (rc == TPD_EXIT_OK) {
        if (tpd_config_check_world(&cfg, tpd_comm_size(world)) != TPD_OK ||
            tpd_config_check_trainable(&cfg) != TPD_OK) {
            rc = TPD_EXIT_CONFIG;
        } else if (mode == TPD_CLI_BENCH &&
                   tpd_plan_cluster_load(o.cluster                               ? o.cluster
                                         : cfg.training.device == TPD_DEVICE_CPU ? "cpu"
                                                                                 : "h200",
                                         &cluster) != TPD_OK) {
            rc = TPD_EXIT_CONFIG; /* the loader named the file and the key */
        } else if (mode == TPD_CLI_EVAL && !cfg.checkpoint.load[0]) {
            tpd_log_error("%s: eval needs checkpoint.load (a checkpoint, or auto with "
                          "checkpoint.save)",
                          cfg.source_path[0] ? cfg.source_path : "<overrides>");
            rc = TPD_EXIT_CONFIG;
        } else if (mode == TPD_CLI_EVAL && !strcmp(cfg.checkpoint.load, "auto") &&
                   cfg.checkpoint.save[0] && !save_dir_has_checkpoint(cfg.checkpoint.save)) {
            /* training starts fresh there; eval would score random weights */
            tpd_log_error("eval: checkpoint.load=auto: no checkpoint in %s (no latest, no "
                          "iter_*); nothing to evaluate",
                          cfg.checkpoint.save);
            rc = TPD_EXIT_CONFIG;
        }
    }
    tpd_cli_args_free(&a); /* after the cluster: o.cluster points into it */
    /* Start-up's collectives (this agreement, the mesh split) get the run's deadline: a
     * peer stopped or stuck here ends the job with TPD_EXIT_COMM instead of a hang. A rank
     * whose config did not load uses the default comm.timeout_s. */
    tpd_config dflt;
    if (rc != TPD_EXIT_OK) tpd_config_defaults(&dflt);
    tpd_comm_mpi_set_timeout(rc == TPD_EXIT_OK ? cfg.comm.timeout_s : dflt.comm.timeout_s);
    int stop_rank = 1; /* test-only (base/fault.h): a rank stopped before the agreement */
    if (tpd_fault("stop-rank", 1, &stop_rank) && tpd_comm_rank(world) == stop_rank) raise(SIGSTOP);
    int32_t worst = rc;
    if (tpd_comm_allreduce(world, &worst, &worst, 1, TPD_DTYPE_I32, TPD_COMM_OP_MAX, NULL) !=
        TPD_OK)
        worst = TPD_EXIT_COMM;
    if (worst != TPD_EXIT_OK) {
        tpd_comm_mpi_finish(world);
        return worst;
    }
    if (mode == TPD_CLI_EVAL) {
        /* reads the checkpoint (checkpoint.save locates `auto`) and the data; never trains,
         * so writes nothing */
        cfg.logging.metrics_file[0] = 0;
        cfg.logging.trace_file[0] = 0;
        cfg.logging.eval_interval = 0;
    }
    if (mode == TPD_CLI_BENCH) {
        /* a measurement starts from fresh weights and leaves nothing behind */
        cfg.training.train_iters = o.warmup + o.steps;
        cfg.logging.eval_interval = 0;
        cfg.logging.metrics_file[0] = 0;
        cfg.checkpoint.load[0] = 0;
        cfg.checkpoint.save[0] = 0;
    }

    tpd_trainer *tr = NULL;
    st = tpd_trainer_create(&cfg, world, &tr);
    if (st == TPD_OK) {
        tpd_log_set_rank(tpd_comm_rank(world), tpd_trainer_is_logger(tr));
        if (mode == TPD_CLI_EVAL)
            st = run_eval(tr, &o);
        else if (mode == TPD_CLI_BENCH)
            st = run_bench(tr, &o, &cluster);
        else
            st = tpd_trainer_run(tr);
    }
    rc = tpd_status_exit_code(st);
    /* The other ranks may be inside a collective: take the whole job down, unless every
     * rank stopped on the same verdict (each prints its own message and leaves). */
    if (st != TPD_OK && tpd_comm_size(world) > 1 && !(tr && tpd_trainer_failed_together(tr)))
        tpd_comm_mpi_abort_job(rc);
    tpd_trainer_destroy(tr);
    tpd_comm_mpi_finish(world);
    return rc;
}
