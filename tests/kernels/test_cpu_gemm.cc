// The cpu bf16 GEMM (kernels/cpu/cpu_gemm.h) against a double-precision reference on the
// same bf16-valued inputs: every transpose combination, odd and empty shapes, padded
// leading dimensions, beta 0 and 1, alpha != 1, bias, fp32 and bf16 C, calls from an
// OpenMP parallel region, and bad arguments.
//
// Tolerances, from the arithmetic. The products of two bf16 values are exact in fp32, so
// the only error of an fp32 C is the fp32 summation (and the alpha, bias and beta adds):
// at most about K * 2^-24 * S for S = |alpha| sum_k |a_ik b_kj| + |bias_j| + |beta c_ij|,
// and in practice (blocked sums) far less; we allow 1e-5 * S + 1e-6. A bf16 C is rounded
// once more, to nearest: half a bf16 ulp, 2^-8 of the value, on top.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "base/bf16.h"
#include "kernels/cpu/cpu_gemm.h"
}

namespace {

constexpr double kSumRel = 1e-5; // fp32 summation, relative to S
constexpr double kAbs = 1e-6;
constexpr double kBf16Half = 1.0 / 256; // half a bf16 ulp, relative
constexpr uint16_t kPadBf16 = 0x7fc1;   // a NaN: the padding of C must stay as it is
constexpr uint32_t kPadF32 = 0x7fc00123u;

struct Gemm {
    tpd_cpu_gemm *g = nullptr;
    Gemm() {
        EXPECT_EQ(tpd_cpu_gemm_create(&g), TPD_OK);
    }
    ~Gemm() {
        tpd_cpu_gemm_destroy(g);
    }
};

struct Case {
    int transa, transb, M, N, K;
    int pad_a, pad_b, pad_c; // leading dimension minus the stored row width
    float alpha, beta;
    bool bias;
    tpd_dtype c_dt;
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937 &rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> v(n);
    for (auto &x : v)
        x = tpd_bf16_from_f32(u(rng));
    return v;
}

// Runs case c on random inputs and checks C, padding included, against the reference.
void run_case(tpd_cpu_gemm *g, const Case &c, unsigned seed) {
    SCOPED_TRACE(::testing::Message()
                 << "transa=" << c.transa << " transb=" << c.transb << " M=" << c.M << " N=" << c.N
                 << " K=" << c.K << " alpha=" << c.alpha << " beta=" << c.beta << " bias=" << c.bias
                 << " C=" << tpd_dtype_name(c.c_dt));
    std::mt19937 rng(seed);
    int a_rows = c.transa ? c.K : c.M, a_cols = c.transa ? c.M : c.K;
    int b_rows = c.transb ? c.N : c.K, b_cols = c.transb ? c.K : c.N;
    int lda = std::max(a_cols, 1) + c.pad_a, ldb = std::max(b_cols, 1) + c.pad_b;
    int ldc = std::max(c.N, 1) + c.pad_c;
    auto A = random_bf16((size_t)a_rows * lda, rng);
    auto B = random_bf16((size_t)b_rows * ldb, rng);
    auto bias = random_bf16((size_t)c.N, rng);
    auto c0 = random_bf16((size_t)c.M * ldc, rng); // C's initial values, bf16-valued
    bool f32 = c.c_dt == TPD_DTYPE_F32;
    std::vector<float> C32((size_t)c.M * ldc);
    std::vector<uint16_t> C16((size_t)c.M * ldc);
    for (size_t i = 0; i < c0.size(); i++) {
        bool pad = (int)(i % ldc) >= c.N;
        float v = tpd_bf16_to_f32(c0[i]);
        uint32_t p = kPadF32;
        if (pad) std::memcpy(&v, &p, sizeof v);
        C32[i] = v;
        C16[i] = pad ? kPadBf16 : c0[i];
    }
    void *C = f32 ? (void *)C32.data() : (void *)C16.data();
    ASSERT_EQ(tpd_cpu_gemm_bf16(g, c.transa, c.transb, c.M, c.N, c.K, c.alpha, A.data(), lda,
                                B.data(), ldb, c.beta, C, c.c_dt, ldc,
                                c.bias ? bias.data() : nullptr),
              TPD_OK);
    auto a = [&](int m, int k) {
        return (double)tpd_bf16_to_f32(c.transa ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k]);
    };
    auto b = [&](int k, int n) {
        return (double)tpd_bf16_to_f32(c.transb ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n]);
    };
    int bad = 0;
    for (int m = 0; m < c.M; m++) {
        for (int n = 0; n < ldc; n++) {
            size_t i = (size_t)m * ldc + n;
            if (n >= c.N) { // padding: untouched
                uint32_t u;
                std::memcpy(&u, &C32[i], sizeof u);
                if (f32 ? u != kPadF32 : C16[i] != kPadBf16) bad++;
                continue;
            }
            double dot = 0, abs_dot = 0;
            for (int k = 0; k < c.K; k++) {
                dot += a(m, k) * b(k, n);
                abs_dot += std::fabs(a(m, k) * b(k, n));
            }
            double cb = c.bias ? tpd_bf16_to_f32(bias[n]) : 0.0;
            double cc = c.beta * (double)tpd_bf16_to_f32(c0[i]);
            double ref = c.alpha * dot + cb + cc;
            double S = std::fabs(c.alpha) * abs_dot + std::fabs(cb) + std::fabs(cc);
            double tol = kSumRel * S + kAbs + (f32 ? 0.0 : kBf16Half * std::fabs(ref));
            double got = f32 ? C32[i] : tpd_bf16_to_f32(C16[i]);
            if (!(std::fabs(got - ref) <= tol)) {
                if (bad < 5)
                    ADD_FAILURE() << "C(" << m << "," << n << ") = " << got << ", reference " << ref
                                  << ", tolerance " << tol;
                bad++;
            }
        }
    }
    EXPECT_EQ(bad, 0);
}

