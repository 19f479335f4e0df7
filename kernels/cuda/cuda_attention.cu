/* Causal self-attention with grouped-query attention: the op entry points, which pick the
 * fused cuDNN path or the unfused one, and the unfused path itself (cuBLASLt batched GEMMs +
 * causal softmax kernels), forward and backward side by side.
 *
 * qkv(B,T,W), W = (NH+2*NKV)*HS, is read in place: head h of Q for batch b is the (T, HS)
 * matrix at qkv + b*T*W + h*HS with row stride W; K head g is at + C + g*HS (C = NH*HS) and
 * V head g at + C + KV + g*HS (KV = NKV*HS). Query head h = g*G + j (G = NH/NKV) attends
 * with K/V head g, so for one batch index b and one member j of every group, the NKV heads
 * g*G + j are a strided batch (Q stride G*HS, K/V stride HS, P stride G*T*T): one GEMM
 * covers them without a permute. With NKV == NH that is one GEMM per b over all NH heads.
 * The unfused path saves the probabilities P(B,NH,T,T) in the activation dtype; it is the
 * reference the fused path is checked against, and the only path in f32. In bf16 the scores
 * S = scale * Q K^T come out of the GEMM in fp32 (bf16 operands, fp32 accumulation and
 * output), the softmax reads them in fp32, and only P is rounded to bf16 for the P V GEMM,
 * as Megatron's and FlashAttention's kernels do; the fp32 scores of one batch index at a
 * time live in scratch (NH*T*T*4 bytes). Its softmax-statistics form (the *_stats
 * functions) keeps P in scratch and saves what the fused path saves: the fused path's
 * fallback for grouped-query shapes. Which path a shape takes is decided once, at plan
 * time (tpd_cuda_attention_decide, kernels/attention_choice.h). */
#include "kernels/cuda/cuda_common.cuh"

#include <math.h>

/* Plan time: the path of the shape is decided here (cuDNN graphs built, fallback logged),
 * so the model allocates what that path saves. */
extern "C" size_t tpd_kern_cuda_attention_saved_bytes(tpd_kern_ctx *ctx, int B, int T, int NH,
                                                      int HS) {
    return tpd_cuda_attention_decide(ctx, B, T, NH, HS)->saved_bytes;
}

static int fused_path(tpd_kern_ctx *ctx, int B, int T, int NH, int HS) {
    return tpd_cuda_attention_decide(ctx, B, T, NH, HS)->path != TPD_ATTN_PATH_UNFUSED;
}

extern "C" tpd_status tpd_kern_cuda_attention_fwd(tpd_kern_ctx *ctx, void *out, void *saved,
                                                  const void *qkv, int B, int T, int NH, int NKV,
                                                  int HS) {
    TPD_CUDA_REQUIRE(B >= 0 && T > 0 && NH > 0 && HS > 0 && NKV > 0 && NH % NKV == 0,
                     "attention_fwd: bad shape B=%d T=%d NH=%d NKV=%d HS=%d (NKV must divide NH)",
                     B, T, NH, NKV, HS);
    if (B == 0) return TPD_OK;
    if (fused_path(ctx, B, T, NH, HS))
        return tpd_cuda_attention_cudnn_fwd(ctx, out, (float *)saved, qkv, B, T, NH, NKV, HS);
    return tpd_cuda_attention_gemm_fwd(ctx, out, saved, qkv, B, T, NH, NKV, HS);
}

extern "C" tpd_status tpd_kern_cuda_attention_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                                  const void *qkv, const void *out,
                                                  const void *saved, int B, int T, int NH, int NKV,
                                                  int HS) {
    TPD_CUDA_REQUIRE(B >= 0 && T > 0 && NH > 0 && HS > 0 && NKV > 0 && NH % NKV == 0,
                     "attention_bwd: bad shape B=%d T=%d NH=%d NKV=%d HS=%d (NKV must divide NH)",
                     B, T, NH, NKV, HS);
    if (B == 0) return TPD_OK;
    if (fused_path(ctx, B, T, NH, HS))
        return tpd_cuda_attention_cudnn_bwd(ctx, dqkv, dout, qkv, out, (const float *)saved, B, T,
                                            NH, NKV, HS);
    return tpd_cuda_attention_gemm_bwd(ctx, dqkv, dout, qkv, saved, B, T, NH, NKV, HS);
}

