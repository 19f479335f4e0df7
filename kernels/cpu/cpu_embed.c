/* Token and position embeddings, forward and backward side by side.
 *
 * Vocab-parallel: this rank holds rows [v0, v0+Vl) of the token table; tokens outside
 * that range embed to zero here and the tensor-parallel layer all-reduces the rows. */
#include "kernels/cpu/cpu_internal.h"

#include <string.h>

/* Columns per task in the backward loops: 16 floats = one cache line, so two threads
 * never write the same line. */
#define EMBED_COL_BLOCK 16

tpd_status tpd_kern_cpu_embed_fwd(tpd_kern_ctx *ctx, void *out_v, const int32_t *tokens,
                                  const void *wte_v, int N, int C, int v0, int Vl) {
    TPD_CPU_REQUIRE(N >= 0 && C >= 0 && Vl >= 0, "embed_fwd: bad shape N=%d C=%d Vl=%d", N, C, Vl);
    float *out = out_v;       /* (N,C) */
    const float *wte = wte_v; /* (Vl,C) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        int64_t row = (int64_t)tokens[n] - v0;
        if (row >= 0 && row < Vl)
            memcpy(o, wte + (size_t)row * C, (size_t)C * sizeof(float));
        else
            memset(o, 0, (size_t)C * sizeof(float));
    }
    return TPD_OK;
}

/* Backward of out[n] = wte[tok[n] - v0]: dwte[tok[n] - v0] += dout[n].
 * Repeated tokens hit the same row, so instead of splitting tokens across threads (a
 * race, or atomics whose order varies) each thread owns a block of columns and walks
 * the tokens in order: every element is summed in the same order on every run and for
 * every thread count. */
tpd_status tpd_kern_cpu_embed_bwd(tpd_kern_ctx *ctx, void *dwte_v, const void *dout_v,
                                  const int32_t *tokens, int N, int C, int v0, int Vl) {
    TPD_CPU_REQUIRE(N >= 0 && C >= 0 && Vl >= 0, "embed_bwd: bad shape N=%d C=%d Vl=%d", N, C, Vl);
    float *dwte = dwte_v;       /* (Vl,C) */
    const float *dout = dout_v; /* (N,C) */
    int nblocks = (C + EMBED_COL_BLOCK - 1) / EMBED_COL_BLOCK;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * EMBED_COL_BLOCK;
        int c1 = c0 + EMBED_COL_BLOCK < C ? c0 + EMBED_COL_BLOCK : C;
        for (int n = 0; n < N; n++) {
            int64_t row = (int64_t)tokens[n] - v0;
            if (row < 0 || row >= Vl) continue;
            float *dw = dwte + (size_t)row * C;
            const float *d = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++)
                dw[c] += d[c];
        }
    }
    return TPD_OK;
}

tpd_status tpd_kern_cpu_pos_fwd(tpd_kern_ctx *ctx, void *out_v, const void *wpe_v, int B, int T,
                                int C) {
    TPD_CPU_REQUIRE(B >= 0 && T >= 0 && C >= 0, "pos_fwd: bad shape B=%d T=%d C=%d", B, T, C);
    float *out = out_v;       /* (B,T,C) */
    const float *wpe = wpe_v; /* (T,C) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static) collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *p = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++)
                o[c] += p[c];
        }
    }
    return TPD_OK;
}

/* Backward of out[b,t] += wpe[t]: dwpe[t] += sum_b dout[b,t], summed over b in order
 * by the one thread that owns position t. */
tpd_status tpd_kern_cpu_pos_bwd(tpd_kern_ctx *ctx, void *dwpe_v, const void *dout_v, int B, int T,
                                int C) {
    TPD_CPU_REQUIRE(B >= 0 && T >= 0 && C >= 0, "pos_bwd: bad shape B=%d T=%d C=%d", B, T, C);
    float *dwpe = dwpe_v;       /* (T,C) */
    const float *dout = dout_v; /* (B,T,C) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < T; t++) {
        float *dp = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++)
                dp[c] += d[c];
        }
    }
    return TPD_OK;
}
