// The time model's terms beyond the SC21 fit: TP communication overlap, the gradient dtype
// on the wire, the network's topology, host costs, stragglers and global syncs; and the
// profile keys that set them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "plan_test_util.h"

extern "C" {
#include "engine/plan/plan_internal.h"
}

using namespace plan_test;

namespace {

tpd_plan_layout layout(int tp, int pp, int dp, int mbs, int v, int sp) {
    tpd_plan_layout l;
    std::memset(&l, 0, sizeof l);
    l.tp = tp;
    l.pp = pp;
    l.dp = dp;
    l.micro_batch_size = mbs;
    l.virtual_stages = v;
    l.recompute = TPD_RECOMPUTE_SELECTIVE;
    l.sequence_parallel = sp;
    l.schedule = v > 1 ? TPD_SCHEDULE_INTERLEAVED : TPD_SCHEDULE_1F1B;
    return l;
}

tpd_plan_result eval(const tpd_config &c, const tpd_plan_cluster &cl, const tpd_plan_layout &l) {
    return evaluate(c, cl, l, 0, l.tp * l.pp * l.dp);
}

// An 8B-class GPT at TP 8 with sequence parallelism on an H100 node.
tpd_config gpt8b() {
    return gpt(32, 4096, 32, 256, 1);
}

tpd_plan_cluster h100() {
    tpd_plan_cluster c;
    EXPECT_EQ(tpd_plan_cluster_load("dgx-h100", &c), TPD_OK);
    return c;
}

TEST(PlanTerms, TpOverlapHidesItsShareAndNeverGoesBelowZero) {
    // the rule itself: hidden = min(share * comm, max(0, gemm - tp * chunk))
    tpd_plan_cluster cl = h100();
    cl.tp_overlap_share = 0.8;
    cl.tp_overlap_chunk_s = 10e-6;
    double exposed, hidden;
    tpd_plan_tp_overlap(&cl, 1e-3, 0.5e-3, 8, &exposed, &hidden); // room 0.92 ms
    EXPECT_NEAR(hidden, 0.4e-3, 1e-12);
    EXPECT_NEAR(exposed, 0.1e-3, 1e-12);
    tpd_plan_tp_overlap(&cl, 0.3e-3, 0.5e-3, 8, &exposed, &hidden); // room 0.22 ms
    EXPECT_NEAR(hidden, 0.22e-3, 1e-12);
    EXPECT_NEAR(exposed, 0.28e-3, 1e-12);
    tpd_plan_tp_overlap(&cl, 50e-6, 0.5e-3, 8, &exposed, &hidden); // chunks cost more
    EXPECT_EQ(hidden, 0.0);
    EXPECT_NEAR(exposed, 0.5e-3, 1e-12);

    // in the model: what is hidden leaves the exposed TP time, the total stays
    tpd_config c = gpt8b();
    tpd_plan_cluster h = h100();
    tpd_plan_layout off = layout(8, 1, 1, 1, 1, 1), on = off;
    on.tp_comm_overlap = 1;
    tpd_plan_result r0 = eval(c, h, off), r1 = eval(c, h, on);
    EXPECT_EQ(r0.time.tp_comm_hidden, 0.0);
    EXPECT_GT(r1.time.tp_comm_hidden, 0.0);
    EXPECT_GE(r1.time.tp_comm, 0.0);
    EXPECT_LT(r1.time.tp_comm, r0.time.tp_comm);
    EXPECT_NEAR(r1.time.tp_comm + r1.time.tp_comm_hidden, r0.time.tp_comm, 1e-9 * r0.time.tp_comm);
    // the GEMMs pay the slowdown: compute without TP comm grows
    EXPECT_GT(r1.time.compute - r1.time.tp_comm, r0.time.compute - r0.time.tp_comm);
    EXPECT_LT(r1.step_time_s, r0.step_time_s); // TP 8 in one node: worth it
    // a share of 0.1 hides at most a tenth of the collectives
    h.tp_overlap_share = 0.1;
    tpd_plan_result r2 = eval(c, h, on);
    EXPECT_LT(r2.time.tp_comm_hidden, r1.time.tp_comm_hidden);
    EXPECT_LE(r2.time.tp_comm_hidden, 0.1 * r0.time.tp_comm + 1e-12);
    // no room in any GEMM: nothing hidden, every GEMM still slowed
    h.tp_overlap_share = 1.0;
    h.tp_overlap_chunk_s = 1.0;
    tpd_plan_result r3 = eval(c, h, on);
    EXPECT_EQ(r3.time.tp_comm_hidden, 0.0);
    EXPECT_NEAR(r3.time.tp_comm, r0.time.tp_comm, 1e-9 * r0.time.tp_comm);
    EXPECT_GT(r3.step_time_s, r0.step_time_s);
}

TEST(PlanTerms, TpOverlapIsRefusedWhereItCannotRun) {
    tpd_config c;
    const char *no_sp[] = {"parallel.tensor_model_parallel_size=2",
                           "parallel.tp_comm_overlap=true"};
    EXPECT_EQ(tpd_config_load(nullptr, 2, no_sp, &c), TPD_ERR_INVALID);
    std::string err = tpd_last_error();
    EXPECT_NE(err.find("parallel.tp_comm_overlap"), std::string::npos) << err;
    EXPECT_NE(err.find("sequence_parallel"), std::string::npos) << err;
    const char *ok[] = {"parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true",
                        "parallel.tp_comm_overlap=true", "training.device=cuda"};
    ASSERT_EQ(tpd_config_load(nullptr, 4, ok, &c), TPD_OK) << tpd_last_error();
    // the planner models it; the trainer refuses it, naming the key
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_ERR_INVALID);
    err = tpd_last_error();
    EXPECT_NE(err.find("parallel.tp_comm_overlap"), std::string::npos) << err;
    c.parallel.tp_comm_overlap = 0;
    EXPECT_EQ(tpd_config_check_trainable(&c), TPD_OK) << tpd_last_error();

