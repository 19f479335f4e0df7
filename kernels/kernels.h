/* The op interface every backend implements (ggml's backend pattern): behind the opaque
 * handle tpd_kern_backend sit a struct of function pointers and a backend context
 * (kernels/kernels_internal.h). Model code calls the tpd_kern_* functions below on a
 * handle and never names a backend.
 *
 * Conventions for every op:
 * - Pointers are backend memory (host for cpu, device for cuda) from tpd_kern_alloc.
 * - Activations, parameters and gradients are in the backend's dtypes (act_dtype,
 *   param_dtype, grad_dtype below), chosen at run time. LayerNorm statistics, losses,
 *   cross-entropy statistics, AdamW moments and master weights are always fp32.
 * - N = B*T rows. Matrices are row-major. Weights are (out, in), as in llm.c and PyTorch
 *   Linear: y(N,OC) = x(N,C) @ W(OC,C)^T + b(OC).
 * - "overwrites" means the output is written; "accumulates" means += (gradient
 *   accumulation over micro-batches). Backward ops overwrite the input gradient and
 *   accumulate parameter gradients.
 * - Ops are asynchronous with respect to the host on backends that can be (cuda: they
 *   are queued on the context's compute stream); tpd_kern_synchronize waits for them. Ops
 *   whose result lands in host memory (sumsq) synchronize themselves.
 * - The kernels know nothing of ranks: tensor-parallel slicing happens in parallel/tensor
 *   by passing local shapes and vocab offsets.
 *
 * The bf16 recipe (both backends round at the same places, so that the cpu backend in bf16
 * is the cuda backend's exact-recipe reference):
 * - Parameters and activations are bf16; the fp32 master weights and AdamW's moments are
 *   what the optimizer updates, and the bf16 parameters are the master rounded once per step.
 * - Every op reads its bf16 inputs exactly (bf16 widens to fp32 without error), computes in
 *   fp32 (LayerNorm/RMSNorm statistics, softmax, cross-entropy and the router in fp32, some
 *   sums in double on cpu) and rounds each bf16 output once, to nearest even, where it is
 *   stored. A GEMM sums its bf16 products in fp32 and rounds once after the bias (and, when
 *   it accumulates, after adding the old value: dw += ... under bf16 gradients).
 * - Fused ops round once at their output: matmul_gelu_fwd's pre is the rounded GEMM output
 *   and its out the rounded GELU of the fp32 sum on cuda (cuBLASLt's epilogue), of the
 *   rounded pre on cpu (one rounding of pre apart).
 * - Parameter gradients are fp32 under fp32_grads (main gradients: the weight and bias
 *   gradients of every op accumulate in fp32), else bf16, each accumulation rounded once
 *   (the embedding backward sums a row's tokens in fp32 first, then adds once).
 * - Attention keeps its probabilities or statistics in fp32; the cpu backend computes it
 *   in fp32 from the widened bf16 q, k, v and rounds out (and dqkv) once. */
#ifndef TPD_KERNELS_H
#define TPD_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kernels/rope_freq.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpd_dtype {
    TPD_DTYPE_F32 = 0,
    TPD_DTYPE_BF16 = 1,
    TPD_DTYPE_I32 = 2,
    TPD_DTYPE_U8 = 3,  /* bytes: structs and strings through the communicators */
    TPD_DTYPE_F64 = 4, /* host scalars: norms, timings */
} tpd_dtype;

size_t tpd_dtype_size(tpd_dtype dt);
const char *tpd_dtype_name(tpd_dtype dt);

/* A backend instance: its ops, its context and the dtypes it computes in. */
typedef struct tpd_kern_backend tpd_kern_backend;

typedef struct tpd_kern_config {
    int num_threads;     /* cpu: OpenMP threads, 0 = runtime default */
    int device;          /* cuda: device ordinal */
    tpd_dtype dtype;     /* F32 or BF16 compute (the bf16 recipe below, on both backends) */
    int fused_attention; /* cuda: 1 = cuDNN flash attention, 0 = cuBLASLt + softmax */
    /* 1: fp32 gradients under a BF16 dtype (Megatron's fp32 main gradients): the ops that
     * accumulate parameter gradients (matmul_bwd's dw and dbias, the norms' dw and db, the
     * embeddings' dwte and dwpe) read and write fp32, adamw reads fp32; grad_dtype says F32.
     * 0: gradients in `dtype`. No effect under F32. */
    int fp32_grads;
} tpd_kern_config;

