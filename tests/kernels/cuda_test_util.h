// Shared by the cuda kernel tests (label `gpu`): a backend with the buffers a test
// allocates on it, bf16-rounded random inputs, and the tolerance check against the cpu
// backend. Tolerances: |got - ref| <= rtol * (|ref| + rms(ref)), rtol 2e-2 for bf16 (8-bit
// mantissa, fp32 accumulation) and 1e-4 for the f32 backend.
#ifndef TPD_TESTS_KERNELS_CUDA_TEST_UTIL_H
#define TPD_TESTS_KERNELS_CUDA_TEST_UTIL_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu.h"

extern "C" {
#include "base/bf16.h"
#include "kernels/kernels.h"
}

namespace cuda_test {

using FVec = std::vector<float>;
using IVec = std::vector<int32_t>;

// TPD_KERNEL_REF_CPU_BF16: the reference ("c", Be(false, dt)) is the cpu backend in dt (bf16
// by default) instead of fp32: the exact-recipe twin of the gpu tests
// (test_cuda_kernels_recipe). Both backends then round at the same points (kernels.h's bf16
// recipe) and differ only in their fp32 summation orders, so a bf16 output may land one bf16
// step (2^-7 relative at most) to either side: kRtolBf16 = 8e-3 instead of the 2e-2 that
// bf16 against fp32 needs. A case that passes against fp32 but fails here is a recipe bug
// (a rounding point moved); one that fails both is a kernel bug.
#ifdef TPD_KERNEL_REF_CPU_BF16
inline constexpr float kRtolBf16 = 8e-3f;
#else
inline constexpr float kRtolBf16 = 2e-2f;
#endif
inline constexpr float kRtolF32 = 1e-4f;

// TPD_KERNEL_TWIN_CPU: the backend under test ("g", Be(true, ...)) is the cpu backend in the
// requested dtype instead of the cuda one, so the same cases hold the cpu's bf16 recipe to the
// fp32 reference without a GPU (test_cpu_bf16_kernels, label `unit`).
#ifdef TPD_KERNEL_TWIN_CPU
#define SKIP_WITHOUT_GPU()                                                                         \
    do {                                                                                           \
    } while (0)
#else
#define SKIP_WITHOUT_GPU() TPD_SKIP_WITHOUT_GPU()
#endif

inline FVec round_bf16(const FVec &v) {
    FVec r(v.size());
    for (size_t i = 0; i < v.size(); i++)
        r[i] = tpd_bf16_to_f32(tpd_bf16_from_f32(v[i]));
    return r;
}
inline FVec randn(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> d(0.0f, scale);
    FVec v(n);
    for (auto &x : v)
        x = d(gen);
    return round_bf16(v);
}
inline IVec randint(size_t n, uint32_t seed, int lo, int hi) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> d(lo, hi - 1);
    IVec v(n);
    for (auto &x : v)
        x = d(gen);
    return v;
}

// One backend plus the buffers a test allocates on it (freed with it).
struct Be {
    tpd_kern_backend *b = nullptr;
    std::vector<void *> bufs;
    bool cuda;
    int fused;
    explicit Be(bool cuda_, tpd_dtype dt = TPD_DTYPE_BF16, int fused_ = 1)
        : cuda(cuda_), fused(fused_) {
        tpd_kern_config cfg = TPD_KERN_CONFIG_INIT;
        cfg.fused_attention = fused;
        if (cuda) {
            cfg.dtype = dt;
#ifdef TPD_KERNEL_TWIN_CPU
            cfg.num_threads = 2;
            EXPECT_EQ(tpd_kern_cpu_create(&cfg, &b), TPD_OK);
#else
            EXPECT_EQ(tpd_kern_cuda_create(&cfg, &b), TPD_OK);
#endif
        } else {
            cfg.num_threads = 2;
#ifdef TPD_KERNEL_REF_CPU_BF16
            cfg.dtype = dt;
#endif
            EXPECT_EQ(tpd_kern_cpu_create(&cfg, &b), TPD_OK);
        }
    }
    ~Be() {
        for (void *p : bufs)
            tpd_kern_free(b, p);
        tpd_kern_backend_destroy(b);
    }
    tpd_dtype act() const {
        return tpd_kern_act_dtype(b);
    }
    void *alloc(size_t bytes) {
        void *p = nullptr;
        EXPECT_EQ(tpd_kern_alloc(b, bytes, &p), TPD_OK);
        bufs.push_back(p);
        return p;
    }
    // Tensor in dtype dt (default: the activation dtype) holding v.
    void *up(const FVec &v, int dt = -1) {
        tpd_dtype t = dt < 0 ? act() : (tpd_dtype)dt;
        size_t n = v.size();
        void *p = alloc(n * tpd_dtype_size(t) + 16);
        if (t == TPD_DTYPE_BF16) {
            std::vector<uint16_t> h(n);
            for (size_t i = 0; i < n; i++)
                h[i] = tpd_bf16_from_f32(v[i]);
            EXPECT_EQ(tpd_kern_copy_to_device(b, p, h.data(), n * 2), TPD_OK);
        } else {
            EXPECT_EQ(tpd_kern_copy_to_device(b, p, v.data(), n * 4), TPD_OK);
        }
        return p;
    }
    float *upf(const FVec &v) {
        return (float *)up(v, TPD_DTYPE_F32);
    }
    int32_t *upi(const IVec &v) {
        void *p = alloc(v.size() * 4 + 16);
        EXPECT_EQ(tpd_kern_copy_to_device(b, p, v.data(), v.size() * 4), TPD_OK);
        return (int32_t *)p;
    }
    void *zeros(size_t n, int dt = -1) {
        return up(FVec(n, 0.0f), dt);
    }
    FVec down(const void *p, size_t n, int dt = -1) {
        tpd_dtype t = dt < 0 ? act() : (tpd_dtype)dt;
        FVec r(n);
        EXPECT_EQ(tpd_kern_synchronize(b), TPD_OK);
        if (t == TPD_DTYPE_BF16) {
            std::vector<uint16_t> h(n);
            EXPECT_EQ(tpd_kern_copy_to_host(b, h.data(), p, n * 2), TPD_OK);
            for (size_t i = 0; i < n; i++)
                r[i] = tpd_bf16_to_f32(h[i]);
        } else {
            EXPECT_EQ(tpd_kern_copy_to_host(b, r.data(), p, n * 4), TPD_OK);
        }
        return r;
    }
    FVec downf(const void *p, size_t n) {
        return down(p, n, TPD_DTYPE_F32);
    }
    std::vector<uint8_t> bytes(const void *p, size_t n) {
        std::vector<uint8_t> r(n);
        EXPECT_EQ(tpd_kern_copy_to_host(b, r.data(), p, n), TPD_OK);
        return r;
    }
};

inline void expect_close(const FVec &got, const FVec &ref, float rtol, const char *what) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    double ss = 0.0;
    for (float r : ref)
        ss += (double)r * r;
    double rms = ref.empty() ? 0.0 : std::sqrt(ss / ref.size());
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < ref.size(); i++) {
        double tol = rtol * (std::fabs((double)ref[i]) + rms) + 1e-30;
        double err = std::fabs((double)got[i] - ref[i]);
        if (!(err <= tol)) bad++;
        double ratio = err / tol;
        if (!(ratio <= worst_ratio)) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size()
                       << " elements out of tolerance; worst at " << worst << ": got " << got[worst]
                       << " want " << ref[worst] << " (rtol " << rtol << ", rms " << rms << ")";
}

} // namespace cuda_test

#endif
