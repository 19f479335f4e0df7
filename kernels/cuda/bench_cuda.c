/* tripod_bench_cuda: kernel microbenchmark of the cuda backend (bf16).
 *
 * For GPT-2 124M, 350M and 1.5B at seq_length 1024 it prints the cuBLASLt TFLOP/s of each
 * of the model's GEMMs (qkv, attproj, fc, fcproj, lm head; forward and backward) and the
 * attention forward/backward times of the fused cuDNN path and the unfused fallback, after
 * a bf16 8192^3 GEMM as the baseline figure (about 790 TFLOP/s on an H200).
 *
 * Usage: tripod_bench_cuda [device]. Exits 0 with a message when there is no device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kernels/kernels.h"

#define WARMUP 3
#define ITERS 10

typedef struct model_shape {
    const char *name;
    int C, L, NH, B; /* hidden, layers, heads, micro-batch */
} model_shape;

static const model_shape MODELS[] = {
    {"gpt2-124M", 768, 12, 12, 8},
    {"gpt2-350M", 1024, 24, 16, 4},
    {"gpt2-1.5B", 1600, 48, 25, 2},
};
#define SEQ 1024
#define VOCAB 50304

typedef struct bench {
    tpd_kern_backend *be;
    cudaStream_t stream;
    cudaEvent_t start, stop;
} bench;

static int cuda_ok(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return 1;
    fprintf(stderr, "tripod_bench_cuda: %s: %s\n", what, cudaGetErrorString(err));
    return 0;
}

/* Times `iters` runs of what fn enqueues (after WARMUP untimed ones); ms per run, or -1. */
typedef tpd_status (*bench_fn)(bench *b, void *arg);
static double time_ms(bench *b, bench_fn fn, void *arg) {
    for (int i = 0; i < WARMUP; i++)
        if (fn(b, arg) != TPD_OK) return -1.0;
    if (!cuda_ok(cudaEventRecord(b->start, b->stream), "event record")) return -1.0;
    for (int i = 0; i < ITERS; i++)
        if (fn(b, arg) != TPD_OK) return -1.0;
    if (!cuda_ok(cudaEventRecord(b->stop, b->stream), "event record")) return -1.0;
    if (!cuda_ok(cudaEventSynchronize(b->stop), "event sync")) return -1.0;
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, b->start, b->stop);
    return (double)ms / ITERS;
}

typedef struct gemm_arg {
    void *out, *inp, *w, *bias, *dinp, *dw, *dout;
    int N, C, OC;
} gemm_arg;

static tpd_status run_fwd(bench *b, void *p) {
    gemm_arg *a = (gemm_arg *)p;
    return tpd_kern_matmul_fwd(b->be, a->out, a->inp, a->w, a->bias, a->N, a->C, a->OC);
}
static tpd_status run_bwd(bench *b, void *p) {
    gemm_arg *a = (gemm_arg *)p;
    return tpd_kern_matmul_bwd(b->be, a->dinp, a->dw, NULL, a->dout, a->inp, a->w, a->N, a->C,
                               a->OC);
}

typedef struct attn_arg {
    tpd_kern_backend *be;
    void *out, *saved, *qkv, *dqkv, *dout;
    int B, T, NH, HS;
} attn_arg;

static tpd_status run_attn_fwd(bench *b, void *p) {
    (void)b;
    attn_arg *a = (attn_arg *)p;
    return tpd_kern_attention_fwd(a->be, a->out, a->saved, a->qkv, a->B, a->T, a->NH, a->NH, a->HS);
}
static tpd_status run_attn_bwd(bench *b, void *p) {
    (void)b;
    attn_arg *a = (attn_arg *)p;
    return tpd_kern_attention_bwd(a->be, a->dqkv, a->dout, a->qkv, a->out, a->saved, a->B, a->T,
                                  a->NH, a->NH, a->HS);
}

/* Device buffer of `bytes` filled with bf16 0x3c3c (~0.0115): small normal values, so no
 * denormal or overflow path skews the timing. */