    // a layout without SP, or a framework without the overlap, is invalid
    tpd_config g = gpt8b();
    tpd_plan_cluster cl = h100();
    tpd_plan_layout l = layout(8, 1, 1, 1, 1, 0);
    l.tp_comm_overlap = 1;
    char why[192];
    EXPECT_FALSE(tpd_plan_layout_valid(&g, &cl, &l, 8, why, sizeof why));
    EXPECT_NE(std::string(why).find("sequence parallel"), std::string::npos) << why;
    l.sequence_parallel = 1;
    EXPECT_TRUE(tpd_plan_layout_valid(&g, &cl, &l, 8, why, sizeof why)) << why;
    cl.tp_overlap_available = 0;
    EXPECT_FALSE(tpd_plan_layout_valid(&g, &cl, &l, 8, why, sizeof why));
    EXPECT_NE(std::string(why).find("tp_overlap_available"), std::string::npos) << why;
}

// The search turns the overlap on only where the config does, and then only with SP.
TEST(PlanTerms, SearchNeverTurnsTpOverlapOnByItself) {
    tpd_plan_cluster cl = h100();
    tpd_config c = gpt8b();
    for (int asked = 0; asked <= 1; asked++) {
        c.parallel.tp_comm_overlap = asked;
        tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
        opt.gpus = 16;
        opt.top_k = 20;
        tpd_plan_search s;
        ASSERT_EQ(tpd_plan_search_run(&c, &cl, &opt, &s), TPD_OK);
        ASSERT_GT(s.n_top, 0);
        int with = 0;
        for (int i = 0; i < s.n_top; i++) {
            const tpd_plan_layout &l = s.top[i].layout;
            EXPECT_TRUE(!l.tp_comm_overlap || (asked && l.sequence_parallel && l.tp > 1));
            with += l.tp_comm_overlap;
            char buf[4096];
            ASSERT_GT(tpd_plan_overrides(&c, &s.top[i], buf, sizeof buf), 0);
            EXPECT_EQ(std::string(buf).find("tp_comm_overlap") != std::string::npos,
                      (bool)l.tp_comm_overlap)
                << buf;
        }
        if (asked)
            EXPECT_GT(with, 0);
        else
            EXPECT_EQ(with, 0);
        tpd_plan_search_free(&s);
    }
}

