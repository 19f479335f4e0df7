// The cpu backend: construction, memory, every forward op against a naive double
// reference, accumulate/overwrite semantics, determinism, AdamW, SGD, DiLoCo's outer step,
// sumsq and casts.
//
// Forward tolerance: |kernel - reference| <= 1e-5 * |reference| + 1e-5 unless a test says
// otherwise (fp32 with double accumulation where it matters, on O(1) inputs).
#include "ref_llama.h"

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

// bf16 is the cuda backend's recipe: bf16 parameters and activations, fp32 master weights,
// gradients in fp32 (fp32_grads) or bf16.
TEST(CpuBackend, Bf16HasTheCudaBackendsDtypes) {
    for (int fp32_grads : {1, 0}) {
        tpd_kern_backend *b = nullptr;
        tpd_kern_config cfg = TPD_KERN_CONFIG_INIT;
        cfg.dtype = TPD_DTYPE_BF16;
        cfg.fp32_grads = fp32_grads;
        ASSERT_EQ(tpd_kern_cpu_create(&cfg, &b), TPD_OK);
        EXPECT_EQ(tpd_kern_act_dtype(b), TPD_DTYPE_BF16);
        EXPECT_EQ(tpd_kern_param_dtype(b), TPD_DTYPE_BF16);
        EXPECT_EQ(tpd_kern_grad_dtype(b), fp32_grads ? TPD_DTYPE_F32 : TPD_DTYPE_BF16);
        EXPECT_EQ(tpd_kern_has_master(b), 1);
        EXPECT_EQ(tpd_kern_device_memory(b), 0);
        tpd_kern_backend_destroy(b);
    }
}