#define TPD_KERN_CONFIG_INIT                                                                       \
    { 0, 0, TPD_DTYPE_F32, 1, 0 }

/* Backend constructors: *backend_p gets a new handle on success. */
tpd_status tpd_kern_cpu_create(const tpd_kern_config *cfg, tpd_kern_backend **backend_p);
/* Returns TPD_ERR_UNSUPPORTED when built without CUDA or when no device is present. */
tpd_status tpd_kern_cuda_create(const tpd_kern_config *cfg, tpd_kern_backend **backend_p);
/* 1 when this build has the cuda backend and a device is visible. */
int tpd_kern_cuda_available(void);
/* Visible CUDA devices (0 without the cuda backend or a driver). */
int tpd_kern_cuda_device_count(void);
/* Why tpd_kern_cuda_available() is 0, in words: the loader's message when libtripod_cuda.so
 * could not be opened (a missing libcudnn.so.9, say), the CUDA runtime's error, or that the
 * build has no cuda backend. "" when a device is available. */
const char *tpd_kern_cuda_unavailable_reason(void);
/* Frees the backend and its context. NULL is a no-op. */
void tpd_kern_backend_destroy(tpd_kern_backend *backend);

/* ---- what a backend is ---- */
const char *tpd_kern_name(const tpd_kern_backend *kb);      /* "cpu" or "cuda" */
tpd_dtype tpd_kern_act_dtype(const tpd_kern_backend *kb);   /* activations */
tpd_dtype tpd_kern_param_dtype(const tpd_kern_backend *kb); /* the working copy of
                                                               parameters (matmuls) */
tpd_dtype tpd_kern_grad_dtype(const tpd_kern_backend *kb);  /* gradients (F32 under
                                                               fp32_grads) */
int tpd_kern_has_master(const tpd_kern_backend *kb);        /* fp32 master weights beside param */
int tpd_kern_device_memory(const tpd_kern_backend *kb);     /* pointers not host-addressable */
/* cuda: the compute stream (cudaStream_t) that ops are queued on, handed to the
 * communicators; NULL on cpu. */
void *tpd_kern_stream(const tpd_kern_backend *kb);

/* ---- scratch: planned, not discovered ----
 * Some ops need temporary backend memory (cuda: norm and bias-gradient partial sums, the
 * embedding backward's sort buffers, attention workspaces). Its size is a function of the
 * shapes the model runs, known before anything is allocated: `tripod plan` counts it and
 * the engine reserves it once at model creation (tpd_kern_scratch_reserve), so that no op
 * allocates during a step. */
/* The cuda backend's cuBLASLt workspace, allocated once at creation beside the scratch. */
#define TPD_KERN_GEMM_WORKSPACE_BYTES ((size_t)32 << 20)

typedef struct tpd_kern_shapes {
    int B, T;            /* micro-batch; the matmuls, attention and embedding see N = B*T rows */
    int Nl;              /* rows of the norms (B*T/tp under sequence parallelism) */
    int C;               /* hidden size */
    int NH, NKV, HS;     /* this rank's query heads, K/V heads, head size */
    int bias_oc;         /* widest output of a matmul with a bias (0: no biases) */
    int Vl;              /* this rank's vocab rows (0: no embedding on this rank) */
    int rmsnorm;         /* 1: RMSNorm, 0: LayerNorm */
    tpd_dtype dtype;     /* activation dtype */
    int fused_attention; /* cuda: cuDNN fused attention requested */
    int moe_rows;        /* rows of the experts' scatter_add_rows (N*topk; 0: no experts) */
} tpd_kern_shapes;

/* Scratch bytes per op for given shapes; `total` is their max (one buffer serves them all,
 * since ops run one after another on the backend's stream). */
