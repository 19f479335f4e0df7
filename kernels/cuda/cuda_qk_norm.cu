/* Qwen3's QK norm: RMSNorm of every Q and K head of qkv, forward and backward.
 *
 * Head h of row n is the vector of HS at n*ld + h*HS in qkv (the H = NH + NKV Q and K heads
 * open a row of ld = (NH + 2*NKV)*HS) and at (n*H + h)*HS in raw. One warp per head for
 * the forward and the input gradient, as cuda_rmsnorm.cu does per row. The weight
 * gradients (two vectors of HS) are column sums over all N*NH (or N*NKV) heads: block
 * (column group of QK_DW_COLS, Q or K) has QK_DW_LANES lanes of heads combined in lane order,
 * so the sum is the same on every run and needs no scratch. */
#include "kernels/cuda/cuda_common.cuh"

#define QK_WARPS 8     /* heads per block of the head kernels */
#define QK_DW_COLS 32  /* columns per block of the weight gradient */
#define QK_DW_LANES 32 /* head lanes per block of the weight gradient */

/* This warp's head v (of N * (NH + NKV)): its vector in qkv (or dqkv) and its weight; false
 * past the last head. */
template <typename T>
__device__ __forceinline__ bool warp_head(T *qkv, const T *wq, const T *wk, int N, int NH, int NKV,
                                          int HS, size_t *v_p, T **x_p, const T **w_p) {
    const int H = NH + NKV;
    size_t v = (size_t)blockIdx.x * QK_WARPS + threadIdx.x / 32;
    if (v >= (size_t)N * H) return false;
    int h = (int)(v % H);
    *v_p = v;
    *x_p = qkv + (v / H) * (size_t)(NH + 2 * NKV) * HS + (size_t)h * HS;
    *w_p = h < NH ? wq : wk;
    return true;
}

template <typename T>
__global__ void qk_norm_fwd_kernel(T *qkv, T *raw, float *rstd, const T *wq, const T *wk, int N,
                                   int NH, int NKV, int HS, float eps) {
    size_t v;
    T *x;
    const T *w;
    if (!warp_head(qkv, wq, wk, N, NH, NKV, HS, &v, &x, &w)) return;
    int lane = threadIdx.x & 31;
    T *r = raw + v * HS;
    float ss = 0.0f;
    for (int c = lane; c < HS; c += 32) {
        float f = tpd_to_f(x[c]);
        r[c] = x[c];
        ss += f * f;
    }
    float rs = rsqrtf(tpd_warp_sum(ss) / (float)HS + eps);
    __syncwarp();
    for (int c = lane; c < HS; c += 32)
        x[c] = tpd_from_f<T>(tpd_to_f(r[c]) * rs * tpd_to_f(w[c]));
    if (lane == 0) rstd[v] = rs;
}

/* The head kernels' grid (QK_WARPS heads a block), 0 for no heads; a bad shape is an error. */
static tpd_status head_grid(const char *op, int N, int NH, int NKV, int HS, unsigned *grid) {
    TPD_CUDA_REQUIRE(N >= 0 && NH > 0 && NKV > 0 && HS > 0, "%s: bad shape N=%d NH=%d NKV=%d HS=%d",
                     op, N, NH, NKV, HS);
    size_t heads = (size_t)N * (NH + NKV);
    TPD_CUDA_REQUIRE(heads / QK_WARPS < 2147483647u, "%s: %zu heads are too many", op, heads);
    *grid = (unsigned)((heads + QK_WARPS - 1) / QK_WARPS);
    return TPD_OK;
}

extern "C" tpd_status tpd_kern_cuda_qk_norm_fwd(tpd_kern_ctx *ctx, void *qkv, void *raw,
                                                float *rstd, const void *wq, const void *wk, int N,
                                                int NH, int NKV, int HS, double eps) {
    unsigned grid = 0;
    TPD_CHECK(head_grid("qk_norm_fwd", N, NH, NKV, HS, &grid));
    if (grid == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        qk_norm_fwd_kernel<T><<<grid, QK_WARPS * 32, 0, ctx->stream>>>(
            (T *)qkv, (T *)raw, rstd, (const T *)wq, (const T *)wk, N, NH, NKV, HS, (float)eps);
    });
    return TPD_CUDA_LAUNCHED("qk_norm_fwd");
}

