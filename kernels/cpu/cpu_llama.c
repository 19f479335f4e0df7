/* Llama's block ops, forward and backward side by side: RMSNorm, rotary position
 * embedding (rotate-half layout), SwiGLU, and Qwen3's per-head RMSNorm of Q and K.
 *
 * Like LayerNorm here, the row statistics accumulate in double; RoPE's angles and
 * rotations and SwiGLU's sigmoid are computed in double and rounded once to fp32: this is
 * the reference backend and none of these ops is where the time goes. Every loop writes
 * disjoint elements in a fixed order, so the bits depend neither on the thread count nor
 * on scheduling. Tensors are in the activation dtype, RMSNorm's dw in the gradient dtype
 * (cpu_internal.h's loads and stores); the arithmetic is as above either way. */
#include "kernels/cpu/cpu_internal.h"

#include <limits.h>
#include <math.h>

#define RMS_COL_BLOCK 16   /* columns per task in the weight-gradient loop (a cache line) */
#define ROPE_PAIR_BLOCK 64 /* rotation pairs whose cos/sin are computed at once */

/* ---- RMSNorm ---- */

/* out = inp * rstd * w, rstd = 1/sqrt(mean_c(inp^2) + eps). */
tpd_status tpd_kern_cpu_rmsnorm_fwd(tpd_kern_ctx *ctx, void *out_v, float *rstd, const void *inp_v,
                                    const void *w_v, int N, int C, double eps) {
    TPD_CPU_REQUIRE(N >= 0 && C > 0, "rmsnorm_fwd: bad shape N=%d C=%d", N, C);
    TPD_CPU_REQUIRE(eps >= 0.0, "rmsnorm_fwd: eps (%g) must be >= 0", eps);
    const int ab = ctx->act_bf16; /* out, inp (N,C); w (C) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t x = (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) {
            float xc = tpd_cpu_ld(inp_v, x + c, ab);
            ss += (double)xc * xc;
        }
        float rsf = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++)
            tpd_cpu_st(out_v, x + c, tpd_cpu_ld(inp_v, x + c, ab) * rsf * tpd_cpu_ld(w_v, c, ab),
                       ab);
        rstd[n] = rsf;
    }
    return TPD_OK;
}

/* One row's input gradient of out = inp * rs * w (C elements at offsets di, dd, xi of dinp,
 * dout, inp): dinp = rs * (dn - norm * mean_c(dn * norm)), dn = dout * w, norm = inp * rs.
 * The whole row is read before it is written, so dinp may alias dout. */
static inline void rms_row_bwd(void *dinp, size_t di, const void *dout, size_t dd, const void *inp,
                               size_t xi, const void *w, float rs, int C, int ab) {
    double s_dnn = 0.0;
    for (int c = 0; c < C; c++)
        s_dnn += (double)(tpd_cpu_ld(dout, dd + c, ab) * tpd_cpu_ld(w, c, ab)) *
                 (tpd_cpu_ld(inp, xi + c, ab) * rs);
    float m_dnn = (float)(s_dnn / C);
    for (int c = 0; c < C; c++) {
        float norm = tpd_cpu_ld(inp, xi + c, ab) * rs;
        float dn = tpd_cpu_ld(dout, dd + c, ab) * tpd_cpu_ld(w, c, ab);
        tpd_cpu_st(dinp, di + c, (dn - norm * m_dnn) * rs, ab);
    }
}

/* Backward of out = norm * w with norm = inp * rstd (rstd depends on every inp of the row):
 *   dw += sum_n dout * norm;
 *   dinp = rstd * (dnorm - norm * mean_c(dnorm * norm)),  dnorm = dout * w.
 * As in LayerNorm, dw is reduced first over column blocks with the rows in order, and
 * dinp is written after, each row read before it is written: dinp may alias dout. */
tpd_status tpd_kern_cpu_rmsnorm_bwd(tpd_kern_ctx *ctx, void *dinp_v, void *dw_v, const void *dout_v,
                                    const void *inp_v, const void *w_v, const float *rstd, int N,
                                    int C) {
    TPD_CPU_REQUIRE(N >= 0 && C > 0, "rmsnorm_bwd: bad shape N=%d C=%d", N, C);
    /* dinp, dout, inp (N,C); w (C); dw (C) in the gradient dtype */
    const int ab = ctx->act_bf16, gb = ctx->grad_bf16;
    int nt = tpd_kern_cpu_threads(ctx);

    int nblocks = (C + RMS_COL_BLOCK - 1) / RMS_COL_BLOCK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * RMS_COL_BLOCK;
        int c1 = c0 + RMS_COL_BLOCK < C ? c0 + RMS_COL_BLOCK : C;
        double sdw[RMS_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const size_t x = (size_t)n * C;
            for (int c = c0; c < c1; c++)
                sdw[c - c0] += (double)tpd_cpu_ld(dout_v, x + c, ab) *
                               (tpd_cpu_ld(inp_v, x + c, ab) * rstd[n]);
        }
        for (int c = c0; c < c1; c++)
            tpd_cpu_add_to(dw_v, c, (float)sdw[c - c0], gb);
    }

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t x = (size_t)n * C;
        rms_row_bwd(dinp_v, x, dout_v, x, inp_v, x, w_v, rstd[n], C, ab);
    }
    return TPD_OK;
}

