/* AdamW and plain SGD on flat ranges (with fp32 master weights under bf16, reading the
 * gradients in ctx->grad_dtype: fp32 main gradients or bf16 ones), DiLoCo's outer step
 * (pseudo-gradient and Nesterov update) and the host-result
 * reductions (sum of the loss, sum of squares for the gradient norm).
 *
 * The reductions are deterministic: a fixed grid reduces fixed slices into per-block
 * doubles, and one block adds those in block order, so the bits depend on nothing but the
 * input. */
#include "kernels/cuda/cuda_common.cuh"

#include <math.h>

#define ADAM_BLOCK 256
#define RED_THREADS 256

/* g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * w -= lr * (m/bc1 / (sqrt(v/bc2) + eps) + wd * w). w is master when present (then param
 * is written as its cast), else param (fp32) itself. */
template <typename P, typename G>
__global__ void adamw_kernel(P *param, float *master, const G *grad, float *m, float *v, size_t n,
                             float lr, float b1, float b2, float eps, float wd, float inv_bc1,
                             float inv_bc2, float grad_scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = tpd_to_f(grad[i]) * grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float w = master != NULL ? master[i] : tpd_to_f(param[i]);
        float mhat = mi * inv_bc1, vhat = vi * inv_bc2;
        w -= lr * (mhat / (sqrtf(vhat) + eps) + wd * w);
        if (master != NULL) master[i] = w;
        param[i] = tpd_from_f<P>(w);
    }
}

extern "C" tpd_status tpd_kern_cuda_adamw(tpd_kern_ctx *ctx, void *param, float *master,
                                          const void *grad, float *m, float *v, size_t n, float lr,
                                          float beta1, float beta2, float eps, float weight_decay,
                                          int step, float grad_scale) {
    TPD_CUDA_REQUIRE(step >= 1, "adamw: step (%d) must be >= 1", step);
    TPD_CUDA_REQUIRE(master != NULL || ctx->dtype == TPD_DTYPE_F32,
                     "adamw: a %s parameter needs fp32 master weights", tpd_dtype_name(ctx->dtype));
    if (n == 0) return TPD_OK;
    /* Bias corrections in double on the host: 1 - beta^step loses digits in fp32 for
     * betas near 1 and early steps. */
    float inv_bc1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)step)));
    float inv_bc2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)step)));
    unsigned grid = tpd_grid_for(n, ADAM_BLOCK);
    /* grad in ctx->grad_dtype: fp32 main gradients under bf16 parameters */
    TPD_CUDA_DISPATCH_GRAD(ctx, T, G, {
        adamw_kernel<T, G><<<grid, ADAM_BLOCK, 0, ctx->stream>>>(
            (T *)param, master, (const G *)grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
            inv_bc1, inv_bc2, grad_scale);
    });
    return TPD_CUDA_LAUNCHED("adamw");
}

/* g = grad * grad_scale + wd * w;  w -= lr * g. w is master when present (then param is
 * written as its cast), else param (fp32) itself. */
template <typename P, typename G>
__global__ void sgd_kernel(P *param, float *master, const G *grad, size_t n, float lr, float wd,
                           float grad_scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float w = master != NULL ? master[i] : tpd_to_f(param[i]);
        float g = tpd_to_f(grad[i]) * grad_scale + wd * w;
        w -= lr * g;
        if (master != NULL) master[i] = w;
        param[i] = tpd_from_f<P>(w);
    }
}

extern "C" tpd_status tpd_kern_cuda_sgd(tpd_kern_ctx *ctx, void *param, float *master,
                                        const void *grad, size_t n, float lr, float weight_decay,
                                        float grad_scale) {
    TPD_CUDA_REQUIRE(master != NULL || ctx->dtype == TPD_DTYPE_F32,
                     "sgd: a %s parameter needs fp32 master weights", tpd_dtype_name(ctx->dtype));
    if (n == 0) return TPD_OK;
    unsigned grid = tpd_grid_for(n, ADAM_BLOCK);
    TPD_CUDA_DISPATCH_GRAD(ctx, T, G, {
        sgd_kernel<T, G><<<grid, ADAM_BLOCK, 0, ctx->stream>>>((T *)param, master, (const G *)grad,
                                                               n, lr, weight_decay, grad_scale);
    });
    return TPD_CUDA_LAUNCHED("sgd");
}

/* dst += src in the gradient dtype G, summed in fp32. */
template <typename G> __global__ void grad_acc_kernel(G *dst, const G *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = tpd_from_f<G>(tpd_to_f(dst[i]) + tpd_to_f(src[i]));
}

