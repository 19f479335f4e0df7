// The cuda backend against the cpu backend (the fp32 reference), op by op, on random
// inputs. Label `gpu`: every test skips when no CUDA device is visible. Attention has its
// own file (test_cuda_attention.cc).
//
// Inputs are rounded to bf16 first and the same rounded values go to both backends, so
// the differences measured are those of bf16 outputs and intermediates only (tolerances:
// cuda_test_util.h).
#include "kernels/cuda_test_util.h"

// Built twice: as the gpu test, and with TPD_KERNEL_TWIN_CPU as the cpu backend's bf16 test
// (the same cases and tolerances with the cpu backend under test).
#ifdef TPD_KERNEL_TWIN_CPU
#define CudaKernels CpuBf16Kernels
#endif

namespace {

using namespace cuda_test;

// ---- embedding ----

TEST(CudaKernels, EmbedForwardBackwardVocabParallel) {
    SKIP_WITHOUT_GPU();
    Be g(true), c(false);
    const int N = 300, C = 64, v0 = 100, Vl = 50;
    IVec tok = randint(N, 1, 80, 170); // some below v0, some past v0+Vl
    for (int i = 0; i < 40; i++)
        tok[i] = 120; // a hot row
    FVec wte = randn((size_t)Vl * C, 2), dout = randn((size_t)N * C, 3);
    FVec dw0 = randn((size_t)Vl * C, 4, 0.1f); // accumulate onto this

    void *go = g.zeros((size_t)N * C), *co = c.zeros((size_t)N * C);
    ASSERT_EQ(tpd_kern_embed_fwd(g.b, go, g.upi(tok), g.up(wte), N, C, v0, Vl), TPD_OK);
    ASSERT_EQ(tpd_kern_embed_fwd(c.b, co, c.upi(tok), c.up(wte), N, C, v0, Vl), TPD_OK);
    expect_close(g.down(go, (size_t)N * C), c.down(co, (size_t)N * C), 0.0f, "embed_fwd");

    void *gdw = g.up(dw0), *cdw = c.up(dw0);
    int32_t *gt = g.upi(tok);
    void *gd = g.up(dout);
    ASSERT_EQ(tpd_kern_embed_bwd(g.b, gdw, gd, gt, N, C, v0, Vl), TPD_OK);
    ASSERT_EQ(tpd_kern_embed_bwd(c.b, cdw, c.up(dout), c.upi(tok), N, C, v0, Vl), TPD_OK);
    expect_close(g.down(gdw, (size_t)Vl * C), c.down(cdw, (size_t)Vl * C), kRtolBf16, "embed_bwd");
}

TEST(CudaKernels, EmbedBackwardIsBitDeterministic) {
    SKIP_WITHOUT_GPU();
    Be g(true);
    const int N = 4096, C = 768, Vl = 1000;
    IVec tok = randint(N, 5, 0, 200); // heavy repetition
    FVec dout = randn((size_t)N * C, 6);
    int32_t *t = g.upi(tok);
    void *d = g.up(dout);
    std::vector<uint8_t> first;
    for (int rep = 0; rep < 3; rep++) {
        void *dw = g.zeros((size_t)Vl * C);
        ASSERT_EQ(tpd_kern_embed_bwd(g.b, dw, d, t, N, C, 0, Vl), TPD_OK);
        ASSERT_EQ(tpd_kern_synchronize(g.b), TPD_OK);
        auto bits = g.bytes(dw, (size_t)Vl * C * 2);
        if (rep == 0)
            first = bits;
        else
            EXPECT_EQ(bits, first) << "embed_bwd differs between identical runs";
    }
}

TEST(CudaKernels, PositionForwardBackward) {
    SKIP_WITHOUT_GPU();
    Be g(true), c(false);
    const int B = 3, T = 17, C = 40;
    FVec x = randn((size_t)B * T * C, 7), wpe = randn((size_t)T * C, 8),
         d0 = randn((size_t)T * C, 9);
    void *gx = g.up(x), *cx = c.up(x);
    ASSERT_EQ(tpd_kern_pos_fwd(g.b, gx, g.up(wpe), B, T, C), TPD_OK);
    ASSERT_EQ(tpd_kern_pos_fwd(c.b, cx, c.up(wpe), B, T, C), TPD_OK);
    expect_close(g.down(gx, x.size()), c.down(cx, x.size()), kRtolBf16, "pos_fwd");
    void *gd = g.up(d0), *cd = c.up(d0);
    ASSERT_EQ(tpd_kern_pos_bwd(g.b, gd, g.up(x), B, T, C), TPD_OK);
    ASSERT_EQ(tpd_kern_pos_bwd(c.b, cd, c.up(x), B, T, C), TPD_OK);
    expect_close(g.down(gd, d0.size()), c.down(cd, d0.size()), kRtolBf16, "pos_bwd");
}

// ---- layernorm ----

void layernorm_case(int N, int C) {
    Be g(true), c(false);
    FVec x = randn((size_t)N * C, 10), w = randn(C, 11), bb = randn(C, 12),
         dy = randn((size_t)N * C, 13);
    for (auto &v : x)
        v = v + 3.0f; // a row mean far from 0
    x = round_bf16(x);
    FVec dw0 = randn(C, 14), db0 = randn(C, 15);
    void *gx = g.up(x), *gw = g.up(w), *gb = g.up(bb);
    void *cx = c.up(x), *cw = c.up(w), *cb = c.up(bb);
    void *go = g.zeros((size_t)N * C), *co = c.zeros((size_t)N * C);
    float *gm = (float *)g.zeros(N, TPD_DTYPE_F32), *gr = (float *)g.zeros(N, TPD_DTYPE_F32);
    float *cm = (float *)c.zeros(N, TPD_DTYPE_F32), *cr = (float *)c.zeros(N, TPD_DTYPE_F32);
    ASSERT_EQ(tpd_kern_layernorm_fwd(g.b, go, gm, gr, gx, gw, gb, N, C, 1e-5f), TPD_OK);
    ASSERT_EQ(tpd_kern_layernorm_fwd(c.b, co, cm, cr, cx, cw, cb, N, C, 1e-5f), TPD_OK);
    expect_close(g.down(go, x.size()), c.down(co, x.size()), kRtolBf16, "layernorm_fwd out");
    expect_close(g.downf(gm, N), c.downf(cm, N), 1e-5f, "layernorm_fwd mean");
    expect_close(g.downf(gr, N), c.downf(cr, N), 1e-4f, "layernorm_fwd rstd");

    void *gdx = g.zeros(x.size()), *cdx = c.zeros(x.size());
    void *gdw = g.up(dw0), *gdb = g.up(db0), *cdw = c.up(dw0), *cdb = c.up(db0);
    ASSERT_EQ(tpd_kern_layernorm_bwd(g.b, gdx, gdw, gdb, g.up(dy), gx, gw, gm, gr, N, C), TPD_OK);
    ASSERT_EQ(tpd_kern_layernorm_bwd(c.b, cdx, cdw, cdb, c.up(dy), cx, cw, cm, cr, N, C), TPD_OK);
    expect_close(g.down(gdx, x.size()), c.down(cdx, x.size()), kRtolBf16, "layernorm_bwd dinp");
    expect_close(g.down(gdw, C), c.down(cdw, C), kRtolBf16, "layernorm_bwd dw");
    expect_close(g.down(gdb, C), c.down(cdb, C), kRtolBf16, "layernorm_bwd db");
}

TEST(CudaKernels, LayerNormVectorized) {
    SKIP_WITHOUT_GPU();
    layernorm_case(77, 768);
}
TEST(CudaKernels, LayerNormOddWidth) {
    SKIP_WITHOUT_GPU();
    layernorm_case(33, 100);
}
TEST(CudaKernels, LayerNormWide) {
    SKIP_WITHOUT_GPU();
    layernorm_case(64, 1600); // GPT-2 1.5B width: more than 48 KiB of shared memory
}

// ---- rmsnorm ----

// w and dw start `off` elements into their buffers (views into the flat parameter buffer
// start at any element), which turns the 16-byte packs off.
void rmsnorm_case(int N, int C, tpd_dtype dt, float rtol, int off = 0) {
    Be g(true, dt), c(false, dt);
    FVec x = randn((size_t)N * C, 200, 2.0f), w = randn(C, 201), dy = randn((size_t)N * C, 202);
    FVec dw0 = randn(C, 203);
    auto shifted = [&](const FVec &v) {
        FVec r(off, 0.0f);
        r.insert(r.end(), v.begin(), v.end());
        return r;
    };
    const size_t es = tpd_dtype_size(dt);
    void *gx = g.up(x), *gw = (char *)g.up(shifted(w)) + off * es;
    void *cx = c.up(x), *cw = c.up(w);
    void *go = g.zeros((size_t)N * C), *co = c.zeros((size_t)N * C);
    float *gr = (float *)g.zeros(N, TPD_DTYPE_F32), *cr = (float *)c.zeros(N, TPD_DTYPE_F32);
    ASSERT_EQ(tpd_kern_rmsnorm_fwd(g.b, go, gr, gx, gw, N, C, 1e-5f), TPD_OK);
    ASSERT_EQ(tpd_kern_rmsnorm_fwd(c.b, co, cr, cx, cw, N, C, 1e-5f), TPD_OK);
    expect_close(g.down(go, x.size()), c.down(co, x.size()), rtol, "rmsnorm_fwd out");
    expect_close(g.downf(gr, N), c.downf(cr, N), 1e-4f, "rmsnorm_fwd rstd");

    void *gdx = g.zeros(x.size()), *cdx = c.zeros(x.size());
    void *gdw = (char *)g.up(shifted(dw0)) + off * es, *cdw = c.up(dw0);
    ASSERT_EQ(tpd_kern_rmsnorm_bwd(g.b, gdx, gdw, g.up(dy), gx, gw, gr, N, C), TPD_OK);
    ASSERT_EQ(tpd_kern_rmsnorm_bwd(c.b, cdx, cdw, c.up(dy), cx, cw, cr, N, C), TPD_OK);
    expect_close(g.down(gdx, x.size()), c.down(cdx, x.size()), rtol, "rmsnorm_bwd dinp");
    expect_close(g.down(gdw, C), c.down(cdw, C), rtol, "rmsnorm_bwd dw (accumulated)");
}

TEST(CudaKernels, RmsNormVectorized) {
    SKIP_WITHOUT_GPU();
    rmsnorm_case(77, 768, TPD_DTYPE_BF16, kRtolBf16);
}
TEST(CudaKernels, RmsNormOddWidth) {
    SKIP_WITHOUT_GPU();
    rmsnorm_case(33, 100, TPD_DTYPE_BF16, kRtolBf16);
}
TEST(CudaKernels, RmsNormMisalignedWeight) {
    SKIP_WITHOUT_GPU();
    rmsnorm_case(40, 256, TPD_DTYPE_BF16, kRtolBf16, 3);
}
// Llama 3 70B's width, and more rows than one block of the weight-gradient partials.
TEST(CudaKernels, RmsNormLlamaWidthManyRows) {
    SKIP_WITHOUT_GPU();
    rmsnorm_case(300, 8192, TPD_DTYPE_BF16, kRtolBf16);
}
TEST(CudaKernels, RmsNormF32MatchesCpuTightly) {
    SKIP_WITHOUT_GPU();
    rmsnorm_case(65, 256, TPD_DTYPE_F32, kRtolF32);
    rmsnorm_case(270, 99, TPD_DTYPE_F32, kRtolF32);
}

TEST(CudaKernels, RmsNormBackwardIsBitDeterministic) {
    SKIP_WITHOUT_GPU();
    Be g(true);
    const int N = 1000, C = 1024;
    FVec x = randn((size_t)N * C, 210), w = randn(C, 211), dy = randn((size_t)N * C, 212);
    void *gx = g.up(x), *gw = g.up(w), *gd = g.up(dy), *go = g.zeros(x.size());
    float *gr = (float *)g.zeros(N, TPD_DTYPE_F32);
    ASSERT_EQ(tpd_kern_rmsnorm_fwd(g.b, go, gr, gx, gw, N, C, 1e-6f), TPD_OK);
    std::vector<uint8_t> first_dw, first_dx;
    for (int rep = 0; rep < 3; rep++) {
        void *dw = g.zeros(C), *dx = g.zeros(x.size());
        ASSERT_EQ(tpd_kern_rmsnorm_bwd(g.b, dx, dw, gd, gx, gw, gr, N, C), TPD_OK);
        ASSERT_EQ(tpd_kern_synchronize(g.b), TPD_OK);
        auto bw = g.bytes(dw, (size_t)C * 2), bx = g.bytes(dx, x.size() * 2);
        if (rep == 0) {
            first_dw = bw;
            first_dx = bx;
        } else {
            EXPECT_EQ(bw, first_dw) << "rmsnorm_bwd dw differs between identical runs";
            EXPECT_EQ(bx, first_dx) << "rmsnorm_bwd dinp differs between identical runs";
        }
    }
}

// ---- Qwen3's QK norm ----

// The Q and K heads of qkv normalized in place (V untouched), raw kept; the backward in place
// with dwq and dwk accumulated. Also bit-deterministic over repeats (the weight gradients
// are column sums over every head).
void qk_norm_case(int N, int NH, int NKV, int HS, tpd_dtype dt, float rtol) {
    Be g(true, dt), c(false, dt);
    const int H = NH + NKV;
    const size_t n = (size_t)N * (NH + 2 * NKV) * HS, nr = (size_t)N * H * HS;
    FVec x = randn(n, 220, 2.0f), wq = randn(HS, 221), wk = randn(HS, 222), dy = randn(n, 223);
    FVec dwq0 = randn(HS, 224), dwk0 = randn(HS, 225);
    void *gx = g.up(x), *cx = c.up(x), *gwq = g.up(wq), *gwk = g.up(wk), *cwq = c.up(wq),
         *cwk = c.up(wk);
    void *graw = g.zeros(nr), *craw = c.zeros(nr);
    float *gr = (float *)g.zeros((size_t)N * H, TPD_DTYPE_F32);
    float *cr = (float *)c.zeros((size_t)N * H, TPD_DTYPE_F32);
    ASSERT_EQ(tpd_kern_qk_norm_fwd(g.b, gx, graw, gr, gwq, gwk, N, NH, NKV, HS, 1e-6), TPD_OK);
    ASSERT_EQ(tpd_kern_qk_norm_fwd(c.b, cx, craw, cr, cwq, cwk, N, NH, NKV, HS, 1e-6), TPD_OK);
    expect_close(g.down(gx, n), c.down(cx, n), rtol, "qk_norm_fwd qkv");
    expect_close(g.down(graw, nr), c.down(craw, nr), rtol, "qk_norm_fwd raw");
    expect_close(g.downf(gr, (size_t)N * H), c.downf(cr, (size_t)N * H), 1e-4f, "qk_norm rstd");
    std::vector<uint8_t> first_dq, first_dx;
    for (int rep = 0; rep < 2; rep++) {
        void *gd = g.up(dy), *cd = c.up(dy);
        void *gdq = g.up(dwq0), *gdk = g.up(dwk0), *cdq = c.up(dwq0), *cdk = c.up(dwk0);
        ASSERT_EQ(tpd_kern_qk_norm_bwd(g.b, gd, gdq, gdk, graw, gwq, gwk, gr, N, NH, NKV, HS),
                  TPD_OK);
        ASSERT_EQ(tpd_kern_qk_norm_bwd(c.b, cd, cdq, cdk, craw, cwq, cwk, cr, N, NH, NKV, HS),
                  TPD_OK);
        expect_close(g.down(gd, n), c.down(cd, n), rtol, "qk_norm_bwd dqkv");
        expect_close(g.down(gdq, HS), c.down(cdq, HS), rtol, "qk_norm_bwd dwq (accumulated)");
        expect_close(g.down(gdk, HS), c.down(cdk, HS), rtol, "qk_norm_bwd dwk (accumulated)");
        ASSERT_EQ(tpd_kern_synchronize(g.b), TPD_OK);
        auto bq = g.bytes(gdq, (size_t)HS * tpd_dtype_size(dt)),
             bx = g.bytes(gd, n * tpd_dtype_size(dt));
        if (rep == 0) {
            first_dq = bq;
            first_dx = bx;
        } else {
            EXPECT_EQ(bq, first_dq) << "qk_norm_bwd dwq differs between identical runs";
            EXPECT_EQ(bx, first_dx) << "qk_norm_bwd dqkv differs between identical runs";
        }
    }
}

// Qwen3 8B's heads (32 query heads of 128 in 8 K/V groups, TP 4's share), an odd head size,
// and more heads than one lane pass of the weight gradient.
TEST(CudaKernels, QkNormQwen3Heads) {
    SKIP_WITHOUT_GPU();
    qk_norm_case(64, 8, 2, 128, TPD_DTYPE_BF16, kRtolBf16);
}
TEST(CudaKernels, QkNormOddHeadSize) {
    SKIP_WITHOUT_GPU();
    qk_norm_case(37, 3, 1, 40, TPD_DTYPE_BF16, kRtolBf16);
}
TEST(CudaKernels, QkNormF32MatchesCpuTightly) {
    SKIP_WITHOUT_GPU();
    qk_norm_case(50, 4, 4, 64, TPD_DTYPE_F32, kRtolF32);
}

// ---- matmul ----

void matmul_case(int N, int C, int OC, bool bias) {
    Be g(true), c(false);
    FVec x = randn((size_t)N * C, 20), w = randn((size_t)OC * C, 21, 0.1f), b = randn(OC, 22);
    FVec dy = randn((size_t)N * OC, 23), dw0 = randn((size_t)OC * C, 24), db0 = randn(OC, 25);
    void *gx = g.up(x), *gw = g.up(w), *gb = bias ? g.up(b) : nullptr;
    void *cx = c.up(x), *cw = c.up(w), *cb = bias ? c.up(b) : nullptr;
    void *go = g.zeros((size_t)N * OC), *co = c.zeros((size_t)N * OC);
    ASSERT_EQ(tpd_kern_matmul_fwd(g.b, go, gx, gw, gb, N, C, OC), TPD_OK);
    ASSERT_EQ(tpd_kern_matmul_fwd(c.b, co, cx, cw, cb, N, C, OC), TPD_OK);
    expect_close(g.down(go, (size_t)N * OC), c.down(co, (size_t)N * OC), kRtolBf16, "matmul_fwd");

    void *gdx = g.zeros((size_t)N * C), *cdx = c.zeros((size_t)N * C);
    void *gdw = g.up(dw0), *cdw = c.up(dw0);
    void *gdb = bias ? g.up(db0) : nullptr, *cdb = bias ? c.up(db0) : nullptr;
    ASSERT_EQ(tpd_kern_matmul_bwd(g.b, gdx, gdw, gdb, g.up(dy), gx, gw, N, C, OC), TPD_OK);
    ASSERT_EQ(tpd_kern_matmul_bwd(c.b, cdx, cdw, cdb, c.up(dy), cx, cw, N, C, OC), TPD_OK);
    expect_close(g.down(gdx, (size_t)N * C), c.down(cdx, (size_t)N * C), kRtolBf16,
                 "matmul_bwd dinp");
    expect_close(g.down(gdw, (size_t)OC * C), c.down(cdw, (size_t)OC * C), kRtolBf16,
                 "matmul_bwd dw (accumulated)");
    if (bias)
        expect_close(g.down(gdb, OC), c.down(cdb, OC), kRtolBf16, "matmul_bwd dbias (accumulated)");

    // ZB-H1's split on the GPU: B (no dw, dbias, inp) then W (no dinp) against the whole
    // call on the cpu backend
    void *sdx = g.zeros((size_t)N * C), *sdw = g.up(dw0), *sdb = bias ? g.up(db0) : nullptr;
    void *gdy = g.up(dy);
    ASSERT_EQ(tpd_kern_matmul_bwd(g.b, sdx, nullptr, nullptr, gdy, nullptr, gw, N, C, OC), TPD_OK);
    ASSERT_EQ(tpd_kern_matmul_bwd(g.b, nullptr, sdw, sdb, gdy, gx, gw, N, C, OC), TPD_OK);
    expect_close(g.down(sdx, (size_t)N * C), c.down(cdx, (size_t)N * C), kRtolBf16,
                 "matmul_bwd B dinp");
    expect_close(g.down(sdw, (size_t)OC * C), c.down(cdw, (size_t)OC * C), kRtolBf16,
                 "matmul_bwd W dw");
    if (bias) expect_close(g.down(sdb, OC), c.down(cdb, OC), kRtolBf16, "matmul_bwd W dbias");
}

TEST(CudaKernels, MatmulWithBias) {
    SKIP_WITHOUT_GPU();
    matmul_case(128, 96, 160, true);
}
TEST(CudaKernels, MatmulNoBiasOddShape) {
    SKIP_WITHOUT_GPU();
    matmul_case(37, 24, 40, false);
}

void matmul_gelu_case(int N, int C, int OC) {
    Be g(true), c(false);
    FVec x = randn((size_t)N * C, 30), w = randn((size_t)OC * C, 31, 0.2f), b = randn(OC, 32);
    void *go = g.zeros((size_t)N * OC), *gp = g.zeros((size_t)N * OC);
    void *co = c.zeros((size_t)N * OC), *cp = c.zeros((size_t)N * OC);
    ASSERT_EQ(tpd_kern_matmul_gelu_fwd(g.b, go, gp, g.up(x), g.up(w), g.up(b), N, C, OC), TPD_OK);
    ASSERT_EQ(tpd_kern_matmul_gelu_fwd(c.b, co, cp, c.up(x), c.up(w), c.up(b), N, C, OC), TPD_OK);
    expect_close(g.down(gp, (size_t)N * OC), c.down(cp, (size_t)N * OC), kRtolBf16,
                 "matmul_gelu pre");
    expect_close(g.down(go, (size_t)N * OC), c.down(co, (size_t)N * OC), kRtolBf16,
                 "matmul_gelu out");
}

TEST(CudaKernels, MatmulGeluEpilogue) {
    SKIP_WITHOUT_GPU();
    matmul_gelu_case(64, 48, 192);
}
TEST(CudaKernels, MatmulGeluOddWidthFallback) {
    SKIP_WITHOUT_GPU();
    matmul_gelu_case(16, 8, 20);
}

// Views into the flat parameter buffer start at any element: weights, biases and their
// gradients at odd bf16 offsets (2-byte aligned) must still work, with or without an
// epilogue.
TEST(CudaKernels, MatmulMisalignedParameterViews) {
    SKIP_WITHOUT_GPU();
    const int N = 64, C = 64, OC = 96, off = 3;
    Be g(true), c(false);
    FVec x = randn((size_t)N * C, 120), w = randn((size_t)OC * C, 121, 0.1f), b = randn(OC, 122);
    FVec dy = randn((size_t)N * OC, 123), dw0 = randn((size_t)OC * C, 124), db0 = randn(OC, 125);
    auto shifted = [&](const FVec &v) {
        FVec r(off, 0.0f);
        r.insert(r.end(), v.begin(), v.end());
        return r;
    };
    const size_t es = 2;
    char *gw = (char *)g.up(shifted(w)) + off * es, *gb = (char *)g.up(shifted(b)) + off * es;
    char *gdw = (char *)g.up(shifted(dw0)) + off * es, *gdb = (char *)g.up(shifted(db0)) + off * es;
    void *gx = g.up(x), *go = g.zeros((size_t)N * OC), *gp = g.zeros((size_t)N * OC);
    void *cx = c.up(x), *cw = c.up(w), *cb = c.up(b), *cdw = c.up(dw0), *cdb = c.up(db0);
    void *co = c.zeros((size_t)N * OC), *cp = c.zeros((size_t)N * OC);
    ASSERT_EQ(tpd_kern_matmul_fwd(g.b, go, gx, gw, gb, N, C, OC), TPD_OK);
    ASSERT_EQ(tpd_kern_matmul_fwd(c.b, co, cx, cw, cb, N, C, OC), TPD_OK);
    expect_close(g.down(go, (size_t)N * OC), c.down(co, (size_t)N * OC), kRtolBf16,
                 "misaligned matmul_fwd");
    ASSERT_EQ(tpd_kern_matmul_gelu_fwd(g.b, go, gp, gx, gw, gb, N, C, OC), TPD_OK);
    ASSERT_EQ(tpd_kern_matmul_gelu_fwd(c.b, co, cp, cx, cw, cb, N, C, OC), TPD_OK);
    expect_close(g.down(go, (size_t)N * OC), c.down(co, (size_t)N * OC), kRtolBf16,
                 "misaligned matmul_gelu out");
    void *gdx = g.zeros((size_t)N * C), *cdx = c.zeros((size_t)N * C);
    ASSERT_EQ(tpd_kern_matmul_bwd(g.b, gdx, gdw, gdb, g.up(dy), gx, gw, N, C, OC), TPD_OK);
    ASSERT_EQ(tpd_kern_matmul_bwd(c.b, cdx, cdw, cdb, c.up(dy), cx, cw, N, C, OC), TPD_OK);
    expect_close(g.down(gdx, (size_t)N * C), c.down(cdx, (size_t)N * C), kRtolBf16,
                 "misaligned matmul_bwd dinp");
    expect_close(g.down(gdw, (size_t)OC * C), c.down(cdw, (size_t)OC * C), kRtolBf16,
                 "misaligned matmul_bwd dw");
    expect_close(g.down(gdb, OC), c.down(cdb, OC), kRtolBf16, "misaligned matmul_bwd dbias");
}

// ---- elementwise ----

TEST(CudaKernels, Elementwise) {
    SKIP_WITHOUT_GPU();
    Be g(true), c(false);
    const size_t n = 1003; // a tail after the 8-wide packs
    FVec a = randn(n, 40, 2.0f), b = randn(n, 41);
    void *go = g.zeros(n), *co = c.zeros(n);
    ASSERT_EQ(tpd_kern_gelu_fwd(g.b, go, g.up(a), n), TPD_OK);
    ASSERT_EQ(tpd_kern_gelu_fwd(c.b, co, c.up(a), n), TPD_OK);
    expect_close(g.down(go, n), c.down(co, n), kRtolBf16, "gelu_fwd");

    void *gd = g.up(b), *cd = c.up(b); // dinp aliases dout
    ASSERT_EQ(tpd_kern_gelu_bwd(g.b, gd, g.up(a), gd, n), TPD_OK);
    ASSERT_EQ(tpd_kern_gelu_bwd(c.b, cd, c.up(a), cd, n), TPD_OK);
    expect_close(g.down(gd, n), c.down(cd, n), kRtolBf16, "gelu_bwd (aliased)");

    void *ga = g.up(a), *ca = c.up(a);
    ASSERT_EQ(tpd_kern_add(g.b, ga, ga, g.up(b), n), TPD_OK);
    ASSERT_EQ(tpd_kern_add(c.b, ca, ca, c.up(b), n), TPD_OK);
    expect_close(g.down(ga, n), c.down(ca, n), kRtolBf16, "add");
    ASSERT_EQ(tpd_kern_scale(g.b, ga, 0.37f, n), TPD_OK);
    ASSERT_EQ(tpd_kern_scale(c.b, ca, 0.37f, n), TPD_OK);
    expect_close(g.down(ga, n), c.down(ca, n), kRtolBf16, "scale");

    const int N = 17, OC = 59;
    FVec x = randn((size_t)N * OC, 42), bias = randn(OC, 43);
    void *gx = g.up(x), *cx = c.up(x);
    ASSERT_EQ(tpd_kern_bias_add(g.b, gx, g.up(bias), N, OC), TPD_OK);
    ASSERT_EQ(tpd_kern_bias_add(c.b, cx, c.up(bias), N, OC), TPD_OK);
    expect_close(g.down(gx, x.size()), c.down(cx, x.size()), kRtolBf16, "bias_add");
}

// copy_2d moves the same column block on both backends (cudaMemcpy2DAsync).
TEST(CudaKernels, Copy2dMatchesCpu) {
    SKIP_WITHOUT_GPU();
    Be g(true, TPD_DTYPE_F32), c(false, TPD_DTYPE_F32);
    const int rows = 33, scols = 21, dcols = 10, w = 6;
    FVec src = randn((size_t)rows * scols, 44), dst((size_t)rows * dcols, -1.0f);
    float *gs = g.upf(src), *gd = g.upf(dst), *cs = c.upf(src), *cd = c.upf(dst);
    ASSERT_EQ(tpd_kern_copy_2d(g.b, gd + 2, dcols * 4, gs + 5, scols * 4, w * 4, rows), TPD_OK);
    ASSERT_EQ(tpd_kern_copy_2d(c.b, cd + 2, dcols * 4, cs + 5, scols * 4, w * 4, rows), TPD_OK);
    FVec a(dst.size()), b(dst.size());
    ASSERT_EQ(tpd_kern_copy_to_host(g.b, a.data(), gd, a.size() * 4), TPD_OK);
    ASSERT_EQ(tpd_kern_copy_to_host(c.b, b.data(), cd, b.size() * 4), TPD_OK);
    EXPECT_EQ(a, b);
}

TEST(CudaKernels, CastRoundTrip) {
    SKIP_WITHOUT_GPU();
    Be g(true);
    const size_t n = 999;
    FVec a = randn(n, 44); // already bf16-representable: the round trip is exact
    float *f = g.upf(a);
    void *h = g.zeros(n, TPD_DTYPE_BF16);
    float *f2 = (float *)g.zeros(n, TPD_DTYPE_F32);
    ASSERT_EQ(tpd_kern_cast(g.b, h, TPD_DTYPE_BF16, f, TPD_DTYPE_F32, n), TPD_OK);
    ASSERT_EQ(tpd_kern_cast(g.b, f2, TPD_DTYPE_F32, h, TPD_DTYPE_BF16, n), TPD_OK);
    expect_close(g.downf(f2, n), a, 0.0f, "cast f32 -> bf16 -> f32");
}

// ---- rotary position embedding ----

void rope_case(int B, int T, int NH, int NKV, int HS, float base, int pos0, tpd_dtype dt,
               float rtol) {
    Be g(true, dt), c(false, dt);
    const size_t W = (size_t)(NH + 2 * NKV) * HS, n = (size_t)B * T * W;
    FVec x = randn(n, 220), d = randn(n, 221);
    void *gx = g.up(x), *cx = c.up(x);
    ASSERT_EQ(tpd_kern_rope_fwd(g.b, gx, B, T, NH, NKV, HS, base, pos0), TPD_OK);
    ASSERT_EQ(tpd_kern_rope_fwd(c.b, cx, B, T, NH, NKV, HS, base, pos0), TPD_OK);
    FVec got = g.down(gx, n);
    expect_close(got, c.down(cx, n), rtol, "rope_fwd");
    const size_t v0 = (size_t)(NH + NKV) * HS; // V's columns are untouched
    for (size_t row = 0; row < (size_t)B * T; row++)
        for (size_t k = v0; k < W; k++)
            ASSERT_EQ(got[row * W + k], x[row * W + k]) << "rope_fwd changed V at row " << row;

    void *gd = g.up(d), *cd = c.up(d);
    ASSERT_EQ(tpd_kern_rope_bwd(g.b, gd, B, T, NH, NKV, HS, base, pos0), TPD_OK);
    ASSERT_EQ(tpd_kern_rope_bwd(c.b, cd, B, T, NH, NKV, HS, base, pos0), TPD_OK);
    FVec dgot = g.down(gd, n);
    expect_close(dgot, c.down(cd, n), rtol, "rope_bwd");
    for (size_t row = 0; row < (size_t)B * T; row++)
        for (size_t k = v0; k < W; k++)
            ASSERT_EQ(dgot[row * W + k], d[row * W + k]) << "rope_bwd changed dV at row " << row;

    // The backward is the inverse rotation: it takes the forward's output back to x.
    ASSERT_EQ(tpd_kern_rope_bwd(g.b, gx, B, T, NH, NKV, HS, base, pos0), TPD_OK);
    expect_close(g.down(gx, n), x, 2 * rtol, "rope_bwd(rope_fwd(x)) = x");
}

TEST(CudaKernels, RopeQueryAndKeyHeads) {
    SKIP_WITHOUT_GPU();
    rope_case(2, 37, 4, 2, 64, 10000.0f, 0, TPD_DTYPE_BF16, kRtolBf16);
}
TEST(CudaKernels, RopeOddHalfAndFirstPosition) {
    SKIP_WITHOUT_GPU();
    rope_case(1, 20, 3, 1, 10, 10000.0f, 7, TPD_DTYPE_BF16, kRtolBf16);
}
// Angles in double: at position 1e5 a float angle is off by ~1e-2 rad, which the f32
// tolerance catches.
TEST(CudaKernels, RopeF32FarPositionsMatchCpuTightly) {
    SKIP_WITHOUT_GPU();
    rope_case(2, 16, 2, 1, 128, 500000.0f, 100000, TPD_DTYPE_F32, kRtolF32);
}

// ---- SwiGLU ----

void swiglu_case(int N, int F, tpd_dtype dt, float rtol) {
    Be g(true, dt), c(false, dt);
    FVec x = randn((size_t)N * 2 * F, 230, 2.0f), d = randn((size_t)N * F, 231);
    x[0] = -100.0f; // sigmoid's exp overflows and underflows: no NaN, no inf
    x[1] = 100.0f;
    x[F] = -30.0f; // and the same on the up half
    void *gx = g.up(x), *cx = c.up(x);
    void *go = g.zeros((size_t)N * F), *co = c.zeros((size_t)N * F);
    ASSERT_EQ(tpd_kern_swiglu_fwd(g.b, go, gx, N, F), TPD_OK);
    ASSERT_EQ(tpd_kern_swiglu_fwd(c.b, co, cx, N, F), TPD_OK);
    expect_close(g.down(go, (size_t)N * F), c.down(co, (size_t)N * F), rtol, "swiglu_fwd");

    void *gdx = g.up(x), *cdx = c.up(x); // overwritten: start from something else
    ASSERT_EQ(tpd_kern_swiglu_bwd(g.b, gdx, gx, g.up(d), N, F), TPD_OK);
    ASSERT_EQ(tpd_kern_swiglu_bwd(c.b, cdx, cx, c.up(d), N, F), TPD_OK);
    expect_close(g.down(gdx, x.size()), c.down(cdx, x.size()), rtol, "swiglu_bwd");
}

TEST(CudaKernels, SwigluVectorized) {
    SKIP_WITHOUT_GPU();
    swiglu_case(64, 256, TPD_DTYPE_BF16, kRtolBf16);
}
TEST(CudaKernels, SwigluOddWidth) {
    SKIP_WITHOUT_GPU();
    swiglu_case(37, 1003, TPD_DTYPE_BF16, kRtolBf16);
}
TEST(CudaKernels, SwigluF32MatchesCpuTightly) {
    SKIP_WITHOUT_GPU();
    swiglu_case(16, 64, TPD_DTYPE_F32, kRtolF32);
    swiglu_case(33, 130, TPD_DTYPE_F32, kRtolF32);
}

// ---- cross-entropy ----

TEST(CudaKernels, CrossEntropyPiecesVocabParallel) {
    SKIP_WITHOUT_GPU();
    Be g(true), c(false);
    const int N = 37, Vl = 320, Vvalid = 300, v0 = 640;
    FVec logits = randn((size_t)N * Vl, 60, 3.0f);
    IVec tgt = randint(N, 61, 600, 960); // some outside this rank's columns
    float *gm = (float *)g.zeros(N, TPD_DTYPE_F32), *cm = (float *)c.zeros(N, TPD_DTYPE_F32);
    float *gs = (float *)g.zeros(N, TPD_DTYPE_F32), *cs = (float *)c.zeros(N, TPD_DTYPE_F32);
    float *gt = (float *)g.zeros(N, TPD_DTYPE_F32), *ct = (float *)c.zeros(N, TPD_DTYPE_F32);
    float *gl = (float *)g.zeros(N, TPD_DTYPE_F32), *cl = (float *)c.zeros(N, TPD_DTYPE_F32);
    void *glog = g.up(logits), *clog = c.up(logits);
    int32_t *gtg = g.upi(tgt), *ctg = c.upi(tgt);
    ASSERT_EQ(tpd_kern_xent_max(g.b, gm, glog, N, Vl, Vvalid), TPD_OK);
    ASSERT_EQ(tpd_kern_xent_max(c.b, cm, clog, N, Vl, Vvalid), TPD_OK);
    ASSERT_EQ(tpd_kern_xent_sumexp(g.b, gs, gt, glog, gm, gtg, N, Vl, Vvalid, v0), TPD_OK);
    ASSERT_EQ(tpd_kern_xent_sumexp(c.b, cs, ct, clog, cm, ctg, N, Vl, Vvalid, v0), TPD_OK);
    ASSERT_EQ(tpd_kern_xent_loss(g.b, gl, gm, gs, gt, N), TPD_OK);
    ASSERT_EQ(tpd_kern_xent_loss(c.b, cl, cm, cs, ct, N), TPD_OK);
    expect_close(g.downf(gm, N), c.downf(cm, N), 0.0f, "xent_max");
    expect_close(g.downf(gs, N), c.downf(cs, N), 1e-4f, "xent_sumexp");
    expect_close(g.downf(gt, N), c.downf(ct, N), 0.0f, "xent tgt");
    expect_close(g.downf(gl, N), c.downf(cl, N), 1e-4f, "xent_loss");
    double gsum = 0, csum = 0;
    ASSERT_EQ(tpd_kern_sum_f32(g.b, gl, N, &gsum), TPD_OK);
    ASSERT_EQ(tpd_kern_sum_f32(c.b, cl, N, &csum), TPD_OK);
    EXPECT_NEAR(gsum, csum, 1e-4 * std::fabs(csum) + 1e-6);

    const float dloss = 1.0f / 64;
    ASSERT_EQ(tpd_kern_xent_bwd(g.b, glog, gm, gs, gtg, dloss, N, Vl, Vvalid, v0), TPD_OK);
    ASSERT_EQ(tpd_kern_xent_bwd(c.b, clog, cm, cs, ctg, dloss, N, Vl, Vvalid, v0), TPD_OK);
    FVec gd = g.down(glog, logits.size()), cd = c.down(clog, logits.size());
    expect_close(gd, cd, kRtolBf16, "xent_bwd");
    for (int n = 0; n < N; n++)
        for (int v = Vvalid; v < Vl; v++)
            ASSERT_EQ(gd[(size_t)n * Vl + v], 0.0f) << "padded column";
}

// ---- optimizer and reductions ----

TEST(CudaKernels, AdamWWithMasterWeights) {
    SKIP_WITHOUT_GPU();
    Be g(true), c(false, TPD_DTYPE_F32); // the fp32 optimizer as reference
    ASSERT_EQ(tpd_kern_has_master(g.b), 1);
    const size_t n = 2053;
    FVec w = randn(n, 70), m0(n, 0.0f), v0(n, 0.0f);
    // bf16 master-weight path on the device, fp32 reference on the cpu
    void *gp = g.up(w);
    float *gmw = g.upf(w), *gm = g.upf(m0), *gv = g.upf(v0);
    void *cp = c.up(w);
    float *cm = c.upf(m0), *cv = c.upf(v0);
    for (int step = 1; step <= 3; step++) {
        FVec grad = randn(n, 71 + step);
        ASSERT_EQ(tpd_kern_adamw(g.b, gp, gmw, g.up(grad), gm, gv, n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                                 0.1f, step, 0.5f),
                  TPD_OK);
        ASSERT_EQ(tpd_kern_adamw(c.b, cp, nullptr, c.up(grad), cm, cv, n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                                 0.1f, step, 0.5f),
                  TPD_OK);
    }
    FVec ref = c.down(cp, n);
    expect_close(g.downf(gmw, n), ref, 1e-5f, "adamw master");
    expect_close(g.downf(gm, n), c.downf(cm, n), 1e-5f, "adamw m");
    expect_close(g.downf(gv, n), c.downf(cv, n), 1e-5f, "adamw v");
    // The bf16 parameter is the rounding of the master.
    expect_close(g.down(gp, n), round_bf16(g.downf(gmw, n)), 0.0f, "adamw param = bf16(master)");
}

// The engine runs AdamW and sumsq on sub-ranges of the flat buffers: any element offset.
TEST(CudaKernels, AdamWAndSumsqOnMisalignedRange) {
    SKIP_WITHOUT_GPU();
    Be g(true), c(false, TPD_DTYPE_F32); // the fp32 optimizer as reference
    const size_t n = 1029, off = 5;
    FVec w = randn(n, 130), grad = randn(n, 131), z(n, 0.0f);
    void *gp = g.up(w), *gg = g.up(grad);
    float *gmw = g.upf(w), *gm = g.upf(z), *gv = g.upf(z);
    void *cp = c.up(w);
    float *cm = c.upf(z), *cv = c.upf(z);
    const size_t k = n - off;
    ASSERT_EQ(tpd_kern_adamw(g.b, (char *)gp + off * 2, gmw + off, (char *)gg + off * 2, gm + off,
                             gv + off, k, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f),
              TPD_OK);
    ASSERT_EQ(tpd_kern_adamw(c.b, (float *)cp + off, nullptr, (float *)c.up(grad) + off, cm + off,
                             cv + off, k, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f),
              TPD_OK);
    FVec got = g.downf(gmw, n), ref = c.down(cp, n);
    expect_close(got, ref, 1e-5f, "adamw on a misaligned range");
    double ss = 0.0, want = 0.0;
    for (size_t i = off; i < n; i++)
        want += (double)grad[i] * grad[i];
    ASSERT_EQ(tpd_kern_sumsq(g.b, (char *)gg + off * 2, TPD_DTYPE_BF16, k, &ss), TPD_OK);
    EXPECT_NEAR(ss, want, 1e-9 * want);
}

TEST(CudaKernels, AdamWF32WithoutMaster) {
    SKIP_WITHOUT_GPU();
    Be g(true, TPD_DTYPE_F32), c(false, TPD_DTYPE_F32);
    ASSERT_EQ(tpd_kern_has_master(g.b), 0);
    const size_t n = 517;
    FVec w = randn(n, 80), grad = randn(n, 81), z(n, 0.0f);
    void *gp = g.up(w), *cp = c.up(w);
    float *gm = g.upf(z), *gv = g.upf(z), *cm = c.upf(z), *cv = c.upf(z);
    ASSERT_EQ(tpd_kern_adamw(g.b, gp, nullptr, g.up(grad), gm, gv, n, 3e-3f, 0.9f, 0.999f, 1e-8f,
                             0.0f, 1, 1.0f),
              TPD_OK);
    ASSERT_EQ(tpd_kern_adamw(c.b, cp, nullptr, c.up(grad), cm, cv, n, 3e-3f, 0.9f, 0.999f, 1e-8f,
                             0.0f, 1, 1.0f),
              TPD_OK);
    expect_close(g.down(gp, n), c.down(cp, n), 1e-5f, "adamw f32");
}

// ---- plain SGD and DiLoCo's outer step, against double reference loops ----
// dt is the parameter dtype: fp32 (with and without master) or bf16 (fp32 master required).

FVec to_f(const std::vector<double> &v) {
    return FVec(v.begin(), v.end());
}

// The parameter as it must read after an update that left `w` in the fp32 master.
FVec param_of(const FVec &w, tpd_dtype dt) {
    return dt == TPD_DTYPE_BF16 ? round_bf16(w) : w;
}

void sgd_case(tpd_dtype dt, bool with_master) {
    Be g(true, dt);
    const size_t n = 1037; // not a multiple of 8
    const float lr = 0.05f, wd = 0.1f, gscale = 0.5f;
    FVec w0 = randn(n, 400);
    std::vector<FVec> grads = {randn(n, 401), randn(n, 402)};
    std::vector<double> want(w0.begin(), w0.end());
    for (const FVec &gr : grads)
        for (size_t i = 0; i < n; i++)
            want[i] -= lr * (gr[i] * (double)gscale + wd * want[i]);

    void *gp = g.up(w0, dt);
    float *gmw = with_master ? g.upf(w0) : nullptr;
    for (const FVec &gr : grads)
        ASSERT_EQ(tpd_kern_sgd(g.b, gp, gmw, g.up(gr, tpd_kern_grad_dtype(g.b)), n, lr, wd, gscale),
                  TPD_OK);
    if (with_master) {
        FVec mw = g.downf(gmw, n);
        expect_close(mw, to_f(want), 1e-5f, "sgd master");
        expect_close(g.down(gp, n, dt), param_of(mw, dt), 0.0f, "sgd param = cast(master)");
    } else {
        expect_close(g.down(gp, n, dt), to_f(want), 1e-5f, "sgd param");
    }
}

TEST(CudaKernels, SgdF32WithAndWithoutMaster) {
    SKIP_WITHOUT_GPU();
    sgd_case(TPD_DTYPE_F32, false);
    sgd_case(TPD_DTYPE_F32, true);
}

TEST(CudaKernels, SgdBf16WithMasterWeights) {
    SKIP_WITHOUT_GPU();
    sgd_case(TPD_DTYPE_BF16, true);
    Be g(true, TPD_DTYPE_BF16);
    FVec w = randn(16, 403);
    EXPECT_EQ(tpd_kern_sgd(g.b, g.up(w), nullptr, g.up(w, tpd_kern_grad_dtype(g.b)), 16, 0.1f, 0.0f,
                           1.0f),
              TPD_ERR_INVALID); // a bf16 parameter needs its fp32 master
}

TEST(CudaKernels, OuterDeltaIsSyncMinusW) {
    SKIP_WITHOUT_GPU();
    Be g(true, TPD_DTYPE_BF16);
    const size_t n = 1037;
    FVec sync = randn(n, 410), w = randn(n, 411);
    std::vector<double> want(n);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)sync[i] - w[i];
    float *gd = (float *)g.zeros(n, TPD_DTYPE_F32);
    ASSERT_EQ(tpd_kern_outer_delta(g.b, gd, g.upf(sync), g.upf(w), n), TPD_OK);
    expect_close(g.downf(gd, n), to_f(want), 1e-6f, "outer_delta");
}

