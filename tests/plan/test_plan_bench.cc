// Planner speed, printed only (no timing assertions): the full search for the 1T model
// on 3072 A100s, and one GPT-3 175B layout.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "plan_test_util.h"

using namespace plan_test;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(PlanBench, SearchOneTrillionOn3072) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("dgx-a100-80g", &cl), TPD_OK);
    tpd_config c = gpt(160, 25600, 128, 3072, 1);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 3072;
    auto t0 = std::chrono::steady_clock::now();
    tpd_plan_search s;
    ASSERT_EQ(tpd_plan_search_run(&c, &cl, &opt, &s), TPD_OK);
    double dt = seconds_since(t0);
    std::printf("  1T on 3072 A100s: full search %.3f s (%ld layouts sized, %ld fit, %ld timed, "
                "%ld pruned by the bound)\n",
                dt, s.evaluated, s.fitting, s.timed, s.pruned);
    ASSERT_GT(s.n_top, 0);
    std::printf("  best: TP=%d PP=%d DP=%d mbs=%d v=%d %s, %.1f TFLOP/s/GPU, MFU %.1f%%\n",
                s.top[0].layout.tp, s.top[0].layout.pp, s.top[0].layout.dp,
                s.top[0].layout.micro_batch_size, s.top[0].layout.virtual_stages,
                tpd_plan_recompute_name(s.top[0].layout.recompute), s.top[0].tflops_per_gpu,
                100 * s.top[0].mfu);
    EXPECT_EQ(s.top[0].layout.tp * s.top[0].layout.pp * s.top[0].layout.dp, 3072);
    tpd_plan_search_free(&s);
}

TEST(PlanBench, OneLayoutGpt3) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("dgx-a100-80g", &cl), TPD_OK);
    tpd_config c = gpt(96, 12288, 96, 1536, 1);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 1024;
    tpd_plan_layout lay = {8, 16, 8, 1, 1, TPD_PLAN_RECOMPUTE_SELECTIVE, 1, 1};
    auto t0 = std::chrono::steady_clock::now();
    tpd_plan_result r;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &r), TPD_OK);
    double dt = seconds_since(t0);
    std::printf("  GPT-3 175B, one layout (TP=8 PP=16 DP=8): %.2f ms\n", 1e3 * dt);
    EXPECT_GT(r.step_time_s, 0.0);
}

} // namespace
