/* The calibration's leaves: timing a call on every rank at once, and fitting latency and
 * bandwidth to the timings. calibrate.c and calibrate_comm.c both build on them. */
#ifndef TPD_ENGINE_BENCH_CALIB_TIMER_H
#define TPD_ENGINE_BENCH_CALIB_TIMER_H

#include "engine/bench/calibrate.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef tpd_status (*tpd_calib_fn)(void *arg);

/* Seconds per call of fn: every rank of `world` runs it at once, the same number of
 * times (enough for opt->budget_s on the slowest rank), between two barriers; the
 * window over the calls, averaged over ranks (the same on every rank). Collective. */
tpd_status tpd_calib_time(tpd_comm *world, const tpd_calib_options *opt, tpd_calib_fn fn, void *arg,
                          double *t_p);

/* Least-squares fit of t = x * inv_bw + y * lat with relative weights (1/t^2), both
 * coefficients kept >= 0. Returns 0 when there are fewer than two usable points. */
int tpd_calib_fit(const double *x, const double *y, const double *t, int n, double *inv_bw_p,
                  double *lat_p);

#ifdef __cplusplus
}
#endif
#endif
