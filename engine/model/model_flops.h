/* The model's FLOPs: one definition that the trainer's log line, the sweep's measured
 * throughput and the planner's prediction all use, so that their MFU figures agree for
 * any block shape (ffn_hidden_size, grouped-query attention, SwiGLU).
 *
 * Matmuls only, Megatron's convention: the norms (LayerNorm or RMSNorm), RoPE, the
 * activations, biases, residual adds and the softmax are not counted, and an untied output
 * layer costs what the tied head does (the same (tokens, V, h) GEMMs); the input embedding
 * is a lookup. */
#ifndef TPD_ENGINE_MODEL_MODEL_FLOPS_H
#define TPD_ENGINE_MODEL_MODEL_FLOPS_H

#include "engine/config/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Forward matmul FLOPs per token of one transformer layer, h = hidden_size, f =
 * ffn_hidden_size, g = K/V heads (tpd_config_kv_heads), a = query heads:
 *   2*(2h^2 + 2h*(g/a)h + m*h*f) + 4sh
 * for the Q and output projections, the K and V projections of g heads of h/a, the m MLP
 * matrices (m = 3 under SwiGLU: gate, up, down; else 2), and 4sh for QK^T and AV (every
 * query head attends over s keys whatever g is; Megatron counts the full s x s, not the
 * causal half). At g = a, m = 2 this is GPT's 2*(4h^2 + 2hf) + 4sh. A mixture of experts
 * counts what a token runs (active parameters): f = k * moe_ffn_hidden_size + the shared
 * experts' width, and the router's h*E (E experts); capacity drops are not subtracted. */
double tpd_model_layer_fwd_flops_per_token(const tpd_config *cfg);
/* The same for a MoE layer (moe 1) or a dense one (moe 0, an MLP of ffn_hidden_size). */
double tpd_model_layer_kind_fwd_flops_per_token(const tpd_config *cfg, int moe);
/* Summed over the model's layers: its MoE layers (every model.moe_layer_freq-th) and its
 * dense ones. */
double tpd_model_layers_fwd_flops_per_token(const tpd_config *cfg);

/* Megatron's model FLOPs of an iteration over `batch` sequences with a (padded) vocabulary
 * of `vocab` columns: 3x (forward + two backward GEMMs) the layers and the logits. At
 * f = 4h (GPT) this is 72*B*s*l*h^2 * (1 + s/(6h) + V/(12*l*h)); in general Megatron's
 * num_floating_point_operations, 12*B*s*l*h^2 * ((1 + g/a + s/h) + (m/2)*f/h + V/(2*l*h)).
 * Recomputation is not counted. */
double tpd_model_flops(const tpd_config *cfg, double batch, double vocab);

#ifdef __cplusplus
}
#endif
#endif