/* ---- unfused path ---- */

#define SM_WARPS 8 /* rows per block */

/* From the (already scaled) scores s(rows, T) into p(rows, T), which may be s itself: row r
 * is query t = r % T; p[t, j] = softmax over j <= t of s[t, :], 0 for j > t. fp32
 * arithmetic on S_ (fp32 scores) or T_ (in place). With stats != NULL, also
 * stats[r] = max + log(sum of exp(score - max)), the statistics the fused path saves. */
template <typename S_, typename T_>
__global__ void causal_softmax_kernel(const S_ *s_in, T_ *p, float *stats, size_t rows, int T) {
    size_t r = (size_t)blockIdx.x * SM_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = (int)(r % (size_t)T);
    const S_ *row = s_in + r * (size_t)T;
    T_ *prow = p + r * (size_t)T; /* each lane reads its j before writing it */
    float m = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        m = fmaxf(m, tpd_to_f(row[j]));
    m = tpd_warp_max(m);
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32)
        s += expf(tpd_to_f(row[j]) - m);
    float sum = tpd_warp_sum(s);
    float inv = 1.0f / sum;
    for (int j = lane; j < T; j += 32)
        prow[j] = tpd_from_f<T_>(j <= t ? expf(tpd_to_f(row[j]) - m) * inv : 0.0f);
    if (stats != NULL && lane == 0) stats[r] = m + logf(sum);
}

/* From the scaled scores s(rows, T) again (fp32, or p itself): P[t, j] = exp(score -
 * stats[r]) for j <= t, else 0 (the softmax rebuilt from the saved statistics). */
template <typename S_, typename T_>
__global__ void causal_exp_kernel(const S_ *s_in, T_ *p, const float *stats, size_t rows, int T) {
    size_t r = (size_t)blockIdx.x * SM_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = (int)(r % (size_t)T);
    const S_ *row = s_in + r * (size_t)T;
    T_ *prow = p + r * (size_t)T;
    float st = stats[r];
    for (int j = lane; j < T; j += 32)
        prow[j] = tpd_from_f<T_>(j <= t ? expf(tpd_to_f(row[j]) - st) : 0.0f);
}

/* Backward of P = softmax(S) per row, in place over dp:
 *   dS[t, j] = P[t, j] (dP[t, j] - sum_k P[t, k] dP[t, k]) for j <= t, else 0. */
template <typename T_>
__global__ void causal_softmax_bwd_kernel(T_ *dp, const T_ *p, size_t rows, int T) {
    size_t r = (size_t)blockIdx.x * SM_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = (int)(r % (size_t)T);
    T_ *drow = dp + r * (size_t)T;
    const T_ *prow = p + r * (size_t)T;
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32)
        s += tpd_to_f(prow[j]) * tpd_to_f(drow[j]);
    s = tpd_warp_sum(s);
    for (int j = lane; j < T; j += 32)
        drow[j] = tpd_from_f<T_>(j <= t ? tpd_to_f(prow[j]) * (tpd_to_f(drow[j]) - s) : 0.0f);
}

/* dqkv's K and V heads from the per-query-head gradients full(B,T,2,NH,HS) ([dK | dV] per
 * token): dK_g = sum over j < G of dK_{g*G+j}, dV_g likewise; fp32 sums in j order. n =
 * B*T*2*NKV*HS outputs; output i of a token is column C + i of its dqkv row (K, then V). */
