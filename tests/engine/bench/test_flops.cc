// One home for the model's FLOPs: the trainer's log line, the sweep's measured throughput
// and the planner's prediction all count the same FLOPs, also when the MLP is not 4x the
// hidden size (Megatron's 72*B*s*l*h^2 formula assumes it is).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "common/tiny.h"

extern "C" {
#include "engine/bench/sweep.h"
#include "engine/model/model_flops.h"
#include "engine/plan/plan.h"
#include "engine/train/train.h"
#include "parallel/comm.h"
}

namespace {

tpd_comm *g_world = nullptr;

TEST(Flops, TrainSweepAndPlannerAgreeForAnyFfnWidth) {
    std::string data = tiny::write_corpus(tiny::temp_prefix("flops_corpus"));
    std::string path = tiny::temp_prefix("flops.yaml");
    // ffn_hidden_size 3*hidden: not the 4*hidden Megatron's closed form assumes
    std::ofstream(path) << "model:\n  num_layers: 2\n  hidden_size: 32\n  num_attention_heads: 4\n"
                           "  ffn_hidden_size: 96\n  vocab_size: 257\n  seq_length: 16\n"
                           "training:\n  micro_batch_size: 2\n  global_batch_size: 8\n"
                           "  train_iters: 1\n  num_threads: 1\n"
                           "data:\n  data_path: "
                        << data << "\n";
    tpd_config cfg;
    char err[1024];
    ASSERT_EQ(tpd_config_load(path.c_str(), 0, nullptr, &cfg, err, sizeof err), TPD_OK) << err;
    double B = cfg.training.global_batch_size, s = cfg.model.seq_length;
    double l = cfg.model.num_layers, h = cfg.model.hidden_size;
    double V = tpd_config_padded_vocab(&cfg, 1);
    double want = tpd_model_flops(&cfg, B, V);
    double at_4h = 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
    // The width matters here: a function that ignored it would count 4h and be caught.
    EXPECT_GT(std::fabs(at_4h - want) / want, 0.05);
    cfg.model.ffn_hidden_size = 4 * cfg.model.hidden_size;
    EXPECT_NEAR(tpd_model_flops(&cfg, B, V) / at_4h, 1.0, 1e-12) << "Megatron's formula at 4h";
    cfg.model.ffn_hidden_size = 96;

    // the trainer's figure (its log line and JSONL throughput)
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_DOUBLE_EQ(tpd_trainer_flops_per_iteration(tr), want);
    tpd_trainer_destroy(tr);

    // the planner's
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("cpu", &cl), TPD_OK);
    tpd_plan_layout lay;
    tpd_plan_layout_from_config(&cfg, 1, &lay);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 1;
    tpd_plan_result res;
    ASSERT_EQ(tpd_plan_evaluate(&cfg, &cl, &lay, &opt, &res), TPD_OK);
    EXPECT_DOUBLE_EQ(res.model_flops, want);

    // the sweep's: its TFLOP/s per rank times the step time is the FLOPs it counted
    tpd_sweep_options so = TPD_SWEEP_OPTIONS_INIT;
    so.steps = 1;
    so.warmup = 0;
    so.plot = 0;
    so.traces = 0;
    so.verbose = 0;
    std::snprintf(so.out_dir, sizeof so.out_dir, "%s", tiny::temp_prefix("flops_sweep").c_str());
    tpd_sweep_result r;
    ASSERT_EQ(tpd_sweep_run(path.c_str(), 0, nullptr, g_world, &so, &r), TPD_OK);
    ASSERT_EQ(r.n, 1);
    const tpd_sweep_trial &t = r.trials[0];
    ASSERT_EQ(t.state, TPD_SWEEP_OK) << t.reason;
    EXPECT_NEAR(t.tflops_per_rank * 1e12 * t.t_median * t.world / want, 1.0, 1e-9);
    tpd_sweep_result_free(&r);
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    if (tpd_comm_mpi_start(&g_world) != TPD_OK) return 1;
    int rc = RUN_ALL_TESTS();
    tpd_comm_mpi_finish(g_world);
    return rc;
}
