/* tripod: the command-line entry point. It chooses the BLAS kernels, installs the fatal
 * handler, and hands the command line to a subcommand (engine/cli/cli.h), whose exit code
 * it returns. Library code never ends the process; the one exception, tpd_fatal
 * (base/fatal.h), reports through the handler installed here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fatal.h"
#include "engine/cli/cli.h"
#include "kernels/cpu/cpu.h"

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
            "  verify CONFIG.yaml [key=value ...] [--ranks N] [--steps K] [--out DIR]\n"
            "                                      rehearse the layout on cpu ranks (mpirun)\n"
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
            "  report METRICS.jsonl|RUN_DIR [--out DIR]\n"
            "                                      draw a run's loss, lr, grad norm and\n"
            "                                      throughput (gnuplot)\n"
            "  --version                           print the version\n"
            "\n"
            "Overrides use the YAML section names: model.num_layers=4 training.train_iters=20\n");
}

/* tpd_fatal's report: one line on stderr (async-signal-safe: write(2) only), then
 * tpd_fatal leaves with the code. */
static void on_fatal(int code, const char *why) {
    char line[160];
    size_t n = 0;
    const char *parts[] = {"tripod: fatal: ", why ? why : "unknown", ": leaving with exit code "};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        for (const char *p = parts[i]; *p && n < sizeof line - 8; p++)
            line[n++] = *p;
    if (code >= 10) line[n++] = (char)('0' + code / 10 % 10);
    line[n++] = (char)('0' + code % 10);
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
}

/* When OpenBLAS chose slower kernels than this CPU allows (it does not recognise the CPU
 * model), start again once with OPENBLAS_CORETYPE set: the library reads it only when it
 * loads. A caller's own OPENBLAS_CORETYPE is left alone. Runs before MPI_Init. */
static void pick_blas_kernels(int argc, char **argv) {
    /* only the commands that run the model's kernels */
    static const char *const heavy[] = {"train", "bench", "sweep", "eval", "generate", "verify"};
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
    tpd_fatal_set_handler(on_fatal);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? TPD_EXIT_CONFIG : TPD_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("tripod %s\n", TPD_VERSION);
        return TPD_EXIT_OK;
    }
    const char *cmd = argv[1];
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1; /* argv[0] is the subcommand */
    if (!strcmp(cmd, "train")) return tpd_cli_run(sub_argc, sub_argv, TPD_CLI_TRAIN);
    if (!strcmp(cmd, "eval")) return tpd_cli_run(sub_argc, sub_argv, TPD_CLI_EVAL);
    if (!strcmp(cmd, "bench")) {
        for (int i = 2; i < argc; i++)
            if (!strcmp(argv[i], "--calibrate")) return tpd_cli_calibrate(sub_argc, sub_argv);
        return tpd_cli_run(sub_argc, sub_argv, TPD_CLI_BENCH);
    }
    if (!strcmp(cmd, "sweep")) return tpd_cli_sweep(sub_argc, sub_argv);
    if (!strcmp(cmd, "verify")) return tpd_cli_verify(sub_argc, sub_argv);
    if (!strcmp(cmd, "config")) return tpd_cli_config(sub_argc, sub_argv);
    if (!strcmp(cmd, "data")) return tpd_cli_data(sub_argc, sub_argv);
    if (!strcmp(cmd, "plan")) return tpd_cli_plan(sub_argc, sub_argv);
    if (!strcmp(cmd, "report")) return tpd_cli_report(sub_argc, sub_argv);
    if (!strcmp(cmd, "generate")) return tpd_cli_generate(sub_argc, sub_argv);
    if (!strcmp(cmd, "export") || !strcmp(cmd, "import") || !strcmp(cmd, "inspect"))
        return tpd_cli_ckpt(sub_argc, sub_argv);
    tpd_log_error("unknown command '%s'", cmd);
    usage(stderr);
    return TPD_EXIT_CONFIG;
}
