/* The cuda backend: context, device memory ops, the ops table and the constructor.
 *
 * Everything lives in the context (device ordinal, compute stream, cuBLASLt handle and its
 * workspace, cuDNN handle, the GEMM heuristics and attention plan caches, scratch): two
 * backends in one process (two devices, or a test beside a run) never share state. */
#include "kernels/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

tpd_status tpd_cuda_check(cudaError_t err, const char *what, const char *file, int line) {
    if (err == cudaSuccess) return TPD_OK;
    tpd_log_error("cuda: %s failed: %s (%s) at %s:%d", what, cudaGetErrorString(err),
                  cudaGetErrorName(err), file, line);
    return err == cudaErrorMemoryAllocation ? TPD_ERR_NOMEM : TPD_ERR_BACKEND;
}

tpd_status tpd_cublas_check(cublasStatus_t st, const char *what, const char *file, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return TPD_OK;
    tpd_log_error("cuBLASLt: %s failed: %s at %s:%d", what, cublasLtGetStatusString(st), file,
                  line);
    return st == CUBLAS_STATUS_ALLOC_FAILED ? TPD_ERR_NOMEM : TPD_ERR_BACKEND;
}

tpd_status tpd_cudnn_check(cudnnStatus_t st, const char *what, const char *file, int line) {
    if (st == CUDNN_STATUS_SUCCESS) return TPD_OK;
    char detail[512];
    cudnnGetLastErrorString(detail, sizeof detail);
    tpd_log_error("cuDNN: %s failed: %s (%s) at %s:%d", what, cudnnGetErrorString(st), detail, file,
                  line);
    return TPD_ERR_BACKEND;
}

size_t tpd_cuda_dtype_size(tpd_dtype dt) {
    return tpd_dtype_size(dt);
}

/* Replaces the scratch by one of `bytes` (stream-ordered, so kernels still running on the
 * old one keep it until they finish). */
static tpd_status scratch_realloc(tpd_kern_ctx *ctx, size_t bytes) {
    if (ctx->scratch != NULL) {
        TPD_CHECK(TPD_CUDA(cudaFreeAsync(ctx->scratch, ctx->stream)));
        ctx->scratch = NULL;
        ctx->scratch_bytes = 0;
    }
    void *p = NULL;
    cudaError_t err = cudaMallocAsync(&p, bytes, ctx->stream);
    if (err != cudaSuccess) {
        tpd_log_error("cuda: scratch allocation of %zu bytes failed: %s", bytes,
                      cudaGetErrorString(err));
        return TPD_ERR_NOMEM;
    }
    ctx->scratch = p;
    ctx->scratch_bytes = bytes;
    return TPD_OK;
}

tpd_status tpd_cuda_scratch(tpd_kern_ctx *ctx, size_t bytes, void **ptr_p) {
    if (bytes <= ctx->scratch_bytes && ctx->scratch != NULL) {
        *ptr_p = ctx->scratch;
        return TPD_OK;
    }
    if (ctx->scratch_planned) {
        /* The engine reserved the plan's scratch (tpd_kern_scratch_plan) at model creation:
         * an op asking for more means the plan is wrong, and the memory the planner
         * reported is short by the difference. Debug builds stop here; release builds
         * say so and grow. */
#ifndef NDEBUG
        tpd_log_error("cuda: an op asks for %zu bytes of scratch, the plan reserved %zu "
                      "(kernels/scratch.c is out of step with the kernels)",
                      bytes, ctx->scratch_bytes);
        return TPD_ERR_INTERNAL;
#else
        tpd_log_warn("cuda: an op asks for %zu bytes of scratch, the plan reserved %zu; "
                     "growing (kernels/scratch.c is out of step with the kernels)",
                     bytes, ctx->scratch_bytes);
#endif
    }
    /* Unplanned use (a backend without a model, as in the kernel tests): grow by 1.5x so a
     * sequence of slightly larger requests does not reallocate each time. */
    TPD_CHECK(scratch_realloc(ctx, ctx->scratch_planned ? bytes : bytes + bytes / 2));
    *ptr_p = ctx->scratch;
    return TPD_OK;
}

static tpd_status cuda_scratch_reserve(tpd_kern_ctx *ctx, const tpd_kern_shapes *s,
                                       size_t *bytes_p) {
    tpd_kern_scratch plan;
    TPD_CHECK(tpd_kern_scratch_plan("cuda", s, &plan));
    if (plan.total > ctx->scratch_bytes || ctx->scratch == NULL)
        TPD_CHECK(scratch_realloc(ctx, plan.total > 0 ? plan.total : 256));
    ctx->scratch_planned = 1;
    *bytes_p = ctx->scratch_bytes;
    return TPD_OK;
}

