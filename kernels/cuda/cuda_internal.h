/* Private declarations of the cuda backend: the context, the error macros and the op
 * implementations that cuda_backend.cu puts in the ops table.
 *
 * Every op is queued on ctx->stream and returns without waiting, except those whose
 * result lands in host memory (sum_f32, sumsq). Tensors are in ctx->dtype (BF16 with fp32
 * master weights, or F32 throughout), parameter gradients in ctx->grad_dtype (F32 under
 * BF16 with fp32 main gradients); statistics, losses and optimizer state are fp32.
 *
 * Kernels are templates over the element type (float or __nv_bfloat16) and compute in
 * fp32; the entry points are C-linkage functions with the ops-table signatures. */
#ifndef TPD_KERNELS_CUDA_CUDA_INTERNAL_H
#define TPD_KERNELS_CUDA_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "base/status.h"
#include "kernels/attention_choice.h"
#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

#define TPD_CUDA_GEMM_WORKSPACE_BYTES TPD_KERN_GEMM_WORKSPACE_BYTES
#define TPD_CUDA_GEMM_CACHE_SLOTS 256 /* distinct GEMM shapes remembered */
#define TPD_CUDA_ATTN_CACHE_SLOTS 32  /* distinct cuDNN attention plans */

/* One remembered cuBLASLt heuristic result, keyed by everything that changes the choice. */
typedef struct tpd_cuda_gemm_key {
    int transa, transb;
    int64_t m, n, k, lda, ldb, ldd;
    int64_t stride_a, stride_b, stride_d;
    int batch;
    int dtype;    /* tpd_dtype of A and B (and of C and D unless d_fp32) */
    int d_fp32;   /* C and D are fp32 */
    int epilogue; /* cublasLtEpilogue_t */
    int beta_nonzero;
    /* Byte alignment (a power of two up to 256) of every batch item of A, B and D (which
     * is also C), and of the bias and aux pointers: cuBLASLt picks kernels by them. */
    int align_a, align_b, align_d, align_bias, align_aux;
} tpd_cuda_gemm_key;

typedef struct tpd_cuda_gemm_slot {
    int used;
    int unsupported; /* cuBLASLt refused the key (no algorithm, or cublasLtMatmul refused it) */
    tpd_cuda_gemm_key key;
    cublasLtMatmulAlgo_t algo;
} tpd_cuda_gemm_slot;

/* A finalized cuDNN execution plan for one attention shape and direction. */
typedef struct tpd_cuda_attn_plan {
    int used;
    int bwd;     /* 0 forward, 1 backward */
    int pattern; /* backward: TPD_ATTN_PATH_FUSED (current cuDNN 9 graph) or _FUSED_OLD */
    int B, T, NH, NKV, HS;
    /* 1 when cuDNN has no engine for this grouped-query shape: remembered so that the
     * graph is not rebuilt on every call, and the op takes the unfused path instead. */
    int unsupported;
    cudnnBackendDescriptor_t plan;
    void *graph;             /* every descriptor the plan references, freed with it */
    int64_t workspace_bytes; /* the plan's own workspace */
} tpd_cuda_attn_plan;

/* The attention path of one shape (kernels/attention_choice.h), decided once at plan time. */
typedef struct tpd_cuda_attn_decision {
    int used;
    int B, T, NH, HS;
    tpd_attn_choice choice;
} tpd_cuda_attn_decision;

