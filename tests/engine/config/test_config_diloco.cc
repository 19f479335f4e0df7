// DiLoCo's rules in the config: the replica split of DP and the fragment schedule.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

extern "C" {
#include "base/status.h"
#include "engine/config/config.h"
}

namespace {

tpd_config Diloco(int H, int F, int overlap, int replicas) {
    tpd_config c;
    std::memset(&c, 0, sizeof c);
    tpd_config_defaults(&c);
    c.parallel.dp_sync = TPD_DP_SYNC_DILOCO;
    c.diloco.sync_interval = H;
    c.diloco.fragments = F;
    c.diloco.overlap_steps = overlap;
    c.diloco.replicas = replicas;
    return c;
}

} // namespace

TEST(ConfigDiloco, ReplicasSplitDp) {
    tpd_config c = Diloco(20, 1, 0, 0);
    EXPECT_EQ(tpd_config_dp_replicas(&c, 8), 8); // 0: one replica per DP rank
    EXPECT_EQ(tpd_config_dp_inner(&c, 8), 1);
    c.diloco.replicas = 2;
    EXPECT_EQ(tpd_config_dp_replicas(&c, 8), 2);
    EXPECT_EQ(tpd_config_dp_inner(&c, 8), 4);
    c.parallel.dp_sync = TPD_DP_SYNC_EVERY_STEP; // the section is not read
    EXPECT_EQ(tpd_config_dp_replicas(&c, 8), 1);
    EXPECT_EQ(tpd_config_dp_inner(&c, 8), 8);
}

TEST(ConfigDiloco, WorldCheckRefusesReplicasThatDoNotDivideDp) {
    tpd_config c = Diloco(20, 1, 0, 3);
    c.training.global_batch_size = 12;
    tpd_last_error_clear();
    EXPECT_EQ(tpd_config_check_world(&c, 4), TPD_ERR_INVALID);
    EXPECT_NE(std::string(tpd_last_error())
                  .find("diloco.replicas (3) must divide the data "
                        "parallel size (4)"),
              std::string::npos)
        << tpd_last_error();
    c.diloco.replicas = 2;
    EXPECT_EQ(tpd_config_check_world(&c, 4), TPD_OK);
}

TEST(ConfigDiloco, OneFragmentSyncsAtMultiplesOfH) {
    tpd_config c = Diloco(5, 1, 0, 0);
    for (int t = 0; t <= 30; t++) {
        EXPECT_EQ(tpd_diloco_sync_fragment(&c, t), t > 0 && t % 5 == 0 ? 0 : -1) << t;
        EXPECT_EQ(tpd_diloco_pending_fragment(&c, t), -1) << t; // no overlap
    }
    c.parallel.dp_sync = TPD_DP_SYNC_EVERY_STEP;
    for (int t = 0; t <= 30; t++)
        EXPECT_EQ(tpd_diloco_sync_fragment(&c, t), -1) << t;
}

TEST(ConfigDiloco, FragmentsAreStaggeredAndEachSyncsEveryH) {
    const int H = 20, F = 4;
    tpd_config c = Diloco(H, F, 0, 0);
    int count[F] = {0}, last[F] = {0};
    for (int t = 1; t <= 10 * H; t++) {
        int f = tpd_diloco_sync_fragment(&c, t);
        if (f < 0) continue;
        ASSERT_LT(f, F);
        if (count[f]) EXPECT_EQ(t - last[f], H) << "fragment " << f; // every H steps
        count[f]++;
        last[f] = t;
    }
    for (int f = 0; f < F; f++)
        EXPECT_EQ(count[f], 10) << f;
    // H/F apart, fragment 0 first, the last one at multiples of H
    EXPECT_EQ(tpd_diloco_sync_fragment(&c, 5), 0);
    EXPECT_EQ(tpd_diloco_sync_fragment(&c, 10), 1);
    EXPECT_EQ(tpd_diloco_sync_fragment(&c, 15), 2);
    EXPECT_EQ(tpd_diloco_sync_fragment(&c, 20), 3);
    EXPECT_EQ(tpd_diloco_sync_fragment(&c, 21), -1);
}

TEST(ConfigDiloco, PendingCoversTheOverlapWindow) {
    const int H = 20, F = 4, tau = 2;
    tpd_config c = Diloco(H, F, tau, 0);
    for (int t = 1; t <= 3 * H; t++) {
        // in flight after steps s .. s+tau-1 of a fragment that started after step s
        int want = -1;
        for (int s = t - tau + 1; s <= t; s++)
            if (s >= 1 && tpd_diloco_sync_fragment(&c, s) >= 0)
                want = tpd_diloco_sync_fragment(&c, s);
        EXPECT_EQ(tpd_diloco_pending_fragment(&c, t), want) << t;
    }
    EXPECT_EQ(tpd_diloco_pending_fragment(&c, 5), 0);  // started now
    EXPECT_EQ(tpd_diloco_pending_fragment(&c, 6), 0);  // still in flight
    EXPECT_EQ(tpd_diloco_pending_fragment(&c, 7), -1); // applied after step 7
}

TEST(ConfigDiloco, TrainRunsDilocoAndSgdButNotTheBf16OuterWireOnCuda) {
    tpd_config c = Diloco(20, 1, 0, 0);
    c.optimizer.type = TPD_OPTIM_SGD;
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK) << tpd_last_error();
    c.diloco.reduce_dtype = TPD_REDUCE_BF16;
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK) << tpd_last_error(); // cpu: MPI
    c.training.device = TPD_DEVICE_CUDA;
    tpd_last_error_clear();
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_ERR_INVALID);
    EXPECT_NE(std::string(tpd_last_error()).find("diloco.reduce_dtype bf16"), std::string::npos)
        << tpd_last_error();
    c.diloco.reduce_dtype = TPD_REDUCE_FP32;
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK) << tpd_last_error();
}

TEST(ConfigDiloco, TrainRefusesTheBf16WireOnCuda) {
    tpd_config c;
    std::memset(&c, 0, sizeof c);
    tpd_config_defaults(&c);
    c.parallel.grad_reduce_dtype = TPD_REDUCE_BF16;
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK) << tpd_last_error(); // cpu: MPI
    c.training.device = TPD_DEVICE_CUDA;
    tpd_last_error_clear();
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_ERR_INVALID);
    EXPECT_NE(std::string(tpd_last_error()).find("parallel.grad_reduce_dtype bf16"),
              std::string::npos)
        << tpd_last_error();
}
