// Sharded data parallelism in the config: use_distributed_optimizer as strategy optim's
// older name, the error when both are stated and disagree, the shard size against DP, and
// what `tripod train` refuses although the planner models it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "base/status.h"
#include "engine/config/config.h"
}

namespace {

const std::string kSource = TPD_SOURCE_DIR;
const char *kKey = "parallel.data_parallel_sharding_strategy";

tpd_status Load(std::vector<std::string> ov, tpd_config *c) {
    std::vector<const char *> p;
    for (auto &s : ov)
        p.push_back(s.c_str());
    tpd_log_quiet_begin();
    tpd_status st =
        tpd_config_load((kSource + "/configs/demo.yaml").c_str(), (int)p.size(), p.data(), c);
    tpd_log_quiet_end();
    return st;
}

bool Says(const char *what) {
    return std::string(tpd_last_error()).find(what) != std::string::npos;
}

} // namespace

TEST(ConfigSharding, DefaultsShardNothing) {
    tpd_config c;
    ASSERT_EQ(Load({}, &c), TPD_OK) << tpd_last_error();
    EXPECT_EQ(c.parallel.data_parallel_sharding_strategy, TPD_DP_SHARDING_NO_SHARD);
    EXPECT_EQ(c.parallel.use_distributed_optimizer, 0);
    EXPECT_EQ(c.parallel.data_parallel_shard_size, 0);
    EXPECT_EQ(c.parallel.fsdp_units_in_flight, 2);
}

TEST(ConfigSharding, UseDistributedOptimizerIsOptimAndTheStrategiesSetIt) {
    tpd_config c;
    ASSERT_EQ(Load({"parallel.use_distributed_optimizer=true"}, &c), TPD_OK) << tpd_last_error();
    EXPECT_EQ(c.parallel.data_parallel_sharding_strategy, TPD_DP_SHARDING_OPTIM);
    for (int s = TPD_DP_SHARDING_OPTIM; s <= TPD_DP_SHARDING_OPTIM_GRADS_PARAMS; s++) {
        std::string name = tpd_config_choice(kKey, s);
        ASSERT_EQ(Load({std::string(kKey) + "=" + name}, &c), TPD_OK) << tpd_last_error();
        EXPECT_EQ(c.parallel.use_distributed_optimizer, 1) << name;
        EXPECT_EQ((int)c.parallel.data_parallel_sharding_strategy, s);
        // both stated and agreeing is fine
        ASSERT_EQ(
            Load({"parallel.use_distributed_optimizer=true", std::string(kKey) + "=" + name}, &c),
            TPD_OK)
            << tpd_last_error();
    }
    ASSERT_EQ(
        Load({"parallel.use_distributed_optimizer=false", std::string(kKey) + "=no_shard"}, &c),
        TPD_OK)
        << tpd_last_error();
    // the rule is the resolve's too, for a config built in code
    tpd_config d;
    tpd_config_defaults(&d);
    d.parallel.data_parallel_sharding_strategy = TPD_DP_SHARDING_OPTIM_GRADS;
    ASSERT_EQ(tpd_config_resolve(&d), TPD_OK);
    EXPECT_EQ(d.parallel.use_distributed_optimizer, 1);
}

TEST(ConfigSharding, BothStatedAndDisagreeingIsAnErrorNamingBoth) {
    tpd_config c;
    for (const char *name : {"optim", "optim_grads", "optim_grads_params"}) {
        tpd_last_error_clear();
        EXPECT_EQ(
            Load({"parallel.use_distributed_optimizer=false", std::string(kKey) + "=" + name}, &c),
            TPD_ERR_INVALID)
            << name;
        EXPECT_TRUE(Says("<override>: parallel.data_parallel_sharding_strategy"))
            << tpd_last_error();
        EXPECT_TRUE(Says((std::string(name) + " disagrees with parallel.use_distributed_optimizer: "
                                              "false")
                             .c_str()))
            << tpd_last_error();
    }
    tpd_last_error_clear();
    EXPECT_EQ(
        Load({"parallel.use_distributed_optimizer=true", std::string(kKey) + "=no_shard"}, &c),
        TPD_ERR_INVALID);
    EXPECT_TRUE(Says("no_shard disagrees with parallel.use_distributed_optimizer: true"))
        << tpd_last_error();
}

