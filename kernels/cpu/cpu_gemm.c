/* bf16 GEMM on the host (cpu_gemm.h): oneDNN's matmul primitive, or without oneDNN an
 * fp32 staging copy through cblas_sgemm.
 *
 * oneDNN path. The operands are described by strides, so transposes and leading
 * dimensions cost no copy: op(A) is src (M,K), op(B) is weights (K,N), C is dst (M,N).
 * alpha != 1 is an output scale passed at run time (one primitive serves every alpha),
 * beta == 1 a sum post-op that reads C in its own dtype. oneDNN 2.x applies the output
 * scale after the matmul's own bias (dst = scale * (acc + bias)), so with alpha != 1 the
 * bias is a binary-add post-op instead, which comes after the scale.
 *
 * Creating a primitive costs far more than running a small product, so a handle keeps
 * the last CACHE_SLOTS primitives, keyed by everything that shapes one. The cache is
 * guarded by a mutex and an entry in use is never evicted, so calls from several threads
 * (an OpenMP parallel region included) are safe: oneDNN primitives may execute
 * concurrently, and with its OpenMP runtime a call from inside a parallel region runs on
 * the calling thread. */
#include "kernels/cpu/cpu_gemm.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"

/* rows x cols bf16 block with row stride ld -> a tight fp32 block. */
static void widen_block(float *dst, const uint16_t *src, int rows, int cols, int ld) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)r * cols + c] = tpd_bf16_to_f32(src[(size_t)r * ld + c]);
}

/* The product through fp32 staging and cblas_sgemm, for checked arguments with M, N, K > 0:
 * A and B are widened to fp32 buffers malloc'd inside the call, and a bf16 C is staged in
 * fp32 too and rounded once at the end. Slower than a bf16 kernel (the copies, and fp32
 * FLOPs), but the same arithmetic up to the order of the fp32 summation. The whole path of
 * a build without oneDNN, and the run-time fallback of one whose oneDNN has no bf16 matmul
 * for this CPU. */
static tpd_status gemm_staged(int transa, int transb, int M, int N, int K, float alpha,
                              const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                              void *C, tpd_dtype c_dt, int ldc, const uint16_t *bias) {
    int bf16_c = c_dt == TPD_DTYPE_BF16;
    int a_rows = transa ? K : M, a_cols = transa ? M : K;
    int b_rows = transb ? N : K, b_cols = transb ? K : N;
    float *a32 = malloc((size_t)a_rows * a_cols * sizeof(float));
    float *b32 = malloc((size_t)b_rows * b_cols * sizeof(float));
    float *c32 = bf16_c ? malloc((size_t)M * N * sizeof(float)) : NULL;
    if (a32 == NULL || b32 == NULL || (bf16_c && c32 == NULL)) {
        free(c32);
        free(b32);
        free(a32);
        return tpd_fail(TPD_ERR_NOMEM,
                        "cpu_gemm_bf16: no memory for the fp32 staging of "
                        "M=%d N=%d K=%d",
                        M, N, K);
    }
    widen_block(a32, A, a_rows, a_cols, lda);
    widen_block(b32, B, b_rows, b_cols, ldb);
    /* beta * C + bias in fp32 (C itself when fp32); sgemm then adds the product with its
     * beta = 1, and a bf16 C is rounded once, at the end. */
    float *acc = bf16_c ? c32 : (float *)C;
    int ldacc = bf16_c ? N : ldc;
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            float *a = &acc[(size_t)m * ldacc + n];
            float c = 0.0f;
            if (beta != 0.0f)
                c = bf16_c ? tpd_bf16_to_f32(((const uint16_t *)C)[(size_t)m * ldc + n]) : *a;
            *a = c + (bias != NULL ? tpd_bf16_to_f32(bias[n]) : 0.0f);
        }
    }
    cblas_sgemm(CblasRowMajor, transa ? CblasTrans : CblasNoTrans,
                transb ? CblasTrans : CblasNoTrans, M, N, K, alpha, a32, a_cols, b32, b_cols, 1.0f,
                acc, ldacc);
    if (bf16_c) {
        uint16_t *c = C;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++)
                c[(size_t)m * ldc + n] = tpd_bf16_from_f32(c32[(size_t)m * N + n]);
    }
    free(c32);
    free(b32);
    free(a32);
    return TPD_OK;
}

