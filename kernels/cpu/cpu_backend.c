/* The cpu backend: context, host memory ops, the ops table and the constructor.
 *
 * Memory is plain host memory, 64-byte aligned (one cache line, and the widest AVX-512
 * load). Each block carries a 64-byte header holding its requested size, so ->free can
 * keep ctx->bytes_allocated exact without a lookup table. */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_internal.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CPU_ALIGN 64 /* bytes; also the header size, so the payload stays aligned */

int tpd_kern_cpu_threads(const tpd_kern_ctx *ctx) {
    return ctx->num_threads > 0 ? ctx->num_threads : omp_get_max_threads();
}

int tpd_kern_cpu_blas_nested_ok(void) {
    /* openblas_get_parallel: 0 sequential, 1 pthreads, 2 OpenMP. */
    return openblas_get_parallel() != 1 || openblas_get_num_threads() == 1;
}

const char *tpd_kern_cpu_gemm_library(void) {
    return tpd_cpu_gemm_library();
}

const char *tpd_kern_cpu_blas_corename(void) {
    const char *name = openblas_get_corename();
    return name ? name : "unknown";
}

const char *tpd_kern_cpu_blas_coretype_upgrade(void) {
#if defined(__x86_64__)
    /* OpenBLAS's names for kernels with AVX-512, and with AVX2+FMA. On a CPU with AVX-512
     * only the first kind is fast enough: OpenBLAS 0.3.21 takes Zen 4 and later, and
     * virtual CPUs it does not recognise, for Haswell or Zen (AVX2), whose sgemm reaches
     * half of what its SkylakeX kernels do on a core with full-width AVX-512. */
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen"};
    const char *now = openblas_get_corename();
    for (size_t i = 0; now && i < sizeof avx512 / sizeof avx512[0]; i++)
        if (!strcasecmp(now, avx512[i])) return NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    for (size_t i = 0; now && i < sizeof avx2 / sizeof avx2[0]; i++)
        if (!strcasecmp(now, avx2[i])) return NULL;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

static tpd_status cpu_alloc(tpd_kern_ctx *ctx, size_t bytes, void **ptr_p) {
    if (bytes > SIZE_MAX - 2 * CPU_ALIGN) {
        tpd_log_error("cpu alloc: %zu bytes is too large", bytes);
        return TPD_ERR_NOMEM;
    }
    /* aligned_alloc wants a size that is a multiple of the alignment. */
    size_t total = (bytes + CPU_ALIGN + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    unsigned char *base = aligned_alloc(CPU_ALIGN, total);
    if (base == NULL) {
        tpd_log_error("cpu alloc: out of memory allocating %zu bytes (%zu already held)", bytes,
                      atomic_load(&ctx->bytes_allocated));
        return TPD_ERR_NOMEM;
    }
    memcpy(base, &bytes, sizeof bytes);
    atomic_fetch_add(&ctx->bytes_allocated, bytes);
    *ptr_p = base + CPU_ALIGN;
    return TPD_OK;
}

static void cpu_free(tpd_kern_ctx *ctx, void *ptr) {
    if (ptr == NULL) return;
    unsigned char *base = (unsigned char *)ptr - CPU_ALIGN;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    atomic_fetch_sub(&ctx->bytes_allocated, bytes);
    free(base);
}

static tpd_status cpu_zero(tpd_kern_ctx *ctx, void *ptr, size_t bytes) {
    (void)ctx;
    if (bytes > 0) memset(ptr, 0, bytes);
    return TPD_OK;
}

/* Host and "device" are the same memory here; memmove so overlapping ranges are safe. */
static tpd_status cpu_copy(tpd_kern_ctx *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes > 0) memmove(dst, src, bytes);
    return TPD_OK;
}

static tpd_status cpu_copy_2d(tpd_kern_ctx *ctx, void *dst, size_t dpitch, const void *src,
                              size_t spitch, size_t width, size_t rows) {
    (void)ctx;
    for (size_t i = 0; i < rows; i++)
        memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
    return TPD_OK;
}

static tpd_status cpu_synchronize(tpd_kern_ctx *ctx) {
    (void)ctx; /* every op has finished when it returns */
    return TPD_OK;
}

/* The cpu ops keep no backend scratch (tpd_kern_scratch_plan): there is nothing to
 * reserve, and the plan says so. */
static tpd_status cpu_scratch_reserve(tpd_kern_ctx *ctx, const tpd_kern_shapes *s,
                                      size_t *bytes_p) {
    (void)ctx;
    tpd_kern_scratch plan;
    TPD_CHECK(tpd_kern_scratch_plan("cpu", s, &plan));
    *bytes_p = plan.total;
    return TPD_OK;
}

/* Host staging is plain host memory, outside ->alloc's count (the model counts it). */
static tpd_status cpu_host_alloc(tpd_kern_ctx *ctx, size_t bytes, void **ptr_p) {
    (void)ctx;
    *ptr_p = malloc(bytes > 0 ? bytes : 1);
    if (*ptr_p == NULL) {
        tpd_log_error("cpu host alloc: out of memory allocating %zu bytes", bytes);
        return TPD_ERR_NOMEM;
    }
    return TPD_OK;
}

static void cpu_host_free(tpd_kern_ctx *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
}

/* Every op has finished when it returns: events are NULL and always complete. */
static tpd_status cpu_event_create(tpd_kern_ctx *ctx, void **event_p) {
    (void)ctx;
    *event_p = NULL;
    return TPD_OK;
}

static void cpu_event_destroy(tpd_kern_ctx *ctx, void *event) {
    (void)ctx;
    (void)event;
}

static tpd_status cpu_event_noop(tpd_kern_ctx *ctx, void *event) {
    (void)ctx;
    (void)event;
    return TPD_OK;
}

/* The sum of tpd_kern_cpu_sum_f32, divided and added in double as the trainer did on the
 * host before the accumulator moved to the backend: the same bits. */
static tpd_status cpu_sum_f32_acc(tpd_kern_ctx *ctx, double *acc, const float *x, size_t n,
                                  double div) {
    double sum = 0.0;
    TPD_CHECK(tpd_kern_cpu_sum_f32(ctx, x, n, &sum));
    *acc += sum / div;
    return TPD_OK;
}

static void cpu_destroy(tpd_kern_ctx *ctx) {
    if (ctx == NULL) return;
    size_t left = atomic_load(&ctx->bytes_allocated);
    if (left != 0) tpd_log_warn("cpu backend destroyed with %zu bytes still allocated", left);
    tpd_cpu_gemm_destroy(ctx->gemm);
    free(ctx);
}

static const tpd_kern_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .copy = cpu_copy,
    .copy_2d = cpu_copy_2d,
    .synchronize = cpu_synchronize,

    .embed_fwd = tpd_kern_cpu_embed_fwd,
    .embed_bwd = tpd_kern_cpu_embed_bwd,
    .pos_fwd = tpd_kern_cpu_pos_fwd,
    .pos_bwd = tpd_kern_cpu_pos_bwd,

    .layernorm_fwd = tpd_kern_cpu_layernorm_fwd,
    .layernorm_bwd = tpd_kern_cpu_layernorm_bwd,

    .matmul_fwd = tpd_kern_cpu_matmul_fwd,
    .matmul_bwd = tpd_kern_cpu_matmul_bwd,
    .bias_add = tpd_kern_cpu_bias_add,
    .matmul_gelu_fwd = tpd_kern_cpu_matmul_gelu_fwd,

    .gelu_fwd = tpd_kern_cpu_gelu_fwd,
    .gelu_bwd = tpd_kern_cpu_gelu_bwd,
    .add = tpd_kern_cpu_add,
    .scale = tpd_kern_cpu_scale,

    .attention_saved_bytes = tpd_kern_cpu_attention_saved_bytes,
    .attention_fwd = tpd_kern_cpu_stage_attention_fwd,
    .attention_bwd = tpd_kern_cpu_stage_attention_bwd,
    .attention_decode = tpd_kern_cpu_stage_attention_decode,
    .attention_block_fwd = tpd_kern_cpu_stage_attention_block_fwd,
    .attention_block_finish = tpd_kern_cpu_stage_attention_block_finish,
    .attention_block_bwd = tpd_kern_cpu_stage_attention_block_bwd,
    .gather_rows = tpd_kern_cpu_gather_rows,
    .scatter_add_rows = tpd_kern_cpu_scatter_add_rows,
    .scale_rows = tpd_kern_cpu_scale_rows,
    .row_dot = tpd_kern_cpu_row_dot,

    .xent_max = tpd_kern_cpu_xent_max,
    .xent_sumexp = tpd_kern_cpu_xent_sumexp,
    .xent_loss = tpd_kern_cpu_xent_loss,
    .xent_bwd = tpd_kern_cpu_xent_bwd,
    .sum_f32 = tpd_kern_cpu_sum_f32,

    .adamw = tpd_kern_cpu_adamw,
    .sgd = tpd_kern_cpu_sgd,
    .grad_acc = tpd_kern_cpu_grad_acc,
    .outer_delta = tpd_kern_cpu_outer_delta,
    .outer_nesterov = tpd_kern_cpu_outer_nesterov,
    .sumsq = tpd_kern_cpu_sumsq,
    .sumsq_acc = tpd_kern_cpu_sumsq_acc,
    .sumsq_take = tpd_kern_cpu_sumsq_take,
    .cast = tpd_kern_cpu_cast,

    .destroy = cpu_destroy,

    .rmsnorm_fwd = tpd_kern_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = tpd_kern_cpu_rmsnorm_bwd,
    .qk_norm_fwd = tpd_kern_cpu_qk_norm_fwd,
    .qk_norm_bwd = tpd_kern_cpu_qk_norm_bwd,
    .rope_fwd = tpd_kern_cpu_rope_fwd,
    .rope_bwd = tpd_kern_cpu_rope_bwd,
    .swiglu_fwd = tpd_kern_cpu_swiglu_fwd,
    .swiglu_bwd = tpd_kern_cpu_swiglu_bwd,

    .scratch_reserve = cpu_scratch_reserve,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .copy_to_device_async = cpu_copy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_noop,
    .event_wait = cpu_event_noop,
    .sum_f32_acc = cpu_sum_f32_acc,
};

