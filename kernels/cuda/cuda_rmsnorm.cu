/* RMSNorm (Llama's), forward and backward side by side.
 *
 * One warp per row, as in cuda_layernorm.cu: the row's fp32 sum of squares, then the
 * normalized, scaled row, read in 16-byte packs when C and the pointers allow. The weight
 * gradient is a column sum over rows; it is kept deterministic without LayerNorm's per-warp
 * shared-memory rows (LN_WARPS x C floats would not fit for Llama widths: C = 8192 is
 * 256 KiB): fixed row blocks each write an fp32 partial row, added in block order. */
#include "kernels/cuda/cuda_common.cuh"

#define RMS_WARPS 8    /* rows per block of the row kernels */
#define RMS_DW_COLS 32 /* columns per block of the weight gradient */
#define RMS_DW_LANES 8 /* row lanes per block of the weight gradient */

/* out = x * r * w, r = 1/sqrt(mean_c(x^2) + eps); rstd[row] = r. */
template <typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C,
                                   int vec, float eps) {
    constexpr int V = tpd_pack<T>::N;
    int row = blockIdx.x * RMS_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    T *o = out + (size_t)row * C;
    int step = vec ? 32 * V : 32, width = vec ? V : 1;
    float f[V];

    float ss = 0.0f;
    for (int c = lane * width; c < C; c += step) {
        tpd_load_row<T, V>(f, x, c, vec);
        for (int k = 0; k < width; k++)
            ss += f[k] * f[k];
    }
    float r = rsqrtf(tpd_warp_sum(ss) / (float)C + eps);
    for (int c = lane * width; c < C; c += step) {
        float fw[V];
        tpd_load_row<T, V>(f, x, c, vec);
        tpd_load_row<T, V>(fw, w, c, vec);
        if (vec) {
            tpd_pack<T> p;
#pragma unroll
            for (int k = 0; k < V; k++)
                p.v[k] = tpd_from_f<T>(f[k] * r * fw[k]);
            tpd_store_pack(o + c, p);
        } else {
            o[c] = tpd_from_f<T>(f[0] * r * fw[0]);
        }
    }
    if (lane == 0) rstd[row] = r;
}

extern "C" tpd_status tpd_kern_cuda_rmsnorm_fwd(tpd_kern_ctx *ctx, void *out, float *rstd,
                                                const void *inp, const void *w, int N, int C,
                                                double eps) {
    TPD_CUDA_REQUIRE(N >= 0 && C > 0, "rmsnorm_fwd: bad shape N=%d C=%d", N, C);
    if (N == 0) return TPD_OK;
    unsigned grid = (unsigned)((N + RMS_WARPS - 1) / RMS_WARPS);
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        int vec =
            C % tpd_pack<T>::N == 0 && tpd_aligned16(out) && tpd_aligned16(inp) && tpd_aligned16(w);
        rmsnorm_fwd_kernel<T><<<grid, RMS_WARPS * 32, 0, ctx->stream>>>(
            (T *)out, rstd, (const T *)inp, (const T *)w, N, C, vec, (float)eps);
    });
    return TPD_CUDA_LAUNCHED("rmsnorm_fwd");
}

/* Backward of out = x * r * w, with xhat = x * r and g = dout * w:
 *   dinp = r * (g - xhat * mean_c(g * xhat))    (overwritten)
 *   dw  += sum_n dout * xhat                     (accumulated)
 * (d r / d x_k = -r^3 x_k / C gives the second term.) */
template <typename T>
__global__ void rmsnorm_bwd_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                        const float *rstd, int N, int C, int vec) {
    constexpr int V = tpd_pack<T>::N;
    int row = blockIdx.x * RMS_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    const T *dy = dout + (size_t)row * C;
    T *dx = dinp + (size_t)row * C;
    int step = vec ? 32 * V : 32, width = vec ? V : 1;
    float r = rstd[row];
    float fx[V], fd[V], fw[V];

    float sgx = 0.0f;
    for (int c = lane * width; c < C; c += step) {
        tpd_load_row<T, V>(fx, x, c, vec);
        tpd_load_row<T, V>(fd, dy, c, vec);
        tpd_load_row<T, V>(fw, w, c, vec);
        for (int k = 0; k < width; k++)
            sgx += fd[k] * fw[k] * fx[k] * r;
    }
    sgx = tpd_warp_sum(sgx) / (float)C;
    for (int c = lane * width; c < C; c += step) {
        tpd_load_row<T, V>(fx, x, c, vec);
        tpd_load_row<T, V>(fd, dy, c, vec);
        tpd_load_row<T, V>(fw, w, c, vec);
        if (vec) {
            tpd_pack<T> p;
#pragma unroll
            for (int k = 0; k < V; k++)
                p.v[k] = tpd_from_f<T>(r * (fd[k] * fw[k] - fx[k] * r * sgx));
            tpd_store_pack(dx + c, p);
        } else {
            dx[c] = tpd_from_f<T>(r * (fd[0] * fw[0] - fx[0] * r * sgx));
        }
    }
}