template <typename E>
__global__ void kv_group_sum_kernel(E *dqkv, const E *full, size_t n, int NH, int NKV, int HS,
                                    int G) {
    const size_t KV = (size_t)NKV * HS, C = (size_t)NH * HS, W = C + 2 * KV;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t tok = i / (2 * KV), r = i % (2 * KV); /* r = kv*KV + g*HS + d */
        size_t kv = r / KV, g = (r % KV) / (size_t)HS, d = r % (size_t)HS;
        const E *src = full + tok * 2 * C + kv * C + g * (size_t)G * HS + d;
        float s = 0.0f;
        for (int j = 0; j < G; j++)
            s += tpd_to_f(src[(size_t)j * HS]);
        dqkv[tok * W + C + r] = tpd_from_f<E>(s);
    }
}

/* The geometry every unfused GEMM below derives its operands from. */
typedef struct attn_geom {
    int B, T, NH, NKV, HS, G;
    int64_t C;  /* NH*HS: a row of out and dout; the offset of K in a qkv row */
    int64_t KV; /* NKV*HS: from K to V in a qkv row */
    int64_t W;  /* (NH+2*NKV)*HS: a row of qkv and dqkv */
    int64_t TT; /* T*T: one head's P */
    size_t es;  /* bytes per element */
} attn_geom;

static attn_geom geom_of_dtype(tpd_dtype dt, int B, int T, int NH, int NKV, int HS) {
    attn_geom a;
    a.B = B;
    a.T = T;
    a.NH = NH;
    a.NKV = NKV;
    a.HS = HS;
    a.G = NH / NKV;
    a.C = (int64_t)NH * HS;
    a.KV = (int64_t)NKV * HS;
    a.W = a.C + 2 * a.KV;
    a.TT = (int64_t)T * T;
    a.es = tpd_cuda_dtype_size(dt);
    return a;
}
static attn_geom geom_of(const tpd_kern_ctx *ctx, int B, int T, int NH, int NKV, int HS) {
    return geom_of_dtype(ctx->dtype, B, T, NH, NKV, HS);
}

static size_t probs_bytes(const attn_geom *a) {
    return tpd_kern_attention_probs_bytes(a->B, a->T, a->NH, a->es); /* kernels/scratch.c */
}

/* The fp32 scores of one batch index, (NH,T,T): none in f32, where they are P's own buffer. */
static size_t scores_bytes(const attn_geom *a) {
    return tpd_kern_attention_scores_bytes(a->T, a->NH, a->es); /* kernels/scratch.c */
}

/* s(NH,T,T) = scale * Q_h(T,HS) @ K_g(T,HS)^T for batch index b and every head h = g*G + j,
 * in fp32 (bf16 operands, fp32 accumulation and output). */
static tpd_status qk_gemms(tpd_kern_ctx *ctx, const attn_geom *a, float *s, const void *qkv,
                           int b) {
    const char *row0 = (const char *)qkv + (size_t)b * a->T * a->W * a->es;
    for (int j = 0; j < a->G; j++) {
        tpd_cuda_gemm_args g = TPD_CUDA_GEMM_ARGS_INIT;
        g.M = a->T;
        g.N = a->T;
        g.K = a->HS;
        g.A = row0 + (size_t)j * a->HS * a->es;
        g.lda = a->W;
        g.stride_a = (int64_t)a->G * a->HS;
        g.B = row0 + (size_t)a->C * a->es;
        g.transb = 1;
        g.ldb = a->W;
        g.stride_b = a->HS;
        g.D = s + (size_t)j * a->TT;
        g.ldd = a->T;
        g.stride_d = (int64_t)a->G * a->TT;
        g.batch = a->NKV;
        g.alpha = 1.0f / sqrtf((float)a->HS);
        g.dt = ctx->dtype;
        g.d_fp32 = 1;
        TPD_CHECK(tpd_cuda_gemm(ctx, &g));
    }
    return TPD_OK;
}

/* The fp32 scores of batch index b: in scratch s32 (bf16), or P's own rows (f32). */
static float *scores_of(const attn_geom *a, void *p, char *s32, int b) {
    if (s32 == NULL) return (float *)((char *)p + (size_t)b * a->NH * a->TT * sizeof(float));
    return (float *)s32;
}

