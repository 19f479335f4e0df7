/* `tripod sweep`: argument parsing, MPI set-up, the run and the outputs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/bench/sweep.h"
#include "engine/cli/args.h"
#include "engine/cli/cli.h"
#include "engine/cli/overwrite.h"
#include "parallel/comm.h"

static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np WORLD tripod sweep CONFIG.yaml [section.key=value ...]\n"
               "           --tp 1,2,4 --pp 1,2,4 [--mbs 1,2,4] [--zero 0,1] [--sp 0,1]\n"
               "           [--recompute none,selective,full] [--vp 1,2] [--schedule 1f1b,zb-h1]\n"
               "           [--overlap 0,1] [--steps N] [--warmup W]\n"
               "           [--out DIR [--force]] [--cluster NAME|FILE] [--no-plot] [--no-traces]\n"
               "  Every TP x PP (x mbs x ZeRO x SP x recompute x vp x schedule x overlap) layout\n"
               "  runs on the whole world, DP = WORLD/(TP*PP); sequence parallel applies where\n"
               "  TP > 1. --vp: virtual stages (> 1 runs interleaved); --schedule: 1f1b,\n"
               "  interleaved, zb-h1; --overlap: parallel.overlap_grad_reduce and\n"
               "  overlap_param_gather off (0) or on (1). Each runs\n"
               "  beside the planner's prediction (--cluster, default cpu; a profile from\n"
               "  `tripod bench --calibrate` makes it predict this machine). Writes\n"
               "  DIR/summary.csv, failed.csv, summary.json, sweep.png and per-layout real and\n"
               "  predicted traces (default DIR: sweep_out; an earlier sweep's files there are\n"
               "  kept unless --force). Defaults: --steps 5 --warmup 2. Exits non-zero when no\n"
               "  layout runs.\n");
}

/* "1,2,4" into v (positive, at most TPD_SWEEP_MAX_VALUES); allow0 lets 0 through. */
static int parse_list(const char *flag, const char *s, int *v, int *n_p, int allow0) {
    return tpd_cli_int_list("sweep", flag, s, allow0 ? 0 : 1, 1 << 20, 1, TPD_SWEEP_MAX_VALUES, v,
                            n_p) == TPD_OK;
}

/* "0", "1" or "0,1" into v (2 entries). */
static int parse_switch(const char *flag, const char *s, int *v, int *n_p) {
    int z[TPD_SWEEP_MAX_VALUES], nz = 0;
    int ok = parse_list(flag, s, z, &nz, 1);
    for (int k = 0; ok && k < nz; k++)
        ok = z[k] <= 1 && (k == 0 || z[k] != z[0]);
    if (ok && nz > 2) ok = 0;
    if (!ok) {
        tpd_log_error("sweep: %s '%s' must be 0, 1 or 0,1", flag, s);
        return 0;
    }
    for (int k = 0; k < nz; k++)
        v[k] = z[k];
    *n_p = nz;
    return 1;
}

/* "none,selective,full" (any of them, once each) into training.recompute values. */
static int parse_recompute(const char *s, tpd_recompute *v, int *n_p) {
    int n = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int code = tpd_config_choice_value("training.recompute", tok);
        for (int k = 0; k < n; k++)
            if ((int)v[k] == code) code = -1;
        if (code < 0 || n == 3) {
            tpd_log_error("sweep: --recompute '%s' must list none, selective and full, each "
                          "at most once",
                          s);
            return 0;
        }
        v[n++] = (tpd_recompute)code;
    }
    *n_p = n;
    return n > 0;
}

/* "1f1b,zb-h1" (parallel.pipeline_schedule choices, once each) into v. */
static int parse_schedule(const char *s, tpd_schedule *v, int *n_p) {
    int n = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int code = tpd_config_choice_value("parallel.pipeline_schedule", tok);
        for (int k = 0; k < n; k++)
            if ((int)v[k] == code) code = -1;
        if (code < 0 || n == 3) {
            tpd_log_error("sweep: --schedule '%s' must list 1f1b, interleaved and zb-h1, each "
                          "at most once",
                          s);
            return 0;
        }
        v[n++] = (tpd_schedule)code;
    }
    *n_p = n;
    return n > 0;
}

static const tpd_cli_opt k_opts[] = {
    {"--no-plot", 0}, {"--no-traces", 0}, {"--tp", 1},        {"--pp", 1},       {"--mbs", 1},
    {"--zero", 1},    {"--sp", 1},        {"--recompute", 1}, {"--steps", 1},    {"--warmup", 1},
    {"--out", 1},     {"--cluster", 1},   {"--vp", 1},        {"--schedule", 1}, {"--overlap", 1},
    {"--force", 0},   {NULL, 0}};