struct tpd_kern_ctx {
    int device;
    tpd_dtype dtype;      /* act = param dtype */
    tpd_dtype grad_dtype; /* parameter gradients: dtype, or F32 (fp32 main gradients) */
    int fused_attention;
    /* Grouped-query shapes (NKV < NH) on the fused path: 1 = cuDNN (default), 0 = the
     * unfused path with softmax statistics (TRIPOD_CUDNN_GQA=0 at create time). */
    int cudnn_gqa;
    int gqa_fallback_logged; /* the one-time note that a GQA shape left cuDNN */
    int32_t
        *attn_seq_len; /* the padding mask's lengths (cudnn_rules.h), attn_seq_len_cap of them */
    int attn_seq_len_cap;
    tpd_attn_force attn_force; /* TRIPOD_CUDNN_ATTN at create time */
    tpd_cuda_attn_decision attn_decisions[TPD_CUDA_ATTN_CACHE_SLOTS];
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *gemm_workspace; /* TPD_CUDA_GEMM_WORKSPACE_BYTES */
    cudnnHandle_t cudnn;
    tpd_cuda_gemm_slot gemm_cache[TPD_CUDA_GEMM_CACHE_SLOTS];
    tpd_cuda_attn_plan attn_cache[TPD_CUDA_ATTN_CACHE_SLOTS];
    /* Scratch shared by ops that need temporary device memory (norm and bias-gradient
     * partial sums, embedding sort buffers, attention workspaces). Every op runs on
     * ctx->stream, so one op's use of it has finished before the next op's kernels start.
     * The engine reserves the planned size once (tpd_kern_scratch_reserve; then
     * scratch_planned = 1 and growing is an error in debug builds, a warning otherwise);
     * unplanned, it grows with stream-ordered cudaFreeAsync/cudaMallocAsync so in-flight
     * kernels keep the old one. */
    void *scratch;
    size_t scratch_bytes;
    int scratch_planned;
    double *host_result;   /* pinned, 1 double: where host-result ops land their value */
    void *reduce_partials; /* device, TPD_CUDA_REDUCE_BLOCKS doubles + 1 result + the running
                              sum of squares (tpd_kern_sumsq_acc) */
};

#define TPD_CUDA_REDUCE_BLOCKS 256

#ifdef __cplusplus
extern "C" {
#endif

/* ---- error helpers (cuda_backend.cu) ---- */
tpd_status tpd_cuda_check(cudaError_t err, const char *what, const char *file, int line);
tpd_status tpd_cublas_check(cublasStatus_t st, const char *what, const char *file, int line);
tpd_status tpd_cudnn_check(cudnnStatus_t st, const char *what, const char *file, int line);

#define TPD_CUDA(call) tpd_cuda_check((call), #call, __FILE__, __LINE__)
#define TPD_CUBLAS(call) tpd_cublas_check((call), #call, __FILE__, __LINE__)
#define TPD_CUDNN(call) tpd_cudnn_check((call), #call, __FILE__, __LINE__)
/* After a kernel launch: reports a bad launch configuration at the op that caused it. */
#define TPD_CUDA_LAUNCHED(what) tpd_cuda_check(cudaGetLastError(), (what), __FILE__, __LINE__)

#define TPD_CUDA_REQUIRE(cond, ...)                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            tpd_log_error(__VA_ARGS__);                                                            \
            return TPD_ERR_INVALID;                                                                \
        }                                                                                          \
    } while (0)

size_t tpd_cuda_dtype_size(tpd_dtype dt);

/* Device scratch of at least `bytes`, valid until the next call on this context. */
tpd_status tpd_cuda_scratch(tpd_kern_ctx *ctx, size_t bytes, void **ptr_p);

/* ---- GEMM (cuda_gemm.cu) ----
 * Row-major D(M,N) = alpha * op(A)(M,K) @ op(B)(K,N) + beta * D, batched with element
 * strides. op(A) = A stored (M,K) with row stride lda, or (K,M) when transa. Likewise B:
 * (K,N), or (N,K) when transb. A, B and D are in `dt`, except D (which is also C) when
 * d_fp32: then fp32, so that a weight gradient accumulates (beta = 1) in fp32 from bf16
 * operands (fp32 main gradients), or bf16 products are kept in fp32 (the attention scores
 * before the softmax). epilogue BIAS adds bias(N) to every row; GELU_AUX_BIAS
 * also stores the pre-activation into aux (M,N) with row stride ldd. */
typedef struct tpd_cuda_gemm_args {
    int transa, transb;
    int64_t M, N, K;
    const void *A;
    int64_t lda, stride_a;
    const void *B;
    int64_t ldb, stride_b;
    void *D;
    int64_t ldd, stride_d;
    int batch;
    float alpha, beta;
    tpd_dtype dt;
    cublasLtEpilogue_t epilogue;
    const void *bias; /* (N) */
    void *aux;        /* (M,N) */
    int d_fp32;       /* 1: C and D are fp32 whatever dt (no epilogue) */
} tpd_cuda_gemm_args;

