// Gradient checks of every cpu backward op against central finite differences.
//
// For an op y = f(x) the scalar loss is L = sum(y * R) with fixed random weights R, so
// dL/dy = R is what the kernel's backward gets as dout. The finite differences
// (L(x+h) - L(x-h)) / 2h, h = 1e-4, run entirely in double on the double reference
// forward of ref.h, so their own error (~h^2 truncation, ~1e-12 rounding) is far below
// the fp32 kernel's. Tolerance: |kernel - fd| <= kTol * max(1, |fd|) with kTol = 2e-5;
// the kernels land within 1e-6 here, so the margin covers other BLAS builds while a
// missing term of any gradient formula still fails by orders of magnitude.
#include "ref_llama.h"

using ref::FVec;
using ref::Vec;

namespace {

constexpr double kTol = 2e-5;

TEST(CpuGrad, Embedding) {
    ref::CpuBackend be;
    const int N = 9, C = 13, v0 = 3, Vl = 5;
    std::vector<int32_t> tok = {3, 4, 3, 7, 0, 3, 12, 5, 4}; // repeats, and outside the slice
    FVec wte = ref::randn((size_t)Vl * C, 50), R = ref::randn((size_t)N * C, 51);
    Vec wd = ref::to_d(wte), Rd = ref::to_d(R);
    Vec fd = ref::fd_grad(wd, [&] { return ref::dot(ref::embed(tok, wd, N, C, v0, Vl), Rd); });
    FVec dwte((size_t)Vl * C, 0.0f);
    ASSERT_EQ(tpd_kern_embed_bwd(be.b, dwte.data(), R.data(), tok.data(), N, C, v0, Vl), TPD_OK);
    ref::expect_grad_close(dwte.data(), fd, kTol, "dwte");
}

TEST(CpuGrad, Position) {
    ref::CpuBackend be;
    const int B = 3, T = 5, C = 7;
    FVec x = ref::randn((size_t)B * T * C, 52), wpe = ref::randn((size_t)T * C, 53);
    FVec R = ref::randn(x.size(), 54);
    Vec xd = ref::to_d(x), wd = ref::to_d(wpe), Rd = ref::to_d(R);
    Vec fd = ref::fd_grad(wd, [&] { return ref::dot(ref::pos(xd, wd, B, T, C), Rd); });
    FVec dwpe((size_t)T * C, 0.0f);
    ASSERT_EQ(tpd_kern_pos_bwd(be.b, dwpe.data(), R.data(), B, T, C), TPD_OK);
    ref::expect_grad_close(dwpe.data(), fd, kTol, "dwpe");
}

TEST(CpuGrad, LayerNorm) {
    ref::CpuBackend be;
    for (auto [N, C] : {std::pair{7, 13}, std::pair{4, 64}}) {
        SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
        FVec inp = ref::randn((size_t)N * C, 55), w = ref::randn(C, 56), b = ref::randn(C, 57);
        FVec R = ref::randn(inp.size(), 58);
        Vec xd = ref::to_d(inp), wd = ref::to_d(w), bd = ref::to_d(b), Rd = ref::to_d(R);
        auto loss = [&, N = N, C = C] { return ref::dot(ref::layernorm(xd, wd, bd, N, C), Rd); };
        Vec fdx = ref::fd_grad(xd, loss), fdw = ref::fd_grad(wd, loss),
            fdb = ref::fd_grad(bd, loss);

        FVec out(inp.size()), mean(N), rstd(N);
        ASSERT_EQ(tpd_kern_layernorm_fwd(be.b, out.data(), mean.data(), rstd.data(), inp.data(),
                                         w.data(), b.data(), N, C, 1e-5f),
                  TPD_OK);
        FVec dinp(inp.size(), NAN), dw(C, 0.0f), db(C, 0.0f);
        ASSERT_EQ(tpd_kern_layernorm_bwd(be.b, dinp.data(), dw.data(), db.data(), R.data(),
                                         inp.data(), w.data(), mean.data(), rstd.data(), N, C),
                  TPD_OK);
        ref::expect_grad_close(dinp.data(), fdx, kTol, "layernorm dinp");
        ref::expect_grad_close(dw.data(), fdw, kTol, "layernorm dw");
        ref::expect_grad_close(db.data(), fdb, kTol, "layernorm db");
    }
}

TEST(CpuGrad, Matmul) {
    ref::CpuBackend be;
    struct {
        int N, C, OC;
    } shapes[] = {{7, 13, 5}, {3, 1, 4}, {17, 40, 9}};
    for (auto s : shapes) {
        SCOPED_TRACE("N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
                     " OC=" + std::to_string(s.OC));
        FVec inp = ref::randn((size_t)s.N * s.C, 60), w = ref::randn((size_t)s.OC * s.C, 61);
        FVec bias = ref::randn(s.OC, 62), R = ref::randn((size_t)s.N * s.OC, 63);
        Vec xd = ref::to_d(inp), wd = ref::to_d(w), bd = ref::to_d(bias), Rd = ref::to_d(R);
        auto loss = [&] { return ref::dot(ref::matmul(xd, wd, &bd, s.N, s.C, s.OC), Rd); };
        Vec fdx = ref::fd_grad(xd, loss), fdw = ref::fd_grad(wd, loss),
            fdb = ref::fd_grad(bd, loss);

        FVec dinp(inp.size(), NAN), dw(w.size(), 0.0f), db(s.OC, 0.0f);
        ASSERT_EQ(tpd_kern_matmul_bwd(be.b, dinp.data(), dw.data(), db.data(), R.data(), inp.data(),
                                      w.data(), s.N, s.C, s.OC),
                  TPD_OK);
        ref::expect_grad_close(dinp.data(), fdx, kTol, "matmul dinp");
        ref::expect_grad_close(dw.data(), fdw, kTol, "matmul dw");
        ref::expect_grad_close(db.data(), fdb, kTol, "matmul dbias");
    }
}

TEST(CpuGrad, Gelu) {
    ref::CpuBackend be;
    const size_t n = 301;
    FVec x = ref::randn(n, 64, 2.5f), R = ref::randn(n, 65);
    x[0] = 0.0f;
    x[1] = 12.0f;
    x[2] = -12.0f;
    Vec xd = ref::to_d(x), Rd = ref::to_d(R);
    Vec fd = ref::fd_grad(xd, [&] { return ref::dot(ref::gelu(xd), Rd); });
    FVec dinp(n, NAN);
    ASSERT_EQ(tpd_kern_gelu_bwd(be.b, dinp.data(), x.data(), R.data(), n), TPD_OK);
    ref::expect_grad_close(dinp.data(), fd, kTol, "gelu dinp");
}

TEST(CpuGrad, Attention) {
    ref::CpuBackend be;
    struct {
        int B, T, NH, HS;
    } shapes[] = {{2, 1, 3, 4}, {2, 9, 3, 4}, {1, 67, 1, 3}}; // 67 crosses the 64-row block
    for (auto s : shapes) {
        SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T));
        const size_t nqkv = (size_t)s.B * s.T * 3 * s.NH * s.HS;
        const size_t nout = (size_t)s.B * s.T * s.NH * s.HS;
        FVec qkv = ref::randn(nqkv, 66), R = ref::randn(nout, 67);
        Vec qd = ref::to_d(qkv), Rd = ref::to_d(R);
        Vec fd = ref::fd_grad(
            qd, [&] { return ref::dot(ref::attention(qd, s.B, s.T, s.NH, s.HS), Rd); });