TEST(ConfigSharding, ShardSizeMustDivideDp) {
    tpd_config c;
    ASSERT_EQ(Load({"parallel.data_parallel_shard_size=3", "training.global_batch_size=48",
                    "training.micro_batch_size=1"},
                   &c),
              TPD_OK)
        << tpd_last_error();
    for (int world : {4, 8, 6, 12}) {
        tpd_last_error_clear();
        tpd_status want = world % 3 == 0 ? TPD_OK : TPD_ERR_INVALID;
        EXPECT_EQ(tpd_config_check_world(&c, world), want) << world << ": " << tpd_last_error();
        if (want != TPD_OK) {
            std::string msg = "parallel.data_parallel_shard_size (3) must divide the data parallel "
                              "size (" +
                              std::to_string(world) + ")";
            EXPECT_TRUE(Says(msg.c_str())) << tpd_last_error();
        }
    }
}

TEST(ConfigSharding, TrainRefusesWhatOnlyThePlannerModels) {
    tpd_config c;
    ASSERT_EQ(Load({"parallel.use_distributed_optimizer=true"}, &c), TPD_OK);
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK) << tpd_last_error();
    for (const char *name : {"optim_grads", "optim_grads_params"}) {
        // trained, with every schedule
        for (const char *sched : {"1f1b", "zb-h1"}) {
            ASSERT_EQ(Load({std::string(kKey) + "=" + name,
                            std::string("parallel.pipeline_schedule=") + sched},
                           &c),
                      TPD_OK);
            EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK) << name << " " << tpd_last_error();
        }
        // but not under DiLoCo, whose outer step works on optimizer-state shards
        ASSERT_EQ(Load({std::string(kKey) + "=" + name, "parallel.dp_sync=diloco"}, &c), TPD_OK);
        tpd_last_error_clear();
        tpd_log_quiet_begin();
        EXPECT_EQ(tpd_config_check_trainable(&c), TPD_ERR_INVALID) << name;
        tpd_log_quiet_end();
        std::string want = std::string(kKey) + " " + name +
                           " with parallel.dp_sync diloco: DiLoCo's outer step works on "
                           "optimizer-state shards only";
        EXPECT_TRUE(Says(want.c_str())) << tpd_last_error();
    }
    ASSERT_EQ(Load({"parallel.data_parallel_shard_size=2"}, &c), TPD_OK);
    tpd_log_quiet_begin();
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_ERR_INVALID);
    tpd_log_quiet_end();
    EXPECT_TRUE(Says("parallel.data_parallel_shard_size 2 with "
                     "parallel.data_parallel_sharding_strategy no_shard: `tripod train` shards "
                     "optimizer state (optim) over all of DP only"))
        << tpd_last_error();
    // hybrid sharding trains with the strategies that shard the gradients
    for (const char *name : {"optim_grads", "optim_grads_params"}) {
        ASSERT_EQ(Load({"parallel.data_parallel_shard_size=2", std::string(kKey) + "=" + name}, &c),
                  TPD_OK);
        EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK) << name << " " << tpd_last_error();
    }
    // a shard size that is all of DP is no hybrid
    ASSERT_EQ(Load({"parallel.data_parallel_shard_size=2", "parallel.data_parallel_size=2"}, &c),
              TPD_OK);
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK) << tpd_last_error();
}

