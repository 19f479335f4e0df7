// The cpu backend: construction, memory, every forward op against a naive double
// reference, accumulate/overwrite semantics, determinism, AdamW, sumsq and casts.
//
// Forward tolerance: |kernel - reference| <= 1e-5 * |reference| + 1e-5 unless a test says
// otherwise (fp32 with double accumulation where it matters, on O(1) inputs).
#include "ref.h"

#include <cstring>

using ref::FVec;
using ref::Vec;

namespace {

constexpr double kRel = 1e-5;
constexpr double kAbs = 1e-5;

uint32_t f2u(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
float u2f(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// ---- construction ----

TEST(CpuBackend, CreateFillsTheBackendStruct) {
    ref::CpuBackend be(2);
    EXPECT_STREQ(tpd_kern_name(be.b), "cpu");
    EXPECT_EQ(tpd_kern_act_dtype(be.b), TPD_DTYPE_F32);
    EXPECT_EQ(tpd_kern_param_dtype(be.b), TPD_DTYPE_F32);
    EXPECT_EQ(tpd_kern_grad_dtype(be.b), TPD_DTYPE_F32);
    EXPECT_EQ(tpd_kern_has_master(be.b), 0);
    EXPECT_EQ(tpd_kern_device_memory(be.b), 0);
    ASSERT_NE(be.b, nullptr);
    EXPECT_EQ(tpd_kern_attention_saved_bytes(be.b, 2, 9, 3, 4), (size_t)2 * 3 * 9 * 9 * 4);
}

TEST(CpuBackend, RejectsBf16AndNegativeThreads) {
    tpd_kern_backend *b = nullptr;
    tpd_kern_config cfg = TPD_KERN_CONFIG_INIT;
    cfg.dtype = TPD_DTYPE_BF16;
    EXPECT_EQ(tpd_kern_cpu_create(&cfg, &b), TPD_ERR_UNSUPPORTED);
    EXPECT_EQ(b, nullptr); // output written only on success
    cfg.dtype = TPD_DTYPE_F32;
    cfg.num_threads = -1;
    EXPECT_EQ(tpd_kern_cpu_create(&cfg, &b), TPD_ERR_INVALID);
    EXPECT_EQ(b, nullptr);
}

TEST(CpuBackend, DestroyOfNullIsSafe) {
    tpd_kern_backend *b = nullptr;
    tpd_kern_config cfg = TPD_KERN_CONFIG_INIT;
    ASSERT_EQ(tpd_kern_cpu_create(&cfg, &b), TPD_OK);
    ASSERT_NE(b, nullptr);
    tpd_kern_backend_destroy(b);
    tpd_kern_backend_destroy(nullptr);
}

#ifndef TPD_HAVE_CUDA
TEST(CpuBackend, CudaIsAbsentInThisBuild) {
    EXPECT_EQ(tpd_kern_cuda_available(), 0);
    tpd_kern_backend *b = nullptr;
    tpd_kern_config cfg = TPD_KERN_CONFIG_INIT;
    EXPECT_EQ(tpd_kern_cuda_create(&cfg, &b), TPD_ERR_UNSUPPORTED);
    EXPECT_EQ(b, nullptr);
}
#endif

TEST(Dtype, SizesAndNames) {
    EXPECT_EQ(tpd_dtype_size(TPD_DTYPE_F32), 4u);
    EXPECT_EQ(tpd_dtype_size(TPD_DTYPE_BF16), 2u);
    EXPECT_EQ(tpd_dtype_size(TPD_DTYPE_I32), 4u);
    EXPECT_STREQ(tpd_dtype_name(TPD_DTYPE_F32), "f32");
    EXPECT_STREQ(tpd_dtype_name(TPD_DTYPE_BF16), "bf16");
    EXPECT_EQ(tpd_dtype_size(TPD_DTYPE_U8), 1u);
    EXPECT_EQ(tpd_dtype_size(TPD_DTYPE_F64), 8u);
    EXPECT_STREQ(tpd_dtype_name(TPD_DTYPE_F64), "f64");
    EXPECT_STREQ(tpd_dtype_name(TPD_DTYPE_I32), "i32");
}

// ---- memory ----

TEST(CpuMemory, AlignedAndCountedExactly) {
    ref::CpuBackend be;
    const size_t sizes[] = {0, 1, 13, 64, 1000, 1 << 20};
    void *p[6];
    size_t total = 0;
    for (int i = 0; i < 6; i++) {
        ASSERT_EQ(tpd_kern_alloc(be.b, sizes[i], &p[i]), TPD_OK);
        ASSERT_NE(p[i], nullptr);
        EXPECT_EQ((uintptr_t)p[i] % 64, 0u) << "size " << sizes[i];
        total += sizes[i];
        EXPECT_EQ(tpd_kern_cpu_bytes_allocated(be.b), total);
    }
    // Free out of order; the count follows each free exactly.
    for (int i : {3, 0, 5, 1, 4, 2}) {
        tpd_kern_free(be.b, p[i]);
        total -= sizes[i];
        EXPECT_EQ(tpd_kern_cpu_bytes_allocated(be.b), total);
    }
    tpd_kern_free(be.b, nullptr); // like free(NULL)
    EXPECT_EQ(tpd_kern_cpu_bytes_allocated(be.b), 0u);
}

TEST(CpuMemory, BytesAllocatedIsZeroWithoutABackend) {
    EXPECT_EQ(tpd_kern_cpu_bytes_allocated(nullptr), 0u);
}

TEST(CpuMemory, CopiesAndZero) {
    ref::CpuBackend be;
    FVec host = ref::randn(100, 1), back(100, 0.0f);
    void *a, *b;
    ASSERT_EQ(tpd_kern_alloc(be.b, 400, &a), TPD_OK);
    ASSERT_EQ(tpd_kern_alloc(be.b, 400, &b), TPD_OK);
    EXPECT_EQ(tpd_kern_copy_to_device(be.b, a, host.data(), 400), TPD_OK);
    EXPECT_EQ(tpd_kern_copy(be.b, b, a, 400), TPD_OK);
    EXPECT_EQ(tpd_kern_synchronize(be.b), TPD_OK);
    EXPECT_EQ(tpd_kern_copy_to_host(be.b, back.data(), b, 400), TPD_OK);
    EXPECT_EQ(back, host);
    EXPECT_EQ(tpd_kern_zero(be.b, b, 200), TPD_OK);
    EXPECT_EQ(tpd_kern_copy_to_host(be.b, back.data(), b, 400), TPD_OK);
    for (int i = 0; i < 50; i++)
        EXPECT_EQ(back[i], 0.0f);
    for (int i = 50; i < 100; i++)
        EXPECT_EQ(back[i], host[i]);
    tpd_kern_free(be.b, a);
    tpd_kern_free(be.b, b);
}

// ---- embeddings ----

TEST(CpuForward, EmbedWithVocabOffset) {
    ref::CpuBackend be;
    const int N = 11, C = 13, v0 = 4, Vl = 6; // this rank holds tokens [4, 10)
    FVec wte = ref::randn((size_t)Vl * C, 2);
    std::vector<int32_t> tok = ref::randint(N, 3, 0, 14); // some outside [v0, v0+Vl)
    tok[0] = v0;
    tok[1] = v0 + Vl - 1;
    tok[2] = v0 + Vl; // just past the slice: zero row
    FVec out((size_t)N * C, NAN);
    ASSERT_EQ(tpd_kern_embed_fwd(be.b, out.data(), tok.data(), wte.data(), N, C, v0, Vl), TPD_OK);
    ref::expect_close(out.data(), ref::embed(tok, ref::to_d(wte), N, C, v0, Vl), 0, 0, "embed");
}

TEST(CpuForward, PosAddsOverBatch) {
    ref::CpuBackend be;
    const int B = 3, T = 7, C = 13;
    FVec x = ref::randn((size_t)B * T * C, 4), wpe = ref::randn((size_t)T * C, 5);
    Vec want = ref::pos(ref::to_d(x), ref::to_d(wpe), B, T, C);
    ASSERT_EQ(tpd_kern_pos_fwd(be.b, x.data(), wpe.data(), B, T, C), TPD_OK);
    ref::expect_close(x.data(), want, kRel, kAbs, "pos");
}

// ---- layernorm ----

TEST(CpuForward, LayerNorm) {
    ref::CpuBackend be;
    for (auto [N, C] : {std::pair{7, 13}, std::pair{1, 1}, std::pair{33, 64}}) {
        FVec inp = ref::randn((size_t)N * C, 6, 2.0f), w = ref::randn(C, 7), b = ref::randn(C, 8);
        for (auto &x : inp)
            x += 3.0f; // a mean far from 0 tests the two-pass variance
        FVec out((size_t)N * C), mean(N), rstd(N);
        ASSERT_EQ(tpd_kern_layernorm_fwd(be.b, out.data(), mean.data(), rstd.data(), inp.data(),
                                         w.data(), b.data(), N, C, 1e-5f),
                  TPD_OK);
        Vec rm, rr;
        Vec want = ref::layernorm(ref::to_d(inp), ref::to_d(w), ref::to_d(b), N, C, &rm, &rr);
        SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
        ref::expect_close(out.data(), want, kRel, kAbs, "layernorm out");
        ref::expect_close(mean.data(), rm, kRel, kAbs, "layernorm mean");
        // C=1 has zero variance, rstd = 1/sqrt(1e-5) = 316: relative tolerance only.
        ref::expect_close(rstd.data(), rr, kRel, kAbs, "layernorm rstd");
    }
}

// ---- matmul ----

struct MMShape {
    int N, C, OC;
};
const MMShape kMatmulShapes[] = {{7, 13, 5}, {1, 1, 1}, {33, 64, 17}, {5, 300, 3}};

TEST(CpuForward, MatmulWithAndWithoutBias) {
    ref::CpuBackend be;
    for (MMShape s : kMatmulShapes) {
        FVec inp = ref::randn((size_t)s.N * s.C, 9), w = ref::randn((size_t)s.OC * s.C, 10);
        FVec bias = ref::randn(s.OC, 11);
        Vec bd = ref::to_d(bias);
        SCOPED_TRACE("N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
                     " OC=" + std::to_string(s.OC));
        // Relative tolerance scaled by sqrt(C): the sums have C terms of O(1).
        double rel = kRel, abs = kAbs * std::sqrt((double)s.C);
        FVec out((size_t)s.N * s.OC, NAN);
        ASSERT_EQ(tpd_kern_matmul_fwd(be.b, out.data(), inp.data(), w.data(), bias.data(), s.N, s.C,
                                      s.OC),
                  TPD_OK);
        ref::expect_close(out.data(),
                          ref::matmul(ref::to_d(inp), ref::to_d(w), &bd, s.N, s.C, s.OC), rel, abs,
                          "matmul+bias");
        std::fill(out.begin(), out.end(), NAN); // overwritten, not accumulated
        ASSERT_EQ(
            tpd_kern_matmul_fwd(be.b, out.data(), inp.data(), w.data(), nullptr, s.N, s.C, s.OC),
            TPD_OK);
        ref::expect_close(out.data(),
                          ref::matmul(ref::to_d(inp), ref::to_d(w), nullptr, s.N, s.C, s.OC), rel,
                          abs, "matmul");
    }
}

TEST(CpuForward, BiasAdd) {
    ref::CpuBackend be;
    const int N = 7, OC = 5;
    FVec out = ref::randn((size_t)N * OC, 12), bias = ref::randn(OC, 13);
    Vec want = ref::to_d(out);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++)
            want[(size_t)n * OC + o] += bias[o];
    ASSERT_EQ(tpd_kern_bias_add(be.b, out.data(), bias.data(), N, OC), TPD_OK);
    ref::expect_close(out.data(), want, kRel, kAbs, "bias_add");
}

TEST(CpuForward, MatmulGelu) {
    ref::CpuBackend be;
    for (MMShape s : kMatmulShapes) {
        FVec inp = ref::randn((size_t)s.N * s.C, 14), w = ref::randn((size_t)s.OC * s.C, 15, 0.3f);
        FVec bias = ref::randn(s.OC, 16);
        Vec bd = ref::to_d(bias);
        FVec out((size_t)s.N * s.OC), pre((size_t)s.N * s.OC);
        ASSERT_EQ(tpd_kern_matmul_gelu_fwd(be.b, out.data(), pre.data(), inp.data(), w.data(),
                                           bias.data(), s.N, s.C, s.OC),
                  TPD_OK);
        Vec want_pre = ref::matmul(ref::to_d(inp), ref::to_d(w), &bd, s.N, s.C, s.OC);
        double abs = kAbs * std::sqrt((double)s.C);
        ref::expect_close(pre.data(), want_pre, kRel, abs, "matmul_gelu pre");
        ref::expect_close(out.data(), ref::gelu(want_pre), kRel, abs, "matmul_gelu out");
    }
}

// ---- elementwise ----

TEST(CpuForward, GeluAddScale) {
    ref::CpuBackend be;
    const size_t n = 1001;
    FVec x = ref::randn(n, 17, 3.0f), y = ref::randn(n, 18);
    x[0] = 0.0f;
    x[1] = 20.0f; // saturated tails
    x[2] = -20.0f;
    FVec out(n);
    ASSERT_EQ(tpd_kern_gelu_fwd(be.b, out.data(), x.data(), n), TPD_OK);
    ref::expect_close(out.data(), ref::gelu(ref::to_d(x)), kRel, kAbs, "gelu");

    Vec sum(n);
    for (size_t i = 0; i < n; i++)
        sum[i] = (double)x[i] + y[i];
    FVec a = x;
    ASSERT_EQ(tpd_kern_add(be.b, a.data(), a.data(), y.data(), n), TPD_OK); // out aliases a
    ref::expect_close(a.data(), sum, kRel, kAbs, "add");

    Vec scaled(n);
    for (size_t i = 0; i < n; i++)
        scaled[i] = (double)y[i] * -0.25;
    ASSERT_EQ(tpd_kern_scale(be.b, y.data(), -0.25f, n), TPD_OK);
    ref::expect_close(y.data(), scaled, 0, 0, "scale"); // power of two: exact
}

// ---- attention ----

struct AttShape {
    int B, T, NH, HS;
};
// T=70 crosses the kernel's 64-row block.
const AttShape kAttShapes[] = {{2, 1, 3, 4}, {2, 9, 3, 4}, {1, 70, 2, 8}};

TEST(CpuForward, Attention) {
    ref::CpuBackend be;
    for (AttShape s : kAttShapes) {
        const size_t nqkv = (size_t)s.B * s.T * 3 * s.NH * s.HS;
        FVec qkv = ref::randn(nqkv, 19);
        FVec out((size_t)s.B * s.T * s.NH * s.HS, NAN);
        FVec saved(tpd_kern_attention_saved_bytes(be.b, s.B, s.T, s.NH, s.HS) / 4, NAN);
        ASSERT_EQ(saved.size(), (size_t)s.B * s.NH * s.T * s.T);
        ASSERT_EQ(tpd_kern_attention_fwd(be.b, out.data(), saved.data(), qkv.data(), s.B, s.T, s.NH,
                                         s.NH, s.HS),
                  TPD_OK);
        Vec probs;
        Vec want = ref::attention(ref::to_d(qkv), s.B, s.T, s.NH, s.HS, &probs);
        SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T));
        ref::expect_close(out.data(), want, kRel, kAbs, "attention out");
        // The saved probabilities, zeros above the diagonal included.
        ref::expect_close(saved.data(), probs, kRel, kAbs, "attention probs");
    }
}

