/* SwiGLU (Llama's MLP activation), forward and backward side by side:
 * inp(N,2F) = [gate | up] per row (the fused gate/up projection's output), out(N,F) =
 * silu(gate) * up with silu(x) = x * sigmoid(x).
 *
 * Each direction is one elementwise pass (fwd: read gate and up, write out; bwd: read gate,
 * up and dout, write d gate and d up), the silu recomputed in the backward rather than
 * stored. A further fusion into the GEMM epilogue would need a custom GEMM (cuBLASLt has no
 * gated epilogue) and saves one pass over (N,2F) at most; not worth it next to the GEMMs.
 * 16-byte packs when F and the pointers allow, else one element per thread. */
#include "kernels/cuda/cuda_common.cuh"

#define SWIGLU_BLOCK 256

__device__ __forceinline__ float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x)); /* 0 when expf overflows, 1 when it underflows */
}

/* Item it covers `width` (1 or a pack) consecutive columns f of one row. */
template <typename T>
__global__ void swiglu_fwd_kernel(T *out, const T *inp, size_t items, int F, int width) {
    constexpr int V = tpd_pack<T>::N;
    const int per_row = F / width;
    for (size_t it = (size_t)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (size_t)gridDim.x * blockDim.x) {
        size_t row = it / (size_t)per_row;
        int f = (int)(it % (size_t)per_row) * width;
        const T *g = inp + row * 2 * (size_t)F + f;
        const T *u = g + F;
        T *o = out + row * (size_t)F + f;
        if (width == V) {
            tpd_pack<T> pg = tpd_load_pack(g), pu = tpd_load_pack(u), po;
#pragma unroll
            for (int k = 0; k < V; k++) {
                float x = tpd_to_f(pg.v[k]);
                po.v[k] = tpd_from_f<T>(x * sigmoid_f(x) * tpd_to_f(pu.v[k]));
            }
            tpd_store_pack(o, po);
        } else {
            float x = tpd_to_f(g[0]);
            o[0] = tpd_from_f<T>(x * sigmoid_f(x) * tpd_to_f(u[0]));
        }
    }
}

extern "C" tpd_status tpd_kern_cuda_swiglu_fwd(tpd_kern_ctx *ctx, void *out, const void *inp, int N,
                                               int F) {
    TPD_CUDA_REQUIRE(N >= 0 && F > 0, "swiglu_fwd: bad shape N=%d F=%d", N, F);
    if (N == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        int width = F % tpd_pack<T>::N == 0 && tpd_aligned16(out) && tpd_aligned16(inp)
                        ? tpd_pack<T>::N
                        : 1;
        size_t items = (size_t)N * (size_t)(F / width);
        swiglu_fwd_kernel<T><<<tpd_grid_for(items, SWIGLU_BLOCK), SWIGLU_BLOCK, 0, ctx->stream>>>(
            (T *)out, (const T *)inp, items, F, width);
    });
    return TPD_CUDA_LAUNCHED("swiglu_fwd");
}

/* Backward of out = silu(g) * u, s = sigmoid(g):
 *   d g = dout * u * s * (1 + g * (1 - s))    (silu'(g) = s + g s (1 - s))
 *   d u = dout * silu(g)
 * Every thread reads its gate, up and dout before it writes the same columns of dinp. */
template <typename T>
__global__ void swiglu_bwd_kernel(T *dinp, const T *inp, const T *dout, size_t items, int F,
                                  int width) {
    constexpr int V = tpd_pack<T>::N;
    const int per_row = F / width;
    for (size_t it = (size_t)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (size_t)gridDim.x * blockDim.x) {
        size_t row = it / (size_t)per_row;
        int f = (int)(it % (size_t)per_row) * width;
        const T *g = inp + row * 2 * (size_t)F + f;
        const T *u = g + F;
        const T *d = dout + row * (size_t)F + f;
        T *dg = dinp + row * 2 * (size_t)F + f;
        T *du = dg + F;
        if (width == V) {
            tpd_pack<T> pg = tpd_load_pack(g), pu = tpd_load_pack(u), pd = tpd_load_pack(d);
            tpd_pack<T> og, ou;
#pragma unroll
            for (int k = 0; k < V; k++) {
                float x = tpd_to_f(pg.v[k]), s = sigmoid_f(x), dy = tpd_to_f(pd.v[k]);
                og.v[k] = tpd_from_f<T>(dy * tpd_to_f(pu.v[k]) * s * (1.0f + x * (1.0f - s)));
                ou.v[k] = tpd_from_f<T>(dy * x * s);
            }
            tpd_store_pack(dg, og);
            tpd_store_pack(du, ou);
        } else {
            float x = tpd_to_f(g[0]), s = sigmoid_f(x), dy = tpd_to_f(d[0]), up = tpd_to_f(u[0]);
            dg[0] = tpd_from_f<T>(dy * up * s * (1.0f + x * (1.0f - s)));
            du[0] = tpd_from_f<T>(dy * x * s);
        }
    }
}

extern "C" tpd_status tpd_kern_cuda_swiglu_bwd(tpd_kern_ctx *ctx, void *dinp, const void *inp,
                                               const void *dout, int N, int F) {
    TPD_CUDA_REQUIRE(N >= 0 && F > 0, "swiglu_bwd: bad shape N=%d F=%d", N, F);
    if (N == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        int width = F % tpd_pack<T>::N == 0 && tpd_aligned16(dinp) && tpd_aligned16(inp) &&
                            tpd_aligned16(dout)
                        ? tpd_pack<T>::N
                        : 1;
        size_t items = (size_t)N * (size_t)(F / width);
        swiglu_bwd_kernel<T><<<tpd_grid_for(items, SWIGLU_BLOCK), SWIGLU_BLOCK, 0, ctx->stream>>>(
            (T *)dinp, (const T *)inp, (const T *)dout, items, F, width);
    });
    return TPD_CUDA_LAUNCHED("swiglu_bwd");
}
