/* Elementwise ops: tanh-approximate GELU, residual add, scale. Every tensor is in the
 * activation dtype, the arithmetic fp32. */
#include "kernels/cpu/cpu_internal.h"

#include <math.h>

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBE 0.044715f

/* out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
tpd_status tpd_kern_cpu_gelu_fwd(tpd_kern_ctx *ctx, void *out_v, const void *inp_v, size_t n) {
    const int ab = ctx->act_bf16; /* out, inp (n) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = tpd_cpu_ld(inp_v, i, ab);
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        tpd_cpu_st(out_v, i, 0.5f * x * (1.0f + tanhf(u)), ab);
    }
    return TPD_OK;
}

/* d/dx of the line above: 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx,
 * du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2). 1 - tanh^2 instead of sech^2 = 1/cosh^2,
 * which would overflow cosh for large |u|. Each element is read before it is written,
 * so dinp may alias dout. */
tpd_status tpd_kern_cpu_gelu_bwd(tpd_kern_ctx *ctx, void *dinp_v, const void *inp_v,
                                 const void *dout_v, size_t n) {
    const int ab = ctx->act_bf16; /* dinp, inp, dout (n) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = tpd_cpu_ld(inp_v, i, ab);
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        float th = tanhf(u);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        tpd_cpu_st(dinp_v, i, grad * tpd_cpu_ld(dout_v, i, ab), ab);
    }
    return TPD_OK;
}

tpd_status tpd_kern_cpu_add(tpd_kern_ctx *ctx, void *out_v, const void *a_v, const void *b_v,
                            size_t n) {
    const int ab = ctx->act_bf16; /* out (n), may alias a or b; a, b (n) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++)
        tpd_cpu_st(out_v, i, tpd_cpu_ld(a_v, i, ab) + tpd_cpu_ld(b_v, i, ab), ab);
    return TPD_OK;
}

tpd_status tpd_kern_cpu_scale(tpd_kern_ctx *ctx, void *x_v, float s, size_t n) {
    const int ab = ctx->act_bf16; /* x (n) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++)
        tpd_cpu_st(x_v, i, tpd_cpu_ld(x_v, i, ab) * s, ab);
    return TPD_OK;
}
