/* Run reports: JSONL metrics joined over resumes, drawn by gnuplot when it is installed.
 * Each line is read whole, as engine/data/jsonl.h says. */
#include "engine/train/metrics_plot.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/spawn.h"
#include "engine/data/jsonl.h"

#define REPORT_MAX_LINE (1 << 20)

/* The metrics file of a folder: metrics.jsonl, else its only *.jsonl. */
static tpd_status find_metrics(const char *dir, char *out, size_t cap) {
    snprintf(out, cap, "%s/metrics.jsonl", dir);
    struct stat sb;
    if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode)) return TPD_OK;
    DIR *d = opendir(dir);
    if (!d) {
        tpd_log_error("report: cannot open the folder '%s': %s", dir, strerror(errno));
        return TPD_ERR_IO;
    }
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 6 && !strcmp(e->d_name + n - 6, ".jsonl")) {
            if (found++ == 0) snprintf(out, cap, "%s/%s", dir, e->d_name);
        }
    }
    closedir(d);
    if (found == 1) return TPD_OK;
    tpd_log_error("report: '%s' holds %s; give the metrics file (logging.metrics_file)", dir,
                  found ? "several .jsonl files" : "no metrics.jsonl and no .jsonl file");
    return TPD_ERR_INVALID;
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = tpd_jsonl_get(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int by_iteration_latest(const void *a, const void *b) {
    const tpd_report_point *x = a, *y = b;
    if (x->iteration != y->iteration) return (x->iteration > y->iteration) ? 1 : -1;
    return (x->line < y->line) - (x->line > y->line);
}

tpd_status tpd_report_load(const char *path, tpd_report_run *run) {
    memset(run, 0, sizeof *run);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        tpd_log_error("report: '%s': %s", path, strerror(errno));
        return TPD_ERR_IO;
    }
    if (S_ISDIR(sb.st_mode))
        TPD_CHECK(find_metrics(path, run->path, sizeof run->path));
    else
        snprintf(run->path, sizeof run->path, "%s", path);
    int err;
    FILE *f = tpd_file_fopen_read(run->path, &err);
    if (!f) {
        tpd_log_error("report: cannot open '%s': %s", run->path, tpd_file_strerror(err));
        return TPD_ERR_IO;
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    tpd_status st = TPD_OK;
    int cap = 0, last = -1;
    run->segments = 1;
    while ((len = getline(&line, &line_cap, f)) >= 0) {
        run->records++;
        if (line[0] == '\n') continue;
        if (len > REPORT_MAX_LINE) {
            st = tpd_fail(TPD_ERR_FORMAT, "report: %s:%d: a line of %zd bytes, more than %d",
                          run->path, run->records, len, REPORT_MAX_LINE);
            break;
        }
        cJSON *o = NULL;
        st = tpd_jsonl_parse(run->path, (size_t)run->records, line, (size_t)len, &o);
        if (st != TPD_OK) break;
        double it = num(o, "iteration");
        if (!cJSON_IsObject(o) || !(it >= 0) || it > 2e9 || it != floor(it)) {
            cJSON_Delete(o);
            tpd_log_error("report: %s:%d: not a metrics record (a JSON object with an "
                          "integer \"iteration\")",
                          run->path, run->records);
            st = TPD_ERR_FORMAT;
            break;
        }
        if (run->n == cap) {
            cap = cap ? 2 * cap : 256;
            tpd_report_point *p = realloc(run->p, (size_t)cap * sizeof *p);
            if (!p) {
                cJSON_Delete(o);
                st = TPD_ERR_NOMEM;
                break;
            }
            run->p = p;
        }
        if ((int)it <= last) run->segments++;
        last = (int)it;
        run->p[run->n++] = (tpd_report_point){.iteration = (int)it,
                                              .lm_loss = num(o, "lm_loss"),
                                              .val_loss = num(o, "val_loss"),
                                              .lr = num(o, "lr"),
                                              .grad_norm = num(o, "grad_norm"),
                                              .tokens_per_s = num(o, "tokens_per_s"),
                                              .tflops_per_gpu = num(o, "tflops_per_gpu")};
        cJSON_Delete(o);
    }
    if (st == TPD_OK && ferror(f))
        st = tpd_fail(errno == ENOMEM ? TPD_ERR_NOMEM : TPD_ERR_IO, "report: reading %s: %s",
                      run->path, strerror(errno));
    free(line);
    fclose(f);
    if (st == TPD_OK && run->n == 0) {
        tpd_log_error("report: %s holds no metrics records", run->path);
        st = TPD_ERR_FORMAT;
    }
    if (st != TPD_OK) {
        tpd_report_free(run);
        return st;
    }
    /* later segments win: sort by iteration, the latest line first, and keep the first of
     * each iteration */
    for (int i = 0; i < run->n; i++)
        run->p[i].line = i;
    qsort(run->p, (size_t)run->n, sizeof *run->p, by_iteration_latest);
    int k = 0;
    for (int i = 0; i < run->n; i++)
        if (k == 0 || run->p[k - 1].iteration != run->p[i].iteration) run->p[k++] = run->p[i];
    run->n = k;
    return TPD_OK;
}

void tpd_report_free(tpd_report_run *run) {
    free(run->p);
    run->p = NULL;
    run->n = 0;
}

static void put(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, " %.9g", v);
    else
        fputs(" NaN", f);
}

