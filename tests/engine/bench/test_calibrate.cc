// The calibration's single-process pieces: the latency/bandwidth fit, and the calibrated
// profile's round trip through the planner's YAML loader.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "common/tiny.h"
#include "engine/plan/plan_test_util.h"

extern "C" {
#include "engine/bench/calib_timer.h"
#include "engine/plan/plan.h"
}

using plan_test::sample_cpu_profile;

namespace {

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
    for (int i = 0; i < 6; i++)
        t[i] = x[i] / 1e9;
    ASSERT_TRUE(tpd_calib_fit(x, y, t, 6, &inv_bw, &lat));
    EXPECT_GE(lat, 0.0);
    EXPECT_NEAR(1.0 / inv_bw, 1e9, 1e3);
    EXPECT_FALSE(tpd_calib_fit(x, y, t, 1, &inv_bw, &lat));
}

TEST(SweepCalib, ProfileRoundTripsThroughTheLoader) {
    tpd_plan_cluster c = sample_cpu_profile(), back;
    c.calibrated_bf16 = 1;
    std::string path = tiny::temp_prefix("profile") + ".yaml";
    ASSERT_EQ(tpd_plan_cluster_save(&c, path.c_str(), "a test profile\nsecond line"), TPD_OK);
    ASSERT_EQ(tpd_plan_cluster_load(path.c_str(), &back), TPD_OK);
    EXPECT_STREQ(back.name, "unit-cpu");
    EXPECT_EQ(back.backend, TPD_PLAN_BACKEND_CPU);
    EXPECT_EQ(back.calibrated, 1);
    EXPECT_EQ(back.calibrated_bf16, 1);
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

} // namespace
