// fp32 main gradients in the cuda backend (training.accumulate_allreduce_grads_in_fp32;
// label gpu, skips without a device). A bf16 backend created with fp32_grads reports F32
// gradients, and every op that accumulates a parameter gradient (matmul_bwd's dw and dbias,
// layernorm_bwd's dw and db, rmsnorm_bwd's dw, embed_bwd, pos_bwd) adds kRepeats small bf16
// contributions onto gradients near 1 in fp32: within 2e-5 of a double reference. The same
// ops with bf16 gradients (fp32_grads 0) round every sum to bf16's spacing of 2^-7 near 1
// and end more than 1e-4 off; the test checks that too, so it fails when the accumulation
// is not fp32. AdamW reads the fp32 gradient as it is (within 2e-6 of the reference, where
// a bf16 gradient moves the step by more than 1e-5).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "common/gpu.h"

extern "C" {
#include "base/bf16.h"
#include "kernels/kernels.h"
}

namespace {

using Floats = std::vector<float>;
using Doubles = std::vector<double>;

constexpr int kRepeats = 8;
constexpr double kFp32Tol = 2e-5, kBf16Drift = 1e-4;

// Normal values of standard deviation `scale`, rounded to bf16 so that both the device
// (which computes from bf16 activations) and the double reference see the same numbers.
Floats bf16_values(size_t n, uint32_t seed, float scale, float offset = 0.0f) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> d(0.0f, scale);
    Floats v(n);
    for (auto &x : v)
        x = tpd_bf16_to_f32(tpd_bf16_from_f32(offset + d(gen)));
    return v;
}

// A bf16 cuda backend with fp32 (fp32_grads 1) or bf16 gradients, and its buffers.
struct Bf16Device {
    tpd_kern_backend *kb = nullptr;
    std::vector<void *> mem;
    explicit Bf16Device(int fp32_grads) {
        tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
        kc.dtype = TPD_DTYPE_BF16;
        kc.fp32_grads = fp32_grads;
        EXPECT_EQ(tpd_kern_cuda_create(&kc, &kb), TPD_OK);
    }
    ~Bf16Device() {
        for (void *p : mem)
            tpd_kern_free(kb, p);
        tpd_kern_backend_destroy(kb);
    }
    void *raw(size_t bytes) {
        void *p = nullptr;
        EXPECT_EQ(tpd_kern_alloc(kb, bytes, &p), TPD_OK);
        mem.push_back(p);
        return p;
    }
    // v as dtype dt on the device: uploaded in fp32, cast there.
    void *put(const Floats &v, tpd_dtype dt) {
        void *f = raw(v.size() * 4);
        EXPECT_EQ(tpd_kern_copy_to_device(kb, f, v.data(), v.size() * 4), TPD_OK);
        if (dt == TPD_DTYPE_F32) return f;
        void *p = raw(v.size() * tpd_dtype_size(dt));
        EXPECT_EQ(tpd_kern_cast(kb, p, dt, f, TPD_DTYPE_F32, v.size()), TPD_OK);
        return p;
    }
    void *act(const Floats &v) {
        return put(v, TPD_DTYPE_BF16);
    }
    void *grad(const Floats &v) {
        return put(v, tpd_kern_grad_dtype(kb));
    }
    // n gradient elements at p, as fp32 on the host.
    Floats grad_host(const void *p, size_t n) {
        const void *src = p;
        if (tpd_kern_grad_dtype(kb) != TPD_DTYPE_F32) {
            void *f = raw(n * 4);
            EXPECT_EQ(tpd_kern_cast(kb, f, TPD_DTYPE_F32, p, tpd_kern_grad_dtype(kb), n), TPD_OK);
            src = f;
        }
        Floats h(n);
        EXPECT_EQ(tpd_kern_synchronize(kb), TPD_OK);
        EXPECT_EQ(tpd_kern_copy_to_host(kb, h.data(), src, n * 4), TPD_OK);
        return h;
    }
};

double worst_error(const Floats &got, const Doubles &want) {
    EXPECT_EQ(got.size(), want.size());
    double w = 0.0;
    for (size_t i = 0; i < got.size() && i < want.size(); i++)
        w = std::fmax(w, std::fabs((double)got[i] - want[i]));
    return w;
}

