/* Token and position embeddings, forward and backward side by side.
 *
 * Vocab-parallel: this rank holds rows [v0, v0+Vl) of the token table; tokens outside
 * that range embed to zero here and the tensor-parallel layer all-reduces the rows. */
#include "kernels/cuda/cuda_sort.cuh"

#define EMB_BLOCK 256

/* out[n] = wte[tok[n] - v0] or 0. One block per token row, 16-byte packs when C allows. */
template <typename T>
__global__ void embed_fwd_kernel(T *out, const int32_t *tokens, const T *wte, int C, int v0, int Vl,
                                 int vec) {
    int n = blockIdx.x;
    int64_t row = (int64_t)tokens[n] - v0;
    int valid = row >= 0 && row < Vl;
    T *o = out + (size_t)n * C;
    const T *w = wte + (size_t)(valid ? row : 0) * C;
    if (vec) {
        constexpr int V = tpd_pack<T>::N;
        for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
            tpd_pack<T> p;
            if (valid)
                p = tpd_ldg_pack(w + c);
            else
                for (int k = 0; k < V; k++)
                    p.v[k] = tpd_from_f<T>(0.0f);
            tpd_store_pack(o + c, p);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            o[c] = valid ? w[c] : tpd_from_f<T>(0.0f);
    }
}

extern "C" tpd_status tpd_kern_cuda_embed_fwd(tpd_kern_ctx *ctx, void *out, const int32_t *tokens,
                                              const void *wte, int N, int C, int v0, int Vl) {
    TPD_CUDA_REQUIRE(N >= 0 && C > 0 && Vl >= 0, "embed_fwd: bad shape N=%d C=%d Vl=%d", N, C, Vl);
    if (N == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        int vec = C % tpd_pack<T>::N == 0 && tpd_aligned16(out) && tpd_aligned16(wte);
        embed_fwd_kernel<T>
            <<<N, EMB_BLOCK, 0, ctx->stream>>>((T *)out, tokens, (const T *)wte, C, v0, Vl, vec);
    });
    return TPD_CUDA_LAUNCHED("embed_fwd");
}

/* Backward of out[n] = wte[tok[n] - v0]: dwte[row] += sum of dout[n] over tok[n] - v0 == row.
 *
 * Deterministic without atomics: the (row, n) pairs are radix-sorted by row (a stable
 * sort, so each row's n stay in increasing order). Then two passes, so that a token that
 * fills much of the batch (a space in byte-level text) is summed by many warps, not one:
 *  1. one warp per chunk of TPD_KERN_EMBED_SEG sorted positions sums each run of one row
 *     inside its chunk, in order, into partials at the run's first position in the chunk;
 *  2. one warp per distinct row adds its partials in position order (its first position,
 *     then every chunk start inside its run) and adds the total to dwte once.
 * The order of every sum is fixed by the sort. Out-of-range tokens get the key Vl and are
 * skipped. */
__global__ void embed_keys_kernel(int32_t *keys, int32_t *vals, const int32_t *tokens, int N,
                                  int v0, int Vl) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int64_t row = (int64_t)tokens[n] - v0;
    keys[n] = (row >= 0 && row < Vl) ? (int32_t)row : Vl;
    vals[n] = n;
}

template <typename T>
__global__ void embed_bwd_partial_kernel(float *partials, const T *dout, const int32_t *keys,
                                         const int32_t *vals, int N, int C, int Vl) {
    int warps_per_block = blockDim.x / 32;
    int w = blockIdx.x * warps_per_block + threadIdx.x / 32, lane = threadIdx.x & 31;
    int p0 = w * TPD_KERN_EMBED_SEG;
    if (p0 >= N) return;
    int p1 = p0 + TPD_KERN_EMBED_SEG < N ? p0 + TPD_KERN_EMBED_SEG : N;
    for (int i = p0; i < p1;) {
        int row = keys[i], j = i + 1;
        while (j < p1 && keys[j] == row)
            j++;
        if (row < Vl)
            for (int c = lane; c < C; c += 32) {
                float acc = 0.0f;
                for (int q = i; q < j; q++)
                    acc += tpd_to_f(dout[(size_t)vals[q] * C + c]);
                partials[(size_t)i * C + c] = acc;
            }
        i = j;
    }
}

/* G: the gradient element (float under fp32 main gradients) */
template <typename G>
__global__ void embed_bwd_final_kernel(G *dwte, const float *partials, const int32_t *keys, int N,
                                       int C, int Vl) {
    int warps_per_block = blockDim.x / 32;
    int i = blockIdx.x * warps_per_block + threadIdx.x / 32; /* sorted position */
    int lane = threadIdx.x & 31;
    if (i >= N) return;
    int row = keys[i];
    if (row >= Vl) return;                   /* not this rank's token */
    if (i > 0 && keys[i - 1] == row) return; /* not the first of its run */
    int lo = i + 1, hi = N;                  /* the run's end: the first key above row */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (keys[mid] == row)
            lo = mid + 1;
        else
            hi = mid;
    }
    int end = lo;
    G *dw = dwte + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float acc = partials[(size_t)i * C + c];
        for (int q = (i / TPD_KERN_EMBED_SEG + 1) * TPD_KERN_EMBED_SEG; q < end;
             q += TPD_KERN_EMBED_SEG)
            acc += partials[(size_t)q * C + c];
        dw[c] = tpd_from_f<G>(tpd_to_f(dw[c]) + acc);
    }
}