// bf16 on the wire halves the bytes of the DP reduction; its ring latency stays.
TEST(PlanTerms, Bf16GradientsOnTheWireHalveTheDpBytes) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(16, 2048, 24, 512, 4);
    c.parallel.ddp_bucket_size = INT64_MAX;       // one bucket: bytes/bw + 2(n-1) latencies
    EXPECT_EQ(tpd_plan_grad_wire_bytes(&c), 4.0); // fp32 main grads by default
    tpd_plan_layout l = layout(1, 1, 8, 4, 1, 0);
    tpd_plan_result fp32 = eval(c, cl, l);
    c.training.accumulate_allreduce_grads_in_fp32 = 0;
    EXPECT_EQ(tpd_plan_grad_wire_bytes(&c), 2.0);
    tpd_plan_result bf16 = eval(c, cl, l);
    double fixed = 2.0 * 7 * cl.intra_latency; // DP 8 in one node
    EXPECT_NEAR(fp32.time.dp_comm_total - fixed, 2.0 * (bf16.time.dp_comm_total - fixed),
                1e-9 * fp32.time.dp_comm_total);
    // ZeRO: the reduce-scatter halves too; the parameter all-gather does not change
    l.distributed_optimizer = 1;
    tpd_plan_result z16 = eval(c, cl, l);
    c.training.accumulate_allreduce_grads_in_fp32 = 1;
    tpd_plan_result z32 = eval(c, cl, l);
    EXPECT_LT(z16.time.dp_comm_total, z32.time.dp_comm_total);
    EXPECT_NEAR(z16.time.dp_gather_exposed, z32.time.dp_gather_exposed, 1e-12);
    // fp32 training moves fp32 gradients whatever the key says
    c.training.precision = TPD_PRECISION_FP32;
    c.training.accumulate_allreduce_grads_in_fp32 = 0;
    EXPECT_EQ(tpd_plan_grad_wire_bytes(&c), 4.0);
}

TEST(PlanTerms, ExpectedMaximumGrowsWithTheRanks) {
    EXPECT_EQ(tpd_plan_expected_max_normal(1), 0.0);
    // exact expected maxima of n standard normals: 1/sqrt(pi), 3/(2 sqrt(pi)), 1.16296
    EXPECT_NEAR(tpd_plan_expected_max_normal(2), 0.5642, 0.05);
    EXPECT_NEAR(tpd_plan_expected_max_normal(3), 0.8463, 0.04);
    EXPECT_NEAR(tpd_plan_expected_max_normal(5), 1.1630, 0.03);
    EXPECT_NEAR(tpd_plan_expected_max_normal(1000), 3.2414, 0.03);
    double prev = 0.0;
    for (int n = 2; n <= (1 << 20); n *= 2) {
        double e = tpd_plan_expected_max_normal(n);
        EXPECT_GT(e, prev) << n;
        EXPECT_LT(e, std::sqrt(2.0 * std::log((double)n))) << n; // the large-n bound
        prev = e;
    }

    // the step pays compute x cv x E[max of the world]; nothing at cv = 0
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(16, 2048, 24, 512, 4);
    tpd_plan_layout small = layout(1, 1, 8, 4, 1, 0), big = layout(1, 1, 64, 4, 1, 0);
    EXPECT_EQ(eval(c, cl, small).time.straggler, 0.0);
    cl.straggler_cv = 0.02;
    tpd_plan_result a = eval(c, cl, small), b = eval(c, cl, big);
    EXPECT_NEAR(a.time.straggler, a.time.compute * 0.02 * tpd_plan_expected_max_normal(8),
                1e-12 * a.step_time_s);
    EXPECT_GT(b.time.straggler / b.time.compute, a.time.straggler / a.time.compute);
}

TEST(PlanTerms, GlobalSyncsGrowWithTheRingOrTree) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(16, 2048, 24, 512, 4);
    tpd_plan_layout l = layout(1, 1, 64, 4, 1, 0);
    EXPECT_EQ(eval(c, cl, l).time.global_sync, 0.0); // none unless the profile says
    cl.global_syncs = 2;
    tpd_plan_result tree = eval(c, cl, l);
    EXPECT_NEAR(tree.time.global_sync, 2 * 2.0 * 6 * cl.inter_latency, 1e-15); // log2 64
    cl.sync_ring = 1;
    tpd_plan_result ring = eval(c, cl, l);
    EXPECT_NEAR(ring.time.global_sync, 2 * 2.0 * 63 * cl.inter_latency, 1e-15);
    EXPECT_NEAR(ring.step_time_s - tree.step_time_s, ring.time.global_sync - tree.time.global_sync,
                1e-12);
    // inside one node: the NVLink latency, log2 8 steps
    tpd_plan_layout n8 = layout(1, 1, 8, 4, 1, 0);
    cl.sync_ring = 0;
    EXPECT_NEAR(eval(c, cl, n8).time.global_sync, 2 * 2.0 * 3 * cl.intra_latency, 1e-15);
}