// Runs `op` (which accumulates kRepeats times and returns the gradients) with fp32 and with
// bf16 gradients and holds each against the double reference.
void expect_fp32_accumulation(const char *what, const Doubles &want,
                              const std::function<Floats(Bf16Device &)> &op) {
    Bf16Device f32(1), b16(0);
    ASSERT_EQ(tpd_kern_grad_dtype(f32.kb), TPD_DTYPE_F32) << what;
    ASSERT_EQ(tpd_kern_grad_dtype(b16.kb), TPD_DTYPE_BF16) << what;
    double e32 = worst_error(op(f32), want), e16 = worst_error(op(b16), want);
    printf("%-22s worst error after %d accumulations: fp32 main grads %.2e, bf16 grads %.2e\n",
           what, kRepeats, e32, e16);
    EXPECT_LE(e32, kFp32Tol) << what;
    EXPECT_GT(e16, kBf16Drift) << what << ": bf16 gradients should have drifted";
}

TEST(CudaMainGrads, MatmulWeightAndBiasGradients) {
    TPD_SKIP_WITHOUT_GPU();
    const int N = 64, C = 48, OC = 40;
    Floats dout = bf16_values((size_t)N * OC, 1, 1e-3f), inp = bf16_values((size_t)N * C, 2, 1.0f);
    Floats dw0 = bf16_values((size_t)OC * C, 3, 0.2f, 1.0f), db0 = bf16_values(OC, 4, 0.2f, 1.0f);
    Doubles want(dw0.begin(), dw0.end());
    want.insert(want.end(), db0.begin(), db0.end());
    for (int o = 0; o < OC; o++)
        for (int n = 0; n < N; n++) {
            double d = kRepeats * (double)dout[(size_t)n * OC + o];
            for (int c = 0; c < C; c++)
                want[(size_t)o * C + c] += d * inp[(size_t)n * C + c];
            want[(size_t)OC * C + o] += d;
        }
    expect_fp32_accumulation("matmul_bwd dw, dbias", want, [&](Bf16Device &d) {
        void *dy = d.act(dout), *x = d.act(inp), *dw = d.grad(dw0), *db = d.grad(db0);
        for (int r = 0; r < kRepeats; r++)
            EXPECT_EQ(tpd_kern_matmul_bwd(d.kb, nullptr, dw, db, dy, x, nullptr, N, C, OC), TPD_OK);
        Floats got = d.grad_host(dw, dw0.size()), gb = d.grad_host(db, db0.size());
        got.insert(got.end(), gb.begin(), gb.end());
        return got;
    });
}

TEST(CudaMainGrads, NormGradients) {
    TPD_SKIP_WITHOUT_GPU();
    const int N = 64, C = 96;
    Floats dout = bf16_values((size_t)N * C, 5, 1e-3f), x = bf16_values((size_t)N * C, 6, 1.0f);
    Floats w = bf16_values(C, 7, 0.1f, 1.0f), mean = bf16_values(N, 8, 0.1f);
    Floats rstd = bf16_values(N, 9, 0.1f, 1.0f);
    Floats g0 = bf16_values(2 * (size_t)C, 10, 0.2f, 1.0f);
    Doubles ln(g0.begin(), g0.end()), rms(g0.begin(), g0.begin() + C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)n * C + c;
            double d = kRepeats * (double)dout[i];
            ln[c] += d * (((double)x[i] - mean[n]) * rstd[n]);
            ln[(size_t)C + c] += d;
            rms[c] += d * x[i] * rstd[n];
        }
    expect_fp32_accumulation("layernorm_bwd dw, db", ln, [&](Bf16Device &d) {
        void *dy = d.act(dout), *xi = d.act(x), *wi = d.act(w), *dx = d.act(dout);
        float *m = (float *)d.put(mean, TPD_DTYPE_F32), *r = (float *)d.put(rstd, TPD_DTYPE_F32);
        Floats dw0(g0.begin(), g0.begin() + C), db0(g0.begin() + C, g0.end());
        void *dw = d.grad(dw0), *db = d.grad(db0);
        for (int k = 0; k < kRepeats; k++)
            EXPECT_EQ(tpd_kern_layernorm_bwd(d.kb, dx, dw, db, dy, xi, wi, m, r, N, C), TPD_OK);
        Floats got = d.grad_host(dw, C), gb = d.grad_host(db, C);
        got.insert(got.end(), gb.begin(), gb.end());
        return got;
    });
    expect_fp32_accumulation("rmsnorm_bwd dw", rms, [&](Bf16Device &d) {
        void *dy = d.act(dout), *xi = d.act(x), *wi = d.act(w), *dx = d.act(dout);
        float *r = (float *)d.put(rstd, TPD_DTYPE_F32);
        void *dw = d.grad(Floats(g0.begin(), g0.begin() + C));
        for (int k = 0; k < kRepeats; k++)
            EXPECT_EQ(tpd_kern_rmsnorm_bwd(d.kb, dx, dw, dy, xi, wi, r, N, C), TPD_OK);
        return d.grad_host(dw, C);
    });
}

