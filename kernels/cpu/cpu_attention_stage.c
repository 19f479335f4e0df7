/* The attention ops under bf16 activations: each bf16 input is widened into an fp32 copy
 * (exact), the fp32 kernels of cpu_attention*.c run on the copies, and each bf16 output is
 * rounded once from the fp32 result. So the softmax, its statistics and every product are
 * fp32, as in the cuda backend's kernels, which read bf16, compute in fp32 and round at the
 * store. Under fp32 the wrappers call the kernels directly. The copies are host memory of
 * the call, like the fp32 kernels' own per-thread scratch. */
#include "kernels/cpu/cpu_internal.h"

#include <stdlib.h>

/* One fp32 buffer holding the widened copies of an op; NULL and logged when out of memory. */
static float *stage_alloc(const char *op, size_t n) {
    float *f = malloc((n > 0 ? n : 1) * sizeof *f);
    if (f == NULL)
        tpd_log_error("%s: out of memory for %zu bytes of bf16 staging", op, n * sizeof *f);
    return f;
}

static void widen(tpd_kern_ctx *ctx, float *dst, const void *src, size_t n) {
    (void)tpd_kern_cpu_cast(ctx, dst, TPD_DTYPE_F32, src, TPD_DTYPE_BF16, n);
}

static void narrow(tpd_kern_ctx *ctx, void *dst, const float *src, size_t n) {
    (void)tpd_kern_cpu_cast(ctx, dst, TPD_DTYPE_BF16, src, TPD_DTYPE_F32, n);
}

tpd_status tpd_kern_cpu_stage_attention_fwd(tpd_kern_ctx *ctx, void *out, void *saved,
                                            const void *qkv, int B, int T, int NH, int NKV,
                                            int HS) {
    if (!ctx->act_bf16 || B < 0 || T < 0 || NH < 0 || NKV < 0 || HS <= 0) /* bad: its error */
        return tpd_kern_cpu_attention_fwd(ctx, out, saved, qkv, B, T, NH, NKV, HS);
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HS, no = (size_t)B * T * NH * HS;
    float *f = stage_alloc("attention_fwd", nq + no);
    if (f == NULL) return TPD_ERR_NOMEM;
    widen(ctx, f, qkv, nq);
    tpd_status st = tpd_kern_cpu_attention_fwd(ctx, f + nq, saved, f, B, T, NH, NKV, HS);
    if (st == TPD_OK) narrow(ctx, out, f + nq, no);
    free(f);
    return st;
}

tpd_status tpd_kern_cpu_stage_attention_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                            const void *qkv, const void *out, const void *saved,
                                            int B, int T, int NH, int NKV, int HS) {
    if (!ctx->act_bf16 || B < 0 || T < 0 || NH < 0 || NKV < 0 || HS <= 0)
        return tpd_kern_cpu_attention_bwd(ctx, dqkv, dout, qkv, out, saved, B, T, NH, NKV, HS);
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HS, no = (size_t)B * T * NH * HS;
    float *f = stage_alloc("attention_bwd", 2 * nq + no); /* qkv | dqkv | dout */
    if (f == NULL) return TPD_ERR_NOMEM;
    widen(ctx, f, qkv, nq);
    widen(ctx, f + 2 * nq, dout, no);
    /* the cpu backward reads the saved probabilities, not out */
    tpd_status st =
        tpd_kern_cpu_attention_bwd(ctx, f + nq, f + 2 * nq, f, NULL, saved, B, T, NH, NKV, HS);
    if (st == TPD_OK) narrow(ctx, dqkv, f + nq, nq);
    free(f);
    return st;
}

