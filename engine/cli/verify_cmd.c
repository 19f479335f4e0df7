/* `tripod verify CONFIG.yaml [overrides] [--ranks N] [--steps K] [--out DIR] [--device D]`:
 * the config's layout rehearsed at tiny widths on cpu ranks, or on the cuda backend against
 * the cpu (engine/verify/verify.h). Exit codes: 0 every check passed, 1 a check failed,
 * 6 (TPD_EXIT_NO_GPU) --device cuda found no usable device and ran nothing, else the
 * failure's class (base/status.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "engine/cli/args.h"
#include "engine/cli/cli.h"
#include "engine/config/config.h"
#include "engine/verify/verify.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"

static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np N tripod verify CONFIG.yaml [section.key=value ...] [--ranks N]\n"
               "                     [--steps K] [--out DIR] [--cluster NAME|FILE]\n"
               "                     [--device cpu|cuda]\n"
               "  Rehearses the config's exact layout (TP, PP, DP, virtual stages, schedule, SP,\n"
               "  ZeRO-1, recompute, overlap, the stage split, every layer, the model family) at\n"
               "  tiny widths on cpu ranks, and checks it against one rank: the layers of every\n"
               "  stage, each rank's memory against the planner, K training steps (loss, grad\n"
               "  norm, parameters), and a checkpoint saved at the layout and resumed at it, on\n"
               "  one rank and on another layout. Exit code 0 only when every check passes.\n"
               "  --ranks N   ranks of the rehearsal (a multiple of TP x PP): shrinks DP\n"
               "              (default: the config's DP, else every rank of the job)\n"
               "  --steps K   training steps compared (default 3)\n"
               "  --out DIR   writes DIR/verify.json (the report) and DIR/verify-config.yaml\n"
               "  --cluster   planner profile for the real model's memory (default: h200, cpu\n"
               "              for training.device=cpu)\n"
               "  --device    cpu (default): the rehearsal above. cuda: the same shrunken layout\n"
               "              trains K steps on the cuda backend in bf16 and on the cpu in fp32\n"
               "              in the same job; losses, grad norms and parameters must stay\n"
               "              within budgets derived from bf16's rounding (printed). Without a\n"
               "              usable CUDA device it says so and exits 6, having run nothing.\n");
}

static const tpd_cli_opt k_opts[] = {{"--ranks", 1},   {"--steps", 1},  {"--out", 1},
                                     {"--cluster", 1}, {"--device", 1}, {NULL, 0}};

/* DIR/NAME with `text` in it; 0 on success */
static int write_out(const char *dir, const char *name, const tpd_config *small, const char *text) {
    char path[TPD_CONFIG_STR + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        tpd_log_error("verify: cannot write %s", path);
        return 1;
    }
    if (text)
        fputs(text, f);
    else
        tpd_config_print(small, f);
    return fclose(f) != 0;
}

/* --device cuda: 1 when some rank has no usable CUDA device (no cuda backend in this
 * build, the module does not load, or the runtime sees no device), which world rank 0 then
 * says in one line, with the reason. Collective over world. A device stand-in for the
 * tests (TPD_VERIFY_DEVICE_ENV) needs none. */
static int no_device(tpd_comm *world) {
    const char *stand = getenv(TPD_VERIFY_DEVICE_ENV);
    if (stand && !strcmp(stand, "cpu")) return 0;
    int32_t none = !tpd_kern_cuda_available();
    if (tpd_comm_allreduce(world, &none, &none, 1, TPD_DTYPE_I32, TPD_COMM_OP_MAX, NULL) != TPD_OK)
        none = 1;
    if (none && tpd_comm_rank(world) == 0) {
        const char *why = tpd_kern_cuda_unavailable_reason();
        printf("verify: NO GPU: no usable CUDA device (%s); --device cuda needs one, so nothing "
               "ran (exit code %d)\n",
               why && why[0] ? why : "another rank of the job has none", TPD_EXIT_NO_GPU);
        fflush(stdout);
    }
    return none;
}

