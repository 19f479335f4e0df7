// The bf16 budget of `tripod verify --device cuda` (engine/verify/verify_budget.c): it
// matches a hand computation of the documented formulas on the shrunken demo, its inputs
// come from the config (rounding points of the block, GEMM depths, tokens, bf16 main
// gradients), it grows with depth and with steps, and results perturbed past it fail while
// results inside it pass (per-step loss and grad norm, and parameters measured against how
// far the reference moved).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "base/file.h"
#include "engine/verify/verify_internal.h"
}

namespace {

// configs/demo.yaml at TP 2, PP 2, shrunk for DP 2 and 3 steps, as verify runs it
tpd_config demo_small(bool llama = false) {
    tpd_config real, small;
    std::string path =
        std::string(tpd_source_dir()) + (llama ? "/configs/demo-llama.yaml" : "/configs/demo.yaml");
    const char *ov[] = {"parallel.tensor_model_parallel_size=2",
                        "parallel.pipeline_model_parallel_size=2"};
    EXPECT_EQ(tpd_config_load(path.c_str(), 2, ov, &real), TPD_OK) << tpd_last_error();
    char err[256] = "";
    EXPECT_EQ(tpd_verify_shrink(&real, 2, 3, &small, err, sizeof err), TPD_OK) << err;
    return small;
}

tpd_verify_budget budget(const tpd_verify_budget_in &in) {
    tpd_verify_budget b;
    tpd_verify_budget_compute(&in, &b);
    return b;
}

TEST(VerifyBudget, MatchesTheHandComputationOnTheDemo) {
    tpd_config small = demo_small();
    small.training.precision = TPD_PRECISION_BF16; // the device run's config
    tpd_verify_budget_in in;
    tpd_verify_budget_shape(&small, 3, 2, &in);
    // hidden 64, FFN 32, sequence 8, 4 layers, 16 samples of 8 tokens, fp32 main gradients
    EXPECT_EQ(in.layers, 4);
    EXPECT_EQ(in.rounds_per_layer, 15);
    EXPECT_EQ(in.depth_fwd, 64);
    EXPECT_EQ(in.tokens, 128);
    EXPECT_EQ(in.depth_wgrad, 128);
    EXPECT_EQ(in.grad_rounds, 0);
    EXPECT_EQ(in.steps, 3);
    tpd_verify_budget b = budget(in);
    // u sqrt(15 x 4 + 5) + 64 x 2^-24; u sqrt(2 x 65) + 128 x 2^-24 (computed by hand)
    EXPECT_NEAR(b.eps_fwd, 0.03149700902655683, 1e-15);
    EXPECT_NEAR(b.eps_bwd, 0.044545731937466325, 1e-15);
    EXPECT_DOUBLE_EQ(b.eps_fwd, std::ldexp(1.0, -8) * std::sqrt(65.0) + 64 * std::ldexp(1.0, -24));
    // 2 sqrt(sqrt(2/pi) e_bwd 3)
    EXPECT_NEAR(b.params, 0.6530759688970418, 1e-13);
    // loss: e_fwd s / sqrt(128); grad norm: e_bwd s
    EXPECT_NEAR(tpd_verify_budget_loss(&b, 2), 0.005567937167443058, 1e-15);
    EXPECT_NEAR(tpd_verify_budget_norm(&b, 3), 0.13363719581239897, 1e-15);
    // below 1: a tensor that did not move on the device (measure 1) fails
    EXPECT_LT(b.params, 1.0);
}

TEST(VerifyBudget, InputsFollowTheConfig) {
    tpd_config llama = demo_small(true);
    tpd_verify_budget_in in;
    tpd_verify_budget_shape(&llama, 3, 2, &in);
    EXPECT_EQ(in.rounds_per_layer, 18) << "SwiGLU (+2) and RoPE (+1) on GPT's 15";
    EXPECT_EQ(tpd_verify_budget_rounds_per_layer(&llama), 18);
    // bf16 main gradients: each micro-batch's running sum and each DP hop rounded
    tpd_config c = demo_small();
    c.training.precision = TPD_PRECISION_BF16;
    c.training.accumulate_allreduce_grads_in_fp32 = 0;
    tpd_verify_budget_shape(&c, 3, 2, &in);
    int M = c.training.global_batch_size / (c.training.micro_batch_size * 2);
    EXPECT_EQ(in.grad_rounds, M + 1);
    tpd_verify_budget_in fp32_grads = in;
    fp32_grads.grad_rounds = 0;
    EXPECT_GT(budget(in).eps_bwd, budget(fp32_grads).eps_bwd);
    EXPECT_EQ(budget(in).eps_fwd, budget(fp32_grads).eps_fwd);
    // a deeper GEMM adds its fp32 accumulation
    c.model.hidden_size = 4096;
    tpd_verify_budget_shape(&c, 3, 2, &in);
    EXPECT_EQ(in.depth_fwd, 4096);
    EXPECT_GT(budget(in).eps_fwd - budget(fp32_grads).eps_fwd, 4000 * std::ldexp(1.0, -24));
}

TEST(VerifyBudget, GrowsWithDepthAndSteps) {
    tpd_verify_budget_in in = {4, 15, 64, 128, 128, 0, 3};
    tpd_verify_budget prev = budget(in);
    for (int L : {8, 16, 48, 96}) {
        in.layers = L;
        tpd_verify_budget b = budget(in);
        EXPECT_GT(b.eps_fwd, prev.eps_fwd) << L << " layers";
        EXPECT_GT(b.eps_bwd, prev.eps_bwd) << L << " layers";
        EXPECT_GT(b.params, prev.params) << L << " layers";
        EXPECT_GT(tpd_verify_budget_loss(&b, 1), tpd_verify_budget_loss(&prev, 1));
        prev = b;
    }
    in.layers = 4;
    prev = budget(in);
    for (int S : {4, 10, 100}) {
        in.steps = S;
        tpd_verify_budget b = budget(in);
        EXPECT_GT(b.params, prev.params) << S << " steps";
        prev = b;
    }
    tpd_verify_budget b = budget(in);
    for (int s = 1; s < 10; s++) {
        EXPECT_GT(tpd_verify_budget_loss(&b, s + 1), tpd_verify_budget_loss(&b, s));
        EXPECT_GT(tpd_verify_budget_norm(&b, s + 1), tpd_verify_budget_norm(&b, s));
    }
    // more tokens average the activations' roundings of the mean loss
    tpd_verify_budget_in more = in;
    more.tokens *= 4;
    tpd_verify_budget bm = budget(more);
    EXPECT_NEAR(tpd_verify_budget_loss(&bm, 1), tpd_verify_budget_loss(&b, 1) / 2, 1e-15);
    // 96 layers x 15: the parameters' budget passes 1, where it cannot tell an unmoved tensor
    in.layers = 96;
    in.steps = 3;
    EXPECT_GT(budget(in).params, 1.0);
}

TEST(VerifyBudget, PerturbedSeriesExceedIt) {
    tpd_verify_budget b = budget({4, 15, 64, 128, 128, 0, 3});
    std::vector<double> ref = {4.86, 4.81, 4.74}, got = ref;
    // inside: 0.9 of each step's budget
    for (int s = 0; s < 3; s++)
        got[s] = ref[s] * (1 + 0.9 * tpd_verify_budget_loss(&b, s + 1));
    tpd_verify_report rep = {};
    tpd_verify_check *c = tpd_verify_add(&rep, "cuda: loss", tpd_verify_budget_loss(&b, 3));
    tpd_verify_cmp_budget(c, "loss", got.data(), ref.data(), 3, &b, tpd_verify_budget_loss);
    EXPECT_EQ(c->verdict, TPD_VERIFY_PASS) << c->detail;
    // step 1 past its own budget, though within step 3's: fails, naming step 1
    got[0] = ref[0] * (1 + 1.1 * tpd_verify_budget_loss(&b, 1));
    c = tpd_verify_add(&rep, "cuda: loss", tpd_verify_budget_loss(&b, 3));
    tpd_verify_cmp_budget(c, "loss", got.data(), ref.data(), 3, &b, tpd_verify_budget_loss);
    EXPECT_EQ(c->verdict, TPD_VERIFY_FAIL);
    EXPECT_NE(std::string(c->detail).find("at step 1"), std::string::npos) << c->detail;
    EXPECT_LT(c->worst, tpd_verify_budget_loss(&b, 3));
    // a grad norm off by 20% (a DP bucket left unreduced reads like this) fails at once
    std::vector<double> nref = {1.93, 1.71, 1.52}, ngot = {1.55, 1.71, 1.52};
    c = tpd_verify_add(&rep, "cuda: grad norm", tpd_verify_budget_norm(&b, 3));
    tpd_verify_cmp_budget(c, "grad norm", ngot.data(), nref.data(), 3, &b, tpd_verify_budget_norm);
    EXPECT_EQ(c->verdict, TPD_VERIFY_FAIL);
    // NaN fails
    ngot = nref;
    ngot[2] = NAN;
    c = tpd_verify_add(&rep, "cuda: grad norm", tpd_verify_budget_norm(&b, 3));
    tpd_verify_cmp_budget(c, "grad norm", ngot.data(), nref.data(), 3, &b, tpd_verify_budget_norm);
    EXPECT_EQ(c->verdict, TPD_VERIFY_FAIL);
}

TEST(VerifyBudget, ParametersMeasuredAgainstHowFarTheyMoved) {
    // every element moved by about lr x 3 steps; the device's run differs by a fraction of that
    const size_t n = 4096;
    const float lr3 = 9e-3f;
    std::vector<float> init(n), ref(n), got(n);
    for (size_t i = 0; i < n; i++) {
        init[i] = 0.02f * (float)std::sin(0.37 * (double)i);
        ref[i] = init[i] + (i % 3 ? lr3 : -lr3);
    }
    tpd_verify_budget b = budget({4, 15, 64, 128, 128, 0, 3});
    // a flipped step on a fraction f of the elements: measure 2 sqrt(f)
    for (double f : {0.02, 0.2}) {
        size_t k = (size_t)(f * (double)n);
        got = ref;
        for (size_t i = 0; i < k; i++)
            got[i * (n / k)] = 2 * init[i * (n / k)] - ref[i * (n / k)];
        double e = tpd_verify_moved_diff(got.data(), ref.data(), init.data(), n);
        EXPECT_NEAR(e, 2 * std::sqrt((double)k / n), 1e-3) << f;
        if (f < 0.05)
            EXPECT_LT(e, b.params) << "2% of the signs flipped is inside the demo's budget";
        else
            EXPECT_GT(e, b.params) << "20% of the signs flipped is past it";
    }
    // a tensor the device never moved: measure 1, past the budget
    EXPECT_NEAR(tpd_verify_moved_diff(init.data(), ref.data(), init.data(), n), 1.0, 1e-12);
    // identical: 0; the reference did not move and the device did: inf; NaN: inf
    EXPECT_EQ(tpd_verify_moved_diff(ref.data(), ref.data(), init.data(), n), 0.0);
    EXPECT_EQ(tpd_verify_moved_diff(init.data(), init.data(), init.data(), n), 0.0);
    EXPECT_TRUE(std::isinf(tpd_verify_moved_diff(ref.data(), init.data(), init.data(), n)));
    got = ref;
    got[7] = NAN;
    EXPECT_TRUE(std::isinf(tpd_verify_moved_diff(got.data(), ref.data(), init.data(), n)));
}

TEST(VerifyBudget, TheParamsCheckNamesTheTensor) {
    tpd_config c = tiny::config("/tmp/none");
    c.parallel.tensor_model_parallel_size = 2;
    c.parallel.pipeline_model_parallel_size = 2;
    tpd_model_layout g;
    ASSERT_EQ(tpd_model_layout_init(&c, 1, 0, 1, 0, &g), TPD_OK);
    std::vector<std::vector<float>> init(TPD_P_COUNT), ref(TPD_P_COUNT), got(TPD_P_COUNT);
    std::vector<float *> pi(TPD_P_COUNT), pr(TPD_P_COUNT), pg(TPD_P_COUNT);
    for (int p = 0; p < TPD_P_COUNT; p++) {
        size_t n = tpd_model_layout_global_numel(&g, (tpd_param)p);
        init[p].assign(n, 0.1f);
        ref[p].assign(n, 0.1f + 9e-3f);
        got[p] = ref[p];
        pi[p] = init[p].data();
        pr[p] = ref[p].data();
        pg[p] = got[p].data();
    }
    tpd_verify_budget b = budget({4, 15, 64, 128, 128, 0, 3});
    tpd_verify_report rep = {};
    tpd_verify_check *chk = tpd_verify_add(&rep, "cuda: params", b.params);
    tpd_verify_cmp_moved(chk, &c, pg.data(), pr.data(), pi.data(), "after step 3");
    EXPECT_EQ(chk->verdict, TPD_VERIFY_PASS) << chk->detail;
    // layer 1's fc bias never moved on the device: 1 for that layer, though a quarter of
    // the tensor (0.5 over all of it would pass)
    size_t piece = got[TPD_P_FCB].size() / c.model.num_layers;
    for (size_t i = 0; i < piece; i++)
        got[TPD_P_FCB][piece + i] = 0.1f;
    chk = tpd_verify_add(&rep, "cuda: params", b.params);
    tpd_verify_cmp_moved(chk, &c, pg.data(), pr.data(), pi.data(), "after step 3");
    EXPECT_EQ(chk->verdict, TPD_VERIFY_FAIL);
    std::string d = chk->detail;
    EXPECT_NE(d.find("param layers.1.fcb differs"), std::string::npos) << d;
    EXPECT_NE(d.find("relative to how far the reference moved it"), std::string::npos) << d;
}

} // namespace
