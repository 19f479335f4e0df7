/* LayerNorm (biased variance; GPT-2's eps is 1e-5), forward and backward side by side.
 *
 * One warp per row. Statistics are fp32 and two-pass (mean, then the sum of squared
 * deviations), which avoids the cancellation of E[x^2] - E[x]^2 on rows with a large mean.
 * Rows are read in 16-byte packs when C and the pointers allow. */
#include "kernels/cuda/cuda_common.cuh"

#define LN_WARPS 8 /* rows per block */

template <typename T>
__global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w,
                                     const T *b, int N, int C, int vec, float eps) {
    constexpr int V = tpd_pack<T>::N;
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    T *o = out + (size_t)row * C;
    int step = vec ? 32 * V : 32, width = vec ? V : 1;
    float f[V];

    float s = 0.0f;
    for (int c = lane * width; c < C; c += step) {
        tpd_load_row<T, V>(f, x, c, vec);
        for (int k = 0; k < width; k++)
            s += f[k];
    }
    float m = tpd_warp_sum(s) / (float)C;
    float ss = 0.0f;
    for (int c = lane * width; c < C; c += step) {
        tpd_load_row<T, V>(f, x, c, vec);
        for (int k = 0; k < width; k++) {
            float d = f[k] - m;
            ss += d * d;
        }
    }
    float r = rsqrtf(tpd_warp_sum(ss) / (float)C + eps);
    for (int c = lane * width; c < C; c += step) {
        float fw[V], fb[V];
        tpd_load_row<T, V>(f, x, c, vec);
        tpd_load_row<T, V>(fw, w, c, vec);
        tpd_load_row<T, V>(fb, b, c, vec);
        if (vec) {
            tpd_pack<T> p;
#pragma unroll
            for (int k = 0; k < V; k++)
                p.v[k] = tpd_from_f<T>((f[k] - m) * r * fw[k] + fb[k]);
            tpd_store_pack(o + c, p);
        } else {
            o[c] = tpd_from_f<T>((f[0] - m) * r * fw[0] + fb[0]);
        }
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

extern "C" tpd_status tpd_kern_cuda_layernorm_fwd(tpd_kern_ctx *ctx, void *out, float *mean,
                                                  float *rstd, const void *inp, const void *w,
                                                  const void *b, int N, int C, double eps) {
    TPD_CUDA_REQUIRE(N >= 0 && C > 0, "layernorm_fwd: bad shape N=%d C=%d", N, C);
    if (N == 0) return TPD_OK;
    unsigned grid = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        int vec = C % tpd_pack<T>::N == 0 && tpd_aligned16(out) && tpd_aligned16(inp) &&
                  tpd_aligned16(w) && tpd_aligned16(b);
        layernorm_fwd_kernel<T><<<grid, LN_WARPS * 32, 0, ctx->stream>>>(
            (T *)out, mean, rstd, (const T *)inp, (const T *)w, (const T *)b, N, C, vec,
            (float)eps);
    });
    return TPD_CUDA_LAUNCHED("layernorm_fwd");
}

/* Backward of out = (x - mean) * rstd * w + b, with xhat = (x - mean) * rstd and
 * g = dout * w:
 *   dinp = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))    (overwritten)
 *   dw  += sum_n dout * xhat,  db += sum_n dout                 (accumulated)
 * The parameter sums are deterministic: each block sums a fixed range of rows into its
 * own fp32 partial row of scratch (block-local order fixed), and a second kernel adds the
 * partials in block order. A block takes TPD_KERN_LN_BWD_ROWS rows (kernels_internal.h, where
 * the scratch plan reads it). */
