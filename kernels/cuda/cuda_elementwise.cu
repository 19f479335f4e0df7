/* Elementwise ops (GELU, residual add, scale, bias add, dtype casts) and the column sums
 * behind bias gradients.
 *
 * Flat kernels move 16 bytes per thread per step (8 bf16 or 4 fp32) when every pointer is
 * 16-byte aligned, which keeps them at memory bandwidth; a scalar tail handles the last
 * n % 8 elements and misaligned views. */
#include "kernels/cuda/cuda_common.cuh"

#define EW_BLOCK 256
#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

__device__ __forceinline__ float gelu_f(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

/* d/dx of 0.5 x (1 + tanh(u)), u = s (x + 0.044715 x^3). */
__device__ __forceinline__ float gelu_grad_f(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float t = tanhf(u);
    float sech2 = 1.0f - t * t;
    return 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

/* One kernel shape for every unary/binary flat op: OP(a, b) -> out, with b optional. */
struct op_gelu {
    __device__ float operator()(float a, float, float) const {
        return gelu_f(a);
    }
};
struct op_gelu_bwd { /* a = inp, b = dout */
    __device__ float operator()(float a, float b, float) const {
        return gelu_grad_f(a) * b;
    }
};
struct op_add {
    __device__ float operator()(float a, float b, float) const {
        return a + b;
    }
};
struct op_scale {
    __device__ float operator()(float a, float, float s) const {
        return a * s;
    }
};

template <typename T, typename OP>
__global__ void flat_kernel_vec(T *out, const T *a, const T *b, float s, size_t npack, OP op) {
    constexpr int V = tpd_pack<T>::N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < npack;
         i += (size_t)gridDim.x * blockDim.x) {
        tpd_pack<T> pa = tpd_load_pack(a + i * V);
        tpd_pack<T> pb;
        if (b != NULL) pb = tpd_load_pack(b + i * V);
        tpd_pack<T> po;
#pragma unroll
        for (int k = 0; k < V; k++)
            po.v[k] = tpd_from_f<T>(op(tpd_to_f(pa.v[k]), b != NULL ? tpd_to_f(pb.v[k]) : 0.0f, s));
        tpd_store_pack(out + i * V, po);
    }
}

template <typename T, typename OP>
__global__ void flat_kernel_scalar(T *out, const T *a, const T *b, float s, size_t begin, size_t n,
                                   OP op) {
    for (size_t i = begin + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = tpd_from_f<T>(op(tpd_to_f(a[i]), b != NULL ? tpd_to_f(b[i]) : 0.0f, s));
}

template <typename T, typename OP>
static tpd_status flat_launch(tpd_kern_ctx *ctx, void *out_v, const void *a_v, const void *b_v,
                              float s, size_t n, OP op, const char *name) {
    if (n == 0) return TPD_OK;
    T *out = (T *)out_v;
    const T *a = (const T *)a_v, *b = (const T *)b_v;
    constexpr int V = tpd_pack<T>::N;
    size_t done = 0;
    if (tpd_aligned16(out) && tpd_aligned16(a) && (b == NULL || tpd_aligned16(b))) {
        size_t npack = n / V;
        if (npack > 0) {
            flat_kernel_vec<T, OP><<<tpd_grid_for(npack, EW_BLOCK), EW_BLOCK, 0, ctx->stream>>>(
                out, a, b, s, npack, op);
            TPD_CHECK(TPD_CUDA_LAUNCHED(name));
        }
        done = npack * V;
    }
    if (done < n) {
        flat_kernel_scalar<T, OP><<<tpd_grid_for(n - done, EW_BLOCK), EW_BLOCK, 0, ctx->stream>>>(
            out, a, b, s, done, n, op);
        TPD_CHECK(TPD_CUDA_LAUNCHED(name));
    }
    return TPD_OK;
}

extern "C" tpd_status tpd_kern_cuda_gelu_fwd(tpd_kern_ctx *ctx, void *out, const void *inp,
                                             size_t n) {
    TPD_CUDA_DISPATCH(ctx->dtype, T,
                      return flat_launch<T>(ctx, out, inp, NULL, 0.0f, n, op_gelu(), "gelu_fwd"));
}

/* Backward of out = gelu(inp): dinp = gelu'(inp) * dout (dinp may alias dout: each element
 * is read before it is written by the same thread). */
extern "C" tpd_status tpd_kern_cuda_gelu_bwd(tpd_kern_ctx *ctx, void *dinp, const void *inp,
                                             const void *dout, size_t n) {
    TPD_CUDA_DISPATCH(
        ctx->dtype, T,
        return flat_launch<T>(ctx, dinp, inp, dout, 0.0f, n, op_gelu_bwd(), "gelu_bwd"));
}

extern "C" tpd_status tpd_kern_cuda_add(tpd_kern_ctx *ctx, void *out, const void *a, const void *b,
                                        size_t n) {
    TPD_CUDA_DISPATCH(ctx->dtype, T,
                      return flat_launch<T>(ctx, out, a, b, 0.0f, n, op_add(), "add"));
}

extern "C" tpd_status tpd_kern_cuda_scale(tpd_kern_ctx *ctx, void *x, float s, size_t n) {
    TPD_CUDA_DISPATCH(ctx->dtype, T,
                      return flat_launch<T>(ctx, x, x, NULL, s, n, op_scale(), "scale"));
}

/* ---- bias ---- */

/* out(N,OC) += bias(OC) */
template <typename T> __global__ void bias_add_kernel(T *out, const T *bias, size_t n, int OC) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = tpd_from_f<T>(tpd_to_f(out[i]) + tpd_to_f(bias[i % (size_t)OC]));
}

extern "C" tpd_status tpd_kern_cuda_bias_add(tpd_kern_ctx *ctx, void *out, const void *bias, int N,
                                             int OC) {
    TPD_CUDA_REQUIRE(N >= 0 && OC > 0, "bias_add: bad shape N=%d OC=%d", N, OC);
    size_t n = (size_t)N * (size_t)OC;
    if (n == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        bias_add_kernel<T><<<tpd_grid_for(n, EW_BLOCK), EW_BLOCK, 0, ctx->stream>>>(
            (T *)out, (const T *)bias, n, OC);
    });
    return TPD_CUDA_LAUNCHED("bias_add");
}

