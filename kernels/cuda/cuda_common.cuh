/* Device-side helpers shared by the kernel files: element conversions, 128-bit packs and
 * warp/block reductions. Internal to kernels/cuda. */
#ifndef TPD_KERNELS_CUDA_CUDA_COMMON_CUH
#define TPD_KERNELS_CUDA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_internal.h"

typedef __nv_bfloat16 tpd_bf16;

__device__ __forceinline__ float tpd_to_f(float x) {
    return x;
}
__device__ __forceinline__ float tpd_to_f(tpd_bf16 x) {
    return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T tpd_from_f(float x);
template <> __device__ __forceinline__ float tpd_from_f<float>(float x) {
    return x;
}
template <> __device__ __forceinline__ tpd_bf16 tpd_from_f<tpd_bf16>(float x) {
    return __float2bfloat16_rn(x);
}

/* 16 bytes of T: 8 bf16 or 4 floats, loaded and stored with one 128-bit access. */
template <typename T> struct alignas(16) tpd_pack {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};

template <typename T> __device__ __forceinline__ tpd_pack<T> tpd_load_pack(const T *p) {
    tpd_pack<T> r;
    *reinterpret_cast<int4 *>(&r) = *reinterpret_cast<const int4 *>(p);
    return r;
}

/* The norm kernels' row reader: elements [c, c+V) (vec) or the single element c of row x
 * into f. */
template <typename T, int V>
__device__ __forceinline__ void tpd_load_row(float *f, const T *x, int c, int vec) {
    if (vec) {
        tpd_pack<T> p = tpd_load_pack(x + c);
#pragma unroll
        for (int k = 0; k < V; k++)
            f[k] = tpd_to_f(p.v[k]);
    } else {
        f[0] = tpd_to_f(x[c]);
    }
}

/* Read-only, streaming through the non-coherent cache. */
template <typename T> __device__ __forceinline__ tpd_pack<T> tpd_ldg_pack(const T *p) {
    tpd_pack<T> r;
    *reinterpret_cast<int4 *>(&r) = __ldg(reinterpret_cast<const int4 *>(p));
    return r;
}
template <typename T> __device__ __forceinline__ void tpd_store_pack(T *p, const tpd_pack<T> &x) {
    *reinterpret_cast<int4 *>(p) = *reinterpret_cast<const int4 *>(&x);
}

__device__ __forceinline__ float tpd_warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float tpd_warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ double tpd_warp_sum_d(double x) {
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Block-wide sum/max; every thread gets the result. blockDim.x is a multiple of 32 and at
 * most 1024. The fixed tree makes the result independent of scheduling. */
__device__ __forceinline__ float tpd_block_sum(float x) {
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = tpd_warp_sum(x);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[warp] = x;
    __syncthreads();
    x = lane < nw ? sh[lane] : 0.0f;
    return tpd_warp_sum(x);
}
__device__ __forceinline__ float tpd_block_max(float x) {
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = tpd_warp_max(x);
    __syncthreads();
    if (lane == 0) sh[warp] = x;
    __syncthreads();
    x = lane < nw ? sh[lane] : -INFINITY;
    return tpd_warp_max(x);
}
__device__ __forceinline__ double tpd_block_sum_d(double x) {
    __shared__ double sh[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = tpd_warp_sum_d(x);
    __syncthreads();
    if (lane == 0) sh[warp] = x;
    __syncthreads();
    x = lane < nw ? sh[lane] : 0.0;
    return tpd_warp_sum_d(x);
}

static inline int tpd_aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

static inline unsigned tpd_grid_for(size_t work, int block) {
    size_t g = (work + (size_t)block - 1) / (size_t)block;
    if (g < 1) g = 1;
    if (g > 65535u * 32u) g = 65535u * 32u; /* kernels use grid-stride loops beyond this */
    return (unsigned)g;
}

/* Dispatch on the context dtype: instantiate `body` with T = float or tpd_bf16. */
#define TPD_CUDA_DISPATCH(dt, T, ...)                                                              \
    do {                                                                                           \
        if ((dt) == TPD_DTYPE_BF16) {                                                              \
            typedef tpd_bf16 T;                                                                    \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            typedef float T;                                                                       \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)

/* The same for ops that accumulate parameter gradients: T = the context dtype, G = the
 * gradient element (float under fp32 main gradients, ctx->grad_dtype F32; else T). */
#define TPD_CUDA_DISPATCH_GRAD(ctx, T, G, ...)                                                     \
    do {                                                                                           \
        if ((ctx)->dtype == TPD_DTYPE_BF16 && (ctx)->grad_dtype == TPD_DTYPE_F32) {                \
            typedef tpd_bf16 T;                                                                    \
            typedef float G;                                                                       \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            TPD_CUDA_DISPATCH((ctx)->dtype, T, typedef T G; __VA_ARGS__);                          \
        }                                                                                          \
    } while (0)

#endif
