/* The model's FLOPs: one definition that the trainer's log line, the sweep's measured
 * throughput and the planner's prediction all use, so that their MFU figures agree for
 * any ffn_hidden_size. */
#ifndef TPD_ENGINE_MODEL_MODEL_FLOPS_H
#define TPD_ENGINE_MODEL_MODEL_FLOPS_H

#include "engine/config/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Forward matmul FLOPs per token of one transformer layer: 2*(4h^2 + 2hf) for the four
 * GEMMs (QKV, projection, the two MLP matrices of width f = ffn_hidden_size) and 4sh for
 * QK^T and AV (Megatron counts the full s x s, not the causal half). */
double tpd_model_layer_fwd_flops_per_token(const tpd_config *cfg);

/* Megatron's model FLOPs of an iteration over `batch` sequences with a (padded) vocabulary
 * of `vocab` columns: 3x (forward + two backward GEMMs) the layers and the logits. At
 * f = 4h this is 72*B*s*l*h^2 * (1 + s/(6h) + V/(12*l*h)). Recomputation is not counted. */
double tpd_model_flops(const tpd_config *cfg, double batch, double vocab);

#ifdef __cplusplus
}
#endif
#endif
