/* Gradient and parameter communication of a step, bucket by bucket: the sequence-parallel
 * LayerNorm sums over TP, the tied-embedding sum between the first and the last stage, the
 * DP sum (all-reduce, or ZeRO-1 reduce-scatter) of every bucket, and after the update the
 * ZeRO-1 all-gather of the parameters.
 *
 * Megatron's overlap_grad_reduce: while the last micro-batch's backward runs, a bucket's
 * reduction starts as soon as every gradient in it is final. The buffer is layer-major
 * (engine/model/model_layout.h) and the backward walks it from its end, so buckets start in
 * reverse layer order. The one holding the embedding (wte, wpe) starts after the pipeline,
 * behind the tied-embedding all-reduce. overlap_param_gather: each bucket's all-gather for
 * the next step is waited for just before a forward first reads its parameters.
 *
 * Without overlap the same operations run on the same buckets after the pipeline (and the
 * gathers are waited for at once), so the sums, and the losses, are bit-identical.
 *
 * optim_grads and optim_grads_params run unit by unit instead, every micro-batch, with
 * their own engine (grad_shard.h) behind the same calls; the overlap keys do not apply
 * (the reductions and gathers always overlap the passes).
 *
 * Progress: the non-blocking collectives (MPI on cpu) advance only inside communication
 * calls, so every model hook between layers polls the outstanding ones (tpd_comm_test):
 * no progress thread competes with the compute threads for the cores, and MPI stays at
 * thread level FUNNELED. On the cuda backend the collectives run on NCCL's communication
 * stream and the polls are cheap event queries. */
#ifndef TPD_ENGINE_OPTIM_GRAD_SYNC_H
#define TPD_ENGINE_OPTIM_GRAD_SYNC_H

#include "engine/model/model.h"
#include "parallel/data/dp.h"
#include "parallel/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_grad_sync tpd_grad_sync;

/* comms: the communicators of the backend's memory (tp, dp, emb). */
tpd_status tpd_grad_sync_create(tpd_model *m, const tpd_dp_plan *dpp, const tpd_mesh_comms *comms,
                                int overlap_grad_reduce, int overlap_param_gather,
                                tpd_grad_sync **gs_p);
/* Waits for anything outstanding, then frees. */
tpd_status tpd_grad_sync_destroy(tpd_grad_sync *gs);

/* Before a step's pipeline: no gradient is final yet. */
void tpd_grad_sync_begin(tpd_grad_sync *gs);
/* The gradients of hook unit `unit` (engine/model/model.h) are final for this step:
 * starts every bucket whose units are all final (a no-op without overlap_grad_reduce). */
tpd_status tpd_grad_sync_unit_final(tpd_grad_sync *gs, int unit);
/* A hook event of the model (TPD_HOOK_*, engine/model/model.h) for unit `unit`; final_mb:
 * the call is its chunk's last backward of the step. Waits for the unit's parameter
 * gathers before a forward and starts reductions of final gradients (overlap), or under
 * the sharded strategies gathers, frees and reduces units (grad_shard.h); polls. */
tpd_status tpd_grad_sync_event(tpd_grad_sync *gs, int unit, int event, int final_mb);
/* The whole flat parameter buffer as fp32 in host memory (numel_padded), gathered from
 * the shards under optim_grads_params: collective over DP. */
tpd_status tpd_grad_sync_params_f32(tpd_grad_sync *gs, float *out);
/* Advances outstanding collectives without waiting. */
tpd_status tpd_grad_sync_poll(tpd_grad_sync *gs);
/* After the pipeline: the tied-embedding sum, every bucket not yet started, and waits for
 * all of them. Afterwards the gradients are summed (under ZeRO, this rank's parts). */
tpd_status tpd_grad_sync_finish(tpd_grad_sync *gs);

/* After the update: starts the ZeRO-1 all-gather of every bucket's parameters; waits for
 * them unless overlap_param_gather. A no-op without ZeRO. */
tpd_status tpd_grad_sync_gather_params(tpd_grad_sync *gs);
/* Before a forward reads unit `unit`'s parameters: waits for the gathers of its buckets. */
tpd_status tpd_grad_sync_params_ready(tpd_grad_sync *gs, int unit);
/* Waits for every parameter gather: before anything but the forward reads parameters
 * (evaluation, checkpoints, norms, gathers). */
tpd_status tpd_grad_sync_params_all(tpd_grad_sync *gs);

/* Seconds the caller spent blocked on DP communication since the last call (finish's
 * waits and the parameter waits), and resets it: the exposed DP time. */
double tpd_grad_sync_take_exposed(tpd_grad_sync *gs);

#ifdef __cplusplus
}
#endif
#endif