// ---- cross-entropy forward, unsplit ----

TEST(CpuForward, CrossEntropyIgnoresPadding) {
    ref::CpuBackend be;
    const int N = 6, Vl = 16, Vvalid = 13;
    FVec logits = ref::randn((size_t)N * Vl, 20, 2.0f);
    for (int n = 0; n < N; n++)
        for (int j = Vvalid; j < Vl; j++)
            logits[(size_t)n * Vl + j] = 50.0f; // would dominate
    std::vector<int32_t> tgt = ref::randint(N, 21, 0, Vvalid);
    FVec maxv(N), sumexp(N), t(N), loss(N);
    ASSERT_EQ(tpd_kern_xent_max(be.b, maxv.data(), logits.data(), N, Vl, Vvalid), TPD_OK);
    ASSERT_EQ(tpd_kern_xent_sumexp(be.b, sumexp.data(), t.data(), logits.data(), maxv.data(),
                                   tgt.data(), N, Vl, Vvalid, 0),
              TPD_OK);
    ASSERT_EQ(tpd_kern_xent_loss(be.b, loss.data(), maxv.data(), sumexp.data(), t.data(), N),
              TPD_OK);
    for (int n = 0; n < N; n++) {
        EXPECT_LT(maxv[n], 50.0f);
        EXPECT_EQ(t[n], logits[(size_t)n * Vl + tgt[n]]);
    }
    ref::expect_close(loss.data(), ref::xent_losses(ref::to_d(logits), tgt, N, Vl, Vvalid), kRel,
                      kAbs, "xent loss");

    double sum = 0.0;
    ASSERT_EQ(tpd_kern_sum_f32(be.b, loss.data(), N, &sum), TPD_OK);
    double want = 0.0;
    for (float l : loss)
        want += l;
    EXPECT_NEAR(sum, want, 1e-12 * std::fabs(want));
}

