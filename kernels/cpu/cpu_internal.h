/* Private declarations of the cpu backend: the context and the op implementations that
 * cpu_backend.c puts in the ops table.
 *
 * The backend computes in fp32 or in bf16 (the cuda backend's recipe, kernels.h's
 * conventions block): under bf16 the activations and parameters are bf16, the gradients
 * bf16 or fp32 (fp32_grads), and every op reads its bf16 tensors into fp32, computes in
 * fp32 and rounds once where it stores (tpd_cpu_ld / tpd_cpu_st below). Loops are OpenMP
 * with a num_threads clause taken from the context; fp32 matrix products go through
 * cblas_sgemm, bf16 ones through oneDNN (cpu_gemm.h). */
#ifndef TPD_KERNELS_CPU_CPU_INTERNAL_H
#define TPD_KERNELS_CPU_CPU_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/bf16.h"
#include "base/status.h"
#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

struct tpd_cpu_gemm;

struct tpd_kern_ctx {
    int num_threads;               /* OpenMP threads per op; 0 = runtime default */
    int act_bf16;                  /* 1: activations and parameters are bf16 */
    int grad_bf16;                 /* 1: parameter gradients are bf16 (bf16 without fp32_grads) */
    struct tpd_cpu_gemm *gemm;     /* the bf16 matrix products (NULL under fp32) */
    atomic_size_t bytes_allocated; /* live bytes handed out by ->alloc */
    double sumsq_acc;              /* tpd_kern_sumsq_acc's running sum */
};

/* Element i of a tensor that is bf16 when bf is 1, else fp32, widened to fp32 (exact), and
 * the store that rounds once to nearest even. The branch is loop-invariant in every use,
 * so -O3 unswitches the loops and the fp32 path compiles as if it were plain float code. */
static inline float tpd_cpu_ld(const void *p, size_t i, int bf) {
    return bf ? tpd_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
static inline void tpd_cpu_st(void *p, size_t i, float v, int bf) {
    if (bf)
        ((uint16_t *)p)[i] = tpd_bf16_from_f32(v);
    else
        ((float *)p)[i] = v;
}
/* p[i] += v in the tensor's dtype (a bf16 element is widened, added to in fp32, rounded). */
static inline void tpd_cpu_add_to(void *p, size_t i, float v, int bf) {
    tpd_cpu_st(p, i, tpd_cpu_ld(p, i, bf) + v, bf);
}
/* Bytes of an element of the activation dtype. */
static inline size_t tpd_cpu_act_size(const tpd_kern_ctx *ctx) {
    return ctx->act_bf16 ? 2 : 4;
}

/* Threads for the next parallel region of this context. */
int tpd_kern_cpu_threads(const tpd_kern_ctx *ctx);

/* 1 when cblas_sgemm may be called from inside our own parallel region without the
 * calls contending for one BLAS thread pool: the BLAS is sequential, OpenMP-threaded
 * (it then runs single-threaded inside a parallel region) or limited to one thread.
 * With a multi-threaded pthreads OpenBLAS we instead loop serially and let each sgemm
 * use the BLAS threads. */
int tpd_kern_cpu_blas_nested_ok(void);

/* Fail with TPD_ERR_INVALID and a message naming the op when a precondition on the
 * caller's arguments does not hold. */
#define TPD_CPU_REQUIRE(cond, ...)                                                                 \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            tpd_log_error(__VA_ARGS__);                                                            \
            return TPD_ERR_INVALID;                                                                \
        }                                                                                          \
    } while (0)

tpd_status tpd_kern_cpu_sumsq_acc(tpd_kern_ctx *ctx, const void *x, tpd_dtype dt, size_t n);
tpd_status tpd_kern_cpu_sumsq_take(tpd_kern_ctx *ctx, double *sumsq_p);

/* ---- embedding (cpu_embed.c) ---- */
tpd_status tpd_kern_cpu_embed_fwd(tpd_kern_ctx *ctx, void *out, const int32_t *tokens,
                                  const void *wte, int N, int C, int v0, int Vl);