/* ---- Qwen3's QK norm: RMSNorm of every Q and K head of qkv ---- */

/* Head h of row n: the (n*H + h)-th vector of HS, at n*ld + h*HS in qkv (H = NH + NKV
 * heads first in a row of ld = (NH + 2*NKV)*HS) and at (n*H + h)*HS in raw. */
static tpd_status qk_norm_check(const char *op, int N, int NH, int NKV, int HS) {
    TPD_CPU_REQUIRE(N >= 0 && NH > 0 && NKV > 0 && HS > 0 &&
                        (int64_t)(NH + 2 * NKV) * HS <= INT_MAX,
                    "%s: bad shape N=%d NH=%d NKV=%d HS=%d", op, N, NH, NKV, HS);
    return TPD_OK;
}

tpd_status tpd_kern_cpu_qk_norm_fwd(tpd_kern_ctx *ctx, void *qkv_v, void *raw_v, float *rstd,
                                    const void *wq_v, const void *wk_v, int N, int NH, int NKV,
                                    int HS, double eps) {
    TPD_CHECK(qk_norm_check("qk_norm_fwd", N, NH, NKV, HS));
    TPD_CPU_REQUIRE(eps >= 0.0, "qk_norm_fwd: eps (%g) must be >= 0", eps);
    const int ab = ctx->act_bf16, H = NH + NKV;
    const size_t ld = (size_t)(NH + 2 * NKV) * HS;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            const size_t x = (size_t)n * ld + (size_t)h * HS, r = ((size_t)n * H + h) * HS;
            const void *w = h < NH ? wq_v : wk_v;
            double ss = 0.0;
            for (int c = 0; c < HS; c++) {
                float xc = tpd_cpu_ld(qkv_v, x + c, ab);
                tpd_cpu_st(raw_v, r + c, xc, ab); /* exact: the same dtype */
                ss += (double)xc * xc;
            }
            float rsf = (float)(1.0 / sqrt(ss / HS + eps));
            for (int c = 0; c < HS; c++)
                tpd_cpu_st(qkv_v, x + c, tpd_cpu_ld(raw_v, r + c, ab) * rsf * tpd_cpu_ld(w, c, ab),
                           ab);
            rstd[(size_t)n * H + h] = rsf;
        }
    return TPD_OK;
}

/* RMSNorm's backward per head (tpd_kern_cpu_rmsnorm_bwd), the Q heads' dw summed into dwq
 * and the K heads' into dwk: first over column blocks with the heads in order, then dqkv
 * head by head, each read before it is written. */
