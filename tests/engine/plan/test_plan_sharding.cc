// Sharded data parallelism in the planner: memory per rank falls with each strategy (by the
// shard group, plus the gathered working set computed here from the model's shapes), the
// search finds a fitting layout for Llama 3 8B on one DGX H100 through sharding, HSDP pays
// its replica all-reduce, and slow links expose the gathers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

extern "C" {
#include "base/file.h"
#include "base/status.h"
#include "engine/config/config.h"
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"
}

namespace {

const std::string kSource = tpd_source_dir();

struct Fixture {
    tpd_config cfg;
    tpd_plan_cluster cl;
};

Fixture Load() {
    Fixture s;
    EXPECT_EQ(tpd_config_load((kSource + "/configs/llama3-8b.yaml").c_str(), 0, nullptr, &s.cfg),
              TPD_OK)
        << tpd_last_error();
    EXPECT_EQ(tpd_plan_cluster_load("dgx-h100", &s.cl), TPD_OK) << tpd_last_error();
    return s;
}

tpd_plan_layout Layout(int dp, tpd_dp_sharding sh, int shard_size) {
    tpd_plan_layout l;
    std::memset(&l, 0, sizeof l);
    l.tp = 1, l.pp = 1, l.dp = dp, l.micro_batch_size = 1, l.virtual_stages = 1;
    l.schedule = TPD_SCHEDULE_1F1B;
    l.recompute = TPD_RECOMPUTE_FULL;
    l.overlap_grad_reduce = l.overlap_param_gather = 1;
    l.sharding = sh;
    l.distributed_optimizer = sh != TPD_DP_SHARDING_NO_SHARD;
    l.shard_size = shard_size;
    return l;
}

tpd_plan_result Eval(const Fixture &s, const tpd_plan_layout &l, int time) {
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = l.tp * l.pp * l.dp;
    opt.evaluate_time = time;
    opt.balance_stages = 0;
    tpd_plan_result r;
    EXPECT_EQ(tpd_plan_evaluate(&s.cfg, &s.cl, &l, &opt, &r), TPD_OK) << tpd_last_error();
    EXPECT_TRUE(r.fits || std::string(r.reject_reason).rfind("OOM", 0) == 0) << r.reject_reason;
    return r;
}

// The largest FSDP unit of one rank of a one-stage Llama at TP 1, from the shapes: a layer
// (Q and the output projection h x h, K and V h x h_kv, SwiGLU's three h x f, two RMSNorm
// weights), the embedding (V_pad x h), the final norm with the untied output layer.
struct Units {
    double embedding, layer, final;
};
Units UnitsOf(const tpd_config &c) {
    const double h = c.model.hidden_size, f = c.model.ffn_hidden_size;
    const double kv = h * c.model.num_query_groups / c.model.num_attention_heads;
    const double v = std::ceil(c.model.vocab_size / 128.0) * 128.0;
    return {v * h, 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h, h + v * h};
}
double LargestUnit(const tpd_config &c) {
    Units u = UnitsOf(c);
    return std::max({u.layer, u.embedding, u.final});
}
// A unit's staging slot: DP parts of ceil(len / DP) elements.
double Slot(double len, int dp) {
    return std::ceil(len / dp) * dp;
}

} // namespace

TEST(PlanSharding, MemoryPerRankFallsWithEachStrategy) {
    Fixture s = Load();
    const int dp = 8;
    tpd_plan_result r[4];
    for (int sh = 0; sh < 4; sh++)
        r[sh] = Eval(s, Layout(dp, (tpd_dp_sharding)sh, 0), 0);
    for (int sh = 1; sh < 4; sh++)
        EXPECT_LT(r[sh].memory_bytes, r[sh - 1].memory_bytes) << sh;
    const tpd_plan_stage_mem &m0 = r[0].mem[0], &m1 = r[1].mem[0], &m2 = r[2].mem[0],
                             &m3 = r[3].mem[0];
    const double n = m0.params / 2.0; // bf16 parameters, padded to a multiple of DP
    EXPECT_NEAR(n, tpd_plan_params_count(&s.cfg), 1024.0 + 128.0 * 4096); // vocab padding
    // optim: the optimizer state over DP
    EXPECT_NEAR(m1.optimizer, m0.optimizer / dp, 64.0);
    EXPECT_EQ(m1.grads, m0.grads);
    // optim_grads: the main gradients too (each unit's DP part), plus the engine's staging
    // slots: two of the largest layer or final unit's fp32 gradients (the untied output
    // layer's) and the embedding's own
    EXPECT_NEAR(m2.grads, m0.grads / dp, 64.0);
    const Units u = UnitsOf(s.cfg);
    const double gslot = std::max(Slot(u.layer, dp), Slot(u.final, dp));
    const double grad_slots = (2.0 * gslot + Slot(u.embedding, dp)) * 4.0;
    EXPECT_DOUBLE_EQ(m2.gather, grad_slots);
    // optim_grads_params: the parameters too, plus max(fsdp_units_in_flight, 2) slots of the
    // largest unit's bf16 parameters
    EXPECT_NEAR(m3.params + m3.grads, (m0.params + m0.grads) / dp, 64.0);
    const int k = std::max(s.cfg.parallel.fsdp_units_in_flight, 2);
    EXPECT_DOUBLE_EQ(m3.gather, k * Slot(LargestUnit(s.cfg), dp) * 2.0 + grad_slots);
    EXPECT_NEAR(m3.total, m2.total - m2.gather - (m2.params - m3.params) + m3.gather, 1.0);
    // the report's unsharded figures are no_shard's
    EXPECT_EQ(m3.params_full, m0.params);
    EXPECT_EQ(m3.grads_full, m0.grads);
    EXPECT_EQ(m3.optimizer_full, m0.optimizer);
}