typedef struct tpd_kern_scratch {
    size_t norm_bwd;      /* LayerNorm/RMSNorm backward: per-block partial dw (and db) rows */
    size_t bias_grad;     /* matmul backward's bias gradient: per-row-chunk partial rows */
    size_t embed_bwd;     /* embedding backward: sort keys and values, the sort's temp */
    size_t attention_fwd; /* attention forward: cuDNN workspace, or P of the stats path */
    size_t attention_bwd; /* attention backward: cuDNN workspace + dQ accumulator, or the
                             unfused path's dS (and P, and GQA's per-head dK/dV) */
    size_t moe_scatter;   /* scatter_add_rows: sort keys and values, the sort's temp */
    size_t total;
} tpd_kern_scratch;

/* The plan for backend `name` ("cpu" or "cuda"), without a backend instance or a device:
 * `tripod plan` calls it. cuda's cuDNN workspace is only known once cuDNN has built its
 * plan on a device; a documented bound stands in for it (kernels/scratch.c). */
tpd_status tpd_kern_scratch_plan(const char *name, const tpd_kern_shapes *s, tpd_kern_scratch *out);
/* Reserves the planned scratch on this backend once (it grows to the largest plan asked
 * for; several models may share a backend). *bytes_p gets the bytes now reserved. */
tpd_status tpd_kern_scratch_reserve(const tpd_kern_backend *kb, const tpd_kern_shapes *s,
                                    size_t *bytes_p);

/* ---- ops ---- */
/* ---- memory ---- */
tpd_status tpd_kern_alloc(const tpd_kern_backend *kb, size_t bytes, void **ptr_p);
void tpd_kern_free(const tpd_kern_backend *kb, void *ptr);
tpd_status tpd_kern_zero(const tpd_kern_backend *kb, void *ptr, size_t bytes);
tpd_status tpd_kern_copy_to_device(const tpd_kern_backend *kb, void *dst, const void *src,
                                   size_t bytes);
tpd_status tpd_kern_copy_to_host(const tpd_kern_backend *kb, void *dst, const void *src,
                                 size_t bytes);
tpd_status tpd_kern_copy(const tpd_kern_backend *kb, void *dst, const void *src, size_t bytes);
/* rows x width bytes between backend buffers: row i from src + i*spitch to dst + i*dpitch
 * (a column block of a row-major matrix, as cudaMemcpy2D). The ranges must not overlap. */
tpd_status tpd_kern_copy_2d(const tpd_kern_backend *kb, void *dst, size_t dpitch, const void *src,
                            size_t spitch, size_t width, size_t rows);
tpd_status tpd_kern_synchronize(const tpd_kern_backend *kb);

/* ---- host staging and ordering (uploads that do not stall the host) ---- */
/* Host memory the backend can copy from asynchronously (cuda: pinned); plain memory on cpu. */
tpd_status tpd_kern_host_alloc(const tpd_kern_backend *kb, size_t bytes, void **ptr_p);
void tpd_kern_host_free(const tpd_kern_backend *kb, void *ptr);
/* Queues a copy from host memory of tpd_kern_host_alloc and returns at once (cpu: copies
 * now). src must not change until an event recorded after this call has completed. */
tpd_status tpd_kern_copy_to_device_async(const tpd_kern_backend *kb, void *dst, const void *src,
                                         size_t bytes);
/* A point in the backend's stream. Create gives NULL on cpu (everything is complete). */
tpd_status tpd_kern_event_create(const tpd_kern_backend *kb, void **event_p);
void tpd_kern_event_destroy(const tpd_kern_backend *kb, void *event);
/* Marks the work queued so far. */
tpd_status tpd_kern_event_record(const tpd_kern_backend *kb, void *event);
/* Waits on the host until the work before the last record has finished (at once when
 * never recorded). */
tpd_status tpd_kern_event_wait(const tpd_kern_backend *kb, void *event);

/* ---- embedding (vocab-parallel pieces) ---- */
/* out(N,C) = wte[tok - v0] when v0 <= tok < v0 + Vl, else 0. wte is (Vl,C): this
 * rank's vocab rows. Overwrites out. */
tpd_status tpd_kern_embed_fwd(const tpd_kern_backend *kb, void *out, const int32_t *tokens,
                              const void *wte, int N, int C, int v0, int Vl);
