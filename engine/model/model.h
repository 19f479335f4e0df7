/* GPT-2 on one rank of a TP x PP x DP mesh: this stage's layers, this TP rank's slices.
 *
 * Buffers are allocated once at creation, one block per category, in exactly the sizes
 * of the buffer plan that `tripod plan` also reports (tpd_model_memory): parameters,
 * gradients (mirroring them), optimizer state and master weights (this rank's ZeRO-1
 * shard), activations for the schedule's peak number of in-flight micro-batches
 * ("slots"), and one workspace of activation gradients.
 *
 * Forward and backward of one micro-batch run on one slot. The pipeline executor moves
 * stage inputs and outputs between stages; this file never talks to other stages, only
 * to its TP group (through parallel/tensor). */
#ifndef TPD_ENGINE_MODEL_H
#define TPD_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/config/config.h"
#include "engine/model/model_layout.h"
#include "engine/model/model_memory.h"
#include "kernels/kernels.h"
#include "parallel/data/dp.h"
#include "parallel/tensor/tp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Byte offsets inside one layer's block of a slot. Nl = N, or N/tp under sequence
 * parallel (dims.Nl): the rows this rank keeps of the LayerNorm and residual regions. */
typedef struct tpd_act_layer {
    size_t ln1, ln1_mean, ln1_rstd; /* (Nl,C) act, (Nl) f32, (Nl) f32 */
    size_t qkv;                     /* (N,3*C/tp) */
    size_t atty;                    /* (N,C/tp) */
    size_t att;                     /* backend's saved attention state (not under
                                       selective recompute: w_att) */
    size_t x1;                      /* (Nl,C) residual after attention */
    size_t ln2, ln2_mean, ln2_rstd; /* (Nl,C), (Nl), (Nl) */
    size_t fch, fch_gelu;           /* (N,F/tp) before and after GELU */
    size_t out;                     /* (Nl,C) layer output */
    size_t bytes;                   /* block size */
} tpd_act_layer;

/* Sizes and offsets of every buffer of a rank; pure arithmetic. */
typedef struct tpd_buffer_plan {
    tpd_model_layout lay;
    size_t act_size, param_size, grad_size; /* dtype bytes */
    int has_master;
    size_t numel_padded; /* parameter and gradient elements, padded for DP */
    size_t shard_numel;  /* optimizer-state elements on this rank */
    int nslots;          /* in-flight micro-batches: min(PP - stage, M) under 1F1B */
    size_t att_saved;    /* bytes per layer per micro-batch */
    int recompute;       /* training.recompute: full, on the first `recompute` layers of the
                            stage (all, or training.recompute_num_layers). A slot keeps
                            only those layers' outputs (the next layer's input); the
                            backward recomputes each of them into the one shared layer block
                            w_layer. The other layers keep their blocks at s_layers. */
    int selective;       /* training.recompute: selective (Korthikanti et al.). The saved
                            attention state (the cpu backend's (B,NH/tp,T,T) probabilities)
                            is not kept; the backward recomputes the attention forward into
                            the one shared block w_att. */
    size_t s_outs;       /* recompute: `recompute` x (Nl,C) layer outputs */
    /* slot: */
    size_t s_tokens, s_targets; /* (N) int32 each */
    size_t s_x0;                /* (Nl,C) stage input */
    size_t s_layers;            /* block of the first layer not recomputed */
    tpd_act_layer layer;
    size_t s_lnf, s_lnf_mean, s_lnf_rstd; /* last stage: (Nl,C), (Nl), (Nl) */
    size_t s_logits;                      /* (N, Vp/tp) logits, then dlogits in place */
    size_t s_xstats;                      /* (3N) f32: max, sumexp, target logit */
    size_t s_loss;                        /* (N) f32 */
    size_t slot_bytes;
    /* workspace (one, shared by all slots): */
    size_t w_dres, w_dtmp; /* (Nl,C) each: the residual stream's gradient */
    size_t w_dln;          /* (N,C) gradient of a LayerNorm output (under SP, the
                              partial sum before the reduce-scatter) */
    size_t w_dqkv;         /* (N,3C/tp) */
    size_t w_datty;        /* (N,C/tp) */
    size_t w_dfch;         /* (N,F/tp) */
    size_t w_dsend;        /* (Nl,C) gradient sent to the previous stage */
    size_t w_layer;        /* recompute: one layer block of activations */
    size_t w_att;          /* selective: one layer's attention state */
    size_t w_gath;         /* SP: (N,C) all-gathered rows, or a row-parallel
                              layer's partial output before its reduce-scatter */
    size_t w_dlnl;         /* SP: (Nl,C) this rank's rows of w_dln, reduced */
    size_t ws_bytes;
    tpd_mem_breakdown mem;
} tpd_buffer_plan;