tpd_status tpd_kern_cpu_embed_bwd(tpd_kern_ctx *ctx, void *dwte, const void *dout,
                                  const int32_t *tokens, int N, int C, int v0, int Vl);
tpd_status tpd_kern_cpu_pos_fwd(tpd_kern_ctx *ctx, void *out, const void *wpe, int B, int T, int C);
tpd_status tpd_kern_cpu_pos_bwd(tpd_kern_ctx *ctx, void *dwpe, const void *dout, int B, int T,
                                int C);

/* ---- layernorm (cpu_layernorm.c) ---- */
tpd_status tpd_kern_cpu_layernorm_fwd(tpd_kern_ctx *ctx, void *out, float *mean, float *rstd,
                                      const void *inp, const void *w, const void *b, int N, int C,
                                      double eps);
tpd_status tpd_kern_cpu_layernorm_bwd(tpd_kern_ctx *ctx, void *dinp, void *dw, void *db,
                                      const void *dout, const void *inp, const void *w,
                                      const float *mean, const float *rstd, int N, int C);

/* ---- matmul (cpu_matmul.c) ---- */
tpd_status tpd_kern_cpu_matmul_fwd(tpd_kern_ctx *ctx, void *out, const void *inp, const void *w,
                                   const void *bias, int N, int C, int OC);
tpd_status tpd_kern_cpu_matmul_bwd(tpd_kern_ctx *ctx, void *dinp, void *dw, void *dbias,
                                   const void *dout, const void *inp, const void *w, int N, int C,
                                   int OC);
tpd_status tpd_kern_cpu_bias_add(tpd_kern_ctx *ctx, void *out, const void *bias, int N, int OC);
tpd_status tpd_kern_cpu_matmul_gelu_fwd(tpd_kern_ctx *ctx, void *out, void *pre, const void *inp,
                                        const void *w, const void *bias, int N, int C, int OC);

/* ---- elementwise (cpu_elementwise.c) ---- */
tpd_status tpd_kern_cpu_gelu_fwd(tpd_kern_ctx *ctx, void *out, const void *inp, size_t n);
tpd_status tpd_kern_cpu_gelu_bwd(tpd_kern_ctx *ctx, void *dinp, const void *inp, const void *dout,
                                 size_t n);
tpd_status tpd_kern_cpu_add(tpd_kern_ctx *ctx, void *out, const void *a, const void *b, size_t n);
tpd_status tpd_kern_cpu_scale(tpd_kern_ctx *ctx, void *x, float s, size_t n);

/* ---- attention (cpu_attention.c) ---- */
size_t tpd_kern_cpu_attention_saved_bytes(tpd_kern_ctx *ctx, int B, int T, int NH, int HS);
tpd_status tpd_kern_cpu_attention_fwd(tpd_kern_ctx *ctx, void *out, void *saved, const void *qkv,
                                      int B, int T, int NH, int NKV, int HS);
tpd_status tpd_kern_cpu_attention_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                      const void *qkv, const void *out, const void *saved, int B,
                                      int T, int NH, int NKV, int HS);
/* (cpu_moe.c) */
tpd_status tpd_kern_cpu_gather_rows(tpd_kern_ctx *ctx, void *out, const void *inp,
                                    const int32_t *idx, int N, int C);
tpd_status tpd_kern_cpu_scatter_add_rows(tpd_kern_ctx *ctx, void *out, const void *inp,
                                         const int32_t *idx, int N, int C, int rows_out);
tpd_status tpd_kern_cpu_scale_rows(tpd_kern_ctx *ctx, void *out, const void *inp, const float *s,
                                   int N, int C);
tpd_status tpd_kern_cpu_row_dot(tpd_kern_ctx *ctx, float *out, const void *a, const void *b, int N,
                                int C);