void outer_nesterov_case(tpd_dtype dt, bool with_master) {
    Be g(true, dt);
    const size_t n = 1037;
    const float lr = 0.7f, momentum = 0.9f, scale = 0.5f;
    FVec sync0 = randn(n, 420), mom0 = randn(n, 421, 0.1f);
    std::vector<FVec> deltas = {randn(n, 422, 0.05f), randn(n, 423, 0.05f)};
    std::vector<double> ws(sync0.begin(), sync0.end()), wm(mom0.begin(), mom0.end());
    for (const FVec &dl : deltas)
        for (size_t i = 0; i < n; i++) {
            double d = dl[i] * (double)scale;
            wm[i] = momentum * wm[i] + d;
            ws[i] -= lr * (d + momentum * wm[i]);
        }

    float *gs = g.upf(sync0), *gm = g.upf(mom0);
    void *gp = g.zeros(n, dt);
    float *gmw = with_master ? (float *)g.zeros(n, TPD_DTYPE_F32) : nullptr;
    for (const FVec &dl : deltas) // two calls: the momentum carries from the first
        ASSERT_EQ(tpd_kern_outer_nesterov(g.b, gp, gmw, gs, gm, g.upf(dl), n, lr, momentum, scale),
                  TPD_OK);
    FVec s = g.downf(gs, n);
    expect_close(s, to_f(ws), 1e-5f, "outer_nesterov sync");
    expect_close(g.downf(gm, n), to_f(wm), 1e-5f, "outer_nesterov mom");
    if (with_master) expect_close(g.downf(gmw, n), s, 0.0f, "outer_nesterov master = sync");
    expect_close(g.down(gp, n, dt), param_of(s, dt), 0.0f, "outer_nesterov param = cast(sync)");
}

