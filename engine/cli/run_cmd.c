/* `tripod train`, `tripod bench` (measured steps), `tripod eval` and `tripod config show`:
 * the commands that load a run configuration. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "engine/bench/bench.h"
#include "engine/cli/args.h"
#include "engine/cli/cli.h"
#include "engine/config/config.h"
#include "engine/train/train.h"
#include "parallel/comm.h"

static void usage(FILE *f, tpd_cli_run_mode mode) {
    if (mode == TPD_CLI_BENCH)
        fprintf(f, "usage: tripod bench CONFIG.yaml [section.key=value ...] [--steps N]\n"
                   "                    [--warmup W] [--peak-tflops P]\n"
                   "  Trains warm-up then measured steps from fresh weights (nothing is read or\n"
                   "  written) and prints ms/step, tokens/s, GFLOP/s, MFU against the dense peak\n"
                   "  P per device when given, and for pipelines the idle fraction.\n"
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
    {"--steps", 1}, {"--warmup", 1}, {"--peak-tflops", 1}, {NULL, 0}};
static const tpd_cli_opt k_eval_opts[] = {{"--split", 1}, {"--iters", 1}, {NULL, 0}};

int tpd_cli_code(tpd_status st) {
    switch (st) {
    case TPD_OK:
        return TPD_EXIT_OK;
    case TPD_ERR_INVALID:
        return TPD_EXIT_CONFIG;
    case TPD_ERR_COMM:
        return TPD_EXIT_COMM;
    default:
        return TPD_EXIT_FAILURE;
    }
}

static int load_config(const tpd_cli_args *a, tpd_config *cfg) {
    char err[1024];
    if (!a->config) {
        tpd_log_error("missing CONFIG.yaml");
        return TPD_EXIT_CONFIG;
    }
    if (tpd_config_load(a->config, a->n_overrides, a->overrides, cfg, err, sizeof err) != TPD_OK) {
        tpd_log_error("%s", err);
        return TPD_EXIT_CONFIG;
    }
    return TPD_EXIT_OK;
}

int tpd_cli_config(int argc, char **argv) {
    static const tpd_cli_opt none[] = {{NULL, 0}};
    if (argc < 2 || strcmp(argv[1], "show") != 0) {
        fprintf(stderr, "usage: tripod config show CONFIG.yaml [key=value ...]\n");
        return argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
                   ? TPD_EXIT_OK
                   : TPD_EXIT_CONFIG;
    }
    tpd_cli_args a;
    if (tpd_cli_args_parse("config show", argc - 2, argv + 2, none, &a) != TPD_OK)
        return TPD_EXIT_CONFIG;
    if (a.help) {
        printf("usage: tripod config show CONFIG.yaml [key=value ...]\n"
               "  Prints the resolved configuration: every key, its value and a comment.\n");
        tpd_cli_args_free(&a);
        return TPD_EXIT_OK;
    }
    tpd_config cfg;
    int rc = load_config(&a, &cfg);
    if (rc == TPD_EXIT_OK) tpd_config_print(&cfg, stdout);
    tpd_cli_args_free(&a);
    return rc;
}

/* The options of bench and eval. */
typedef struct run_opts {
    int steps, warmup, eval_iters;
    tpd_split eval_split;
    double peak_tflops; /* per device, dense; > 0 enables the MFU figure */
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
 * and for pipelines the idle fraction beside (PP-1)/(M+PP-1) and each stage's compute
 * time (stage balance explains the rest). */
static tpd_status run_bench(tpd_trainer *tr, const run_opts *o) {
    tpd_bench_report r;
    TPD_CHECK(tpd_bench_measure(tr, o->warmup, o->steps, &r));
    if (!tpd_trainer_is_logger(tr) || r.steps == 0) return TPD_OK;
    double t = r.step_s, fl = r.flops_per_step;
    printf("bench: layout TP %d PP %d DP %d | %d steps | %.1f ms/step | %.0f tokens/s | "
           "%.2f GFLOP/s (all ranks) | %.3f GFLOP/s per rank\n",
           r.tp, r.pp, r.dp, r.steps, 1e3 * t, r.tokens_per_s, fl / t / 1e9,
           fl / t / 1e9 / r.world);
    if (o->peak_tflops > 0)
        printf("bench: MFU %.1f%% of %.0f TFLOP/s per device (model FLOPs, Megatron's "
               "formula)\n",
               100.0 * fl / t / r.world / (o->peak_tflops * 1e12), o->peak_tflops);
    if (r.pp > 1) {
        int P = r.pp, M = r.micro_batches;
        printf("bench: pipeline idle fraction %.3f measured, (PP-1)/(M+PP-1) = %.3f for PP %d, "
               "M %d | compute per step by stage (ms):",
               r.pipe_wait_s / (r.pipe_compute_s + r.pipe_wait_s), (double)(P - 1) / (M + P - 1), P,
               M);
        for (int s = 0; s < P; s++)
            printf(" %.1f", 1e3 * r.stage_compute_s[s]);
        printf("\n");
    }
    fflush(stdout);
    return TPD_OK;
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
    run_opts o = {10, 2, 0, TPD_SPLIT_VALID, 0};
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
    if (rc == TPD_EXIT_OK) rc = load_config(&a, &cfg);
    tpd_cli_args_free(&a);
    if (rc == TPD_EXIT_OK) {
        char err[1024];
        if (tpd_config_check_world(&cfg, tpd_comm_size(world), err, sizeof err) != TPD_OK ||
            tpd_config_check_trainable(&cfg, err, sizeof err) != TPD_OK) {
            tpd_log_error("%s", err);
            rc = TPD_EXIT_CONFIG;
        } else if (mode == TPD_CLI_EVAL && !cfg.checkpoint.load[0]) {
            tpd_log_error("%s: eval needs checkpoint.load (a checkpoint, or auto with "
                          "checkpoint.save)",
                          cfg.source_path[0] ? cfg.source_path : "<overrides>");
            rc = TPD_EXIT_CONFIG;
        }
    }
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
    tpd_comm_mpi_set_timeout(cfg.comm.timeout_s);
    st = tpd_trainer_create(&cfg, world, &tr);
    if (st == TPD_OK) {
        tpd_log_set_rank(tpd_comm_rank(world), tpd_trainer_is_logger(tr));
        if (mode == TPD_CLI_EVAL)
            st = run_eval(tr, &o);
        else if (mode == TPD_CLI_BENCH)
            st = run_bench(tr, &o);
        else
            st = tpd_trainer_run(tr);
    }
    rc = tpd_cli_code(st);
    /* The other ranks may be inside a collective: take the whole job down. */
    if (st != TPD_OK && tpd_comm_size(world) > 1) tpd_comm_mpi_abort_job(rc);
    tpd_trainer_destroy(tr);
    tpd_comm_mpi_finish(world);
    return rc;
}