TEST(PlanTerms, TpGroupCrossingTheNvlinkDomainIsSlower) {
    tpd_config c = gpt8b();
    tpd_plan_cluster cl = h100();
    tpd_plan_layout l = layout(8, 1, 1, 1, 1, 1);
    double in_domain = eval(c, cl, l).time.tp_comm;
    EXPECT_EQ(cl.nvlink_domain_gpus, 8); // the shipped profile states it
    cl.nvlink_domain_gpus = 4;           // NVLink pairs of 4 inside a node of 8
    tpd_plan_result cr = eval(c, cl, l);
    EXPECT_EQ(cr.hop_tp, TPD_PLAN_HOP_NETWORK);
    EXPECT_GT(cr.time.tp_comm, 1.5 * in_domain);
    // NVL72: nodes of 4 on one NVLink fabric of 72; TP 8 spans two nodes at NVLink speed
    cl.gpus_per_node = 4;
    cl.nics_per_node = 4;
    cl.nvlink_domain_gpus = 72;
    EXPECT_NEAR(eval(c, cl, l).time.tp_comm, in_domain, 1e-9 * in_domain);
}

TEST(PlanTerms, OversubscriptionSlowsOnlyCrossLeafCollectives) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(32, 4096, 32, 512, 1);
    c.parallel.ddp_bucket_size = INT64_MAX;
    // TP 8 in the node, DP across nodes (Megatron's order: DP ranks TP apart)
    tpd_plan_layout dp4 = layout(8, 1, 4, 1, 1, 1), dp8 = layout(8, 1, 8, 1, 1, 1);
    tpd_plan_result a0 = eval(c, cl, dp4), b0 = eval(c, cl, dp8);
    cl.leaf_switch_nodes = 4; // 32 GPUs per leaf
    cl.oversubscription = 4.0;
    tpd_plan_result a1 = eval(c, cl, dp4), b1 = eval(c, cl, dp8);
    EXPECT_NEAR(a1.time.dp_comm_total, a0.time.dp_comm_total, 1e-12); // 4 nodes: one leaf
    EXPECT_GT(b1.time.dp_comm_total, 2.0 * b0.time.dp_comm_total);    // 8 nodes: two leaves
    EXPECT_NEAR(b1.time.tp_comm, b0.time.tp_comm, 1e-12);             // TP stays in the node
    EXPECT_EQ(a1.hop_dp, TPD_PLAN_HOP_NETWORK);
    EXPECT_EQ(b1.hop_dp, TPD_PLAN_HOP_CROSS_LEAF);
    EXPECT_EQ(b1.hop_tp, TPD_PLAN_HOP_NVLINK);
    EXPECT_EQ(b1.hop_pp, TPD_PLAN_HOP_NONE);
    // fewer NICs than GPUs: each GPU gets its share of them
    cl.leaf_switch_nodes = 0;
    cl.nics_per_node = 4;
    tpd_plan_result a2 = eval(c, cl, dp4);
    EXPECT_GT(a2.time.dp_comm_total, 1.5 * a0.time.dp_comm_total);
}

TEST(PlanTerms, HostCostsAreTheirOwnTerms) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(16, 2048, 24, 512, 4);
    tpd_plan_layout l = layout(1, 1, 8, 4, 1, 0);
    tpd_plan_result r0 = eval(c, cl, l);
    EXPECT_EQ(r0.time.host_overhead, 0.0);
    cl.micro_batch_host_s = 1e-3;
    cl.step_host_s = 0.05;
    cl.optimizer_fixed_s = 0.02;
    tpd_plan_result r1 = eval(c, cl, l);
    int M = r1.num_micro_batches;
    EXPECT_NEAR(r1.time.host_overhead, M * 1e-3, 1e-12);
    EXPECT_NEAR(r1.time.compute - r0.time.compute, M * 1e-3, 1e-12);
    EXPECT_NEAR(r1.time.step_host, 0.05, 1e-15);
    EXPECT_NEAR(r1.time.optimizer - r0.time.optimizer, 0.02, 1e-12);
    // a host that launches slower than small kernels run sets their time
    cl.micro_batch_host_s = cl.step_host_s = cl.optimizer_fixed_s = 0.0;
    cl.host_launch_s = 100e-6;
    tpd_plan_result r2 = eval(c, cl, l);
    EXPECT_GT(r2.time.host_overhead, 0.0);
    EXPECT_NEAR(r2.time.compute - r0.time.compute, r2.time.host_overhead, 1e-9 * r2.time.compute);
}

