/* `tripod report RUN [--out DIR]`: pictures of a run from its metrics file. */
#include <stdio.h>
#include <string.h>

#include "engine/cli/args.h"
#include "engine/cli/cli.h"
#include "engine/train/metrics_plot.h"

static void usage(FILE *f) {
    fprintf(f, "usage: tripod report METRICS.jsonl|RUN_DIR [--out DIR]\n"
               "  draws loss.png (train and validation), lr.png, grad_norm.png and\n"
               "  throughput.png with gnuplot from a run's logging.metrics_file; a resumed\n"
               "  run's segments join into one curve. DIR defaults to the metrics file's\n"
               "  folder + /report.\n");
}

static const tpd_cli_opt k_opts[] = {{"--out", 1}, {NULL, 0}};

int tpd_cli_report(int argc, char **argv) {
    tpd_cli_args a;
    if (tpd_cli_args_parse_path("report", argc - 1, argv + 1, k_opts, &a) != TPD_OK) {
        usage(stderr);
        return TPD_EXIT_CONFIG;
    }
    const char *run = a.config, *out = a.n_opts ? a.opt_value[a.n_opts - 1] : NULL;
    int help = a.help;
    tpd_cli_args_free(&a); /* run and out point into argv */
    if (help || !run) {
        usage(help ? stdout : stderr);
        return help ? TPD_EXIT_OK : TPD_EXIT_CONFIG;
    }
    tpd_report_run r;
    tpd_status st = tpd_report_load(run, &r);
    if (st != TPD_OK) return tpd_status_exit_code(st);
    char dir[4200];
    if (out) {
        snprintf(dir, sizeof dir, "%s", out);
    } else {
        const char *slash = strrchr(r.path, '/');
        if (slash)
            snprintf(dir, sizeof dir, "%.*s/report", (int)(slash - r.path), r.path);
        else
            snprintf(dir, sizeof dir, "report");
    }
    int drawn = 0;
    st = tpd_report_draw(&r, dir, &drawn);
    if (st == TPD_OK) {
        printf("report: %s: %d iterations (%d to %d) from %d record%s in %d segment%s -> ", r.path,
               r.n, r.p[0].iteration, r.p[r.n - 1].iteration, r.records, r.records == 1 ? "" : "s",
               r.segments, r.segments == 1 ? "" : "s");
        /* drawn is 1 only when gnuplot exited 0 and every picture is on disk */
        if (drawn)
            printf("drew %s/{loss,lr,grad_norm,throughput}.png\n", dir);
        else
            printf("%s/report.dat; gnuplot is not on PATH (Debian: gnuplot-nox), draw the "
                   "pictures with: gnuplot -c %s/report.gp %s\n",
                   dir, dir, dir);
    }
    tpd_report_free(&r);
    return tpd_status_exit_code(st);
}