#define TPD_CUDA_GEMM_ARGS_INIT                                                                    \
    {                                                                                              \
        0, 0, 0, 0, 0, NULL, 0, 0, NULL, 0, 0, NULL, 0, 0, 1, 1.0f, 0.0f, TPD_DTYPE_F32,           \
            CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0                                               \
    }

tpd_status tpd_cuda_gemm(tpd_kern_ctx *ctx, const tpd_cuda_gemm_args *g);
/* Same, but returns TPD_ERR_UNSUPPORTED without logging when cuBLASLt has no algorithm
 * (callers with an unfused fallback). */
tpd_status tpd_cuda_gemm_try(tpd_kern_ctx *ctx, const tpd_cuda_gemm_args *g);

/* ---- ops (one file each) ---- */
tpd_status tpd_kern_cuda_embed_fwd(tpd_kern_ctx *ctx, void *out, const int32_t *tokens,
                                   const void *wte, int N, int C, int v0, int Vl);
tpd_status tpd_kern_cuda_embed_bwd(tpd_kern_ctx *ctx, void *dwte, const void *dout,
                                   const int32_t *tokens, int N, int C, int v0, int Vl);
tpd_status tpd_kern_cuda_pos_fwd(tpd_kern_ctx *ctx, void *out, const void *wpe, int B, int T,
                                 int C);
tpd_status tpd_kern_cuda_pos_bwd(tpd_kern_ctx *ctx, void *dwpe, const void *dout, int B, int T,
                                 int C);

tpd_status tpd_kern_cuda_layernorm_fwd(tpd_kern_ctx *ctx, void *out, float *mean, float *rstd,
                                       const void *inp, const void *w, const void *b, int N, int C,
                                       double eps);
tpd_status tpd_kern_cuda_layernorm_bwd(tpd_kern_ctx *ctx, void *dinp, void *dw, void *db,
                                       const void *dout, const void *inp, const void *w,
                                       const float *mean, const float *rstd, int N, int C);

tpd_status tpd_kern_cuda_matmul_fwd(tpd_kern_ctx *ctx, void *out, const void *inp, const void *w,
                                    const void *bias, int N, int C, int OC);
tpd_status tpd_kern_cuda_matmul_bwd(tpd_kern_ctx *ctx, void *dinp, void *dw, void *dbias,
                                    const void *dout, const void *inp, const void *w, int N, int C,
                                    int OC);
tpd_status tpd_kern_cuda_bias_add(tpd_kern_ctx *ctx, void *out, const void *bias, int N, int OC);
tpd_status tpd_kern_cuda_matmul_gelu_fwd(tpd_kern_ctx *ctx, void *out, void *pre, const void *inp,
                                         const void *w, const void *bias, int N, int C, int OC);
/* dbias(OC) += colsum(dout(N,OC)), fp32 sums in a fixed order (cuda_elementwise.cu);
 * dbias in ctx->grad_dtype. */
tpd_status tpd_kern_cuda_colsum_acc(tpd_kern_ctx *ctx, void *dbias, const void *dout, int N,
                                    int OC);

tpd_status tpd_kern_cuda_gelu_fwd(tpd_kern_ctx *ctx, void *out, const void *inp, size_t n);
tpd_status tpd_kern_cuda_gelu_bwd(tpd_kern_ctx *ctx, void *dinp, const void *inp, const void *dout,
                                  size_t n);
tpd_status tpd_kern_cuda_add(tpd_kern_ctx *ctx, void *out, const void *a, const void *b, size_t n);
tpd_status tpd_kern_cuda_scale(tpd_kern_ctx *ctx, void *x, float s, size_t n);
tpd_status tpd_kern_cuda_cast(tpd_kern_ctx *ctx, void *dst, tpd_dtype dst_dt, const void *src,
                              tpd_dtype src_dt, size_t n);