TEST(PlanSharding, LlamaEightBOnOneDgxH100FitsThroughSharding) {
    Fixture s = Load();
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 8;
    opt.top_k = 5;
    tpd_plan_search search;
    ASSERT_EQ(tpd_plan_search_run(&s.cfg, &s.cl, &opt, &search), TPD_OK) << tpd_last_error();
    ASSERT_GT(search.n_top, 0);
    const tpd_plan_result &best = search.top[0];
    EXPECT_TRUE(best.fits);
    EXPECT_LE(best.memory_bytes, s.cl.hbm_bytes * s.cl.hbm_usable_fraction);
    EXPECT_GT(tpd_plan_sharding(&best.layout), TPD_DP_SHARDING_NO_SHARD);
    // the same layout unsharded needs more than the GPU has
    tpd_plan_layout l = best.layout;
    l.sharding = TPD_DP_SHARDING_NO_SHARD;
    l.distributed_optimizer = 0;
    l.shard_size = 0;
    tpd_plan_options o = opt;
    o.evaluate_time = 0;
    tpd_plan_result r;
    ASSERT_EQ(tpd_plan_evaluate(&s.cfg, &s.cl, &l, &o, &r), TPD_OK);
    EXPECT_GT(r.memory_bytes, best.memory_bytes);
    // its overrides name the strategy, so that the line is what was planned
    char buf[4096];
    ASSERT_GT(tpd_plan_overrides(&s.cfg, &best, buf, sizeof buf), 0);
    std::string want = std::string("parallel.data_parallel_sharding_strategy=") +
                       tpd_config_choice("parallel.data_parallel_sharding_strategy",
                                         tpd_plan_sharding(&best.layout));
    EXPECT_NE(std::string(buf).find(want), std::string::npos) << buf;
    tpd_plan_search_free(&search);
}

TEST(PlanSharding, HybridShardingPaysTheReplicaAllReduceAndKeepsAnEighth) {
    Fixture s = Load();
    tpd_plan_result full = Eval(s, Layout(16, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, 0), 1);
    tpd_plan_result hsdp = Eval(s, Layout(16, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, 8), 1);
    tpd_plan_result dp8 = Eval(s, Layout(8, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, 0), 0);
    EXPECT_EQ(full.time.dp_replica_allreduce, 0.0);
    EXPECT_EQ(hsdp.shard_group, 8);
    // memory: a shard of 1/8, as all of DP 8 keeps
    const tpd_plan_stage_mem &h = hsdp.mem[0];
    EXPECT_NEAR(h.params, h.params_full / 8, 64.0);
    EXPECT_NEAR(h.grads, h.grads_full / 8, 64.0);
    EXPECT_NEAR(h.optimizer, h.optimizer_full / 8, 64.0);
    EXPECT_NEAR(h.params + h.grads + h.optimizer,
                dp8.mem[0].params + dp8.mem[0].grads + dp8.mem[0].optimizer, 1024.0);
    EXPECT_GT(full.memory_bytes, 0.0);
    EXPECT_LT(full.mem[0].params, h.params);
    // time: the shard all-reduced over the 2 replicas, 8 ranks apart (across the nodes)
    double bw, lat;
    tpd_plan_group_link(&s.cl, 2, 8, &bw, &lat);
    double bytes = std::ceil(h.params_full / 2.0 / 8) * tpd_plan_dp_wire_bytes(&s.cfg);
    double want = 2.0 * (2 - 1) / 2 * bytes / bw + 2.0 * (2 - 1) * lat;
    EXPECT_NEAR(hsdp.time.dp_replica_allreduce, want, 1e-9 + 1e-6 * want);
    EXPECT_GT(hsdp.time.dp_replica_allreduce, 0.0);
    EXPECT_EQ(hsdp.hop_replica, TPD_PLAN_HOP_NETWORK);
    EXPECT_NEAR(hsdp.step_time_s - hsdp.time.dp_replica_allreduce,
                hsdp.time.compute + hsdp.time.pp_bubble + hsdp.time.pp_p2p +
                    hsdp.time.dp_comm_exposed + hsdp.time.optimizer + hsdp.time.dp_gather_exposed +
                    hsdp.time.dp_shard_exposed + hsdp.time.straggler + hsdp.time.global_sync +
                    hsdp.time.step_host + hsdp.time.dp_outer + hsdp.time.outer_update,
                1e-9);
}