        FVec out(nout), saved((size_t)s.B * s.NH * s.T * s.T);
        ASSERT_EQ(tpd_kern_attention_fwd(be.b, out.data(), saved.data(), qkv.data(), s.B, s.T, s.NH,
                                         s.NH, s.HS),
                  TPD_OK);
        FVec dqkv(nqkv, NAN);
        ASSERT_EQ(tpd_kern_attention_bwd(be.b, dqkv.data(), R.data(), qkv.data(), out.data(),
                                         saved.data(), s.B, s.T, s.NH, s.NH, s.HS),
                  TPD_OK);
        ref::expect_grad_close(dqkv.data(), fd, kTol, "attention dqkv");
    }
}

TEST(CpuGrad, RmsNorm) {
    ref::CpuBackend be;
    for (auto [N, C] : {std::pair{7, 13}, std::pair{4, 64}}) {
        for (float eps : {1e-5f, 0.5f}) { // a large eps weighs in rstd's derivative
            SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) +
                         " eps=" + std::to_string(eps));
            FVec inp = ref::randn((size_t)N * C, 110), w = ref::randn(C, 111);
            FVec R = ref::randn(inp.size(), 112);
            Vec xd = ref::to_d(inp), wd = ref::to_d(w), Rd = ref::to_d(R);
            auto loss = [&, N = N, C = C] { return ref::dot(ref::rmsnorm(xd, wd, N, C, eps), Rd); };
            Vec fdx = ref::fd_grad(xd, loss), fdw = ref::fd_grad(wd, loss);

            FVec out(inp.size()), rstd(N);
            ASSERT_EQ(tpd_kern_rmsnorm_fwd(be.b, out.data(), rstd.data(), inp.data(), w.data(), N,
                                           C, eps),
                      TPD_OK);
            FVec dinp(inp.size(), NAN), dw(C, 0.0f);
            ASSERT_EQ(tpd_kern_rmsnorm_bwd(be.b, dinp.data(), dw.data(), R.data(), inp.data(),
                                           w.data(), rstd.data(), N, C),
                      TPD_OK);
            ref::expect_grad_close(dinp.data(), fdx, kTol, "rmsnorm dinp");
            ref::expect_grad_close(dw.data(), fdw, kTol, "rmsnorm dw");
        }
    }
}

