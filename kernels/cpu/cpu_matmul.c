/* Linear layers: y(N,OC) = x(N,C) @ W(OC,C)^T + b(OC), weights (out, in) as in PyTorch.
 * Every product goes through cblas_sgemm (row-major). */
#include "kernels/cpu/cpu_internal.h"

#include <cblas.h>
#include <string.h>

#define BIAS_COL_BLOCK 16 /* columns per task in the bias-gradient loop (a cache line) */

tpd_status tpd_kern_cpu_matmul_fwd(tpd_kern_ctx *ctx, void *out_v, const void *inp_v,
                                   const void *w_v, const void *bias_v, int N, int C, int OC) {
    TPD_CPU_REQUIRE(N >= 0 && C >= 0 && OC >= 0, "matmul_fwd: bad shape N=%d C=%d OC=%d", N, C, OC);
    float *out = out_v;         /* (N,OC) */
    const float *inp = inp_v;   /* (N,C) */
    const float *w = w_v;       /* (OC,C) */
    const float *bias = bias_v; /* (OC) or NULL */
    if (N == 0 || OC == 0) return TPD_OK;
    int nt = tpd_kern_cpu_threads(ctx);
    /* With a bias, seed out with it and let sgemm add the product (beta = 1): one pass
     * less over out than adding the bias afterwards. */
    float beta = 0.0f;
    if (bias != NULL) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    } else if (C == 0) {
        memset(out, 0, (size_t)N * OC * sizeof(float));
    }
    if (C == 0) return TPD_OK; /* empty product; BLAS rejects a leading dimension of 0 */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta, out,
                OC);
    return TPD_OK;
}

/* Backward of out = inp @ w^T + bias:
 *   dinp(N,C) = dout(N,OC) @ w(OC,C)         (overwritten)
 *   dw(OC,C) += dout^T(OC,N) @ inp(N,C)      (accumulated: sgemm beta = 1)
 *   dbias(OC) += colsum(dout)                (accumulated) */
tpd_status tpd_kern_cpu_matmul_bwd(tpd_kern_ctx *ctx, void *dinp_v, void *dw_v, void *dbias_v,
                                   const void *dout_v, const void *inp_v, const void *w_v, int N,
                                   int C, int OC) {
    TPD_CPU_REQUIRE(N >= 0 && C >= 0 && OC >= 0, "matmul_bwd: bad shape N=%d C=%d OC=%d", N, C, OC);
    float *dinp = dinp_v;       /* (N,C) or NULL */
    float *dw = dw_v;           /* (OC,C) or NULL */
    float *dbias = dbias_v;     /* (OC) or NULL */
    const float *dout = dout_v; /* (N,OC) */
    const float *inp = inp_v;   /* (N,C) */
    const float *w = w_v;       /* (OC,C) */
    int nt = tpd_kern_cpu_threads(ctx);

    if (dinp != NULL && N > 0 && C > 0) {
        if (OC == 0)
            memset(dinp, 0, (size_t)N * C * sizeof(float));
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C,
                        0.0f, dinp, C);
    }
    if (dw != NULL && N > 0 && C > 0 && OC > 0) /* NULL: B of a split backward */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                    dw, C);
    if (dbias != NULL) {
        /* Column sums with rows in order, one thread per column block: deterministic. */
        int nblocks = (OC + BIAS_COL_BLOCK - 1) / BIAS_COL_BLOCK;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            int o0 = blk * BIAS_COL_BLOCK;
            int o1 = o0 + BIAS_COL_BLOCK < OC ? o0 + BIAS_COL_BLOCK : OC;
            double s[BIAS_COL_BLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * OC;
                for (int o = o0; o < o1; o++)
                    s[o - o0] += d[o];
            }
            for (int o = o0; o < o1; o++)
                dbias[o] += (float)s[o - o0];
        }
    }
    return TPD_OK;
}

tpd_status tpd_kern_cpu_bias_add(tpd_kern_ctx *ctx, void *out_v, const void *bias_v, int N,
                                 int OC) {
    TPD_CPU_REQUIRE(N >= 0 && OC >= 0, "bias_add: bad shape N=%d OC=%d", N, OC);
    float *out = out_v;         /* (N,OC) */
    const float *bias = bias_v; /* (OC) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * OC;
        for (int c = 0; c < OC; c++)
            o[c] += bias[c];
    }
    return TPD_OK;
}

/* pre = inp @ w^T + bias; out = gelu(pre). On cpu "fused" is two passes; pre is what
 * gelu_bwd needs later. */
tpd_status tpd_kern_cpu_matmul_gelu_fwd(tpd_kern_ctx *ctx, void *out, void *pre, const void *inp,
                                        const void *w, const void *bias, int N, int C, int OC) {
    TPD_CHECK(tpd_kern_cpu_matmul_fwd(ctx, pre, inp, w, bias, N, C, OC));
    return tpd_kern_cpu_gelu_fwd(ctx, out, pre, (size_t)N * (size_t)OC);
}
