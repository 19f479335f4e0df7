/* Causal attention one block of keys at a time, by global positions (kernels.h: context
 * parallelism's ring attention). fp32.
 *
 * Each (batch, query head) pair owns its rows of the running state and of dq, so the
 * forward and dq loop over (b,h). The G query heads of a K/V group all add into the
 * block's dK and dV, so the backward loops over (b,g) and walks the group's heads in
 * order inside, as cpu_attention.c does: no two threads write one element and the sums'
 * order is fixed whatever the thread count. Scores go through cblas_sgemm in row blocks of
 * BLOCK_ROWS queries; the mask is applied by position after the product. */
#include "kernels/cpu/cpu_internal.h"

#include "base/fault.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK_ROWS 64

static int block_shape_ok(const char *op, int B, int T, int Tk, int NH, int NKV, int HS) {
    if (!(B >= 0 && T >= 0 && Tk >= 0 && NH >= 0 && NKV > 0 && HS > 0 && NH % NKV == 0)) {
        tpd_log_error("%s: bad shape B=%d T=%d Tk=%d NH=%d NKV=%d HS=%d", op, B, T, Tk, NH, NKV,
                      HS);
        return 0;
    }
    return 1;
}

/* Scores of query rows [t0, t0+nb) of one head against the block: s (nb, Tk) = scale q k^T,
 * -inf where the key lies after the query. Returns whether any score is visible. */
static int block_scores(float *s, const float *q, int ldq, const float *k, int ldk, int nb, int Tk,
                        int HS, float scale, const int32_t *qpos, const int32_t *kpos) {
    /* a row block wholly before the block's first key (above the diagonal) costs no
     * product: ring attention's skipped blocks */
    int32_t qmax = INT32_MIN, kmin = INT32_MAX;
    for (int i = 0; i < nb; i++)
        if (qpos[i] > qmax) qmax = qpos[i];
    for (int j = 0; j < Tk; j++)
        if (kpos[j] < kmin) kmin = kpos[j];
    if (kmin > qmax) return 0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, Tk, HS, scale, q, ldq, k, ldk, 0.0f, s,
                Tk);
    int any = 0;
    for (int i = 0; i < nb; i++)
        for (int j = 0; j < Tk; j++) {
            if (kpos[j] > qpos[i])
                s[(size_t)i * Tk + j] = -INFINITY;
            else
                any = 1;
        }
    return any;
}

tpd_status tpd_kern_cpu_attention_block_fwd(tpd_kern_ctx *ctx, float *o, float *m, float *l,
                                            const void *qkv_v, const void *kv_v,
                                            const int32_t *qpos, const int32_t *kpos, int B, int T,
                                            int Tk, int NH, int NKV, int HS) {
    if (!block_shape_ok("attention_block_fwd", B, T, Tk, NH, NKV, HS)) return TPD_ERR_INVALID;
    const float *qkv = qkv_v, *kv = kv_v;
    const int C3 = (NH + 2 * NKV) * HS, CKV = 2 * NKV * HS, G = NH / NKV;
    const float scale = (float)(1.0 / sqrt((double)HS));
    const int items = B * NH;
    if (items == 0 || T == 0 || Tk == 0) return TPD_OK;
    int nt = tpd_kern_cpu_blas_nested_ok() ? tpd_kern_cpu_threads(ctx) : 1;
    if (nt > items) nt = items;
    int wrong_max = tpd_fault("cp-lse-wrong-max", 0, NULL); /* planted for tests */
    float *scratch = malloc((size_t)nt * BLOCK_ROWS * Tk * sizeof *scratch);
    if (!scratch)
        return tpd_fail_nomem("the block attention scores", (size_t)nt * BLOCK_ROWS * Tk * 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < items; bh++) {
        int b = bh / NH, h = bh % NH, g = h / G;
        float *s = scratch + (size_t)omp_get_thread_num() * BLOCK_ROWS * Tk;
        const float *q = qkv + (size_t)b * T * C3 + (size_t)h * HS;
        const float *k = kv + (size_t)b * Tk * CKV + (size_t)g * HS;
        const float *v = kv + (size_t)b * Tk * CKV + (size_t)(NKV + g) * HS;
        float *ob = o + (size_t)bh * T * HS, *mb = m + (size_t)bh * T, *lb = l + (size_t)bh * T;
        for (int t0 = 0; t0 < T; t0 += BLOCK_ROWS) {
            int nb = T - t0 < BLOCK_ROWS ? T - t0 : BLOCK_ROWS;
            if (!block_scores(s, q + (size_t)t0 * C3, C3, k, CKV, nb, Tk, HS, scale, qpos + t0,
                              kpos))
                continue;
            for (int i = 0; i < nb; i++) {
                float *row = s + (size_t)i * Tk, mx = -INFINITY;
                for (int j = 0; j < Tk; j++)
                    if (row[j] > mx) mx = row[j];
                int t = t0 + i;
                if (mx == -INFINITY) { /* no visible key for this query */
                    memset(row, 0, (size_t)Tk * sizeof *row);
                    continue;
                }
                /* l = 0: no key seen yet, and m means nothing */
                int empty = lb[t] == 0.0f;
                float mnew = !empty && mb[t] > mx ? mb[t] : mx;
                float alpha = empty ? 0.0f : expf(mb[t] - mnew), sum = 0.0f;
                /* the fault weighs the block against its own maximum, not the merged one */
                float ref = wrong_max ? mx : mnew;
                for (int j = 0; j < Tk; j++) {
                    row[j] = row[j] == -INFINITY ? 0.0f : expf(row[j] - ref);
                    sum += row[j];
                }
                lb[t] = lb[t] * alpha + sum;
                mb[t] = mnew;
                float *orow = ob + (size_t)t * HS;
                for (int d = 0; d < HS; d++)
                    orow[d] *= alpha;
            }
            /* o[t0:t0+nb] += P V */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, HS, Tk, 1.0f, s, Tk, v, CKV,
                        1.0f, ob + (size_t)t0 * HS, HS);
        }
    }
    free(scratch);
    return TPD_OK;
}