TEST(ConfigSharding, TheLayoutCarriesTheStrategyAndAOneRankCopyDropsIt) {
    tpd_config c;
    ASSERT_EQ(
        Load({std::string(kKey) + "=optim_grads_params", "parallel.data_parallel_shard_size=2"},
             &c),
        TPD_OK);
    tpd_config_layout lay;
    tpd_config_layout_get(&c, &lay);
    EXPECT_EQ(lay.sharding, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS);
    EXPECT_EQ(lay.shard_size, 2);
    EXPECT_EQ(lay.distributed_optimizer, 1);
    lay.dp = 4;
    tpd_config o;
    tpd_config_relayout(&c, &lay, &o);
    EXPECT_EQ(o.parallel.data_parallel_sharding_strategy, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS);
    EXPECT_EQ(o.parallel.data_parallel_shard_size, 2);
    lay.dp = 3; // 2 does not divide 3: all of DP
    tpd_config_relayout(&c, &lay, &o);
    EXPECT_EQ(o.parallel.data_parallel_shard_size, 0);
    const tpd_config_layout one = TPD_CONFIG_LAYOUT_INIT;
    tpd_config_relayout(&c, &one, &o);
    EXPECT_EQ(o.parallel.data_parallel_sharding_strategy, TPD_DP_SHARDING_NO_SHARD);
    EXPECT_EQ(o.parallel.use_distributed_optimizer, 0);
    EXPECT_EQ(o.parallel.data_parallel_shard_size, 0);
    // ZeRO-1 by its old name alone is optim
    lay = one;
    lay.dp = 2;
    lay.distributed_optimizer = 1;
    tpd_config_relayout(&c, &lay, &o);
    EXPECT_EQ(o.parallel.data_parallel_sharding_strategy, TPD_DP_SHARDING_OPTIM);
}

// parallel.context_parallel_size: the sequence must cut into 2 x CP chunks; `tripod train`
// trains CP on the cpu backend and refuses it on cuda and under DiLoCo with the reason.
TEST(ConfigContextParallel, ChunksAndRefusal) {
    tpd_config c;
    ASSERT_EQ(Load({"parallel.context_parallel_size=2"}, &c), TPD_OK);
    EXPECT_EQ(tpd_config_cp(&c), 2);
    EXPECT_EQ(tpd_config_dp(&c, 8), 4);       // world 8 / (TP 1 x PP 1 x CP 2)
    EXPECT_EQ(tpd_config_dp_inner(&c, 4), 8); // gradients summed over DP x CP
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK);
    c.training.device = TPD_DEVICE_CUDA;
    tpd_log_quiet_begin();
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_ERR_INVALID);
    tpd_log_quiet_end();
    EXPECT_TRUE(Says("context parallelism trains on the cpu backend")) << tpd_last_error();
    c.training.device = TPD_DEVICE_CPU;
    c.parallel.dp_sync = TPD_DP_SYNC_DILOCO;
    tpd_log_quiet_begin();
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_ERR_INVALID);
    tpd_log_quiet_end();
    EXPECT_TRUE(Says("DiLoCo's replicas split data-parallel ranks")) << tpd_last_error();
    tpd_log_quiet_begin();
    tpd_status st = Load({"parallel.context_parallel_size=3"}, &c); // seq_length not 6k
    tpd_log_quiet_end();
    if (c.model.seq_length % 6) {
        EXPECT_EQ(st, TPD_ERR_INVALID);
        EXPECT_TRUE(Says("needs seq_length")) << tpd_last_error();
    }
}

