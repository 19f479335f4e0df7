/* Token rows to and from their experts (kernels.h, mixture of experts), in the context dtype;
 * products and sums in fp32, each output rounded once where it is stored (the cpu backend's
 * recipe, kernels/cpu/cpu_moe.c).
 *
 * scatter_add_rows adds several input rows into one output row. Deterministic without
 * atomics, like the embedding backward: the (idx[i], i) pairs are radix-sorted by idx (a
 * stable sort, so each output row's i stay in increasing order), then one warp per run of
 * equal keys adds the run's rows in that order, rounding after each add as the cpu does
 * (out += inp[i], one stored value per i). The sums so are the cpu's, bit for bit. */
#include "kernels/cuda/cuda_sort.cuh"

#define MOE_BLOCK 256

/* out[i] = inp[idx[i]]: one block per row, 16-byte packs when C and the pointers allow. */
template <typename T>
__global__ void gather_rows_kernel(T *out, const T *inp, const int32_t *idx, int C, int vec) {
    const int i = blockIdx.x;
    const T *x = inp + (size_t)idx[i] * C;
    T *o = out + (size_t)i * C;
    if (vec) {
        constexpr int V = tpd_pack<T>::N;
        for (int c = threadIdx.x * V; c < C; c += blockDim.x * V)
            tpd_store_pack(o + c, tpd_ldg_pack(x + c));
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            o[c] = x[c];
    }
}

extern "C" tpd_status tpd_kern_cuda_gather_rows(tpd_kern_ctx *ctx, void *out, const void *inp,
                                                const int32_t *idx, int N, int C) {
    TPD_CUDA_REQUIRE(N >= 0 && C >= 0, "gather_rows: bad shape N=%d C=%d", N, C);
    if (N == 0 || C == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        int vec = C % tpd_pack<T>::N == 0 && tpd_aligned16(out) && tpd_aligned16(inp);
        gather_rows_kernel<T>
            <<<N, MOE_BLOCK, 0, ctx->stream>>>((T *)out, (const T *)inp, idx, C, vec);
    });
    return TPD_CUDA_LAUNCHED("gather_rows");
}

/* Sort keys: the output row, or rows_out (skipped) for one outside 0..rows_out-1. */
__global__ void scatter_keys_kernel(int32_t *keys, int32_t *vals, const int32_t *idx, int N,
                                    int rows_out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    int r = idx[i];
    keys[i] = r >= 0 && r < rows_out ? r : rows_out;
    vals[i] = i;
}

/* One warp per run of equal keys (sorted positions [i, end)): out[row] += inp[vals[q]] for
 * q in order, each add rounded to T. */
template <typename T>
__global__ void scatter_add_runs_kernel(T *out, const T *inp, const int32_t *keys,
                                        const int32_t *vals, int N, int C, int rows_out) {
    int wpb = blockDim.x / 32;
    int i = blockIdx.x * wpb + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (i >= N) return;
    int row = keys[i];
    if (row >= rows_out) return;             /* outside the output */
    if (i > 0 && keys[i - 1] == row) return; /* not the first of its run */
    int lo = i + 1, hi = N;                  /* the run's end: the first key above row */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (keys[mid] == row)
            lo = mid + 1;
        else
            hi = mid;
    }
    T *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        T acc = o[c];
        for (int q = i; q < lo; q++)
            acc = tpd_from_f<T>(tpd_to_f(acc) + tpd_to_f(inp[(size_t)vals[q] * C + c]));
        o[c] = acc;
    }
}

extern "C" tpd_status tpd_kern_cuda_scatter_add_rows(tpd_kern_ctx *ctx, void *out, const void *inp,
                                                     const int32_t *idx, int N, int C,
                                                     int rows_out) {
    TPD_CUDA_REQUIRE(N >= 0 && C >= 0 && rows_out >= 0,
                     "scatter_add_rows: bad shape N=%d C=%d rows_out=%d", N, C, rows_out);
    if (N == 0 || C == 0 || rows_out == 0) return TPD_OK;
    /* tpd_kern_scatter_rows_scratch(N) unless cub wants more temp */
    tpd_cuda_sort so;
    TPD_CHECK(tpd_cuda_sort_begin(ctx, "scatter_add_rows", N, rows_out, 0, &so));
    scatter_keys_kernel<<<(N + 255) / 256, 256, 0, ctx->stream>>>(so.keys_in, so.vals_in, idx, N,
                                                                  rows_out);
    TPD_CHECK(TPD_CUDA_LAUNCHED("scatter_add_rows keys"));
    TPD_CHECK(tpd_cuda_sort_run(ctx, &so));
    const int wpb = MOE_BLOCK / 32;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        scatter_add_runs_kernel<T><<<(N + wpb - 1) / wpb, MOE_BLOCK, 0, ctx->stream>>>(
            (T *)out, (const T *)inp, so.keys_out, so.vals_out, N, C, rows_out);
    });
    return TPD_CUDA_LAUNCHED("scatter_add_rows");
}

/* out[i] = s[i] * inp[i] (out may alias inp: each element is read before it is written by
 * the same thread). */
template <typename T>
__global__ void scale_rows_kernel(T *out, const T *inp, const float *s, int N, int C) {
    size_t n = (size_t)N * C;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x)
        out[k] = tpd_from_f<T>(s[k / C] * tpd_to_f(inp[k]));
}

extern "C" tpd_status tpd_kern_cuda_scale_rows(tpd_kern_ctx *ctx, void *out, const void *inp,
                                               const float *s, int N, int C) {
    TPD_CUDA_REQUIRE(N >= 0 && C >= 0, "scale_rows: bad shape N=%d C=%d", N, C);
    size_t n = (size_t)N * C;
    if (n == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        scale_rows_kernel<T><<<tpd_grid_for(n, MOE_BLOCK), MOE_BLOCK, 0, ctx->stream>>>(
            (T *)out, (const T *)inp, s, N, C);
    });
    return TPD_CUDA_LAUNCHED("scale_rows");
}

/* out[i] = a[i] . b[i] in fp32: one warp per row, a fixed lane order and shuffle tree. */
template <typename T>
__global__ void row_dot_kernel(float *out, const T *a, const T *b, int N, int C) {
    int wpb = blockDim.x / 32;
    int i = blockIdx.x * wpb + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (i >= N) return;
    const T *x = a + (size_t)i * C, *y = b + (size_t)i * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32)
        sum += tpd_to_f(x[c]) * tpd_to_f(y[c]);
    sum = tpd_warp_sum(sum);
    if (lane == 0) out[i] = sum;
}

extern "C" tpd_status tpd_kern_cuda_row_dot(tpd_kern_ctx *ctx, float *out, const void *a,
                                            const void *b, int N, int C) {
    TPD_CUDA_REQUIRE(N >= 0 && C >= 0, "row_dot: bad shape N=%d C=%d", N, C);
    if (N == 0) return TPD_OK;
    const int wpb = MOE_BLOCK / 32;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        row_dot_kernel<T><<<(N + wpb - 1) / wpb, MOE_BLOCK, 0, ctx->stream>>>(out, (const T *)a,
                                                                              (const T *)b, N, C);
    });
    return TPD_CUDA_LAUNCHED("row_dot");
}