/* out_h(T,HS) = P_h @ V_g for every head h = g*G + j, into out rows of stride C. */
static tpd_status pv_gemms(tpd_kern_ctx *ctx, const attn_geom *a, void *out, const void *p,
                           const void *qkv) {
    for (int b = 0; b < a->B; b++)
        for (int j = 0; j < a->G; j++) {
            const char *row0 = (const char *)qkv + (size_t)b * a->T * a->W * a->es;
            tpd_cuda_gemm_args g = TPD_CUDA_GEMM_ARGS_INIT;
            g.M = a->T;
            g.N = a->HS;
            g.K = a->T;
            g.A = (const char *)p + ((size_t)b * a->NH + j) * a->TT * a->es;
            g.lda = a->T;
            g.stride_a = (int64_t)a->G * a->TT;
            g.B = row0 + (size_t)(a->C + a->KV) * a->es;
            g.ldb = a->W;
            g.stride_b = a->HS;
            g.D = (char *)out + ((size_t)b * a->T * a->C + (size_t)j * a->HS) * a->es;
            g.ldd = a->C;
            g.stride_d = (int64_t)a->G * a->HS;
            g.batch = a->NKV;
            g.dt = ctx->dtype;
            TPD_CHECK(tpd_cuda_gemm(ctx, &g));
        }
    return TPD_OK;
}

static unsigned rows_grid(const attn_geom *a) {
    size_t rows = (size_t)a->B * a->NH * a->T;
    return (unsigned)((rows + SM_WARPS - 1) / SM_WARPS);
}

/* Forward, per batch index b: S = scale * Q K^T in fp32 (scratch s32 of scores_bytes(), NULL
 * in f32: P's rows); P = causal softmax(S) into p in the activation dtype (stats when
 * asked); then out = P V. */
static tpd_status fwd_into(tpd_kern_ctx *ctx, const attn_geom *a, void *out, void *p, float *stats,
                           const void *qkv, char *s32) {
    const size_t rows = (size_t)a->NH * a->T; /* one batch index */
    const unsigned grid = (unsigned)((rows + SM_WARPS - 1) / SM_WARPS);
    for (int b = 0; b < a->B; b++) {
        float *s = scores_of(a, p, s32, b);
        TPD_CHECK(qk_gemms(ctx, a, s, qkv, b));
        float *st = stats != NULL ? stats + (size_t)b * rows : NULL;
        TPD_CUDA_DISPATCH(ctx->dtype, E, {
            causal_softmax_kernel<float, E><<<grid, SM_WARPS * 32, 0, ctx->stream>>>(
                s, (E *)((char *)p + (size_t)b * a->NH * a->TT * a->es), st, rows, a->T);
        });
        TPD_CHECK(TPD_CUDA_LAUNCHED("attention_fwd softmax"));
    }
    return pv_gemms(ctx, a, out, p, qkv);
}

tpd_status tpd_cuda_attention_gemm_fwd(tpd_kern_ctx *ctx, void *out, void *probs, const void *qkv,
                                       int B, int T, int NH, int NKV, int HS) {
    attn_geom a = geom_of(ctx, B, T, NH, NKV, HS);
    void *s32 = NULL;
    if (scores_bytes(&a) > 0) TPD_CHECK(tpd_cuda_scratch(ctx, scores_bytes(&a), &s32));
    return fwd_into(ctx, &a, out, probs, NULL, qkv, (char *)s32);
}

tpd_status tpd_cuda_attention_gemm_fwd_stats(tpd_kern_ctx *ctx, void *out, float *stats,
                                             const void *qkv, int B, int T, int NH, int NKV,
                                             int HS) {
    attn_geom a = geom_of(ctx, B, T, NH, NKV, HS);
    void *p = NULL;
    TPD_CHECK(tpd_cuda_scratch(ctx, probs_bytes(&a) + scores_bytes(&a), &p));
    char *s32 = scores_bytes(&a) > 0 ? (char *)p + probs_bytes(&a) : NULL;
    return fwd_into(ctx, &a, out, p, stats, qkv, s32);
}

