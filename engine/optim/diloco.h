/* DiLoCo's outer step (Douillard et al. 2023) with Streaming DiLoCo's fragments and
 * overlapped all-reduce (Douillard et al. 2025), over the ranges a rank owns.
 *
 * Each replica (a whole TP x PP model, DP/replicas ranks wide: tpd_config_dp_replicas)
 * trains on its own data share with the inner optimizer and no communication across
 * replicas. At the step where fragment f syncs (tpd_diloco_sync_fragment), every rank takes
 * the pseudo-gradient of its owned part of f, delta = (weights at f's last sync) - (weights
 * now), and all-reduces it over the replicas (the mesh's DP_OUTER group: equal TP, PP and
 * inner DP coordinates, so equal ranges). Once the sum is in (at once, or
 * diloco.overlap_steps inner steps later), the outer Nesterov step runs on the mean:
 *   mom = mu mom + mean;  sync -= outer_lr (mean + mu mom)  (PyTorch SGD, nesterov=True)
 * and the fragment's weights continue from sync: its inner steps taken during the overlap
 * window are replaced (Streaming DiLoCo with mixing factor 0), so every replica holds the
 * same fragment again.
 *
 * State (the model's, planned by tpd_model_plan_buffers): outer_sync and outer_mom, one
 * fp32 value per owned state element; outer_delta, one fragment's pseudo-gradient. The
 * all-reduce carries diloco.reduce_dtype: fp32, or bf16 with fp32 sums at the owner
 * (tpd_comm_iallreduce_wire). Under ZeRO-1 inside a replica each rank owns a shard, and
 * the parameter all-gather that follows the step (tpd_grad_sync_gather_params) spreads the
 * outer step's result with the inner update's. */
#ifndef TPD_ENGINE_OPTIM_DILOCO_H
#define TPD_ENGINE_OPTIM_DILOCO_H

#include "engine/model/model.h"
#include "parallel/data/dp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_diloco tpd_diloco;

/* What the outer step did after one inner step. */
typedef struct tpd_diloco_stats {
    int started;       /* fragment whose all-reduce started after this step; -1: none */
    int applied;       /* fragment whose outer step was applied after this step; -1: none */
    double bytes_sent; /* wire bytes this rank sent for the all-reduce started (ring count:
                          2 (R-1)/R of the fragment's bytes) */
    double wait_s;     /* time blocked on the outer all-reduce */
} tpd_diloco_stats;

/* outer: the communicator across replicas in backend memory (NULL with one replica: the
 * outer step then runs on this replica's own pseudo-gradient). */
tpd_status tpd_diloco_create(tpd_model *m, const tpd_dp_plan *dpp, const tpd_config *cfg,
                             tpd_comm *outer, tpd_diloco **d_p);
/* Waits for an all-reduce in flight, then frees. */
tpd_status tpd_diloco_destroy(tpd_diloco *d);

/* After the inner update of step `completed` (1-based), on the schedule of
 * tpd_diloco_sync_fragment / tpd_diloco_pending_fragment: applies the fragment whose
 * overlap window ends now, then starts the all-reduce of the fragment that syncs now and,
 * without overlap or at the run's last step, waits and applies it too. Runs before the
 * ZeRO-1 parameter all-gather. Collective over the outer group at sync steps. */
tpd_status tpd_diloco_after_step(tpd_diloco *d, int completed, tpd_diloco_stats *s);
/* Advances an outer all-reduce in flight (between inner steps). */
tpd_status tpd_diloco_poll(tpd_diloco *d);
/* The fragment whose all-reduce is in flight, or -1. */
int tpd_diloco_in_flight(const tpd_diloco *d);
/* Wire bytes this rank sends for fragment f's all-reduce (the ring's count). */
double tpd_diloco_fragment_bytes(const tpd_diloco *d, int f);

#ifdef __cplusplus
}
#endif
#endif
