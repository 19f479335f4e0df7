/* Causal self-attention, scale 1/sqrt(HS), grouped-query (NKV K/V heads shared by groups
 * of G = NH/NKV query heads; NKV == NH is multi-head attention), with the softmax
 * probabilities saved for the backward (B,NH,T,T) fp32.
 *
 * The forward's (batch, query head) pairs are independent and own their columns of out,
 * so its parallel loop is over (b,h). In the backward the G query heads of a group all
 * add into their K/V head's dK and dV, so the loop is over (b,g) and walks the group's
 * heads in order inside: no two threads write one element, and the sum's order is fixed
 * whatever the thread count. With G = 1 that is the multi-head loop, operation for
 * operation. Inside, query rows go in blocks of ATT_ROW_BLOCK: a block of rows [t0,t1)
 * only sees keys [0,t1), so the products skip most of the masked upper triangle, and the
 * backward's score-gradient scratch is ATT_ROW_BLOCK*T floats per thread instead of T*T. */
#include "kernels/cpu/cpu_internal.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define ATT_ROW_BLOCK 64

size_t tpd_kern_cpu_attention_saved_bytes(tpd_kern_ctx *ctx, int B, int T, int NH, int HS) {
    (void)ctx;
    (void)HS;
    return (size_t)B * NH * T * T * sizeof(float);
}

static int att_shape_ok(const char *op, int B, int T, int NH, int NKV, int HS) {
    if (!(B >= 0 && T >= 0 && NH >= 0 && NKV >= 0 && HS > 0)) {
        tpd_log_error("%s: bad shape B=%d T=%d NH=%d NKV=%d HS=%d", op, B, T, NH, NKV, HS);
        return 0;
    }
    if (NKV == 0 ? NH != 0 : NH % NKV != 0) {
        tpd_log_error("%s: the K/V heads NKV (%d) must divide the query heads NH (%d)", op, NKV,
                      NH);
        return 0;
    }
    return 1;
}

/* Threads for the outer loop, (b,h) or (b,g): all of the context's when each sgemm may
 * run inside our parallel region, else one, and the sgemms use the BLAS threads instead. */
static int att_outer_threads(tpd_kern_ctx *ctx, int items) {
    int nt = tpd_kern_cpu_blas_nested_ok() ? tpd_kern_cpu_threads(ctx) : 1;
    if (nt > items) nt = items;
    return nt > 0 ? nt : 1;
}

/* S = scale * Q K^T, masked to j <= t; P = softmax_j(S); out = P V. */
tpd_status tpd_kern_cpu_attention_fwd(tpd_kern_ctx *ctx, void *out_v, void *saved_v,
                                      const void *qkv_v, int B, int T, int NH, int NKV, int HS) {
    if (!att_shape_ok("attention_fwd", B, T, NH, NKV, HS)) return TPD_ERR_INVALID;
    float *out = out_v;       /* (B,T,NH*HS) */
    float *att = saved_v;     /* (B,NH,T,T) softmax, zeros above the diagonal */
    const float *qkv = qkv_v; /* (B,T,(NH+2*NKV)*HS) */
    const int C = NH * HS, C3 = (NH + 2 * NKV) * HS;
    const float scale = (float)(1.0 / sqrt((double)HS));
    const int items = B * NH;
    if (items == 0 || T == 0) return TPD_OK;
    const int G = NH / NKV; /* query heads per K/V head */
    int nt = att_outer_threads(ctx, items);

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < items; bh++) {
        int b = bh / NH, h = bh % NH, g = h / G;
        const float *row0 = qkv + (size_t)b * T * C3;
        const float *q = row0 + (size_t)h * HS;              /* (T,HS), ld C3 */
        const float *k = row0 + (size_t)(NH + g) * HS;       /* (T,HS), ld C3 */
        const float *v = row0 + (size_t)(NH + NKV + g) * HS; /* (T,HS), ld C3 */
        float *o = out + (size_t)b * T * C + (size_t)h * HS; /* (T,HS), ld C */
        float *p = att + (size_t)bh * T * T;                 /* (T,T) */
        for (int t0 = 0; t0 < T; t0 += ATT_ROW_BLOCK) {
            int t1 = t0 + ATT_ROW_BLOCK < T ? t0 + ATT_ROW_BLOCK : T;
            int nb = t1 - t0;
            float *pb = p + (size_t)t0 * T; /* rows [t0,t1), keys [0,t1) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, t1, HS, scale,
                        q + (size_t)t0 * C3, C3, k, C3, 0.0f, pb, T);
            for (int t = t0; t < t1; t++) {
                float *row = p + (size_t)t * T;
                float mx = -INFINITY;
                for (int j = 0; j <= t; j++)
                    mx = row[j] > mx ? row[j] : mx;
                double sum = 0.0;
                for (int j = 0; j <= t; j++) {
                    row[j] = expf(row[j] - mx);
                    sum += row[j];
                }
                float inv = (float)(1.0 / sum);
                for (int j = 0; j <= t; j++)
                    row[j] *= inv;
                /* The masked keys are stored as exact zeros: the backward's P^T dO
                 * product reads them. */
                memset(row + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, HS, t1, 1.0f, pb, T, v, C3,
                        0.0f, o + (size_t)t0 * C, C);
        }
    }
    return TPD_OK;
}

/* One query head's share of the backward (formulas below): writes dq's rows and adds into
 * dk and dv, block of query rows by block. ds is ATT_ROW_BLOCK*T floats of scratch. q, k,
 * v, dq, dk, dv are (T,HS) with row stride C3; dO is (T,HS) with row stride C; p (T,T). */