TEST(CudaKernels, OuterNesterovF32WithAndWithoutMaster) {
    SKIP_WITHOUT_GPU();
    outer_nesterov_case(TPD_DTYPE_F32, false);
    outer_nesterov_case(TPD_DTYPE_F32, true);
}

TEST(CudaKernels, OuterNesterovBf16WithMasterWeights) {
    SKIP_WITHOUT_GPU();
    outer_nesterov_case(TPD_DTYPE_BF16, true);
    Be g(true, TPD_DTYPE_BF16);
    FVec z(16, 0.0f);
    EXPECT_EQ(tpd_kern_outer_nesterov(g.b, g.up(z), nullptr, g.upf(z), g.upf(z), g.upf(z), 16, 0.7f,
                                      0.9f, 0.5f),
              TPD_ERR_INVALID); // a bf16 parameter needs its fp32 master
}

// lr 1, momentum 0, scale 1/R: sync becomes the mean of the R replicas' w (the master
// under bf16), from delta = the sum of their pseudo-gradients.
void outer_average_case(tpd_dtype dt) {
    Be g(true, dt);
    const size_t n = 1037;
    const int R = 2;
    FVec sync0 = randn(n, 430);
    std::vector<FVec> ws = {randn(n, 431), randn(n, 432)};
    float *gs = g.upf(sync0), *gm = (float *)g.zeros(n, TPD_DTYPE_F32);
    float *gd = (float *)g.zeros(n, TPD_DTYPE_F32);
    FVec sum(n, 0.0f);
    for (const FVec &w : ws) {
        ASSERT_EQ(tpd_kern_outer_delta(g.b, gd, gs, g.upf(w), n), TPD_OK);
        FVec d = g.downf(gd, n);
        for (size_t i = 0; i < n; i++)
            sum[i] += d[i];
    }
    void *gp = g.zeros(n, dt);
    float *gmw = dt == TPD_DTYPE_BF16 ? (float *)g.zeros(n, TPD_DTYPE_F32) : nullptr;
    ASSERT_EQ(tpd_kern_outer_nesterov(g.b, gp, gmw, gs, gm, g.upf(sum), n, 1.0f, 0.0f, 1.0f / R),
              TPD_OK);
    FVec mean(n);
    for (size_t i = 0; i < n; i++)
        mean[i] = (float)(((double)ws[0][i] + ws[1][i]) / R);
    FVec s = g.downf(gs, n);
    expect_close(s, mean, 1e-5f, "outer step with lr 1, momentum 0");
    expect_close(g.down(gp, n, dt), param_of(s, dt), 0.0f, "param after the averaging step");
}

