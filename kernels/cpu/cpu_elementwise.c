/* Elementwise ops: tanh-approximate GELU, residual add, scale. Every tensor is in the
 * activation dtype, the arithmetic fp32. */
#include "kernels/cpu/cpu_internal.h"

#include <math.h>

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBE 0.044715f

/* bf16 tensors go through fp32 chunks of this many elements on the stack, so that the
 * fp32 loops below (libmvec's vector tanhf) run on them unchanged. */
#define EW_CHUNK 512

static void gelu_fwd_f32(float *out, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

static void gelu_bwd_f32(float *dinp, const float *inp, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        float th = tanhf(u);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] = grad * dout[i];
    }
}

static void widen(float *dst, const void *src, size_t i0, size_t n) {
    const uint16_t *h = (const uint16_t *)src + i0;
    for (size_t i = 0; i < n; i++)
        dst[i] = tpd_bf16_to_f32(h[i]);
}

static void narrow(void *dst, const float *src, size_t i0, size_t n) {
    uint16_t *h = (uint16_t *)dst + i0;
    for (size_t i = 0; i < n; i++)
        h[i] = tpd_bf16_from_f32(src[i]);
}

/* out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
tpd_status tpd_kern_cpu_gelu_fwd(tpd_kern_ctx *ctx, void *out_v, const void *inp_v, size_t n) {
    int nt = tpd_kern_cpu_threads(ctx), ab = ctx->act_bf16; /* out, inp (n) */
    size_t chunks = (n + EW_CHUNK - 1) / EW_CHUNK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * EW_CHUNK, len = n - i0 < EW_CHUNK ? n - i0 : EW_CHUNK;
        if (!ab) {
            gelu_fwd_f32((float *)out_v + i0, (const float *)inp_v + i0, len);
            continue;
        }
        float x[EW_CHUNK], y[EW_CHUNK];
        widen(x, inp_v, i0, len);
        gelu_fwd_f32(y, x, len);
        narrow(out_v, y, i0, len);
    }
    return TPD_OK;
}

/* d/dx of the line above: 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx,
 * du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2). 1 - tanh^2 instead of sech^2 = 1/cosh^2,
 * which would overflow cosh for large |u|. Each element is read before it is written,
 * so dinp may alias dout. */
tpd_status tpd_kern_cpu_gelu_bwd(tpd_kern_ctx *ctx, void *dinp_v, const void *inp_v,
                                 const void *dout_v, size_t n) {
    int nt = tpd_kern_cpu_threads(ctx), ab = ctx->act_bf16; /* dinp, inp, dout (n) */
    /* a chunk is read whole before it is written: dinp may alias dout or inp */
    size_t chunks = (n + EW_CHUNK - 1) / EW_CHUNK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * EW_CHUNK, len = n - i0 < EW_CHUNK ? n - i0 : EW_CHUNK;
        if (!ab) {
            gelu_bwd_f32((float *)dinp_v + i0, (const float *)inp_v + i0,
                         (const float *)dout_v + i0, len);
            continue;
        }
        float x[EW_CHUNK], d[EW_CHUNK], y[EW_CHUNK];
        widen(x, inp_v, i0, len);
        widen(d, dout_v, i0, len);
        gelu_bwd_f32(y, x, d, len);
        narrow(dinp_v, y, i0, len);
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
