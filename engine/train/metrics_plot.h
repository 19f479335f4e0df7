/* `tripod report RUN`: pictures of a run from its JSONL metrics (logging.metrics_file).
 *
 * A resumed run appends to the same file, and may log again iterations it had logged
 * before it was stopped (it resumes from its last checkpoint): the segments are joined by
 * iteration, the latest record of an iteration winning, so the curve is the one the model
 * that exists now went through. gnuplot (gnuplot-nox) draws loss.png (train and
 * validation), lr.png, grad_norm.png and throughput.png (tokens/s and TFLOP/s per GPU). */
#ifndef TPD_ENGINE_TRAIN_METRICS_PLOT_H
#define TPD_ENGINE_TRAIN_METRICS_PLOT_H

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_report_point {
    int iteration;
    double lm_loss, val_loss, lr, grad_norm, tokens_per_s, tflops_per_gpu; /* NaN: absent */
    int line; /* 0-based record index in the file */
} tpd_report_point;

typedef struct tpd_report_run {
    char path[4096];     /* the metrics file read */
    tpd_report_point *p; /* by iteration, one per iteration */
    int n;
    int segments; /* 1 + the times the iteration went back (resumes that re-logged) */
    int records;  /* lines read */
} tpd_report_run;

/* path: a JSONL metrics file, or a folder holding metrics.jsonl (or exactly one
 * *.jsonl). A malformed line is an error naming the file and the line. */
tpd_status tpd_report_load(const char *path, tpd_report_run *run);
void tpd_report_free(tpd_report_run *run);

/* Writes out_dir/report.dat and its gnuplot script out_dir/report.gp, and, when gnuplot is
 * on PATH, runs it (no shell) for the four PNGs: *drawn_p = 1 only when gnuplot exited 0
 * and every PNG is there; a failed or silent gnuplot is TPD_ERR_IO. Without gnuplot
 * *drawn_p = 0 and the pictures can be drawn later with `gnuplot -c out_dir/report.gp
 * out_dir`. */
tpd_status tpd_report_draw(const tpd_report_run *run, const char *out_dir, int *drawn_p);

#ifdef __cplusplus
}
#endif
#endif