// Qwen3's QK norm: d(qkv) in place (V's part passes through), dwq and dwk accumulated.
TEST(CpuGrad, QkNorm) {
    ref::CpuBackend be;
    struct S {
        int N, NH, NKV, HS;
    };
    for (S s : {S{3, 4, 2, 6}, S{2, 2, 1, 16}}) {
        SCOPED_TRACE("N=" + std::to_string(s.N) + " NH=" + std::to_string(s.NH) +
                     " NKV=" + std::to_string(s.NKV) + " HS=" + std::to_string(s.HS));
        const double eps = 0.1; // large enough that rstd's derivative weighs in
        const int H = s.NH + s.NKV;
        const size_t n = (size_t)s.N * (s.NH + 2 * s.NKV) * s.HS;
        FVec qkv = ref::randn(n, 113), wq = ref::randn(s.HS, 114), wk = ref::randn(s.HS, 115);
        FVec R = ref::randn(n, 116);
        Vec xd = ref::to_d(qkv), wqd = ref::to_d(wq), wkd = ref::to_d(wk), Rd = ref::to_d(R);
        auto loss = [&] {
            return ref::dot(ref::qk_norm(xd, wqd, wkd, s.N, s.NH, s.NKV, s.HS, eps), Rd);
        };
        Vec fdx = ref::fd_grad(xd, loss), fdq = ref::fd_grad(wqd, loss),
            fdk = ref::fd_grad(wkd, loss);
        FVec raw((size_t)s.N * H * s.HS), rstd((size_t)s.N * H);
        ASSERT_EQ(tpd_kern_qk_norm_fwd(be.b, qkv.data(), raw.data(), rstd.data(), wq.data(),
                                       wk.data(), s.N, s.NH, s.NKV, s.HS, eps),
                  TPD_OK);
        FVec d = R, dwq(s.HS, 0.0f), dwk(s.HS, 0.0f);
        ASSERT_EQ(tpd_kern_qk_norm_bwd(be.b, d.data(), dwq.data(), dwk.data(), raw.data(),
                                       wq.data(), wk.data(), rstd.data(), s.N, s.NH, s.NKV, s.HS),
                  TPD_OK);
        ref::expect_grad_close(d.data(), fdx, kTol, "qk_norm dqkv");
        ref::expect_grad_close(dwq.data(), fdq, kTol, "qk_norm dwq");
        ref::expect_grad_close(dwk.data(), fdk, kTol, "qk_norm dwk");
    }
}

TEST(CpuGrad, Rope) {
    ref::CpuBackend be;
    struct {
        int B, T, NH, NKV, HS;
        float base;
        int pos0;
    } cases[] = {{2, 5, 4, 2, 6, 10000.0f, 0}, {1, 4, 2, 1, 130, 500000.0f, 9}};
    for (auto c : cases) {
        SCOPED_TRACE("HS=" + std::to_string(c.HS) + " pos0=" + std::to_string(c.pos0));
        const size_t n = (size_t)c.B * c.T * (c.NH + 2 * c.NKV) * c.HS;
        FVec qkv = ref::randn(n, 113), R = ref::randn(n, 114);
        Vec qd = ref::to_d(qkv), Rd = ref::to_d(R);
        Vec fd = ref::fd_grad(qd, [&] {
            return ref::dot(ref::rope(qd, c.B, c.T, c.NH, c.NKV, c.HS, c.base, c.pos0), Rd);
        });
        FVec d = R; // in place: dout in, dinp out
        ASSERT_EQ(tpd_kern_rope_bwd(be.b, d.data(), c.B, c.T, c.NH, c.NKV, c.HS, c.base, c.pos0),
                  TPD_OK);
        ref::expect_grad_close(d.data(), fd, kTol, "rope dqkv");
    }
}