TEST(CpuForward, CrossEntropyEmptySliceGivesNeutralValues) {
    // A rank whose columns are all padding contributes -inf to the MAX and 0 to the SUMs.
    ref::CpuBackend be;
    const int N = 3, Vl = 4;
    FVec logits = ref::randn((size_t)N * Vl, 22);
    std::vector<int32_t> tgt = {0, 5, 8};
    FVec maxv(N), sumexp(N), t(N);
    ASSERT_EQ(tpd_kern_xent_max(be.b, maxv.data(), logits.data(), N, Vl, 0), TPD_OK);
    for (float m : maxv)
        EXPECT_EQ(m, -INFINITY);
    FVec gmax = {1.0f, 2.0f, 3.0f}; // the all-reduced max from other ranks
    ASSERT_EQ(tpd_kern_xent_sumexp(be.b, sumexp.data(), t.data(), logits.data(), gmax.data(),
                                   tgt.data(), N, Vl, 0, 8),
              TPD_OK);
    for (int n = 0; n < N; n++) {
        EXPECT_EQ(sumexp[n], 0.0f);
        EXPECT_EQ(t[n], 0.0f); // target 8 is column 0 here, but padded
    }
}

// ---- reductions ----

TEST(CpuReduce, SumAndSumsqInDouble) {
    ref::CpuBackend be;
    const size_t n = 10007; // several 4096-element chunks and a remainder
    FVec x = ref::randn(n, 23);
    double want_sum = 0.0, want_sq = 0.0;
    for (float v : x)
        want_sum += v, want_sq += (double)v * v;
    double sum = 0.0, sq = 0.0;
    ASSERT_EQ(tpd_kern_sum_f32(be.b, x.data(), n, &sum), TPD_OK);
    ASSERT_EQ(tpd_kern_sumsq(be.b, x.data(), TPD_DTYPE_F32, n, &sq), TPD_OK);
    EXPECT_NEAR(sum, want_sum, 1e-10);
    EXPECT_NEAR(sq, want_sq, 1e-10 * want_sq);

    // Thread count does not change a bit of the result.
    ref::CpuBackend one(1);
    double sq1 = 0.0;
    ASSERT_EQ(tpd_kern_sumsq(one.b, x.data(), TPD_DTYPE_F32, n, &sq1), TPD_OK);
    EXPECT_EQ(sq1, sq);

    // bf16 input: 1.5 and -2 are exact in bf16 (0x3FC0, 0xC000).
    std::vector<uint16_t> h(3000);
    for (size_t i = 0; i < h.size(); i++)
        h[i] = (i % 2) ? 0x3FC0 : 0xC000;
    double hsq = 0.0;
    ASSERT_EQ(tpd_kern_sumsq(be.b, h.data(), TPD_DTYPE_BF16, h.size(), &hsq), TPD_OK);
    EXPECT_EQ(hsq, 1500 * 2.25 + 1500 * 4.0);

    EXPECT_EQ(tpd_kern_sumsq(be.b, x.data(), TPD_DTYPE_I32, 1, &hsq), TPD_ERR_UNSUPPORTED);
}

