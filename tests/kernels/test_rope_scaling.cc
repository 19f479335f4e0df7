// Llama 3.1's "llama3" rotary frequency scaling: the three bands of tpd_rope_inv_freq
// against the rule written out by hand, the cpu rotation against a plain double reference
// with those frequencies, and its backward as the exact transpose (<R x, y> = <x, R^T y>).
// transformers' own numbers for a scaled model are held by tests/engine/checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

extern "C" {
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"
}

namespace {

// base 20000, 16-wide heads, original context 32: wavelengths 2 pi 20000^(i/8) are 6.3 (i=0,
// below 32/4: kept), 21.7 (i=1, between 8 and 32: blended) and >= 74.9 (i>=2: divided).
const tpd_rope kRope = {20000.0, 8.0, 1.0, 4.0, 32.0};
constexpr int kHS = 16;

TEST(RopeScaling, TheThreeBandsFollowTheRule) {
    for (int i = 0; i < kHS / 2; i++) {
        double inv = std::pow(20000.0, -2.0 * i / kHS), got = tpd_rope_inv_freq(&kRope, i, kHS);
        double wavelen = 2 * M_PI / inv;
        if (i == 0) {
            EXPECT_LT(wavelen, 8.0);
            EXPECT_EQ(got, inv);
        } else if (i == 1) {
            ASSERT_GT(wavelen, 8.0);
            ASSERT_LT(wavelen, 32.0);
            double s = (32.0 / wavelen - 1.0) / (4.0 - 1.0);
            EXPECT_NEAR(got, (1 - s) * inv / 8.0 + s * inv, 1e-15);
            EXPECT_GT(got, inv / 8.0);
            EXPECT_LT(got, inv);
        } else {
            EXPECT_GT(wavelen, 32.0);
            EXPECT_EQ(got, inv / 8.0);
        }
    }
    tpd_rope plain = kRope;
    plain.factor = 0;
    for (int i = 0; i < kHS / 2; i++)
        EXPECT_EQ(tpd_rope_inv_freq(&plain, i, kHS), std::pow(20000.0, -2.0 * i / kHS));
}

struct Cpu {
    tpd_kern_backend *b = nullptr;
    Cpu() {
        tpd_kern_config cfg = TPD_KERN_CONFIG_INIT;
        EXPECT_EQ(tpd_kern_cpu_create(&cfg, &b), TPD_OK);
    }
    ~Cpu() {
        tpd_kern_backend_destroy(b);
    }
};

TEST(RopeScaling, CpuRotationMatchesTheReferenceAndItsBackwardIsTheTranspose) {
    const int B = 2, T = 40, NH = 4, NKV = 2, pos0 = 3; // positions beyond the original 32
    const int W = (NH + 2 * NKV) * kHS, half = kHS / 2;
    const size_t n = (size_t)B * T * W;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    std::vector<float> x(n), y(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = nd(rng);
        y[i] = nd(rng);
    }
    std::vector<float> rx = x, ry = y;
    Cpu be;
    ASSERT_EQ(tpd_kern_rope_scaled_fwd(be.b, rx.data(), B, T, NH, NKV, kHS, &kRope, pos0), TPD_OK);
    ASSERT_EQ(tpd_kern_rope_scaled_bwd(be.b, ry.data(), B, T, NH, NKV, kHS, &kRope, pos0), TPD_OK);
    double worst = 0, xy = 0, yx = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH + 2 * NKV; h++)
                for (int i = 0; i < half; i++) {
                    size_t at = ((size_t)b * T + t) * W + (size_t)h * kHS + i;
                    double x0 = x[at], x1 = x[at + half], w0 = x0, w1 = x1;
                    if (h < NH + NKV) { // Q and K rotate, V does not
                        double th = (pos0 + t) * tpd_rope_inv_freq(&kRope, i, kHS);
                        w0 = x0 * std::cos(th) - x1 * std::sin(th);
                        w1 = x0 * std::sin(th) + x1 * std::cos(th);
                    }
                    worst = std::max(worst, std::fabs(rx[at] - w0));
                    worst = std::max(worst, std::fabs(rx[at + half] - w1));
                }
    EXPECT_LT(worst, 1e-6);
    for (size_t i = 0; i < n; i++) {
        xy += (double)rx[i] * y[i];
        yx += (double)x[i] * ry[i];
    }
    EXPECT_NEAR(xy, yx, 1e-5 * std::fabs(xy) + 1e-5);
}

TEST(RopeScaling, ABadScalingIsRefused) {
    Cpu be;
    std::vector<float> x(8 * kHS, 0.f);
    tpd_rope bad = kRope;
    bad.high_freq_factor = 0.5; // below low_freq_factor
    EXPECT_NE(tpd_kern_rope_scaled_fwd(be.b, x.data(), 1, 1, 2, 1, kHS, &bad, 0), TPD_OK);
}

} // namespace
