/* AdamW, the deterministic reductions behind sum_f32 and sumsq, and dtype casts. */
#include "kernels/cpu/cpu_internal.h"

#include "base/bf16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Elements per partial sum of the deterministic reductions. Fixed, so the result does
 * not depend on the thread count. */
#define REDUCE_CHUNK 4096

/* PyTorch AdamW (decoupled weight decay, scaled by lr), as kernels.h states:
 *   g = grad * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   w -= lr * (m / (1-b1^step) / (sqrt(v / (1-b2^step)) + eps) + wd * w)
 * With master != NULL the fp32 master is the w that is updated and param receives its
 * cast to the parameter dtype (bf16, or a copy under fp32); grad is in the gradient
 * dtype. This lets the same optimizer code drive both backends. */
tpd_status tpd_kern_cpu_adamw(tpd_kern_ctx *ctx, void *param_v, float *master, const void *grad_v,
                              float *m, float *v, size_t n, float lr, float beta1, float beta2,
                              float eps, float weight_decay, int step, float grad_scale) {
    TPD_CPU_REQUIRE(step >= 1, "adamw: step (%d) must be >= 1", step);
    const int pb = ctx->act_bf16, gb = ctx->grad_bf16; /* param, grad (n) */
    TPD_CPU_REQUIRE(master != NULL || !pb, "adamw: bf16 parameters need fp32 master weights");
    /* Bias corrections in double on the host: b^step underflows gracefully and is exact
     * for the early steps where it matters most. */
    const float bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    const float bc2 = (float)(1.0 - pow((double)beta2, (double)step));
    float *w = master != NULL ? master : (float *)param_v;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = tpd_cpu_ld(grad_v, i, gb) * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        float wi = w[i];
        wi -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * wi);
        w[i] = wi;
        if (master != NULL) tpd_cpu_st(param_v, i, wi, pb);
    }
    return TPD_OK;
}

static double reduce_chunk(const void *x, size_t i0, size_t i1, tpd_kern_cpu_reduce_kind kind) {
    double s = 0.0;
    switch (kind) {
    case TPD_KERN_CPU_REDUCE_SUM_F32: {
        const float *f = x;
        for (size_t i = i0; i < i1; i++)
            s += f[i];
        break;
    }
    case TPD_KERN_CPU_REDUCE_SUMSQ_F32: {
        const float *f = x;
        for (size_t i = i0; i < i1; i++)
            s += (double)f[i] * f[i];
        break;
    }
    case TPD_KERN_CPU_REDUCE_SUMSQ_BF16: {
        const uint16_t *h = x;
        for (size_t i = i0; i < i1; i++) {
            double d = tpd_bf16_to_f32(h[i]);
            s += d * d;
        }
        break;
    }
    }
    return s;
}

tpd_status tpd_kern_cpu_reduce(tpd_kern_ctx *ctx, const void *x, size_t n,
                               tpd_kern_cpu_reduce_kind kind, double *result_p) {
    size_t nchunks = (n + REDUCE_CHUNK - 1) / REDUCE_CHUNK;
    if (nchunks <= 1) {
        *result_p = reduce_chunk(x, 0, n, kind);
        return TPD_OK;
    }
    double *part = malloc(nchunks * sizeof *part);
    if (part == NULL) {
        tpd_log_error("reduction: out of memory for %zu partial sums", nchunks);
        return TPD_ERR_NOMEM;
    }
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
        size_t i0 = c * REDUCE_CHUNK;
        size_t i1 = i0 + REDUCE_CHUNK < n ? i0 + REDUCE_CHUNK : n;
        part[c] = reduce_chunk(x, i0, i1, kind);
    }
    double s = 0.0;
    for (size_t c = 0; c < nchunks; c++)
        s += part[c];
    free(part);
    *result_p = s;
    return TPD_OK;
}

tpd_status tpd_kern_cpu_sumsq(tpd_kern_ctx *ctx, const void *x, tpd_dtype dt, size_t n,
                              double *sumsq_p) {
    switch (dt) {
    case TPD_DTYPE_F32:
        return tpd_kern_cpu_reduce(ctx, x, n, TPD_KERN_CPU_REDUCE_SUMSQ_F32, sumsq_p);
    case TPD_DTYPE_BF16:
        return tpd_kern_cpu_reduce(ctx, x, n, TPD_KERN_CPU_REDUCE_SUMSQ_BF16, sumsq_p);
    default:
        break;
    }
    tpd_log_error("sumsq: dtype %s is not supported (f32 or bf16)", tpd_dtype_name(dt));
    return TPD_ERR_UNSUPPORTED;
}

tpd_status tpd_kern_cpu_cast(tpd_kern_ctx *ctx, void *dst, tpd_dtype dst_dt, const void *src,
                             tpd_dtype src_dt, size_t n) {
    int nt = tpd_kern_cpu_threads(ctx);
    if (dst_dt == src_dt && tpd_dtype_size(dst_dt) > 0) {
        if (n > 0 && dst != src) memmove(dst, src, n * tpd_dtype_size(dst_dt));
        return TPD_OK;
    }
    if (dst_dt == TPD_DTYPE_BF16 && src_dt == TPD_DTYPE_F32) {
        uint16_t *d = dst;
        const float *s = src;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (size_t i = 0; i < n; i++)
            d[i] = tpd_bf16_from_f32(s[i]);
        return TPD_OK;
    }
    if (dst_dt == TPD_DTYPE_F32 && src_dt == TPD_DTYPE_BF16) {
        float *d = dst;
        const uint16_t *s = src;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (size_t i = 0; i < n; i++)
            d[i] = tpd_bf16_to_f32(s[i]);
        return TPD_OK;
    }
    tpd_log_error("cast: %s -> %s is not supported", tpd_dtype_name(src_dt),
                  tpd_dtype_name(dst_dt));
    return TPD_ERR_UNSUPPORTED;
}

tpd_status tpd_kern_cpu_sumsq_acc(tpd_kern_ctx *ctx, const void *x, tpd_dtype dt, size_t n) {
    double s = 0.0;
    TPD_CHECK(tpd_kern_cpu_sumsq(ctx, x, dt, n, &s));
    ctx->sumsq_acc += s;
    return TPD_OK;
}

tpd_status tpd_kern_cpu_sumsq_take(tpd_kern_ctx *ctx, double *sumsq_p) {
    *sumsq_p = ctx->sumsq_acc;
    ctx->sumsq_acc = 0.0;
    return TPD_OK;
}
