/* LayerNorm over the last dimension (biased variance; GPT-2's eps is 1e-5). inp, out, w,
 * b, dout and dinp are in the activation dtype, dw and db in the gradient dtype; the
 * arithmetic is fp32 (and double for the sums) either way. */
#include "kernels/cpu/cpu_internal.h"

#include <math.h>

#define LN_COL_BLOCK 16 /* columns per task in the parameter-gradient loop (a cache line) */

/* out = (inp - mean) * rstd * w + b. Row statistics are accumulated in double: this is
 * the reference backend and the extra precision costs little next to the matmuls. */
tpd_status tpd_kern_cpu_layernorm_fwd(tpd_kern_ctx *ctx, void *out_v, float *mean, float *rstd,
                                      const void *inp_v, const void *w_v, const void *b_v, int N,
                                      int C, double eps) {
    TPD_CPU_REQUIRE(N >= 0 && C > 0, "layernorm_fwd: bad shape N=%d C=%d", N, C);
    /* out, inp (N,C); w, b (C) */
    const int ab = ctx->act_bf16;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t x = (size_t)n * C;
        double s = 0.0;
        for (int c = 0; c < C; c++)
            s += tpd_cpu_ld(inp_v, x + c, ab);
        double mu = s / C;
        double ss = 0.0; /* two passes: no cancellation when |mean| >> std */
        for (int c = 0; c < C; c++) {
            double d = tpd_cpu_ld(inp_v, x + c, ab) - mu;
            ss += d * d;
        }
        double rs = 1.0 / sqrt(ss / C + eps);
        float muf = (float)mu, rsf = (float)rs;
        for (int c = 0; c < C; c++)
            tpd_cpu_st(out_v, x + c,
                       (tpd_cpu_ld(inp_v, x + c, ab) - muf) * rsf * tpd_cpu_ld(w_v, c, ab) +
                           tpd_cpu_ld(b_v, c, ab),
                       ab);
        mean[n] = muf;
        rstd[n] = rsf;
    }
    return TPD_OK;
}

/* Backward of out = norm * w + b with norm = (inp - mean) * rstd:
 *   db += sum_n dout;  dw += sum_n dout * norm;
 *   dinp = rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm)),  dnorm = dout * w.
 * dw/db are reduced first, over column blocks with rows in order (deterministic, no two
 * threads on one column), and dinp is written after: so dinp may even alias dout. */
tpd_status tpd_kern_cpu_layernorm_bwd(tpd_kern_ctx *ctx, void *dinp_v, void *dw_v, void *db_v,
                                      const void *dout_v, const void *inp_v, const void *w_v,
                                      const float *mean, const float *rstd, int N, int C) {
    TPD_CPU_REQUIRE(N >= 0 && C > 0, "layernorm_bwd: bad shape N=%d C=%d", N, C);
    /* dinp, dout, inp (N,C); w (C), activation dtype; dw, db (C), gradient dtype */
    const int ab = ctx->act_bf16, gb = ctx->grad_bf16;
    int nt = tpd_kern_cpu_threads(ctx);

    int nblocks = (C + LN_COL_BLOCK - 1) / LN_COL_BLOCK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * LN_COL_BLOCK;
        int c1 = c0 + LN_COL_BLOCK < C ? c0 + LN_COL_BLOCK : C;
        double sdw[LN_COL_BLOCK] = {0}, sdb[LN_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const size_t x = (size_t)n * C;
            for (int c = c0; c < c1; c++) {
                float norm = (tpd_cpu_ld(inp_v, x + c, ab) - mean[n]) * rstd[n];
                float d = tpd_cpu_ld(dout_v, x + c, ab);
                sdw[c - c0] += (double)d * norm;
                sdb[c - c0] += d;
            }
        }
        for (int c = c0; c < c1; c++) {
            tpd_cpu_add_to(dw_v, c, (float)sdw[c - c0], gb);
            tpd_cpu_add_to(db_v, c, (float)sdb[c - c0], gb);
        }
    }

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t x = (size_t)n * C;
        float mu = mean[n], rs = rstd[n];
        double s_dn = 0.0, s_dnn = 0.0;
        for (int c = 0; c < C; c++) {
            float norm = (tpd_cpu_ld(inp_v, x + c, ab) - mu) * rs;
            float dn = tpd_cpu_ld(dout_v, x + c, ab) * tpd_cpu_ld(w_v, c, ab);
            s_dn += dn;
            s_dnn += (double)dn * norm;
        }
        float m_dn = (float)(s_dn / C), m_dnn = (float)(s_dnn / C);
        for (int c = 0; c < C; c++) {
            float norm = (tpd_cpu_ld(inp_v, x + c, ab) - mu) * rs;
            float dn = tpd_cpu_ld(dout_v, x + c, ab) * tpd_cpu_ld(w_v, c, ab);
            tpd_cpu_st(dinp_v, x + c, (dn - m_dn - norm * m_dnn) * rs, ab);
        }
    }
    return TPD_OK;
}