TEST(CpuGrad, SwiGlu) {
    ref::CpuBackend be;
    const int N = 9, F = 17;
    FVec inp = ref::randn((size_t)N * 2 * F, 115, 2.5f), R = ref::randn((size_t)N * F, 116);
    inp[0] = 0.0f;  // gate 0
    inp[1] = 12.0f; // saturated gates
    inp[2] = -12.0f;
    Vec xd = ref::to_d(inp), Rd = ref::to_d(R);
    Vec fd = ref::fd_grad(xd, [&] { return ref::dot(ref::swiglu(xd, N, F), Rd); });
    FVec dinp(inp.size(), NAN);
    ASSERT_EQ(tpd_kern_swiglu_bwd(be.b, dinp.data(), inp.data(), R.data(), N, F), TPD_OK);
    ref::expect_grad_close(dinp.data(), fd, kTol, "swiglu dinp");
}

// Grouped-query attention: a K/V head's gradient sums those of its G query heads.
TEST(CpuGrad, GroupedQueryAttention) {
    ref::CpuBackend be;
    struct {
        int B, T, NH, NKV, HS;
    } shapes[] = {{2, 9, 4, 2, 4}, {2, 9, 4, 1, 4}, {1, 67, 2, 1, 3}}; // 67 crosses a block
    for (auto s : shapes) {
        SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                     " NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV));
        const size_t nqkv = (size_t)s.B * s.T * (s.NH + 2 * s.NKV) * s.HS;
        const size_t nout = (size_t)s.B * s.T * s.NH * s.HS;
        FVec qkv = ref::randn(nqkv, 117), R = ref::randn(nout, 118);
        Vec qd = ref::to_d(qkv), Rd = ref::to_d(R);
        Vec fd = ref::fd_grad(
            qd, [&] { return ref::dot(ref::attention_gqa(qd, s.B, s.T, s.NH, s.NKV, s.HS), Rd); });

        FVec out(nout), saved((size_t)s.B * s.NH * s.T * s.T);
        ASSERT_EQ(tpd_kern_attention_fwd(be.b, out.data(), saved.data(), qkv.data(), s.B, s.T, s.NH,
                                         s.NKV, s.HS),
                  TPD_OK);
        FVec dqkv(nqkv, NAN);
        ASSERT_EQ(tpd_kern_attention_bwd(be.b, dqkv.data(), R.data(), qkv.data(), out.data(),
                                         saved.data(), s.B, s.T, s.NH, s.NKV, s.HS),
                  TPD_OK);
        ref::expect_grad_close(dqkv.data(), fd, kTol, "gqa dqkv");
    }
}

