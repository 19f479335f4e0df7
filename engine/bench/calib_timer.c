/* The calibration's timer and its fit: leaves that calibrate.c (kernels) and
 * calibrate_comm.c (collectives) both build on. */
#include "engine/bench/calib_timer.h"

#include <math.h>
#include <stdlib.h>

#include "base/clock.h"

tpd_status tpd_calib_time(tpd_comm *world, const tpd_calib_options *opt, tpd_calib_fn fn, void *arg,
                          double *t_p) {
    TPD_CHECK(tpd_comm_barrier(world));
    TPD_CHECK(fn(arg)); /* warm caches and lazily allocated scratch */
    double t0 = tpd_clock_s();
    TPD_CHECK(fn(arg));
    double slowest = tpd_clock_s() - t0;
    TPD_CHECK(
        tpd_comm_allreduce(world, &slowest, &slowest, 1, TPD_DTYPE_F64, TPD_COMM_OP_MAX, NULL));
    int reps = slowest > 0 ? (int)(opt->budget_s / slowest) : 1000;
    if (reps < opt->min_reps) reps = opt->min_reps;
    if (reps > 1000) reps = 1000;
    /* From a common start to a common end: ranks that share a core take turns in
     * scheduler time slices, and a rank alone on its core for its whole loop would
     * otherwise time itself at full speed. The window sees the share. */
    TPD_CHECK(tpd_comm_barrier(world));
    double a = tpd_clock_s();
    for (int i = 0; i < reps; i++)
        TPD_CHECK(fn(arg));
    TPD_CHECK(tpd_comm_barrier(world));
    double sum = (tpd_clock_s() - a) / reps;
    TPD_CHECK(tpd_comm_allreduce(world, &sum, &sum, 1, TPD_DTYPE_F64, TPD_COMM_OP_SUM, NULL));
    *t_p = sum / tpd_comm_size(world);
    return TPD_OK;
}

int tpd_calib_fit(const double *x, const double *y, const double *t, int n, double *inv_bw_p,
                  double *lat_p) {
    double sxx = 0, sxy = 0, syy = 0, sxt = 0, syt = 0;
    int used = 0;
    for (int i = 0; i < n; i++) {
        if (!(t[i] > 0)) continue;
        double w = 1.0 / (t[i] * t[i]);
        sxx += w * x[i] * x[i];
        sxy += w * x[i] * y[i];
        syy += w * y[i] * y[i];
        sxt += w * x[i] * t[i];
        syt += w * y[i] * t[i];
        used++;
    }
    if (used < 2) return 0;
    double det = sxx * syy - sxy * sxy, a = 0, b = 0;
    if (fabs(det) > 1e-30 * (sxx * syy + 1e-300)) {
        a = (sxt * syy - syt * sxy) / det;
        b = (syt * sxx - sxt * sxy) / det;
    }
    /* Keep both terms physical: refit the other alone when one comes out negative. */
    if (a <= 0 || fabs(det) <= 1e-30 * (sxx * syy + 1e-300)) {
        a = sxx > 0 && sxt > 0 ? 1e-15 : 1e-15;
        b = syy > 0 ? (syt - a * sxy) / syy : 0;
    }
    if (b < 0) {
        b = 0;
        a = sxx > 0 ? sxt / sxx : 1e-15;
    }
    if (a <= 0) a = 1e-15;
    *inv_bw_p = a;
    *lat_p = b;
    return 1;
}