/* Scratch the backward needs beside P: dS (B,NH,T,T), and with G > 1 the per-query-head
 * gradients of K and V, full(B,T,2,NH,HS). */
static size_t bwd_work_bytes(const attn_geom *a) {
    return tpd_kern_attention_bwd_work_bytes(a->B, a->T, a->NH, a->NKV, a->HS, a->es);
}

/* Backward from P, per batch index b and head h = g*G + j (scale = 1/sqrt(HS)):
 *   dP = dO_h @ V_g^T;  dS = P * (dP - rowsum(P * dP))
 *   dQ_h = scale * dS @ K_g;  dK_h = scale * dS^T @ Q_h;  dV_h = P^T @ dO_h
 *   dK_g = sum over j of dK_{g*G+j}, dV_g likewise (with G = 1: written in place)
 * `work` holds bwd_work_bytes() bytes apart from p. dqkv is fully overwritten. */
static tpd_status bwd_from_probs(tpd_kern_ctx *ctx, const attn_geom *a, void *dqkv,
                                 const void *dout, const void *qkv, const void *probs, char *work) {
    const size_t es = a->es;
    const float scale = 1.0f / sqrtf((float)a->HS);
    char *dp = work;                    /* dP, then dS in place */
    char *full = work + probs_bytes(a); /* G > 1: (B,T,2,NH,HS) */
    for (int b = 0; b < a->B; b++)
        for (int j = 0; j < a->G; j++) {
            const char *row0 = (const char *)qkv + (size_t)b * a->T * a->W * es;
            tpd_cuda_gemm_args g = TPD_CUDA_GEMM_ARGS_INIT;
            g.M = a->T;
            g.N = a->T;
            g.K = a->HS;
            g.A = (const char *)dout + ((size_t)b * a->T * a->C + (size_t)j * a->HS) * es;
            g.lda = a->C;
            g.stride_a = (int64_t)a->G * a->HS;
            g.B = row0 + (size_t)(a->C + a->KV) * es;
            g.transb = 1;
            g.ldb = a->W;
            g.stride_b = a->HS;
            g.D = dp + ((size_t)b * a->NH + j) * a->TT * es;
            g.ldd = a->T;
            g.stride_d = (int64_t)a->G * a->TT;
            g.batch = a->NKV;
            g.dt = ctx->dtype;
            TPD_CHECK(tpd_cuda_gemm(ctx, &g));
        }
    size_t rows = (size_t)a->B * a->NH * a->T;
    TPD_CUDA_DISPATCH(ctx->dtype, E, {
        causal_softmax_bwd_kernel<E><<<rows_grid(a), SM_WARPS * 32, 0, ctx->stream>>>(
            (E *)dp, (const E *)probs, rows, a->T);
    });
    TPD_CHECK(TPD_CUDA_LAUNCHED("attention_bwd softmax"));
    for (int b = 0; b < a->B; b++) {
        const char *q = (const char *)qkv + (size_t)b * a->T * a->W * es;
        char *dq = (char *)dqkv + (size_t)b * a->T * a->W * es;
        const char *ds = dp + (size_t)b * a->NH * a->TT * es;
        const char *p = (const char *)probs + (size_t)b * a->NH * a->TT * es;
        const char *dob = (const char *)dout + (size_t)b * a->T * a->C * es;
        tpd_cuda_gemm_args g = TPD_CUDA_GEMM_ARGS_INIT;
        g.dt = ctx->dtype;
        g.M = a->T;
        g.N = a->HS;
        g.K = a->T;
        g.lda = a->T;

        /* dQ_h = scale * dS_h @ K_g, for the heads g*G + j of each j */
        g.batch = a->NKV;
        g.stride_a = (int64_t)a->G * a->TT;
        g.B = q + (size_t)a->C * es;
        g.ldb = a->W;
        g.stride_b = a->HS;
        g.ldd = a->W;
        g.stride_d = (int64_t)a->G * a->HS;
        g.alpha = scale;
        for (int j = 0; j < a->G; j++) {
            g.A = ds + (size_t)j * a->TT * es;
            g.D = dq + (size_t)j * a->HS * es;
            TPD_CHECK(tpd_cuda_gemm(ctx, &g));
        }

        /* dK_h = scale * dS_h^T @ Q_h and dV_h = P_h^T @ dO_h for all NH heads: into dqkv
         * when G = 1, else into full for the group sums below */
        char *dk = a->G > 1 ? full + (size_t)b * a->T * 2 * a->C * es : dq + (size_t)a->C * es;
        char *dv = a->G > 1 ? dk + (size_t)a->C * es : dq + (size_t)(a->C + a->KV) * es;
        g.batch = a->NH;
        g.stride_a = a->TT;
        g.transa = 1;
        g.ldd = a->G > 1 ? 2 * a->C : a->W;
        g.stride_d = a->HS;
        g.A = ds;
        g.B = q;
        g.D = dk;
        TPD_CHECK(tpd_cuda_gemm(ctx, &g));
        g.A = p;
        g.B = dob;
        g.ldb = a->C;
        g.D = dv;
        g.alpha = 1.0f;
        TPD_CHECK(tpd_cuda_gemm(ctx, &g));
    }
    if (a->G == 1) return TPD_OK;
    size_t n = (size_t)a->B * a->T * 2 * a->KV;
    TPD_CUDA_DISPATCH(ctx->dtype, E, {
        kv_group_sum_kernel<E><<<tpd_grid_for(n, 256), 256, 0, ctx->stream>>>(
            (E *)dqkv, (const E *)full, n, a->NH, a->NKV, a->HS, a->G);
    });
    return TPD_CUDA_LAUNCHED("attention_bwd dK/dV group sums");
}