/* dwte(Vl,C) += dout rows of the tokens in [v0, v0+Vl). Accumulates. Deterministic:
 * the same inputs give the same bits. */
tpd_status tpd_kern_embed_bwd(const tpd_kern_backend *kb, void *dwte, const void *dout,
                              const int32_t *tokens, int N, int C, int v0, int Vl);
/* out(B,T,C) += wpe(T,C) broadcast over B. */
tpd_status tpd_kern_pos_fwd(const tpd_kern_backend *kb, void *out, const void *wpe, int B, int T,
                            int C);
/* dwpe(T,C) += sum over B of dout(B,T,C). Accumulates. */
tpd_status tpd_kern_pos_bwd(const tpd_kern_backend *kb, void *dwpe, const void *dout, int B, int T,
                            int C);

/* ---- layernorm (biased variance) ---- */
/* out(N,C) = (inp - mean) * rstd * w + b with rstd = 1/sqrt(var + eps) (model.norm_epsilon;
 * GPT-2's is 1e-5: a double, since the cpu backend adds it in double); mean(N), rstd(N)
 * fp32. Overwrites. */
tpd_status tpd_kern_layernorm_fwd(const tpd_kern_backend *kb, void *out, float *mean, float *rstd,
                                  const void *inp, const void *w, const void *b, int N, int C,
                                  double eps);
/* dinp(N,C) overwritten; dw(C), db(C) accumulated. */
tpd_status tpd_kern_layernorm_bwd(const tpd_kern_backend *kb, void *dinp, void *dw, void *db,
                                  const void *dout, const void *inp, const void *w,
                                  const float *mean, const float *rstd, int N, int C);

/* ---- matmul ---- */
/* out(N,OC) = inp(N,C) @ w(OC,C)^T (+ bias(OC) when bias != NULL). Overwrites. */
tpd_status tpd_kern_matmul_fwd(const tpd_kern_backend *kb, void *out, const void *inp,
                               const void *w, const void *bias, int N, int C, int OC);
/* dinp(N,C) = dout(N,OC) @ w(OC,C), overwritten (skipped when dinp == NULL);
 * dw(OC,C) += dout^T @ inp; dbias(OC) += colsum(dout) (skipped when NULL).
 * dw == NULL skips the weight gradient (inp is then not read and may be NULL). A split
 * backward (ZB-H1) calls it twice: B with dw = dbias = NULL, W later with dinp = NULL. */
tpd_status tpd_kern_matmul_bwd(const tpd_kern_backend *kb, void *dinp, void *dw, void *dbias,
                               const void *dout, const void *inp, const void *w, int N, int C,
                               int OC);
/* out(N,OC) += bias(OC). Used after a row-parallel all-reduce. */
tpd_status tpd_kern_bias_add(const tpd_kern_backend *kb, void *out, const void *bias, int N,
                             int OC);

/* ---- fused matmul + bias + GELU (cuBLASLt GELU_AUX_BIAS on cuda) ----
 * pre(N,OC) = inp @ w^T + bias; out = gelu(pre). Both overwritten; pre is kept for
 * the backward. */
tpd_status tpd_kern_matmul_gelu_fwd(const tpd_kern_backend *kb, void *out, void *pre,
                                    const void *inp, const void *w, const void *bias, int N, int C,
                                    int OC);

/* ---- elementwise ---- */
/* tanh-approximate GELU: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
tpd_status tpd_kern_gelu_fwd(const tpd_kern_backend *kb, void *out, const void *inp, size_t n);
/* dinp = gelu'(inp) * dout. Overwrites. dinp may alias dout or inp (elementwise). */
tpd_status tpd_kern_gelu_bwd(const tpd_kern_backend *kb, void *dinp, const void *inp,
                             const void *dout, size_t n);
/* out = a + b (residual). out may alias a or b. */
tpd_status tpd_kern_add(const tpd_kern_backend *kb, void *out, const void *a, const void *b,
                        size_t n);
/* x *= s. */
tpd_status tpd_kern_scale(const tpd_kern_backend *kb, void *x, float s, size_t n);