TEST(CpuGemm, NamesItsLibrary) {
    const char *lib = tpd_cpu_gemm_library();
    ASSERT_NE(lib, nullptr);
#ifdef TPD_HAVE_DNNL
    EXPECT_EQ(std::strncmp(lib, "oneDNN ", 7), 0) << lib;
#else
    EXPECT_NE(std::strstr(lib, "sgemm"), nullptr) << lib;
#endif
    tpd_cpu_gemm_destroy(nullptr);
}

TEST(CpuGemm, EveryTransposeBetaBiasAndDtype) {
    Gemm g;
    unsigned seed = 1;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (float beta : {0.0f, 1.0f})
                for (bool bias : {false, true})
                    for (float alpha : {1.0f, -0.375f})
                        for (tpd_dtype dt : {TPD_DTYPE_F32, TPD_DTYPE_BF16})
                            run_case(g.g, {ta, tb, 37, 53, 19, 0, 0, 0, alpha, beta, bias, dt},
                                     seed++);
}

TEST(CpuGemm, PaddedLeadingDimensions) {
    Gemm g;
    unsigned seed = 100;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (tpd_dtype dt : {TPD_DTYPE_F32, TPD_DTYPE_BF16}) {
                run_case(g.g, {ta, tb, 37, 53, 19, 5, 3, 7, 1.0f, 1.0f, true, dt}, seed++);
                run_case(g.g, {ta, tb, 64, 48, 96, 16, 1, 32, 0.125f, 0.0f, false, dt}, seed++);
            }
}

TEST(CpuGemm, TinyAndEmptyShapes) {
    Gemm g;
    unsigned seed = 200;
    const int shapes[][3] = {{1, 1, 1}, {1, 7, 3}, {5, 1, 9}, {3, 4, 1},
                             {4, 5, 0}, {0, 5, 4}, {4, 0, 5}, {0, 0, 0}};
    for (const auto &s : shapes)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (float beta : {0.0f, 1.0f})
                    for (tpd_dtype dt : {TPD_DTYPE_F32, TPD_DTYPE_BF16}) {
                        run_case(g.g, {ta, tb, s[0], s[1], s[2], 2, 0, 1, 1.0f, beta, true, dt},
                                 seed++);
                        run_case(g.g, {ta, tb, s[0], s[1], s[2], 0, 2, 0, 2.0f, beta, false, dt},
                                 seed++);
                    }
}

