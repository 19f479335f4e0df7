/* Private to kernels/: the op table a backend fills, and the handle behind
 * tpd_kern_backend. Each op's contract is documented at its tpd_kern_* function in
 * kernels/kernels.h; the table's entries take the backend context instead of the handle.
 * The tables name every entry (designated initializers; C++20's for cuda, which keep this
 * declaration order): many entries share a signature, so a table filled by position would
 * still compile with two of them swapped. */
#ifndef TPD_KERNELS_KERNELS_INTERNAL_H
#define TPD_KERNELS_KERNELS_INTERNAL_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_kern_ctx tpd_kern_ctx; /* backend-private */

typedef struct tpd_kern_ops {
    /* ---- memory ---- */
    tpd_status (*alloc)(tpd_kern_ctx *ctx, size_t bytes, void **ptr_p);
    void (*free)(tpd_kern_ctx *ctx, void *ptr);
    tpd_status (*zero)(tpd_kern_ctx *ctx, void *ptr, size_t bytes);
    tpd_status (*copy_to_device)(tpd_kern_ctx *ctx, void *dst, const void *src, size_t bytes);
    tpd_status (*copy_to_host)(tpd_kern_ctx *ctx, void *dst, const void *src, size_t bytes);
    tpd_status (*copy)(tpd_kern_ctx *ctx, void *dst, const void *src, size_t bytes);
    tpd_status (*copy_2d)(tpd_kern_ctx *ctx, void *dst, size_t dpitch, const void *src,
                          size_t spitch, size_t width, size_t rows);
    tpd_status (*synchronize)(tpd_kern_ctx *ctx);

    /* ---- embedding (vocab-parallel pieces) ---- */
    tpd_status (*embed_fwd)(tpd_kern_ctx *ctx, void *out, const int32_t *tokens, const void *wte,
                            int N, int C, int v0, int Vl);
    tpd_status (*embed_bwd)(tpd_kern_ctx *ctx, void *dwte, const void *dout, const int32_t *tokens,
                            int N, int C, int v0, int Vl);
    tpd_status (*pos_fwd)(tpd_kern_ctx *ctx, void *out, const void *wpe, int B, int T, int C);
    tpd_status (*pos_bwd)(tpd_kern_ctx *ctx, void *dwpe, const void *dout, int B, int T, int C);

    /* ---- layernorm (biased variance) ---- */
    tpd_status (*layernorm_fwd)(tpd_kern_ctx *ctx, void *out, float *mean, float *rstd,
                                const void *inp, const void *w, const void *b, int N, int C,
                                double eps);
    tpd_status (*layernorm_bwd)(tpd_kern_ctx *ctx, void *dinp, void *dw, void *db, const void *dout,
                                const void *inp, const void *w, const float *mean,
                                const float *rstd, int N, int C);

    /* ---- matmul ---- */
    tpd_status (*matmul_fwd)(tpd_kern_ctx *ctx, void *out, const void *inp, const void *w,
                             const void *bias, int N, int C, int OC);
    tpd_status (*matmul_bwd)(tpd_kern_ctx *ctx, void *dinp, void *dw, void *dbias, const void *dout,
                             const void *inp, const void *w, int N, int C, int OC);
    tpd_status (*bias_add)(tpd_kern_ctx *ctx, void *out, const void *bias, int N, int OC);

    /* ---- fused matmul + bias + GELU (cuBLASLt GELU_AUX_BIAS on cuda) ----
     * pre(N,OC) = inp @ w^T + bias; out = gelu(pre). Both overwritten; pre is kept for
     * the backward. */
    tpd_status (*matmul_gelu_fwd)(tpd_kern_ctx *ctx, void *out, void *pre, const void *inp,
                                  const void *w, const void *bias, int N, int C, int OC);

    /* ---- elementwise ---- */
    tpd_status (*gelu_fwd)(tpd_kern_ctx *ctx, void *out, const void *inp, size_t n);
    tpd_status (*gelu_bwd)(tpd_kern_ctx *ctx, void *dinp, const void *inp, const void *dout,
                           size_t n);
    tpd_status (*add)(tpd_kern_ctx *ctx, void *out, const void *a, const void *b, size_t n);
    tpd_status (*scale)(tpd_kern_ctx *ctx, void *x, float s, size_t n);

    /* ---- causal self-attention, scale 1/sqrt(HS), grouped-query (kernels.h) ---- */
    size_t (*attention_saved_bytes)(tpd_kern_ctx *ctx, int B, int T, int NH, int HS);
    tpd_status (*attention_fwd)(tpd_kern_ctx *ctx, void *out, void *saved, const void *qkv, int B,
                                int T, int NH, int NKV, int HS);
    tpd_status (*attention_bwd)(tpd_kern_ctx *ctx, void *dqkv, const void *dout, const void *qkv,
                                const void *out, const void *saved, int B, int T, int NH, int NKV,
                                int HS);
    tpd_status (*attention_block_fwd)(tpd_kern_ctx *ctx, float *o, float *m, float *l,
                                      const void *qkv, const void *kv, const int32_t *qpos,
                                      const int32_t *kpos, int B, int T, int Tk, int NH, int NKV,
                                      int HS);
    tpd_status (*attention_block_finish)(tpd_kern_ctx *ctx, void *out, float *lse, const float *o,
                                         const float *m, const float *l, int B, int T, int NH,
                                         int HS);
    tpd_status (*attention_block_bwd)(tpd_kern_ctx *ctx, float *dq, float *dkv, const void *dout,
                                      const void *out, const float *lse, const void *qkv,
                                      const void *kv, const int32_t *qpos, const int32_t *kpos,
                                      int B, int T, int Tk, int NH, int NKV, int HS);
    tpd_status (*attention_decode)(tpd_kern_ctx *ctx, void *out, const void *q, const void *kcache,
                                   const void *vcache, int len, int NH, int NKV, int HS);

    /* ---- mixture of experts: token rows moved to and from their experts (kernels.h) ---- */
    tpd_status (*gather_rows)(tpd_kern_ctx *ctx, void *out, const void *inp, const int32_t *idx,
                              int N, int C);
    tpd_status (*scatter_add_rows)(tpd_kern_ctx *ctx, void *out, const void *inp,
                                   const int32_t *idx, int N, int C, int rows_out);
    tpd_status (*scale_rows)(tpd_kern_ctx *ctx, void *out, const void *inp, const float *s, int N,
                             int C);
    tpd_status (*row_dot)(tpd_kern_ctx *ctx, float *out, const void *a, const void *b, int N,
                          int C);

    /* ---- softmax cross-entropy, vocab-parallel pieces ----
     * logits(N,Vl) are this rank's vocab columns [v0, v0+Vl); only the first Vvalid of
     * them are real tokens (the rest is padding and never enters the softmax). The
     * caller all-reduces between the steps: max (MAX), then sumexp and tgt (SUM). */
    tpd_status (*xent_max)(tpd_kern_ctx *ctx, float *maxv, const void *logits, int N, int Vl,
                           int Vvalid);
    tpd_status (*xent_sumexp)(tpd_kern_ctx *ctx, float *sumexp, float *tgt, const void *logits,
                              const float *maxv, const int32_t *targets, int N, int Vl, int Vvalid,
                              int v0);
    tpd_status (*xent_loss)(tpd_kern_ctx *ctx, float *loss, const float *maxv, const float *sumexp,
                            const float *tgt, int N);
    tpd_status (*xent_bwd)(tpd_kern_ctx *ctx, void *logits, const float *maxv, const float *sumexp,
                           const int32_t *targets, float dloss, int N, int Vl, int Vvalid, int v0);
    tpd_status (*sum_f32)(tpd_kern_ctx *ctx, const float *x, size_t n, double *sum_p);

    /* ---- optimizer ---- */
    tpd_status (*adamw)(tpd_kern_ctx *ctx, void *param, float *master, const void *grad, float *m,
                        float *v, size_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int step, float grad_scale);
    tpd_status (*sgd)(tpd_kern_ctx *ctx, void *param, float *master, const void *grad, size_t n,
                      float lr, float weight_decay, float grad_scale);
    tpd_status (*grad_acc)(tpd_kern_ctx *ctx, void *dst, const void *src, size_t n);
    tpd_status (*outer_delta)(tpd_kern_ctx *ctx, float *delta, const float *sync, const float *w,
                              size_t n);
    tpd_status (*outer_nesterov)(tpd_kern_ctx *ctx, void *param, float *master, float *sync,
                                 float *mom, const float *delta, size_t n, float lr, float momentum,
                                 float scale);
    tpd_status (*sumsq)(tpd_kern_ctx *ctx, const void *x, tpd_dtype dt, size_t n, double *sumsq_p);
    tpd_status (*sumsq_acc)(tpd_kern_ctx *ctx, const void *x, tpd_dtype dt, size_t n);
    tpd_status (*sumsq_take)(tpd_kern_ctx *ctx, double *sumsq_p);
    tpd_status (*cast)(tpd_kern_ctx *ctx, void *dst, tpd_dtype dst_dt, const void *src,
                       tpd_dtype src_dt, size_t n);

    /* ---- teardown ---- */
    void (*destroy)(tpd_kern_ctx *ctx);

    /* ---- Llama's block (kernels.h) ---- */
    tpd_status (*rmsnorm_fwd)(tpd_kern_ctx *ctx, void *out, float *rstd, const void *inp,
                              const void *w, int N, int C, double eps);
    tpd_status (*rmsnorm_bwd)(tpd_kern_ctx *ctx, void *dinp, void *dw, const void *dout,
                              const void *inp, const void *w, const float *rstd, int N, int C);
    tpd_status (*qk_norm_fwd)(tpd_kern_ctx *ctx, void *qkv, void *raw, float *rstd, const void *wq,
                              const void *wk, int N, int NH, int NKV, int HS, double eps);
    tpd_status (*qk_norm_bwd)(tpd_kern_ctx *ctx, void *dqkv, void *dwq, void *dwk, const void *raw,
                              const void *wq, const void *wk, const float *rstd, int N, int NH,
                              int NKV, int HS);
    tpd_status (*rope_fwd)(tpd_kern_ctx *ctx, void *qkv, int B, int T, int NH, int NKV, int HS,
                           const tpd_rope *rope, int pos0);
    tpd_status (*rope_bwd)(tpd_kern_ctx *ctx, void *dqkv, int B, int T, int NH, int NKV, int HS,
                           const tpd_rope *rope, int pos0);
    tpd_status (*swiglu_fwd)(tpd_kern_ctx *ctx, void *out, const void *inp, int N, int F);
    tpd_status (*swiglu_bwd)(tpd_kern_ctx *ctx, void *dinp, const void *inp, const void *dout,
                             int N, int F);

    /* ---- scratch reservation, host staging, events, the loss accumulator (kernels.h) ---- */
    tpd_status (*scratch_reserve)(tpd_kern_ctx *ctx, const tpd_kern_shapes *s, size_t *bytes_p);
    tpd_status (*host_alloc)(tpd_kern_ctx *ctx, size_t bytes, void **ptr_p);
    void (*host_free)(tpd_kern_ctx *ctx, void *ptr);
    tpd_status (*copy_to_device_async)(tpd_kern_ctx *ctx, void *dst, const void *src, size_t bytes);
    tpd_status (*event_create)(tpd_kern_ctx *ctx, void **event_p);
    void (*event_destroy)(tpd_kern_ctx *ctx, void *event);
    tpd_status (*event_record)(tpd_kern_ctx *ctx, void *event);
    tpd_status (*event_wait)(tpd_kern_ctx *ctx, void *event);
    tpd_status (*sum_f32_acc)(tpd_kern_ctx *ctx, double *acc, const float *x, size_t n, double div);
} tpd_kern_ops;