/* ---- causal self-attention, scale 1/sqrt(HS), with grouped-query attention ----
 * qkv(B,T,(NH+2*NKV)*HS): per token [Q heads | K heads | V heads], head h of Q at columns
 * h*HS..h*HS+HS-1, K head g at (NH+g)*HS, V head g at (NH+NKV+g)*HS. NKV divides NH; query
 * head h attends with K/V head h / (NH/NKV) (NKV == NH: multi-head attention).
 * out(B,T,NH*HS). `saved` holds what the backward needs, of attention_saved_bytes() bytes
 * (cpu: softmax probabilities (B,NH,T,T) fp32; cuda: the path of the shape is decided at the
 * first call, kernels/attention_choice.h, and saves softmax statistics (B,NH,T) fp32 when
 * cuDNN runs it, the probabilities in the compute dtype when unfused). Overwrites out and
 * saved. */
size_t tpd_kern_attention_saved_bytes(const tpd_kern_backend *kb, int B, int T, int NH, int HS);
tpd_status tpd_kern_attention_fwd(const tpd_kern_backend *kb, void *out, void *saved,
                                  const void *qkv, int B, int T, int NH, int NKV, int HS);
/* dqkv(B,T,(NH+2*NKV)*HS) overwritten (a K/V head's gradient sums its query heads'). */
tpd_status tpd_kern_attention_bwd(const tpd_kern_backend *kb, void *dqkv, const void *dout,
                                  const void *qkv, const void *out, const void *saved, int B, int T,
                                  int NH, int NKV, int HS);
/* One new position over a key/value cache (decoding), scale 1/sqrt(HS), grouped-query:
 * q(NH*HS) holds the position's query heads; kcache and vcache (len, NKV*HS) its K and V
 * heads at positions 0..len-1, its own included (so the mask is implicit); query head h
 * reads K/V head h / (NH/NKV). out(NH*HS) = softmax(q K^T * scale) V per head, the same
 * as the position's row of attention_fwd over those len positions. len >= 1. Overwrites
 * out; needs no scratch and saves nothing (no backward). */
/* ---- context parallelism: causal attention one block of keys at a time (ring attention) ----
 * The queries are this rank's T rows of qkv (B,T,(NH+2*NKV)*HS), at global positions
 * qpos[0..T); a block is Tk rows of keys and values kv (B,Tk,2*NKV*HS), [K heads | V heads]
 * per row, at positions kpos[0..Tk). A query sees the keys at positions <= its own; scale
 * 1/sqrt(HS); head h reads K/V head h / (NH/NKV). fp32 throughout (the cpu backend).
 *
 * block_fwd folds one block into flash attention's running state (Dao et al.): per
 * (b, h, t) the largest score m, the sum l of exp(score - m) and the unnormalised output
 * o = sum exp(score - m) v. Start from m = l = o = 0 (l = 0: no key seen, m unread); a
 * block with no visible key leaves the state as it is. block_finish then writes out(B,T,NH*HS) = o
 * / l and the log-sum-exp lse = m + log l (B,NH,T), which is all the backward keeps. In any order
 * of blocks the result is the causal attention over their union, up to rounding.
 *
 * block_bwd adds one block's part of the gradients: dq (B,NH,T,HS) fp32 and dkv (the
 * block's layout) fp32 accumulate, from dout and out (B,T,NH*HS) and lse: with
 * P = exp(score - lse), dV += P^T dO, dS = P (dO V^T - rowsum(dO * out)), dQ += scale dS K,
 * dK += scale dS^T Q. Not built on the cuda backend (TPD_ERR_UNSUPPORTED). */
tpd_status tpd_kern_attention_block_fwd(const tpd_kern_backend *kb, float *o, float *m, float *l,
                                        const void *qkv, const void *kv, const int32_t *qpos,
                                        const int32_t *kpos, int B, int T, int Tk, int NH, int NKV,
                                        int HS);
tpd_status tpd_kern_attention_block_finish(const tpd_kern_backend *kb, void *out, float *lse,
                                           const float *o, const float *m, const float *l, int B,
                                           int T, int NH, int HS);