// A GPT-2-like layer's three products at a small width, repeated so that the cache's
// entries are reused.
TEST(CpuGemm, LayerShapesReuseTheCache) {
    Gemm g;
    for (int rep = 0; rep < 3; rep++) {
        unsigned s = 300 + 10 * rep;
        run_case(g.g, {0, 1, 64, 96, 48, 0, 0, 0, 1.0f, 0.0f, true, TPD_DTYPE_BF16}, s);  // fwd
        run_case(g.g, {0, 0, 64, 48, 96, 0, 0, 0, 1.0f, 0.0f, false, TPD_DTYPE_BF16}, s); // dinp
        run_case(g.g, {1, 0, 96, 48, 64, 0, 0, 0, 1.0f, 1.0f, false, TPD_DTYPE_F32}, s);  // dW
    }
}

// More shapes than the cache holds, so entries are evicted and rebuilt.
TEST(CpuGemm, ManyShapes) {
    Gemm g;
    for (int rep = 0; rep < 2; rep++)
        for (int i = 1; i <= 40; i++)
            run_case(g.g,
                     {i % 2, (i / 2) % 2, i, 41 - i, 3 + i % 5, 0, 0, 0, 1.0f, (float)(i % 2),
                      i % 3 == 0, i % 4 ? TPD_DTYPE_F32 : TPD_DTYPE_BF16},
                     400 + i);
}

// fp32 accumulation, shown by a case that bf16 accumulation fails: a long dot product of
// values near 1 (multiples of 2^-7) whose running sum reaches ~4200, where a bf16 partial
// sum has an ulp of 16 or 32 and every further add rounds. Every partial sum fits in 20
// bits, so an fp32 sum in any order is exact, and an fp32 C must equal the reference. The
// emulated bf16 sums (sequential, and pairwise, which is far more accurate) must differ
// from it, or this test would prove nothing.
TEST(CpuGemm, AccumulatesInFp32) {
    Gemm g;
    const int K = 4096, N = 3;
    std::vector<uint16_t> A(K), B((size_t)K * N);
    for (int k = 0; k < K; k++) {
        A[k] = tpd_bf16_from_f32(1.0f + (float)(k % 7) / 128);
        for (int n = 0; n < N; n++)
            B[(size_t)k * N + n] = tpd_bf16_from_f32(n == 2 && k % 2 ? -1.0f : 1.0f);
    }
    for (tpd_dtype dt : {TPD_DTYPE_F32, TPD_DTYPE_BF16}) {
        std::vector<float> C32(N);
        std::vector<uint16_t> C16(N);
        void *C = dt == TPD_DTYPE_F32 ? (void *)C32.data() : (void *)C16.data();
        ASSERT_EQ(tpd_cpu_gemm_bf16(g.g, 0, 0, 1, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C, dt,
                                    N, nullptr),
                  TPD_OK);
        for (int n = 0; n < N; n++) {
            double ref = 0, seq = 0;
            std::vector<float> pair(K);
            for (int k = 0; k < K; k++) {
                double p = (double)tpd_bf16_to_f32(A[k]) * tpd_bf16_to_f32(B[(size_t)k * N + n]);
                ref += p;
                seq = tpd_bf16_to_f32(tpd_bf16_from_f32((float)(seq + p)));
                pair[k] = (float)p;
            }
            for (int w = K; w > 1; w /= 2)
                for (int k = 0; k < w / 2; k++)
                    pair[k] = tpd_bf16_to_f32(tpd_bf16_from_f32(pair[2 * k] + pair[2 * k + 1]));
            double tol = dt == TPD_DTYPE_F32 ? 0.0 : kBf16Half * std::fabs(ref);
            double got = dt == TPD_DTYPE_F32 ? C32[n] : tpd_bf16_to_f32(C16[n]);
            EXPECT_LE(std::fabs(got - ref), tol) << "column " << n << " " << tpd_dtype_name(dt);
            if (dt == TPD_DTYPE_F32 && n < 2) { // column 2 cancels: its sums stay small
                EXPECT_GT(std::fabs(seq - ref), 1.0) << "column " << n << ": bf16 sum passes";
                EXPECT_NE(pair[0], ref) << "column " << n << ": pairwise bf16 sum passes";
            }
        }
    }
}

