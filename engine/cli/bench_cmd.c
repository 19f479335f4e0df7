/* `tripod bench --calibrate`: measures this machine into a cluster profile. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/file.h"
#include "engine/bench/calibrate.h"
#include "engine/cli/args.h"
#include "engine/cli/cli.h"
#include "engine/cli/overwrite.h"
#include "engine/plan/plan.h"
#include "parallel/comm.h"

static const tpd_cli_opt k_opts[] = {{"--calibrate", 0}, {"--out", 1},   {"--name", 1},
                                     {"--budget-ms", 1}, {"--force", 0}, {NULL, 0}};

int tpd_cli_calibrate(int argc, char **argv) {
    const char *cmd = "bench --calibrate";
    tpd_calib_options o = TPD_CALIB_OPTIONS_INIT;
    tpd_cli_args a;
    if (tpd_cli_args_parse(cmd, argc - 1, argv + 1, k_opts, &a) != TPD_OK) return TPD_EXIT_CONFIG;
    int rc = TPD_EXIT_OK;
    const char *out = NULL;
    int force = 0;
    for (int i = 0; i < a.n_opts && rc == TPD_EXIT_OK; i++) {
        const char *n = a.opt_name[i], *v = a.opt_value[i];
        double ms;
        if (!strcmp(n, "--out"))
            out = v;
        else if (!strcmp(n, "--force"))
            force = 1;
        else if (!strcmp(n, "--name"))
            snprintf(o.name, sizeof o.name, "%s", v);
        else if (!strcmp(n, "--budget-ms")) {
            if (tpd_cli_double(cmd, n, v, 1e-3, 1e5, &ms) != TPD_OK)
                rc = TPD_EXIT_CONFIG;
            else
                o.budget_s = ms / 1e3;
        }
    }
    if (a.help) {
        printf("usage: tripod bench --calibrate --out PROFILE.yaml [CONFIG.yaml] [key=value ...]\n"
               "                    [--name NAME] [--budget-ms MS] [--force]\n"
               "  Measures kernels at the model's shapes, collectives and p2p on every rank\n"
               "  of the job, and writes a cpu cluster profile for tripod plan and sweep (an\n"
               "  existing PROFILE.yaml is kept unless --force).\n");
        tpd_cli_args_free(&a);
        return TPD_EXIT_OK;
    }
    if (rc == TPD_EXIT_OK && !out) {
        tpd_log_error("%s: --out PROFILE.yaml is required", cmd);
        rc = TPD_EXIT_CONFIG;
    }
    /* Without a config, the demo model's shapes. */
    char demo[TPD_CONFIG_STR];
    const char *config = a.config;
    if (!config) {
        snprintf(demo, sizeof demo, "%s/configs/demo.yaml", tpd_source_dir());
        config = demo;
    }
    tpd_config cfg;
    if (rc == TPD_EXIT_OK && tpd_config_load(config, a.n_overrides, a.overrides, &cfg) != TPD_OK)
        rc = TPD_EXIT_CONFIG;
    tpd_cli_args_free(&a);
    if (rc != TPD_EXIT_OK) return rc;
    if (!o.name[0]) {
        const char *b = strrchr(out, '/');
        snprintf(o.name, sizeof o.name, "%s", b ? b + 1 : out);
        char *dot = strrchr(o.name, '.');
        if (dot) *dot = '\0';
    }
    tpd_comm *world = NULL;
    tpd_plan_cluster c;
    char *notes = NULL;
    tpd_status st = tpd_comm_mpi_start(&world);
    if (st != TPD_OK) return TPD_EXIT_COMM;
    int me = tpd_comm_rank(world);
    tpd_log_set_rank(me, me == 0);
    o.verbose = me == 0;
    /* Before the measurement: an earlier profile is kept unless --force. */
    st = tpd_cli_refuse_overwrite(world, cmd, &out, 1, force, "--out PROFILE.yaml");
    if (st != TPD_OK) {
        tpd_comm_mpi_finish(world);
        return tpd_status_exit_code(st);
    }
    double t0 = tpd_clock_s();
    st = tpd_calib_run(&cfg, world, &o, &c, &notes);
    if (st == TPD_OK && me == 0) {
        char head[1 << 16];
        snprintf(head, sizeof head,
                 "Calibrated by `tripod bench --calibrate` in %.1f s with %d ranks.\n"
                 "Use it with: tripod plan CONFIG --cluster %s, tripod sweep ... --cluster %s\n"
                 "%s",
                 tpd_clock_s() - t0, tpd_comm_size(world), out, out, notes ? notes : "");
        st = tpd_plan_cluster_save(&c, out, head);
        if (st == TPD_OK)
            printf("calibrate: peak %.2f GFLOP/s per rank, streaming %.2f GB/s, all-reduce "
                   "%.2f GB/s + %.1f us, p2p %.2f GB/s + %.1f us -> %s\n",
                   c.peak_flops / 1e9, c.hbm_bw / 1e9, c.intra_bw / 1e9, c.intra_latency * 1e6,
                   c.p2p_bw / 1e9, c.p2p_latency * 1e6, out);
    }
    /* every rank leaves with rank 0's verdict on the profile */
    int32_t code = (int32_t)st;
    if (tpd_comm_broadcast(world, &code, 1, TPD_DTYPE_I32, 0, NULL) != TPD_OK) code = TPD_ERR_COMM;
    free(notes);
    tpd_comm_mpi_finish(world);
    return tpd_status_exit_code((tpd_status)code);
}