tpd_status tpd_kern_cpu_qk_norm_bwd(tpd_kern_ctx *ctx, void *dqkv_v, void *dwq_v, void *dwk_v,
                                    const void *raw_v, const void *wq_v, const void *wk_v,
                                    const float *rstd, int N, int NH, int NKV, int HS) {
    TPD_CHECK(qk_norm_check("qk_norm_bwd", N, NH, NKV, HS));
    const int ab = ctx->act_bf16, gb = ctx->grad_bf16, H = NH + NKV;
    const size_t ld = (size_t)(NH + 2 * NKV) * HS;
    int nt = tpd_kern_cpu_threads(ctx);
    int nblocks = (HS + RMS_COL_BLOCK - 1) / RMS_COL_BLOCK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int task = 0; task < 2 * nblocks; task++) {
        const int k = task / nblocks, c0 = (task % nblocks) * RMS_COL_BLOCK;
        const int c1 = c0 + RMS_COL_BLOCK < HS ? c0 + RMS_COL_BLOCK : HS;
        const int h0 = k ? NH : 0, h1 = k ? H : NH; /* the Q heads, or the K heads */
        double sdw[RMS_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++)
            for (int h = h0; h < h1; h++) {
                const size_t x = (size_t)n * ld + (size_t)h * HS, r = ((size_t)n * H + h) * HS;
                const float rs = rstd[(size_t)n * H + h];
                for (int c = c0; c < c1; c++)
                    sdw[c - c0] +=
                        (double)tpd_cpu_ld(dqkv_v, x + c, ab) * (tpd_cpu_ld(raw_v, r + c, ab) * rs);
            }
        for (int c = c0; c < c1; c++)
            tpd_cpu_add_to(k ? dwk_v : dwq_v, c, (float)sdw[c - c0], gb);
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            const size_t x = (size_t)n * ld + (size_t)h * HS, r = ((size_t)n * H + h) * HS;
            rms_row_bwd(dqkv_v, x, dqkv_v, x, raw_v, r, h < NH ? wq_v : wk_v,
                        rstd[(size_t)n * H + h], HS, ab);
        }
    return TPD_OK;
}

/* ---- rotary position embedding ---- */

static tpd_status rope_check(const char *op, int B, int T, int NH, int NKV, int HS,
                             const tpd_rope *rope, int pos0) {
    double base = rope->base;
    TPD_CPU_REQUIRE(B >= 0 && T >= 0 && NH > 0 && NKV > 0 && HS > 0,
                    "%s: bad shape B=%d T=%d NH=%d NKV=%d HS=%d", op, B, T, NH, NKV, HS);
    TPD_CPU_REQUIRE(NH % NKV == 0, "%s: NKV (%d) must divide NH (%d)", op, NKV, NH);
    TPD_CPU_REQUIRE(HS % 2 == 0, "%s: head size HS (%d) must be even (rotate-half pairs)", op, HS);
    TPD_CPU_REQUIRE(base > 0.0 && isfinite(base), "%s: base (%g) must be a positive number", op,
                    base);
    TPD_CPU_REQUIRE(!(rope->factor > 0) ||
                        (rope->factor >= 1.0 && rope->high_freq_factor > rope->low_freq_factor &&
                         rope->low_freq_factor > 0 && rope->original_max_positions > 0),
                    "%s: llama3 scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor "
                    "and original positions > 0",
                    op);
    TPD_CPU_REQUIRE(pos0 >= 0 && (T == 0 || pos0 <= INT_MAX - (T - 1)),
                    "%s: positions pos0=%d .. pos0+T-1 (T=%d) must lie in [0, INT_MAX]", op, pos0,
                    T);
    return TPD_OK;
}

/* Rotates pairs (x_i, x_{i+HS/2}) of the first NH+NKV heads (Q and K) of every row by
 * theta_i = p * inv_freq_i (kernels/rope_freq.h), p = pos0 + t, or by -theta_i when sign = -1 (the
 * transposed rotation: sin(-a) = -sin(a) exactly, so the backward uses the forward's
 * cos and sin). The loop is over positions, so the cos/sin of a position are computed
 * once for the B rows and NH+NKV heads that share it, ROPE_PAIR_BLOCK pairs at a time. */
static void rope_rotate(tpd_kern_ctx *ctx, void *qkv, int B, int T, int NH, int NKV, int HS,
                        const tpd_rope *rope, int pos0, double sign) {
    const int half = HS / 2, nrot = NH + NKV;
    const size_t ld = (size_t)(NH + 2 * NKV) * HS; /* row stride of qkv */
    const int ab = ctx->act_bf16;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < T; t++) {
        const double p = (double)pos0 + t;
        double cs[ROPE_PAIR_BLOCK], sn[ROPE_PAIR_BLOCK];
        for (int i0 = 0; i0 < half; i0 += ROPE_PAIR_BLOCK) {
            int i1 = i0 + ROPE_PAIR_BLOCK < half ? i0 + ROPE_PAIR_BLOCK : half;
            for (int i = i0; i < i1; i++) {
                double theta = p * tpd_rope_inv_freq(rope, i, HS);
                cs[i - i0] = cos(theta);
                sn[i - i0] = sign * sin(theta);
            }
            for (int b = 0; b < B; b++) {
                const size_t row = ((size_t)b * T + t) * ld;
                for (int h = 0; h < nrot; h++) {
                    const size_t x = row + (size_t)h * HS;
                    for (int i = i0; i < i1; i++) {
                        double x0 = tpd_cpu_ld(qkv, x + i, ab),
                               x1 = tpd_cpu_ld(qkv, x + i + half, ab);
                        tpd_cpu_st(qkv, x + i, (float)(x0 * cs[i - i0] - x1 * sn[i - i0]), ab);
                        tpd_cpu_st(qkv, x + i + half, (float)(x0 * sn[i - i0] + x1 * cs[i - i0]),
                                   ab);
                    }
                }
            }
        }
    }
}