tpd_status tpd_buffer_plan_init(const tpd_config *cfg, int tp, int tp_rank, int pp, int dp,
                                int stage, tpd_buffer_plan *plan_p);

typedef struct tpd_model {
    tpd_config cfg;
    tpd_buffer_plan plan;
    tpd_model_dims d;
    const tpd_kern_backend *kb;
    tpd_tp_ctx tp;
    void *params;         /* (numel_padded) param dtype: the flat buffer all views point into */
    void *grads;          /* (numel_padded) grad dtype, mirrors params */
    float *master;        /* (shard_numel) fp32 or NULL */
    float *opt_m, *opt_v; /* (shard_numel) fp32 */
    char *acts;           /* nslots * slot_bytes */
    char *ws;             /* ws_bytes */
    int32_t *host_tokens; /* (2, B*T) host staging: inputs, then targets */
    size_t bytes_allocated;
} tpd_model;

/* Allocates every buffer (tp_comm: this rank's TP communicator; may be NULL for TP=1). */
tpd_status tpd_model_create(const tpd_config *cfg, const tpd_kern_backend *kb, tpd_comm *tp_comm,
                            int tp_size, int tp_rank, int pp, int dp, int stage,
                            tpd_model **model_p);
void tpd_model_destroy(tpd_model *m);

/* Views into the flat buffers. */
void *tpd_model_param(const tpd_model *m, tpd_param p);
void *tpd_model_grad(const tpd_model *m, tpd_param p);

/* Counter-based initialization: each element gets the value of its global index, so every
 * layout starts from the same model. Also zeroes gradients and optimizer state and writes
 * the master weights of the ranges this rank owns under `dpp`. */
tpd_status tpd_model_init_params(tpd_model *m, const tpd_dp_plan *dpp);
tpd_status tpd_model_zero_grads(tpd_model *m);

/* tokens: (B, T+1) host int32 samples; inputs are [:, :T], targets [:, 1:]. */
tpd_status tpd_model_set_batch(tpd_model *m, int slot, const int32_t *tokens);

/* Runs this stage's part of the forward on slot. On the first stage the input is the
 * embedding of the slot's tokens; otherwise the slot's stage input (received). On the
 * last stage it ends with the per-token loss. */
tpd_status tpd_model_forward(tpd_model *m, int slot);
/* Backward of slot. On the last stage it starts from the loss with weight dloss per token;
 * otherwise from tpd_model_grad_in (received). Parameter gradients accumulate. */
tpd_status tpd_model_backward(tpd_model *m, int slot, float dloss);
/* Sum of the slot's per-token losses (last stage). */
tpd_status tpd_model_loss_sum(tpd_model *m, int slot, double *sum_p);

/* The buffers the pipeline moves between stages, (Nl,C) each: under sequence parallel
 * every TP rank sends and receives only its rows. */
void *tpd_model_stage_input(const tpd_model *m, int slot);
void *tpd_model_stage_output(const tpd_model *m, int slot);
void *tpd_model_grad_in(const tpd_model *m);
void *tpd_model_grad_out(const tpd_model *m);
/* Sequence parallel: LayerNorm gradients are partial sums over this rank's rows;
 * all-reduces them over TP so that every rank holds the full gradient (no-op without SP). */
tpd_status tpd_model_sp_reduce_grads(tpd_model *m);

#ifdef __cplusplus
}
#endif
#endif