// The mixture-of-experts keys: what the block cannot be built with fails at load, naming
// the key; expert parallelism with sharded state and CP are refused by `tripod train` with the
// reason. Both backends train it.
TEST(ConfigMoe, KeysAndRefusals) {
    tpd_config c;
    ASSERT_EQ(Load({"model.num_moe_experts=4", "model.moe_router_topk=2"}, &c), TPD_OK);
    EXPECT_EQ(tpd_config_moe(&c), 1);
    EXPECT_EQ(tpd_config_moe_ffn(&c), c.model.ffn_hidden_size); // 0 means the dense width
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK);
    c.training.device = TPD_DEVICE_CUDA;
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK);
    const struct {
        std::vector<std::string> keys;
        const char *says;
    } bad[] = {
        {{"model.num_moe_experts=4", "model.moe_router_topk=5"}, "model.moe_router_topk"},
        {{"model.num_moe_experts=1"}, "at least 2 experts"},
        {{"model.num_moe_experts=4", "model.moe_shared_expert_gate=true"}, "needs shared experts"},
        {{"model.num_moe_experts=4", "model.moe_norm_topk_prob=true"}, "moe_router_pre_softmax"},
        {{"model.num_moe_experts=4", "parallel.expert_model_parallel_size=3"}, "must divide"},
        {{"parallel.expert_model_parallel_size=2"}, "the model has none"},
    };
    for (const auto &b : bad) {
        tpd_log_quiet_begin();
        EXPECT_EQ(Load(b.keys, &c), TPD_ERR_INVALID) << b.says;
        tpd_log_quiet_end();
        EXPECT_TRUE(Says(b.says)) << tpd_last_error();
    }
    // a stack that mixes dense and MoE layers: every second layer from layer 0 MoE
    ASSERT_EQ(Load({"model.num_moe_experts=4", "model.moe_layer_freq=2"}, &c), TPD_OK);
    EXPECT_TRUE(tpd_config_layer_moe(&c, 0));
    EXPECT_FALSE(tpd_config_layer_moe(&c, 1));
    EXPECT_TRUE(tpd_config_layer_moe(&c, 2));
    EXPECT_EQ(tpd_config_moe_layers_before(&c, 0), 0);
    EXPECT_EQ(tpd_config_moe_layers_before(&c, 1), 1);
    EXPECT_EQ(tpd_config_moe_layers_before(&c, 3), 2);
    EXPECT_EQ(tpd_config_moe_layers_before(&c, 4), 2);
    ASSERT_EQ(Load({"model.num_moe_experts=4", "parallel.expert_model_parallel_size=2"}, &c),
              TPD_OK);
    // EP trains over DP ranks it divides, without sharded state
    EXPECT_EQ(tpd_config_ep(&c), 2);
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK);
    EXPECT_EQ(tpd_config_check_world(&c, 4), TPD_OK);
    tpd_log_quiet_begin();
    EXPECT_EQ(tpd_config_check_world(&c, 3), TPD_ERR_INVALID);
    tpd_log_quiet_end();
    EXPECT_TRUE(Says("expert_model_parallel_size (2) must divide the data parallel size (3)"))
        << tpd_last_error();
    c.parallel.use_distributed_optimizer = 1; // ZeRO-1: the experts' state over expert DP
    c.parallel.data_parallel_sharding_strategy = TPD_DP_SHARDING_OPTIM;
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK);
    // ZeRO-2 and ZeRO-3: the experts' units over expert DP, the rest over all of DP
    for (tpd_dp_sharding sh : {TPD_DP_SHARDING_OPTIM_GRADS, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS}) {
        c.parallel.data_parallel_sharding_strategy = sh;
        EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK);
    }
    // and over hybrid shard groups that hold whole EP runs
    c.parallel.data_parallel_shard_size = 4;
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK);
    c.parallel.data_parallel_shard_size = 3;
    tpd_log_quiet_begin();
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_ERR_INVALID);
    tpd_log_quiet_end();
    EXPECT_TRUE(Says("parallel.data_parallel_shard_size 3 with parallel.expert_model_parallel_size "
                     "2: a hybrid shard group must hold whole EP runs"))
        << tpd_last_error();
    // a dense model has no EP to take
    ASSERT_EQ(Load({}, &c), TPD_OK);
    EXPECT_EQ(tpd_config_ep(&c), 1);
}
