/* tripod: the command-line entry point. Each subcommand parses its arguments, calls the
 * library, and turns its status into a process exit code. This is the only file that
 * ends the process. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "engine/calibrate.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/data.h"
#include "engine/plan/plan.h"
#include "engine/sweep.h"
#include "engine/train.h"
#include "kernels/cpu/cpu.h"
#include "parallel/comm.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: tripod <command> [args]\n"
            "\n"
            "commands:\n"
            "  train CONFIG.yaml [key=value ...]   train (launch with mpirun/srun for >1 rank)\n"
            "  plan CONFIG.yaml [key=value ...]    predict memory, step time and MFU of layouts\n"
            "  bench CONFIG.yaml [key=value ...] [--steps N] [--warmup W] [--peak-tflops P]\n"
            "                                      measure training throughput\n"
            "  bench --calibrate --out PROFILE.yaml [CONFIG.yaml ...]\n"
            "                                      measure this machine into a cluster profile\n"
            "  sweep CONFIG.yaml [key=value ...] --tp 1,2 --pp 1,2 [--mbs ..] [--zero 0,1]\n"
            "        [--steps N] [--warmup W] [--cluster P] [--out DIR]\n"
            "                                      measure many layouts beside the planner\n"
            "  config show CONFIG.yaml [key=value ...]\n"
            "                                      print the resolved configuration\n"
            "  data prepare|info ...               prepare or inspect token data sets\n"
            "  export CHECKPOINT --format hf|llmc --output PATH\n"
            "                                      write Hugging Face safetensors or llm.c\n"
            "  import PATH --format hf|llmc --output DIR [--layout TP,PP,DP]\n"
            "                                      make a weights-only tripod checkpoint\n"
            "  inspect CHECKPOINT                  iteration, layout and model of a\n"
            "                                      checkpoint, every file verified\n"
            "  eval CONFIG.yaml [key=value ...] [--split valid|test] [--iters N]\n"
            "                                      loss and perplexity of checkpoint.load on\n"
            "                                      N global batches (logging.eval_iters)\n"
            "  generate CHECKPOINT --prompt TEXT [--max-new-tokens N] [--temperature T]\n"
            "           [--top-k K] [--top-p P] [--seed S]\n"
            "                                      sample text from a trained model\n"
            "\n"
            "Overrides use the YAML section names: model.num_layers=4 training.train_iters=20\n");
}

/* Splits argv into the config path, key=value overrides and the remaining flags. */
typedef struct cli_args {
    const char *config;
    int n_overrides;
    const char **overrides;
    int n_flags;
    const char **flags;
} cli_args;

static int split_args(int argc, char **argv, cli_args *a) {
    memset(a, 0, sizeof *a);
    a->overrides = calloc((size_t)argc + 1, sizeof *a->overrides);
    a->flags = calloc((size_t)argc + 1, sizeof *a->flags);
    if (!a->overrides || !a->flags) return -1;
    for (int i = 0; i < argc; i++) {
        if (argv[i][0] == '-') {
            a->flags[a->n_flags++] = argv[i];
            /* a flag's value follows it unless it is another flag or an override */
            if (i + 1 < argc && argv[i + 1][0] != '-' && !strchr(argv[i + 1], '='))
                a->flags[a->n_flags++] = argv[++i];
        } else if (strchr(argv[i], '=')) {
            a->overrides[a->n_overrides++] = argv[i];
        } else if (!a->config) {
            a->config = argv[i];
        } else {
            fprintf(stderr, "tripod: error: unexpected argument '%s'\n", argv[i]);
            return -1;
        }
    }
    return 0;
}

static void free_args(cli_args *a) {
    free(a->overrides);
    free(a->flags);
}

static int load_config(const cli_args *a, tpd_config *cfg) {
    char err[1024];
    if (!a->config) {
        fprintf(stderr, "tripod: error: missing CONFIG.yaml\n");
        return TPD_EXIT_CONFIG;
    }
    if (tpd_config_load(a->config, a->n_overrides, a->overrides, cfg, err, sizeof err) != TPD_OK) {
        fprintf(stderr, "tripod: error: %s\n", err);
        return TPD_EXIT_CONFIG;
    }
    return TPD_EXIT_OK;
}