/* ---- memory ---- */

static tpd_status cuda_alloc(tpd_kern_ctx *ctx, size_t bytes, void **ptr_p) {
    (void)ctx;
    void *p = NULL;
    /* cudaMalloc of 0 bytes returns NULL; hand out a valid 256-byte block instead so that
     * callers can treat every successful alloc alike. */
    cudaError_t err = cudaMalloc(&p, bytes > 0 ? bytes : 256);
    if (err != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        tpd_log_error("cuda alloc: %zu bytes failed: %s (%zu of %zu bytes free on the device)",
                      bytes, cudaGetErrorString(err), free_b, total_b);
        return TPD_ERR_NOMEM;
    }
    *ptr_p = p;
    return TPD_OK;
}

static void cuda_free(tpd_kern_ctx *ctx, void *ptr) {
    (void)ctx;
    if (ptr != NULL) cudaFree(ptr);
}

static tpd_status cuda_zero(tpd_kern_ctx *ctx, void *ptr, size_t bytes) {
    if (bytes == 0) return TPD_OK;
    return TPD_CUDA(cudaMemsetAsync(ptr, 0, bytes, ctx->stream));
}

/* Host <-> device copies wait for their transfer, so the caller may reuse or read the host
 * buffer as soon as the call returns (pinned host memory would otherwise be read later). */
static tpd_status cuda_copy_to_device(tpd_kern_ctx *ctx, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return TPD_OK;
    TPD_CHECK(TPD_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream)));
    return TPD_CUDA(cudaStreamSynchronize(ctx->stream));
}

static tpd_status cuda_copy_to_host(tpd_kern_ctx *ctx, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return TPD_OK;
    TPD_CHECK(TPD_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream)));
    return TPD_CUDA(cudaStreamSynchronize(ctx->stream));
}

static tpd_status cuda_copy(tpd_kern_ctx *ctx, void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return TPD_OK;
    return TPD_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
}

static tpd_status cuda_copy_2d(tpd_kern_ctx *ctx, void *dst, size_t dpitch, const void *src,
                               size_t spitch, size_t width, size_t rows) {
    return TPD_CUDA(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                      cudaMemcpyDeviceToDevice, ctx->stream));
}

/* ---- host staging and events ---- */

static tpd_status cuda_host_alloc(tpd_kern_ctx *ctx, size_t bytes, void **ptr_p) {
    (void)ctx;
    return TPD_CUDA(cudaMallocHost(ptr_p, bytes > 0 ? bytes : 1));
}

static void cuda_host_free(tpd_kern_ctx *ctx, void *ptr) {
    (void)ctx;
    if (ptr != NULL) cudaFreeHost(ptr);
}

/* From pinned memory: the copy is queued and the host moves on; an event recorded after it
 * says when the source may be refilled. */
static tpd_status cuda_copy_to_device_async(tpd_kern_ctx *ctx, void *dst, const void *src,
                                            size_t bytes) {
    if (bytes == 0) return TPD_OK;
    return TPD_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream));
}

static tpd_status cuda_event_create(tpd_kern_ctx *ctx, void **event_p) {
    (void)ctx;
    cudaEvent_t ev = NULL;
    TPD_CHECK(TPD_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)));
    *event_p = (void *)ev;
    return TPD_OK;
}

static void cuda_event_destroy(tpd_kern_ctx *ctx, void *event) {
    (void)ctx;
    if (event != NULL) cudaEventDestroy((cudaEvent_t)event);
}

static tpd_status cuda_event_record(tpd_kern_ctx *ctx, void *event) {
    return TPD_CUDA(cudaEventRecord((cudaEvent_t)event, ctx->stream));
}

static tpd_status cuda_event_wait(tpd_kern_ctx *ctx, void *event) {
    (void)ctx;
    return TPD_CUDA(cudaEventSynchronize((cudaEvent_t)event));
}

static tpd_status cuda_synchronize(tpd_kern_ctx *ctx) {
    return TPD_CUDA(cudaStreamSynchronize(ctx->stream));
}

static void cuda_destroy(tpd_kern_ctx *ctx) {
    if (ctx == NULL) return;
    cudaSetDevice(ctx->device);
    if (ctx->stream != NULL) cudaStreamSynchronize(ctx->stream);
    tpd_cuda_attention_cache_destroy(ctx);
    if (ctx->scratch != NULL) cudaFreeAsync(ctx->scratch, ctx->stream);
    if (ctx->reduce_partials != NULL) cudaFree(ctx->reduce_partials);
    if (ctx->host_result != NULL) cudaFreeHost(ctx->host_result);
    if (ctx->cudnn != NULL) cudnnDestroy(ctx->cudnn);
    if (ctx->gemm_workspace != NULL) cudaFree(ctx->gemm_workspace);
    if (ctx->lt != NULL) cublasLtDestroy(ctx->lt);
    if (ctx->stream != NULL) {
        cudaStreamSynchronize(ctx->stream);
        cudaStreamDestroy(ctx->stream);
    }
    free(ctx);
}

