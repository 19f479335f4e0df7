/* Token and position embeddings, forward and backward side by side.
 *
 * Vocab-parallel: this rank holds rows [v0, v0+Vl) of the token table; tokens outside
 * that range embed to zero here and the tensor-parallel layer all-reduces the rows.
 * wte, wpe and out are in the activation dtype; dwte and dwpe in the gradient dtype
 * (cpu_internal.h's loads and stores). */
#include "kernels/cpu/cpu_internal.h"

#include <stdlib.h>
#include <string.h>

/* Columns per task in the backward loops: 16 floats = one cache line, so two threads
 * never write the same line. */
#define EMBED_COL_BLOCK 16

tpd_status tpd_kern_cpu_embed_fwd(tpd_kern_ctx *ctx, void *out_v, const int32_t *tokens,
                                  const void *wte_v, int N, int C, int v0, int Vl) {
    TPD_CPU_REQUIRE(N >= 0 && C >= 0 && Vl >= 0, "embed_fwd: bad shape N=%d C=%d Vl=%d", N, C, Vl);
    char *out = out_v;                                     /* (N,C) */
    const char *wte = wte_v;                               /* (Vl,C) */
    const size_t rowb = (size_t)C * tpd_cpu_act_size(ctx); /* a copy: same dtype both sides */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        char *o = out + (size_t)n * rowb;
        int64_t row = (int64_t)tokens[n] - v0;
        if (row >= 0 && row < Vl)
            memcpy(o, wte + (size_t)row * rowb, rowb);
        else
            memset(o, 0, rowb);
    }
    return TPD_OK;
}

/* bf16 gradients: each row's tokens are summed in fp32 (in token order) and added to the
 * row once, so a row is rounded once per call as in the cuda backend's sorted backward, not
 * once per token. A counting sort by row gives every row its tokens, in order. */
static tpd_status embed_bwd_bf16(tpd_kern_ctx *ctx, void *dwte, const void *dout,
                                 const int32_t *tokens, int N, int C, int v0, int Vl) {
    /* one block: start[r], row r's first slot in order; fill[r], its next free one */
    int *start = calloc(2 * ((size_t)Vl + 1) + (size_t)N, sizeof *start);
    if (start == NULL) {
        tpd_log_error("embed_bwd: out of memory sorting %d tokens by row", N);
        return TPD_ERR_NOMEM;
    }
    int *fill = start + Vl + 1, *order = fill + Vl + 1;
    for (int n = 0; n < N; n++) {
        int64_t row = (int64_t)tokens[n] - v0;
        if (row >= 0 && row < Vl) start[row + 1]++;
    }
    for (int r = 0; r < Vl; r++)
        start[r + 1] += start[r];
    memcpy(fill, start, ((size_t)Vl + 1) * sizeof *fill);
    for (int n = 0; n < N; n++) {
        int64_t row = (int64_t)tokens[n] - v0;
        if (row >= 0 && row < Vl) order[fill[row]++] = n;
    }
    const int ab = ctx->act_bf16, gb = ctx->grad_bf16;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 16)
    for (int r = 0; r < Vl; r++) {
        if (start[r] == start[r + 1]) continue;
        for (int c = 0; c < C; c++) {
            float s = 0.0f;
            for (int k = start[r]; k < start[r + 1]; k++)
                s += tpd_cpu_ld(dout, (size_t)order[k] * C + c, ab);
            tpd_cpu_add_to(dwte, (size_t)r * C + c, s, gb);
        }
    }
    free(start);
    return TPD_OK;
}

/* Backward of out[n] = wte[tok[n] - v0]: dwte[tok[n] - v0] += dout[n].
 * Repeated tokens hit the same row, so instead of splitting tokens across threads (a
 * race, or atomics whose order varies) each thread owns a block of columns and walks
 * the tokens in order: every element is summed in the same order on every run and for
 * every thread count. fp32 gradients are added token by token; bf16 ones as above. */
tpd_status tpd_kern_cpu_embed_bwd(tpd_kern_ctx *ctx, void *dwte_v, const void *dout_v,
                                  const int32_t *tokens, int N, int C, int v0, int Vl) {
    TPD_CPU_REQUIRE(N >= 0 && C >= 0 && Vl >= 0, "embed_bwd: bad shape N=%d C=%d Vl=%d", N, C, Vl);
    if (ctx->grad_bf16) return embed_bwd_bf16(ctx, dwte_v, dout_v, tokens, N, C, v0, Vl);
    const int ab = ctx->act_bf16;
    int nblocks = (C + EMBED_COL_BLOCK - 1) / EMBED_COL_BLOCK;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * EMBED_COL_BLOCK;
        int c1 = c0 + EMBED_COL_BLOCK < C ? c0 + EMBED_COL_BLOCK : C;
        for (int n = 0; n < N; n++) {
            int64_t row = (int64_t)tokens[n] - v0;
            if (row < 0 || row >= Vl) continue;
            size_t dw = (size_t)row * C, d = (size_t)n * C; /* dwte (Vl,C), dout (N,C) */
            for (int c = c0; c < c1; c++)
                ((float *)dwte_v)[dw + c] += tpd_cpu_ld(dout_v, d + c, ab);
        }
    }
    return TPD_OK;
}

tpd_status tpd_kern_cpu_pos_fwd(tpd_kern_ctx *ctx, void *out_v, const void *wpe_v, int B, int T,
                                int C) {
    TPD_CPU_REQUIRE(B >= 0 && T >= 0 && C >= 0, "pos_fwd: bad shape B=%d T=%d C=%d", B, T, C);
    const int ab = ctx->act_bf16; /* out (B,T,C), wpe (T,C) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static) collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t o = ((size_t)b * T + t) * C, p = (size_t)t * C;
            for (int c = 0; c < C; c++)
                tpd_cpu_add_to(out_v, o + c, tpd_cpu_ld(wpe_v, p + c, ab), ab);
        }
    }
    return TPD_OK;
}

/* Backward of out[b,t] += wpe[t]: dwpe[t] += sum_b dout[b,t], summed over b in order
 * by the one thread that owns position t. */
tpd_status tpd_kern_cpu_pos_bwd(tpd_kern_ctx *ctx, void *dwpe_v, const void *dout_v, int B, int T,
                                int C) {
    TPD_CPU_REQUIRE(B >= 0 && T >= 0 && C >= 0, "pos_bwd: bad shape B=%d T=%d C=%d", B, T, C);
    const int ab = ctx->act_bf16, gb = ctx->grad_bf16; /* dwpe (T,C), dout (B,T,C) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < T; t++) {
        size_t dp = (size_t)t * C;
        for (int b = 0; b < B; b++) {
            size_t d = ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++)
                tpd_cpu_add_to(dwpe_v, dp + c, tpd_cpu_ld(dout_v, d + c, ab), gb);
        }
    }
    return TPD_OK;
}