static int cmd_config(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "show") != 0) {
        fprintf(stderr, "usage: tripod config show CONFIG.yaml [key=value ...]\n");
        return TPD_EXIT_CONFIG;
    }
    cli_args a;
    if (split_args(argc - 1, argv + 1, &a) != 0) return TPD_EXIT_CONFIG;
    tpd_config cfg;
    int rc = load_config(&a, &cfg);
    if (rc == TPD_EXIT_OK) tpd_config_print(&cfg, stdout);
    free_args(&a);
    return rc;
}

static int status_exit(tpd_status st) {
    switch (st) {
    case TPD_OK: return TPD_EXIT_OK;
    case TPD_ERR_INVALID: return TPD_EXIT_CONFIG;
    case TPD_ERR_COMM: return TPD_EXIT_COMM;
    default: return TPD_EXIT_FAILURE;
    }
}

/* `tripod bench`: warm-up, then measured steps; the logging rank prints throughput, MFU
 * when the device peak is given, and for pipelines the idle fraction beside
 * (PP-1)/(M+PP-1) and each stage's compute time (stage balance explains the rest). */
static tpd_status run_bench(tpd_trainer *tr, const tpd_config *cfg, int warmup, int steps,
                            double peak_tflops) {
    const tpd_mesh *ms = &tr->mesh;
    int P = ms->pp_size, M = tr->M, n = 0;
    double sum = 0;
    /* [0] pipeline compute, [1] pipeline wait, [2 + s] stage s compute per rank (s) */
    float acc[2 + TPD_CONFIG_MAX_STAGES] = {0};
    for (int i = 0; i < warmup + steps; i++) {
        tpd_step_stats s;
        TPD_CHECK(tpd_trainer_step(tr, &s));
        if (i < warmup) continue;
        n++;
        sum += s.elapsed_s;
        acc[0] += (float)s.pipe.compute_s;
        acc[1] += (float)s.pipe.wait_s;
        acc[2 + ms->pp] += (float)(s.pipe.compute_s / (ms->tp_size * ms->dp_size));
    }
    TPD_CHECK(tpd_comm_allreduce(tr->hcomms.world, acc, acc, 2 + (size_t)P, TPD_DTYPE_F32,
                                 TPD_COMM_OP_SUM));
    if (!tr->is_logger || n == 0) return TPD_OK;
    double t = sum / n;
    double tok = (double)cfg->training.global_batch_size * cfg->model.seq_length;
    double fl = tpd_model_flops_per_iteration(cfg, tr->model->d.Vp);
    printf("bench: layout TP %d PP %d DP %d | %d steps | %.1f ms/step | %.0f tokens/s | "
           "%.2f GFLOP/s (all ranks) | %.3f GFLOP/s per rank\n",
           ms->tp_size, P, ms->dp_size, n, 1e3 * t, tok / t, fl / t / 1e9,
           fl / t / 1e9 / ms->world_size);
    if (peak_tflops > 0)
        printf("bench: MFU %.1f%% of %.0f TFLOP/s per device (model FLOPs, Megatron's "
               "formula)\n",
               100.0 * fl / t / ms->world_size / (peak_tflops * 1e12), peak_tflops);
    if (P > 1) {
        printf("bench: pipeline idle fraction %.3f measured, (PP-1)/(M+PP-1) = %.3f for PP %d, "
               "M %d | compute per step by stage (ms):",
               acc[1] / (acc[0] + acc[1]), (double)(P - 1) / (M + P - 1), P, M);
        for (int s = 0; s < P; s++) printf(" %.1f", 1e3 * acc[2 + s] / n);
        printf("\n");
    }
    fflush(stdout);
    return TPD_OK;
}

/* train and bench share the set-up: MPI, the config (validated on every rank before any
 * collective), the trainer. */
enum { RUN_TRAIN = 0, RUN_BENCH = 1, RUN_EVAL = 2 };