tpd_status tpd_kern_attention_block_bwd(const tpd_kern_backend *kb, float *dq, float *dkv,
                                        const void *dout, const void *out, const float *lse,
                                        const void *qkv, const void *kv, const int32_t *qpos,
                                        const int32_t *kpos, int B, int T, int Tk, int NH, int NKV,
                                        int HS);
tpd_status tpd_kern_attention_decode(const tpd_kern_backend *kb, void *out, const void *q,
                                     const void *kcache, const void *vcache, int len, int NH,
                                     int NKV, int HS);

/* ---- mixture of experts: token rows to and from their experts ----
 * Activation dtype rows of C columns. gather_rows: out[i] = inp[idx[i]] for i < N.
 * scatter_add_rows: out[idx[i]] += inp[i] for i < N (out has rows_out rows; the rows of
 * one output row are added in increasing i, each add rounded once, so the sums never
 * depend on threads; cuda sorts the rows by idx in scratch, and skips an idx outside
 * 0..rows_out-1 where cpu refuses it). scale_rows: out[i] = s[i] * inp[i] (out may alias
 * inp). row_dot: out[i] = a[i] . b[i] in fp32. idx and s are backend memory. Both backends
 * (TPD_ERR_UNSUPPORTED on one without them). */
tpd_status tpd_kern_gather_rows(const tpd_kern_backend *kb, void *out, const void *inp,
                                const int32_t *idx, int N, int C);
tpd_status tpd_kern_scatter_add_rows(const tpd_kern_backend *kb, void *out, const void *inp,
                                     const int32_t *idx, int N, int C, int rows_out);
tpd_status tpd_kern_scale_rows(const tpd_kern_backend *kb, void *out, const void *inp,
                               const float *s, int N, int C);
tpd_status tpd_kern_row_dot(const tpd_kern_backend *kb, float *out, const void *a, const void *b,
                            int N, int C);
/* Grouped matmul: G groups of consecutive rows, counts[g] rows each (host memory), group g
 * with its weights w + g*OC*IC (and bias + g*OC): the matmul_fwd/matmul_bwd of each group
 * (dw and dbias of group g at the same offsets, accumulated). Empty groups are skipped.
 * One matmul per group on every backend (cuda: cuBLASLt's, with its bias epilogue and fp32
 * main gradients; cuBLAS's grouped GEMM has no bias epilogue, which would round twice). */
tpd_status tpd_kern_grouped_matmul_fwd(const tpd_kern_backend *kb, void *out, const void *inp,
                                       const void *w, const void *bias, const int *counts, int G,
                                       int IC, int OC);
tpd_status tpd_kern_grouped_matmul_bwd(const tpd_kern_backend *kb, void *dinp, void *dw,
                                       void *dbias, const void *dout, const void *inp,
                                       const void *w, const int *counts, int G, int IC, int OC);

/* ---- Llama's block: RMSNorm, rotary position embedding, SwiGLU ---- */
/* out(N,C) = inp * rstd * w with rstd = 1/sqrt(mean over C of inp^2 + eps); rstd(N) fp32.
 * Overwrites. */
tpd_status tpd_kern_rmsnorm_fwd(const tpd_kern_backend *kb, void *out, float *rstd, const void *inp,
                                const void *w, int N, int C, double eps);
/* dinp(N,C) overwritten; dw(C) accumulated. */
tpd_status tpd_kern_rmsnorm_bwd(const tpd_kern_backend *kb, void *dinp, void *dw, const void *dout,
                                const void *inp, const void *w, const float *rstd, int N, int C);
/* Qwen3's QK norm: RMSNorm (as above, over HS) of every Q head of qkv(N,(NH+2*NKV)*HS) with
 * wq(HS) and of every K head with wk(HS), in place; V is untouched. raw(N,NH+NKV,HS) keeps
 * the heads as they came in (activation dtype, exact), rstd(N,NH+NKV) fp32. */
tpd_status tpd_kern_qk_norm_fwd(const tpd_kern_backend *kb, void *qkv, void *raw, float *rstd,
                                const void *wq, const void *wk, int N, int NH, int NKV, int HS,
                                double eps);