// ---- casts ----

TEST(CpuCast, Bf16RoundsToNearestEven) {
    ref::CpuBackend be;
    // bf16 keeps 8 significand bits (7 stored), so near 1 its spacing is 2^-7.
    const float in[] = {
        1.0f,
        1.0f + 0x1p-8f,            // halfway between 1 and 1+2^-7: tie -> even (1.0)
        1.0f + 3 * 0x1p-8f,        // halfway between 1+2^-7 and 1+2^-6: tie -> even (1+2^-6)
        1.0f + 0x1p-8f + 0x1p-20f, // just above halfway: rounds up
        1.0f + 0x1p-9f,            // below halfway: rounds down
        -(1.0f + 3 * 0x1p-8f),     // sign is symmetric
        0x1.fffffep127f,           // FLT_MAX rounds up to +inf
        INFINITY,
        0.0f,
        -0.0f,
    };
    const uint16_t want[] = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F80,
                             0xBF82, 0x7F80, 0x7F80, 0x0000, 0x8000};
    const size_t n = sizeof in / sizeof in[0];
    std::vector<uint16_t> out(n);
    ASSERT_EQ(tpd_kern_cast(be.b, out.data(), TPD_DTYPE_BF16, in, TPD_DTYPE_F32, n), TPD_OK);
    for (size_t i = 0; i < n; i++)
        EXPECT_EQ(out[i], want[i]) << "element " << i << " bits 0x" << std::hex << f2u(in[i]);

    // NaN stays NaN (does not round into the infinity next to it).
    float nan_in = u2f(0x7F80FFFFu);
    uint16_t nan_out = 0;
    ASSERT_EQ(tpd_kern_cast(be.b, &nan_out, TPD_DTYPE_BF16, &nan_in, TPD_DTYPE_F32, 1), TPD_OK);
    EXPECT_TRUE(std::isnan(u2f((uint32_t)nan_out << 16)));
}

