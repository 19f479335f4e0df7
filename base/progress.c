/* Progress lines on a terminal. */
#include "base/progress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"

#define PROGRESS_PERIOD_S 0.25

void tpd_progress_hms(char *buf, size_t cap, double s) {
    if (!(s >= 0) || !isfinite(s) || s > 1e9) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

void tpd_progress_format(char *buf, size_t cap, const char *label, double done, double total,
                         const char *unit, double scale, double elapsed_s) {
    double rate = elapsed_s > 0 ? done / elapsed_s : 0;
    char el[32], eta[32];
    tpd_progress_hms(el, sizeof el, elapsed_s);
    tpd_progress_hms(eta, sizeof eta, rate > 0 ? (total - done) / rate : -1);
    double pct = total > 0 ? 100.0 * done / total : 0;
    snprintf(buf, cap, "%s: %5.1f%% | %.1f of %.1f %s | %.1f %s/s | elapsed %s | ETA %s", label,
             pct, done / scale, total / scale, unit, rate / scale, unit, el, eta);
}

/* 1 on a terminal, 2 when forced by TRIPOD_PROGRESS=1, 0 off */
static int enabled(void) {
    const char *e = getenv("TRIPOD_PROGRESS");
    if (e && e[0]) return strcmp(e, "0") != 0 ? 2 : 0;
    return isatty(STDERR_FILENO);
}

void tpd_progress_begin(tpd_progress *p, const char *label, double total, const char *unit,
                        double scale) {
    memset(p, 0, sizeof *p);
    p->label = label;
    p->unit = unit;
    p->total = total;
    p->scale = scale > 0 ? scale : 1;
    p->t0 = tpd_clock_s();
    p->last_draw = p->t0;
    p->active = enabled();
    p->out = stderr;
}

static void draw(tpd_progress *p, double done, double now) {
    char line[256];
    tpd_progress_format(line, sizeof line, p->label, done, p->total, p->unit, p->scale,
                        now - p->t0);
    fprintf(p->out, "\r%s\033[K", line); /* erase what a longer line left */
    fflush(p->out);
    p->drawn = 1;
    p->last_draw = now;
}

void tpd_progress_update(tpd_progress *p, double done) {
    if (!p->active) return;
    double now = tpd_clock_s();
    if (now - p->last_draw >= PROGRESS_PERIOD_S) draw(p, done, now);
}

void tpd_progress_end(tpd_progress *p, double done) {
    /* work shorter than a redraw period leaves a terminal alone, unless forced */
    if (!p->active || (!p->drawn && p->active != 2)) return;
    draw(p, done, tpd_clock_s());
    fputc('\n', p->out);
    fflush(p->out);
}