/* (cpu_attention_block.c) */
tpd_status tpd_kern_cpu_attention_block_fwd(tpd_kern_ctx *ctx, float *o, float *m, float *l,
                                            const void *qkv, const void *kv, const int32_t *qpos,
                                            const int32_t *kpos, int B, int T, int Tk, int NH,
                                            int NKV, int HS);
tpd_status tpd_kern_cpu_attention_block_finish(tpd_kern_ctx *ctx, void *out, float *lse,
                                               const float *o, const float *m, const float *l,
                                               int B, int T, int NH, int HS);
tpd_status tpd_kern_cpu_attention_block_bwd(tpd_kern_ctx *ctx, float *dq, float *dkv,
                                            const void *dout, const void *out, const float *lse,
                                            const void *qkv, const void *kv, const int32_t *qpos,
                                            const int32_t *kpos, int B, int T, int Tk, int NH,
                                            int NKV, int HS);
/* (cpu_attention_decode.c) */
tpd_status tpd_kern_cpu_attention_decode(tpd_kern_ctx *ctx, void *out, const void *q,
                                         const void *kcache, const void *vcache, int len, int NH,
                                         int NKV, int HS);

/* The ops table's attention entries (cpu_attention_stage.c): the kernels above under fp32,
 * and under bf16 the same kernels on fp32 copies of the bf16 tensors. */
tpd_status tpd_kern_cpu_stage_attention_fwd(tpd_kern_ctx *ctx, void *out, void *saved,
                                            const void *qkv, int B, int T, int NH, int NKV, int HS);
tpd_status tpd_kern_cpu_stage_attention_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                            const void *qkv, const void *out, const void *saved,
                                            int B, int T, int NH, int NKV, int HS);
tpd_status tpd_kern_cpu_stage_attention_block_fwd(tpd_kern_ctx *ctx, float *o, float *m, float *l,
                                                  const void *qkv, const void *kv,
                                                  const int32_t *qpos, const int32_t *kpos, int B,
                                                  int T, int Tk, int NH, int NKV, int HS);
tpd_status tpd_kern_cpu_stage_attention_block_finish(tpd_kern_ctx *ctx, void *out, float *lse,
                                                     const float *o, const float *m, const float *l,
                                                     int B, int T, int NH, int HS);
tpd_status tpd_kern_cpu_stage_attention_block_bwd(tpd_kern_ctx *ctx, float *dq, float *dkv,
                                                  const void *dout, const void *out,
                                                  const float *lse, const void *qkv, const void *kv,
                                                  const int32_t *qpos, const int32_t *kpos, int B,
                                                  int T, int Tk, int NH, int NKV, int HS);
tpd_status tpd_kern_cpu_stage_attention_decode(tpd_kern_ctx *ctx, void *out, const void *q,
                                               const void *kcache, const void *vcache, int len,
                                               int NH, int NKV, int HS);

/* ---- Llama's block: RMSNorm, RoPE, SwiGLU (cpu_llama.c) ---- */
tpd_status tpd_kern_cpu_rmsnorm_fwd(tpd_kern_ctx *ctx, void *out, float *rstd, const void *inp,
                                    const void *w, int N, int C, double eps);
tpd_status tpd_kern_cpu_rmsnorm_bwd(tpd_kern_ctx *ctx, void *dinp, void *dw, const void *dout,
                                    const void *inp, const void *w, const float *rstd, int N,
                                    int C);
tpd_status tpd_kern_cpu_qk_norm_fwd(tpd_kern_ctx *ctx, void *qkv, void *raw, float *rstd,
                                    const void *wq, const void *wk, int N, int NH, int NKV, int HS,
                                    double eps);
tpd_status tpd_kern_cpu_qk_norm_bwd(tpd_kern_ctx *ctx, void *dqkv, void *dwq, void *dwk,
                                    const void *raw, const void *wq, const void *wk,
                                    const float *rstd, int N, int NH, int NKV, int HS);
tpd_status tpd_kern_cpu_rope_fwd(tpd_kern_ctx *ctx, void *qkv, int B, int T, int NH, int NKV,
                                 int HS, const tpd_rope *rope, int pos0);