tpd_status tpd_kern_cpu_create(const tpd_kern_config *cfg, tpd_kern_backend **backend_p) {
    tpd_kern_config defaults = TPD_KERN_CONFIG_INIT;
    if (cfg == NULL) cfg = &defaults;
    if (cfg->dtype != TPD_DTYPE_F32 && cfg->dtype != TPD_DTYPE_BF16) {
        tpd_log_error("the cpu backend computes in f32 or bf16, but dtype %s was requested",
                      tpd_dtype_name(cfg->dtype));
        return TPD_ERR_UNSUPPORTED;
    }
    if (cfg->num_threads < 0) {
        tpd_log_error("cpu backend: num_threads (%d) must be >= 0 (0 = OpenMP default)",
                      cfg->num_threads);
        return TPD_ERR_INVALID;
    }
    tpd_kern_ctx *ctx = calloc(1, sizeof *ctx);
    tpd_kern_backend *b = calloc(1, sizeof *b);
    if (ctx == NULL || b == NULL) {
        free(ctx);
        free(b);
        tpd_log_error("cpu backend: out of memory allocating the context");
        return TPD_ERR_NOMEM;
    }
    ctx->num_threads = cfg->num_threads;
    if (cfg->num_threads > 0) {
        /* the sgemms run on OpenBLAS's own thread count, not on the kernels' num_threads */
        omp_set_num_threads(cfg->num_threads);
        openblas_set_num_threads(cfg->num_threads);
    }
    atomic_init(&ctx->bytes_allocated, 0);
    /* bf16: the cuda backend's dtypes (bf16 parameters and activations, fp32 master
     * weights, gradients bf16 or fp32), and oneDNN for the matrix products */
    int bf16 = cfg->dtype == TPD_DTYPE_BF16;
    ctx->act_bf16 = bf16;
    ctx->grad_bf16 = bf16 && !cfg->fp32_grads;
    if (bf16) {
        tpd_status st = tpd_cpu_gemm_create(&ctx->gemm);
        if (st != TPD_OK) {
            free(ctx);
            free(b);
            return st;
        }
    }

    b->ops = &cpu_ops;
    b->ctx = ctx;
    b->name = "cpu";
    b->act_dtype = cfg->dtype;
    b->param_dtype = cfg->dtype;
    b->grad_dtype = ctx->grad_bf16 ? TPD_DTYPE_BF16 : TPD_DTYPE_F32;
    b->has_master = bf16;
    b->device_memory = 0;
    *backend_p = b;
    return TPD_OK;
}

size_t tpd_kern_cpu_bytes_allocated(const tpd_kern_backend *b) {
    if (b == NULL || b->ops != &cpu_ops || b->ctx == NULL) return 0;
    return atomic_load(&b->ctx->bytes_allocated);
}