tpd_status tpd_kern_cpu_attention_block_finish(tpd_kern_ctx *ctx, void *out_v, float *lse,
                                               const float *o, const float *m, const float *l,
                                               int B, int T, int NH, int HS) {
    float *out = out_v; /* (B,T,NH*HS) */
    const int C = NH * HS, items = B * NH;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < items; bh++) {
        int b = bh / NH, h = bh % NH;
        for (int t = 0; t < T; t++) {
            size_t at = (size_t)bh * T + t;
            float inv = l[at] > 0.0f ? 1.0f / l[at] : 0.0f;
            const float *orow = o + at * HS;
            float *dst = out + ((size_t)b * T + t) * C + (size_t)h * HS;
            for (int d = 0; d < HS; d++)
                dst[d] = orow[d] * inv;
            lse[at] = l[at] > 0.0f ? m[at] + logf(l[at]) : -INFINITY;
        }
    }
    return TPD_OK;
}

tpd_status tpd_kern_cpu_attention_block_bwd(tpd_kern_ctx *ctx, float *dq, float *dkv,
                                            const void *dout_v, const void *out_v, const float *lse,
                                            const void *qkv_v, const void *kv_v,
                                            const int32_t *qpos, const int32_t *kpos, int B, int T,
                                            int Tk, int NH, int NKV, int HS) {
    if (!block_shape_ok("attention_block_bwd", B, T, Tk, NH, NKV, HS)) return TPD_ERR_INVALID;
    const float *dout = dout_v, *out = out_v, *qkv = qkv_v, *kv = kv_v;
    const int C = NH * HS, C3 = (NH + 2 * NKV) * HS, CKV = 2 * NKV * HS, G = NH / NKV;
    const float scale = (float)(1.0 / sqrt((double)HS));
    const int items = B * NKV;
    if (items == 0 || T == 0 || Tk == 0) return TPD_OK;
    int nt = tpd_kern_cpu_blas_nested_ok() ? tpd_kern_cpu_threads(ctx) : 1;
    if (nt > items) nt = items;
    /* per thread: P and dP for a row block, and the rows' D = rowsum(dO * out) */
    size_t per = (size_t)2 * BLOCK_ROWS * Tk + BLOCK_ROWS;
    float *scratch = malloc((size_t)nt * per * sizeof *scratch);
    if (!scratch) return tpd_fail_nomem("the block attention backward", (size_t)nt * per * 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bg = 0; bg < items; bg++) {
        int b = bg / NKV, g = bg % NKV;
        float *p = scratch + (size_t)omp_get_thread_num() * per;
        float *dp = p + (size_t)BLOCK_ROWS * Tk, *D = dp + (size_t)BLOCK_ROWS * Tk;
        const float *k = kv + (size_t)b * Tk * CKV + (size_t)g * HS;
        const float *v = kv + (size_t)b * Tk * CKV + (size_t)(NKV + g) * HS;
        float *dk = dkv + (size_t)b * Tk * CKV + (size_t)g * HS;
        float *dv = dkv + (size_t)b * Tk * CKV + (size_t)(NKV + g) * HS;
        for (int h = g * G; h < (g + 1) * G; h++) {
            size_t bh = (size_t)b * NH + h;
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * HS;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * HS;
            const float *O = out + (size_t)b * T * C + (size_t)h * HS;
            float *dqh = dq + bh * T * HS;
            for (int t0 = 0; t0 < T; t0 += BLOCK_ROWS) {
                int nb = T - t0 < BLOCK_ROWS ? T - t0 : BLOCK_ROWS;
                if (!block_scores(p, q + (size_t)t0 * C3, C3, k, CKV, nb, Tk, HS, scale, qpos + t0,
                                  kpos))
                    continue;
                for (int i = 0; i < nb; i++) {
                    int t = t0 + i;
                    float L = lse[bh * T + t], *row = p + (size_t)i * Tk, sum = 0.0f;
                    for (int j = 0; j < Tk; j++)
                        row[j] = row[j] == -INFINITY || L == -INFINITY ? 0.0f : expf(row[j] - L);
                    const float *a = dO + (size_t)t * C, *c = O + (size_t)t * C;
                    for (int d = 0; d < HS; d++)
                        sum += a[d] * c[d];
                    D[i] = sum;
                }
                /* dV += P^T dO */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, HS, nb, 1.0f, p, Tk,
                            dO + (size_t)t0 * C, C, 1.0f, dv, CKV);
                /* dP = dO V^T; dS = P (dP - D) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, Tk, HS, 1.0f,
                            dO + (size_t)t0 * C, C, v, CKV, 0.0f, dp, Tk);
                for (int i = 0; i < nb; i++)
                    for (int j = 0; j < Tk; j++) {
                        size_t at = (size_t)i * Tk + j;
                        dp[at] = p[at] * (dp[at] - D[i]);
                    }
                /* dQ += scale dS K; dK += scale dS^T Q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, HS, Tk, scale, dp, Tk, k,
                            CKV, 1.0f, dqh + (size_t)t0 * HS, HS);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, HS, nb, scale, dp, Tk,
                            q + (size_t)t0 * C3, C3, 1.0f, dk, CKV);
            }
        }
    }
    free(scratch);
    return TPD_OK;
}