TEST(CudaKernels, OuterUnitStepAveragesTheReplicas) {
    SKIP_WITHOUT_GPU();
    outer_average_case(TPD_DTYPE_F32);
    outer_average_case(TPD_DTYPE_BF16);
}

TEST(CudaKernels, SumOfSquaresIsExactAndDeterministic) {
    SKIP_WITHOUT_GPU();
    Be g(true);
    const size_t n = 1 << 20;
    FVec x = randn(n, 90);
    double ref = 0.0;
    for (float v : x)
        ref += (double)v * v;
    float *xf = g.upf(x);
    void *xb = g.up(x, TPD_DTYPE_BF16);
    double a = 0, b = 0, a2 = 0;
    ASSERT_EQ(tpd_kern_sumsq(g.b, xf, TPD_DTYPE_F32, n, &a), TPD_OK);
    ASSERT_EQ(tpd_kern_sumsq(g.b, xb, TPD_DTYPE_BF16, n, &b), TPD_OK);
    ASSERT_EQ(tpd_kern_sumsq(g.b, xf, TPD_DTYPE_F32, n, &a2), TPD_OK);
    EXPECT_NEAR(a, ref, 1e-9 * ref);
    EXPECT_NEAR(b, ref, 1e-9 * ref); // inputs are bf16-representable: same values
    EXPECT_EQ(a, a2);
}