/* dbias(OC) += sum over rows of dout(N,OC), on a 2-D grid: block (x, y) of (32 x 8)
 * threads owns columns [32x, 32x+32) of the row chunk [yR, yR+R), R =
 * TPD_KERN_BIAS_GRAD_ROWS; its 8 row lanes stride the chunk in a fixed pattern and are
 * combined in lane order into the chunk's fp32 partial row. A second kernel adds the
 * partial rows in chunk order. Every sum has a fixed order, so the result is the same bits
 * on every run, and N/R x OC/32 blocks keep the device busy where OC/32 blocks of long
 * loops did not. */
#define BIAS_LANES 8

template <typename T>
__global__ void colsum_partial_kernel(float *partial, const T *dout, int N, int OC) {
    __shared__ float part[BIAS_LANES][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    int row0 = blockIdx.y * TPD_KERN_BIAS_GRAD_ROWS;
    int row1 = min(row0 + TPD_KERN_BIAS_GRAD_ROWS, N);
    float acc = 0.0f;
    if (col < OC)
        for (int r = row0 + threadIdx.y; r < row1; r += BIAS_LANES)
            acc += tpd_to_f(dout[(size_t)r * OC + col]);
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < OC) {
        float s = 0.0f;
        for (int k = 0; k < BIAS_LANES; k++)
            s += part[k][threadIdx.x];
        partial[(size_t)blockIdx.y * OC + col] = s;
    }
}

template <typename T>
__global__ void colsum_reduce_kernel(T *dbias, const float *partial, int nchunks, int OC) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= OC) return;
    float s = 0.0f;
    for (int k = 0; k < nchunks; k++)
        s += partial[(size_t)k * OC + col];
    dbias[col] = tpd_from_f<T>(tpd_to_f(dbias[col]) + s);
}

extern "C" tpd_status tpd_kern_cuda_colsum_acc(tpd_kern_ctx *ctx, void *dbias, const void *dout,
                                               int N, int OC) {
    if (N <= 0 || OC <= 0) return TPD_OK;
    int nchunks = (N + TPD_KERN_BIAS_GRAD_ROWS - 1) / TPD_KERN_BIAS_GRAD_ROWS;
    TPD_CUDA_REQUIRE(nchunks <= 65535, "matmul_bwd dbias: N=%d rows are too many", N);
    void *scratch = NULL;
    TPD_CHECK(tpd_cuda_scratch(ctx, tpd_kern_bias_grad_scratch(N, OC), &scratch));
    float *partial = (float *)scratch;
    dim3 block(32, BIAS_LANES);
    dim3 grid((unsigned)((OC + 31) / 32), (unsigned)nchunks);
    /* G: the gradient element (float under fp32 main gradients) */
    TPD_CUDA_DISPATCH_GRAD(ctx, T, G, {
        colsum_partial_kernel<T><<<grid, block, 0, ctx->stream>>>(partial, (const T *)dout, N, OC);
        TPD_CHECK(TPD_CUDA_LAUNCHED("matmul_bwd dbias partials"));
        colsum_reduce_kernel<G>
            <<<(OC + 255) / 256, 256, 0, ctx->stream>>>((G *)dbias, partial, nchunks, OC);
    });
    return TPD_CUDA_LAUNCHED("matmul_bwd dbias");
}

/* ---- casts ---- */

template <typename D, typename S> __global__ void cast_kernel(D *dst, const S *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = tpd_from_f<D>(tpd_to_f(src[i]));
}

extern "C" tpd_status tpd_kern_cuda_cast(tpd_kern_ctx *ctx, void *dst, tpd_dtype dst_dt,
                                         const void *src, tpd_dtype src_dt, size_t n) {
    if (n == 0) return TPD_OK;
    if (dst_dt == src_dt) {
        size_t bytes = n * tpd_cuda_dtype_size(dst_dt);
        if (dst == src) return TPD_OK;
        return TPD_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
    }
    unsigned grid = tpd_grid_for(n, EW_BLOCK);
    if (dst_dt == TPD_DTYPE_BF16 && src_dt == TPD_DTYPE_F32)
        cast_kernel<tpd_bf16, float>
            <<<grid, EW_BLOCK, 0, ctx->stream>>>((tpd_bf16 *)dst, (const float *)src, n);
    else if (dst_dt == TPD_DTYPE_F32 && src_dt == TPD_DTYPE_BF16)
        cast_kernel<float, tpd_bf16>
            <<<grid, EW_BLOCK, 0, ctx->stream>>>((float *)dst, (const tpd_bf16 *)src, n);
    else {
        tpd_log_error("cast: %s -> %s is not supported", tpd_dtype_name(src_dt),
                      tpd_dtype_name(dst_dt));
        return TPD_ERR_UNSUPPORTED;
    }
    return TPD_CUDA_LAUNCHED("cast");
}
