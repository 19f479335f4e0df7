/* Shared by calibrate.c (kernels, profile) and calibrate_comm.c (collectives). */
#ifndef TPD_ENGINE_CALIBRATE_INTERNAL_H
#define TPD_ENGINE_CALIBRATE_INTERNAL_H

#include "engine/calibrate.h"

typedef tpd_status (*tpd_calib_fn)(void *arg);

/* Seconds per call of fn: every rank of `world` runs it at once, the same number of
 * times (enough for opt->budget_s on the slowest rank), between two barriers; the
 * window over the calls, averaged over ranks (the same on every rank). Collective. */
tpd_status tpd_calib_time(tpd_comm *world, const tpd_calib_options *opt, tpd_calib_fn fn,
                          void *arg, double *t_p);

/* Collectives and p2p: fills intra/inter bandwidth and latency, p2p_bw/p2p_latency of c,
 * and appends the measured table to notes (rank 0). Collective. */
tpd_status tpd_calib_comm(tpd_comm *world, const tpd_config *cfg, const tpd_calib_options *opt,
                          tpd_plan_cluster *c, char *notes, size_t notes_len);

#endif
