/* Softmax cross-entropy in vocab-parallel pieces (max, sumexp + target logit, loss, and
 * the in-place backward), one block per row.
 *
 * The classifier is fused in the sense that matters for memory: xent_bwd turns the logits
 * into dlogits in place from (maxv, sumexp), so the (N, V) probabilities are never stored.
 * Padded vocab columns [Vvalid, Vl) never enter the softmax and get a zero gradient. */
#include "kernels/cuda/cuda_common.cuh"

#define XENT_BLOCK 512

template <typename T>
__global__ void xent_max_kernel(float *maxv, const T *logits, int Vl, int Vvalid) {
    const T *l = logits + (size_t)blockIdx.x * Vl;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < Vvalid; c += blockDim.x)
        m = fmaxf(m, tpd_to_f(l[c]));
    m = tpd_block_max(m);
    if (threadIdx.x == 0) maxv[blockIdx.x] = m;
}

extern "C" tpd_status tpd_kern_cuda_xent_max(tpd_kern_ctx *ctx, float *maxv, const void *logits,
                                             int N, int Vl, int Vvalid) {
    TPD_CUDA_REQUIRE(N >= 0 && Vl >= 0 && Vvalid >= 0 && Vvalid <= Vl,
                     "xent_max: bad shape N=%d Vl=%d Vvalid=%d", N, Vl, Vvalid);
    if (N == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        xent_max_kernel<T><<<N, XENT_BLOCK, 0, ctx->stream>>>(maxv, (const T *)logits, Vl, Vvalid);
    });
    return TPD_CUDA_LAUNCHED("xent_max");
}

template <typename T>
__global__ void xent_sumexp_kernel(float *sumexp, float *tgt, const T *logits, const float *maxv,
                                   const int32_t *targets, int Vl, int Vvalid, int v0) {
    int n = blockIdx.x;
    const T *l = logits + (size_t)n * Vl;
    float m = maxv[n];
    float s = 0.0f;
    /* A row whose global max is -inf has no valid column anywhere; keep its sum 0. */
    if (m != -INFINITY)
        for (int c = threadIdx.x; c < Vvalid; c += blockDim.x)
            s += __expf(tpd_to_f(l[c]) - m);
    s = tpd_block_sum(s);
    if (threadIdx.x == 0) {
        sumexp[n] = s;
        int64_t t = (int64_t)targets[n] - v0;
        tgt[n] = (t >= 0 && t < Vvalid) ? tpd_to_f(l[t]) : 0.0f;
    }
}

extern "C" tpd_status tpd_kern_cuda_xent_sumexp(tpd_kern_ctx *ctx, float *sumexp, float *tgt,
                                                const void *logits, const float *maxv,
                                                const int32_t *targets, int N, int Vl, int Vvalid,
                                                int v0) {
    TPD_CUDA_REQUIRE(N >= 0 && Vl >= 0 && Vvalid >= 0 && Vvalid <= Vl,
                     "xent_sumexp: bad shape N=%d Vl=%d Vvalid=%d", N, Vl, Vvalid);
    if (N == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        xent_sumexp_kernel<T><<<N, XENT_BLOCK, 0, ctx->stream>>>(sumexp, tgt, (const T *)logits,
                                                                 maxv, targets, Vl, Vvalid, v0);
    });
    return TPD_CUDA_LAUNCHED("xent_sumexp");
}

__global__ void xent_loss_kernel(float *loss, const float *maxv, const float *sumexp,
                                 const float *tgt, int N) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) loss[n] = logf(sumexp[n]) + maxv[n] - tgt[n];
}

extern "C" tpd_status tpd_kern_cuda_xent_loss(tpd_kern_ctx *ctx, float *loss, const float *maxv,
                                              const float *sumexp, const float *tgt, int N) {
    TPD_CUDA_REQUIRE(N >= 0, "xent_loss: bad shape N=%d", N);
    if (N == 0) return TPD_OK;
    xent_loss_kernel<<<(N + 255) / 256, 256, 0, ctx->stream>>>(loss, maxv, sumexp, tgt, N);
    return TPD_CUDA_LAUNCHED("xent_loss");
}

/* Backward of loss = log(sum exp) + max - logit[target], times dloss:
 *   dlogit[c] = (exp(logit[c] - max) / sumexp - [c == target]) * dloss  for valid c,
 *   0 for padded c. In place over the logits. */
template <typename T>
__global__ void xent_bwd_kernel(T *logits, const float *maxv, const float *sumexp,
                                const int32_t *targets, float dloss, int Vl, int Vvalid, int v0) {
    int n = blockIdx.x;
    T *l = logits + (size_t)n * Vl;
    float m = maxv[n];
    float inv = 1.0f / sumexp[n];
    int64_t t = (int64_t)targets[n] - v0;
    for (int c = threadIdx.x; c < Vl; c += blockDim.x) {
        float d = 0.0f;
        if (c < Vvalid) {
            float p = __expf(tpd_to_f(l[c]) - m) * inv;
            d = (p - (c == t ? 1.0f : 0.0f)) * dloss;
        }
        l[c] = tpd_from_f<T>(d);
    }
}

extern "C" tpd_status tpd_kern_cuda_xent_bwd(tpd_kern_ctx *ctx, void *logits, const float *maxv,
                                             const float *sumexp, const int32_t *targets,
                                             float dloss, int N, int Vl, int Vvalid, int v0) {
    TPD_CUDA_REQUIRE(N >= 0 && Vl >= 0 && Vvalid >= 0 && Vvalid <= Vl,
                     "xent_bwd: bad shape N=%d Vl=%d Vvalid=%d", N, Vl, Vvalid);
    if (N == 0 || Vl == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        xent_bwd_kernel<T><<<N, XENT_BLOCK, 0, ctx->stream>>>((T *)logits, maxv, sumexp, targets,
                                                              dloss, Vl, Vvalid, v0);
    });
    return TPD_CUDA_LAUNCHED("xent_bwd");
}
