/* Causal self-attention: the op entry points, which pick the fused cuDNN path or the
 * unfused one, and the unfused path itself (cuBLASLt batched GEMMs + causal softmax
 * kernels), forward and backward side by side.
 *
 * qkv(B,T,3,NH,HS) is read in place: head h of Q for batch b is the (T, HS) matrix at
 * qkv + b*T*3C + h*HS with row stride 3C (C = NH*HS), K and V follow at +C and +2C. So one
 * strided-batched GEMM per batch index covers all NH heads (batch stride HS) without a
 * permute. The unfused path saves the probabilities P(B,NH,T,T) in the activation dtype;
 * it is the reference the fused path is checked against, and the only path in f32. */
#include "kernels/cuda/cuda_common.cuh"

#include <math.h>

int tpd_cuda_attention_fused(const tpd_kern_ctx *ctx) {
    return ctx->fused_attention && ctx->dtype == TPD_DTYPE_BF16;
}

extern "C" size_t tpd_kern_cuda_attention_saved_bytes(tpd_kern_ctx *ctx, int B, int T, int NH,
                                                      int HS) {
    (void)HS;
    if (tpd_cuda_attention_fused(ctx)) return (size_t)B * NH * T * sizeof(float); /* stats */
    return (size_t)B * NH * T * T * tpd_cuda_dtype_size(ctx->dtype);              /* probs */
}

extern "C" tpd_status tpd_kern_cuda_attention_fwd(tpd_kern_ctx *ctx, void *out, void *saved,
                                                  const void *qkv, int B, int T, int NH, int NKV,
                                                  int HS) {
    TPD_CUDA_REQUIRE(B >= 0 && T > 0 && NH > 0 && HS > 0,
                     "attention_fwd: bad shape B=%d T=%d NH=%d HS=%d", B, T, NH, HS);
    TPD_CUDA_REQUIRE(NKV == NH,
                     "attention_fwd: grouped-query attention (NKV %d of NH %d) is not "
                     "implemented yet",
                     NKV, NH);
    if (B == 0) return TPD_OK;
    if (tpd_cuda_attention_fused(ctx))
        return tpd_cuda_attention_cudnn_fwd(ctx, out, (float *)saved, qkv, B, T, NH, HS);
    return tpd_cuda_attention_gemm_fwd(ctx, out, saved, qkv, B, T, NH, HS);
}

extern "C" tpd_status tpd_kern_cuda_attention_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                                  const void *qkv, const void *out,
                                                  const void *saved, int B, int T, int NH, int NKV,
                                                  int HS) {
    TPD_CUDA_REQUIRE(B >= 0 && T > 0 && NH > 0 && HS > 0,
                     "attention_bwd: bad shape B=%d T=%d NH=%d HS=%d", B, T, NH, HS);
    TPD_CUDA_REQUIRE(NKV == NH,
                     "attention_bwd: grouped-query attention (NKV %d of NH %d) is not "
                     "implemented yet",
                     NKV, NH);
    if (B == 0) return TPD_OK;
    if (tpd_cuda_attention_fused(ctx))
        return tpd_cuda_attention_cudnn_bwd(ctx, dqkv, dout, qkv, out, (const float *)saved, B, T,
                                            NH, HS);
    return tpd_cuda_attention_gemm_bwd(ctx, dqkv, dout, qkv, saved, B, T, NH, HS);
}

/* ---- unfused path ---- */

#define SM_WARPS 8 /* rows per block */

/* In place over p(rows, T): row r is query t = r % T; p[t, j] = softmax over j <= t of the
 * (already scaled) scores, 0 for j > t. fp32 arithmetic. */
template <typename T_> __global__ void causal_softmax_kernel(T_ *p, size_t rows, int T) {
    size_t r = (size_t)blockIdx.x * SM_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = (int)(r % (size_t)T);
    T_ *row = p + r * (size_t)T;
    float m = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        m = fmaxf(m, tpd_to_f(row[j]));
    m = tpd_warp_max(m);
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32)
        s += expf(tpd_to_f(row[j]) - m);
    float inv = 1.0f / tpd_warp_sum(s);
    for (int j = lane; j < T; j += 32)
        row[j] = tpd_from_f<T_>(j <= t ? expf(tpd_to_f(row[j]) - m) * inv : 0.0f);
}

