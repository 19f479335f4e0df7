/* `tripod bench --calibrate`: measures this machine and writes a cluster profile
 * (the format of the files in configs/clusters/, backend: cpu) that makes the planner predict the
 * cpu backend's own runs.
 *
 * What is measured, with every rank of the job running the same kernel at the same time
 * (so ranks that share cores are measured sharing them, as they train):
 *   - GEMM throughput of the model's linear layers (cpu matmul_fwd / matmul_bwd) for every
 *     TP degree that divides the heads and the world, and micro-batch sizes 1, 2, 4 and
 *     the config's: the efficiency curve by FLOPs, the best rate as the peak, and the
 *     backward/forward ratio;
 *   - the attention kernel (forward and backward) on the same shapes;
 *   - per-element cost of the memory-bound kernels (add, LayerNorm, GELU, cross-entropy,
 *     AdamW, sum of squares, zeroing) at the model's sizes;
 *   - all-reduce, reduce-scatter, all-gather over groups of 2, 4, ... ranks (every group
 *     at once) and pipeline p2p between rank pairs, from 4 bytes to a few MB, fitted to
 *     latency + bytes / bandwidth.
 * Units: seconds, bytes, FLOPs inside; the profile file uses its own (TFLOP/s, GB/s, us,
 * ns). */
#ifndef TPD_ENGINE_CALIBRATE_H
#define TPD_ENGINE_CALIBRATE_H

#include <stddef.h>

#include "base/status.h"
#include "engine/config/config.h"
#include "engine/plan/plan.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_calib_options {
    double budget_s; /* wall time per measured point (after one warm-up call) */
    int min_reps;    /* calls per point at least */
    int verbose;     /* progress on world rank 0 */
    char name[64];   /* profile name; "" = the output file's base name */
} tpd_calib_options;

#define TPD_CALIB_OPTIONS_INIT                                                                     \
    { 0.02, 3, 0, "" }

/* Measures everything on `world` (MPI) and fills a cpu cluster profile. Collective.
 * cfg gives the shapes (model, micro-batch, threads). notes (may be NULL) receives the
 * measured tables as text for the profile's header comment (malloc'd, caller frees;
 * rank 0). */
tpd_status tpd_calib_run(const tpd_config *cfg, tpd_comm *world, const tpd_calib_options *opt,
                         tpd_plan_cluster *cluster_p, char **notes_p);

#ifdef __cplusplus
}
#endif
#endif
