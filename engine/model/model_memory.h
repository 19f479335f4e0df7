/* The bytes a rank of `tripod train` allocates, computed without allocating anything.
 *
 * The engine allocates exactly these buffers at start-up (one block per category), and
 * `tripod plan` reports the same numbers for the cpu backend, so a test can hold the
 * prediction and the allocation equal. */
#ifndef TPD_ENGINE_MODEL_MEMORY_H
#define TPD_ENGINE_MODEL_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/config/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_mem_breakdown {
    uint64_t params;      /* working parameters (param dtype); this rank's shard under
                             optim_grads_params */
    uint64_t grads;       /* gradients (grad dtype), padded for DP sharding; this rank's
                             shard under optim_grads and optim_grads_params */
    uint64_t gather;      /* optim_grads(_params): the staging slots of units in use (the
                             gathered parameters, the gradients of a micro-batch) */
    uint64_t optimizer;   /* AdamW m and v (fp32), this rank's shard under ZeRO-1 */
    uint64_t master;      /* fp32 master weights (bf16 training), sharded like optimizer */
    uint64_t outer;       /* DiLoCo (parallel.dp_sync: diloco): fp32 parameters at the last
                             sync and outer momentum, sharded like optimizer, and one
                             fragment's pseudo-gradient (tpd_diloco_fragment_numel) */
    uint64_t activations; /* the schedule's peak in-flight micro-batches of activations */
    uint64_t workspace;   /* activation gradients, p2p and logits scratch */
    uint64_t total;
} tpd_mem_breakdown;

/* Memory of the rank at pipeline stage `stage` (0..pp-1) of a (tp, pp, dp) layout.
 * Every TP and DP rank of a stage allocates the same bytes (buffers are padded so that
 * ZeRO-1 shards are equal). The dtypes follow cfg->training.precision: fp32 keeps one
 * fp32 copy of the weights; bf16 keeps bf16 weights plus fp32 master weights, and fp32
 * gradients (bf16 ones when training.accumulate_allreduce_grads_in_fp32 is false). */
/* Elements of the largest of `fragments` contiguous pieces of a shard of shard_numel
 * elements (Streaming DiLoCo's fragments; the whole shard for one fragment). */
size_t tpd_diloco_fragment_numel(size_t shard_numel, int fragments);

tpd_status tpd_model_memory(const tpd_config *cfg, int tp, int pp, int dp, int stage,
                            tpd_mem_breakdown *mem_p);

#ifdef __cplusplus
}
#endif
#endif