// The p2p the schedule leaves unhidden: more sends on the critical path with interleaving.
TEST(PlanTerms, InterleavedP2pIsNamedAndGrowsWithChunks) {
    tpd_plan_cluster cl = a100();
    cl.inter_latency = 200e-6; // a slow network makes the sends visible
    tpd_config c = gpt(32, 4096, 32, 512, 1);
    tpd_plan_result one = eval(c, cl, layout(8, 4, 4, 1, 1, 1));
    tpd_plan_result two = eval(c, cl, layout(8, 4, 4, 1, 2, 1));
    EXPECT_GT(one.time.pp_p2p, 0.0);
    EXPECT_GT(two.time.pp_p2p, one.time.pp_p2p);
    EXPECT_EQ(eval(c, cl, layout(8, 1, 16, 1, 1, 1)).time.pp_p2p, 0.0);
}

TEST(PlanTerms, NewTermsAreInTheReportAndTheJson) {
    tpd_plan_cluster cl = h100();
    cl.straggler_cv = 0.01;
    cl.global_syncs = 2;
    cl.step_host_s = 0.01;
    tpd_config c = gpt8b();
    tpd_plan_layout l = layout(8, 1, 2, 1, 1, 1);
    l.tp_comm_overlap = 1;
    tpd_plan_result r = eval(c, cl, l);
    EXPECT_NEAR(r.step_time_s, step_sum(r.time), 1e-12 * r.step_time_s);
    char *buf = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ASSERT_NE(f, nullptr);
    tpd_plan_print_breakdown(f, &r);
    std::fclose(f);
    std::string text(buf, len);
    std::free(buf);
    for (const char *k : {"stragglers", "global syncs", "host per step", "pipeline p2p (unhidden)",
                          "hidden behind the GEMMs", "TP nvlink, DP network, PP none"})
        EXPECT_NE(text.find(k), std::string::npos) << k << "\n" << text;
    char *json = tpd_plan_json(&c, &r, 1);
    ASSERT_NE(json, nullptr);
    std::string js(json);
    std::free(json);
    for (const char *k :
         {"\"tp_comm_hidden\"", "\"host_overhead\"", "\"straggler\"", "\"global_sync\"",
          "\"step_host\"", "\"tp_comm_overlap\":\ttrue", "\"tp\":\t\"nvlink\""})
        EXPECT_NE(js.find(k), std::string::npos) << k;
    // and in the predicted timeline
    const std::string trace = scratch_path("terms_trace.json");
    ASSERT_EQ(tpd_plan_write_trace(&r, trace.c_str()), TPD_OK);
    FILE *tf = std::fopen(trace.c_str(), "r");
    ASSERT_NE(tf, nullptr);
    std::string tt;
    for (int ch; (ch = std::fgetc(tf)) != EOF;)
        tt.push_back((char)ch);
    std::fclose(tf);
    std::remove(trace.c_str());
    for (const char *k : {"STRAGGLER_WAIT", "GLOBAL_SYNC", "STEP_HOST"})
        EXPECT_NE(tt.find(k), std::string::npos) << k;
}

