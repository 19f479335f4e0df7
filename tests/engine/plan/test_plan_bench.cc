// Planner reports, label `bench` (run with `ctest -L bench`; left out of tools/test.sh):
// figures printed for a reader, with no bound held. The planner's speed (the full search
// for the 1T model on 3072 A100s, one GPT-3 175B layout), and how close the A100
// constants come to Korthikanti et al.'s published MFU.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>

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
                tpd_config_choice("training.recompute", s.top[0].layout.recompute),
                s.top[0].tflops_per_gpu, 100 * s.top[0].mfu);
    EXPECT_EQ(s.top[0].layout.tp * s.top[0].layout.pp * s.top[0].layout.dp, 3072);
    tpd_plan_search_free(&s);
}

TEST(PlanBench, OneLayoutGpt3) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("dgx-a100-80g", &cl), TPD_OK);
    tpd_config c = gpt(96, 12288, 96, 1536, 1);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 1024;
    tpd_plan_layout lay = {8, 16, 8, 1, 1, TPD_RECOMPUTE_SELECTIVE, 1, 1};
    auto t0 = std::chrono::steady_clock::now();
    tpd_plan_result r;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &r), TPD_OK);
    double dt = seconds_since(t0);
    std::printf("  GPT-3 175B, one layout (TP=8 PP=16 DP=8): %.2f ms\n", 1e3 * dt);
    EXPECT_GT(r.step_time_s, 0.0);
}

// Korthikanti et al. (2022) Table 4: selective recompute + SP, A100. Printed only (no
// assertion): how close the same constants get to their MFU.
TEST(PlanThroughput, KorthikantiMfuReport) {
    tpd_plan_cluster cl = a100();
    struct Run {
        const char *name;
        int heads, hidden, layers, tp, pp, gpus, batch;
        double mfu;
    } runs[] = {
        {"22B", 64, 6144, 48, 8, 1, 8, 4, 0.415},
        {"175B", 96, 12288, 96, 8, 8, 64, 64, 0.514},
        {"530B", 128, 20480, 105, 8, 35, 280, 280, 0.560},
        {"1T", 160, 25600, 128, 8, 64, 512, 512, 0.563},
    };
    for (const Run &r : runs) {
        tpd_config cfg = gpt(r.heads, r.hidden, r.layers, r.batch, 1);
        cfg.training.attention = TPD_ATTENTION_UNFUSED;
        tpd_plan_layout lay;
        std::memset(&lay, 0, sizeof lay);
        lay.tp = r.tp;
        lay.pp = r.pp;
        lay.dp = r.gpus / (r.tp * r.pp);
        lay.micro_batch_size = 1;
        lay.virtual_stages = 1;
        lay.recompute = TPD_RECOMPUTE_SELECTIVE;
        lay.sequence_parallel = 1;
        tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
        opt.gpus = r.gpus;
        tpd_plan_result res;
        ASSERT_EQ(tpd_plan_evaluate(&cfg, &cl, &lay, &opt, &res), TPD_OK);
        ASSERT_GT(res.step_time_s, 0.0) << res.reject_reason;
        std::printf("  Korthikanti %-5s MFU predicted %.1f%%, published %.1f%% (%+.1f points; "
                    "mem %.1f GiB, fits %d)\n",
                    r.name, 100 * res.mfu, 100 * r.mfu, 100 * (res.mfu - r.mfu),
                    res.memory_bytes / 1073741824.0, res.fits);
        EXPECT_GT(res.mfu, 0.0);
    }
}

} // namespace