/* Backward of P = softmax(S) per row, in place over dp:
 *   dS[t, j] = P[t, j] (dP[t, j] - sum_k P[t, k] dP[t, k]) for j <= t, else 0. */
template <typename T_>
__global__ void causal_softmax_bwd_kernel(T_ *dp, const T_ *p, size_t rows, int T) {
    size_t r = (size_t)blockIdx.x * SM_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = (int)(r % (size_t)T);
    T_ *drow = dp + r * (size_t)T;
    const T_ *prow = p + r * (size_t)T;
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32)
        s += tpd_to_f(prow[j]) * tpd_to_f(drow[j]);
    s = tpd_warp_sum(s);
    for (int j = lane; j < T; j += 32)
        drow[j] = tpd_from_f<T_>(j <= t ? tpd_to_f(prow[j]) * (tpd_to_f(drow[j]) - s) : 0.0f);
}

/* Per batch index b, NH heads at batch stride HS:
 *   S_h(T,T) = scale * Q_h(T,HS) @ K_h(T,HS)^T   -> probs
 *   P = causal softmax(S)
 *   out_h(T,HS) = P_h @ V_h(T,HS)                 -> out rows of stride C */
tpd_status tpd_cuda_attention_gemm_fwd(tpd_kern_ctx *ctx, void *out, void *probs, const void *qkv,
                                       int B, int T, int NH, int HS) {
    size_t es = tpd_cuda_dtype_size(ctx->dtype);
    int64_t C = (int64_t)NH * HS, C3 = 3 * C, TT = (int64_t)T * T;
    const char *qkv_b = (const char *)qkv;
    for (int b = 0; b < B; b++) {
        const char *q = qkv_b + (size_t)b * T * C3 * es;
        tpd_cuda_gemm_args g = TPD_CUDA_GEMM_ARGS_INIT;
        g.M = T;
        g.N = T;
        g.K = HS;
        g.A = q;
        g.lda = C3;
        g.stride_a = HS;
        g.B = q + (size_t)C * es;
        g.transb = 1;
        g.ldb = C3;
        g.stride_b = HS;
        g.D = (char *)probs + (size_t)b * NH * TT * es;
        g.ldd = T;
        g.stride_d = TT;
        g.batch = NH;
        g.alpha = 1.0f / sqrtf((float)HS);
        g.dt = ctx->dtype;
        TPD_CHECK(tpd_cuda_gemm(ctx, &g));
    }
    size_t rows = (size_t)B * NH * T;
    unsigned grid = (unsigned)((rows + SM_WARPS - 1) / SM_WARPS);
    TPD_CUDA_DISPATCH(ctx->dtype, E, {
        causal_softmax_kernel<E><<<grid, SM_WARPS * 32, 0, ctx->stream>>>((E *)probs, rows, T);
    });
    TPD_CHECK(TPD_CUDA_LAUNCHED("attention_fwd softmax"));
    for (int b = 0; b < B; b++) {
        const char *q = qkv_b + (size_t)b * T * C3 * es;
        tpd_cuda_gemm_args g = TPD_CUDA_GEMM_ARGS_INIT;
        g.M = T;
        g.N = HS;
        g.K = T;
        g.A = (const char *)probs + (size_t)b * NH * TT * es;
        g.lda = T;
        g.stride_a = TT;
        g.B = q + (size_t)2 * C * es;
        g.ldb = C3;
        g.stride_b = HS;
        g.D = (char *)out + (size_t)b * T * C * es;
        g.ldd = C;
        g.stride_d = HS;
        g.batch = NH;
        g.dt = ctx->dtype;
        TPD_CHECK(tpd_cuda_gemm(ctx, &g));
    }
    return TPD_OK;
}

