/* Rotary position embedding in the "rotate half" layout (Llama, Megatron), in place on the
 * Q and K heads of qkv(B,T,(NH+2*NKV)*HS); forward and backward side by side.
 *
 * One thread per (token, i < HS/2): it computes the angle theta_i = p * inv_freq_i
 * (kernels/rope_freq.h: base^(-2i/HS), with Llama 3.1's scaling),
 * p = pos0 + t, and its cosine and sine in double (no table: HS/2 double sincos per token,
 * shared by every head), then rotates the pair (x_i, x_{i+HS/2}) of each of the NH + NKV
 * heads of its token. Threads of a warp hold consecutive i, so each head's accesses are
 * contiguous. The rotation itself is fp32. */
#include "kernels/cuda/cuda_common.cuh"

#define ROPE_BLOCK 256

/* dir = +1: forward rotation by theta; dir = -1: its transpose (rotation by -theta). */
template <typename T>
__global__ void rope_kernel(T *qkv, size_t n, int T_, int NH, int NKV, int HS, tpd_rope rope,
                            int pos0, float dir) {
    const int half = HS / 2;
    const size_t W = (size_t)(NH + 2 * NKV) * HS;
    const int heads = NH + NKV; /* Q heads, then K heads: contiguous at the row's start */
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t tok = idx / (size_t)half;
        int i = (int)(idx % (size_t)half);
        int t = (int)(tok % (size_t)T_);
        double theta = ((double)pos0 + t) * tpd_rope_inv_freq(&rope, i, HS);
        double sd, cd;
        sincos(theta, &sd, &cd);
        float c = (float)cd, s = dir * (float)sd;
        T *row = qkv + tok * W + i;
        for (int h = 0; h < heads; h++) {
            T *x = row + (size_t)h * HS;
            float x1 = tpd_to_f(x[0]), x2 = tpd_to_f(x[half]);
            x[0] = tpd_from_f<T>(x1 * c - x2 * s);
            x[half] = tpd_from_f<T>(x1 * s + x2 * c);
        }
    }
}

static tpd_status rope_launch(tpd_kern_ctx *ctx, void *qkv, int B, int T, int NH, int NKV, int HS,
                              const tpd_rope *rope, int pos0, float dir, const char *name) {
    TPD_CUDA_REQUIRE(B >= 0 && T > 0 && NH > 0 && NKV > 0 && HS > 0 && HS % 2 == 0,
                     "%s: bad shape B=%d T=%d NH=%d NKV=%d HS=%d (HS must be even)", name, B, T, NH,
                     NKV, HS);
    TPD_CUDA_REQUIRE(rope->base > 0.0 && pos0 >= 0, "%s: bad rotary base %g or first position %d",
                     name, rope->base, pos0);
    size_t n = (size_t)B * T * (HS / 2);
    if (n == 0) return TPD_OK;
    TPD_CUDA_DISPATCH(ctx->dtype, E, {
        rope_kernel<E><<<tpd_grid_for(n, ROPE_BLOCK), ROPE_BLOCK, 0, ctx->stream>>>(
            (E *)qkv, n, T, NH, NKV, HS, *rope, pos0, dir);
    });
    return TPD_CUDA_LAUNCHED(name);
}

/* (x_i, x_{i+HS/2}) <- (x_i cos - x_{i+HS/2} sin, x_i sin + x_{i+HS/2} cos) */
extern "C" tpd_status tpd_kern_cuda_rope_fwd(tpd_kern_ctx *ctx, void *qkv, int B, int T, int NH,
                                             int NKV, int HS, const tpd_rope *rope, int pos0) {
    return rope_launch(ctx, qkv, B, T, NH, NKV, HS, rope, pos0, 1.0f, "rope_fwd");
}

/* The forward is a rotation R(theta) of each pair, so d(before) = R(theta)^T d(after) =
 * R(-theta) d(after): (d_i cos + d_{i+HS/2} sin, -d_i sin + d_{i+HS/2} cos). */
extern "C" tpd_status tpd_kern_cuda_rope_bwd(tpd_kern_ctx *ctx, void *dqkv, int B, int T, int NH,
                                             int NKV, int HS, const tpd_rope *rope, int pos0) {
    return rope_launch(ctx, dqkv, B, T, NH, NKV, HS, rope, pos0, -1.0f, "rope_bwd");
}