static void *dev_fill(size_t bytes) {
    void *p = NULL;
    if (!cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc")) return NULL;
    cudaMemset(p, 0x3c, bytes);
    return p;
}

static void gemm_line(bench *b, const char *model, const char *name, int N, int C, int OC,
                      void *big[6]) {
    gemm_arg a = {big[0], big[1], big[2], big[3], big[4], big[5], big[0], N, C, OC};
    double f = 2.0 * N * (double)C * OC;
    double ms_f = time_ms(b, run_fwd, &a);
    double ms_b = time_ms(b, run_bwd, &a);
    printf("%-10s %-8s N=%-6d C=%-5d OC=%-6d  fwd %8.3f ms %7.1f TFLOP/s   bwd %8.3f ms %7.1f "
           "TFLOP/s\n",
           model, name, N, C, OC, ms_f, ms_f > 0 ? f / (ms_f * 1e9) : 0.0, ms_b,
           ms_b > 0 ? 2.0 * f / (ms_b * 1e9) : 0.0);
}

/* Usage: tripod_bench_cuda [DEVICE] | --probe. Without a usable device it says why (the
 * loader's or the CUDA runtime's message), so that a check built on it cannot mistake
 * "nothing measured" for a pass: exit 2 when the CUDA runtime itself sees no device, exit 3
 * when it sees one but the cuda module (libtripod_cuda.so and what it links: cuBLASLt,
 * cuDNN and its sub-libraries) did not load. --probe stops after naming the device. */
int main(int argc, char **argv) {
    int probe = argc > 1 && strcmp(argv[1], "--probe") == 0;
    int device = argc > 1 && !probe ? atoi(argv[1]) : 0;
    if (!tpd_kern_cuda_available()) {
        int n = 0;
        cudaError_t err = cudaGetDeviceCount(&n);
        if (err == cudaSuccess && n > 0) {
            printf("tripod_bench_cuda: the CUDA runtime sees %d device(s) but the cuda module "
                   "is unusable: %s\n",
                   n, tpd_kern_cuda_unavailable_reason());
            return 3;
        }
        /* the loader's message (the module did not open) and the runtime's, when they differ */
        const char *why = tpd_kern_cuda_unavailable_reason();
        const char *rt = err != cudaSuccess ? cudaGetErrorString(err) : "";
        int both = rt[0] != 0 && strcmp(why, rt) != 0;
        printf("tripod_bench_cuda: no usable CUDA device: %s%s%s\n", why,
               both ? "; the CUDA runtime: " : "", both ? rt : "");
        return 2;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
        printf("device %d: %s, %d SMs, %.1f GiB, sm_%d%d, %d device(s) visible\n", device,
               prop.name, prop.multiProcessorCount,
               prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), prop.major, prop.minor,
               tpd_kern_cuda_device_count());
    if (probe) return 0;

    tpd_kern_config cfg = TPD_KERN_CONFIG_INIT;
    cfg.device = device;
    cfg.dtype = TPD_DTYPE_BF16;
    cfg.fused_attention = 1;
    /* the weight gradients as training writes them: fp32 main gradients (Megatron's default,
     * training.accumulate_allreduce_grads_in_fp32), not bf16 outputs */
    cfg.fp32_grads = 1;
    bench b;
    memset(&b, 0, sizeof b);
    if (tpd_kern_cuda_create(&cfg, &b.be) != TPD_OK) return 1;
    tpd_kern_backend *unfused = NULL;
    cfg.fused_attention = 0;
    if (tpd_kern_cuda_create(&cfg, &unfused) != TPD_OK) return 1;
    b.stream = (cudaStream_t)tpd_kern_stream(b.be);
    cudaEventCreate(&b.start);
    cudaEventCreate(&b.stop);

    /* Buffers sized for the largest GEMM: 8192^3 baseline and the 124M lm head. */
    size_t max_n = 8192;
    size_t elems = max_n * VOCAB; /* N x V logits */
    void *big[6];
    big[0] = dev_fill(elems * 2);                /* out / dout */
    big[1] = dev_fill(max_n * 8192 * 2);         /* inp */
    big[2] = dev_fill((size_t)VOCAB * 8192 * 2); /* w */
    big[3] = dev_fill((size_t)VOCAB * 2);        /* bias */
    big[4] = dev_fill(max_n * 8192 * 2);         /* dinp */
    big[5] = dev_fill((size_t)VOCAB * 8192 * 4); /* dw: fp32 main gradients */
    for (int i = 0; i < 6; i++)
        if (big[i] == NULL) return 1;

    printf("\n== baseline ==\n");
    gemm_line(&b, "bf16", "8192^3", 8192, 8192, 8192, big);

    printf("\n== GEMMs (seq %d; bwd = dinp + dweight into fp32 main gradients, as training "
           "runs them) ==\n",
           SEQ);
    for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++) {
        const model_shape *s = &MODELS[m];
        int N = s->B * SEQ, C = s->C;
        gemm_line(&b, s->name, "qkv", N, C, 3 * C, big);
        gemm_line(&b, s->name, "attproj", N, C, C, big);
        gemm_line(&b, s->name, "fc", N, C, 4 * C, big);
        gemm_line(&b, s->name, "fcproj", N, 4 * C, C, big);
        gemm_line(&b, s->name, "lm_head", N, C, VOCAB, big);
    }

    printf("\n== attention (causal; fwd FLOPs counted as 2*B*NH*T^2*HS, bwd 2.5x) ==\n");
    for (size_t m = 0; m < sizeof MODELS / sizeof MODELS[0]; m++) {
        const model_shape *s = &MODELS[m];
        int HS = s->C / s->NH;
        size_t qkv_b = (size_t)s->B * SEQ * 3 * s->C * 2, out_b = (size_t)s->B * SEQ * s->C * 2;
        tpd_kern_backend *bes[2] = {b.be, unfused};
        const char *names[2] = {"fused", "unfused"};
        for (int k = 0; k < 2; k++) {
            size_t saved_b = tpd_kern_attention_saved_bytes(bes[k], s->B, SEQ, s->NH, HS);
            attn_arg a = {bes[k],
                          dev_fill(out_b),
                          dev_fill(saved_b),
                          dev_fill(qkv_b),
                          dev_fill(qkv_b),
                          dev_fill(out_b),
                          s->B,
                          SEQ,
                          s->NH,
                          HS};
            if (!a.out || !a.saved || !a.qkv || !a.dqkv || !a.dout) return 1;
            /* The unfused path runs on its own stream; time it there. */
            bench bb = b;
            bb.stream = (cudaStream_t)tpd_kern_stream(bes[k]);
            double f = 2.0 * s->B * s->NH * (double)SEQ * SEQ * HS; /* causal half of 4*... */
            double ms_f = time_ms(&bb, run_attn_fwd, &a);
            double ms_b = time_ms(&bb, run_attn_bwd, &a);
            printf("%-10s %-8s B=%d NH=%d HS=%d  fwd %8.3f ms %7.1f TFLOP/s   bwd %8.3f ms %7.1f "
                   "TFLOP/s\n",
                   s->name, names[k], s->B, s->NH, HS, ms_f, ms_f > 0 ? f / (ms_f * 1e9) : 0.0,
                   ms_b, ms_b > 0 ? 2.5 * f / (ms_b * 1e9) : 0.0);
            cudaFree(a.out);
            cudaFree(a.saved);
            cudaFree(a.qkv);
            cudaFree(a.dqkv);
            cudaFree(a.dout);
        }
    }

    for (int i = 0; i < 6; i++)
        cudaFree(big[i]);
    cudaEventDestroy(b.start);
    cudaEventDestroy(b.stop);
    tpd_kern_backend_destroy(unfused);
    tpd_kern_backend_destroy(b.be);
    return 0;
}
