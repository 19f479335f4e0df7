// The comparisons of `tripod verify` (engine/verify/verify_check.c): a planted difference
// in one element is named by its parameter, layer, stage, chunk and TP rank; a difference
// within tolerance passes; exact checks fail on one bit; per-step series name the step.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "engine/verify/verify_internal.h"
}

namespace {

// TP 2, PP 2, two virtual stages of 2 layers each: layers 0-1 stage 0 chunk 0, 2-3 stage 1
// chunk 0, 4-5 stage 0 chunk 1, 6-7 stage 1 chunk 1.
tpd_config layout() {
    tpd_config c = tiny::config("/tmp/none");
    c.model.num_layers = 8;
    c.parallel.tensor_model_parallel_size = 2;
    c.parallel.pipeline_model_parallel_size = 2;
    c.parallel.virtual_pipeline_model_parallel_size = 2;
    c.parallel.data_parallel_size = 1;
    return c;
}

struct Params {
    std::vector<std::vector<float>> t;
    std::vector<float *> p;
    explicit Params(const tpd_config &c) : t(TPD_P_COUNT), p(TPD_P_COUNT) {
        tpd_model_layout g;
        EXPECT_EQ(tpd_model_layout_init(&c, 1, 0, 1, 0, &g), TPD_OK);
        for (int i = 0; i < TPD_P_COUNT; i++) {
            t[i].resize(tpd_model_layout_global_numel(&g, (tpd_param)i));
            for (size_t k = 0; k < t[i].size(); k++)
                t[i][k] = 0.01f * (float)((k * 7 + i) % 13) + 0.1f;
            p[i] = t[i].data();
        }
    }
};

TEST(VerifyCheck, NamesTheParameterLayerStageChunkAndRank) {
    tpd_config c = layout();
    Params ref(c), got(c);
    // fcw is (L, F, C) with F = 128, C = 32: row 100 of layer 5 lies in TP rank 1's half
    size_t piece = 128 * 32;
    got.t[TPD_P_FCW][5 * piece + 100 * 32 + 3] += 1.0f;
    tpd_verify_report rep = {};
    tpd_verify_check *chk = tpd_verify_add(&rep, "params", 1e-4);
    tpd_verify_cmp_params(chk, &c, got.p.data(), ref.p.data(), "after step 3");
    EXPECT_EQ(chk->verdict, TPD_VERIFY_FAIL);
    std::string d = chk->detail;
    EXPECT_NE(d.find("param layers.5.fcw differs"), std::string::npos) << d;
    EXPECT_NE(d.find("after step 3; element 3203"), std::string::npos) << d;
    EXPECT_NE(d.find("stage 0 of 2, chunk 1, rank 1 (TP 1, DP 0)"), std::string::npos) << d;
    EXPECT_GT(chk->worst, 1e-4);
    // a replicated tensor names every TP rank of its stage
    Params got2(c);
    got2.t[TPD_P_LN1W][6 * 32 + 1] += 1.0f;
    chk = tpd_verify_add(&rep, "params", 1e-4);
    tpd_verify_cmp_params(chk, &c, got2.p.data(), ref.p.data(), "after step 3");
    EXPECT_NE(std::string(chk->detail).find("layers.6.ln1w"), std::string::npos) << chk->detail;
    EXPECT_NE(std::string(chk->detail).find("stage 1 of 2, chunk 1, ranks 2..3"), std::string::npos)
        << chk->detail;
}

TEST(VerifyCheck, ToleranceAndExactness) {
    tpd_config c = layout();
    Params ref(c), got(c);
    got.t[TPD_P_QKVW][17] *= 1.0f + 1e-7f; // one element, far inside 1e-4 of the tensor
    tpd_verify_report rep = {};
    tpd_verify_check *tol = tpd_verify_add(&rep, "params", 1e-4);
    tpd_verify_cmp_params(tol, &c, got.p.data(), ref.p.data(), "after step 1");
    EXPECT_EQ(tol->verdict, TPD_VERIFY_PASS) << tol->detail;
    EXPECT_GT(tol->worst, 0);
    tpd_verify_check *exact = tpd_verify_add(&rep, "resume", 0);
    tpd_verify_cmp_params(exact, &c, got.p.data(), ref.p.data(), "after loading");
    EXPECT_EQ(exact->verdict, TPD_VERIFY_FAIL);
    EXPECT_NE(std::string(exact->detail).find("param layers.0.qkvw"), std::string::npos)
        << exact->detail;
    tpd_verify_check *same = tpd_verify_add(&rep, "resume", 0);
    tpd_verify_cmp_params(same, &c, ref.p.data(), ref.p.data(), "after loading");
    EXPECT_EQ(same->verdict, TPD_VERIFY_PASS);
    EXPECT_EQ(same->worst, 0);
}

TEST(VerifyCheck, SeriesNameTheStep) {
    tpd_verify_report rep = {};
    double ref[3] = {5.5, 5.4, 5.3}, got[3] = {5.5, 5.4 * (1 + 2e-5), 5.3};
    tpd_verify_check *c = tpd_verify_add(&rep, "loss", 1e-5);
    tpd_verify_cmp_series(c, "loss", got, ref, 3, 1, "one rank");
    EXPECT_EQ(c->verdict, TPD_VERIFY_FAIL);
    EXPECT_NE(std::string(c->detail).find("at step 2, one rank 5.4"), std::string::npos)
        << c->detail;
    EXPECT_NEAR(c->worst, 2e-5, 1e-9);
    double nan_got[1] = {NAN};
    c = tpd_verify_add(&rep, "loss", 1e-5);
    tpd_verify_cmp_series(c, "loss", nan_got, ref, 1, 1, "one rank");
    EXPECT_EQ(c->verdict, TPD_VERIFY_FAIL) << "NaN must fail";
    const float a[2] = {1, 2}, b[2] = {2, 2};
    EXPECT_EQ(tpd_verify_rel_diff(a, a, 2), 0);
    EXPECT_DOUBLE_EQ(tpd_verify_rel_diff(a, b, 2), std::sqrt(1.0 / 8.0));
}

} // namespace
