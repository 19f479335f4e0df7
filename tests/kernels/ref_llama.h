// Double-precision references of Llama's block ops (RMSNorm, RoPE, SwiGLU, grouped-query
// attention), written loop by loop from the formulas in kernels/kernels.h like those of
// ref.h, for the cpu forward tests and the finite-difference gradient checks.
#ifndef TPD_TESTS_KERNELS_REF_LLAMA_H
#define TPD_TESTS_KERNELS_REF_LLAMA_H

#include "ref.h"

namespace ref {

// out(N,C) = inp * rstd * w, rstd = 1/sqrt(mean over C of inp^2 + eps).
inline Vec rmsnorm(const Vec &inp, const Vec &w, int N, int C, double eps, Vec *rstd = nullptr) {
    Vec out((size_t)N * C);
    if (rstd) rstd->assign(N, 0.0);
    for (int n = 0; n < N; n++) {
        const double *x = &inp[(size_t)n * C];
        double ms = 0.0;
        for (int c = 0; c < C; c++)
            ms += x[c] * x[c];
        ms /= C;
        double rs = 1.0 / std::sqrt(ms + eps);
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] = x[c] * rs * w[c];
        if (rstd) (*rstd)[n] = rs;
    }
    return out;
}

// Qwen3's QK norm: RMSNorm over HS of each of the NH query heads of qkv(N,(NH+2*NKV)*HS) with
// wq and of each of the NKV key heads with wk; V copied through. rstd: (N, NH+NKV).
inline Vec qk_norm(const Vec &qkv, const Vec &wq, const Vec &wk, int N, int NH, int NKV, int HS,
                   double eps, Vec *rstd = nullptr) {
    Vec out = qkv;
    const int H = NH + NKV;
    const size_t ld = (size_t)(NH + 2 * NKV) * HS;
    if (rstd) rstd->assign((size_t)N * H, 0.0);
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            Vec head(qkv.begin() + n * ld + (size_t)h * HS,
                     qkv.begin() + n * ld + (size_t)(h + 1) * HS),
                r;
            Vec y = rmsnorm(head, h < NH ? wq : wk, 1, HS, eps, &r);
            std::copy(y.begin(), y.end(), out.begin() + n * ld + (size_t)h * HS);
            if (rstd) (*rstd)[(size_t)n * H + h] = r[0];
        }
    return out;
}

// Rotate-half RoPE on the NH query and NKV key heads of qkv(B,T,(NH+2*NKV)*HS) at
// position p = pos0 + t: (x_i, x_{i+HS/2}) rotated by theta_i = p * base^(-2i/HS).
// V is copied through.
inline Vec rope(const Vec &qkv, int B, int T, int NH, int NKV, int HS, double base, int pos0) {
    Vec out = qkv;
    const int C3 = (NH + 2 * NKV) * HS, half = HS / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH + NKV; h++)
                for (int i = 0; i < half; i++) {
                    double theta = (double)(pos0 + t) * std::pow(base, -2.0 * i / HS);
                    size_t at = ((size_t)b * T + t) * C3 + (size_t)h * HS + i;
                    double x0 = qkv[at], x1 = qkv[at + half];
                    out[at] = x0 * std::cos(theta) - x1 * std::sin(theta);
                    out[at + half] = x0 * std::sin(theta) + x1 * std::cos(theta);
                }
    return out;
}

// inp(N,2F) = [gate | up] per row; out(N,F) = silu(gate) * up, silu(x) = x/(1+e^-x).
inline Vec swiglu(const Vec &inp, int N, int F) {
    Vec out((size_t)N * F);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < F; c++) {
            double g = inp[(size_t)n * 2 * F + c], u = inp[(size_t)n * 2 * F + F + c];
            out[(size_t)n * F + c] = g / (1.0 + std::exp(-g)) * u;
        }
    return out;
}

// Causal grouped-query attention. qkv(B,T,(NH+2*NKV)*HS): Q head h at h*HS, K head g at
// (NH+g)*HS, V head g at (NH+NKV+g)*HS; query head h uses K/V head h / (NH/NKV).
// out(B,T,NH*HS); probs(B,NH,T,T) with zeros above the diagonal.
inline Vec attention_gqa(const Vec &qkv, int B, int T, int NH, int NKV, int HS,
                         Vec *probs = nullptr) {
    const int C = NH * HS, C3 = (NH + 2 * NKV) * HS, G = NH / NKV;
    const double scale = 1.0 / std::sqrt((double)HS);
    Vec out((size_t)B * T * C, 0.0);
    if (probs) probs->assign((size_t)B * NH * T * T, 0.0);
    std::vector<double> p(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int g = h / G;
            for (int t = 0; t < T; t++) {
                const double *q = &qkv[((size_t)b * T + t) * C3 + h * HS];
                double mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    const double *k = &qkv[((size_t)b * T + j) * C3 + (NH + g) * HS];
                    double s = 0.0;
                    for (int d = 0; d < HS; d++)
                        s += q[d] * k[d];
                    p[j] = s * scale;
                    mx = std::max(mx, p[j]);
                }
                double sum = 0.0;
                for (int j = 0; j <= t; j++)
                    sum += (p[j] = std::exp(p[j] - mx));
                for (int j = 0; j <= t; j++) {
                    p[j] /= sum;
                    if (probs) (*probs)[(((size_t)b * NH + h) * T + t) * T + j] = p[j];
                    const double *v = &qkv[((size_t)b * T + j) * C3 + (NH + NKV + g) * HS];
                    for (int d = 0; d < HS; d++)
                        out[((size_t)b * T + t) * C + h * HS + d] += p[j] * v[d];
                }
            }
        }
    return out;
}

} // namespace ref

#endif