// The cross-entropy pipeline xent_max -> xent_sumexp -> xent_loss -> xent_bwd, run once
// on the whole padded vocabulary and once split into two vocab slices as two
// tensor-parallel ranks would hold it, with the all-reduces done by hand.
TEST(CpuGrad, CrossEntropyPipelineWholeAndVocabSplit) {
    ref::CpuBackend be;
    const int N = 6, Vl = 8, Vp = 2 * Vl, V = 13; // 13 real tokens padded to 16 columns
    FVec logits = ref::randn((size_t)N * Vp, 70, 2.0f);
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++)
            logits[(size_t)n * Vp + j] = 30.0f;      // must not matter
    std::vector<int32_t> tgt = {0, 7, 8, 12, 3, 10}; // both slices, and both slice edges
    const float dloss = 1.0f / N;                    // mean loss over rows

    // Finite differences of the double reference mean loss, padded columns included
    // (their derivative is exactly 0).
    Vec ld = ref::to_d(logits);
    auto mean_loss = [&] {
        Vec l = ref::xent_losses(ld, tgt, N, Vp, V);
        double s = 0.0;
        for (double x : l)
            s += x;
        return s / N;
    };
    Vec ref_loss = ref::xent_losses(ld, tgt, N, Vp, V);
    Vec fd = ref::fd_grad(ld, mean_loss);

    // Whole vocabulary on one rank.
    FVec whole = logits, maxv(N), sumexp(N), t(N), loss(N);
    ASSERT_EQ(tpd_kern_xent_max(be.b, maxv.data(), whole.data(), N, Vp, V), TPD_OK);
    ASSERT_EQ(tpd_kern_xent_sumexp(be.b, sumexp.data(), t.data(), whole.data(), maxv.data(),
                                   tgt.data(), N, Vp, V, 0),
              TPD_OK);
    ASSERT_EQ(tpd_kern_xent_loss(be.b, loss.data(), maxv.data(), sumexp.data(), t.data(), N),
              TPD_OK);
    ref::expect_close(loss.data(), ref_loss, 1e-5, 1e-5, "whole loss");
    ASSERT_EQ(tpd_kern_xent_bwd(be.b, whole.data(), maxv.data(), sumexp.data(), tgt.data(), dloss,
                                N, Vp, V, 0),
              TPD_OK);
    ref::expect_grad_close(whole.data(), fd, kTol, "whole dlogits");
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++)
            EXPECT_EQ(whole[(size_t)n * Vp + j], 0.0f);

    // Two slices: rank r holds columns [r*Vl, (r+1)*Vl); rank 1 has V - Vl valid columns.
    FVec part[2];
    const int v0[2] = {0, Vl}, valid[2] = {Vl, V - Vl};
    for (int r = 0; r < 2; r++) {
        part[r].resize((size_t)N * Vl);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < Vl; j++)
                part[r][(size_t)n * Vl + j] = logits[(size_t)n * Vp + v0[r] + j];
    }
    FVec pmax[2] = {FVec(N), FVec(N)}, gmax(N);
    for (int r = 0; r < 2; r++)
        ASSERT_EQ(tpd_kern_xent_max(be.b, pmax[r].data(), part[r].data(), N, Vl, valid[r]), TPD_OK);
    for (int n = 0; n < N; n++)
        gmax[n] = std::max(pmax[0][n], pmax[1][n]); // all-reduce MAX
    FVec psum[2] = {FVec(N), FVec(N)}, ptgt[2] = {FVec(N), FVec(N)}, gsum(N), gtgt(N);
    for (int r = 0; r < 2; r++)
        ASSERT_EQ(tpd_kern_xent_sumexp(be.b, psum[r].data(), ptgt[r].data(), part[r].data(),
                                       gmax.data(), tgt.data(), N, Vl, valid[r], v0[r]),
                  TPD_OK);
    for (int n = 0; n < N; n++) {
        // Exactly one rank holds each target; the other contributes 0.
        bool in0 = tgt[n] < Vl;
        EXPECT_EQ(ptgt[in0 ? 1 : 0][n], 0.0f) << "row " << n;
        EXPECT_EQ(ptgt[in0 ? 0 : 1][n], logits[(size_t)n * Vp + tgt[n]]) << "row " << n;
        gsum[n] = psum[0][n] + psum[1][n]; // all-reduce SUM
        gtgt[n] = ptgt[0][n] + ptgt[1][n];
    }
    FVec sloss(N);
    ASSERT_EQ(tpd_kern_xent_loss(be.b, sloss.data(), gmax.data(), gsum.data(), gtgt.data(), N),
              TPD_OK);
    ref::expect_close(sloss.data(), ref_loss, 1e-5, 1e-5, "split loss");
    ref::expect_close(sloss.data(), Vec(loss.begin(), loss.end()), 1e-6, 1e-6, "split vs whole");

    FVec joined((size_t)N * Vp);
    for (int r = 0; r < 2; r++) {
        ASSERT_EQ(tpd_kern_xent_bwd(be.b, part[r].data(), gmax.data(), gsum.data(), tgt.data(),
                                    dloss, N, Vl, valid[r], v0[r]),
                  TPD_OK);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < Vl; j++)
                joined[(size_t)n * Vp + v0[r] + j] = part[r][(size_t)n * Vl + j];
    }
    ref::expect_grad_close(joined.data(), fd, kTol, "split dlogits");
    ref::expect_close(joined.data(), Vec(whole.begin(), whole.end()), 1e-6, 1e-7,
                      "split vs whole dlogits");
}

} // namespace