/* partial[blockIdx.y][c] = sum of dout * x * rstd over rows [y*R, y*R + R), R =
 * TPD_KERN_RMS_BWD_ROWS (kernels_internal.h, where the scratch plan reads it). Block
 * (RMS_DW_COLS x RMS_DW_LANES): lane ty takes rows ty, ty+LANES, ... of the block's range,
 * and the lanes are combined in lane order: the same sum on every run. */
template <typename T>
__global__ void rmsnorm_bwd_dw_partial_kernel(float *partial, const T *dout, const T *inp,
                                              const float *rstd, int N, int C) {
    __shared__ float part[RMS_DW_LANES][RMS_DW_COLS + 1];
    int c = blockIdx.x * RMS_DW_COLS + threadIdx.x;
    int row0 = blockIdx.y * TPD_KERN_RMS_BWD_ROWS;
    int row1 = min(row0 + TPD_KERN_RMS_BWD_ROWS, N);
    float acc = 0.0f;
    if (c < C)
        for (int n = row0 + threadIdx.y; n < row1; n += RMS_DW_LANES) {
            size_t i = (size_t)n * C + c;
            acc += tpd_to_f(dout[i]) * tpd_to_f(inp[i]) * rstd[n];
        }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.0f;
        for (int k = 0; k < RMS_DW_LANES; k++)
            s += part[k][threadIdx.x];
        partial[(size_t)blockIdx.y * C + c] = s;
    }
}

/* dw[c] += sum of the partials in block order. */
template <typename G> /* the gradient element: float under fp32 main gradients */
__global__ void rmsnorm_bwd_dw_reduce_kernel(G *dw, const float *partial, int nblocks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int k = 0; k < nblocks; k++)
        s += partial[(size_t)k * C + c];
    dw[c] = tpd_from_f<G>(tpd_to_f(dw[c]) + s);
}

extern "C" tpd_status tpd_kern_cuda_rmsnorm_bwd(tpd_kern_ctx *ctx, void *dinp, void *dw,
                                                const void *dout, const void *inp, const void *w,
                                                const float *rstd, int N, int C) {
    TPD_CUDA_REQUIRE(N >= 0 && C > 0, "rmsnorm_bwd: bad shape N=%d C=%d", N, C);
    if (N == 0) return TPD_OK;
    int nblocks = (N + TPD_KERN_RMS_BWD_ROWS - 1) / TPD_KERN_RMS_BWD_ROWS;
    TPD_CUDA_REQUIRE(nblocks <= 65535, "rmsnorm_bwd: N=%d rows are too many for this kernel", N);
    void *scratch = NULL;
    TPD_CHECK(tpd_cuda_scratch(ctx, tpd_kern_rmsnorm_bwd_scratch(N, C), &scratch));
    float *partial = (float *)scratch;
    unsigned grid = (unsigned)((N + RMS_WARPS - 1) / RMS_WARPS);
    dim3 dw_block(RMS_DW_COLS, RMS_DW_LANES);
    dim3 dw_grid((unsigned)((C + RMS_DW_COLS - 1) / RMS_DW_COLS), (unsigned)nblocks);
    TPD_CUDA_DISPATCH_GRAD(ctx, T, G, {
        int vec = C % tpd_pack<T>::N == 0 && tpd_aligned16(dinp) && tpd_aligned16(dout) &&
                  tpd_aligned16(inp) && tpd_aligned16(w);
        /* dw first: it reads dout, which dinp may then overwrite (each row of dinp is
         * written only after the same lanes have read that row of dout) */
        rmsnorm_bwd_dw_partial_kernel<T><<<dw_grid, dw_block, 0, ctx->stream>>>(
            partial, (const T *)dout, (const T *)inp, rstd, N, C);
        TPD_CHECK(TPD_CUDA_LAUNCHED("rmsnorm_bwd dw partials"));
        rmsnorm_bwd_dw_reduce_kernel<G>
            <<<(C + 255) / 256, 256, 0, ctx->stream>>>((G *)dw, partial, nblocks, C);
        TPD_CHECK(TPD_CUDA_LAUNCHED("rmsnorm_bwd dw"));
        rmsnorm_bwd_dinp_kernel<T><<<grid, RMS_WARPS * 32, 0, ctx->stream>>>(
            (T *)dinp, (const T *)dout, (const T *)inp, (const T *)w, rstd, N, C, vec);
    });
    return TPD_CUDA_LAUNCHED("rmsnorm_bwd dinp");
}
