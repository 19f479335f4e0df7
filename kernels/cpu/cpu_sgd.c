/* Plain SGD and DiLoCo's outer step (pseudo-gradient and Nesterov update), fp32 flat loops.
 * With master != NULL the fp32 master is the w that is updated and param receives its cast
 * to the parameter dtype, as in cpu_adamw.c; gradients are in the gradient dtype. */
#include "kernels/cpu/cpu_internal.h"

/* g = grad * grad_scale + wd * w;  w -= lr * g (kernels.h). */
tpd_status tpd_kern_cpu_sgd(tpd_kern_ctx *ctx, void *param_v, float *master, const void *grad_v,
                            size_t n, float lr, float weight_decay, float grad_scale) {
    const int pb = ctx->act_bf16, gb = ctx->grad_bf16; /* param, grad (n) */
    TPD_CPU_REQUIRE(master != NULL || !pb, "sgd: bf16 parameters need fp32 master weights");
    float *w = master != NULL ? master : (float *)param_v;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float wi = w[i];
        float g = tpd_cpu_ld(grad_v, i, gb) * grad_scale + weight_decay * wi;
        wi -= lr * g;
        w[i] = wi;
        if (master != NULL) tpd_cpu_st(param_v, i, wi, pb);
    }
    return TPD_OK;
}

/* dst += src in the gradient dtype, summed in fp32. */
tpd_status tpd_kern_cpu_grad_acc(tpd_kern_ctx *ctx, void *dst_v, const void *src_v, size_t n) {
    const int gb = ctx->grad_bf16;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++)
        tpd_cpu_add_to(dst_v, i, tpd_cpu_ld(src_v, i, gb), gb);
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
    const int pb = ctx->act_bf16; /* param (n) */
    TPD_CPU_REQUIRE(master != NULL || !pb,
                    "outer_nesterov: bf16 parameters need fp32 master weights");
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float d = delta[i] * scale;
        float mi = momentum * mom[i] + d;
        mom[i] = mi;
        float s = sync[i] - lr * (d + momentum * mi);
        sync[i] = s;
        if (master != NULL) master[i] = s;
        tpd_cpu_st(param_v, i, s, pb);
    }
    return TPD_OK;
}
