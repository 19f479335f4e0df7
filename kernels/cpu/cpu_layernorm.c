/* LayerNorm over the last dimension (biased variance; GPT-2's eps is 1e-5). */
#include "kernels/cpu/cpu_internal.h"

#include <math.h>

#define LN_COL_BLOCK 16 /* columns per task in the parameter-gradient loop (a cache line) */

/* out = (inp - mean) * rstd * w + b. Row statistics are accumulated in double: this is
 * the reference backend and the extra precision costs little next to the matmuls. */
tpd_status tpd_kern_cpu_layernorm_fwd(tpd_kern_ctx *ctx, void *out_v, float *mean, float *rstd,
                                      const void *inp_v, const void *w_v, const void *b_v, int N,
                                      int C, double eps) {
    TPD_CPU_REQUIRE(N >= 0 && C > 0, "layernorm_fwd: bad shape N=%d C=%d", N, C);
    float *out = out_v;       /* (N,C) */
    const float *inp = inp_v; /* (N,C) */
    const float *w = w_v;     /* (C) */
    const float *b = b_v;     /* (C) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        double s = 0.0;
        for (int c = 0; c < C; c++)
            s += x[c];
        double mu = s / C;
        double ss = 0.0; /* two passes: no cancellation when |mean| >> std */
        for (int c = 0; c < C; c++) {
            double d = x[c] - mu;
            ss += d * d;
        }
        double rs = 1.0 / sqrt(ss / C + eps);
        float muf = (float)mu, rsf = (float)rs;
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - muf) * rsf * w[c] + b[c];
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
    float *dinp = dinp_v;       /* (N,C) */
    float *dw = dw_v;           /* (C) */
    float *db = db_v;           /* (C) */
    const float *dout = dout_v; /* (N,C) */
    const float *inp = inp_v;   /* (N,C) */
    const float *w = w_v;       /* (C) */
    int nt = tpd_kern_cpu_threads(ctx);

    int nblocks = (C + LN_COL_BLOCK - 1) / LN_COL_BLOCK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * LN_COL_BLOCK;
        int c1 = c0 + LN_COL_BLOCK < C ? c0 + LN_COL_BLOCK : C;
        double sdw[LN_COL_BLOCK] = {0}, sdb[LN_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *d = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) {
                float norm = (x[c] - mean[n]) * rstd[n];
                sdw[c - c0] += (double)d[c] * norm;
                sdb[c - c0] += d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dw[c] += (float)sdw[c - c0];
            db[c] += (float)sdb[c - c0];
        }
    }

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *d = dout + (size_t)n * C;
        float *di = dinp + (size_t)n * C;
        float mu = mean[n], rs = rstd[n];
        double s_dn = 0.0, s_dnn = 0.0;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - mu) * rs;
            float dn = d[c] * w[c];
            s_dn += dn;
            s_dnn += (double)dn * norm;
        }
        float m_dn = (float)(s_dn / C), m_dnn = (float)(s_dnn / C);
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - mu) * rs;
            float dn = d[c] * w[c];
            di[c] = (dn - m_dn - norm * m_dnn) * rs;
        }
    }
    return TPD_OK;
}