/* Checks shared by both paths; returns from the caller on a bad argument. */
#define GEMM_REQUIRE(cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) return tpd_fail(TPD_ERR_INVALID, __VA_ARGS__);                                \
    } while (0)

/* C(M,N) = beta * C + bias, the whole answer when K == 0. */
static void gemm_empty_k(int M, int N, float beta, void *C, tpd_dtype c_dt, int ldc,
                         const uint16_t *bias) {
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)m * ldc + n;
            float b = bias != NULL ? tpd_bf16_to_f32(bias[n]) : 0.0f;
            if (c_dt == TPD_DTYPE_F32) {
                float *c = C;
                c[i] = (beta != 0.0f ? c[i] : 0.0f) + b;
            } else {
                uint16_t *c = C;
                c[i] = tpd_bf16_from_f32((beta != 0.0f ? tpd_bf16_to_f32(c[i]) : 0.0f) + b);
            }
        }
    }
}

static tpd_status gemm_check_args(const tpd_cpu_gemm *g, int transa, int transb, int M, int N,
                                  int K, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                                  float beta, const void *C, tpd_dtype c_dt, int ldc) {
    GEMM_REQUIRE(g != NULL, "cpu_gemm_bf16: NULL handle");
    GEMM_REQUIRE(M >= 0 && N >= 0 && K >= 0, "cpu_gemm_bf16: bad shape M=%d N=%d K=%d", M, N, K);
    GEMM_REQUIRE(c_dt == TPD_DTYPE_F32 || c_dt == TPD_DTYPE_BF16,
                 "cpu_gemm_bf16: C must be f32 or bf16, not %s", tpd_dtype_name(c_dt));
    GEMM_REQUIRE(beta == 0.0f || beta == 1.0f, "cpu_gemm_bf16: beta must be 0 or 1, not %g",
                 (double)beta);
    int a_cols = transa ? M : K, b_cols = transb ? K : N;
    GEMM_REQUIRE(lda >= (a_cols > 1 ? a_cols : 1) && ldb >= (b_cols > 1 ? b_cols : 1) &&
                     ldc >= (N > 1 ? N : 1),
                 "cpu_gemm_bf16: leading dimensions lda=%d ldb=%d ldc=%d below the rows' widths "
                 "%d, %d, %d (M=%d N=%d K=%d transa=%d transb=%d)",
                 lda, ldb, ldc, a_cols, b_cols, N, M, N, K, transa, transb);
    GEMM_REQUIRE(M == 0 || N == 0 || C != NULL, "cpu_gemm_bf16: NULL C");
    GEMM_REQUIRE(M == 0 || N == 0 || K == 0 || (A != NULL && B != NULL),
                 "cpu_gemm_bf16: NULL A or B");
    return TPD_OK;
}

#ifdef TPD_HAVE_DNNL

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#define CACHE_SLOTS 32 /* a layer's forward and backward shapes, times a few layer kinds */

/* Everything that shapes a primitive. Only ints, so memcmp compares it. */
typedef struct gemm_key {
    int transa, transb, M, N, K, lda, ldb, ldc;
    int c_dt;
    int accumulate; /* beta == 1 */
    int bias;       /* 0 none, 1 the matmul's bias, 2 a binary-add post-op (alpha != 1) */
    int scaled;     /* alpha != 1: run-time output scale */
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    dnnl_primitive_t prim; /* NULL: free slot */
    dnnl_memory_desc_t src_md, wei_md, dst_md, bias_md, scale_md;
    int users;          /* calls executing it now: never evicted while > 0 */
    unsigned long used; /* the cache clock at its last use (LRU) */
} gemm_entry;

struct tpd_cpu_gemm {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    pthread_mutex_t lock; /* guards entries and clock */
    unsigned long clock;
    gemm_entry entries[CACHE_SLOTS];
    atomic_int staged; /* 1 once oneDNN had no bf16 matmul for this CPU (warned once) */
};

#define DNNL_CHECK(call, what)                                                                     \
    do {                                                                                           \
        dnnl_status_t dst_ = (call);                                                               \
        if (dst_ != dnnl_success) {                                                                \
            st = tpd_fail(TPD_ERR_BACKEND, "cpu_gemm: %s: %s", what, dnnl_status2str(dst_));       \
            goto cleanup;                                                                          \
        }                                                                                          \
    } while (0)

