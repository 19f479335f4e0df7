/* One new position over a key/value cache (decoding), grouped-query: a simple kernel, one
 * block of DEC_WARPS warps per query head, fp32 arithmetic on E (bf16 or fp32) K and V.
 *
 * A warp computes the score of one cached position at a time (its lanes split the HS
 * products, a warp sum adds them), so the keys are read in contiguous rows. Pass 1 finds the
 * largest score; pass 2 recomputes the scores a tile of DEC_TILE positions at a time (the same
 * lanes in the same order, so the same bits) into shared memory as exp(score - max), adds
 * them to the normalizer and their weighted values to the head's output accumulator, one
 * thread per output column. Shared memory is q and the accumulator (HS floats each) plus one
 * tile: no scratch, whatever len is. */
#include "kernels/cuda/cuda_common.cuh"

#include <math.h>

#define DEC_WARPS 8
#define DEC_TILE 256 /* positions per pass-2 tile */

/* score(t) = scale * q . k_t, reduced over the warp (every lane gets it). */
template <typename E>
__device__ __forceinline__ float decode_score(const float *qs, const E *k, int HS, int lane,
                                              float scale) {
    float s = 0.0f;
    for (int d = lane; d < HS; d += 32)
        s += qs[d] * tpd_to_f(k[d]);
    return tpd_warp_sum(s) * scale;
}

template <typename E>
__global__ void attention_decode_kernel(E *out, const E *q, const E *kcache, const E *vcache,
                                        int len, int NH, int NKV, int HS, float scale) {
    extern __shared__ float sh[]; /* q (HS), acc (HS), p (DEC_TILE) */
    float *qs = sh, *acc = sh + HS, *p = sh + 2 * HS;
    const int h = blockIdx.x, g = h / (NH / NKV);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t KV = (size_t)NKV * HS; /* a cache row */
    const E *k = kcache + (size_t)g * HS, *v = vcache + (size_t)g * HS;
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        qs[d] = tpd_to_f(q[(size_t)h * HS + d]);
        acc[d] = 0.0f;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int t = warp; t < len; t += DEC_WARPS)
        mx = fmaxf(mx, decode_score(qs, k + (size_t)t * KV, HS, lane, scale));
    mx = tpd_block_max(mx);
    float sum = 0.0f; /* lane 0 of each warp: its positions' exp */
    for (int t0 = 0; t0 < len; t0 += DEC_TILE) {
        int nt = len - t0 < DEC_TILE ? len - t0 : DEC_TILE;
        for (int j = warp; j < nt; j += DEC_WARPS) {
            float e = expf(decode_score(qs, k + (size_t)(t0 + j) * KV, HS, lane, scale) - mx);
            if (lane == 0) {
                p[j] = e;
                sum += e;
            }
        }
        __syncthreads();
        for (int d = threadIdx.x; d < HS; d += blockDim.x) {
            float a = acc[d];
            for (int j = 0; j < nt; j++)
                a += p[j] * tpd_to_f(v[(size_t)(t0 + j) * KV + d]);
            acc[d] = a;
        }
        __syncthreads(); /* the next tile overwrites p */
    }
    float inv = 1.0f / tpd_block_sum(sum);
    for (int d = threadIdx.x; d < HS; d += blockDim.x)
        out[(size_t)h * HS + d] = tpd_from_f<E>(acc[d] * inv);
}

extern "C" tpd_status tpd_kern_cuda_attention_decode(tpd_kern_ctx *ctx, void *out, const void *q,
                                                     const void *kcache, const void *vcache,
                                                     int len, int NH, int NKV, int HS) {
    TPD_CUDA_REQUIRE(len >= 1 && NH > 0 && NKV > 0 && HS > 0 && NH % NKV == 0,
                     "attention_decode: bad shape len=%d NH=%d NKV=%d HS=%d (NKV must divide NH)",
                     len, NH, NKV, HS);
    float scale = (float)(1.0 / sqrt((double)HS));
    size_t shared = (2 * (size_t)HS + DEC_TILE) * sizeof(float);
    TPD_CUDA_DISPATCH(ctx->dtype, E, {
        attention_decode_kernel<E><<<NH, DEC_WARPS * 32, shared, ctx->stream>>>(
            (E *)out, (const E *)q, (const E *)kcache, (const E *)vcache, len, NH, NKV, HS, scale);
    });
    return TPD_CUDA_LAUNCHED("attention_decode");
}