tpd_status tpd_cuda_attention_gemm_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                       const void *qkv, const void *probs, int B, int T, int NH,
                                       int NKV, int HS) {
    attn_geom a = geom_of(ctx, B, T, NH, NKV, HS);
    void *work = NULL;
    TPD_CHECK(tpd_cuda_scratch(ctx, bwd_work_bytes(&a), &work));
    return bwd_from_probs(ctx, &a, dqkv, dout, qkv, probs, (char *)work);
}

/* P is rebuilt in scratch from the saved statistics: S = scale * Q K^T again in fp32, then
 * P = exp(S - stats) under the causal mask. Scratch: [P | bwd_work_bytes() | fp32 scores]. */
tpd_status tpd_cuda_attention_gemm_bwd_stats(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                             const void *qkv, const float *stats, int B, int T,
                                             int NH, int NKV, int HS) {
    attn_geom a = geom_of(ctx, B, T, NH, NKV, HS);
    void *scratch = NULL;
    TPD_CHECK(
        tpd_cuda_scratch(ctx, probs_bytes(&a) + bwd_work_bytes(&a) + scores_bytes(&a), &scratch));
    char *p = (char *)scratch;
    char *s32 = scores_bytes(&a) > 0 ? p + probs_bytes(&a) + bwd_work_bytes(&a) : NULL;
    const size_t rows = (size_t)a.NH * a.T;
    const unsigned grid = (unsigned)((rows + SM_WARPS - 1) / SM_WARPS);
    for (int b = 0; b < a.B; b++) {
        float *s = scores_of(&a, p, s32, b);
        TPD_CHECK(qk_gemms(ctx, &a, s, qkv, b));
        TPD_CUDA_DISPATCH(ctx->dtype, E, {
            causal_exp_kernel<float, E><<<grid, SM_WARPS * 32, 0, ctx->stream>>>(
                s, (E *)(p + (size_t)b * a.NH * a.TT * a.es), stats + (size_t)b * rows, rows, a.T);
        });
        TPD_CHECK(TPD_CUDA_LAUNCHED("attention_bwd softmax from statistics"));
    }
    return bwd_from_probs(ctx, &a, dqkv, dout, qkv, p, p + probs_bytes(&a));
}