/* The per-op scratch sizes behind tpd_kern_scratch_plan (kernels/scratch.c), shared with
 * the cuda kernels that use them so that the plan and the use cannot drift apart. */
#define TPD_KERN_LN_BWD_ROWS 32     /* LayerNorm backward: rows per block (one partial row) */
#define TPD_KERN_RMS_BWD_ROWS 256   /* RMSNorm backward: rows per dw partial row */
#define TPD_KERN_BIAS_GRAD_ROWS 256 /* bias gradient: rows per partial row */
size_t tpd_kern_layernorm_bwd_scratch(int N, int C);
size_t tpd_kern_rmsnorm_bwd_scratch(int N, int C);
size_t tpd_kern_bias_grad_scratch(int N, int OC);
/* The embedding backward's four (N) int32 arrays, each 256-byte aligned, then the sort's
 * temp; the bound on that temp (cub's onesweep radix sort of N int32 pairs: alternate keys
 * and values, 2 arrays; look-back tiles, at most one array; histograms, under 64 KiB). */
size_t tpd_kern_embed_sort_array(int N);
size_t tpd_kern_embed_sort_temp_bound(int N);
/* scatter_add_rows of N rows: its four (N) int32 sort arrays and the sort's temp (the
 * embedding backward's sizes) */
size_t tpd_kern_scatter_rows_scratch(int N);
/* the cuda embedding backward: sorted positions per chunk of its first pass, and the bytes
 * of its fp32 partial sums */