// ---- mixture of experts: token rows to and from their experts ----

// The MoE's index: T tokens each routed to k distinct of E experts (a few experts hot),
// some assignments dropped, the kept ones sorted by expert then token, as the router
// leaves them: a permutation of token rows with repeats. counts_p gets each expert's rows.
IVec expert_order(int T, int k, int E, uint32_t seed, std::vector<int> *counts_p) {
    std::mt19937 gen(seed);
    std::vector<std::vector<int32_t>> rows(E);
    for (int t = 0; t < T; t++) {
        std::vector<int> taken;
        while ((int)taken.size() < k) {
            int e = (int)(gen() % (unsigned)(E + 2));
            e = e >= E ? 0 : e; // expert 0 hot
            bool dup = false;
            for (int q : taken)
                dup |= q == e;
            if (!dup) taken.push_back(e);
        }
        for (int e : taken)
            if (gen() % 10 != 0) rows[e].push_back(t); // a tenth dropped
    }
    IVec idx;
    counts_p->assign(E, 0);
    for (int e = 0; e < E; e++) {
        (*counts_p)[e] = (int)rows[e].size();
        idx.insert(idx.end(), rows[e].begin(), rows[e].end());
    }
    return idx;
}

void moe_rows_case(int T, int C) {
    Be g(true), c(false);
    std::vector<int> counts;
    IVec idx = expert_order(T, 2, 5, 300, &counts);
    const int M = (int)idx.size();
    FVec x = randn((size_t)T * C, 301), s = randn(M, 302), y0 = randn((size_t)T * C, 303);
    FVec b = randn((size_t)M * C, 304);
    int32_t *gi = g.upi(idx), *ci = c.upi(idx);
    // gather: exact copies
    void *gr = g.zeros((size_t)M * C), *cr = c.zeros((size_t)M * C);
    ASSERT_EQ(tpd_kern_gather_rows(g.b, gr, g.up(x), gi, M, C), TPD_OK);
    ASSERT_EQ(tpd_kern_gather_rows(c.b, cr, c.up(x), ci, M, C), TPD_OK);
    expect_close(g.down(gr, (size_t)M * C), c.down(cr, (size_t)M * C), 0.0f, "gather_rows");
    // row_dot of the gathered rows with b, fp32
    float *gd = (float *)g.zeros(M, TPD_DTYPE_F32), *cd = (float *)c.zeros(M, TPD_DTYPE_F32);
    ASSERT_EQ(tpd_kern_row_dot(g.b, gd, gr, g.up(b), M, C), TPD_OK);
    ASSERT_EQ(tpd_kern_row_dot(c.b, cd, cr, c.up(b), M, C), TPD_OK);
    expect_close(g.downf(gd, M), c.downf(cd, M), kRtolF32, "row_dot");
    // scale in place, then scatter-add onto y0 (accumulates)
    float *gs = g.upf(s), *cs = c.upf(s);
    ASSERT_EQ(tpd_kern_scale_rows(g.b, gr, gr, gs, M, C), TPD_OK);
    ASSERT_EQ(tpd_kern_scale_rows(c.b, cr, cr, cs, M, C), TPD_OK);
    expect_close(g.down(gr, (size_t)M * C), c.down(cr, (size_t)M * C), kRtolBf16,
                 "scale_rows (in place)");
    void *gy = g.up(y0), *cy = c.up(y0);
    ASSERT_EQ(tpd_kern_scatter_add_rows(g.b, gy, gr, gi, M, C, T), TPD_OK);
    ASSERT_EQ(tpd_kern_scatter_add_rows(c.b, cy, cr, ci, M, C, T), TPD_OK);
    expect_close(g.down(gy, (size_t)T * C), c.down(cy, (size_t)T * C), kRtolBf16,
                 "scatter_add_rows (accumulated)");
    // a scale into another buffer
    void *go = g.zeros((size_t)M * C), *co = c.zeros((size_t)M * C);
    void *gb = g.up(b), *cb = c.up(b);
    ASSERT_EQ(tpd_kern_scale_rows(g.b, go, gb, gs, M, C), TPD_OK);
    ASSERT_EQ(tpd_kern_scale_rows(c.b, co, cb, cs, M, C), TPD_OK);
    expect_close(g.down(go, (size_t)M * C), c.down(co, (size_t)M * C), kRtolBf16, "scale_rows");
}