TEST(PlanSharding, GathersOnASlowLinkAreExposed) {
    Fixture s = Load();
    tpd_plan_layout l = Layout(8, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, 0);
    tpd_plan_result fast = Eval(s, l, 1);
    Fixture slow = s;
    slow.cl.intra_bw /= 100.0; // NVLink at a hundredth
    tpd_plan_result r = Eval(slow, l, 1);
    EXPECT_GT(r.time.dp_shard_exposed, fast.time.dp_shard_exposed);
    // per micro-batch at least the first unit's gather of each pass, on the group's link
    double bw, lat;
    tpd_plan_group_link(&slow.cl, 8, 1, &bw, &lat);
    double unit = LargestUnit(s.cfg);
    double first = 7.0 / 8 * unit * 2.0 / bw + 7 * lat; // the embedding, forward
    EXPECT_GT(r.time.dp_shard_exposed, r.num_micro_batches * first);
    // one unit in flight: no prefetch, every gather exposed
    slow.cfg.parallel.fsdp_units_in_flight = 1;
    tpd_plan_result one = Eval(slow, l, 1);
    EXPECT_GT(one.time.dp_shard_exposed, r.time.dp_shard_exposed);
    // the engine keeps two parameter slots at least (one gathering while the other computes)
    EXPECT_EQ(one.memory_bytes, r.memory_bytes);
    // the cpu backend prices the strategies the engine trains there (every one over all of
    // DP, hybrid sharding under optim_grads and optim_grads_params) and leaves out ZeRO-1
    // over a shard group, with the reason
    tpd_plan_cluster cpu;
    ASSERT_EQ(tpd_plan_cluster_load("cpu", &cpu), TPD_OK);
    char why[192];
    EXPECT_TRUE(tpd_plan_layout_valid(&s.cfg, &cpu, &l, 8, why, sizeof why)) << why;
    tpd_plan_layout h = Layout(8, TPD_DP_SHARDING_OPTIM, 4);
    EXPECT_FALSE(tpd_plan_layout_valid(&s.cfg, &cpu, &h, 8, why, sizeof why));
    EXPECT_NE(std::string(why).find("cpu: tripod train shards optimizer state alone (optim) over "
                                    "all of DP only, not in shard groups of 4"),
              std::string::npos)
        << why;
    h.sharding = TPD_DP_SHARDING_OPTIM_GRADS_PARAMS;
    EXPECT_TRUE(tpd_plan_layout_valid(&s.cfg, &cpu, &h, 8, why, sizeof why)) << why;
}

namespace {

// What tpd_plan_print_breakdown and tpd_plan_print_overrides write for r.
std::string Report(const tpd_config &cfg, const tpd_plan_result &r) {
    char *buf = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    EXPECT_NE(f, nullptr);
    if (!f) return "";
    tpd_plan_print_breakdown(f, &r);
    tpd_plan_print_overrides(f, &cfg, &r);
    fclose(f);
    std::string s(buf, len);
    free(buf);
    return s;
}

} // namespace

// `tripod train` runs every strategy over all of DP: the report shows the sharded bytes and
// the gathered working set and calls none of them planned only; hybrid sharding (a shard
// group short of DP) of the optimizer state alone is still planned, not trained.
TEST(PlanSharding, ReportCallsOnlyHybridShardingPlannedNotTrained) {
    Fixture s = Load();
    for (int sh = 0; sh < 4; sh++) {
        tpd_plan_result r = Eval(s, Layout(8, (tpd_dp_sharding)sh, 0), 0);
        std::string out = Report(s.cfg, r);
        EXPECT_EQ(out.find("planned, not trained"), std::string::npos) << sh << "\n" << out;
        EXPECT_NE(out.find("DP sharding: "), std::string::npos) << out;
        bool gathers = sh >= TPD_DP_SHARDING_OPTIM_GRADS;
        EXPECT_EQ(out.find("gathered working set") != std::string::npos, gathers) << out;
        if (gathers) EXPECT_GT(r.mem[0].gather, 0.0);
    }
    // hybrid sharding trains under optim_grads and optim_grads_params, not under optim
    for (int sh = 1; sh < 4; sh++) {
        tpd_plan_result r = Eval(s, Layout(16, (tpd_dp_sharding)sh, 8), 0);
        std::string out = Report(s.cfg, r);
        bool planned = sh == TPD_DP_SHARDING_OPTIM;
        EXPECT_EQ(out.find("planned, not trained: tripod train runs hybrid sharding (a shard "
                           "group short of DP) under optim_grads and optim_grads_params only") !=
                      std::string::npos,
                  planned)
            << sh << "\n"
            << out;
        EXPECT_EQ(out.find("with a shard size below DP") != std::string::npos, planned) << out;
    }
}