size_t tpd_kern_cuda_attention_saved_bytes(tpd_kern_ctx *ctx, int B, int T, int NH, int HS);
tpd_status tpd_kern_cuda_attention_fwd(tpd_kern_ctx *ctx, void *out, void *saved, const void *qkv,
                                       int B, int T, int NH, int NKV, int HS);
tpd_status tpd_kern_cuda_attention_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                       const void *qkv, const void *out, const void *saved, int B,
                                       int T, int NH, int NKV, int HS);
/* (cuda_attention_decode.cu) */
tpd_status tpd_kern_cuda_attention_decode(tpd_kern_ctx *ctx, void *out, const void *q,
                                          const void *kcache, const void *vcache, int len, int NH,
                                          int NKV, int HS);
/* The implementations behind the ops above: the fused cuDNN path
 * (cuda_attention_cudnn.cu; BF16 only) and the unfused cuBLASLt + softmax path
 * (cuda_attention.cu). Shapes are checked by the ops. */
/* The path of a multi-head shape, decided on first call and remembered (plan time: the model
 * asks the saved-buffer size first): the cuDNN graphs are built, the current backward pattern
 * first and the older one second, and tpd_attn_choose (kernels/attention_choice.h) picks; a
 * fallback to the unfused path is logged once per shape. Grouped-query calls of the shape
 * follow the same path (their graphs are built on first use). */
const tpd_attn_choice *tpd_cuda_attention_decide(tpd_kern_ctx *ctx, int B, int T, int NH, int HS);
tpd_status tpd_cuda_attention_cudnn_fwd(tpd_kern_ctx *ctx, void *out, float *stats, const void *qkv,
                                        int B, int T, int NH, int NKV, int HS);
tpd_status tpd_cuda_attention_cudnn_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                        const void *qkv, const void *out, const float *stats, int B,
                                        int T, int NH, int NKV, int HS);
/* Unfused, saving the probabilities P(B,NH,T,T) in ctx->dtype. */
tpd_status tpd_cuda_attention_gemm_fwd(tpd_kern_ctx *ctx, void *out, void *probs, const void *qkv,
                                       int B, int T, int NH, int NKV, int HS);
tpd_status tpd_cuda_attention_gemm_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                       const void *qkv, const void *probs, int B, int T, int NH,
                                       int NKV, int HS);
/* Unfused, saving what the fused path saves: softmax statistics stats(B,NH,T) fp32, the
 * max plus the natural log of the sum of exp of the scaled, masked scores. P lives in
 * scratch; the backward recomputes it. The fused path's fallback for grouped-query shapes
 * that cuDNN does not take. */
tpd_status tpd_cuda_attention_gemm_fwd_stats(tpd_kern_ctx *ctx, void *out, float *stats,
                                             const void *qkv, int B, int T, int NH, int NKV,
                                             int HS);
tpd_status tpd_cuda_attention_gemm_bwd_stats(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                             const void *qkv, const float *stats, int B, int T,
                                             int NH, int NKV, int HS);
void tpd_cuda_attention_cache_destroy(tpd_kern_ctx *ctx);

/* ---- Llama's block (cuda_rmsnorm.cu, cuda_rope.cu, cuda_swiglu.cu), Qwen3's QK norm
 * (cuda_qk_norm.cu) ---- */
tpd_status tpd_kern_cuda_rmsnorm_fwd(tpd_kern_ctx *ctx, void *out, float *rstd, const void *inp,
                                     const void *w, int N, int C, double eps);
tpd_status tpd_kern_cuda_rmsnorm_bwd(tpd_kern_ctx *ctx, void *dinp, void *dw, const void *dout,
                                     const void *inp, const void *w, const float *rstd, int N,
                                     int C);
tpd_status tpd_kern_cuda_qk_norm_fwd(tpd_kern_ctx *ctx, void *qkv, void *raw, float *rstd,
                                     const void *wq, const void *wk, int N, int NH, int NKV, int HS,
                                     double eps);
tpd_status tpd_kern_cuda_qk_norm_bwd(tpd_kern_ctx *ctx, void *dqkv, void *dwq, void *dwk,
                                     const void *raw, const void *wq, const void *wk,
                                     const float *rstd, int N, int NH, int NKV, int HS);