extern "C" tpd_status tpd_kern_cuda_grad_acc(tpd_kern_ctx *ctx, void *dst, const void *src,
                                             size_t n) {
    if (n == 0) return TPD_OK;
    unsigned grid = tpd_grid_for(n, ADAM_BLOCK);
    if (ctx->grad_dtype == TPD_DTYPE_F32)
        grad_acc_kernel<float>
            <<<grid, ADAM_BLOCK, 0, ctx->stream>>>((float *)dst, (const float *)src, n);
    else
        grad_acc_kernel<tpd_bf16>
            <<<grid, ADAM_BLOCK, 0, ctx->stream>>>((tpd_bf16 *)dst, (const tpd_bf16 *)src, n);
    return TPD_CUDA_LAUNCHED("grad_acc");
}

/* ---- DiLoCo's outer step ---- */

/* delta = sync - w, all fp32. */
__global__ void outer_delta_kernel(float *delta, const float *sync, const float *w, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        delta[i] = sync[i] - w[i];
}

extern "C" tpd_status tpd_kern_cuda_outer_delta(tpd_kern_ctx *ctx, float *delta, const float *sync,
                                                const float *w, size_t n) {
    if (n == 0) return TPD_OK;
    unsigned grid = tpd_grid_for(n, ADAM_BLOCK);
    outer_delta_kernel<<<grid, ADAM_BLOCK, 0, ctx->stream>>>(delta, sync, w, n);
    return TPD_CUDA_LAUNCHED("outer_delta");
}

/* d = delta * scale;  mom = momentum * mom + d;  sync -= lr * (d + momentum * mom);
 * master (when present) = sync and param = its cast. */
template <typename P>
__global__ void outer_nesterov_kernel(P *param, float *master, float *sync, float *mom,
                                      const float *delta, size_t n, float lr, float momentum,
                                      float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float d = delta[i] * scale;
        float mi = momentum * mom[i] + d;
        mom[i] = mi;
        float s = sync[i] - lr * (d + momentum * mi);
        sync[i] = s;
        if (master != NULL) master[i] = s;
        param[i] = tpd_from_f<P>(s);
    }
}

extern "C" tpd_status tpd_kern_cuda_outer_nesterov(tpd_kern_ctx *ctx, void *param, float *master,
                                                   float *sync, float *mom, const float *delta,
                                                   size_t n, float lr, float momentum,
                                                   float scale) {
    TPD_CUDA_REQUIRE(master != NULL || ctx->dtype == TPD_DTYPE_F32,
                     "outer_nesterov: a %s parameter needs fp32 master weights",
                     tpd_dtype_name(ctx->dtype));
    if (n == 0) return TPD_OK;
    unsigned grid = tpd_grid_for(n, ADAM_BLOCK);
    TPD_CUDA_DISPATCH(ctx->dtype, T, {
        outer_nesterov_kernel<T><<<grid, ADAM_BLOCK, 0, ctx->stream>>>(
            (T *)param, master, sync, mom, delta, n, lr, momentum, scale);
    });
    return TPD_CUDA_LAUNCHED("outer_nesterov");
}

/* ---- host-result reductions ---- */

template <typename T, int SQUARE>
__global__ void reduce_partial_kernel(double *partials, const T *x, size_t n) {
    /* Block b owns the contiguous slice [b*per, (b+1)*per); threads stride inside it. */
    size_t per = (n + gridDim.x - 1) / gridDim.x;
    size_t begin = (size_t)blockIdx.x * per;
    size_t end = begin + per < n ? begin + per : n;
    double acc = 0.0;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        double f = (double)tpd_to_f(x[i]);
        acc += SQUARE ? f * f : f;
    }
    acc = tpd_block_sum_d(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

/* *result = the sum of the partials in a fixed order; ACC: *result += that sum / div. */
template <int ACC>
__global__ void reduce_final_kernel(double *result, const double *partials, int nparts,
                                    double div) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x)
        acc += partials[i];
    acc = tpd_block_sum_d(acc);
    if (threadIdx.x == 0) *result = ACC ? *result + acc / div : acc;
}

template <typename T, int SQUARE>
static tpd_status reduce_to_host(tpd_kern_ctx *ctx, const T *x, size_t n, double *out_p,
                                 const char *name) {
    double *partials = (double *)ctx->reduce_partials;
    double *result = partials + TPD_CUDA_REDUCE_BLOCKS;
    if (n == 0) {
        *out_p = 0.0;
        return TPD_OK;
    }
    reduce_partial_kernel<T, SQUARE>
        <<<TPD_CUDA_REDUCE_BLOCKS, RED_THREADS, 0, ctx->stream>>>(partials, x, n);
    TPD_CHECK(TPD_CUDA_LAUNCHED(name));
    reduce_final_kernel<0>
        <<<1, RED_THREADS, 0, ctx->stream>>>(result, partials, TPD_CUDA_REDUCE_BLOCKS, 1.0);
    TPD_CHECK(TPD_CUDA_LAUNCHED(name));
    TPD_CHECK(TPD_CUDA(cudaMemcpyAsync(ctx->host_result, result, sizeof(double),
                                       cudaMemcpyDeviceToHost, ctx->stream)));
    TPD_CHECK(TPD_CUDA(cudaStreamSynchronize(ctx->stream)));
    *out_p = *ctx->host_result;
    return TPD_OK;
}

