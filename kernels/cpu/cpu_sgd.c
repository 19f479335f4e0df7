/* Plain SGD and DiLoCo's outer step (pseudo-gradient and Nesterov update), fp32 flat loops.
 * With master != NULL the fp32 master is the w that is updated and param receives a copy
 * of it (on cpu both are fp32, so the "cast" is a copy), as in cpu_adamw.c. */
#include "kernels/cpu/cpu_internal.h"

/* g = grad * grad_scale + wd * w;  w -= lr * g (kernels.h). */
tpd_status tpd_kern_cpu_sgd(tpd_kern_ctx *ctx, void *param_v, float *master, const void *grad_v,
                            size_t n, float lr, float weight_decay, float grad_scale) {
    float *param = param_v;     /* (n) */
    const float *grad = grad_v; /* (n) */
    float *w = master != NULL ? master : param;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float wi = w[i];
        float g = grad[i] * grad_scale + weight_decay * wi;
        wi -= lr * g;
        w[i] = wi;
        if (master != NULL) param[i] = wi;
    }
    return TPD_OK;
}

/* dst += src (fp32: the cpu backend's gradients). */
tpd_status tpd_kern_cpu_grad_acc(tpd_kern_ctx *ctx, void *dst_v, const void *src_v, size_t n) {
    float *dst = dst_v;
    const float *src = src_v;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
    return TPD_OK;
}

/* delta = sync - w. */
tpd_status tpd_kern_cpu_outer_delta(tpd_kern_ctx *ctx, float *delta, const float *sync,
                                    const float *w, size_t n) {
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++)
        delta[i] = sync[i] - w[i];
    return TPD_OK;
}

/* d = delta * scale;  mom = momentum * mom + d;  sync -= lr * (d + momentum * mom);
 * then master (when present) and param continue from sync. */
tpd_status tpd_kern_cpu_outer_nesterov(tpd_kern_ctx *ctx, void *param_v, float *master, float *sync,
                                       float *mom, const float *delta, size_t n, float lr,
                                       float momentum, float scale) {
    float *param = param_v; /* (n) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float d = delta[i] * scale;
        float mi = momentum * mom[i] + d;
        mom[i] = mi;
        float s = sync[i] - lr * (d + momentum * mi);
        sync[i] = s;
        if (master != NULL) master[i] = s;
        param[i] = s;
    }
    return TPD_OK;
}