TEST(CudaKernels, MoeRowsVectorized) {
    SKIP_WITHOUT_GPU();
    moe_rows_case(200, 64);
}
TEST(CudaKernels, MoeRowsOddWidth) {
    SKIP_WITHOUT_GPU();
    moe_rows_case(61, 37);
}

// The sums of scatter_add_rows never depend on the run: many rows into a few outputs.
TEST(CudaKernels, ScatterAddRowsIsBitDeterministic) {
    SKIP_WITHOUT_GPU();
    Be g(true);
    const int N = 6000, C = 96, rows = 50;
    IVec idx = randint(N, 305, 0, rows);
    for (int i = 0; i < 2000; i++)
        idx[i] = 7; // a hot row
    FVec x = randn((size_t)N * C, 306);
    int32_t *gi = g.upi(idx);
    void *gx = g.up(x);
    std::vector<uint8_t> first;
    for (int rep = 0; rep < 3; rep++) {
        void *y = g.zeros((size_t)rows * C);
        ASSERT_EQ(tpd_kern_scatter_add_rows(g.b, y, gx, gi, N, C, rows), TPD_OK);
        ASSERT_EQ(tpd_kern_synchronize(g.b), TPD_OK);
        auto bits = g.bytes(y, (size_t)rows * C * tpd_dtype_size(g.act()));
        if (rep == 0)
            first = bits;
        else
            EXPECT_EQ(bits, first) << "scatter_add_rows differs between identical runs";
    }
}