#define STR2_(x) #x
#define STR_(x) STR2_(x)

const char *tpd_cpu_gemm_library(void) {
    /* The version of the headers built against; Debian ships the library with them. */
    return "oneDNN " STR_(DNNL_VERSION_MAJOR) "." STR_(DNNL_VERSION_MINOR) "." STR_(
        DNNL_VERSION_PATCH);
}

tpd_status tpd_cpu_gemm_create(tpd_cpu_gemm **g_p) {
    tpd_status st = TPD_OK;
    tpd_cpu_gemm *g = calloc(1, sizeof *g);
    if (g == NULL) return tpd_fail(TPD_ERR_NOMEM, "cpu_gemm_create: out of memory");
    DNNL_CHECK(dnnl_engine_create(&g->engine, dnnl_cpu, 0), "engine_create");
    DNNL_CHECK(dnnl_stream_create(&g->stream, g->engine, dnnl_stream_default_flags),
               "stream_create");
    pthread_mutex_init(&g->lock, NULL);
    *g_p = g;
    return TPD_OK;
cleanup:
    if (g->engine != NULL) dnnl_engine_destroy(g->engine);
    free(g);
    return st;
}

void tpd_cpu_gemm_destroy(tpd_cpu_gemm *g) {
    if (g == NULL) return;
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (g->entries[i].prim != NULL) dnnl_primitive_destroy(g->entries[i].prim);
    pthread_mutex_destroy(&g->lock);
    dnnl_stream_destroy(g->stream);
    dnnl_engine_destroy(g->engine);
    free(g);
}

/* Builds the primitive for key k into e (descriptors included). */
static tpd_status gemm_build(tpd_cpu_gemm *g, const gemm_key *k, gemm_entry *e) {
    tpd_status st = TPD_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_data_type_t c_dt = k->c_dt == TPD_DTYPE_F32 ? dnnl_f32 : dnnl_bf16;
    dnnl_dims_t a_dims = {k->M, k->K}, b_dims = {k->K, k->N}, c_dims = {k->M, k->N};
    dnnl_dims_t bias_dims = {1, k->N}, one = {1};
    /* op(A)(m,k) sits at A[m*lda + k], or A[k*lda + m] when transposed; likewise B. */
    dnnl_dims_t a_str = {k->transa ? 1 : k->lda, k->transa ? k->lda : 1};
    dnnl_dims_t b_str = {k->transb ? 1 : k->ldb, k->transb ? k->ldb : 1};
    dnnl_dims_t c_str = {k->ldc, 1}, bias_str = {k->N, 1};
    memset(e, 0, sizeof *e);
    e->key = *k;
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&e->src_md, 2, a_dims, dnnl_bf16, a_str), "src md");
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&e->wei_md, 2, b_dims, dnnl_bf16, b_str), "wei md");
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&e->dst_md, 2, c_dims, c_dt, c_str), "dst md");
    if (k->bias)
        DNNL_CHECK(dnnl_memory_desc_init_by_strides(&e->bias_md, 2, bias_dims, dnnl_bf16, bias_str),
                   "bias md");
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&e->scale_md, 1, one, dnnl_f32, dnnl_a), "scale md");

    DNNL_CHECK(dnnl_primitive_attr_create(&attr), "attr_create");
    if (k->scaled) {
        float rt = DNNL_RUNTIME_F32_VAL;
        DNNL_CHECK(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &rt), "output scales");
    }
    DNNL_CHECK(dnnl_post_ops_create(&po), "post_ops_create");
    if (k->bias == 2)
        DNNL_CHECK(dnnl_post_ops_append_binary(po, dnnl_binary_add, &e->bias_md), "bias");
    if (k->accumulate) DNNL_CHECK(dnnl_post_ops_append_sum(po, 1.0f), "sum post-op");
    DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, po), "set_post_ops");

    dnnl_matmul_desc_t desc;
    DNNL_CHECK(dnnl_matmul_desc_init(&desc, &e->src_md, &e->wei_md,
                                     k->bias == 1 ? &e->bias_md : NULL, &e->dst_md),
               "matmul_desc_init");
    dnnl_status_t ds = dnnl_primitive_desc_create(&pd, &desc, attr, g->engine, NULL);
    if (ds == dnnl_unimplemented) { /* no bf16 kernel for this CPU: the caller falls back */
        st = TPD_ERR_UNSUPPORTED;
        goto cleanup;
    }
    if (ds != dnnl_success) {
        st = tpd_fail(ds == dnnl_unimplemented ? TPD_ERR_UNSUPPORTED : TPD_ERR_BACKEND,
                      "cpu_gemm: no oneDNN matmul for M=%d N=%d K=%d transa=%d transb=%d "
                      "lda=%d ldb=%d ldc=%d C=%s beta=%d bias=%d alpha_scaled=%d: %s",
                      k->M, k->N, k->K, k->transa, k->transb, k->lda, k->ldb, k->ldc,
                      tpd_dtype_name((tpd_dtype)k->c_dt), k->accumulate, k->bias, k->scaled,
                      dnnl_status2str(ds));
        goto cleanup;
    }
    DNNL_CHECK(dnnl_primitive_create(&e->prim, pd), "primitive_create");