TEST(CpuCast, Bf16ToF32IsExactAndF32CopyIsBitwise) {
    ref::CpuBackend be;
    std::vector<uint16_t> h(65536);
    for (size_t i = 0; i < h.size(); i++)
        h[i] = (uint16_t)i;
    FVec f(h.size());
    ASSERT_EQ(tpd_kern_cast(be.b, f.data(), TPD_DTYPE_F32, h.data(), TPD_DTYPE_BF16, h.size()),
              TPD_OK);
    for (size_t i = 0; i < h.size(); i++)
        ASSERT_EQ(f2u(f[i]), (uint32_t)i << 16);
    // Every non-NaN bf16 survives f32 -> bf16 unchanged (the round trip is the identity).
    std::vector<uint16_t> back(h.size());
    ASSERT_EQ(tpd_kern_cast(be.b, back.data(), TPD_DTYPE_BF16, f.data(), TPD_DTYPE_F32, f.size()),
              TPD_OK);
    for (size_t i = 0; i < h.size(); i++)
        if (!std::isnan(f[i])) ASSERT_EQ(back[i], h[i]);

    FVec src = ref::randn(77, 24), dst(77);
    ASSERT_EQ(tpd_kern_cast(be.b, dst.data(), TPD_DTYPE_F32, src.data(), TPD_DTYPE_F32, 77),
              TPD_OK);
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), 77 * 4), 0);
    EXPECT_EQ(tpd_kern_cast(be.b, dst.data(), TPD_DTYPE_I32, src.data(), TPD_DTYPE_F32, 77),
              TPD_ERR_UNSUPPORTED);
}