TEST(CudaMainGrads, EmbeddingGradients) {
    TPD_SKIP_WITHOUT_GPU();
    const int B = 4, T = 16, C = 32, N = B * T, v0 = 8, Vl = 12;
    std::vector<int32_t> tok(N);
    for (int n = 0; n < N; n++)
        tok[n] = (n * 7) % 24; // some below v0, some past v0 + Vl
    Floats dout = bf16_values((size_t)N * C, 11, 1e-3f);
    Floats dwte0 = bf16_values((size_t)Vl * C, 12, 0.2f, 1.0f);
    Floats dwpe0 = bf16_values((size_t)T * C, 13, 0.2f, 1.0f);
    Doubles wte(dwte0.begin(), dwte0.end()), wpe(dwpe0.begin(), dwpe0.end());
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double d = kRepeats * (double)dout[(size_t)n * C + c];
            if (tok[n] >= v0 && tok[n] < v0 + Vl) wte[(size_t)(tok[n] - v0) * C + c] += d;
            wpe[(size_t)(n % T) * C + c] += d;
        }
    expect_fp32_accumulation("embed_bwd dwte", wte, [&](Bf16Device &d) {
        void *dy = d.act(dout), *dw = d.grad(dwte0);
        int32_t *t = (int32_t *)d.raw((size_t)N * 4);
        EXPECT_EQ(tpd_kern_copy_to_device(d.kb, t, tok.data(), (size_t)N * 4), TPD_OK);
        for (int k = 0; k < kRepeats; k++)
            EXPECT_EQ(tpd_kern_embed_bwd(d.kb, dw, dy, t, N, C, v0, Vl), TPD_OK);
        return d.grad_host(dw, dwte0.size());
    });
    expect_fp32_accumulation("pos_bwd dwpe", wpe, [&](Bf16Device &d) {
        void *dy = d.act(dout), *dw = d.grad(dwpe0);
        for (int k = 0; k < kRepeats; k++)
            EXPECT_EQ(tpd_kern_pos_bwd(d.kb, dw, dy, B, T, C), TPD_OK);
        return d.grad_host(dw, dwpe0.size());
    });
}

// One AdamW step (step 1, m = 0, v large enough that the step is linear in the gradient):
// the fp32 gradient's digits reach the master weights.
TEST(CudaMainGrads, AdamwReadsFp32Gradients) {
    TPD_SKIP_WITHOUT_GPU();
    const size_t n = 4096;
    const float lr = 1.0f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    Floats g(n), w0 = bf16_values(n, 14, 0.2f, 1.0f), v0(n, 1e-6f), m0(n, 0.0f);
    for (size_t i = 0; i < n; i++) // not bf16 values: their low bits are what is tested
        g[i] = 1e-3f * (1.0f + 0.37f * std::sin((float)i));
    Doubles want(n);
    for (size_t i = 0; i < n; i++) {
        double m = (1.0 - b1) * g[i], v = (double)b2 * v0[i] + (1.0 - b2) * (double)g[i] * g[i];
        double mhat = m / (1.0 - b1), vhat = v / (1.0 - b2);
        want[i] = w0[i] - lr * (mhat / (std::sqrt(vhat) + eps));
    }
    auto run = [&](Bf16Device &d) {
        void *p = d.act(w0), *gr = d.put(g, tpd_kern_grad_dtype(d.kb));
        float *master = (float *)d.put(w0, TPD_DTYPE_F32), *m = (float *)d.put(m0, TPD_DTYPE_F32);
        float *v = (float *)d.put(v0, TPD_DTYPE_F32);
        EXPECT_EQ(tpd_kern_adamw(d.kb, p, master, gr, m, v, n, lr, b1, b2, eps, 0.0f, 1, 1.0f),
                  TPD_OK);
        Floats out(n);
        EXPECT_EQ(tpd_kern_synchronize(d.kb), TPD_OK);
        EXPECT_EQ(tpd_kern_copy_to_host(d.kb, out.data(), master, n * 4), TPD_OK);
        return out;
    };
    Bf16Device f32(1), b16(0);
    double e32 = worst_error(run(f32), want), e16 = worst_error(run(b16), want);
    printf("adamw master weights: worst error fp32 gradients %.2e, bf16 gradients %.2e\n", e32,
           e16);
    EXPECT_LE(e32, 2e-6);
    EXPECT_GT(e16, 1e-5);
}

} // namespace