static const tpd_kern_ops cuda_ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .zero = cuda_zero,
    .copy_to_device = cuda_copy_to_device,
    .copy_to_host = cuda_copy_to_host,
    .copy = cuda_copy,
    .copy_2d = cuda_copy_2d,
    .synchronize = cuda_synchronize,

    .embed_fwd = tpd_kern_cuda_embed_fwd,
    .embed_bwd = tpd_kern_cuda_embed_bwd,
    .pos_fwd = tpd_kern_cuda_pos_fwd,
    .pos_bwd = tpd_kern_cuda_pos_bwd,

    .layernorm_fwd = tpd_kern_cuda_layernorm_fwd,
    .layernorm_bwd = tpd_kern_cuda_layernorm_bwd,

    .matmul_fwd = tpd_kern_cuda_matmul_fwd,
    .matmul_bwd = tpd_kern_cuda_matmul_bwd,
    .bias_add = tpd_kern_cuda_bias_add,
    .matmul_gelu_fwd = tpd_kern_cuda_matmul_gelu_fwd,

    .gelu_fwd = tpd_kern_cuda_gelu_fwd,
    .gelu_bwd = tpd_kern_cuda_gelu_bwd,
    .add = tpd_kern_cuda_add,
    .scale = tpd_kern_cuda_scale,

    .attention_saved_bytes = tpd_kern_cuda_attention_saved_bytes,
    .attention_fwd = tpd_kern_cuda_attention_fwd,
    .attention_bwd = tpd_kern_cuda_attention_bwd,
    .attention_decode = tpd_kern_cuda_attention_decode,

    .gather_rows = tpd_kern_cuda_gather_rows,
    .scatter_add_rows = tpd_kern_cuda_scatter_add_rows,
    .scale_rows = tpd_kern_cuda_scale_rows,
    .row_dot = tpd_kern_cuda_row_dot,

    .xent_max = tpd_kern_cuda_xent_max,
    .xent_sumexp = tpd_kern_cuda_xent_sumexp,
    .xent_loss = tpd_kern_cuda_xent_loss,
    .xent_bwd = tpd_kern_cuda_xent_bwd,
    .sum_f32 = tpd_kern_cuda_sum_f32,

    .adamw = tpd_kern_cuda_adamw,
    .sgd = tpd_kern_cuda_sgd,
    .grad_acc = tpd_kern_cuda_grad_acc,
    .outer_delta = tpd_kern_cuda_outer_delta,
    .outer_nesterov = tpd_kern_cuda_outer_nesterov,
    .sumsq = tpd_kern_cuda_sumsq,
    .sumsq_acc = tpd_kern_cuda_sumsq_acc,
    .sumsq_take = tpd_kern_cuda_sumsq_take,
    .cast = tpd_kern_cuda_cast,

    .destroy = cuda_destroy,

    .rmsnorm_fwd = tpd_kern_cuda_rmsnorm_fwd,
    .rmsnorm_bwd = tpd_kern_cuda_rmsnorm_bwd,
    .qk_norm_fwd = tpd_kern_cuda_qk_norm_fwd,
    .qk_norm_bwd = tpd_kern_cuda_qk_norm_bwd,
    .rope_fwd = tpd_kern_cuda_rope_fwd,
    .rope_bwd = tpd_kern_cuda_rope_bwd,
    .swiglu_fwd = tpd_kern_cuda_swiglu_fwd,
    .swiglu_bwd = tpd_kern_cuda_swiglu_bwd,

    .scratch_reserve = cuda_scratch_reserve,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_to_device_async = cuda_copy_to_device_async,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .sum_f32_acc = tpd_kern_cuda_sum_f32_acc,
};

/* The module's entry points, opened by kernels/cuda_loader.c; everything else is hidden. */
#define TPD_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

TPD_CUDA_EXPORT int tpd_kern_cuda_module_available(void) {
    int n = 0;
    /* With no driver or no device this returns an error code (never aborts); clear it so
     * it does not surface from a later, unrelated call. */
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

/* The runtime's words for why there is no device ("no CUDA-capable device is detected",
 * "CUDA driver version is insufficient", ...), "" when there is one. */
TPD_CUDA_EXPORT const char *tpd_kern_cuda_module_unavailable_reason(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return cudaGetErrorString(err);
    }
    return n > 0 ? "" : "the CUDA runtime reports 0 devices";
}

