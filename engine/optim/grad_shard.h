/* Private to engine/optim: the step's DP communication under the sharded strategies
 * (parallel.data_parallel_sharding_strategy optim_grads and optim_grads_params), behind
 * grad_sync.h's calls. The DP plan is aligned to the model's hook units
 * (tpd_dp_plan_init_units, under EP with expert units first), and the buffers are the buffer plan's
 * (engine/model/model.h: the shards, pool_p and pool_g).
 *
 * Gradients (both strategies). A unit's backward writes into a zeroed staging slot of the
 * grad pool (opened at TPD_HOOK_BWD). At TPD_HOOK_GRAD_DONE the slot is summed over TP
 * where sequence parallelism needs it, then reduce-scattered (non-blocking); when that
 * completes, this rank's part is added into the gradient shard and the slot is zeroed and
 * free again. So every micro-batch's gradients are reduced, as DeepSpeed's ZeRO-2 and
 * FSDP do, and no full-size gradient buffer exists. The parts are added in the order the
 * reductions were issued, so the sums do not depend on timing. The embedding unit keeps its
 * slot for the whole step (the tied head and the embedding both write it, and the first
 * and last stage sum their wte there); it is reduced after the pipeline.
 *
 * Parameters (optim_grads_params). Before a forward or backward reads a unit, its part of
 * each rank's shard is all-gathered into a slot of the parameter pool, and the unit's views
 * point there until the call is done with it. The next unit in the direction of the pass
 * (layer l+1 in a forward, l-1 in a backward, the final unit after the last layer) is
 * gathered ahead into a free slot (prefetch); a slot nobody holds keeps its unit until
 * another needs the room, so the last layer of a forward is often still there for its
 * backward. Whether a slot is free is decided by the hook events alone (never by which
 * collective has completed), so every DP rank issues the same collectives in the same
 * order. After the optimizer step every slot is stale and emptied.
 *
 * Hybrid sharding (HSDP): the shard group is HSDP's (comms->dp_shard), and after the last
 * reduction of a step the gradient shard is all-reduced over its replicas in the other
 * groups (comms->dp_rep), once a step.
 *
 * Expert parallelism (the plan's expert units, tpd_dp_plan_init_units_ep): each local
 * layer's experts are a unit of their own, staged in a pool of expert slots beside the
 * layer's slots and gathered and reduce-scattered over expert DP (comms->edp; under HSDP
 * its ranks in the shard group, comms->edp_shard) at the layer's events. Reductions land in
 * issue order within each pool (a unit is in one).
 *
 * optim_grads after the update: every unit's updated parts are all-gathered back into the
 * full parameter buffer through a staging slot (blocking). */
#ifndef TPD_ENGINE_OPTIM_GRAD_SHARD_H
#define TPD_ENGINE_OPTIM_GRAD_SHARD_H

#include "engine/model/model.h"
#include "parallel/data/dp.h"
#include "parallel/mesh.h"

typedef struct tpd_grad_shard tpd_grad_shard;

tpd_status tpd_grad_shard_create(tpd_model *m, const tpd_dp_plan *dpp, const tpd_mesh_comms *comms,
                                 tpd_grad_shard **sh_p);
/* Waits for anything outstanding, then frees. */
tpd_status tpd_grad_shard_destroy(tpd_grad_shard *sh);
/* A hook event of the model (TPD_HOOK_*) for unit `unit`; polls the rest. */
tpd_status tpd_grad_shard_event(tpd_grad_shard *sh, int unit, int event);
tpd_status tpd_grad_shard_poll(tpd_grad_shard *sh);
/* After the pipeline: every reduction completed into the shard, the embedding's last. */
tpd_status tpd_grad_shard_finish(tpd_grad_shard *sh);
/* After the update: optim_grads gathers the full parameters; optim_grads_params empties
 * the parameter pool (its copies are stale). */
tpd_status tpd_grad_shard_after_update(tpd_grad_shard *sh);
/* The whole flat parameter buffer as fp32 in host memory (numel_padded): gathered from
 * the shards under optim_grads_params (collective over DP), read otherwise. */
tpd_status tpd_grad_shard_params_f32(tpd_grad_shard *sh, float *out);
/* Seconds spent blocked on the DP communication since the last call; resets it. */
double tpd_grad_shard_take_exposed(tpd_grad_shard *sh);

#endif