extern "C" tpd_status tpd_kern_cuda_embed_bwd(tpd_kern_ctx *ctx, void *dwte, const void *dout,
                                              const int32_t *tokens, int N, int C, int v0, int Vl) {
    TPD_CUDA_REQUIRE(N >= 0 && C > 0 && Vl >= 0, "embed_bwd: bad shape N=%d C=%d Vl=%d", N, C, Vl);
    if (N == 0 || Vl == 0) return TPD_OK;
    tpd_cuda_sort so; /* keys in [0, Vl]; the per-chunk partials after the arrays */
    TPD_CHECK(
        tpd_cuda_sort_begin(ctx, "embed_bwd", N, Vl, tpd_kern_embed_partials_bytes(N, C), &so));
    float *partials = (float *)so.extra;
    embed_keys_kernel<<<(N + 255) / 256, 256, 0, ctx->stream>>>(so.keys_in, so.vals_in, tokens, N,
                                                                v0, Vl);
    TPD_CHECK(TPD_CUDA_LAUNCHED("embed_bwd keys"));
    TPD_CHECK(tpd_cuda_sort_run(ctx, &so));
    const int block = 256, wpb = block / 32;
    int chunks = (N + TPD_KERN_EMBED_SEG - 1) / TPD_KERN_EMBED_SEG;
    TPD_CUDA_DISPATCH_GRAD(ctx, T, G, {
        embed_bwd_partial_kernel<T><<<(chunks + wpb - 1) / wpb, block, 0, ctx->stream>>>(
            partials, (const T *)dout, so.keys_out, so.vals_out, N, C, Vl);
        embed_bwd_final_kernel<G><<<(N + wpb - 1) / wpb, block, 0, ctx->stream>>>(
            (G *)dwte, partials, so.keys_out, N, C, Vl);
    });
    return TPD_CUDA_LAUNCHED("embed_bwd");
}

/* out(B,T,C) += wpe(T,C) */
template <typename T> __global__ void pos_fwd_kernel(T *out, const T *wpe, size_t n, size_t TC) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = tpd_from_f<T>(tpd_to_f(out[i]) + tpd_to_f(wpe[i % TC]));
}

extern "C" tpd_status tpd_kern_cuda_pos_fwd(tpd_kern_ctx *ctx, void *out, const void *wpe, int B,
                                            int T_, int C) {
    TPD_CUDA_REQUIRE(B >= 0 && T_ >= 0 && C >= 0, "pos_fwd: bad shape B=%d T=%d C=%d", B, T_, C);
    size_t TC = (size_t)T_ * C, n = (size_t)B * TC;
    if (n == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        pos_fwd_kernel<T><<<tpd_grid_for(n, EMB_BLOCK), EMB_BLOCK, 0, ctx->stream>>>(
            (T *)out, (const T *)wpe, n, TC);
    });
    return TPD_CUDA_LAUNCHED("pos_fwd");
}

/* Backward of out[b,t] += wpe[t]: dwpe[t,c] += sum_b dout[b,t,c], summed over b in order
 * by the one thread that owns (t,c). */
template <typename T, typename G>
__global__ void pos_bwd_kernel(G *dwpe, const T *dout, int B, size_t TC) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < TC;
         i += (size_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int b = 0; b < B; b++)
            acc += tpd_to_f(dout[(size_t)b * TC + i]);
        dwpe[i] = tpd_from_f<G>(tpd_to_f(dwpe[i]) + acc);
    }
}

extern "C" tpd_status tpd_kern_cuda_pos_bwd(tpd_kern_ctx *ctx, void *dwpe, const void *dout, int B,
                                            int T_, int C) {
    TPD_CUDA_REQUIRE(B >= 0 && T_ >= 0 && C >= 0, "pos_bwd: bad shape B=%d T=%d C=%d", B, T_, C);
    size_t TC = (size_t)T_ * C;
    if (TC == 0 || B == 0) return TPD_OK;
    TPD_CUDA_DISPATCH_GRAD(ctx, T, G, {
        pos_bwd_kernel<T, G><<<tpd_grid_for(TC, EMB_BLOCK), EMB_BLOCK, 0, ctx->stream>>>(
            (G *)dwpe, (const T *)dout, B, TC);
    });
    return TPD_CUDA_LAUNCHED("pos_bwd");
}
