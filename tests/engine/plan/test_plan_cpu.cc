// The planner's cpu time model on a calibrated profile: the step adds up, and follows the
// layout and the ranks that share cores.
#include <gtest/gtest.h>

#include "common/tiny.h"
#include "plan_test_util.h"

extern "C" {
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"
}

using plan_test::sample_cpu_profile;

namespace {

tpd_config small_config() {
    tpd_config c = tiny::config("/nonexistent");
    c.model.num_layers = 4;
    c.model.hidden_size = 64;
    c.model.ffn_hidden_size = 256;
    c.model.seq_length = 64;
    c.model.max_position_embeddings = 64;
    c.training.global_batch_size = 8;
    return c;
}

tpd_plan_result predict(const tpd_config &cfg, const tpd_plan_cluster &cl, int tp, int pp, int dp) {
    tpd_plan_layout lay = {tp, pp, dp, 1, 1, TPD_RECOMPUTE_NONE, 0, 0};
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = tp * pp * dp;
    opt.dp_overlap = 0;
    tpd_plan_result r;
    EXPECT_EQ(tpd_plan_evaluate(&cfg, &cl, &lay, &opt, &r), TPD_OK);
    EXPECT_EQ(r.stages, pp) << r.reject_reason;
    return r;
}

TEST(SweepPlanCpu, TimeModelAddsUpAndFollowsTheLayout) {
    tpd_config cfg = small_config();
    tpd_plan_cluster cl = sample_cpu_profile();
    tpd_plan_result one = predict(cfg, cl, 1, 1, 1);
    const tpd_plan_time &t = one.time;
    EXPECT_GT(one.step_time_s, 0.0);
    EXPECT_NEAR(one.step_time_s,
                t.compute + t.pp_bubble + t.pp_p2p + t.dp_comm_exposed + t.optimizer, 1e-12);
    EXPECT_EQ(t.tp_comm, 0.0);
    EXPECT_EQ(t.dp_comm_exposed, 0.0);
    // DP=4 splits the micro-batches by 4, but its 4 ranks share the 2 cores that one rank
    // had to itself (the profile was measured with 4 ranks on 2): compute halves. A DP
    // reduction appears.
    tpd_plan_result dp4 = predict(cfg, cl, 1, 1, 4);
    EXPECT_NEAR(dp4.time.compute, t.compute / 2, t.compute * 1e-9);
    EXPECT_GT(dp4.time.dp_comm_exposed, 0.0);
    // TP=2 adds collectives; PP=2 adds a bubble from the 1F1B simulation: with equal
    // stages it is (p-1) (f+b) of a stage, and the last stage (logits) is the slower.
    tpd_plan_result tp2 = predict(cfg, cl, 2, 1, 2);
    EXPECT_GT(tp2.time.tp_comm, 0.0);
    tpd_plan_result pp2 = predict(cfg, cl, 1, 2, 2);
    EXPECT_GT(pp2.time.pp_bubble, 0.0);
    EXPECT_GT(pp2.time.pp_p2p, 0.0);
    double f0, b0, c0, f1, b1, c1;
    tpd_plan_layout lay = {1, 2, 2, 1, 1, TPD_RECOMPUTE_NONE, 0, 0};
    tpd_plan_stage_time(&cfg, &cl, &lay, 0, &f0, &b0, &c0);
    tpd_plan_stage_time(&cfg, &cl, &lay, 1, &f1, &b1, &c1);
    EXPECT_GT(f1 + b1, f0 + b0);
    // Ranks that share cores: measured with 4 ranks on 2 cores, 8 ranks on them run each
    // kernel twice as slowly; 2 ranks, each on its own core, twice as fast.
    tpd_plan_result w8 = predict(cfg, cl, 1, 1, 8);
    tpd_plan_result w2 = predict(cfg, cl, 1, 1, 2);
    EXPECT_NEAR(w8.time.compute, 2.0 * dp4.time.compute / 2.0, dp4.time.compute * 1e-9);
    EXPECT_NEAR(w2.time.compute, 0.5 * 2.0 * dp4.time.compute, dp4.time.compute * 1e-9);
}

} // namespace
