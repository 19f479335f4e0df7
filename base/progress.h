/* Progress of long work on a terminal: "label: 45.2% | 123.4 of 273.0 MB | 12.3 MB/s |
 * elapsed 0:10 | ETA 0:12", redrawn in place on stderr at most four times a second.
 *
 * It shows only when stderr is a terminal, so logs and pipes stay quiet, and only for work
 * that lasts longer than a redraw; TRIPOD_PROGRESS=1 forces it on (and the final line
 * always), TRIPOD_PROGRESS=0 off. */
#ifndef TPD_BASE_PROGRESS_H
#define TPD_BASE_PROGRESS_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_progress {
    const char *label, *unit; /* "data prepare", "MB" */
    double total, scale;      /* units of work; raw counts are divided by scale */
    double t0, last_draw;     /* seconds of tpd_clock_s */
    int active;               /* 0 off, 1 on a terminal, 2 forced */
    int drawn;
    FILE *out;
} tpd_progress;

/* total and done are raw counts (bytes, tensors); shown as count / scale in `unit`. */
void tpd_progress_begin(tpd_progress *p, const char *label, double total, const char *unit,
                        double scale);
void tpd_progress_update(tpd_progress *p, double done);
/* Draws the final state and ends the line (when anything was drawn). */
void tpd_progress_end(tpd_progress *p, double done);

/* The line for done of total after elapsed seconds (pure; for the tests). */
void tpd_progress_format(char *buf, size_t cap, const char *label, double done, double total,
                         const char *unit, double scale, double elapsed_s);
/* "1:02:03", "2:03" or "0:05" for seconds; "?" when negative or not finite. */
void tpd_progress_hms(char *buf, size_t cap, double seconds);

#ifdef __cplusplus
}
#endif
#endif