TEST(PlanCluster, NewKeysRoundTripAndDefaultToTheOldModel) {
    tpd_plan_cluster c;
    ASSERT_EQ(tpd_plan_cluster_load("dgx-a100-80g", &c), TPD_OK);
    // the defaults: the model before these keys
    EXPECT_EQ(c.leaf_switch_nodes, 0);
    EXPECT_EQ(c.oversubscription, 1.0);
    EXPECT_EQ(c.straggler_cv, 0.0);
    EXPECT_EQ(c.global_syncs, 0);
    EXPECT_EQ(c.host_launch_s, 0.0);
    c.nvlink_domain_gpus = 72;
    c.gpus_per_node = 4;
    c.nics_per_node = 4;
    c.leaf_switch_nodes = 16;
    c.oversubscription = 2.5;
    c.tp_overlap_available = 0;
    c.tp_overlap_share = 0.7;
    c.tp_overlap_chunk_s = 4e-6;
    c.tp_overlap_slowdown = 0.08;
    c.host_launch_s = 6e-6;
    c.micro_batch_host_s = 300e-6;
    c.step_host_s = 0.012;
    c.optimizer_fixed_s = 0.004;
    c.straggler_cv = 0.015;
    c.global_syncs = 3;
    c.sync_ring = 1;
    const std::string path = scratch_path("roundtrip.yaml");
    ASSERT_EQ(tpd_plan_cluster_save(&c, path.c_str(), "round trip"), TPD_OK);
    tpd_plan_cluster d;
    ASSERT_EQ(tpd_plan_cluster_load(path.c_str(), &d), TPD_OK);
    std::remove(path.c_str());
    EXPECT_EQ(d.nvlink_domain_gpus, 72);
    EXPECT_EQ(d.nics_per_node, 4);
    EXPECT_EQ(d.leaf_switch_nodes, 16);
    EXPECT_DOUBLE_EQ(d.oversubscription, 2.5);
    EXPECT_EQ(d.tp_overlap_available, 0);
    EXPECT_DOUBLE_EQ(d.tp_overlap_share, 0.7);
    EXPECT_NEAR(d.tp_overlap_chunk_s, 4e-6, 1e-15);
    EXPECT_DOUBLE_EQ(d.tp_overlap_slowdown, 0.08);
    EXPECT_NEAR(d.host_launch_s, 6e-6, 1e-15);
    EXPECT_NEAR(d.micro_batch_host_s, 300e-6, 1e-15);
    EXPECT_NEAR(d.step_host_s, 0.012, 1e-15);
    EXPECT_NEAR(d.optimizer_fixed_s, 0.004, 1e-15);
    EXPECT_DOUBLE_EQ(d.straggler_cv, 0.015);
    EXPECT_EQ(d.global_syncs, 3);
    EXPECT_EQ(d.sync_ring, 1);
}

TEST(PlanCluster, BadNewKeysNameFileLineKeyAndRule) {
    const std::string path_s = scratch_path("bad_terms.yaml");
    const char *path = path_s.c_str();
    const std::string base = "gpus_per_node: 8\npeak_tflops: 312\nhbm_gib: 80\nhbm_bw_gbs: 2000\n"
                             "intra_node_bw_gbs: 300\ninter_node_bw_gbs: 25\n";
    struct Case {
        const char *line, *key, *rule;
    } cases[] = {
        {"fabric_oversubscription: 0.5", "fabric_oversubscription", "outside [1, 64]"},
        {"grad_reduce_dtype: bf16", "grad_reduce_dtype",
         "unknown key"}, // the run's, not the cluster's
        {"global_sync_algorithm: star", "global_sync_algorithm", "must be tree or ring"},
        {"straggler_cv: -0.1", "straggler_cv", "outside [0, 1]"},
        {"global_syncs: 1.5", "global_syncs", "whole number"},
        {"nvlink_domain_gpus: 12", "nvlink_domain_gpus", "multiple or a divisor"},
        {"tp_overlap_shares: 1", "tp_overlap_shares", "unknown key"},
    };
    for (const Case &k : cases) {
        FILE *f = std::fopen(path, "w");
        ASSERT_NE(f, nullptr);
        std::fprintf(f, "%s%s\n", base.c_str(), k.line);
        std::fclose(f);
        tpd_plan_cluster c;
        testing::internal::CaptureStderr();
        EXPECT_EQ(tpd_plan_cluster_load(path, &c), TPD_ERR_INVALID) << k.line;
        std::string err = testing::internal::GetCapturedStderr();
        EXPECT_NE(err.find(std::string(path) + ":7:"), std::string::npos) << err;
        EXPECT_NE(err.find(k.key), std::string::npos) << err;
        EXPECT_NE(err.find(k.rule), std::string::npos) << err;
    }
    std::remove(path);
}

} // namespace