// Calls from inside an OpenMP parallel region, several shapes at once: oneDNN then runs
// each on its calling thread, and the cache is shared.
TEST(CpuGemm, CallsFromAParallelRegion) {
    Gemm g;
    // gtest's assertions are thread-safe where pthreads are.
#pragma omp parallel num_threads(4)
    {
        int t = omp_get_thread_num();
        for (int rep = 0; rep < 4; rep++)
            run_case(g.g,
                     {t % 2, (t / 2) % 2, 16 + t, 24, 32 + rep % 2, 0, 0, 0, 0.5f, 1.0f, true,
                      t % 3 ? TPD_DTYPE_F32 : TPD_DTYPE_BF16},
                     500 + 10 * t + rep);
    }
}

// More threads than cache slots, each with its own shape, calling back to back (each
// thread's loop outlasts a scheduler time slice): with more threads than cores most are
// preempted inside a call, so entries are evicted while others execute, and in most runs
// some calls find every slot busy and build a primitive of their own. The last product
// of each thread is checked against the reference.
TEST(CpuGemm, MoreThreadsThanCacheSlots) {
    Gemm g;
    const int K = 1024, N = 128;
#pragma omp parallel num_threads(48)
    {
        int t = omp_get_thread_num(), M = 16 + t;
        std::mt19937 rng(800 + t);
        auto A = random_bf16((size_t)M * K, rng), B = random_bf16((size_t)K * N, rng);
        std::vector<float> C((size_t)M * N);
        int failed = 0;
#pragma omp barrier
        for (int rep = 0; rep < 200; rep++)
            failed += tpd_cpu_gemm_bf16(g.g, 0, 0, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f,
                                        C.data(), TPD_DTYPE_F32, N, nullptr) != TPD_OK;
        EXPECT_EQ(failed, 0);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double ref = 0, S = 0;
                for (int k = 0; k < K; k++) {
                    double p = (double)tpd_bf16_to_f32(A[(size_t)m * K + k]) *
                               tpd_bf16_to_f32(B[(size_t)k * N + n]);
                    ref += p;
                    S += std::fabs(p);
                }
                if (!(std::fabs(C[(size_t)m * N + n] - ref) <= kSumRel * S + kAbs)) failed++;
            }
        EXPECT_EQ(failed, 0) << "thread " << t;
    }
}

TEST(CpuGemm, RejectsBadArguments) {
    Gemm g;
    uint16_t a[4] = {0}, b[4] = {0};
    float c[4] = {0};
    auto call = [&](int M, int N, int K, int lda, int ldb, float beta, tpd_dtype dt, int ldc) {
        return tpd_cpu_gemm_bf16(g.g, 0, 0, M, N, K, 1.0f, a, lda, b, ldb, beta, c, dt, ldc,
                                 nullptr);
    };
    EXPECT_EQ(call(2, 2, 2, 2, 2, 0.5f, TPD_DTYPE_F32, 2), TPD_ERR_INVALID); // beta
    EXPECT_EQ(call(2, 2, 2, 2, 2, 0.0f, TPD_DTYPE_I32, 2), TPD_ERR_INVALID); // C dtype
    EXPECT_EQ(call(-1, 2, 2, 2, 2, 0.0f, TPD_DTYPE_F32, 2), TPD_ERR_INVALID);
    EXPECT_EQ(call(2, 2, 2, 1, 2, 0.0f, TPD_DTYPE_F32, 2), TPD_ERR_INVALID); // lda < K
    EXPECT_EQ(call(2, 2, 2, 2, 1, 0.0f, TPD_DTYPE_F32, 2), TPD_ERR_INVALID); // ldb < N
    EXPECT_EQ(call(2, 2, 2, 2, 2, 0.0f, TPD_DTYPE_F32, 1), TPD_ERR_INVALID); // ldc < N
    EXPECT_EQ(tpd_cpu_gemm_bf16(nullptr, 0, 0, 1, 1, 1, 1.0f, a, 1, b, 1, 0.0f, c, TPD_DTYPE_F32, 1,
                                nullptr),
              TPD_ERR_INVALID);
    EXPECT_EQ(call(2, 2, 2, 2, 2, 0.0f, TPD_DTYPE_F32, 2), TPD_OK);
}

} // namespace