static void attention_bwd_head(float *ds, float *dq, float *dk, float *dv, const float *q,
                               const float *k, const float *v, const float *dO, const float *p,
                               int T, int HS, int C, int C3, float scale) {
    for (int t0 = 0; t0 < T; t0 += ATT_ROW_BLOCK) {
        int t1 = t0 + ATT_ROW_BLOCK < T ? t0 + ATT_ROW_BLOCK : T;
        int nb = t1 - t0;
        const float *pb = p + (size_t)t0 * T; /* (nb, t1), ld T */
        const float *dob = dO + (size_t)t0 * C;
        /* dV[0:t1] += P[t0:t1, 0:t1]^T dO[t0:t1] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, HS, nb, 1.0f, pb, T, dob, C, 1.0f,
                    dv, C3);
        /* dP(nb, t1) = dO[t0:t1] V[0:t1]^T, into ds with ld t1 */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, t1, HS, 1.0f, dob, C, v, C3, 0.0f,
                    ds, t1);
        for (int r = 0; r < nb; r++) {
            int t = t0 + r;
            const float *prow = p + (size_t)t * T;
            float *drow = ds + (size_t)r * t1;
            double dot = 0.0;
            for (int j = 0; j <= t; j++)
                dot += (double)prow[j] * drow[j];
            float dotf = (float)dot;
            for (int j = 0; j <= t; j++)
                drow[j] = prow[j] * (drow[j] - dotf);
            for (int j = t + 1; j < t1; j++)
                drow[j] = 0.0f; /* masked keys */
        }
        /* dQ[t0:t1] = scale * dS(nb,t1) K[0:t1] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, HS, t1, scale, ds, t1, k, C3,
                    0.0f, dq + (size_t)t0 * C3, C3);
        /* dK[0:t1] += scale * dS^T(t1,nb) Q[t0:t1] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, HS, nb, scale, ds, t1,
                    q + (size_t)t0 * C3, C3, 1.0f, dk, C3);
    }
}

/* Backward, quoting the forward (per query head h of K/V head g):
 *   out = P V            ->  dV_g += P^T dO;  dP = dO V_g^T
 *   P = softmax(S)       ->  dS = P * (dP - rowsum(P * dP))
 *   S = scale * Q K_g^T  ->  dQ = scale * dS K_g;  dK_g += scale * dS^T Q
 * dV and dK collect contributions from every later row block and from every query head
 * of the group, so they are zeroed and accumulated (sgemm beta = 1), heads in order; dQ
 * rows are written once. */
tpd_status tpd_kern_cpu_attention_bwd(tpd_kern_ctx *ctx, void *dqkv_v, const void *dout_v,
                                      const void *qkv_v, const void *out_v, const void *saved_v,
                                      int B, int T, int NH, int NKV, int HS) {
    (void)out_v; /* the saved probabilities are enough on cpu */
    if (!att_shape_ok("attention_bwd", B, T, NH, NKV, HS)) return TPD_ERR_INVALID;
    float *dqkv = dqkv_v;       /* (B,T,(NH+2*NKV)*HS) */
    const float *dout = dout_v; /* (B,T,NH*HS) */
    const float *qkv = qkv_v;   /* (B,T,(NH+2*NKV)*HS) */
    const float *att = saved_v; /* (B,NH,T,T) */
    const int C = NH * HS, C3 = (NH + 2 * NKV) * HS;
    const float scale = (float)(1.0 / sqrt((double)HS));
    const int items = B * NKV; /* (b, K/V head) */
    if (items == 0 || T == 0) return TPD_OK;
    const int G = NH / NKV; /* query heads per K/V head */
    int nt = att_outer_threads(ctx, items);

    /* dS scratch: ATT_ROW_BLOCK x T floats per thread. */
    size_t per_thread = (size_t)ATT_ROW_BLOCK * T;
    float *scratch = malloc((size_t)nt * per_thread * sizeof(float));
    if (scratch == NULL) {
        tpd_log_error("attention_bwd: out of memory for %zu bytes of scratch",
                      (size_t)nt * per_thread * sizeof(float));
        return TPD_ERR_NOMEM;
    }

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bg = 0; bg < items; bg++) {
        int b = bg / NKV, g = bg % NKV;
        float *ds = scratch + (size_t)omp_get_thread_num() * per_thread;
        size_t row0 = (size_t)b * T * C3;
        size_t koff = row0 + (size_t)(NH + g) * HS, voff = row0 + (size_t)(NH + NKV + g) * HS;
        const float *k = qkv + koff; /* (T,HS), ld C3 */
        const float *v = qkv + voff;
        float *dk = dqkv + koff;
        float *dv = dqkv + voff;

        for (int t = 0; t < T; t++) {
            memset(dk + (size_t)t * C3, 0, (size_t)HS * sizeof(float));
            memset(dv + (size_t)t * C3, 0, (size_t)HS * sizeof(float));
        }
        for (int h = g * G; h < (g + 1) * G; h++) {
            size_t qoff = row0 + (size_t)h * HS;
            const float *q = qkv + qoff; /* (T,HS), ld C3 */
            float *dq = dqkv + qoff;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * HS; /* (T,HS), ld C */
            const float *p = att + ((size_t)b * NH + h) * T * T;         /* (T,T) */
            attention_bwd_head(ds, dq, dk, dv, q, k, v, dO, p, T, HS, C, C3, scale);
        }
    }
    free(scratch);
    return TPD_OK;
}