TEST(CpuBackend, RejectsOtherDtypesAndNegativeThreads) {
    tpd_kern_backend *b = nullptr;
    tpd_kern_config cfg = TPD_KERN_CONFIG_INIT;
    cfg.dtype = TPD_DTYPE_I32;
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

// A column block of a row-major matrix, against plain loops.
TEST(CpuMemory, Copy2dMovesAColumnBlock) {
    ref::CpuBackend be;
    const int rows = 7, scols = 9, dcols = 5, c0 = 3, w = 4;
    FVec src = ref::randn((size_t)rows * scols, 2), dst((size_t)rows * dcols, -1.0f), want = dst;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < w; j++)
            want[(size_t)i * dcols + 1 + j] = src[(size_t)i * scols + c0 + j];
    ASSERT_EQ(
        tpd_kern_copy_2d(be.b, dst.data() + 1, dcols * 4, src.data() + c0, scols * 4, w * 4, rows),
        TPD_OK);
    EXPECT_EQ(dst, want);
    // a width wider than a pitch is refused; nothing to move is a no-op
    EXPECT_EQ(tpd_kern_copy_2d(be.b, dst.data(), 4, src.data(), scols * 4, 8, 2), TPD_ERR_INVALID);
    EXPECT_EQ(tpd_kern_copy_2d(be.b, dst.data(), 4, src.data(), 4, 4, 0), TPD_OK);
    EXPECT_EQ(dst, want);
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

// eps enters rstd = 1/sqrt(var + eps) as given: rows of known variance, two epsilons.
TEST(CpuForward, LayerNormEpsIsHonoured) {
    ref::CpuBackend be;
    const int C = 4;
    // Row 0: +-0.1 around 0.5 (mean 0.5, biased variance 0.01); row 1: constant (variance 0).
    FVec inp = {0.6f, 0.4f, 0.6f, 0.4f, 2.0f, 2.0f, 2.0f, 2.0f};
    FVec w = {1.0f, 2.0f, -1.0f, 0.5f}, b = {0.0f, 0.25f, 0.0f, -1.0f};
    FVec prev;
    for (float eps : {1e-5f, 0.0025f, 0.25f}) {
        SCOPED_TRACE("eps=" + std::to_string(eps));
        FVec out(inp.size(), NAN), mean(2), rstd(2);
        ASSERT_EQ(tpd_kern_layernorm_fwd(be.b, out.data(), mean.data(), rstd.data(), inp.data(),
                                         w.data(), b.data(), 2, C, eps),
                  TPD_OK);
        // The row's values in fp32 are 0.6f and 0.4f, so its variance is not exactly 0.01.
        double d = ((double)inp[0] - inp[1]) / 2, mu = ((double)inp[0] + inp[1]) / 2;
        Vec want_rstd = {1.0 / std::sqrt(d * d + eps), 1.0 / std::sqrt((double)eps)};
        Vec want(inp.size());
        for (int c = 0; c < C; c++) {
            want[c] = (inp[c] - mu) * want_rstd[0] * w[c] + b[c];
            want[C + c] = b[c]; // zero deviation: only the bias is left
        }
        ref::expect_close(rstd.data(), want_rstd, 1e-6, 0, "layernorm rstd(eps)");
        ref::expect_close(out.data(), want, 1e-6, 1e-6, "layernorm out(eps)");
        if (!prev.empty()) EXPECT_NE(std::memcmp(prev.data(), out.data(), C * 4), 0);
        prev = out;
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

// Grouped-query attention: NH = 4 query heads on NKV = 4 (multi-head), 2 and 1 K/V heads,
// against the double reference; T = 70 crosses the kernel's 64-row block.
struct GqaShape {
    int B, T, NH, NKV, HS;
};
const GqaShape kGqaShapes[] = {{2, 9, 4, 4, 4},  {2, 9, 4, 2, 4}, {2, 9, 4, 1, 4},
                               {1, 70, 4, 2, 8}, {3, 1, 4, 1, 2}, {1, 70, 6, 3, 4}};

TEST(CpuForward, GroupedQueryAttention) {
    ref::CpuBackend be;
    for (GqaShape s : kGqaShapes) {
        SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                     " NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV));
        FVec qkv = ref::randn((size_t)s.B * s.T * (s.NH + 2 * s.NKV) * s.HS, 80);
        FVec out((size_t)s.B * s.T * s.NH * s.HS, NAN);
        FVec saved(tpd_kern_attention_saved_bytes(be.b, s.B, s.T, s.NH, s.HS) / 4, NAN);
        ASSERT_EQ(tpd_kern_attention_fwd(be.b, out.data(), saved.data(), qkv.data(), s.B, s.T, s.NH,
                                         s.NKV, s.HS),
                  TPD_OK);
        Vec probs;
        Vec want = ref::attention_gqa(ref::to_d(qkv), s.B, s.T, s.NH, s.NKV, s.HS, &probs);
        ref::expect_close(out.data(), want, kRel, kAbs, "gqa out");
        ref::expect_close(saved.data(), probs, kRel, kAbs, "gqa probs");
    }
    // With NKV == NH the grouped reference is ref.h's multi-head one, to the bit.
    Vec q = ref::to_d(ref::randn((size_t)2 * 9 * 3 * 4 * 4, 81));
    EXPECT_EQ(ref::attention_gqa(q, 2, 9, 4, 4, 4), ref::attention(q, 2, 9, 4, 4));
}

// Grouped-query attention is multi-head attention on K/V heads repeated G = NH/NKV times:
// the forward and dQ are the same operations on the same numbers (bit for bit), and the
// gradient of a shared K/V head is the sum of its copies' gradients.
TEST(CpuForward, GroupedQueryAttentionIsMultiHeadOnRepeatedKvHeads) {
    ref::CpuBackend be;
    for (GqaShape s : {GqaShape{2, 9, 4, 2, 4}, GqaShape{1, 70, 4, 1, 8}}) {
        SCOPED_TRACE("T=" + std::to_string(s.T) + " NKV=" + std::to_string(s.NKV));
        const int G = s.NH / s.NKV, HS = s.HS, NH = s.NH, NKV = s.NKV;
        const int Cg = (NH + 2 * NKV) * HS, Cm = 3 * NH * HS, N = s.B * s.T;
        FVec qg = ref::randn((size_t)N * Cg, 82), dout = ref::randn((size_t)N * NH * HS, 83);
        FVec qm((size_t)N * Cm);
        for (int n = 0; n < N; n++)
            for (int h = 0; h < NH; h++)
                for (int d = 0; d < HS; d++) {
                    const float *rg = &qg[(size_t)n * Cg];
                    float *rm = &qm[(size_t)n * Cm];
                    rm[h * HS + d] = rg[h * HS + d];
                    rm[(NH + h) * HS + d] = rg[(NH + h / G) * HS + d];
                    rm[(2 * NH + h) * HS + d] = rg[(NH + NKV + h / G) * HS + d];
                }
        size_t nsaved = (size_t)s.B * NH * s.T * s.T;
        FVec og((size_t)N * NH * HS), om(og.size()), sg(nsaved), sm(nsaved);
        ASSERT_EQ(
            tpd_kern_attention_fwd(be.b, og.data(), sg.data(), qg.data(), s.B, s.T, NH, NKV, HS),
            TPD_OK);
        ASSERT_EQ(
            tpd_kern_attention_fwd(be.b, om.data(), sm.data(), qm.data(), s.B, s.T, NH, NH, HS),
            TPD_OK);
        EXPECT_EQ(std::memcmp(og.data(), om.data(), og.size() * 4), 0) << "out";
        EXPECT_EQ(std::memcmp(sg.data(), sm.data(), nsaved * 4), 0) << "saved";

        FVec dg(qg.size(), NAN), dm(qm.size(), NAN);
        ASSERT_EQ(tpd_kern_attention_bwd(be.b, dg.data(), dout.data(), qg.data(), og.data(),
                                         sg.data(), s.B, s.T, NH, NKV, HS),
                  TPD_OK);
        ASSERT_EQ(tpd_kern_attention_bwd(be.b, dm.data(), dout.data(), qm.data(), om.data(),
                                         sm.data(), s.B, s.T, NH, NH, HS),
                  TPD_OK);
        Vec want_kv((size_t)N * 2 * NKV * HS, 0.0);
        FVec got_kv(want_kv.size());
        for (int n = 0; n < N; n++) {
            EXPECT_EQ(std::memcmp(&dg[(size_t)n * Cg], &dm[(size_t)n * Cm], NH * HS * 4), 0)
                << "dq row " << n;
            for (int h = 0; h < NH; h++)
                for (int d = 0; d < HS; d++) {
                    size_t k = ((size_t)n * 2 * NKV + h / G) * HS + d;
                    want_kv[k] += dm[(size_t)n * Cm + (NH + h) * HS + d];
                    want_kv[k + NKV * HS] += dm[(size_t)n * Cm + (2 * NH + h) * HS + d];
                }
            std::memcpy(&got_kv[(size_t)n * 2 * NKV * HS], &dg[(size_t)n * Cg + NH * HS],
                        2 * NKV * HS * 4);
        }
        ref::expect_close(got_kv.data(), want_kv, 1e-6, 1e-6, "dk, dv = sums over the group");
    }
}

TEST(CpuForward, AttentionRejectsKvHeadsThatDoNotDivideTheQueryHeads) {
    ref::CpuBackend be;
    const int B = 1, T = 3, NH = 4, HS = 2;
    FVec qkv((size_t)B * T * (NH + 2 * 8) * HS, 1.0f), out((size_t)B * T * NH * HS, 7.0f);
    FVec saved((size_t)B * NH * T * T), dqkv(qkv.size(), 7.0f);
    for (int nkv : {3, 8, 0, -1}) {
        SCOPED_TRACE("NKV=" + std::to_string(nkv));
        EXPECT_EQ(
            tpd_kern_attention_fwd(be.b, out.data(), saved.data(), qkv.data(), B, T, NH, nkv, HS),
            TPD_ERR_INVALID);
        EXPECT_EQ(tpd_kern_attention_bwd(be.b, dqkv.data(), out.data(), qkv.data(), out.data(),
                                         saved.data(), B, T, NH, nkv, HS),
                  TPD_ERR_INVALID);
    }
    for (float x : out)
        ASSERT_EQ(x, 7.0f) << "written on a rejected call";
    for (float x : dqkv)
        ASSERT_EQ(x, 7.0f) << "written on a rejected call";
}

// ---- Llama's block: RMSNorm, RoPE, SwiGLU ----

TEST(CpuForward, RmsNorm) {
    ref::CpuBackend be;
    for (auto [N, C] : {std::pair{7, 13}, std::pair{1, 1}, std::pair{33, 64}}) {
        for (float eps : {1e-5f, 1e-6f, 0.5f}) {
            SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) +
                         " eps=" + std::to_string(eps));
            FVec inp = ref::randn((size_t)N * C, 84, 2.0f), w = ref::randn(C, 85);
            for (auto &x : inp)
                x += 3.0f; // no mean is subtracted: the statistic is the raw second moment
            FVec out((size_t)N * C, NAN), rstd(N, NAN);
            ASSERT_EQ(tpd_kern_rmsnorm_fwd(be.b, out.data(), rstd.data(), inp.data(), w.data(), N,
                                           C, eps),
                      TPD_OK);
            Vec rr;
            Vec want = ref::rmsnorm(ref::to_d(inp), ref::to_d(w), N, C, eps, &rr);
            ref::expect_close(out.data(), want, kRel, kAbs, "rmsnorm out");
            ref::expect_close(rstd.data(), rr, kRel, 0, "rmsnorm rstd");
        }
    }
}

// Qwen3's QK norm: each Q head normalized with wq, each K head with wk, V untouched; raw holds
// the heads as they came in, bit for bit.
TEST(CpuForward, QkNorm) {
    ref::CpuBackend be;
    struct S {
        int N, NH, NKV, HS;
    };
    for (S s : {S{5, 4, 2, 8}, S{3, 2, 2, 5}, S{1, 1, 1, 1}, S{7, 8, 1, 64}}) {
        SCOPED_TRACE("N=" + std::to_string(s.N) + " NH=" + std::to_string(s.NH) +
                     " NKV=" + std::to_string(s.NKV) + " HS=" + std::to_string(s.HS));
        const int H = s.NH + s.NKV;
        const size_t n = (size_t)s.N * (s.NH + 2 * s.NKV) * s.HS;
        FVec qkv = ref::randn(n, 86, 2.0f), wq = ref::randn(s.HS, 87), wk = ref::randn(s.HS, 88);
        FVec in = qkv, raw((size_t)s.N * H * s.HS, NAN), rstd((size_t)s.N * H, NAN);
        ASSERT_EQ(tpd_kern_qk_norm_fwd(be.b, qkv.data(), raw.data(), rstd.data(), wq.data(),
                                       wk.data(), s.N, s.NH, s.NKV, s.HS, 1e-6),
                  TPD_OK);
        Vec rr;
        Vec want = ref::qk_norm(ref::to_d(in), ref::to_d(wq), ref::to_d(wk), s.N, s.NH, s.NKV, s.HS,
                                1e-6, &rr);
        ref::expect_close(qkv.data(), want, kRel, kAbs, "qk_norm out");
        ref::expect_close(rstd.data(), rr, kRel, 0, "qk_norm rstd");
        const size_t ld = (size_t)(s.NH + 2 * s.NKV) * s.HS, qk = (size_t)H * s.HS;
        for (int t = 0; t < s.N; t++) {
            EXPECT_EQ(std::memcmp(raw.data() + t * qk, in.data() + t * ld, qk * 4), 0)
                << "qk_norm raw, row " << t;
            EXPECT_EQ(std::memcmp(qkv.data() + t * ld + qk, in.data() + t * ld + qk, (ld - qk) * 4),
                      0)
                << "qk_norm touched V, row " << t;
        }
    }
}

// eps as predicted: a constant row a gives rstd = 1/sqrt(a^2 + eps), a zero row 1/sqrt(eps).
TEST(CpuForward, RmsNormEpsIsHonoured) {
    ref::CpuBackend be;
    const int C = 5;
    FVec inp = {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    FVec w = {1.0f, -2.0f, 0.5f, 3.0f, 1.0f};
    for (float eps : {1e-6f, 0.01f, 0.25f}) {
        SCOPED_TRACE("eps=" + std::to_string(eps));
        FVec out(inp.size(), NAN), rstd(2, NAN);
        ASSERT_EQ(
            tpd_kern_rmsnorm_fwd(be.b, out.data(), rstd.data(), inp.data(), w.data(), 2, C, eps),
            TPD_OK);
        double a = inp[0];
        Vec want_rstd = {1.0 / std::sqrt(a * a + eps), 1.0 / std::sqrt((double)eps)};
        Vec want(inp.size(), 0.0);
        for (int c = 0; c < C; c++)
            want[c] = a * want_rstd[0] * w[c];
        ref::expect_close(rstd.data(), want_rstd, 1e-6, 0, "rmsnorm rstd(eps)");
        ref::expect_close(out.data(), want, 1e-6, 0, "rmsnorm out(eps)");
    }
}

struct RopeCase {
    int B, T, NH, NKV, HS;
    float base;
    int pos0;
};
// HS = 2 (one pair), 130 (crosses the kernel's 64-pair block), Llama 3's base, and a
// position offset far out.
const RopeCase kRopeCases[] = {{2, 7, 4, 2, 8, 10000.0f, 0},
                               {1, 5, 3, 3, 2, 10000.0f, 3},
                               {2, 3, 2, 1, 130, 10000.0f, 11},
                               {1, 9, 4, 1, 16, 500000.0f, 0},
                               {2, 4, 4, 2, 6, 500000.0f, 100000}};

TEST(CpuForward, Rope) {
    ref::CpuBackend be;
    for (RopeCase r : kRopeCases) {
        SCOPED_TRACE("T=" + std::to_string(r.T) + " NH=" + std::to_string(r.NH) +
                     " NKV=" + std::to_string(r.NKV) + " HS=" + std::to_string(r.HS) +
                     " pos0=" + std::to_string(r.pos0));
        const int C3 = (r.NH + 2 * r.NKV) * r.HS, N = r.B * r.T;
        FVec qkv = ref::randn((size_t)N * C3, 86), x = qkv;
        ASSERT_EQ(tpd_kern_rope_fwd(be.b, x.data(), r.B, r.T, r.NH, r.NKV, r.HS, r.base, r.pos0),
                  TPD_OK);
        Vec want = ref::rope(ref::to_d(qkv), r.B, r.T, r.NH, r.NKV, r.HS, r.base, r.pos0);
        ref::expect_close(x.data(), want, 1e-6, 1e-6, "rope");
        for (int n = 0; n < N; n++) { // V untouched, to the bit
            size_t v = (size_t)n * C3 + (size_t)(r.NH + r.NKV) * r.HS;
            ASSERT_EQ(std::memcmp(&x[v], &qkv[v], (size_t)r.NKV * r.HS * 4), 0) << "row " << n;
        }
    }
}

// The layout by hand: pairs are (i, i + HS/2) (rotate half, not interleaved), and pair i
// turns by p * base^(-2i/HS): with HS = 4, base = 100 and p = pos0 + t = 10, pair 1 turns
// by 10 * 100^(-1/2) = 1 radian and pair 0 by 10.
TEST(CpuForward, RopeRotatesHalvesByTheDocumentedAngles) {
    ref::CpuBackend be;
    const int NH = 1, NKV = 1, HS = 4, C3 = (NH + 2 * NKV) * HS;
    FVec x(C3, 0.0f);
    x[1] = 1.0f;      // Q pair 1: (1, 0)
    x[HS + 0] = 1.0f; // K pair 0: (1, 0)
    x[HS + 2] = 2.0f; //           (1, 2)
    ASSERT_EQ(tpd_kern_rope_fwd(be.b, x.data(), 1, 1, NH, NKV, HS, 100.0f, 10), TPD_OK);
    Vec want(C3, 0.0);
    want[1] = std::cos(1.0), want[3] = std::sin(1.0);
    want[HS + 0] = std::cos(10.0) - 2 * std::sin(10.0);
    want[HS + 2] = std::sin(10.0) + 2 * std::cos(10.0);
    ref::expect_close(x.data(), want, 1e-7, 1e-7, "rope by hand");
}

// Position pos0 + t depends on t only through the sum: rope of a sequence at pos0 = k is,
// to the bit, rows k.. of rope of the longer sequence at pos0 = 0.
TEST(CpuForward, RopePositionOffsetShiftsPositions) {
    ref::CpuBackend be;
    const int B = 2, T = 12, NH = 4, NKV = 2, HS = 8, C3 = (NH + 2 * NKV) * HS;
    FVec whole = ref::randn((size_t)B * T * C3, 87);
    for (int k : {1, 5, 11}) {
        SCOPED_TRACE("k=" + std::to_string(k));
        FVec tail((size_t)B * (T - k) * C3);
        for (int b = 0; b < B; b++)
            std::memcpy(&tail[(size_t)b * (T - k) * C3], &whole[((size_t)b * T + k) * C3],
                        (size_t)(T - k) * C3 * 4);
        FVec rot = whole;
        ASSERT_EQ(tpd_kern_rope_fwd(be.b, rot.data(), B, T, NH, NKV, HS, 10000.0f, 0), TPD_OK);
        ASSERT_EQ(tpd_kern_rope_fwd(be.b, tail.data(), B, T - k, NH, NKV, HS, 10000.0f, k), TPD_OK);
        for (int b = 0; b < B; b++)
            EXPECT_EQ(std::memcmp(&tail[(size_t)b * (T - k) * C3], &rot[((size_t)b * T + k) * C3],
                                  (size_t)(T - k) * C3 * 4),
                      0)
                << "batch row " << b;
    }
}

// The backward is the transposed rotation: it keeps the norm of every rotated pair, undoes
// the forward, and is the forward's adjoint (<R x, y> = <x, R^T y>).
TEST(CpuForward, RopeBackwardIsTheInverseRotation) {
    ref::CpuBackend be;
    const int B = 2, T = 9, NH = 4, NKV = 1, HS = 10, C3 = (NH + 2 * NKV) * HS, half = HS / 2;
    const float base = 10000.0f;
    const int pos0 = 7;
    FVec x = ref::randn((size_t)B * T * C3, 88), y = ref::randn(x.size(), 89);
    FVec rx = x, ry = y;
    ASSERT_EQ(tpd_kern_rope_fwd(be.b, rx.data(), B, T, NH, NKV, HS, base, pos0), TPD_OK);
    ASSERT_EQ(tpd_kern_rope_bwd(be.b, ry.data(), B, T, NH, NKV, HS, base, pos0), TPD_OK);
    Vec pair_norm(x.size() / 2), want_norm(x.size() / 2);
    size_t np = 0;
    for (int n = 0; n < B * T; n++)
        for (int h = 0; h < NH + 2 * NKV; h++)
            for (int i = 0; i < half; i++, np++) {
                size_t a = (size_t)n * C3 + (size_t)h * HS + i;
                want_norm[np] = std::hypot((double)y[a], (double)y[a + half]);
                pair_norm[np] = std::hypot((double)ry[a], (double)ry[a + half]);
            }
    FVec pn(pair_norm.begin(), pair_norm.end());
    ref::expect_close(pn.data(), want_norm, 1e-6, 1e-7, "pair norms kept");
    EXPECT_NEAR(ref::dot(ref::to_d(rx), ref::to_d(y)), ref::dot(ref::to_d(x), ref::to_d(ry)),
                1e-5 * std::sqrt((double)x.size()))
        << "adjoint";
    FVec back = rx;
    ASSERT_EQ(tpd_kern_rope_bwd(be.b, back.data(), B, T, NH, NKV, HS, base, pos0), TPD_OK);
    ref::expect_close(back.data(), ref::to_d(x), 1e-6, 1e-6, "bwd(fwd(x)) = x");
}

TEST(CpuForward, RopeRejectsBadArguments) {
    ref::CpuBackend be;
    FVec x((size_t)2 * 3 * (4 + 2 * 2) * 6, 7.0f); // room for every call below
    struct {
        int NH, NKV, HS;
        float base;
        int pos0;
        const char *why;
    } bad[] = {{4, 2, 5, 10000.0f, 0, "odd HS"},
               {4, 3, 6, 10000.0f, 0, "NKV does not divide NH"},
               {4, 0, 6, 10000.0f, 0, "no K/V head"},
               {4, 2, 6, 0.0f, 0, "base 0"},
               {4, 2, 6, -10.0f, 0, "negative base"},
               {4, 2, 6, 10000.0f, -1, "negative position"},
               {4, 2, 6, 10000.0f, 2147483647, "positions past INT_MAX"}};
    for (auto c : bad) {
        SCOPED_TRACE(c.why);
        EXPECT_EQ(tpd_kern_rope_fwd(be.b, x.data(), 2, 3, c.NH, c.NKV, c.HS, c.base, c.pos0),
                  TPD_ERR_INVALID);
        EXPECT_EQ(tpd_kern_rope_bwd(be.b, x.data(), 2, 3, c.NH, c.NKV, c.HS, c.base, c.pos0),
                  TPD_ERR_INVALID);
    }
    for (float v : x)
        ASSERT_EQ(v, 7.0f) << "written on a rejected call";
    // The last position may be INT_MAX itself; T = 0 and B = 0 are no-ops.
    EXPECT_EQ(tpd_kern_rope_fwd(be.b, x.data(), 1, 1, 4, 2, 6, 10000.0f, 2147483647), TPD_OK);
    EXPECT_EQ(tpd_kern_rope_fwd(be.b, x.data(), 2, 0, 4, 2, 6, 10000.0f, 0), TPD_OK);
    EXPECT_EQ(tpd_kern_rope_fwd(be.b, x.data(), 0, 3, 4, 2, 6, 10000.0f, 0), TPD_OK);
}

TEST(CpuForward, SwiGlu) {
    ref::CpuBackend be;
    for (auto [N, F] : {std::pair{7, 13}, std::pair{1, 1}, std::pair{33, 64}}) {
        SCOPED_TRACE("N=" + std::to_string(N) + " F=" + std::to_string(F));
        FVec inp = ref::randn((size_t)N * 2 * F, 90, 3.0f);
        inp[0] = 0.0f; // silu(0) = 0
        if (F > 2) {
            inp[1] = 40.0f;  // silu(x) -> x
            inp[2] = -40.0f; // silu(x) -> 0 from below
        }
        FVec out((size_t)N * F, NAN);
        ASSERT_EQ(tpd_kern_swiglu_fwd(be.b, out.data(), inp.data(), N, F), TPD_OK);
        ref::expect_close(out.data(), ref::swiglu(ref::to_d(inp), N, F), kRel, kAbs, "swiglu");
    }
    FVec x(4, 1.0f), o(2);
    EXPECT_EQ(tpd_kern_swiglu_fwd(be.b, o.data(), x.data(), 2, 0), TPD_ERR_INVALID);
    EXPECT_EQ(tpd_kern_swiglu_bwd(be.b, x.data(), x.data(), o.data(), -1, 1), TPD_ERR_INVALID);
    EXPECT_EQ(tpd_kern_rmsnorm_fwd(be.b, o.data(), o.data(), x.data(), x.data(), 2, 0, 1e-5f),
              TPD_ERR_INVALID);
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

// The running sum of squares over slices equals the host's sum of each slice's sumsq, in
// call order, bit for bit; taking it empties it.
TEST(CpuReduce, SumsqAccumulatesSlicesAndTakeEmpties) {
    ref::CpuBackend be;
    FVec x = ref::randn(9001, 29);
    const size_t cuts[] = {0, 17, 4096, 4100, 9001};
    double host = 0.0;
    for (int i = 0; i + 1 < 5; i++) {
        double s = 0.0;
        ASSERT_EQ(
            tpd_kern_sumsq(be.b, x.data() + cuts[i], TPD_DTYPE_F32, cuts[i + 1] - cuts[i], &s),
            TPD_OK);
        host += s;
        ASSERT_EQ(
            tpd_kern_sumsq_acc(be.b, x.data() + cuts[i], TPD_DTYPE_F32, cuts[i + 1] - cuts[i]),
            TPD_OK);
    }
    double acc = -1.0;
    ASSERT_EQ(tpd_kern_sumsq_take(be.b, &acc), TPD_OK);
    EXPECT_EQ(acc, host);
    ASSERT_EQ(tpd_kern_sumsq_take(be.b, &acc), TPD_OK);
    EXPECT_EQ(acc, 0.0);
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

// ---- plain SGD and DiLoCo's outer step ----

// Double reference of kernels.h's SGD, one step per gradient.
Vec sgd_ref(const FVec &w0, const std::vector<FVec> &grads, double lr, double wd, double gscale) {
    Vec w = ref::to_d(w0);
    for (const FVec &gr : grads)
        for (size_t i = 0; i < w.size(); i++)
            w[i] -= lr * (gr[i] * gscale + wd * w[i]);
    return w;
}

TEST(CpuSgd, TwoStepsMatchTheDoubleReferenceWithAndWithoutMaster) {
    ref::CpuBackend be;
    const size_t n = 1037; // not a multiple of 8
    const float lr = 0.05f, wd = 0.1f, gscale = 0.5f;
    FVec w0 = ref::randn(n, 300);
    std::vector<FVec> grads = {ref::randn(n, 301), ref::randn(n, 302)};
    Vec want = sgd_ref(w0, grads, lr, wd, gscale);

    // Without master: param itself is updated.
    FVec w = w0;
    for (const FVec &gr : grads)
        ASSERT_EQ(tpd_kern_sgd(be.b, w.data(), nullptr, gr.data(), n, lr, wd, gscale), TPD_OK);
    ref::expect_close(w.data(), want, 1e-6, 1e-6, "sgd param");

    // With master: master is updated and param becomes a copy of it.
    FVec param(n, NAN), master = w0;
    for (const FVec &gr : grads)
        ASSERT_EQ(tpd_kern_sgd(be.b, param.data(), master.data(), gr.data(), n, lr, wd, gscale),
                  TPD_OK);
    ref::expect_close(master.data(), want, 1e-6, 1e-6, "sgd master");
    EXPECT_EQ(std::memcmp(param.data(), master.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(master.data(), w.data(), n * 4), 0); // same arithmetic either way

    // Weight decay alone (zero gradient): w *= 1 - lr*wd, as L2 on the gradient.
    FVec wz = {2.0f}, gz = {0.0f};
    ASSERT_EQ(tpd_kern_sgd(be.b, wz.data(), nullptr, gz.data(), 1, lr, wd, gscale), TPD_OK);
    EXPECT_NEAR(wz[0], 2.0 * (1 - 0.05 * 0.1), 1e-7);
}

TEST(CpuOuterStep, DeltaIsSyncMinusW) {
    ref::CpuBackend be;
    const size_t n = 1037;
    FVec sync = ref::randn(n, 310), w = ref::randn(n, 311), delta(n, NAN);
    ASSERT_EQ(tpd_kern_outer_delta(be.b, delta.data(), sync.data(), w.data(), n), TPD_OK);
    Vec want(n);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)sync[i] - w[i];
    ref::expect_close(delta.data(), want, 1e-7, 1e-12, "outer_delta");
}

// Double reference of kernels.h's outer Nesterov step, one step per delta.
struct NesterovRef {
    Vec sync, mom;
};
NesterovRef nesterov_ref(const FVec &sync0, const FVec &mom0, const std::vector<FVec> &deltas,
                         double lr, double momentum, double scale) {
    NesterovRef r{ref::to_d(sync0), ref::to_d(mom0)};
    for (const FVec &dl : deltas)
        for (size_t i = 0; i < r.sync.size(); i++) {
            double d = dl[i] * scale;
            r.mom[i] = momentum * r.mom[i] + d;
            r.sync[i] -= lr * (d + momentum * r.mom[i]);
        }
    return r;
}

TEST(CpuOuterStep, NesterovTwoStepsCarryTheMomentumWithAndWithoutMaster) {
    ref::CpuBackend be;
    const size_t n = 1037;
    const float lr = 0.7f, momentum = 0.9f, scale = 0.5f;
    FVec sync0 = ref::randn(n, 320), mom0 = ref::randn(n, 321, 0.1f);
    std::vector<FVec> deltas = {ref::randn(n, 322, 0.05f), ref::randn(n, 323, 0.05f)};
    NesterovRef want = nesterov_ref(sync0, mom0, deltas, lr, momentum, scale);

    // Without master: param (fp32) follows sync.
    FVec sync = sync0, mom = mom0, param(n, NAN);
    for (const FVec &dl : deltas)
        ASSERT_EQ(tpd_kern_outer_nesterov(be.b, param.data(), nullptr, sync.data(), mom.data(),
                                          dl.data(), n, lr, momentum, scale),
                  TPD_OK);
    ref::expect_close(sync.data(), want.sync, 1e-6, 1e-6, "outer_nesterov sync");
    ref::expect_close(mom.data(), want.mom, 1e-6, 1e-6, "outer_nesterov mom");
    EXPECT_EQ(std::memcmp(param.data(), sync.data(), n * 4), 0);

    // With master: master and param both continue from sync.
    FVec sync2 = sync0, mom2 = mom0, param2(n, NAN), master(n, NAN);
    for (const FVec &dl : deltas)
        ASSERT_EQ(tpd_kern_outer_nesterov(be.b, param2.data(), master.data(), sync2.data(),
                                          mom2.data(), dl.data(), n, lr, momentum, scale),
                  TPD_OK);
    EXPECT_EQ(std::memcmp(sync2.data(), sync.data(), n * 4), 0); // same arithmetic either way
    EXPECT_EQ(std::memcmp(mom2.data(), mom.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(master.data(), sync2.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(param2.data(), sync2.data(), n * 4), 0);
}

// lr 1, momentum 0 and scale 1/R turn the outer step into averaging: with delta the sum
// over R replicas of sync - w_r, sync becomes the mean of the w_r.
TEST(CpuOuterStep, UnitStepWithoutMomentumAveragesTheReplicas) {
    ref::CpuBackend be;
    const size_t n = 1037;
    const int R = 2;
    FVec sync = ref::randn(n, 330), mom(n, 0.0f), param(n, NAN), sum(n, 0.0f), delta(n);
    std::vector<FVec> ws = {ref::randn(n, 331), ref::randn(n, 332)};
    for (const FVec &w : ws) {
        ASSERT_EQ(tpd_kern_outer_delta(be.b, delta.data(), sync.data(), w.data(), n), TPD_OK);
        for (size_t i = 0; i < n; i++)
            sum[i] += delta[i];
    }
    ASSERT_EQ(tpd_kern_outer_nesterov(be.b, param.data(), nullptr, sync.data(), mom.data(),
                                      sum.data(), n, 1.0f, 0.0f, 1.0f / R),
              TPD_OK);
    Vec mean(n);
    for (size_t i = 0; i < n; i++)
        mean[i] = ((double)ws[0][i] + ws[1][i]) / R;
    ref::expect_close(sync.data(), mean, 1e-5, 1e-5, "outer step with lr 1, momentum 0");
    ref::expect_close(param.data(), mean, 1e-5, 1e-5, "param after the averaging step");
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

// Llama's ops: rmsnorm's dw accumulates, every input gradient is overwritten (NaN-filled
// before), and the aliasing the cpu kernels allow gives the bits of separate buffers.
TEST(CpuBackwardSemantics, LlamaOpsAccumulateOverwriteAndAlias) {
    ref::CpuBackend be;
    const int N = 7, C = 13;

    // rmsnorm: dw accumulates, dinp overwritten, dinp may alias dout
    FVec inp = ref::randn((size_t)N * C, 91), w = ref::randn(C, 92);
    FVec out((size_t)N * C), rstd(N), dout = ref::randn((size_t)N * C, 93);
    ASSERT_EQ(
        tpd_kern_rmsnorm_fwd(be.b, out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-5f),
        TPD_OK);
    FVec dw(C, 0.0f), d1((size_t)N * C, NAN), d2((size_t)N * C, NAN);
    ASSERT_EQ(tpd_kern_rmsnorm_bwd(be.b, d1.data(), dw.data(), dout.data(), inp.data(), w.data(),
                                   rstd.data(), N, C),
              TPD_OK);
    FVec dw1 = dw;
    ASSERT_EQ(tpd_kern_rmsnorm_bwd(be.b, d2.data(), dw.data(), dout.data(), inp.data(), w.data(),
                                   rstd.data(), N, C),
              TPD_OK);
    expect_doubled(dw, dw1, "rmsnorm dw");
    EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * 4), 0) << "rmsnorm dinp";
    for (float x : d1)
        ASSERT_FALSE(std::isnan(x)) << "rmsnorm dinp not overwritten";
    FVec alias = dout, adw(C, 0.0f);
    ASSERT_EQ(tpd_kern_rmsnorm_bwd(be.b, alias.data(), adw.data(), alias.data(), inp.data(),
                                   w.data(), rstd.data(), N, C),
              TPD_OK);
    EXPECT_EQ(std::memcmp(alias.data(), d1.data(), d1.size() * 4), 0) << "rmsnorm aliased";
    EXPECT_EQ(std::memcmp(adw.data(), dw1.data(), C * 4), 0) << "rmsnorm aliased dw";

    // swiglu: out and dinp overwritten; dinp may alias inp (gate and up read first)
    const int F = 11;
    FVec gu = ref::randn((size_t)N * 2 * F, 94, 2.0f), sdout = ref::randn((size_t)N * F, 95);
    FVec sout((size_t)N * F, NAN), sd((size_t)N * 2 * F, NAN);
    ASSERT_EQ(tpd_kern_swiglu_fwd(be.b, sout.data(), gu.data(), N, F), TPD_OK);
    ASSERT_EQ(tpd_kern_swiglu_bwd(be.b, sd.data(), gu.data(), sdout.data(), N, F), TPD_OK);
    for (float x : sout)
        ASSERT_FALSE(std::isnan(x)) << "swiglu out not overwritten";
    for (float x : sd)
        ASSERT_FALSE(std::isnan(x)) << "swiglu dinp not overwritten";
    FVec inplace = gu;
    ASSERT_EQ(tpd_kern_swiglu_bwd(be.b, inplace.data(), inplace.data(), sdout.data(), N, F),
              TPD_OK);
    EXPECT_EQ(std::memcmp(inplace.data(), sd.data(), sd.size() * 4), 0) << "swiglu aliased";

    // rope_bwd works in place and leaves V's gradient untouched
    const int NH = 4, NKV = 2, HS = 6, C3 = (NH + 2 * NKV) * HS;
    FVec dq = ref::randn((size_t)N * C3, 96), dq0 = dq;
    ASSERT_EQ(tpd_kern_rope_bwd(be.b, dq.data(), 1, N, NH, NKV, HS, 10000.0f, 2), TPD_OK);
    for (int n = 0; n < N; n++) {
        size_t v = (size_t)n * C3 + (size_t)(NH + NKV) * HS;
        ASSERT_EQ(std::memcmp(&dq[v], &dq0[v], (size_t)NKV * HS * 4), 0) << "row " << n;
        EXPECT_NE(std::memcmp(&dq[(size_t)n * C3 + HS / 2], &dq0[(size_t)n * C3 + HS / 2], 4), 0)
            << "row " << n << " not rotated";
    }

    // grouped-query attention: all of dqkv, K/V columns included, is overwritten
    const int AT = 9, AC3 = (NH + 2 * NKV) * HS;
    FVec qkv = ref::randn((size_t)AT * AC3, 97), aout((size_t)AT * NH * HS);
    FVec saved((size_t)NH * AT * AT), adout = ref::randn(aout.size(), 98);
    ASSERT_EQ(
        tpd_kern_attention_fwd(be.b, aout.data(), saved.data(), qkv.data(), 1, AT, NH, NKV, HS),
        TPD_OK);
    FVec g1(qkv.size(), NAN), g2(qkv.size(), NAN);
    ASSERT_EQ(tpd_kern_attention_bwd(be.b, g1.data(), adout.data(), qkv.data(), aout.data(),
                                     saved.data(), 1, AT, NH, NKV, HS),
              TPD_OK);
    ASSERT_EQ(tpd_kern_attention_bwd(be.b, g2.data(), adout.data(), qkv.data(), aout.data(),
                                     saved.data(), 1, AT, NH, NKV, HS),
              TPD_OK);
    for (float x : g1)
        ASSERT_FALSE(std::isnan(x)) << "gqa dqkv not overwritten";
    EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * 4), 0);
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

// ---- Llama's ops: determinism ----

// The reductions (rmsnorm's dw over rows, grouped-query dK/dV over a group's heads) and
// the rest give the same bits for every thread count.
TEST(CpuLlamaOps, BitIdenticalAcrossRunsAndThreadCounts) {
    const int N = 517, C = 200, F = 96;
    const int B = 2, T = 70, NH = 4, NKV = 2, HS = 8, C3 = (NH + 2 * NKV) * HS;
    FVec inp = ref::randn((size_t)N * C, 100), w = ref::randn(C, 101);
    FVec dout = ref::randn((size_t)N * C, 102), gu = ref::randn((size_t)N * 2 * F, 103, 2.0f);
    FVec sdout = ref::randn((size_t)N * F, 104), qkv = ref::randn((size_t)B * T * C3, 105);
    FVec adout = ref::randn((size_t)B * T * NH * HS, 106);
    std::vector<FVec> base;
    for (int threads : {4, 4, 1, 3, 2}) {
        SCOPED_TRACE("threads=" + std::to_string(threads));
        ref::CpuBackend be(threads);
        std::vector<FVec> got;
        FVec out((size_t)N * C), rstd(N), dinp((size_t)N * C), dw(C, 0.0f);
        ASSERT_EQ(
            tpd_kern_rmsnorm_fwd(be.b, out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-5f),
            TPD_OK);
        ASSERT_EQ(tpd_kern_rmsnorm_bwd(be.b, dinp.data(), dw.data(), dout.data(), inp.data(),
                                       w.data(), rstd.data(), N, C),
                  TPD_OK);
        FVec sout((size_t)N * F), sd((size_t)N * 2 * F);
        ASSERT_EQ(tpd_kern_swiglu_fwd(be.b, sout.data(), gu.data(), N, F), TPD_OK);
        ASSERT_EQ(tpd_kern_swiglu_bwd(be.b, sd.data(), gu.data(), sdout.data(), N, F), TPD_OK);
        FVec rq = qkv;
        ASSERT_EQ(tpd_kern_rope_fwd(be.b, rq.data(), B, T, NH, NKV, HS, 500000.0f, 3), TPD_OK);
        FVec aout((size_t)B * T * NH * HS), saved((size_t)B * NH * T * T), dq(qkv.size());
        ASSERT_EQ(
            tpd_kern_attention_fwd(be.b, aout.data(), saved.data(), rq.data(), B, T, NH, NKV, HS),
            TPD_OK);
        ASSERT_EQ(tpd_kern_attention_bwd(be.b, dq.data(), adout.data(), rq.data(), aout.data(),
                                         saved.data(), B, T, NH, NKV, HS),
                  TPD_OK);
        ASSERT_EQ(tpd_kern_rope_bwd(be.b, dq.data(), B, T, NH, NKV, HS, 500000.0f, 3), TPD_OK);
        got = {out, rstd, dinp, dw, sout, sd, rq, aout, saved, dq};
        if (base.empty()) {
            base = got;
            continue;
        }
        const char *names[] = {"rmsnorm out", "rstd",         "rmsnorm dinp", "rmsnorm dw",
                               "swiglu out",  "swiglu dinp",  "rope",         "gqa out",
                               "gqa saved",   "gqa+rope dqkv"};
        for (size_t i = 0; i < got.size(); i++)
            EXPECT_EQ(std::memcmp(base[i].data(), got[i].data(), got[i].size() * 4), 0) << names[i];
    }
}

} // namespace