/* dqkv's Q and K heads in place, from d(after the norm) to d(before); dwq, dwk (HS)
 * accumulated in the gradient dtype. */
tpd_status tpd_kern_qk_norm_bwd(const tpd_kern_backend *kb, void *dqkv, void *dwq, void *dwk,
                                const void *raw, const void *wq, const void *wk, const float *rstd,
                                int N, int NH, int NKV, int HS);
/* Rotary position embedding (Su et al.) in the "rotate half" layout of Llama and Megatron:
 * on every Q and K head of qkv(B,T,(NH+2*NKV)*HS), in place, at position p = pos0 + t,
 * for i < HS/2 with theta_i = p * base^(-2i/HS):
 *   (x_i, x_{i+HS/2}) <- (x_i cos theta_i - x_{i+HS/2} sin theta_i,
 *                         x_i sin theta_i + x_{i+HS/2} cos theta_i).
 * V is untouched. HS is even. The angles are computed in double. */
tpd_status tpd_kern_rope_fwd(const tpd_kern_backend *kb, void *qkv, int B, int T, int NH, int NKV,
                             int HS, float base, int pos0);
/* The transposed rotation on dqkv in place: d(before) from d(after), V's part untouched. */
tpd_status tpd_kern_rope_bwd(const tpd_kern_backend *kb, void *dqkv, int B, int T, int NH, int NKV,
                             int HS, float base, int pos0);
/* The same with theta_i = p * tpd_rope_inv_freq(rope, i, HS) (kernels/rope_freq.h): the
 * base, and Llama 3.1's frequency scaling when rope->factor > 0. */
tpd_status tpd_kern_rope_scaled_fwd(const tpd_kern_backend *kb, void *qkv, int B, int T, int NH,
                                    int NKV, int HS, const tpd_rope *rope, int pos0);
tpd_status tpd_kern_rope_scaled_bwd(const tpd_kern_backend *kb, void *dqkv, int B, int T, int NH,
                                    int NKV, int HS, const tpd_rope *rope, int pos0);
/* inp(N,2F) holds [gate | up] per row; out(N,F) = silu(gate) * up, silu(x) = x/(1+e^-x).
 * Overwrites. */
tpd_status tpd_kern_swiglu_fwd(const tpd_kern_backend *kb, void *out, const void *inp, int N,
                               int F);
/* dinp(N,2F) = [d gate | d up] from dout(N,F). Overwrites. */
tpd_status tpd_kern_swiglu_bwd(const tpd_kern_backend *kb, void *dinp, const void *inp,
                               const void *dout, int N, int F);

/* ---- softmax cross-entropy, vocab-parallel pieces ----
 * logits(N,Vl) are this rank's vocab columns [v0, v0+Vl); only the first Vvalid of
 * them are real tokens (the rest is padding and never enters the softmax). The
 * caller all-reduces between the steps: max (MAX), then sumexp and tgt (SUM). */
/* maxv(N) = max over the Vvalid columns (-INF when Vvalid == 0). */
tpd_status tpd_kern_xent_max(const tpd_kern_backend *kb, float *maxv, const void *logits, int N,
                             int Vl, int Vvalid);
/* sumexp(N) = sum exp(logit - maxv) over valid columns; tgt(N) = logit of the target
 * when it lies in [v0, v0+Vvalid), else 0. */
tpd_status tpd_kern_xent_sumexp(const tpd_kern_backend *kb, float *sumexp, float *tgt,
                                const void *logits, const float *maxv, const int32_t *targets,
                                int N, int Vl, int Vvalid, int v0);
/* loss(N) = log(sumexp) + maxv - tgt. */
tpd_status tpd_kern_xent_loss(const tpd_kern_backend *kb, float *loss, const float *maxv,
                              const float *sumexp, const float *tgt, int N);
/* In place: logits become dlogits = (softmax - onehot(target)) * dloss for valid
 * columns, 0 for padded columns. Probabilities are never stored. */
tpd_status tpd_kern_xent_bwd(const tpd_kern_backend *kb, void *logits, const float *maxv,
                             const float *sumexp, const int32_t *targets, float dloss, int N,
                             int Vl, int Vvalid, int v0);
