// Single-process pieces of the sweep: the latency/bandwidth fit, the calibrated profile's
// round trip through the YAML loader, the planner's cpu time model, and the real-run
// trace recorder on one rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cjson/cJSON.h>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "../common/tiny.h"

extern "C" {
#include "engine/calibrate.h"
#include "engine/plan/plan.h"
#include "engine/trace_run.h"
#include "engine/train.h"
#include "parallel/comm.h"
}

namespace {

tpd_comm *g_world = nullptr;

TEST(SweepCalib, FitRecoversLatencyAndBandwidth) {
    // t = x / (2 GB/s) + y * 5 us, as the calibration fits collectives.
    double x[6], y[6], t[6];
    for (int i = 0; i < 6; i++) {
        x[i] = 1000.0 * std::pow(8.0, i);
        y[i] = 1 + i % 2;
        t[i] = x[i] / 2e9 + y[i] * 5e-6;
    }
    double inv_bw = 0, lat = 0;
    ASSERT_TRUE(tpd_calib_fit(x, y, t, 6, &inv_bw, &lat));
    EXPECT_NEAR(1.0 / inv_bw, 2e9, 2e9 * 1e-6);
    EXPECT_NEAR(lat, 5e-6, 5e-12);
    // Pure bandwidth data never gives a negative latency.
    for (int i = 0; i < 6; i++) t[i] = x[i] / 1e9;
    ASSERT_TRUE(tpd_calib_fit(x, y, t, 6, &inv_bw, &lat));
    EXPECT_GE(lat, 0.0);
    EXPECT_NEAR(1.0 / inv_bw, 1e9, 1e3);
    EXPECT_FALSE(tpd_calib_fit(x, y, t, 1, &inv_bw, &lat));
}

tpd_plan_cluster sample_profile() {
    tpd_plan_cluster c;
    EXPECT_EQ(tpd_plan_cluster_load("cpu", &c), TPD_OK);
    std::snprintf(c.name, sizeof c.name, "unit-cpu");
    c.calibrated = 1;
    c.cpu_cores = 2;
    c.calibration_ranks = 4;
    c.gpus_per_node = 8;
    c.peak_flops = 20e9;
    c.gemm_curve_len = 2;
    c.gemm_curve_flops[0] = 1e5, c.gemm_curve_eff[0] = 0.5;
    c.gemm_curve_flops[1] = 1e7, c.gemm_curve_eff[1] = 0.8;
    c.attn_curve_len = 1;
    c.attn_curve_flops[0] = 1e6, c.attn_curve_eff[0] = 0.3;
    c.gemm_bwd_ratio = 2.1;
    c.attn_bwd_ratio = 1.4;
    c.ew_add = 0.25e-9, c.ew_layernorm_fwd = 2e-9, c.ew_layernorm_bwd = 3e-9;
    c.ew_gelu_fwd = 14e-9, c.ew_gelu_bwd = 17e-9, c.ew_xent_fwd = 6e-9, c.ew_xent_bwd = 5e-9;
    c.ew_adamw = 4e-9, c.ew_sumsq = 0.7e-9, c.ew_zero = 0.1e-9;
    c.p2p_bw = 4e9;
    c.p2p_latency = 5e-6;
    c.intra_bw = 1.2e9;
    c.intra_latency = 7e-6;
    return c;
}

TEST(SweepCalib, ProfileRoundTripsThroughTheLoader) {
    tpd_plan_cluster c = sample_profile(), back;
    std::string path = tiny::temp_prefix("profile") + ".yaml";
    ASSERT_EQ(tpd_plan_cluster_save(&c, path.c_str(), "a test profile\nsecond line"), TPD_OK);
    ASSERT_EQ(tpd_plan_cluster_load(path.c_str(), &back), TPD_OK);
    EXPECT_STREQ(back.name, "unit-cpu");
    EXPECT_EQ(back.backend, TPD_PLAN_BACKEND_CPU);
    EXPECT_EQ(back.calibrated, 1);
    EXPECT_EQ(back.gpus_per_node, 8);
    EXPECT_DOUBLE_EQ(back.cpu_cores, 2);
    EXPECT_NEAR(back.peak_flops, 20e9, 1e4);
    ASSERT_EQ(back.gemm_curve_len, 2);
    EXPECT_NEAR(back.gemm_curve_eff[1], 0.8, 1e-4);
    ASSERT_EQ(back.attn_curve_len, 1);
    EXPECT_NEAR(back.attn_bwd_ratio, 1.4, 1e-3);
    EXPECT_NEAR(back.ew_gelu_bwd, 17e-9, 1e-12);
    EXPECT_NEAR(back.ew_zero, 0.1e-9, 1e-13);
    EXPECT_NEAR(back.p2p_latency, 5e-6, 1e-10);
    EXPECT_NEAR(back.intra_bw, 1.2e9, 1e4);
    std::remove(path.c_str());
    // A bad kernel name in elementwise_ns names the file, line and key.
    std::ofstream(path) << "gpus_per_node: 1\npeak_tflops: 1\nhbm_gib: 1\nhbm_bw_gbs: 1\n"
                           "intra_node_bw_gbs: 1\ninter_node_bw_gbs: 1\nbackend: cpu\n"
                           "elementwise_ns:\n  gelu: 3\n";
    EXPECT_EQ(tpd_plan_cluster_load(path.c_str(), &back), TPD_ERR_INVALID);
    std::remove(path.c_str());
}

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

tpd_plan_result predict(const tpd_config &cfg, const tpd_plan_cluster &cl, int tp, int pp,
                        int dp) {
    tpd_plan_layout lay = {tp, pp, dp, 1, 1, TPD_PLAN_RECOMPUTE_NONE, 0, 0};
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
    tpd_plan_cluster cl = sample_profile();
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
    tpd_plan_layout lay = {1, 2, 2, 1, 1, TPD_PLAN_RECOMPUTE_NONE, 0, 0};
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

TEST(SweepTrace, RecorderWritesEveryActionOfOneRank) {
    std::string data = tiny::write_corpus(tiny::temp_prefix("trace"));
    tpd_config cfg = tiny::config(data);
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    tpd_trace_run *rec = nullptr;
    ASSERT_EQ(tpd_trace_run_create(tr, g_world, 2, &rec), TPD_OK);
    for (int i = 0; i < 3; i++) { // the third step is past max_steps: not recorded
        tpd_step_stats s;
        ASSERT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
        tpd_trace_run_step_end(rec, &s);
    }
    std::string path = tiny::temp_prefix("trace") + ".json";
    ASSERT_EQ(tpd_trace_run_write(rec, path.c_str()), TPD_OK);
    tpd_trace_run_destroy(rec, tr);
    EXPECT_EQ(tr->on_action, nullptr);
    int M = tr->M;
    tpd_trainer_destroy(tr);
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    cJSON *js = cJSON_Parse(ss.str().c_str());
    ASSERT_NE(js, nullptr);
    int fwd = 0, bwd = 0, opt = 0, named = 0;
    double last_end = 0, prev_ts = -1;
    bool ordered = true;
    cJSON *ev;
    cJSON_ArrayForEach(ev, cJSON_GetObjectItem(js, "traceEvents")) {
        std::string name = cJSON_GetObjectItem(ev, "name")->valuestring;
        if (name == "process_name") {
            named++;
            continue;
        }
        double ts = cJSON_GetObjectItem(ev, "ts")->valuedouble;
        double dur = cJSON_GetObjectItem(ev, "dur")->valuedouble;
        EXPECT_GE(dur, 0.0);
        EXPECT_GE(ts, 0.0);
        if (ts < prev_ts) ordered = false;
        prev_ts = ts;
        last_end = std::max(last_end, ts + dur);
        fwd += name.rfind("FWD mb=", 0) == 0;
        bwd += name.rfind("BWD mb=", 0) == 0;
        opt += name == "OPTIMIZER";
    }
    EXPECT_EQ(named, 1);
    EXPECT_EQ(fwd, 2 * M);
    EXPECT_EQ(bwd, 2 * M);
    EXPECT_EQ(opt, 2);
    EXPECT_TRUE(ordered);
    EXPECT_GT(last_end, 0.0);
    cJSON_Delete(js);
    std::remove(path.c_str());
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    MPI_Init(&argc, &argv);
    tpd_comm_mpi_world(&g_world);
    int rc = RUN_ALL_TESTS();
    g_world->ops->destroy(g_world);
    MPI_Finalize();
    return rc;
}
