// Planner reports, label `bench` (run with `ctest -L bench`; left out of tools/test.sh):
// figures printed for a reader, with no bound held. The planner's speed (the full search
// for the 1T model on 3072 A100s, one GPT-3 175B layout), and how close the H100 constants
// come to Llama 3 405B's under each schedule and recompute (Korthikanti et al.'s runs are a
// bounded check in test_plan_throughput.cc).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "plan_test_util.h"

extern "C" {
#include "base/file.h"
#include "engine/plan/plan_internal.h"
}

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
    std::printf("  best: TP=%d CP=%d PP=%d DP=%d mbs=%d v=%d %s, %.1f TFLOP/s/GPU, MFU %.1f%%\n",
                s.top[0].layout.tp, tpd_plan_cp(&s.top[0].layout), s.top[0].layout.pp,
                s.top[0].layout.dp, s.top[0].layout.micro_batch_size,
                s.top[0].layout.virtual_stages,
                tpd_config_choice("training.recompute", s.top[0].layout.recompute),
                s.top[0].tflops_per_gpu, 100 * s.top[0].mfu);
    EXPECT_EQ(tpd_plan_world(&s.top[0].layout), 3072);
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

// Llama 3 405B, the two sequence-8192 rows of Dubey et al. (2024) Table 4 on H100-80GB
// (configs/llama3-405b.yaml: TP 8, PP 16, SP, ZeRO-1, mbs 1). The schedule and recompute
// Meta used are not in the table, so 1F1B (7 + 14 x 8 + 7 layers) and the interleaved
// schedule with 2 chunks a stage (3 + 30 x 4 + 3) are each shown under every recompute.
// Printed only: predicted TFLOP/s and MFU beside the published ones, and whether the layout
// fits 80 GB.
TEST(PlanThroughput, Llama3Table4Report) {
    std::string path = std::string(tpd_source_dir()) + "/configs/llama3-405b.yaml";
    tpd_config cfg;
    ASSERT_EQ(tpd_config_load(path.c_str(), 0, nullptr, &cfg), TPD_OK) << tpd_last_error();
    tpd_config il = cfg; // two chunks a stage: one layer fewer on the very first and last
    il.parallel.virtual_pipeline_model_parallel_size = 2;
    il.parallel.num_pipeline_layers = 32;
    for (int i = 0; i < 32; i++)
        il.parallel.pipeline_layers[i] = i == 0 || i == 31 ? 3 : 4;
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("dgx-h100", &cl), TPD_OK);
    const struct {
        int gpus;
        double tflops, mfu;
    } rows[] = {{8192, 430, 0.43}, {16384, 400, 0.41}};
    for (const auto &row : rows)
        for (const tpd_config *c : {(const tpd_config *)&cfg, (const tpd_config *)&il})
            for (int rc = 0; rc <= 2; rc++) {
                tpd_plan_layout lay;
                tpd_plan_layout_from_config(c, row.gpus, &lay);
                lay.recompute = (tpd_recompute)rc;
                tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
                opt.gpus = row.gpus;
                tpd_plan_result res;
                ASSERT_EQ(tpd_plan_evaluate(c, &cl, &lay, &opt, &res), TPD_OK);
                ASSERT_GT(res.step_time_s, 0.0) << res.reject_reason;
                std::printf("  Llama 3 405B on %5d H100s (TP 8, PP 16, DP %3d, v %d, recompute "
                            "%-9s): predicted %5.1f TFLOP/s/GPU, MFU %4.1f%%; published %3.0f, "
                            "%2.0f%% (mem %.1f GiB, fits %d)\n",
                            row.gpus, lay.dp, lay.virtual_stages,
                            tpd_config_choice("training.recompute", rc), res.tflops_per_gpu,
                            100 * res.mfu, row.tflops, 100 * row.mfu,
                            res.memory_bytes / 1073741824.0, res.fits);
                EXPECT_GT(res.mfu, 0.0);
            }
}

} // namespace