/* The options into o. Returns 1 to run, 0 for --help, -1 on a bad argument. */
static int parse_opts(const tpd_cli_args *a, tpd_sweep_options *o, int *force) {
    if (a->help) {
        usage(stdout);
        return 0;
    }
    for (int i = 0; i < a->n_opts; i++) {
        const char *s = a->opt_name[i], *val = a->opt_value[i];
        int ok = 1;
        if (!strcmp(s, "--no-plot"))
            o->plot = 0;
        else if (!strcmp(s, "--force"))
            *force = 1;
        else if (!strcmp(s, "--no-traces"))
            o->traces = 0;
        else if (!strcmp(s, "--tp"))
            ok = parse_list(s, val, o->tp, &o->n_tp, 0);
        else if (!strcmp(s, "--pp"))
            ok = parse_list(s, val, o->pp, &o->n_pp, 0);
        else if (!strcmp(s, "--mbs"))
            ok = parse_list(s, val, o->mbs, &o->n_mbs, 0);
        else if (!strcmp(s, "--zero"))
            ok = parse_switch(s, val, o->zero, &o->n_zero);
        else if (!strcmp(s, "--sp"))
            ok = parse_switch(s, val, o->sp, &o->n_sp);
        else if (!strcmp(s, "--recompute"))
            ok = parse_recompute(val, o->recompute, &o->n_recompute);
        else if (!strcmp(s, "--vp"))
            ok = parse_list(s, val, o->vp, &o->n_vp, 0);
        else if (!strcmp(s, "--schedule"))
            ok = parse_schedule(val, o->schedule, &o->n_schedule);
        else if (!strcmp(s, "--overlap"))
            ok = parse_switch(s, val, o->overlap, &o->n_overlap);
        else if (!strcmp(s, "--steps"))
            ok = tpd_cli_int("sweep", s, val, 1, TPD_SWEEP_MAX_STEPS, &o->steps) == TPD_OK;
        else if (!strcmp(s, "--warmup"))
            ok = tpd_cli_int("sweep", s, val, 0, TPD_SWEEP_MAX_STEPS, &o->warmup) == TPD_OK;
        else if (!strcmp(s, "--out"))
            snprintf(o->out_dir, sizeof o->out_dir, "%s", val);
        else if (!strcmp(s, "--cluster"))
            snprintf(o->cluster, sizeof o->cluster, "%s", val);
        if (!ok) return -1;
    }
    if (!a->config) {
        tpd_log_error("sweep: missing CONFIG.yaml");
        usage(stderr);
        return -1;
    }
    return 1;
}

int tpd_cli_sweep(int argc, char **argv) {
    tpd_sweep_options o = TPD_SWEEP_OPTIONS_INIT;
    tpd_cli_args a;
    if (tpd_cli_args_parse("sweep", argc - 1, argv + 1, k_opts, &a) != TPD_OK)
        return TPD_EXIT_CONFIG;
    int force = 0;
    int rc = parse_opts(&a, &o, &force);
    if (rc <= 0) {
        tpd_cli_args_free(&a);
        return rc == 0 ? TPD_EXIT_OK : TPD_EXIT_CONFIG;
    }
    tpd_comm *world = NULL;
    tpd_sweep_result res;
    memset(&res, 0, sizeof res);
    tpd_status st = tpd_comm_mpi_start(&world);
    if (st != TPD_OK) {
        tpd_cli_args_free(&a);
        return TPD_EXIT_COMM;
    }
    int me = tpd_comm_rank(world);
    tpd_log_set_rank(me, me == 0);
    o.verbose = me == 0;
    /* Before any trial runs: an earlier sweep's results are kept unless --force. */
    char outs[4][TPD_CONFIG_STR + 16];
    const char *names[4] = {"summary.csv", "failed.csv", "summary.json", "sweep.png"};
    const char *out_paths[4];
    for (int i = 0; i < 4; i++) {
        snprintf(outs[i], sizeof outs[i], "%s/%s", o.out_dir, names[i]);
        out_paths[i] = outs[i];
    }
    st = tpd_cli_refuse_overwrite(world, "sweep", out_paths, 4, force, "--out DIR");
    if (st != TPD_OK) {
        tpd_cli_args_free(&a);
        tpd_comm_mpi_finish(world);
        return tpd_status_exit_code(st);
    }
    if (me == 0)
        printf("sweep: %d layouts x %d steps (+%d warm-up) on %d ranks, planner profile "
               "'%s'\n",
               o.n_tp * o.n_pp * (o.n_mbs ? o.n_mbs : 1) * (o.n_zero ? o.n_zero : 1) *
                   (o.n_sp ? o.n_sp : 1) * (o.n_recompute ? o.n_recompute : 1) *
                   (o.n_vp ? o.n_vp : 1) * (o.n_schedule ? o.n_schedule : 1) *
                   (o.n_overlap ? o.n_overlap : 1),
               o.steps, o.warmup, tpd_comm_size(world), o.cluster);
    st = tpd_sweep_run(a.config, a.n_overrides, a.overrides, world, &o, &res);
    tpd_cli_args_free(&a);
    if (st == TPD_OK && me == 0) {
        st = tpd_sweep_write(&res, &o);
        /* A sweep that measured nothing is no result, whatever it wrote. */
        if (st == TPD_OK && res.best < 0)
            st = tpd_fail(TPD_ERR_INVALID,
                          "sweep: none of the %d layouts ran successfully; the reasons are in "
                          "%s/failed.csv",
                          res.n, o.out_dir);
        char line[512];
        tpd_sweep_best_line(&res, line, sizeof line);
        printf("%s\n", line);
        printf("sweep: %d trials in %.1f s; results in %s/summary.csv, failed.csv, "
               "summary.json\n",
               res.n, res.wall_s, o.out_dir);
        fflush(stdout);
    }
    tpd_sweep_result_free(&res);
    /* Every rank leaves with rank 0's verdict on the outputs. */
    int32_t code = (int32_t)st;
    if (tpd_comm_broadcast(world, &code, 1, TPD_DTYPE_I32, 0, NULL) != TPD_OK) code = TPD_ERR_COMM;
    tpd_comm_mpi_finish(world);
    return tpd_status_exit_code((tpd_status)code);
}
