/* Linear layers: y(N,OC) = x(N,C) @ W(OC,C)^T + b(OC), weights (out, in) as in PyTorch.
 * fp32 products go through cblas_sgemm (row-major); bf16 ones through oneDNN
 * (tpd_cpu_gemm_bf16): bf16 inputs, fp32 accumulation, the output rounded once, and the
 * weight gradient accumulated in the gradient dtype. */
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_internal.h"

#include <cblas.h>
#include <string.h>

#define BIAS_COL_BLOCK 16 /* columns per task in the bias-gradient loop (a cache line) */

tpd_status tpd_kern_cpu_matmul_fwd(tpd_kern_ctx *ctx, void *out_v, const void *inp_v,
                                   const void *w_v, const void *bias_v, int N, int C, int OC) {
    TPD_CPU_REQUIRE(N >= 0 && C >= 0 && OC >= 0, "matmul_fwd: bad shape N=%d C=%d OC=%d", N, C, OC);
    if (ctx->act_bf16)
        return tpd_cpu_gemm_bf16(ctx->gemm, 0, 1, N, OC, C, 1.0f, inp_v, C, w_v, C, 0.0f, out_v,
                                 TPD_DTYPE_BF16, OC, bias_v);
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

/* dbias(OC) += colsum(dout): column sums with rows in order, one thread per column block
 * (deterministic), in double; dout in the activation dtype, dbias in the gradient dtype. */
static void bias_grad(tpd_kern_ctx *ctx, void *dbias, const void *dout, int N, int OC) {
    const int ab = ctx->act_bf16, gb = ctx->grad_bf16;
    int nt = tpd_kern_cpu_threads(ctx);
    int nblocks = (OC + BIAS_COL_BLOCK - 1) / BIAS_COL_BLOCK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int o0 = blk * BIAS_COL_BLOCK;
        int o1 = o0 + BIAS_COL_BLOCK < OC ? o0 + BIAS_COL_BLOCK : OC;
        double s[BIAS_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            size_t d = (size_t)n * OC;
            for (int o = o0; o < o1; o++)
                s[o - o0] += tpd_cpu_ld(dout, d + o, ab);
        }
        for (int o = o0; o < o1; o++)
            tpd_cpu_add_to(dbias, o, (float)s[o - o0], gb);
    }
}

/* The bf16 backward: the same three products through oneDNN. */
static tpd_status matmul_bwd_bf16(tpd_kern_ctx *ctx, void *dinp, void *dw, void *dbias,
                                  const void *dout, const void *inp, const void *w, int N, int C,
                                  int OC) {
    if (dinp != NULL && N > 0 && C > 0)
        TPD_CHECK(tpd_cpu_gemm_bf16(ctx->gemm, 0, 0, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp,
                                    TPD_DTYPE_BF16, C, NULL));
    if (dw != NULL && N > 0 && C > 0 && OC > 0)
        TPD_CHECK(tpd_cpu_gemm_bf16(ctx->gemm, 1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw,
                                    ctx->grad_bf16 ? TPD_DTYPE_BF16 : TPD_DTYPE_F32, C, NULL));
    if (dbias != NULL) bias_grad(ctx, dbias, dout, N, OC);
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
    if (ctx->act_bf16)
        return matmul_bwd_bf16(ctx, dinp_v, dw_v, dbias_v, dout_v, inp_v, w_v, N, C, OC);
    float *dinp = dinp_v;       /* (N,C) or NULL */
    float *dw = dw_v;           /* (OC,C) or NULL */
    const float *dout = dout_v; /* (N,OC) */
    const float *inp = inp_v;   /* (N,C) */
    const float *w = w_v;       /* (OC,C) */

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
    if (dbias_v != NULL) bias_grad(ctx, dbias_v, dout_v, N, OC);
    return TPD_OK;
}

tpd_status tpd_kern_cpu_bias_add(tpd_kern_ctx *ctx, void *out_v, const void *bias_v, int N,
                                 int OC) {
    TPD_CPU_REQUIRE(N >= 0 && OC >= 0, "bias_add: bad shape N=%d OC=%d", N, OC);
    const int ab = ctx->act_bf16; /* out (N,OC), bias (OC) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * OC;
        for (int c = 0; c < OC; c++)
            tpd_cpu_add_to(out_v, o + c, tpd_cpu_ld(bias_v, c, ab), ab);
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