// ---- AdamW ----

// Double reference of kernels.h's formula, over `steps` steps with a fresh gradient each.
struct AdamRef {
    Vec w, m, v;
};
AdamRef adamw_ref(const FVec &w0, const std::vector<FVec> &grads, double lr, double b1, double b2,
                  double eps, double wd, double gscale) {
    AdamRef r{ref::to_d(w0), Vec(w0.size(), 0.0), Vec(w0.size(), 0.0)};
    for (size_t s = 0; s < grads.size(); s++) {
        int step = (int)s + 1;
        for (size_t i = 0; i < w0.size(); i++) {
            double g = grads[s][i] * gscale;
            r.m[i] = b1 * r.m[i] + (1 - b1) * g;
            r.v[i] = b2 * r.v[i] + (1 - b2) * g * g;
            double mhat = r.m[i] / (1 - std::pow(b1, step));
            double vhat = r.v[i] / (1 - std::pow(b2, step));
            r.w[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * r.w[i]);
        }
    }
    return r;
}

TEST(CpuAdamW, ThreeStepsMatchTheDoubleReference) {
    ref::CpuBackend be;
    const size_t n = 257;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gscale = 0.5f;
    FVec w0 = ref::randn(n, 25);
    std::vector<FVec> grads = {ref::randn(n, 26), ref::randn(n, 27), ref::randn(n, 28)};
    AdamRef want = adamw_ref(w0, grads, lr, b1, b2, eps, wd, gscale);

    // Without master: param itself is updated.
    FVec w = w0, m(n, 0.0f), v(n, 0.0f);
    for (int s = 0; s < 3; s++)
        ASSERT_EQ(tpd_kern_adamw(be.b, w.data(), nullptr, grads[s].data(), m.data(), v.data(), n,
                                 lr, b1, b2, eps, wd, s + 1, gscale),
                  TPD_OK);
    ref::expect_close(w.data(), want.w, 1e-5, 1e-6, "adamw param");
    ref::expect_close(m.data(), want.m, 1e-5, 1e-7, "adamw m");
    ref::expect_close(v.data(), want.v, 1e-5, 1e-7, "adamw v");

    // With master: master is updated and param becomes a copy of it.
    FVec param(n, NAN), master = w0, m2(n, 0.0f), v2(n, 0.0f);
    for (int s = 0; s < 3; s++)
        ASSERT_EQ(tpd_kern_adamw(be.b, param.data(), master.data(), grads[s].data(), m2.data(),
                                 v2.data(), n, lr, b1, b2, eps, wd, s + 1, gscale),
                  TPD_OK);
    ref::expect_close(master.data(), want.w, 1e-5, 1e-6, "adamw master");
    EXPECT_EQ(std::memcmp(param.data(), master.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(master.data(), w.data(), n * 4), 0); // same arithmetic either way

    // Weight decay alone (zero gradient): w *= 1 - lr*wd per step, as decoupled decay.
    FVec wz = {2.0f}, mz = {0.0f}, vz = {0.0f}, gz = {0.0f};
    ASSERT_EQ(tpd_kern_adamw(be.b, wz.data(), nullptr, gz.data(), mz.data(), vz.data(), 1, lr, b1,
                             b2, eps, wd, 1, 1.0f),
              TPD_OK);
    EXPECT_NEAR(wz[0], 2.0 * (1 - 1e-2 * 0.1), 1e-7);

    EXPECT_EQ(tpd_kern_adamw(be.b, w.data(), nullptr, grads[0].data(), m.data(), v.data(), n, lr,
                             b1, b2, eps, wd, 0, gscale),
              TPD_ERR_INVALID);
}

// ---- backward semantics: parameter grads accumulate, input grads are overwritten ----

// a == 2*b elementwise within fp32 rounding of the second addition.
void expect_doubled(const FVec &twice, const FVec &once, const char *what) {
    Vec want(once.size());
    for (size_t i = 0; i < once.size(); i++)
        want[i] = 2.0 * once[i];
    ref::expect_close(twice.data(), want, 1e-6, 1e-7, what);
}

// ZB-H1's split: B (dw = dbias = NULL, no inp) then W (dinp = NULL) gives bit for bit
// the input and weight gradients of one whole call.
TEST(CpuBackwardSemantics, MatmulSplitIntoInputAndWeightGradsEqualsWhole) {
    ref::CpuBackend be;
    const int N = 9, C = 11, OC = 6;
    FVec inp = ref::randn((size_t)N * C, 40), w = ref::randn((size_t)OC * C, 41);
    FVec dout = ref::randn((size_t)N * OC, 42), dw0 = ref::randn((size_t)OC * C, 43);
    FVec db0 = ref::randn(OC, 44);
    FVec dinp((size_t)N * C, NAN), dw = dw0, db = db0;
    ASSERT_EQ(tpd_kern_matmul_bwd(be.b, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                  w.data(), N, C, OC),
              TPD_OK);
    FVec sdinp((size_t)N * C, NAN), sdw = dw0, sdb = db0;
    ASSERT_EQ(tpd_kern_matmul_bwd(be.b, sdinp.data(), nullptr, nullptr, dout.data(), nullptr,
                                  w.data(), N, C, OC),
              TPD_OK);
    EXPECT_EQ(std::memcmp(sdw.data(), dw0.data(), dw0.size() * 4), 0) << "B touched dw";
    EXPECT_EQ(std::memcmp(sdb.data(), db0.data(), db0.size() * 4), 0) << "B touched dbias";
    ASSERT_EQ(tpd_kern_matmul_bwd(be.b, nullptr, sdw.data(), sdb.data(), dout.data(), inp.data(),
                                  w.data(), N, C, OC),
              TPD_OK);
    EXPECT_EQ(std::memcmp(sdinp.data(), dinp.data(), dinp.size() * 4), 0) << "dinp";
    EXPECT_EQ(std::memcmp(sdw.data(), dw.data(), dw.size() * 4), 0) << "dw";
    EXPECT_EQ(std::memcmp(sdb.data(), db.data(), db.size() * 4), 0) << "dbias";
}

TEST(CpuBackwardSemantics, ParamGradsAccumulateInputGradsOverwrite) {
    ref::CpuBackend be;
    const int N = 7, C = 13, OC = 5;

    // matmul
    FVec inp = ref::randn((size_t)N * C, 30), w = ref::randn((size_t)OC * C, 31);
    FVec dout = ref::randn((size_t)N * OC, 32);
    FVec dinp1((size_t)N * C, NAN), dw((size_t)OC * C, 0.0f), db(OC, 0.0f);
    ASSERT_EQ(tpd_kern_matmul_bwd(be.b, dinp1.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                  w.data(), N, C, OC),
              TPD_OK);
    FVec dw1 = dw, db1 = db, dinp2((size_t)N * C, NAN);
    ASSERT_EQ(tpd_kern_matmul_bwd(be.b, dinp2.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                  w.data(), N, C, OC),
              TPD_OK);
    expect_doubled(dw, dw1, "matmul dw");
    expect_doubled(db, db1, "matmul dbias");
    EXPECT_EQ(std::memcmp(dinp1.data(), dinp2.data(), dinp1.size() * 4), 0) << "matmul dinp";
    for (float x : dinp1)
        ASSERT_FALSE(std::isnan(x)) << "matmul dinp not overwritten";
    // dinp == NULL and dbias == NULL are skipped; dw still accumulates.
    ASSERT_EQ(tpd_kern_matmul_bwd(be.b, nullptr, dw.data(), nullptr, dout.data(), inp.data(),
                                  w.data(), N, C, OC),
              TPD_OK);
    expect_doubled(db, db1, "matmul dbias untouched");
    Vec thrice(dw1.size());
    for (size_t i = 0; i < dw1.size(); i++)
        thrice[i] = 3.0 * dw1[i];
    ref::expect_close(dw.data(), thrice, 1e-6, 1e-7, "matmul dw x3");

    // layernorm
    FVec lw = ref::randn(C, 33), lb = ref::randn(C, 34), out((size_t)N * C), mean(N), rstd(N);
    FVec lout = ref::randn((size_t)N * C, 35);
    ASSERT_EQ(tpd_kern_layernorm_fwd(be.b, out.data(), mean.data(), rstd.data(), inp.data(),
                                     lw.data(), lb.data(), N, C, 1e-5f),
              TPD_OK);
    FVec ldw(C, 0.0f), ldb(C, 0.0f), ld1((size_t)N * C, NAN), ld2((size_t)N * C, NAN);
    ASSERT_EQ(tpd_kern_layernorm_bwd(be.b, ld1.data(), ldw.data(), ldb.data(), lout.data(),
                                     inp.data(), lw.data(), mean.data(), rstd.data(), N, C),
              TPD_OK);
    FVec ldw1 = ldw, ldb1 = ldb;
    ASSERT_EQ(tpd_kern_layernorm_bwd(be.b, ld2.data(), ldw.data(), ldb.data(), lout.data(),
                                     inp.data(), lw.data(), mean.data(), rstd.data(), N, C),
              TPD_OK);
    expect_doubled(ldw, ldw1, "layernorm dw");
    expect_doubled(ldb, ldb1, "layernorm db");
    EXPECT_EQ(std::memcmp(ld1.data(), ld2.data(), ld1.size() * 4), 0) << "layernorm dinp";
    // dinp may alias dout: same result as the separate buffers.
    FVec alias = lout, sdw(C, 0.0f), sdb(C, 0.0f);
    ASSERT_EQ(tpd_kern_layernorm_bwd(be.b, alias.data(), sdw.data(), sdb.data(), alias.data(),
                                     inp.data(), lw.data(), mean.data(), rstd.data(), N, C),
              TPD_OK);
    EXPECT_EQ(std::memcmp(alias.data(), ld1.data(), ld1.size() * 4), 0) << "layernorm aliased";
    EXPECT_EQ(std::memcmp(sdw.data(), ldw1.data(), C * 4), 0);

    // embedding and position
    const int v0 = 2, Vl = 5, B = 1, T = N;
    std::vector<int32_t> tok = {2, 3, 2, 6, 9, 2, 0};
    FVec dwte((size_t)Vl * C, 0.0f), dwpe((size_t)T * C, 0.0f);
    ASSERT_EQ(tpd_kern_embed_bwd(be.b, dwte.data(), ld1.data(), tok.data(), N, C, v0, Vl), TPD_OK);
    ASSERT_EQ(tpd_kern_pos_bwd(be.b, dwpe.data(), ld1.data(), B, T, C), TPD_OK);
    FVec dwte1 = dwte, dwpe1 = dwpe;
    ASSERT_EQ(tpd_kern_embed_bwd(be.b, dwte.data(), ld1.data(), tok.data(), N, C, v0, Vl), TPD_OK);
    ASSERT_EQ(tpd_kern_pos_bwd(be.b, dwpe.data(), ld1.data(), B, T, C), TPD_OK);
    expect_doubled(dwte, dwte1, "embed dwte");
    expect_doubled(dwpe, dwpe1, "pos dwpe");

    // attention: dqkv is overwritten (NaN-filled before each call)
    const int NH = 3, HS = 4, AT = 9;
    FVec qkv = ref::randn((size_t)AT * 3 * NH * HS, 36), aout((size_t)AT * NH * HS);
    FVec saved((size_t)NH * AT * AT), adout = ref::randn(aout.size(), 37);
    ASSERT_EQ(
        tpd_kern_attention_fwd(be.b, aout.data(), saved.data(), qkv.data(), 1, AT, NH, NH, HS),
        TPD_OK);
    FVec dq1(qkv.size(), NAN), dq2(qkv.size(), NAN);
    ASSERT_EQ(tpd_kern_attention_bwd(be.b, dq1.data(), adout.data(), qkv.data(), aout.data(),
                                     saved.data(), 1, AT, NH, NH, HS),
              TPD_OK);
    ASSERT_EQ(tpd_kern_attention_bwd(be.b, dq2.data(), adout.data(), qkv.data(), aout.data(),
                                     saved.data(), 1, AT, NH, NH, HS),
              TPD_OK);
    for (float x : dq1)
        ASSERT_FALSE(std::isnan(x)) << "attention dqkv not overwritten";
    EXPECT_EQ(std::memcmp(dq1.data(), dq2.data(), dq1.size() * 4), 0);

    // gelu: dinp may alias dout
    FVec gx = ref::randn(50, 38), gd = ref::randn(50, 39), gsep(50, NAN), galias = gd;
    ASSERT_EQ(tpd_kern_gelu_bwd(be.b, gsep.data(), gx.data(), gd.data(), 50), TPD_OK);
    ASSERT_EQ(tpd_kern_gelu_bwd(be.b, galias.data(), gx.data(), galias.data(), 50), TPD_OK);
    EXPECT_EQ(std::memcmp(gsep.data(), galias.data(), 50 * 4), 0);
}

// ---- embed_bwd determinism ----

TEST(CpuEmbedBackward, BitIdenticalAcrossRunsAndThreadCounts) {
    const int N = 512, C = 200, Vl = 7; // 512 tokens on 7 rows: every row repeated many times
    FVec dout = ref::randn((size_t)N * C, 40);
    std::vector<int32_t> tok = ref::randint(N, 41, 0, Vl);
    FVec base;
    for (int threads : {4, 4, 1, 3}) {
        ref::CpuBackend be(threads);
        FVec dwte((size_t)Vl * C, 0.0f);
        ASSERT_EQ(tpd_kern_embed_bwd(be.b, dwte.data(), dout.data(), tok.data(), N, C, 0, Vl),
                  TPD_OK);
        if (base.empty()) {
            base = dwte;
            continue;
        }
        EXPECT_EQ(std::memcmp(base.data(), dwte.data(), base.size() * 4), 0)
            << "threads=" << threads;
    }
    // And it is right: row sums in token order.
    Vec want((size_t)Vl * C, 0.0);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            want[(size_t)tok[n] * C + c] += dout[(size_t)n * C + c];
    ref::expect_close(base.data(), want, 1e-5, 1e-4, "embed_bwd sums");
}

} // namespace