int tpd_cli_verify(int argc, char **argv) {
    const char *cmd = argv[0];
    tpd_cli_args a;
    if (tpd_cli_args_parse(cmd, argc - 1, argv + 1, k_opts, &a) != TPD_OK) return TPD_EXIT_CONFIG;
    if (a.help) {
        usage(stdout);
        tpd_cli_args_free(&a);
        return TPD_EXIT_OK;
    }
    tpd_verify_options o = TPD_VERIFY_OPTIONS_INIT;
    const char *out = NULL;
    int rc = TPD_EXIT_OK;
    for (int i = 0; i < a.n_opts && rc == TPD_EXIT_OK; i++) {
        const char *n = a.opt_name[i], *v = a.opt_value[i];
        if (!strcmp(n, "--ranks") && tpd_cli_int(cmd, n, v, 1, 1 << 20, &o.ranks) != TPD_OK)
            rc = TPD_EXIT_CONFIG;
        if (!strcmp(n, "--steps") && tpd_cli_int(cmd, n, v, 1, 1000, &o.steps) != TPD_OK)
            rc = TPD_EXIT_CONFIG;
        if (!strcmp(n, "--out")) out = v;
        if (!strcmp(n, "--cluster")) o.cluster = v;
        if (!strcmp(n, "--device")) {
            if (!strcmp(v, "cuda")) {
                o.device = TPD_DEVICE_CUDA;
            } else if (strcmp(v, "cpu") != 0) {
                tpd_log_error("%s: --device %s: expected cpu or cuda", cmd, v);
                rc = TPD_EXIT_CONFIG;
            }
        }
    }
    tpd_comm *world = NULL;
    if (tpd_comm_mpi_start(&world) != TPD_OK) {
        tpd_cli_args_free(&a);
        return TPD_EXIT_COMM;
    }
    int me = tpd_comm_rank(world);
    tpd_log_set_rank(me, 0);
    tpd_config cfg;
    /* every rank loads and reports the same error before the first collective */
    if (rc == TPD_EXIT_OK && tpd_cli_args_load_config(cmd, &a, &cfg) != TPD_OK)
        rc = TPD_EXIT_CONFIG;
    if (rc == TPD_EXIT_OK && out && me == 0) {
        int e = 0;
        if (tpd_file_mkdirs(out, &e) != TPD_OK) {
            tpd_log_error("%s: --out %s: cannot create it: %s", cmd, out, strerror(e));
            rc = TPD_EXIT_CONFIG;
        }
    }
    int32_t worst = rc;
    if (tpd_comm_allreduce(world, &worst, &worst, 1, TPD_DTYPE_I32, TPD_COMM_OP_MAX, NULL) !=
        TPD_OK)
        worst = TPD_EXIT_COMM;
    if (worst != TPD_EXIT_OK) {
        tpd_cli_args_free(&a);
        tpd_comm_mpi_finish(world);
        return worst;
    }
    if (o.device == TPD_DEVICE_CUDA && no_device(world)) {
        tpd_cli_args_free(&a);
        tpd_comm_mpi_finish(world);
        return TPD_EXIT_NO_GPU;
    }
    /* the scratch directory: rank 0 names it, every rank uses it (one machine) */
    char scratch[TPD_CONFIG_STR];
    memset(scratch, 0, sizeof scratch);
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof scratch, "%s/tripod-verify-%ld", tmp && tmp[0] ? tmp : "/tmp",
             (long)getpid());
    tpd_comm_broadcast(world, scratch, sizeof scratch, TPD_DTYPE_U8, 0, NULL);
    o.scratch = scratch;
    tpd_comm_mpi_set_timeout(cfg.comm.timeout_s);
    tpd_verify_report *rep = calloc(1, sizeof *rep);
    tpd_status st = rep ? tpd_verify_run(&cfg, &o, world, rep) : TPD_ERR_NOMEM;
    int32_t verdict[2] = {0, 0}; /* rank 0's: passed, and the report written */
    if (st == TPD_OK && me == 0) {
        tpd_verify_print(stdout, rep);
        fflush(stdout);
        verdict[0] = rep->passed;
        verdict[1] = 1;
        if (out) {
            char *json = tpd_verify_json(rep);
            if (!json || write_out(out, "verify.json", NULL, json) ||
                write_out(out, "verify-config.yaml", &rep->small, NULL))
                verdict[1] = 0;
            free(json);
        }
    }
    /* every rank leaves with rank 0's verdict */
    if (st == TPD_OK && tpd_comm_broadcast(world, verdict, 2, TPD_DTYPE_I32, 0, NULL) != TPD_OK)
        st = TPD_ERR_COMM;
    rc = st != TPD_OK  ? tpd_status_exit_code(st)
         : !verdict[1] ? TPD_EXIT_FAILURE
         : verdict[0]  ? TPD_EXIT_OK
                       : TPD_EXIT_FAILURE;
    free(rep);
    tpd_cli_args_free(&a);
    if (st != TPD_OK && st != TPD_ERR_INVALID && tpd_comm_size(world) > 1)
        tpd_comm_mpi_abort_job(rc);
    tpd_comm_mpi_finish(world);
    return rc;
}