template <typename T>
__global__ void layernorm_bwd_kernel(T *dinp, float *partial, const T *dout, const T *inp,
                                     const T *w, const float *mean, const float *rstd, int N,
                                     int C) {
    /* blockDim.x = 32 * LN_WARPS; each warp walks rows row0+warp, row0+warp+LN_WARPS, ... */
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int row0 = blockIdx.x * TPD_KERN_LN_BWD_ROWS;
    int row1 = min(row0 + TPD_KERN_LN_BWD_ROWS, N);
    extern __shared__ float sh[]; /* [LN_WARPS][2*C]: per-warp dw, db partials */
    float *my = sh + (size_t)warp * 2 * C;
    for (int c = lane; c < 2 * C; c += 32)
        my[c] = 0.0f;
    __syncwarp();
    for (int row = row0 + warp; row < row1; row += LN_WARPS) {
        const T *x = inp + (size_t)row * C;
        const T *dy = dout + (size_t)row * C;
        float m = mean[row], r = rstd[row];
        float sg = 0.0f, sgx = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float xh = (tpd_to_f(x[c]) - m) * r;
            float d = tpd_to_f(dy[c]);
            float g = d * tpd_to_f(w[c]);
            sg += g;
            sgx += g * xh;
            my[c] += d * xh;
            my[C + c] += d;
        }
        sg = tpd_warp_sum(sg) / (float)C;
        sgx = tpd_warp_sum(sgx) / (float)C;
        T *dx = dinp + (size_t)row * C;
        for (int c = lane; c < C; c += 32) {
            float xh = (tpd_to_f(x[c]) - m) * r;
            float g = tpd_to_f(dy[c]) * tpd_to_f(w[c]);
            dx[c] = tpd_from_f<T>(r * (g - sg - xh * sgx));
        }
    }
    __syncthreads();
    /* Combine the warps in warp order into this block's partial row. */
    float *pb = partial + (size_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < LN_WARPS; k++)
            s += sh[(size_t)k * 2 * C + c];
        pb[c] = s;
    }
}

/* G: the gradient element (float under fp32 main gradients) */
template <typename G>
__global__ void layernorm_bwd_reduce_kernel(G *dw, G *db, const float *partial, int nblocks,
                                            int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= 2 * C) return;
    float s = 0.0f;
    for (int k = 0; k < nblocks; k++)
        s += partial[(size_t)k * 2 * C + c];
    if (c < C)
        dw[c] = tpd_from_f<G>(tpd_to_f(dw[c]) + s);
    else
        db[c - C] = tpd_from_f<G>(tpd_to_f(db[c - C]) + s);
}

extern "C" tpd_status tpd_kern_cuda_layernorm_bwd(tpd_kern_ctx *ctx, void *dinp, void *dw, void *db,
                                                  const void *dout, const void *inp, const void *w,
                                                  const float *mean, const float *rstd, int N,
                                                  int C) {
    TPD_CUDA_REQUIRE(N >= 0 && C > 0, "layernorm_bwd: bad shape N=%d C=%d", N, C);
    if (N == 0) return TPD_OK;
    size_t shmem = (size_t)LN_WARPS * 2 * (size_t)C * sizeof(float);
    /* LN_WARPS x 2C floats (64*C bytes): up to C = 768 fits the default 48 KiB; wider rows
     * (C = 1600 for GPT-2 1.5B) opt in to more, up to 200 KiB (C = 3200). */
    TPD_CUDA_REQUIRE(shmem <= 200 * 1024, "layernorm_bwd: C=%d is too wide for this kernel", C);
    int nblocks = (N + TPD_KERN_LN_BWD_ROWS - 1) / TPD_KERN_LN_BWD_ROWS;
    void *scratch = NULL;
    TPD_CHECK(tpd_cuda_scratch(ctx, tpd_kern_layernorm_bwd_scratch(N, C), &scratch));
    float *partial = (float *)scratch;
    TPD_CUDA_DISPATCH_GRAD(ctx, T, G, {
        if (shmem > 48 * 1024)
            TPD_CHECK(TPD_CUDA(cudaFuncSetAttribute(
                layernorm_bwd_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem)));
        layernorm_bwd_kernel<T><<<nblocks, LN_WARPS * 32, shmem, ctx->stream>>>(
            (T *)dinp, partial, (const T *)dout, (const T *)inp, (const T *)w, mean, rstd, N, C);
        TPD_CHECK(TPD_CUDA_LAUNCHED("layernorm_bwd"));
        layernorm_bwd_reduce_kernel<G>
            <<<(2 * C + 255) / 256, 256, 0, ctx->stream>>>((G *)dw, (G *)db, partial, nblocks, C);
    });
    return TPD_CUDA_LAUNCHED("layernorm_bwd reduce");
}