tpd_status tpd_kern_cuda_rope_fwd(tpd_kern_ctx *ctx, void *qkv, int B, int T, int NH, int NKV,
                                  int HS, const tpd_rope *rope, int pos0);
tpd_status tpd_kern_cuda_rope_bwd(tpd_kern_ctx *ctx, void *dqkv, int B, int T, int NH, int NKV,
                                  int HS, const tpd_rope *rope, int pos0);
tpd_status tpd_kern_cuda_swiglu_fwd(tpd_kern_ctx *ctx, void *out, const void *inp, int N, int F);
tpd_status tpd_kern_cuda_swiglu_bwd(tpd_kern_ctx *ctx, void *dinp, const void *inp,
                                    const void *dout, int N, int F);

/* ---- mixture of experts: token rows to and from their experts (cuda_moe.cu) ---- */
tpd_status tpd_kern_cuda_gather_rows(tpd_kern_ctx *ctx, void *out, const void *inp,
                                     const int32_t *idx, int N, int C);
tpd_status tpd_kern_cuda_scatter_add_rows(tpd_kern_ctx *ctx, void *out, const void *inp,
                                          const int32_t *idx, int N, int C, int rows_out);
tpd_status tpd_kern_cuda_scale_rows(tpd_kern_ctx *ctx, void *out, const void *inp, const float *s,
                                    int N, int C);
tpd_status tpd_kern_cuda_row_dot(tpd_kern_ctx *ctx, float *out, const void *a, const void *b, int N,
                                 int C);

tpd_status tpd_kern_cuda_xent_max(tpd_kern_ctx *ctx, float *maxv, const void *logits, int N, int Vl,
                                  int Vvalid);
tpd_status tpd_kern_cuda_xent_sumexp(tpd_kern_ctx *ctx, float *sumexp, float *tgt,
                                     const void *logits, const float *maxv, const int32_t *targets,
                                     int N, int Vl, int Vvalid, int v0);
tpd_status tpd_kern_cuda_xent_loss(tpd_kern_ctx *ctx, float *loss, const float *maxv,
                                   const float *sumexp, const float *tgt, int N);
tpd_status tpd_kern_cuda_xent_bwd(tpd_kern_ctx *ctx, void *logits, const float *maxv,
                                  const float *sumexp, const int32_t *targets, float dloss, int N,
                                  int Vl, int Vvalid, int v0);

tpd_status tpd_kern_cuda_adamw(tpd_kern_ctx *ctx, void *param, float *master, const void *grad,
                               float *m, float *v, size_t n, float lr, float beta1, float beta2,
                               float eps, float weight_decay, int step, float grad_scale);
tpd_status tpd_kern_cuda_sgd(tpd_kern_ctx *ctx, void *param, float *master, const void *grad,
                             size_t n, float lr, float weight_decay, float grad_scale);
tpd_status tpd_kern_cuda_grad_acc(tpd_kern_ctx *ctx, void *dst, const void *src, size_t n);
tpd_status tpd_kern_cuda_outer_delta(tpd_kern_ctx *ctx, float *delta, const float *sync,
                                     const float *w, size_t n);
tpd_status tpd_kern_cuda_outer_nesterov(tpd_kern_ctx *ctx, void *param, float *master, float *sync,
                                        float *mom, const float *delta, size_t n, float lr,
                                        float momentum, float scale);
tpd_status tpd_kern_cuda_sum_f32(tpd_kern_ctx *ctx, const float *x, size_t n, double *sum_p);
tpd_status tpd_kern_cuda_sum_f32_acc(tpd_kern_ctx *ctx, double *acc, const float *x, size_t n,
                                     double div);
tpd_status tpd_kern_cuda_sumsq(tpd_kern_ctx *ctx, const void *x, tpd_dtype dt, size_t n,
                               double *sumsq_p);
tpd_status tpd_kern_cuda_sumsq_acc(tpd_kern_ctx *ctx, const void *x, tpd_dtype dt, size_t n);
tpd_status tpd_kern_cuda_sumsq_take(tpd_kern_ctx *ctx, double *sumsq_p);

#ifdef __cplusplus
}
#endif
#endif