/* Backward, per batch index b and head h (scale = 1/sqrt(HS)):
 *   dP = dO_h @ V_h^T;  dS = P * (dP - rowsum(P * dP))
 *   dQ_h = scale * dS @ K_h;  dK_h = scale * dS^T @ Q_h;  dV_h = P^T @ dO_h
 * dS lives in scratch (B,NH,T,T). dqkv is fully overwritten. */
tpd_status tpd_cuda_attention_gemm_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                       const void *qkv, const void *probs, int B, int T, int NH,
                                       int HS) {
    size_t es = tpd_cuda_dtype_size(ctx->dtype);
    int64_t C = (int64_t)NH * HS, C3 = 3 * C, TT = (int64_t)T * T;
    float scale = 1.0f / sqrtf((float)HS);
    void *dp = NULL;
    TPD_CHECK(tpd_cuda_scratch(ctx, (size_t)B * NH * TT * es, &dp));
    const char *qkv_b = (const char *)qkv;
    char *dqkv_b = (char *)dqkv;
    for (int b = 0; b < B; b++) {
        tpd_cuda_gemm_args g = TPD_CUDA_GEMM_ARGS_INIT;
        g.M = T;
        g.N = T;
        g.K = HS;
        g.A = (const char *)dout + (size_t)b * T * C * es;
        g.lda = C;
        g.stride_a = HS;
        g.B = qkv_b + ((size_t)b * T * C3 + 2 * C) * es;
        g.transb = 1;
        g.ldb = C3;
        g.stride_b = HS;
        g.D = (char *)dp + (size_t)b * NH * TT * es;
        g.ldd = T;
        g.stride_d = TT;
        g.batch = NH;
        g.dt = ctx->dtype;
        TPD_CHECK(tpd_cuda_gemm(ctx, &g));
    }
    size_t rows = (size_t)B * NH * T;
    unsigned grid = (unsigned)((rows + SM_WARPS - 1) / SM_WARPS);
    TPD_CUDA_DISPATCH(ctx->dtype, E, {
        causal_softmax_bwd_kernel<E>
            <<<grid, SM_WARPS * 32, 0, ctx->stream>>>((E *)dp, (const E *)probs, rows, T);
    });
    TPD_CHECK(TPD_CUDA_LAUNCHED("attention_bwd softmax"));
    for (int b = 0; b < B; b++) {
        const char *q = qkv_b + (size_t)b * T * C3 * es;
        char *dq = dqkv_b + (size_t)b * T * C3 * es;
        const char *ds = (const char *)dp + (size_t)b * NH * TT * es;
        const char *p = (const char *)probs + (size_t)b * NH * TT * es;
        const char *dob = (const char *)dout + (size_t)b * T * C * es;
        tpd_cuda_gemm_args g = TPD_CUDA_GEMM_ARGS_INIT;
        g.batch = NH;
        g.dt = ctx->dtype;
        g.M = T;
        g.N = HS;
        g.K = T;
        g.lda = T;
        g.stride_a = TT;
        g.ldd = C3;
        g.stride_d = HS;

        /* dQ = scale * dS @ K */
        g.A = ds;
        g.transa = 0;
        g.B = q + (size_t)C * es;
        g.ldb = C3;
        g.stride_b = HS;
        g.D = dq;
        g.alpha = scale;
        TPD_CHECK(tpd_cuda_gemm(ctx, &g));
        /* dK = scale * dS^T @ Q */
        g.transa = 1;
        g.B = q;
        g.D = dq + (size_t)C * es;
        TPD_CHECK(tpd_cuda_gemm(ctx, &g));
        /* dV = P^T @ dO */
        g.A = p;
        g.B = dob;
        g.ldb = C;
        g.D = dq + (size_t)2 * C * es;
        g.alpha = 1.0f;
        TPD_CHECK(tpd_cuda_gemm(ctx, &g));
    }
    return TPD_OK;
}
