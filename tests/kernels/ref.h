// Shared helpers of the cpu kernel tests: a backend fixture, random inputs, naive
// double-precision references of every forward op, central finite differences, and
// comparisons that report the worst element.
//
// The references are written from the formulas in kernels/kernels.h, loop by loop, with
// no attempt at speed, so that they are easy to check by eye.
#ifndef TPD_TESTS_KERNELS_REF_H
#define TPD_TESTS_KERNELS_REF_H

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

extern "C" {
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"
}

namespace ref {

using Vec = std::vector<double>;
using FVec = std::vector<float>;

// A cpu backend for one test. Several threads, so the OpenMP paths really run in
// parallel even though CTest sets OMP_NUM_THREADS=1.
struct CpuBackend {
    tpd_kern_backend *b = nullptr;
    explicit CpuBackend(int threads = 3) {
        tpd_kern_config cfg = TPD_KERN_CONFIG_INIT;
        cfg.num_threads = threads;
        EXPECT_EQ(tpd_kern_cpu_create(&cfg, &b), TPD_OK);
    }
    ~CpuBackend() {
        tpd_kern_backend_destroy(b);
    }
    CpuBackend(const CpuBackend &) = delete;
    CpuBackend &operator=(const CpuBackend &) = delete;
};

inline FVec randn(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> d(0.0f, scale);
    FVec v(n);
    for (auto &x : v)
        x = d(gen);
    return v;
}

inline std::vector<int32_t> randint(size_t n, uint32_t seed, int lo, int hi) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> d(lo, hi - 1);
    std::vector<int32_t> v(n);
    for (auto &x : v)
        x = d(gen);
    return v;
}

inline Vec to_d(const FVec &v) {
    return Vec(v.begin(), v.end());
}

// ---- forward references (double) ----

// out(N,C) = wte[tok - v0] for tokens in [v0, v0+Vl), else 0.
inline Vec embed(const std::vector<int32_t> &tok, const Vec &wte, int N, int C, int v0, int Vl) {
    Vec out((size_t)N * C, 0.0);
    for (int n = 0; n < N; n++) {
        int r = tok[n] - v0;
        if (r < 0 || r >= Vl) continue;
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] = wte[(size_t)r * C + c];
    }
    return out;
}

// out(B,T,C) = inp + wpe broadcast over B.
inline Vec pos(const Vec &inp, const Vec &wpe, int B, int T, int C) {
    Vec out = inp;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((size_t)b * T + t) * C + c] += wpe[(size_t)t * C + c];
    return out;
}

inline Vec layernorm(const Vec &inp, const Vec &w, const Vec &b, int N, int C, Vec *mean = nullptr,
                     Vec *rstd = nullptr) {
    Vec out((size_t)N * C);
    if (mean) mean->assign(N, 0.0);
    if (rstd) rstd->assign(N, 0.0);
    for (int n = 0; n < N; n++) {
        const double *x = &inp[(size_t)n * C];
        double mu = 0.0, var = 0.0;
        for (int c = 0; c < C; c++)
            mu += x[c];
        mu /= C;
        for (int c = 0; c < C; c++)
            var += (x[c] - mu) * (x[c] - mu);
        var /= C; // biased
        double rs = 1.0 / std::sqrt(var + 1e-5);
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] = (x[c] - mu) * rs * w[c] + b[c];
        if (mean) (*mean)[n] = mu;
        if (rstd) (*rstd)[n] = rs;
    }
    return out;
}

// out(N,OC) = inp(N,C) @ w(OC,C)^T + bias(OC).
inline Vec matmul(const Vec &inp, const Vec &w, const Vec *bias, int N, int C, int OC) {
    Vec out((size_t)N * OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? (*bias)[o] : 0.0;
            for (int c = 0; c < C; c++)
                s += inp[(size_t)n * C + c] * w[(size_t)o * C + c];
            out[(size_t)n * OC + o] = s;
        }
    return out;
}

inline double gelu(double x) {
    const double k = std::sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

inline Vec gelu(const Vec &x) {
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); i++)
        y[i] = gelu(x[i]);
    return y;
}

// Causal attention. qkv(B,T,3*NH*HS) -> out(B,T,NH*HS); probs(B,NH,T,T) with zeros
// above the diagonal.
inline Vec attention(const Vec &qkv, int B, int T, int NH, int HS, Vec *probs = nullptr) {
    const int C = NH * HS, C3 = 3 * C;
    const double scale = 1.0 / std::sqrt((double)HS);
    Vec out((size_t)B * T * C, 0.0);
    if (probs) probs->assign((size_t)B * NH * T * T, 0.0);
    std::vector<double> p(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = &qkv[((size_t)b * T + t) * C3 + h * HS];
                double mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    const double *k = &qkv[((size_t)b * T + j) * C3 + C + h * HS];
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
                    const double *v = &qkv[((size_t)b * T + j) * C3 + 2 * C + h * HS];
                    for (int d = 0; d < HS; d++)
                        out[((size_t)b * T + t) * C + h * HS + d] += p[j] * v[d];
                }
            }
    return out;
}

// Per-row cross-entropy over the first Vvalid of Vp columns: log sum exp - logit[target].
inline Vec xent_losses(const Vec &logits, const std::vector<int32_t> &targets, int N, int Vp,
                       int Vvalid) {
    Vec loss(N);
    for (int n = 0; n < N; n++) {
        const double *l = &logits[(size_t)n * Vp];
        double mx = -INFINITY;
        for (int j = 0; j < Vvalid; j++)
            mx = std::max(mx, l[j]);
        double s = 0.0;
        for (int j = 0; j < Vvalid; j++)
            s += std::exp(l[j] - mx);
        loss[n] = std::log(s) + mx - l[targets[n]];
    }
    return loss;
}

inline double dot(const Vec &a, const Vec &b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); i++)
        s += a[i] * b[i];
    return s;
}

// Central differences of a scalar loss: g_i = (L(x + h e_i) - L(x - h e_i)) / 2h, all in
// double. `loss` sees the perturbed x.
template <class F> Vec fd_grad(Vec &x, F loss, double h = 1e-4) {
    Vec g(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = loss();
        x[i] = x0 - h;
        double lm = loss();
        x[i] = x0;
        g[i] = (lp - lm) / (2 * h);
    }
    return g;
}

// ---- comparisons ----

// |got - want| <= abs_tol + rel_tol * |want| for every element.
inline void expect_close(const float *got, const Vec &want, double rel_tol, double abs_tol,
                         const char *what) {
    size_t bad = 0, worst = 0;
    double worst_err = 0.0;
    for (size_t i = 0; i < want.size(); i++) {
        double err = std::fabs((double)got[i] - want[i]);
        double lim = abs_tol + rel_tol * std::fabs(want[i]);
        if (!(err <= lim)) bad++;
        if (!(err <= worst_err)) worst_err = err, worst = i;
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size()
                       << " elements out of tolerance; worst at " << worst << ": got " << got[worst]
                       << ", want " << want[worst];
}

// Gradient check: |got - fd| <= tol * max(1, |fd|) for every element.
inline void expect_grad_close(const float *got, const Vec &fd, double tol, const char *what) {
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < fd.size(); i++) {
        double ratio = std::fabs((double)got[i] - fd[i]) / std::max(1.0, std::fabs(fd[i]));
        if (!(ratio <= tol)) bad++;
        if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << fd.size()
                       << " gradients out of tolerance " << tol << "; worst at " << worst
                       << ": kernel " << got[worst] << ", finite difference " << fd[worst];
}

} // namespace ref

#endif
