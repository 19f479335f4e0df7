/* Token rows to and from their experts (kernels.h, mixture of experts). The rows are in the
 * activation dtype, the sums and products fp32.
 *
 * gather, scale and dot run a row per iteration. scatter_add adds several input rows into
 * one output row, so it splits the columns over threads instead and walks the input rows in
 * order within each: the sums' order is fixed whatever the thread count. */
#include "kernels/cpu/cpu_internal.h"

#include <string.h>

static int rows_ok(const char *op, int N, int C) {
    if (N < 0 || C < 0) {
        tpd_log_error("%s: bad shape N=%d C=%d", op, N, C);
        return 0;
    }
    return 1;
}

tpd_status tpd_kern_cpu_gather_rows(tpd_kern_ctx *ctx, void *out_v, const void *inp_v,
                                    const int32_t *idx, int N, int C) {
    if (!rows_ok("gather_rows", N, C)) return TPD_ERR_INVALID;
    char *out = out_v;
    const char *inp = inp_v;
    const size_t rowb = (size_t)C * tpd_cpu_act_size(ctx);
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < N; i++)
        memcpy(out + (size_t)i * rowb, inp + (size_t)idx[i] * rowb, rowb);
    return TPD_OK;
}

tpd_status tpd_kern_cpu_scatter_add_rows(tpd_kern_ctx *ctx, void *out_v, const void *inp_v,
                                         const int32_t *idx, int N, int C, int rows_out) {
    if (!rows_ok("scatter_add_rows", N, C)) return TPD_ERR_INVALID;
    for (int i = 0; i < N; i++)
        if (idx[i] < 0 || idx[i] >= rows_out) {
            tpd_log_error("scatter_add_rows: row %d goes to %d, outside 0..%d", i, idx[i],
                          rows_out - 1);
            return TPD_ERR_INVALID;
        }
    const int ab = ctx->act_bf16;
    const int W = 64; /* columns per task */
    int nt = tpd_kern_cpu_threads(ctx), tasks = (C + W - 1) / W;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int k = 0; k < tasks; k++) {
        int c0 = k * W, c1 = c0 + W < C ? c0 + W : C;
        for (int i = 0; i < N; i++) {
            size_t o = (size_t)idx[i] * C, x = (size_t)i * C;
            for (int c = c0; c < c1; c++)
                tpd_cpu_add_to(out_v, o + c, tpd_cpu_ld(inp_v, x + c, ab), ab);
        }
    }
    return TPD_OK;
}

tpd_status tpd_kern_cpu_scale_rows(tpd_kern_ctx *ctx, void *out_v, const void *inp_v,
                                   const float *s, int N, int C) {
    if (!rows_ok("scale_rows", N, C)) return TPD_ERR_INVALID;
    const int ab = ctx->act_bf16;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            size_t k = (size_t)i * C + c;
            tpd_cpu_st(out_v, k, s[i] * tpd_cpu_ld(inp_v, k, ab), ab);
        }
    return TPD_OK;
}

tpd_status tpd_kern_cpu_row_dot(tpd_kern_ctx *ctx, float *out, const void *a_v, const void *b_v,
                                int N, int C) {
    if (!rows_ok("row_dot", N, C)) return TPD_ERR_INVALID;
    const int ab = ctx->act_bf16;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < N; i++) {
        float sum = 0.0f;
        for (int c = 0; c < C; c++) {
            size_t k = (size_t)i * C + c;
            sum += tpd_cpu_ld(a_v, k, ab) * tpd_cpu_ld(b_v, k, ab);
        }
        out[i] = sum;
    }
    return TPD_OK;
}