/* The module links its own copy of base/: the loader hands it the program's log rank. */
TPD_CUDA_EXPORT void tpd_kern_cuda_module_set_log_rank(int rank, int print_info) {
    tpd_log_set_rank(rank, print_info);
}

TPD_CUDA_EXPORT int tpd_kern_cuda_module_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

TPD_CUDA_EXPORT tpd_status tpd_kern_cuda_module_create(const tpd_kern_config *cfg,
                                                       tpd_kern_backend *backend_p) {
    tpd_kern_config defaults = TPD_KERN_CONFIG_INIT;
    if (cfg == NULL) cfg = &defaults;
    if (cfg->dtype != TPD_DTYPE_F32 && cfg->dtype != TPD_DTYPE_BF16) {
        tpd_log_error("the cuda backend computes in bf16 or f32, but dtype %s was requested",
                      tpd_dtype_name(cfg->dtype));
        return TPD_ERR_UNSUPPORTED;
    }
    int ndev = 0;
    cudaError_t err = cudaGetDeviceCount(&ndev);
    if (err != cudaSuccess || ndev == 0) {
        cudaGetLastError();
        tpd_log_error("cuda backend: no usable CUDA device (%s)",
                      err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
        return TPD_ERR_UNSUPPORTED;
    }
    if (cfg->device < 0 || cfg->device >= ndev) {
        tpd_log_error("cuda backend: device %d requested but %d device(s) are visible", cfg->device,
                      ndev);
        return TPD_ERR_INVALID;
    }

    tpd_status st = TPD_OK;
    tpd_kern_ctx *ctx = (tpd_kern_ctx *)calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        tpd_log_error("cuda backend: out of memory allocating the context");
        return TPD_ERR_NOMEM;
    }
    ctx->device = cfg->device;
    ctx->dtype = cfg->dtype;
    ctx->grad_dtype = cfg->fp32_grads ? TPD_DTYPE_F32 : cfg->dtype;
    ctx->fused_attention = cfg->fused_attention;
    /* An escape hatch, not a setting: TRIPOD_CUDNN_GQA=0 sends grouped-query shapes of the
     * fused path to the unfused one (cuda_attention_cudnn.cu), as when cuDNN rejects them. */
    const char *gqa_env = getenv("TRIPOD_CUDNN_GQA");
    ctx->cudnn_gqa = !(gqa_env != NULL && strcmp(gqa_env, "0") == 0);
    /* TRIPOD_CUDNN_ATTN=old|unfused forces a path of kernels/attention_choice.h (tests). */
    TPD_CHECK_GOTO(tpd_attn_force_parse(getenv("TRIPOD_CUDNN_ATTN"), &ctx->attn_force), st, fail);

    TPD_CHECK_GOTO(TPD_CUDA(cudaSetDevice(ctx->device)), st, fail);
    TPD_CHECK_GOTO(TPD_CUDA(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)), st,
                   fail);
    TPD_CHECK_GOTO(TPD_CUBLAS(cublasLtCreate(&ctx->lt)), st, fail);
    TPD_CHECK_GOTO(TPD_CUDA(cudaMalloc(&ctx->gemm_workspace, TPD_CUDA_GEMM_WORKSPACE_BYTES)), st,
                   fail);
    TPD_CHECK_GOTO(TPD_CUDNN(cudnnCreate(&ctx->cudnn)), st, fail);
    TPD_CHECK_GOTO(TPD_CUDNN(cudnnSetStream(ctx->cudnn, ctx->stream)), st, fail);
    TPD_CHECK_GOTO(TPD_CUDA(cudaMallocHost((void **)&ctx->host_result, sizeof(double))), st, fail);
    TPD_CHECK_GOTO(
        TPD_CUDA(cudaMalloc(&ctx->reduce_partials, (TPD_CUDA_REDUCE_BLOCKS + 2) * sizeof(double))),
        st, fail);
    TPD_CHECK_GOTO(TPD_CUDA(cudaMemset(ctx->reduce_partials, 0,
                                       (TPD_CUDA_REDUCE_BLOCKS + 2) * sizeof(double))),
                   st, fail);

    backend_p->ops = &cuda_ops;
    backend_p->ctx = ctx;
    backend_p->name = "cuda";
    backend_p->act_dtype = cfg->dtype;
    backend_p->param_dtype = cfg->dtype;
    backend_p->grad_dtype = ctx->grad_dtype;
    backend_p->has_master = cfg->dtype == TPD_DTYPE_BF16;
    backend_p->device_memory = 1;
    backend_p->stream = (void *)ctx->stream;
    return TPD_OK;

fail:
    cuda_destroy(ctx);
    return st;
}
