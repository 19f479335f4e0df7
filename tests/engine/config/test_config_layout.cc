// A config at another layout (tpd_config_relayout): the layout's fields are set, the fields
// that depend on them follow, the model and the rest of the run stay, and what comes out
// passes the loader's rules again.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

extern "C" {
#include "engine/config/config.h"
}

namespace {

tpd_config Load(const std::vector<std::string> &overrides) {
    std::vector<const char *> ov;
    for (const std::string &o : overrides)
        ov.push_back(o.c_str());
    tpd_config c;
    EXPECT_EQ(tpd_config_load(nullptr, (int)ov.size(), ov.data(), &c), TPD_OK) << tpd_last_error();
    return c;
}

// The config printed and loaded back: every rule a file must obey.
void ExpectLoadsBack(const tpd_config &c) {
    std::string path =
        ::testing::TempDir() + "tripod_relayout_" + std::to_string(getpid()) + ".yaml";
    FILE *f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    tpd_config_print(&c, f);
    fclose(f);
    tpd_config back;
    EXPECT_EQ(tpd_config_load(path.c_str(), 0, nullptr, &back), TPD_OK) << tpd_last_error();
    std::remove(path.c_str());
}

// TP 2, PP 2 with 2 virtual stages and a stated split, SP, ZeRO-1, the TP overlap, full
// recompute of 1 layer, DP 2.
tpd_config Parallel() {
    return Load({"model.num_layers=8", "parallel.tensor_model_parallel_size=2",
                 "parallel.pipeline_model_parallel_size=2",
                 "parallel.virtual_pipeline_model_parallel_size=2",
                 "parallel.pipeline_layers=[1,3,3,1]", "parallel.data_parallel_size=2",
                 "parallel.sequence_parallel=true", "parallel.tp_comm_overlap=true",
                 "parallel.use_distributed_optimizer=true", "training.recompute=full",
                 "training.recompute_num_layers=1", "training.micro_batch_size=2",
                 "training.global_batch_size=16"});
}

TEST(ConfigLayout, GetReadsTheLayoutAndRelayoutToItChangesNothing) {
    tpd_config c = Parallel();
    tpd_config_layout lay;
    tpd_config_layout_get(&c, &lay);
    EXPECT_EQ(lay.tp, 2);
    EXPECT_EQ(lay.pp, 2);
    EXPECT_EQ(lay.dp, 2);
    EXPECT_EQ(lay.vpp, 2);
    EXPECT_EQ(lay.distributed_optimizer, 1);
    EXPECT_EQ(lay.sequence_parallel, 1);
    EXPECT_EQ(lay.recompute, TPD_RECOMPUTE_FULL);
    EXPECT_EQ(lay.recompute_num_layers, 1);
    EXPECT_EQ(lay.micro_batch_size, 2);
    EXPECT_EQ(lay.global_batch_size, 16);
    tpd_config same;
    tpd_config_relayout(&c, &lay, &same);
    EXPECT_EQ(std::memcmp(&same, &c, sizeof c), 0);
    tpd_config_relayout(&c, &lay, &c); // in place
    EXPECT_EQ(std::memcmp(&same, &c, sizeof c), 0);
}

TEST(ConfigLayout, OneRankDropsEverythingThatNeedsMoreRanks) {
    tpd_config c = Parallel(), o;
    const tpd_config_layout one = TPD_CONFIG_LAYOUT_INIT;
    tpd_config_relayout(&c, &one, &o);
    const tpd_config_parallel &p = o.parallel;
    EXPECT_EQ(p.tensor_model_parallel_size, 1);
    EXPECT_EQ(p.pipeline_model_parallel_size, 1);
    EXPECT_EQ(p.data_parallel_size, 1);
    EXPECT_EQ(p.virtual_pipeline_model_parallel_size, 1);
    EXPECT_EQ(p.num_pipeline_layers, 0);
    EXPECT_EQ(p.pipeline_layers[0], 0);
    EXPECT_EQ(p.pipeline_schedule, TPD_SCHEDULE_1F1B);
    EXPECT_EQ(tpd_config_schedule(&o), TPD_SCHEDULE_1F1B);
    EXPECT_EQ(p.sequence_parallel, 0);
    EXPECT_EQ(p.tp_comm_overlap, 0);
    EXPECT_EQ(p.use_distributed_optimizer, 0);
    EXPECT_EQ(o.training.recompute, TPD_RECOMPUTE_NONE);
    EXPECT_EQ(o.training.recompute_num_layers, 0);
    // the batch, the model and the rest of the run are the config's
    EXPECT_EQ(o.training.micro_batch_size, 2);
    EXPECT_EQ(o.training.global_batch_size, 16);
    EXPECT_EQ(std::memcmp(&o.model, &c.model, sizeof c.model), 0);
    EXPECT_EQ(std::memcmp(&o.optimizer, &c.optimizer, sizeof c.optimizer), 0);
    EXPECT_EQ(p.ddp_bucket_size, c.parallel.ddp_bucket_size);
    EXPECT_EQ(o.training.seed, c.training.seed);
    EXPECT_EQ(tpd_config_check_world(&o, 1), TPD_OK) << tpd_last_error();
    EXPECT_EQ(tpd_config_check_trainable(&o), TPD_OK) << tpd_last_error();
    ExpectLoadsBack(o);
    // a batch of its own
    tpd_config_layout sample = TPD_CONFIG_LAYOUT_INIT;
    sample.micro_batch_size = sample.global_batch_size = 1;
    tpd_config_relayout(&c, &sample, &o);
    EXPECT_EQ(o.training.micro_batch_size, 1);
    EXPECT_EQ(o.training.global_batch_size, 1);
}

TEST(ConfigLayout, TheSplitStaysWithItsPipelineAndSpWithTp) {
    tpd_config c = Parallel(), o;
    tpd_config_layout lay;
    // TP 1 at the same pipeline: the split and the schedule stay, SP and its overlap go
    tpd_config_layout_get(&c, &lay);
    lay.tp = 1;
    tpd_config_relayout(&c, &lay, &o);
    EXPECT_EQ(o.parallel.num_pipeline_layers, 4);
    EXPECT_EQ(o.parallel.pipeline_layers[1], 3);
    EXPECT_EQ(o.parallel.virtual_pipeline_model_parallel_size, 2);
    EXPECT_EQ(tpd_config_schedule(&o), TPD_SCHEDULE_INTERLEAVED);
    EXPECT_EQ(o.parallel.sequence_parallel, 0);
    EXPECT_EQ(o.parallel.tp_comm_overlap, 0);
    EXPECT_EQ(o.parallel.use_distributed_optimizer, 1);
    EXPECT_EQ(o.training.recompute_num_layers, 1);
    ExpectLoadsBack(o);
    // PP 4 without virtual stages: the split of 2x2 virtual stages means nothing there
    tpd_config_layout_get(&c, &lay);
    lay.pp = 4;
    lay.vpp = 1;
    tpd_config_relayout(&c, &lay, &o);
    EXPECT_EQ(o.parallel.num_pipeline_layers, 0);
    EXPECT_EQ(o.parallel.pipeline_schedule, TPD_SCHEDULE_1F1B); // interleaved needs vpp > 1
    EXPECT_EQ(o.parallel.sequence_parallel, 1);
    EXPECT_EQ(o.parallel.tp_comm_overlap, 1);
    ExpectLoadsBack(o);
    // no pipeline: no virtual stages either, whatever the layout asks
    tpd_config_layout_get(&c, &lay);
    lay.pp = 1;
    tpd_config_relayout(&c, &lay, &o);
    EXPECT_EQ(o.parallel.virtual_pipeline_model_parallel_size, 1);
    EXPECT_EQ(o.parallel.num_pipeline_layers, 0);
    ExpectLoadsBack(o);
    // zb-h1 stays at another pipeline depth, goes without a pipeline
    tpd_config z = Load({"model.num_layers=8", "parallel.pipeline_model_parallel_size=2",
                         "parallel.pipeline_schedule=zb-h1"});
    tpd_config_layout_get(&z, &lay);
    lay.pp = 4;
    tpd_config_relayout(&z, &lay, &o);
    EXPECT_EQ(o.parallel.pipeline_schedule, TPD_SCHEDULE_ZB_H1);
    lay.pp = 1;
    tpd_config_relayout(&z, &lay, &o);
    EXPECT_EQ(o.parallel.pipeline_schedule, TPD_SCHEDULE_1F1B);
    // recompute_num_layers is a count of fully recomputed layers: none without full
    tpd_config_layout_get(&c, &lay);
    lay.recompute = TPD_RECOMPUTE_SELECTIVE;
    tpd_config_relayout(&c, &lay, &o);
    EXPECT_EQ(o.training.recompute, TPD_RECOMPUTE_SELECTIVE);
    EXPECT_EQ(o.training.recompute_num_layers, 0);
    ExpectLoadsBack(o);
}

} // namespace