tpd_status tpd_report_draw(const tpd_report_run *run, const char *out_dir, int *drawn_p) {
    int e = 0;
    if (tpd_file_mkdirs(out_dir, &e) != TPD_OK) {
        tpd_log_error("report: cannot create '%s': %s", out_dir, strerror(e));
        return TPD_ERR_IO;
    }
    char dat[4200];
    snprintf(dat, sizeof dat, "%s/report.dat", out_dir);
    FILE *f = fopen(dat, "w");
    if (!f) {
        tpd_log_error("report: cannot create '%s': %s", dat, strerror(errno));
        return TPD_ERR_IO;
    }
    fprintf(f, "# iteration lm_loss val_loss lr grad_norm tokens_per_s tflops_per_gpu\n");
    for (int i = 0; i < run->n; i++) {
        const tpd_report_point *p = &run->p[i];
        fprintf(f, "%d", p->iteration);
        put(f, p->lm_loss);
        put(f, p->val_loss);
        put(f, p->lr);
        put(f, p->grad_norm);
        put(f, p->tokens_per_s);
        put(f, p->tflops_per_gpu);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        tpd_log_error("report: writing '%s' failed", dat);
        return TPD_ERR_IO;
    }
    /* The script is kept beside the data, so the pictures can be drawn (or restyled)
     * where gnuplot is installed. It holds no path: the folder and the title come in as
     * ARG1 and ARG2 of `gnuplot -c`, so a quote or a ';' in a folder's name stays text
     * (gnuplot runs shell commands of its own: `!cmd`, system(), backquotes). */
    char gp[4200];
    snprintf(gp, sizeof gp, "%s/report.gp", out_dir);
    FILE *g = fopen(gp, "w");
    if (!g) {
        tpd_log_error("report: cannot create '%s': %s", gp, strerror(errno));
        return TPD_ERR_IO;
    }
    /* gnuplot reads NaN as a missing point; validation points are drawn as points */
    fputs("# gnuplot -c report.gp DIR [TITLE]; without arguments DIR is the current folder\n"
          "dir = ARGC >= 1 ? ARG1 : '.'\n"
          "run = ARGC >= 2 ? ARG2 : dir\n"
          "dat = dir.'/report.dat'\n"
          "set terminal pngcairo size 900,540 noenhanced\n"
          "set datafile missing 'NaN'\nset grid\nset key top right\n"
          "set xlabel 'iteration'\n"
          "set output dir.'/loss.png'\nset title 'loss: '.run\nset ylabel 'lm loss'\n"
          "plot dat using 1:2 with lines lw 2 title 'train', "
          "'' using 1:3 with linespoints pt 7 title 'validation'\n"
          "set output dir.'/lr.png'\nset title 'learning rate'\nset ylabel 'lr'\n"
          "plot dat using 1:4 with lines lw 2 notitle\n"
          "set output dir.'/grad_norm.png'\nset title 'gradient norm'\nset ylabel 'grad norm'\n"
          "plot dat using 1:5 with lines lw 2 notitle\n"
          "set output dir.'/throughput.png'\nset title 'throughput'\n"
          "set ylabel 'tokens/s'\nset y2label 'TFLOP/s per GPU'\nset ytics nomirror\n"
          "set y2tics\nplot dat using 1:6 with lines lw 2 title 'tokens/s', "
          "'' using 1:7 axes x1y2 with lines lw 2 dt 2 title 'TFLOP/s per GPU'\n"
          "unset output\n",
          g);
    if (fclose(g) != 0) {
        tpd_log_error("report: writing '%s' failed", gp);
        return TPD_ERR_IO;
    }
    *drawn_p = 0;
    if (!tpd_file_on_path("gnuplot")) return TPD_OK;
    const char *argv[] = {"gnuplot", "-c", gp, out_dir, run->path, NULL};
    int code = 0;
    TPD_CHECK(tpd_spawn_run(argv, &code));
    if (code != 0) {
        tpd_log_error("report: gnuplot -c '%s' exited with status %d; no picture was drawn", gp,
                      code);
        return TPD_ERR_IO;
    }
    /* A zero exit is not proof: each picture must be there before it is announced. */
    static const char *const k_png[] = {"loss", "lr", "grad_norm", "throughput"};
    for (size_t i = 0; i < sizeof k_png / sizeof k_png[0]; i++) {
        char png[4200];
        snprintf(png, sizeof png, "%s/%s.png", out_dir, k_png[i]);
        struct stat sb;
        if (stat(png, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0) {
            tpd_log_error("report: gnuplot -c '%s' exited 0 but did not write '%s'", gp, png);
            return TPD_ERR_IO;
        }
    }
    *drawn_p = 1;
    return TPD_OK;
}