// Grouped matmuls over an expert order's blocks (an empty group among them), forward and
// backward (dw and dbias of each group accumulated).
void grouped_matmul_case(int IC, int OC, bool bias) {
    Be g(true), c(false);
    std::vector<int> counts;
    (void)expert_order(90, 2, 4, 310, &counts);
    counts.insert(counts.begin() + 2, 0); // G = 5, group 2 empty
    const int G = (int)counts.size();
    int M = 0;
    for (int n : counts)
        M += n;
    FVec x = randn((size_t)M * IC, 311), w = randn((size_t)G * OC * IC, 312, 0.1f);
    FVec bb = randn((size_t)G * OC, 313), dy = randn((size_t)M * OC, 314);
    FVec dw0 = randn((size_t)G * OC * IC, 315, 0.1f), db0 = randn((size_t)G * OC, 316);
    void *gx = g.up(x), *gw = g.up(w), *gb = bias ? g.up(bb) : nullptr;
    void *cx = c.up(x), *cw = c.up(w), *cb = bias ? c.up(bb) : nullptr;
    void *go = g.zeros((size_t)M * OC), *co = c.zeros((size_t)M * OC);
    ASSERT_EQ(tpd_kern_grouped_matmul_fwd(g.b, go, gx, gw, gb, counts.data(), G, IC, OC), TPD_OK);
    ASSERT_EQ(tpd_kern_grouped_matmul_fwd(c.b, co, cx, cw, cb, counts.data(), G, IC, OC), TPD_OK);
    expect_close(g.down(go, (size_t)M * OC), c.down(co, (size_t)M * OC), kRtolBf16,
                 "grouped_matmul_fwd");
    void *gdx = g.zeros((size_t)M * IC), *cdx = c.zeros((size_t)M * IC);
    void *gdw = g.up(dw0), *cdw = c.up(dw0);
    void *gdb = bias ? g.up(db0) : nullptr, *cdb = bias ? c.up(db0) : nullptr;
    ASSERT_EQ(
        tpd_kern_grouped_matmul_bwd(g.b, gdx, gdw, gdb, g.up(dy), gx, gw, counts.data(), G, IC, OC),
        TPD_OK);
    ASSERT_EQ(
        tpd_kern_grouped_matmul_bwd(c.b, cdx, cdw, cdb, c.up(dy), cx, cw, counts.data(), G, IC, OC),
        TPD_OK);
    expect_close(g.down(gdx, (size_t)M * IC), c.down(cdx, (size_t)M * IC), kRtolBf16,
                 "grouped_matmul_bwd dinp");
    // the empty group's dw keeps its initial values
    expect_close(g.down(gdw, (size_t)G * OC * IC), c.down(cdw, (size_t)G * OC * IC), kRtolBf16,
                 "grouped_matmul_bwd dw (accumulated)");
    if (bias)
        expect_close(g.down(gdb, (size_t)G * OC), c.down(cdb, (size_t)G * OC), kRtolBf16,
                     "grouped_matmul_bwd dbias (accumulated)");
}