/* Host-side sum of loss(N) (synchronizes). */
tpd_status tpd_kern_sum_f32(const tpd_kern_backend *kb, const float *x, size_t n, double *sum_p);
/* acc[0] += (sum of x(n)) / div, with acc one double of backend memory: the sum is the
 * one tpd_kern_sum_f32 computes, and nothing waits for it (the loss is read once a step). */
tpd_status tpd_kern_sum_f32_acc(const tpd_kern_backend *kb, double *acc, const float *x, size_t n,
                                double div);

/* ---- optimizer ---- */
/* AdamW on a flat range of n elements, PyTorch semantics with bias correction:
 *   g = grad * grad_scale
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   mhat = m / (1 - b1^step);  vhat = v / (1 - b2^step)
 *   w -= lr * (mhat / (sqrt(vhat) + eps) + wd * w)
 * w is `master` (fp32) when master != NULL, and param is then written as the cast of
 * the new master; otherwise param itself (must be fp32) is updated. grad is in grad_dtype.
 * step >= 1. */
tpd_status tpd_kern_adamw(const tpd_kern_backend *kb, void *param, float *master, const void *grad,
                          float *m, float *v, size_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, int step, float grad_scale);
/* Plain SGD on a flat range of n elements (torch.optim.SGD without momentum; weight decay
 * as L2 on the gradient):  g = grad * grad_scale + weight_decay * w;  w -= lr * g.
 * w, master and param as in tpd_kern_adamw (master != NULL: the fp32 master is updated and
 * param receives its cast; else param, which must be fp32). grad is in grad_dtype. */
tpd_status tpd_kern_sgd(const tpd_kern_backend *kb, void *param, float *master, const void *grad,
                        size_t n, float lr, float weight_decay, float grad_scale);
/* dst += src, n elements of the gradient dtype (tpd_kern_grad_dtype), summed in fp32:
 * a micro-batch's reduce-scattered gradients into the shard of the sharded strategies. */
tpd_status tpd_kern_grad_acc(const tpd_kern_backend *kb, void *dst, const void *src, size_t n);
/* DiLoCo's pseudo-gradient of n fp32 elements: delta = sync - w (w: the fp32 master weights,
 * or the fp32 parameters where no master is kept). */
tpd_status tpd_kern_outer_delta(const tpd_kern_backend *kb, float *delta, const float *sync,
                                const float *w, size_t n);
/* DiLoCo's outer Nesterov step on n elements, delta the summed pseudo-gradient:
 *   d = delta * scale;  mom = momentum * mom + d;  sync -= lr * (d + momentum * mom)
 * then the weights continue from sync: master (when != NULL) = sync and param = its cast
 * to the parameter dtype; without master, param (fp32) = sync. */
tpd_status tpd_kern_outer_nesterov(const tpd_kern_backend *kb, void *param, float *master,
                                   float *sync, float *mom, const float *delta, size_t n, float lr,
                                   float momentum, float scale);
/* Host-side sum of squares of x (n elements of dtype dt), in double (synchronizes). */
tpd_status tpd_kern_sumsq(const tpd_kern_backend *kb, const void *x, tpd_dtype dt, size_t n,
                          double *sumsq_p);
/* The backend's running sum of squares, read once (a gradient norm over many slices waits
 * once, not once a slice): sumsq_acc adds x's sum of squares, the value tpd_kern_sumsq
 * gives (the same partials in the same order), to the accumulator without waiting, in
 * double; sumsq_take returns the accumulated sum (waiting for the work queued so far) and
 * zeroes it. The sum over the calls is the host's sum of the tpd_kern_sumsq values in call
 * order, bit for bit. */
tpd_status tpd_kern_sumsq_acc(const tpd_kern_backend *kb, const void *x, tpd_dtype dt, size_t n);
tpd_status tpd_kern_sumsq_take(const tpd_kern_backend *kb, double *sumsq_p);
/* dst = (dst_dt) src. n elements. */
tpd_status tpd_kern_cast(const tpd_kern_backend *kb, void *dst, tpd_dtype dst_dt, const void *src,
                         tpd_dtype src_dt, size_t n);

#ifdef __cplusplus
}
#endif
#endif