/* dx = r * (g - xhat * mean_c(g * xhat)), g = dy * w, xhat = x * r; in place on dqkv. */
template <typename T>
__global__ void qk_norm_bwd_dx_kernel(T *dqkv, const T *raw, const T *wq, const T *wk,
                                      const float *rstd, int N, int NH, int NKV, int HS) {
    size_t v;
    T *dy;
    const T *w;
    if (!warp_head(dqkv, wq, wk, N, NH, NKV, HS, &v, &dy, &w)) return;
    int lane = threadIdx.x & 31;
    const T *x = raw + v * HS;
    float r = rstd[v], sgx = 0.0f;
    for (int c = lane; c < HS; c += 32)
        sgx += tpd_to_f(dy[c]) * tpd_to_f(w[c]) * (tpd_to_f(x[c]) * r);
    sgx = tpd_warp_sum(sgx) / (float)HS;
    __syncwarp();
    for (int c = lane; c < HS; c += 32)
        dy[c] = tpd_from_f<T>(r * (tpd_to_f(dy[c]) * tpd_to_f(w[c]) - tpd_to_f(x[c]) * r * sgx));
}

/* dw[c] += sum over the Q heads (blockIdx.y 0) or the K heads (1) of dy * x * r. */
template <typename T, typename G>
__global__ void qk_norm_bwd_dw_kernel(G *dwq, G *dwk, const T *dqkv, const T *raw,
                                      const float *rstd, int N, int NH, int NKV, int HS) {
    __shared__ float part[QK_DW_LANES][QK_DW_COLS + 1];
    const int H = NH + NKV, k = blockIdx.y, h0 = k ? NH : 0, nh = k ? NKV : NH;
    int c = blockIdx.x * QK_DW_COLS + threadIdx.x;
    float acc = 0.0f;
    if (c < HS)
        for (size_t i = threadIdx.y; i < (size_t)N * nh; i += QK_DW_LANES) {
            size_t n = i / nh, v = n * H + h0 + i % nh;
            size_t at = n * (size_t)(NH + 2 * NKV) * HS + (size_t)(h0 + i % nh) * HS + c;
            acc += tpd_to_f(dqkv[at]) * tpd_to_f(raw[v * HS + c]) * rstd[v];
        }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < HS) {
        float s = 0.0f;
        for (int l = 0; l < QK_DW_LANES; l++)
            s += part[l][threadIdx.x];
        G *dw = k ? dwk : dwq;
        dw[c] = tpd_from_f<G>(tpd_to_f(dw[c]) + s);
    }
}

extern "C" tpd_status tpd_kern_cuda_qk_norm_bwd(tpd_kern_ctx *ctx, void *dqkv, void *dwq, void *dwk,
                                                const void *raw, const void *wq, const void *wk,
                                                const float *rstd, int N, int NH, int NKV, int HS) {
    unsigned grid = 0;
    TPD_CHECK(head_grid("qk_norm_bwd", N, NH, NKV, HS, &grid));
    if (grid == 0) return TPD_OK;
    dim3 dw_block(QK_DW_COLS, QK_DW_LANES),
        dw_grid((unsigned)((HS + QK_DW_COLS - 1) / QK_DW_COLS), 2);
    TPD_CUDA_DISPATCH_GRAD(ctx, T, G, {
        /* dw first: it reads dy, which the input gradient then overwrites */
        qk_norm_bwd_dw_kernel<T, G><<<dw_grid, dw_block, 0, ctx->stream>>>(
            (G *)dwq, (G *)dwk, (const T *)dqkv, (const T *)raw, rstd, N, NH, NKV, HS);
        TPD_CHECK(TPD_CUDA_LAUNCHED("qk_norm_bwd dw"));
        qk_norm_bwd_dx_kernel<T><<<grid, QK_WARPS * 32, 0, ctx->stream>>>(
            (T *)dqkv, (const T *)raw, (const T *)wq, (const T *)wk, rstd, N, NH, NKV, HS);
    });
    return TPD_CUDA_LAUNCHED("qk_norm_bwd dx");
}