TEST(CudaKernels, GroupedMatmulWithBias) {
    SKIP_WITHOUT_GPU();
    grouped_matmul_case(48, 80, true);
}
TEST(CudaKernels, GroupedMatmulNoBiasOddShape) {
    SKIP_WITHOUT_GPU();
    grouped_matmul_case(24, 40, false);
}

TEST(CudaKernels, F32BackendMatmulMatchesCpuTightly) {
    SKIP_WITHOUT_GPU();
    Be g(true, TPD_DTYPE_F32), c(false, TPD_DTYPE_F32);
    ASSERT_EQ(g.act(), TPD_DTYPE_F32);
    const int N = 64, C = 48, OC = 80;
    FVec x = randn((size_t)N * C, 100), w = randn((size_t)OC * C, 101), b = randn(OC, 102);
    void *go = g.zeros((size_t)N * OC), *co = c.zeros((size_t)N * OC);
    ASSERT_EQ(tpd_kern_matmul_fwd(g.b, go, g.up(x), g.up(w), g.up(b), N, C, OC), TPD_OK);
    ASSERT_EQ(tpd_kern_matmul_fwd(c.b, co, c.up(x), c.up(w), c.up(b), N, C, OC), TPD_OK);
    expect_close(g.down(go, (size_t)N * OC), c.down(co, (size_t)N * OC), kRtolF32, "f32 matmul");
}

#ifndef TPD_KERNEL_TWIN_CPU
TEST(CudaKernels, BackendDescribesItself) {
    SKIP_WITHOUT_GPU();
    Be g(true);
    EXPECT_STREQ(tpd_kern_name(g.b), "cuda");
    EXPECT_EQ(tpd_kern_act_dtype(g.b), TPD_DTYPE_BF16);
    EXPECT_EQ(tpd_kern_param_dtype(g.b), TPD_DTYPE_BF16);
    EXPECT_EQ(tpd_kern_grad_dtype(g.b), TPD_DTYPE_BF16);
    EXPECT_EQ(tpd_kern_device_memory(g.b), 1);
    EXPECT_NE(tpd_kern_stream(g.b), nullptr);
}
#endif

// Runs everywhere: without a device the constructor fails cleanly instead of aborting.
TEST(CudaKernels, AvailabilityIsReportedCleanly) {
    if (tpd_kern_cuda_available()) GTEST_SKIP() << "a device is present";
    tpd_kern_config cfg = TPD_KERN_CONFIG_INIT;
    cfg.dtype = TPD_DTYPE_BF16;
    tpd_kern_backend *b = nullptr;
    EXPECT_EQ(tpd_kern_cuda_create(&cfg, &b), TPD_ERR_UNSUPPORTED);
    EXPECT_EQ(b, nullptr);
}

} // namespace