tpd_status tpd_kern_cpu_stage_attention_block_fwd(tpd_kern_ctx *ctx, float *o, float *m, float *l,
                                                  const void *qkv, const void *kv,
                                                  const int32_t *qpos, const int32_t *kpos, int B,
                                                  int T, int Tk, int NH, int NKV, int HS) {
    if (!ctx->act_bf16 || B < 0 || T < 0 || Tk < 0 || NH < 0 || NKV < 0 || HS <= 0)
        return tpd_kern_cpu_attention_block_fwd(ctx, o, m, l, qkv, kv, qpos, kpos, B, T, Tk, NH,
                                                NKV, HS);
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HS, nk = (size_t)B * Tk * 2 * NKV * HS;
    float *f = stage_alloc("attention_block_fwd", nq + nk);
    if (f == NULL) return TPD_ERR_NOMEM;
    widen(ctx, f, qkv, nq);
    widen(ctx, f + nq, kv, nk);
    tpd_status st = tpd_kern_cpu_attention_block_fwd(ctx, o, m, l, f, f + nq, qpos, kpos, B, T, Tk,
                                                     NH, NKV, HS);
    free(f);
    return st;
}

tpd_status tpd_kern_cpu_stage_attention_block_finish(tpd_kern_ctx *ctx, void *out, float *lse,
                                                     const float *o, const float *m, const float *l,
                                                     int B, int T, int NH, int HS) {
    if (!ctx->act_bf16 || B < 0 || T < 0 || NH < 0 || HS <= 0)
        return tpd_kern_cpu_attention_block_finish(ctx, out, lse, o, m, l, B, T, NH, HS);
    size_t no = (size_t)B * T * NH * HS;
    float *f = stage_alloc("attention_block_finish", no);
    if (f == NULL) return TPD_ERR_NOMEM;
    tpd_status st = tpd_kern_cpu_attention_block_finish(ctx, f, lse, o, m, l, B, T, NH, HS);
    if (st == TPD_OK) narrow(ctx, out, f, no);
    free(f);
    return st;
}

tpd_status tpd_kern_cpu_stage_attention_block_bwd(tpd_kern_ctx *ctx, float *dq, float *dkv,
                                                  const void *dout, const void *out,
                                                  const float *lse, const void *qkv, const void *kv,
                                                  const int32_t *qpos, const int32_t *kpos, int B,
                                                  int T, int Tk, int NH, int NKV, int HS) {
    if (!ctx->act_bf16 || B < 0 || T < 0 || Tk < 0 || NH < 0 || NKV < 0 || HS <= 0)
        return tpd_kern_cpu_attention_block_bwd(ctx, dq, dkv, dout, out, lse, qkv, kv, qpos, kpos,
                                                B, T, Tk, NH, NKV, HS);
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HS, nk = (size_t)B * Tk * 2 * NKV * HS;
    size_t no = (size_t)B * T * NH * HS;
    float *f = stage_alloc("attention_block_bwd", nq + nk + 2 * no); /* qkv | kv | dout | out */
    if (f == NULL) return TPD_ERR_NOMEM;
    widen(ctx, f, qkv, nq);
    widen(ctx, f + nq, kv, nk);
    widen(ctx, f + nq + nk, dout, no);
    widen(ctx, f + nq + nk + no, out, no);
    tpd_status st =
        tpd_kern_cpu_attention_block_bwd(ctx, dq, dkv, f + nq + nk, f + nq + nk + no, lse, f,
                                         f + nq, qpos, kpos, B, T, Tk, NH, NKV, HS);
    free(f);
    return st;
}

tpd_status tpd_kern_cpu_stage_attention_decode(tpd_kern_ctx *ctx, void *out, const void *q,
                                               const void *kcache, const void *vcache, int len,
                                               int NH, int NKV, int HS) {
    if (!ctx->act_bf16 || len < 0 || NH < 0 || NKV < 0 || HS <= 0)
        return tpd_kern_cpu_attention_decode(ctx, out, q, kcache, vcache, len, NH, NKV, HS);
    size_t nq = (size_t)NH * HS, nk = (size_t)len * NKV * HS;
    float *f = stage_alloc("attention_decode", 2 * nq + 2 * nk); /* q | out | kcache | vcache */
    if (f == NULL) return TPD_ERR_NOMEM;
    widen(ctx, f, q, nq);
    widen(ctx, f + 2 * nq, kcache, nk);
    widen(ctx, f + 2 * nq + nk, vcache, nk);
    tpd_status st = tpd_kern_cpu_attention_decode(ctx, f + nq, f, f + 2 * nq, f + 2 * nq + nk, len,
                                                  NH, NKV, HS);
    if (st == TPD_OK) narrow(ctx, out, f + nq, nq);
    free(f);
    return st;
}