cleanup:
    if (pd != NULL) dnnl_primitive_desc_destroy(pd);
    if (po != NULL) dnnl_post_ops_destroy(po);
    if (attr != NULL) dnnl_primitive_attr_destroy(attr);
    return st;
}

/* The cached entry for k, built on a miss, with its users count raised; *e_p is a
 * malloc'd uncached entry (users == -1) when every slot is in use. */
static tpd_status gemm_acquire(tpd_cpu_gemm *g, const gemm_key *k, gemm_entry **e_p) {
    pthread_mutex_lock(&g->lock);
    gemm_entry *victim = NULL;
    for (int i = 0; i < CACHE_SLOTS; i++) {
        gemm_entry *e = &g->entries[i];
        if (e->prim != NULL && memcmp(&e->key, k, sizeof *k) == 0) {
            e->users++;
            e->used = ++g->clock;
            pthread_mutex_unlock(&g->lock);
            *e_p = e;
            return TPD_OK;
        }
        if (e->users != 0) continue;
        /* A free slot first, else the least recently used idle one. */
        if (victim == NULL || (victim->prim != NULL && (e->prim == NULL || e->used < victim->used)))
            victim = e;
    }
    /* Built under the lock: a miss is rare once a run has seen its shapes. */
    tpd_status st;
    if (victim == NULL) {
        pthread_mutex_unlock(&g->lock);
        gemm_entry *e = malloc(sizeof *e);
        if (e == NULL) return tpd_fail(TPD_ERR_NOMEM, "cpu_gemm: out of memory");
        st = gemm_build(g, k, e);
        if (st != TPD_OK) {
            free(e);
            return st;
        }
        e->users = -1;
        *e_p = e;
        return TPD_OK;
    }
    if (victim->prim != NULL) dnnl_primitive_destroy(victim->prim);
    st = gemm_build(g, k, victim);
    if (st == TPD_OK) {
        victim->users = 1;
        victim->used = ++g->clock;
        *e_p = victim;
    } else {
        victim->prim = NULL;
    }
    pthread_mutex_unlock(&g->lock);
    return st;
}

static void gemm_release(tpd_cpu_gemm *g, gemm_entry *e) {
    if (e->users < 0) {
        dnnl_primitive_destroy(e->prim);
        free(e);
        return;
    }
    pthread_mutex_lock(&g->lock);
    e->users--;
    pthread_mutex_unlock(&g->lock);
}