/* `tripod eval`: the loss of checkpoint.load over global batches of a split, printed by
 * the logging rank. */
static tpd_status run_eval(tpd_trainer *tr, tpd_split split, int iters) {
    if (iters <= 0) iters = tr->cfg.logging.eval_iters > 0 ? tr->cfg.logging.eval_iters : 1;
    double loss = NAN;
    double t0 = tpd_clock_s();
    TPD_CHECK(tpd_trainer_evaluate_split(tr, split, iters, &loss));
    if (tr->is_logger)
        printf("eval: checkpoint.load=%s, iteration %d | %s split, %d global batches of %d sequences | "
               "lm loss: %.6E | perplexity: %.4f | %.1f s\n",
               tr->cfg.checkpoint.load, tr->iteration, split == TPD_SPLIT_TEST ? "test" : "valid",
               iters, tr->cfg.training.global_batch_size, loss, exp(loss),
               tpd_clock_s() - t0);
    return TPD_OK;
}

static int run_training(int argc, char **argv, int mode) {
    int bench = mode == RUN_BENCH;
    cli_args a;
    if (split_args(argc, argv, &a) != 0) return TPD_EXIT_CONFIG;
    int steps = 10, warmup = 2, eval_iters = 0;
    tpd_split eval_split = TPD_SPLIT_VALID;
    double peak_tflops = 0; /* per device, dense; > 0 enables the MFU figure */
    for (int i = 0; i < a.n_flags; i++) {
        if (mode == RUN_EVAL && !strcmp(a.flags[i], "--split") && i + 1 < a.n_flags) {
            const char *v = a.flags[++i];
            if (strcmp(v, "valid") && strcmp(v, "test")) {
                fprintf(stderr, "tripod: error: eval --split takes valid or test (got '%s')\n", v);
                free_args(&a);
                return TPD_EXIT_CONFIG;
            }
            eval_split = strcmp(v, "test") ? TPD_SPLIT_VALID : TPD_SPLIT_TEST;
        } else if (mode == RUN_EVAL && !strcmp(a.flags[i], "--iters") && i + 1 < a.n_flags)
            eval_iters = atoi(a.flags[++i]);
        else if (!strcmp(a.flags[i], "--steps") && i + 1 < a.n_flags) steps = atoi(a.flags[++i]);
        else if (!strcmp(a.flags[i], "--warmup") && i + 1 < a.n_flags) warmup = atoi(a.flags[++i]);
        else if (!strcmp(a.flags[i], "--peak-tflops") && i + 1 < a.n_flags)
            peak_tflops = atof(a.flags[++i]);
        else if (!strcmp(a.flags[i], "--help")) {
            usage(stdout);
            free_args(&a);
            return TPD_EXIT_OK;
        } else {
            fprintf(stderr, "tripod: error: unknown option '%s'\n", a.flags[i]);
            free_args(&a);
            return TPD_EXIT_CONFIG;
        }
    }
    int provided;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    int world_size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    /* Every rank loads and checks the config on its own and prints its (identical) error;
     * only then do the ranks agree, with one reduction, whether to go on. So each rank's
     * message is out before any rank leaves. */
    tpd_config cfg;
    int rc = load_config(&a, &cfg);
    free_args(&a);
    if (rc == TPD_EXIT_OK) {
        char err[1024];
        if (tpd_config_check_world(&cfg, world_size, err, sizeof err) != TPD_OK ||
            tpd_config_check_trainable(&cfg, err, sizeof err) != TPD_OK) {
            fprintf(stderr, "tripod: error: %s\n", err);
            rc = TPD_EXIT_CONFIG;
        } else if (mode == RUN_EVAL && !cfg.checkpoint.load[0]) {
            fprintf(stderr, "tripod: error: %s: eval needs checkpoint.load (a checkpoint, or "
                            "auto with checkpoint.save)\n",
                    cfg.source_path[0] ? cfg.source_path : "<overrides>");
            rc = TPD_EXIT_CONFIG;
        }
    }
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (worst != TPD_EXIT_OK) {
        MPI_Finalize();
        return worst;
    }
    if (mode == RUN_EVAL) {
        /* reads the checkpoint (checkpoint.save locates `auto`) and the data; never trains,
         * so writes nothing */
        cfg.logging.metrics_file[0] = 0;
        cfg.logging.trace_file[0] = 0;
        cfg.logging.eval_interval = 0;
    }
    if (bench) {
        /* a measurement starts from fresh weights and leaves nothing behind */
        cfg.training.train_iters = warmup + steps;
        cfg.logging.eval_interval = 0;
        cfg.logging.metrics_file[0] = 0;
        cfg.checkpoint.load[0] = 0;
        cfg.checkpoint.save[0] = 0;
    }

    tpd_comm *world = NULL;
    tpd_trainer *tr = NULL;
    tpd_status st = tpd_comm_mpi_world(&world);
    if (st == TPD_OK) {
        tpd_comm_mpi_set_timeout(cfg.comm.timeout_s);
        st = tpd_trainer_create(&cfg, world, &tr);
    }
    if (st == TPD_OK) {
        tpd_log_set_rank(world->rank, tr->is_logger);
        if (mode == RUN_EVAL)
            st = run_eval(tr, eval_split, eval_iters);
        else if (!bench)
            st = tpd_trainer_run(tr);
        else
            st = run_bench(tr, &cfg, warmup, steps, peak_tflops);
    }
    rc = status_exit(st);
    if (st != TPD_OK && world && world->size > 1) {
        /* The other ranks may be inside a collective: take the whole job down. */
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    tpd_trainer_destroy(tr);
    if (world) world->ops->destroy(world);
    MPI_Finalize();
    return rc;
}

/* When OpenBLAS chose slower kernels than this CPU allows (it does not recognise the CPU
 * model), start again once with OPENBLAS_CORETYPE set: the library reads it only when it
 * loads. A caller's own OPENBLAS_CORETYPE is left alone. Runs before MPI_Init. */
static void pick_blas_kernels(int argc, char **argv) {
    /* only the commands that run the model's kernels */
    static const char *const heavy[] = {"train", "bench", "sweep", "eval", "generate"};
    int runs_kernels = 0;
    for (size_t i = 0; argc > 1 && i < sizeof heavy / sizeof heavy[0]; i++)
        runs_kernels |= !strcmp(argv[1], heavy[i]);
    if (!runs_kernels || getenv("OPENBLAS_CORETYPE")) return;
    const char *core = tpd_kern_cpu_blas_coretype_upgrade();
    if (!core || setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
    execv("/proc/self/exe", argv); /* returns only on failure: run on as we are */
}

int main(int argc, char **argv) {
    pick_blas_kernels(argc, argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? TPD_EXIT_CONFIG : TPD_EXIT_OK;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train")) return run_training(argc - 2, argv + 2, RUN_TRAIN);
    if (!strcmp(cmd, "eval")) return run_training(argc - 2, argv + 2, RUN_EVAL);
    if (!strcmp(cmd, "bench")) {
        for (int i = 2; i < argc; i++)
            if (!strcmp(argv[i], "--calibrate")) return tpd_calib_cli(argc - 1, argv + 1);
        return run_training(argc - 2, argv + 2, RUN_BENCH);
    }
    if (!strcmp(cmd, "sweep")) return tpd_sweep_cli(argc - 1, argv + 1);
    if (!strcmp(cmd, "config")) return cmd_config(argc - 2, argv + 2);
    if (!strcmp(cmd, "data")) return tpd_data_cli(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return tpd_plan_cli(argc - 1, argv + 1);
    if (!strcmp(cmd, "export") || !strcmp(cmd, "import") || !strcmp(cmd, "generate") ||
        !strcmp(cmd, "inspect"))
        return tpd_ckpt_cli(argc - 1, argv + 1);
    fprintf(stderr, "tripod: error: unknown command '%s'\n", cmd);
    usage(stderr);
    return TPD_EXIT_CONFIG;
}