#define TPD_KERN_EMBED_SEG 32
size_t tpd_kern_embed_partials_bytes(int N, int C);
/* Unfused attention: P(B,NH,T,T) in elements of es bytes; the backward's work beside P (dS
 * of P's size, and with grouped-query heads (G = NH/NKV > 1) full(B,T,2,NH,HS)). */
size_t tpd_kern_attention_probs_bytes(int B, int T, int NH, size_t es);
size_t tpd_kern_attention_bwd_work_bytes(int B, int T, int NH, int NKV, int HS, size_t es);
/* cuDNN's own workspace for a fused attention plan: a bound (scratch.c says why), and the
 * dQ accumulator (B,NH,T,HS) fp32 that the backward keeps beside it. */
size_t tpd_kern_cudnn_plan_workspace_bound(int B, int T, int NH, int HS);
size_t tpd_kern_cudnn_dq_accum_bytes(int B, int T, int NH, int HS);
/* The current cuDNN backward pattern's softmax_sum workspace, (B,NH,T) fp32. */
size_t tpd_kern_cudnn_softmax_sum_bytes(int B, int T, int NH);
/* The unfused path's fp32 scores of one batch index, (NH,T,T), before the softmax: none when
 * es is 4 (fp32, where they are P's own buffer). */
size_t tpd_kern_attention_scores_bytes(int T, int NH, size_t es);

struct tpd_kern_backend {
    const tpd_kern_ops *ops;
    tpd_kern_ctx *ctx;
    const char *name;      /* "cpu" or "cuda" */
    tpd_dtype act_dtype;   /* activations */
    tpd_dtype param_dtype; /* the working copy of parameters used by matmuls */
    tpd_dtype grad_dtype;  /* gradients */
    int has_master;        /* 1 when fp32 master weights exist beside param */
    int device_memory;     /* 1 when pointers are not host-addressable */
    void *stream;          /* cuda: the compute stream (cudaStream_t); NULL on cpu */
};

#ifdef __cplusplus
}
#endif
#endif
