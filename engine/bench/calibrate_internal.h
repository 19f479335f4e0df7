/* Private to engine/bench/: what calibrate.c (kernels, profile) asks of calibrate_comm.c
 * (collectives). */
#ifndef TPD_ENGINE_CALIBRATE_INTERNAL_H
#define TPD_ENGINE_CALIBRATE_INTERNAL_H

#include "engine/bench/calibrate.h"

/* Collectives and p2p: fills intra/inter bandwidth and latency, p2p_bw/p2p_latency of c,
 * and appends the measured table to notes (rank 0). Collective. */
tpd_status tpd_calib_comm(tpd_comm *world, const tpd_config *cfg, const tpd_calib_options *opt,
                          tpd_plan_cluster *c, char *notes, size_t notes_len);

#endif
