/* Private to engine/model: the views of a layer and the pieces of the forward that the
 * training step (model_step.c) and decoding (model_decode.c) share, so that the block is
 * written once. Each piece runs on the rows it is given: the training step passes its
 * micro-batch (tpd_model_rows of B, T, Nl, from position 0), decoding one position. Under
 * sequence parallel only the micro-batch's rows can be given (decoding runs at TP 1). */
#ifndef TPD_ENGINE_MODEL_MODEL_INTERNAL_H
#define TPD_ENGINE_MODEL_MODEL_INTERNAL_H

#include "engine/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One layer's parameters (or gradients) in the flat buffer; NULL for a tensor the model
 * lacks (biases, LayerNorm's b under RMSNorm). */
typedef struct tpd_model_views {
    void *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
        *fcprojb;
    void *routerw, *expfcw, *expfcb, *expprojw, *expprojb, *shgatew; /* mixture of experts */
    void *shfcw, *shfcb, *shprojw, *shprojb;                         /* its shared experts */
    void *qnormw, *knormw;                                           /* Qwen3's QK norm */
} tpd_model_views;

/* One layer's activations (tpd_act_layer's regions, for the rows of a call). */
typedef struct tpd_model_acts {
    void *ln1, *qkv, *atty, *att, *x1, *ln2, *fch, *fch_gelu, *out;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    void *qkn_raw;   /* QK norm: the Q and K heads before it (NULL without) */
    float *qkn_rstd; /* and their rstd */
    char *block;     /* the layer's block (its mixture-of-experts regions: tpd_act_layer) */
    int moe;         /* a MoE layer: its MLP is the mixture of experts (model_moe.c) */
} tpd_model_acts;

/* The rows of one call: B sequences of T positions starting at position pos0 (N = B*T),
 * Nl of them in the norm and residual regions. */
typedef struct tpd_model_rows {
    int B, T, Nl, pos0;
    int cp; /* 1: the rows are this CP rank's two chunks of each sequence (pos0 unread) */
} tpd_model_rows;

/* Local layer l's views of its parameters (grads 0) or gradients (grads 1), where its unit
 * lives now. */
void tpd_model_layer_views(const tpd_model *m, int grads, int l, tpd_model_views *v);

/* The output layer's weight: wte (tied) or lmhead. */
tpd_param tpd_model_head_param(const tpd_model *m);

/* out(rows,C) = the block's norm of inp: LayerNorm (w, b; mean and rstd kept) or RMSNorm
 * (w; rstd kept, mean unused), with model.norm_epsilon. */
tpd_status tpd_model_norm_fwd(const tpd_model *m, int rows, void *out, float *mean, float *rstd,
                              const void *inp, const void *w, const void *b);

/* out(N,C) = wte[tokens] (+ wpe[pos0 + t] with learned positions): the vocab-parallel lookup,
 * summed over TP. tokens: (N) int32 in backend memory. */
tpd_status tpd_model_embed_fwd(tpd_model *m, const tpd_model_rows *r, void *out,
                               const int32_t *tokens);

/* The layer up to its attention: a->ln1 = norm(inp); a->qkv = ln1 @ qkvw^T + qkvb, its Q and
 * K heads rotated at positions pos0 + t under RoPE. */
tpd_status tpd_model_layer_qkv_fwd(tpd_model *m, const tpd_model_rows *r, const tpd_model_views *w,
                                   const tpd_model_acts *a, const void *inp);
/* The layer after its attention, from a->atty: a->x1 = inp + attention projection;
 * a->out = x1 + mlp(norm(x1)). */
tpd_status tpd_model_layer_mlp_fwd(tpd_model *m, const tpd_model_rows *r, const tpd_model_views *w,
                                   const tpd_model_acts *a, const void *inp);

/* lnf = norm_f(inp); logits(N,Vl) = lnf @ head^T (vocab-parallel columns). */
tpd_status tpd_model_head_fwd(tpd_model *m, const tpd_model_rows *r, void *lnf, float *mean,
                              float *rstd, void *logits, const void *inp);

/* Mixture of experts (model_moe.c). fwd: from the MLP's input `full` (N,C, the gathered
 * ln2), a->out = a->x1 + the TP sum of the MoE MLP (this rank's rows under SP), keeping the
 * routing in the layer's block. bwd: from dfull (N,C), the gradient of the MLP output,
 * dpartial (N,C) = this rank's share of the input gradient (summed over TP by the caller);
 * every MoE parameter gradient accumulated (a split backward computes them in B). */
/* The most EP ranks of one group (parallel.expert_model_parallel_size's bound). */
#define TPD_MOE_MAX_EP 4096
tpd_status tpd_model_moe_fwd(tpd_model *m, const tpd_model_rows *r, const tpd_model_views *w,
                             const tpd_model_acts *a, const void *full);
tpd_status tpd_model_moe_bwd(tpd_model *m, const tpd_model_views *w, const tpd_model_views *g,
                             const tpd_model_acts *a, const void *full, const void *dfull,
                             void *dpartial, float dloss);

/* Context parallelism (model_cp.c): a->atty and the layer's attention state from a->qkv
 * (RoPE applied) across the CP ranks; its backward overwrites dqkv (and, under a2a, reads
 * datty for the last time); recompute rebuilds what selective recompute dropped. */
tpd_status tpd_model_cp_attention_fwd(tpd_model *m, const tpd_model_acts *a);
tpd_status tpd_model_cp_attention_bwd(tpd_model *m, void *dqkv, void *datty,
                                      const tpd_model_acts *a);
tpd_status tpd_model_cp_attention_recompute(tpd_model *m, const tpd_model_acts *a);

#ifdef __cplusplus
}
#endif
#endif