extern "C" tpd_status tpd_kern_cuda_sum_f32(tpd_kern_ctx *ctx, const float *x, size_t n,
                                            double *sum_p) {
    return reduce_to_host<float, 0>(ctx, x, n, sum_p, "sum_f32");
}

/* The sum of sum_f32 (the same partials, in the same order), added to a device double
 * instead of landing on the host: the trainer reads the loss once a step, not once a
 * micro-batch. */
extern "C" tpd_status tpd_kern_cuda_sum_f32_acc(tpd_kern_ctx *ctx, double *acc, const float *x,
                                                size_t n, double div) {
    if (n == 0) return TPD_OK;
    double *partials = (double *)ctx->reduce_partials;
    reduce_partial_kernel<float, 0>
        <<<TPD_CUDA_REDUCE_BLOCKS, RED_THREADS, 0, ctx->stream>>>(partials, x, n);
    TPD_CHECK(TPD_CUDA_LAUNCHED("sum_f32_acc"));
    reduce_final_kernel<1>
        <<<1, RED_THREADS, 0, ctx->stream>>>(acc, partials, TPD_CUDA_REDUCE_BLOCKS, div);
    return TPD_CUDA_LAUNCHED("sum_f32_acc");
}

extern "C" tpd_status tpd_kern_cuda_sumsq(tpd_kern_ctx *ctx, const void *x, tpd_dtype dt, size_t n,
                                          double *sumsq_p) {
    if (dt == TPD_DTYPE_F32)
        return reduce_to_host<float, 1>(ctx, (const float *)x, n, sumsq_p, "sumsq");
    if (dt == TPD_DTYPE_BF16)
        return reduce_to_host<tpd_bf16, 1>(ctx, (const tpd_bf16 *)x, n, sumsq_p, "sumsq");
    tpd_log_error("sumsq: dtype %s is not supported", tpd_dtype_name(dt));
    return TPD_ERR_UNSUPPORTED;
}

/* The running sum of squares lives in the double after the reduction's result (the
 * partials block has room for both); each slice's sum is the one reduce_to_host forms, added
 * in call order. */
extern "C" tpd_status tpd_kern_cuda_sumsq_acc(tpd_kern_ctx *ctx, const void *x, tpd_dtype dt,
                                              size_t n) {
    double *partials = (double *)ctx->reduce_partials;
    double *acc = partials + TPD_CUDA_REDUCE_BLOCKS + 1;
    if (n == 0) return TPD_OK;
    if (dt == TPD_DTYPE_F32)
        reduce_partial_kernel<float, 1><<<TPD_CUDA_REDUCE_BLOCKS, RED_THREADS, 0, ctx->stream>>>(
            partials, (const float *)x, n);
    else if (dt == TPD_DTYPE_BF16)
        reduce_partial_kernel<tpd_bf16, 1><<<TPD_CUDA_REDUCE_BLOCKS, RED_THREADS, 0, ctx->stream>>>(
            partials, (const tpd_bf16 *)x, n);
    else {
        tpd_log_error("sumsq_acc: dtype %s is not supported", tpd_dtype_name(dt));
        return TPD_ERR_UNSUPPORTED;
    }
    TPD_CHECK(TPD_CUDA_LAUNCHED("sumsq_acc"));
    reduce_final_kernel<1>
        <<<1, RED_THREADS, 0, ctx->stream>>>(acc, partials, TPD_CUDA_REDUCE_BLOCKS, 1.0);
    return TPD_CUDA_LAUNCHED("sumsq_acc");
}

extern "C" tpd_status tpd_kern_cuda_sumsq_take(tpd_kern_ctx *ctx, double *sumsq_p) {
    double *acc = (double *)ctx->reduce_partials + TPD_CUDA_REDUCE_BLOCKS + 1;
    TPD_CHECK(TPD_CUDA(cudaMemcpyAsync(ctx->host_result, acc, sizeof(double),
                                       cudaMemcpyDeviceToHost, ctx->stream)));
    TPD_CHECK(TPD_CUDA(cudaMemsetAsync(acc, 0, sizeof(double), ctx->stream)));
    TPD_CHECK(TPD_CUDA(cudaStreamSynchronize(ctx->stream)));
    *sumsq_p = *ctx->host_result;
    return TPD_OK;
}