tpd_status tpd_kern_cpu_rope_fwd(tpd_kern_ctx *ctx, void *qkv, int B, int T, int NH, int NKV,
                                 int HS, const tpd_rope *rope, int pos0) {
    tpd_status st = rope_check("rope_fwd", B, T, NH, NKV, HS, rope, pos0);
    if (st != TPD_OK) return st;
    rope_rotate(ctx, qkv, B, T, NH, NKV, HS, rope, pos0, 1.0); /* (B,T,(NH+2*NKV)*HS) */
    return TPD_OK;
}

/* Backward of y = R(theta) x: dx = R(theta)^T dy = R(-theta) dy, in place on dqkv. */
tpd_status tpd_kern_cpu_rope_bwd(tpd_kern_ctx *ctx, void *dqkv, int B, int T, int NH, int NKV,
                                 int HS, const tpd_rope *rope, int pos0) {
    tpd_status st = rope_check("rope_bwd", B, T, NH, NKV, HS, rope, pos0);
    if (st != TPD_OK) return st;
    rope_rotate(ctx, dqkv, B, T, NH, NKV, HS, rope, pos0, -1.0); /* (B,T,(NH+2*NKV)*HS) */
    return TPD_OK;
}

/* ---- SwiGLU ---- */

/* out = silu(gate) * up, silu(g) = g * sigmoid(g), sigmoid(g) = 1/(1+e^-g). exp(-g)
 * overflows to +inf for g < -709 and the sigmoid is then an exact 0. */
tpd_status tpd_kern_cpu_swiglu_fwd(tpd_kern_ctx *ctx, void *out_v, const void *inp_v, int N,
                                   int F) {
    TPD_CPU_REQUIRE(N >= 0 && F > 0, "swiglu_fwd: bad shape N=%d F=%d", N, F);
    const int ab = ctx->act_bf16; /* out (N,F); inp (N,2F): [gate | up] */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t gate = (size_t)n * 2 * F, up = gate + F, o = (size_t)n * F;
        for (int c = 0; c < F; c++) {
            double g = tpd_cpu_ld(inp_v, gate + c, ab);
            double sig = 1.0 / (1.0 + exp(-g));
            tpd_cpu_st(out_v, o + c, (float)(g * sig * tpd_cpu_ld(inp_v, up + c, ab)), ab);
        }
    }
    return TPD_OK;
}

/* Backward of out = silu(g) * u:
 *   d up = dout * silu(g);  d gate = dout * u * silu'(g),
 *   silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
 * Gate and up of an element are both read before either gradient is written, so dinp
 * may alias inp (not dout: its rows are F wide, dinp's 2F). */
tpd_status tpd_kern_cpu_swiglu_bwd(tpd_kern_ctx *ctx, void *dinp_v, const void *inp_v,
                                   const void *dout_v, int N, int F) {
    TPD_CPU_REQUIRE(N >= 0 && F > 0, "swiglu_bwd: bad shape N=%d F=%d", N, F);
    /* dinp (N,2F): [d gate | d up]; inp (N,2F): [gate | up]; dout (N,F) */
    const int ab = ctx->act_bf16;
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t gate = (size_t)n * 2 * F, up = gate + F, d = (size_t)n * F;
        for (int c = 0; c < F; c++) {
            double g = tpd_cpu_ld(inp_v, gate + c, ab), u = tpd_cpu_ld(inp_v, up + c, ab);
            double dy = tpd_cpu_ld(dout_v, d + c, ab);
            double sig = 1.0 / (1.0 + exp(-g));
            double dsilu = sig * (1.0 + g * (1.0 - sig));
            tpd_cpu_st(dinp_v, gate + c, (float)(dy * u * dsilu), ab);
            tpd_cpu_st(dinp_v, up + c, (float)(dy * g * sig), ab);
        }
    }
    return TPD_OK;
}