/* The product for checked arguments with M, N, K > 0. */
static tpd_status gemm_product(tpd_cpu_gemm *g, int transa, int transb, int M, int N, int K,
                               float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                               float beta, void *C, tpd_dtype c_dt, int ldc, const uint16_t *bias) {
    gemm_key k;
    memset(&k, 0, sizeof k);
    k.transa = transa != 0;
    k.transb = transb != 0;
    k.M = M;
    k.N = N;
    k.K = K;
    k.lda = lda;
    k.ldb = ldb;
    k.ldc = ldc;
    k.c_dt = (int)c_dt;
    k.accumulate = beta != 0.0f;
    k.bias = bias == NULL ? 0 : (alpha != 1.0f ? 2 : 1);
    k.scaled = alpha != 1.0f;
    gemm_entry *e = NULL;
    tpd_status got = atomic_load(&g->staged) ? TPD_ERR_UNSUPPORTED : gemm_acquire(g, &k, &e);
    if (got == TPD_ERR_UNSUPPORTED) {
        /* chosen at run time: a CPU without AVX-512 (oneDNN 2.6's bf16 matmuls need it)
         * multiplies through fp32 staging, the same arithmetic, once warned */
        if (!atomic_exchange(&g->staged, 1))
            tpd_log_warn("cpu_gemm: oneDNN has no bf16 matmul for this CPU (M=%d N=%d K=%d); "
                         "the bf16 products run through fp32 staging and OpenBLAS sgemm",
                         M, N, K);
        return gemm_staged(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, c_dt, ldc,
                           bias);
    }
    TPD_CHECK(got);

    tpd_status st = TPD_OK;
    enum { SRC, WEI, DST, BIAS, SCALE, NMEM };
    dnnl_memory_t mem[NMEM] = {0};
    dnnl_exec_arg_t args[NMEM];
    int nargs = 0;
    float scale = alpha;
    /* oneDNN takes non-const handles; it does not write src, weights, bias or scales. */
    DNNL_CHECK(dnnl_memory_create(&mem[SRC], &e->src_md, g->engine, (void *)A), "src memory");
    DNNL_CHECK(dnnl_memory_create(&mem[WEI], &e->wei_md, g->engine, (void *)B), "wei memory");
    DNNL_CHECK(dnnl_memory_create(&mem[DST], &e->dst_md, g->engine, C), "dst memory");
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, mem[SRC]};
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, mem[WEI]};
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_DST, mem[DST]};
    if (k.bias) {
        DNNL_CHECK(dnnl_memory_create(&mem[BIAS], &e->bias_md, g->engine, (void *)bias),
                   "bias memory");
        int arg =
            k.bias == 1 ? DNNL_ARG_BIAS : (DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1);
        args[nargs++] = (dnnl_exec_arg_t){arg, mem[BIAS]};
    }
    if (k.scaled) {
        DNNL_CHECK(dnnl_memory_create(&mem[SCALE], &e->scale_md, g->engine, &scale),
                   "scale memory");
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_OUTPUT_SCALES, mem[SCALE]};
    }
    DNNL_CHECK(dnnl_primitive_execute(e->prim, g->stream, nargs, args), "execute");
    DNNL_CHECK(dnnl_stream_wait(g->stream), "stream_wait");
cleanup:
    for (int i = NMEM - 1; i >= 0; i--)
        if (mem[i] != NULL) dnnl_memory_destroy(mem[i]);
    gemm_release(g, e);
    return st;
}

#else /* !TPD_HAVE_DNNL */

/* Without oneDNN every product takes gemm_staged. */

struct tpd_cpu_gemm {
    int unused;
};

const char *tpd_cpu_gemm_library(void) {
    return "OpenBLAS sgemm (fp32 staging)";
}

tpd_status tpd_cpu_gemm_create(tpd_cpu_gemm **g_p) {
    tpd_cpu_gemm *g = calloc(1, sizeof *g);
    if (g == NULL) return tpd_fail(TPD_ERR_NOMEM, "cpu_gemm_create: out of memory");
    *g_p = g;
    return TPD_OK;
}

void tpd_cpu_gemm_destroy(tpd_cpu_gemm *g) {
    free(g);
}

static tpd_status gemm_product(tpd_cpu_gemm *g, int transa, int transb, int M, int N, int K,
                               float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                               float beta, void *C, tpd_dtype c_dt, int ldc, const uint16_t *bias) {
    (void)g;
    return gemm_staged(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, c_dt, ldc, bias);
}

#endif

tpd_status tpd_cpu_gemm_bf16(tpd_cpu_gemm *g, int transa, int transb, int M, int N, int K,
                             float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                             float beta, void *C, tpd_dtype c_dt, int ldc, const uint16_t *bias) {
    TPD_CHECK(gemm_check_args(g, transa, transb, M, N, K, A, lda, B, ldb, beta, C, c_dt, ldc));
    if (M == 0 || N == 0) return TPD_OK;
    if (K == 0) {
        gemm_empty_k(M, N, beta, C, c_dt, ldc, bias);
        return TPD_OK;
    }
    return gemm_product(g, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, c_dt, ldc,
                        bias);
}