tpd_status tpd_kern_cpu_rope_bwd(tpd_kern_ctx *ctx, void *dqkv, int B, int T, int NH, int NKV,
                                 int HS, const tpd_rope *rope, int pos0);
tpd_status tpd_kern_cpu_swiglu_fwd(tpd_kern_ctx *ctx, void *out, const void *inp, int N, int F);
tpd_status tpd_kern_cpu_swiglu_bwd(tpd_kern_ctx *ctx, void *dinp, const void *inp, const void *dout,
                                   int N, int F);

/* ---- cross-entropy (cpu_xent.c) ---- */
tpd_status tpd_kern_cpu_xent_max(tpd_kern_ctx *ctx, float *maxv, const void *logits, int N, int Vl,
                                 int Vvalid);
tpd_status tpd_kern_cpu_xent_sumexp(tpd_kern_ctx *ctx, float *sumexp, float *tgt,
                                    const void *logits, const float *maxv, const int32_t *targets,
                                    int N, int Vl, int Vvalid, int v0);
tpd_status tpd_kern_cpu_xent_loss(tpd_kern_ctx *ctx, float *loss, const float *maxv,
                                  const float *sumexp, const float *tgt, int N);
tpd_status tpd_kern_cpu_xent_bwd(tpd_kern_ctx *ctx, void *logits, const float *maxv,
                                 const float *sumexp, const int32_t *targets, float dloss, int N,
                                 int Vl, int Vvalid, int v0);
tpd_status tpd_kern_cpu_sum_f32(tpd_kern_ctx *ctx, const float *x, size_t n, double *sum_p);

/* ---- optimizer and reductions (cpu_adamw.c) ---- */
tpd_status tpd_kern_cpu_adamw(tpd_kern_ctx *ctx, void *param, float *master, const void *grad,
                              float *m, float *v, size_t n, float lr, float beta1, float beta2,
                              float eps, float weight_decay, int step, float grad_scale);
tpd_status tpd_kern_cpu_sumsq(tpd_kern_ctx *ctx, const void *x, tpd_dtype dt, size_t n,
                              double *sumsq_p);
tpd_status tpd_kern_cpu_cast(tpd_kern_ctx *ctx, void *dst, tpd_dtype dst_dt, const void *src,
                             tpd_dtype src_dt, size_t n);

/* ---- plain SGD and DiLoCo's outer step (cpu_sgd.c) ---- */
tpd_status tpd_kern_cpu_sgd(tpd_kern_ctx *ctx, void *param, float *master, const void *grad,
                            size_t n, float lr, float weight_decay, float grad_scale);
tpd_status tpd_kern_cpu_grad_acc(tpd_kern_ctx *ctx, void *dst, const void *src, size_t n);
tpd_status tpd_kern_cpu_outer_delta(tpd_kern_ctx *ctx, float *delta, const float *sync,
                                    const float *w, size_t n);
tpd_status tpd_kern_cpu_outer_nesterov(tpd_kern_ctx *ctx, void *param, float *master, float *sync,
                                       float *mom, const float *delta, size_t n, float lr,
                                       float momentum, float scale);

/* Deterministic reductions to double: fixed-size chunks are reduced in parallel and the
 * partial results combined in order, so the bits depend neither on the thread count nor
 * on scheduling. */
typedef enum tpd_kern_cpu_reduce_kind {
    TPD_KERN_CPU_REDUCE_SUM_F32 = 0,   /* sum x, x fp32 */
    TPD_KERN_CPU_REDUCE_SUMSQ_F32 = 1, /* sum x^2, x fp32 */
    TPD_KERN_CPU_REDUCE_SUMSQ_BF16 = 2 /* sum x^2, x bf16 bit patterns */
} tpd_kern_cpu_reduce_kind;
tpd_status tpd_kern_cpu_reduce(tpd_kern_ctx *ctx, const void *x, size_t n,
                               tpd_kern_cpu_reduce_kind kind, double *result_p);

#endif
