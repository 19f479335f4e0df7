// The bias gradient of the cuda matmul backward (label gpu; skips without a device, fails
// under TRIPOD_REQUIRE_GPU=1): dbias(OC) += colsum(dout(N,OC)) on the 2-D grid of row
// chunks and column blocks with fixed-order partial sums, against a double reference on the
// host, on shapes with a ragged last chunk and a ragged last column block, and the same bits
// on every run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu.h"

extern "C" {
#include "base/bf16.h"
#include "kernels/kernels.h"
}

namespace {

// dbias after one accumulation onto db0, bf16 or f32 backend; dw = NULL (W of a split
// backward without the weight: only the bias gradient runs), dinp = NULL.
std::vector<float> bias_grad(tpd_dtype dt, const std::vector<float> &dout,
                             const std::vector<float> &db0, int N, int OC) {
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    kc.dtype = dt;
    tpd_kern_backend *kb = nullptr;
    EXPECT_EQ(tpd_kern_cuda_create(&kc, &kb), TPD_OK);
    if (!kb) return {};
    size_t es = tpd_dtype_size(dt);
    auto up = [&](const std::vector<float> &v) {
        std::vector<uint8_t> raw(v.size() * es);
        for (size_t i = 0; i < v.size(); i++) {
            if (dt == TPD_DTYPE_BF16) {
                uint16_t b = tpd_bf16_from_f32(v[i]);
                std::memcpy(raw.data() + i * 2, &b, 2);
            } else {
                std::memcpy(raw.data() + i * 4, &v[i], 4);
            }
        }
        void *p = nullptr;
        EXPECT_EQ(tpd_kern_alloc(kb, raw.size(), &p), TPD_OK);
        EXPECT_EQ(tpd_kern_copy_to_device(kb, p, raw.data(), raw.size()), TPD_OK);
        return p;
    };
    void *gd = up(dout), *gb = up(db0);
    EXPECT_EQ(tpd_kern_matmul_bwd(kb, nullptr, nullptr, gb, gd, nullptr, nullptr, N, 8, OC),
              TPD_OK);
    std::vector<uint8_t> raw((size_t)OC * es);
    EXPECT_EQ(tpd_kern_copy_to_host(kb, raw.data(), gb, raw.size()), TPD_OK);
    std::vector<float> out(OC);
    for (int i = 0; i < OC; i++) {
        if (dt == TPD_DTYPE_BF16) {
            uint16_t b;
            std::memcpy(&b, raw.data() + (size_t)i * 2, 2);
            out[i] = tpd_bf16_to_f32(b);
        } else {
            std::memcpy(&out[i], raw.data() + (size_t)i * 4, 4);
        }
    }
    tpd_kern_free(kb, gd);
    tpd_kern_free(kb, gb);
    tpd_kern_backend_destroy(kb);
    return out;
}

void check(tpd_dtype dt, int N, int OC, double rtol) {
    std::mt19937 gen(N * 31 + OC);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> dout((size_t)N * OC), db0(OC);
    for (auto &x : dout)
        x = tpd_bf16_to_f32(tpd_bf16_from_f32(d(gen))); // exact in both dtypes
    for (auto &x : db0)
        x = tpd_bf16_to_f32(tpd_bf16_from_f32(d(gen)));
    std::vector<float> got = bias_grad(dt, dout, db0, N, OC);
    ASSERT_EQ(got.size(), (size_t)OC);
    // |error| <= rtol * (|ref| + sqrt(N)): fp32 sums of N unit normals, bf16 output rounding
    for (int c = 0; c < OC; c++) {
        double ref = db0[c];
        for (int r = 0; r < N; r++)
            ref += dout[(size_t)r * OC + c];
        ASSERT_NEAR(got[c], ref, rtol * (std::fabs(ref) + std::sqrt((double)N)))
            << "column " << c << " of OC=" << OC << ", N=" << N;
    }
    // the same bits again
    std::vector<float> again = bias_grad(dt, dout, db0, N, OC);
    ASSERT_EQ(again.size(), got.size());
    EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0)
        << "bias gradient is not bit-deterministic (N=" << N << ", OC=" << OC << ")";
}

TEST(CudaBiasGrad, Bf16RaggedChunksAndColumns) {
    TPD_SKIP_WITHOUT_GPU();
    check(TPD_DTYPE_BF16, 4096 + 37, 3072 + 5, 1e-2);
}

TEST(CudaBiasGrad, F32MatchesDoubleReferenceTightly) {
    TPD_SKIP_WITHOUT_GPU();
    check(TPD_DTYPE_F32, 1000, 771, 1e-5);
}

TEST(CudaBiasGrad, FewerRowsThanOneChunk) {
    TPD_SKIP_WITHOUT_GPU();
    check(TPD_DTYPE_F32, 3, 40, 1e-5);
}

} // namespace
