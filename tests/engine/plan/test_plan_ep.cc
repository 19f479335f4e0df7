// Expert parallelism in the planner: the memory closed form's EP terms (E / EP experts a rank,
// the rows a rank's experts may receive, the counts and the all-to-all blocks) against the same
// terms written out here; the all-to-alls' time (none at EP 1, more with EP and with
// model.moe_imbalance, on NVLink inside a node and on the NICs across), the expert GEMMs at
// the busiest rank's load, the expert gradients over expert-DP; which layouts are valid; the
// search trying EP for a mixture only; `tripod plan --layout TP,PP,DP,CP,EP` and its JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/tiny.h"
#include "plan_test_util.h"

extern "C" {
#include <cjson/cJSON.h>

#include "base/align.h"
#include "base/file.h"
#include "engine/cli/cli.h"
#include "engine/model/model_flops.h"
#include "engine/plan/plan_internal.h"
}

namespace {

using plan_test::cluster;
using plan_test::load;

// Mixtral 8x7B at Megatron-Core's reference batch (256 sequences): the preset's TP 1 PP 4 v 8
// over 64 GPUs, DP 16, with the given TP, CP, DP and EP.
tpd_config mixtral(std::vector<std::string> extra = {}) {
    std::vector<std::string> ov = {"training.global_batch_size=256"};
    ov.insert(ov.end(), extra.begin(), extra.end());
    return load("mixtral-8x7b.yaml", ov);
}

tpd_plan_layout layout(const tpd_config &c, int tp, int cp, int pp, int dp, int ep) {
    tpd_plan_layout l;
    tpd_plan_layout_from_config(&c, 0, &l);
    l.tp = tp;
    l.cp = cp;
    l.pp = pp;
    l.dp = dp;
    l.ep = ep;
    l.sequence_parallel = tp > 1;
    return l;
}

tpd_plan_result evaluate(const tpd_config &c, const tpd_plan_cluster &cl,
                         const tpd_plan_layout &l) {
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = (int)tpd_plan_world(&l);
    opt.balance_stages = 0;
    tpd_plan_result r;
    EXPECT_EQ(tpd_plan_evaluate(&c, &cl, &l, &opt, &r), TPD_OK);
    EXPECT_GT(r.stages, 0) << r.reject_reason;
    EXPECT_GT(r.step_time_s, 0.0) << r.reject_reason;
    return r;
}

// One all-to-all of `bytes` a rank over n ranks on a link: (n-1)/n of it leaves, n-1 steps.
double a2a(double bytes, int n, double bw, double lat) {
    return (n - 1.0) / n * bytes / bw + (n - 1) * lat;
}

uint64_t up(uint64_t bytes) {
    return (bytes + TPD_ALIGN_BYTES - 1) / TPD_ALIGN_BYTES * TPD_ALIGN_BYTES;
}

// The trainer's allocation spec under EP, term by term, against EP 1 of the same layout. The
// Llama block (SwiGLU experts, no biases), 4 experts of width 32, top 2, 2 sequences of 16
// tokens a micro-batch, DP 4, one stage, fp32 on the cpu backend and bf16 on cuda (fp32
// main gradients, fp32 masters), TP 1 and TP 2 (SP: the MoE rows are gathered, full). Per
// layer: the expert tensors hold El = E / EP experts; moe_x, moe_h, moe_hact take
// NR = EP N min(k, El) rows instead of N k; moe_y stays N k rows; moe_ecounts, EP x El
// int32, is new; in the workspace w_moe_dh and w_moe_dhact take NR rows, and w_moe_ea and
// w_moe_eb (NR x C) are new. Everything else is EP 1's.
TEST(PlanEp, MemoryClosedFormEpTerms) {
    int checked = 0;
    for (bool bf16 : {false, true})
        for (int tp : {1, 2})
            for (const char *rc : {"none", "selective"})
                for (int ep : {2, 4}) {
                    tpd_config cfg = tiny::config("");
                    tiny::llama(cfg);
                    cfg.model.num_moe_experts = 4;
                    cfg.model.moe_router_topk = 2;
                    cfg.model.moe_ffn_hidden_size = 32;
                    cfg.training.micro_batch_size = 2;
                    cfg.parallel.tensor_model_parallel_size = tp;
                    cfg.parallel.sequence_parallel = tp > 1;
                    tiny::set(cfg.training.recompute, "training.recompute", rc);
                    if (bf16) {
                        cfg.training.precision = TPD_PRECISION_BF16;
                        cfg.training.device = TPD_DEVICE_CUDA;
                    }
                    const int dp = 4;
                    tpd_plan_layout l1;
                    tpd_plan_layout_from_config(&cfg, tp * dp, &l1);
                    ASSERT_EQ(l1.dp, dp);
                    ASSERT_EQ(tpd_plan_ep(&l1), 1);
                    tpd_plan_layout le = l1;
                    le.ep = ep;
                    tpd_plan_stage_mem m1, me;
                    ASSERT_EQ(tpd_plan_cpu_memory(&cfg, &l1, 0, &m1), TPD_OK);
                    ASSERT_EQ(tpd_plan_cpu_memory(&cfg, &le, 0, &me), TPD_OK);

                    const uint64_t E = 4, k = 2, L = cfg.model.num_layers;
                    const uint64_t C = cfg.model.hidden_size, Fe = 32;
                    const uint64_t FCel = 2 * Fe / tp, Fel = Fe / tp; // SwiGLU [gate; up]
                    const uint64_t N = 2 * cfg.model.seq_length, NK = N * k;
                    const uint64_t El = E / ep, NR = ep * N * std::min(k, El);
                    const uint64_t e = bf16 ? 2 : 4;
                    // parameters: (E - El) experts fewer, each FCel x C + C x Fel, every layer
                    // (every term of the buffer is a multiple of C = 32, so DP 4 pads nothing)
                    const uint64_t fewer = L * (E - El) * (FCel * C + C * Fel);
                    const std::string what = std::string(bf16 ? "bf16" : "fp32") + " TP " +
                                             std::to_string(tp) + " " + rc + " EP " +
                                             std::to_string(ep);
                    EXPECT_EQ(m1.params - me.params, (double)(fewer * e)) << what;
                    EXPECT_EQ(m1.grads - me.grads, (double)(fewer * 4)) << what;
                    // AdamW m and v, and under bf16 the fp32 masters
                    EXPECT_EQ(m1.optimizer - me.optimizer, (double)(fewer * (bf16 ? 12 : 8)))
                        << what;
                    EXPECT_EQ(tpd_plan_layer_params(&cfg, tp) -
                                  tpd_plan_layer_params_ep(&cfg, tp, ep),
                              (double)((E - El) * (FCel * C + C * Fel)))
                        << what;
                    // activations: one slot (one stage, 1F1B) of L layers, all kept
                    const uint64_t layer_ep =
                        up(NR * C * e) + up(NR * FCel * e) + up(NR * Fel * e) + up(ep * El * 4);
                    const uint64_t layer_1 = up(NK * C * e) + up(NK * FCel * e) + up(NK * Fel * e);
                    EXPECT_EQ(me.activations - m1.activations, (double)(L * (layer_ep - layer_1)))
                        << what;
                    // workspace: the experts' fc and activation gradients, the two exchange
                    // blocks (on cuda also the EP counts' host mirror)
                    const uint64_t ws_ep = up(NR * FCel * e) + up(NR * Fel * e) +
                                           2 * up(NR * C * e) + (bf16 ? up(ep * El * 4) : 0);
                    const uint64_t ws_1 = up(NK * FCel * e) + up(NK * Fel * e);
                    EXPECT_EQ(me.workspace - m1.workspace, (double)(ws_ep - ws_1)) << what;
                    EXPECT_EQ(me.total - m1.total, (me.params - m1.params) + (me.grads - m1.grads) +
                                                       (me.optimizer - m1.optimizer) +
                                                       (me.activations - m1.activations) +
                                                       (me.workspace - m1.workspace))
                        << what;
                    checked++;
                }
    EXPECT_EQ(checked, 2 * 2 * 2 * 2);

    // EP 1 is the layout without an EP at all, and a dense model has no experts to split
    tpd_config cfg = tiny::config("");
    tiny::llama(cfg);
    tpd_plan_layout l;
    tpd_plan_layout_from_config(&cfg, 1, &l);
    EXPECT_EQ(l.ep, 1);
    tpd_plan_stage_mem a, b;
    ASSERT_EQ(tpd_plan_cpu_memory(&cfg, &l, 0, &a), TPD_OK);
    l.ep = 0;
    ASSERT_EQ(tpd_plan_cpu_memory(&cfg, &l, 0, &b), TPD_OK);
    EXPECT_EQ(a.total, b.total);
    EXPECT_EQ(tpd_plan_layer_expert_params(&cfg, 1, 2), 0.0);
}

// The all-to-alls of Mixtral 8x7B at TP 1, PP 4 (8 layers a stage): none at EP 1; at EP 2, 4
// and 8 (inside a node: NVLink) each of the four per MoE layer and micro-batch moves the
// rank's 4096 tokens' 2 assignments of 4096 bf16 elements, (EP-1)/EP of them leaving, and the
// forward's counts exchange (E int32) costs its EP-1 latencies; the step's share is
// micro-batches x layers x (4 all-to-alls + the counts), inside compute. More EP, more time.
TEST(PlanEp, AllToAllIsZeroAtEp1AndGrowsWithEp) {
    tpd_config c = mixtral();
    tpd_plan_cluster cl = cluster("dgx-h100");
    const double bw = cl.intra_bw * cl.coll_efficiency, lat = cl.intra_latency;
    const double bytes = 4096.0 * 2 * 4096 * 2;
    tpd_plan_result r1 = evaluate(c, cl, layout(c, 1, 1, 4, 16, 1));
    EXPECT_EQ(r1.time.ep_comm, 0.0);
    EXPECT_EQ(r1.ep_a2a_s, 0.0);
    EXPECT_EQ(r1.ep_local_experts, 0);
    EXPECT_EQ(r1.hop_ep, TPD_PLAN_HOP_NONE);
    double last = 0.0;
    for (int ep : {2, 4, 8}) {
        tpd_plan_result r = evaluate(c, cl, layout(c, 1, 1, 4, 16, ep));
        const std::string what = "EP " + std::to_string(ep);
        EXPECT_EQ(r.hop_ep, TPD_PLAN_HOP_NVLINK) << what;
        EXPECT_EQ(r.ep_local_experts, 8 / ep) << what;
        EXPECT_EQ(r.ep_expert_dp, 16 / ep) << what;
        EXPECT_DOUBLE_EQ(r.ep_a2a_bytes, (ep - 1.0) / ep * bytes) << what;
        EXPECT_NEAR(r.ep_a2a_s, a2a(bytes, ep, bw, lat), 1e-12) << what;
        EXPECT_NEAR(r.ep_counts_s, a2a(4.0 * 8, ep, bw, lat), 1e-12) << what;
        double per_layer = 4 * r.ep_a2a_s + r.ep_counts_s;
        EXPECT_NEAR(r.time.ep_comm, r.num_micro_batches * 8 * per_layer, 1e-9) << what;
        EXPECT_GT(r.time.ep_comm, last) << what;
        EXPECT_LT(r.time.ep_comm, r.time.compute) << what; // inside compute
        last = r.time.ep_comm;
    }
}

// model.moe_imbalance (the busiest EP rank's tokens over the mean) scales what the busiest
// rank receives and runs: the all-to-all's bytes by the factor (its latency stays), the
// expert GEMMs' time with it; at EP 1 every rank runs its own tokens' experts and the
// factor changes nothing.
TEST(PlanEp, AllToAllAndExpertGemmsGrowWithImbalance) {
    tpd_plan_cluster cl = cluster("dgx-h100");
    const double lat = cl.intra_latency;
    double last_a2a = 0.0, last_compute = 0.0, last_step = 0.0, base_a2a = 0.0;
    for (double imb : {1.0, 1.25, 1.5}) {
        tpd_config c = mixtral({"model.moe_imbalance=" + std::to_string(imb)});
        ASSERT_DOUBLE_EQ(c.model.moe_imbalance, imb);
        tpd_plan_result r = evaluate(c, cl, layout(c, 1, 1, 4, 16, 8));
        EXPECT_DOUBLE_EQ(r.moe_imbalance, imb);
        if (imb == 1.0) base_a2a = r.ep_a2a_s - 7 * lat;
        EXPECT_NEAR(r.ep_a2a_s - 7 * lat, imb * base_a2a, 1e-12) << imb;
        EXPECT_GT(r.time.ep_comm, last_a2a) << imb;
        EXPECT_GT(r.time.compute - r.time.ep_comm, last_compute) << imb;
        EXPECT_GT(r.step_time_s, last_step) << imb;
        last_a2a = r.time.ep_comm;
        last_compute = r.time.compute - r.time.ep_comm;
        last_step = r.step_time_s;
        tpd_plan_result one = evaluate(c, cl, layout(c, 1, 1, 4, 16, 1));
        tpd_config even = mixtral();
        tpd_plan_result one_even = evaluate(even, cl, layout(even, 1, 1, 4, 16, 1));
        EXPECT_EQ(one.step_time_s, one_even.step_time_s) << imb;
        EXPECT_EQ(one.moe_imbalance, 0.0);
    }
    // and it is validated where it is read: at least 1
    std::string path = std::string(tpd_source_dir()) + "/configs/mixtral-8x7b.yaml";
    const char *bad[] = {"model.moe_imbalance=0.5"};
    tpd_config c;
    tpd_log_quiet_begin();
    EXPECT_EQ(tpd_config_load(path.c_str(), 1, bad, &c), TPD_ERR_INVALID);
    tpd_log_quiet_end();
    EXPECT_NE(std::string(tpd_last_error()).find("model.moe_imbalance"), std::string::npos)
        << tpd_last_error();
}

// The EP group is EP consecutive DP ranks, TP x CP apart (Megatron's tp-cp-ep-dp-pp): TP x CP
// x EP consecutive ranks, NVLink while that fits the node's 8 GPUs, each GPU's own NIC
// beyond; the all-to-all runs at that link's bandwidth and latency.
TEST(PlanEp, AllToAllLinkFollowsTheRankOrder) {
    tpd_plan_cluster cl = cluster("dgx-h100");
    const struct {
        int tp, cp, ep;
        tpd_plan_hop hop;
    } rows[] = {{1, 1, 8, TPD_PLAN_HOP_NVLINK},  {2, 1, 4, TPD_PLAN_HOP_NVLINK},
                {1, 2, 4, TPD_PLAN_HOP_NVLINK},  {2, 1, 8, TPD_PLAN_HOP_NETWORK},
                {1, 2, 8, TPD_PLAN_HOP_NETWORK}, {4, 1, 4, TPD_PLAN_HOP_NETWORK}};
    for (const auto &w : rows) {
        tpd_config c = mixtral();
        int dp = 64 / (w.tp * w.cp * 4);
        tpd_plan_result r = evaluate(c, cl, layout(c, w.tp, w.cp, 4, dp, w.ep));
        const std::string what = "TP " + std::to_string(w.tp) + " CP " + std::to_string(w.cp) +
                                 " EP " + std::to_string(w.ep);
        EXPECT_EQ(r.hop_ep, w.hop) << what;
        bool nv = w.hop == TPD_PLAN_HOP_NVLINK;
        double bw = nv ? cl.intra_bw * cl.coll_efficiency : cl.inter_bw * cl.net_coll_efficiency;
        double lat = nv ? cl.intra_latency : cl.inter_latency;
        // a rank's 4096 / CP tokens, 2 assignments each, full rows under SP
        double bytes = 4096.0 / w.cp * 2 * 4096 * 2;
        EXPECT_NEAR(r.ep_a2a_s, a2a(bytes, w.ep, bw, lat), 1e-12) << what;
        tpd_plan_hop hop;
        double lbw, llat;
        tpd_plan_ep_link(&cl, w.ep, (long)w.tp * w.cp, &lbw, &llat, &hop);
        EXPECT_EQ(hop, w.hop) << what;
        EXPECT_DOUBLE_EQ(lbw, bw) << what;
    }
}

// The experts' gradients are summed over expert-DP (DP / EP ranks holding the same E / EP
// experts), the rest over DP: the busiest stage's DP bytes per rank are
// 2 (S-1)/S (n - x) g + 2 (Se-1)/Se x g, n its parameters, x its local experts'. At EP = DP
// an expert's gradients stay on their rank.
TEST(PlanEp, ExpertGradientsReduceOverExpertDp) {
    tpd_config c = mixtral();
    c.parallel.use_distributed_optimizer = 0; // the all-reduce's bytes, 2 (n - 1) / n
    c.parallel.data_parallel_sharding_strategy = TPD_DP_SHARDING_NO_SHARD;
    tpd_plan_cluster cl = cluster("dgx-h100");
    const double g = tpd_plan_dp_wire_bytes(&c), C = 4096, Fe = 14336;
    const struct { int tp, dp, ep; } rows[] = {{1, 16, 2}, {1, 16, 8}, {2, 8, 8}};
    for (const auto &w : rows) {
        const std::string what = "TP " + std::to_string(w.tp) + " DP " + std::to_string(w.dp) +
                                 " EP " + std::to_string(w.ep);
        tpd_plan_layout l = layout(c, w.tp, 1, 4, w.dp, w.ep);
        tpd_plan_layout one = layout(c, w.tp, 1, 4, w.dp, 1);
        double n1 = 0;
        for (int s = 0; s < 4; s++)
            n1 = std::max(n1, tpd_plan_stage_params(&c, &one, s));
        // 8 layers a stage, 8 experts each, split over TP
        const double experts = 8 * 8 * 3 * Fe * C / w.tp;
        double x = experts / w.ep, S = w.dp, Se = (double)w.dp / w.ep;
        double want = 2 * (S - 1) / S * (n1 - experts) * g + 2 * (Se - 1) / Se * x * g;
        tpd_plan_result r = evaluate(c, cl, l);
        EXPECT_NEAR(r.dp_bytes_step, want, 1e-6 * want) << what;
        EXPECT_EQ(r.ep_expert_dp, w.dp / w.ep) << what;
        tpd_plan_dp_cost dpc;
        tpd_plan_gpu_dp_cost(&c, &cl, &l, &dpc);
        if (w.dp == w.ep) {
            EXPECT_EQ(r.hop_edp, TPD_PLAN_HOP_NONE) << what;
            EXPECT_EQ(dpc.reduce_ep.per_byte, 0.0) << what;
        } else {
            EXPECT_GT(dpc.reduce_ep.per_byte, 0.0) << what;
        }
        // and the DP reduction of the step moves less than EP 1's
        tpd_plan_result r1 = evaluate(c, cl, one);
        EXPECT_LT(r.time.dp_comm_total, r1.time.dp_comm_total) << what;
    }
}

// Which EP layouts are valid: EP divides DP and the experts, on a mixture only, under every
// sharding strategy, over hybrid shard groups only where each holds whole EP runs, without
// DiLoCo (what the trainer's EP runs).
TEST(PlanEp, LayoutRules) {
    tpd_config c = mixtral();
    tpd_plan_cluster cl = cluster("dgx-h100");
    char why[192];
    tpd_plan_layout ok = layout(c, 1, 1, 4, 16, 8);
    EXPECT_TRUE(tpd_plan_layout_valid(&c, &cl, &ok, 64, why, sizeof why)) << why;
    const struct {
        int dp, ep;
        const char *want;
    } rows[] = {{16, 16, "experts 8 not divisible by EP 16"},
                {16, 3, "experts 8 not divisible by EP 3"}};
    for (const auto &w : rows) {
        tpd_plan_layout l = layout(c, 1, 1, 4, w.dp, w.ep);
        EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &l, 64, why, sizeof why)) << w.ep;
        EXPECT_NE(std::string(why).find(w.want), std::string::npos) << why;
    }
    tpd_plan_layout odd = layout(c, 2, 1, 4, 8, 8); // TP 2 x PP 4 x DP 8: DP 8 takes EP 8
    EXPECT_TRUE(tpd_plan_layout_valid(&c, &cl, &odd, 64, why, sizeof why)) << why;
    tpd_plan_layout dp4 = layout(c, 2, 1, 8, 4, 8);
    dp4.virtual_stages = 1;
    dp4.schedule = TPD_SCHEDULE_1F1B;
    EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &dp4, 64, why, sizeof why));
    EXPECT_NE(std::string(why).find("DP 4 not divisible by EP 8"), std::string::npos) << why;
    tpd_plan_layout zero = ok; // ZeRO-1 trains under EP (the experts' state over expert DP)
    zero.distributed_optimizer = 1;
    zero.sharding = TPD_DP_SHARDING_OPTIM;
    EXPECT_TRUE(tpd_plan_layout_valid(&c, &cl, &zero, 64, why, sizeof why)) << why;
    // ZeRO-2 and ZeRO-3 too (the experts' units over expert DP, the rest over DP)
    for (tpd_dp_sharding sh : {TPD_DP_SHARDING_OPTIM_GRADS, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS}) {
        zero.sharding = sh;
        EXPECT_TRUE(tpd_plan_layout_valid(&c, &cl, &zero, 64, why, sizeof why)) << why;
    }
    zero.shard_size = 8; // and over hybrid shard groups of whole EP runs
    EXPECT_TRUE(tpd_plan_layout_valid(&c, &cl, &zero, 64, why, sizeof why)) << why;
    zero.shard_size = 4; // but not groups that cut an EP run
    EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &zero, 64, why, sizeof why));
    EXPECT_NE(std::string(why).find("EP 8 with hybrid sharding optim_grads_params over shard "
                                    "groups of 4"),
              std::string::npos)
        << why;
    zero.shard_size = 8; // nor ZeRO-1 over shard groups (the GPU model's alone, no expert units)
    zero.sharding = TPD_DP_SHARDING_OPTIM;
    EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &zero, 64, why, sizeof why));
    EXPECT_NE(std::string(why).find("EP 8 with hybrid sharding optim ("), std::string::npos) << why;
    tpd_config dense = load("llama3-8b.yaml", {});
    tpd_plan_layout d = layout(dense, 1, 1, 4, 16, 2);
    d.distributed_optimizer = 0;
    d.sharding = TPD_DP_SHARDING_NO_SHARD;
    EXPECT_FALSE(tpd_plan_layout_valid(&dense, &cl, &d, 64, why, sizeof why));
    EXPECT_NE(std::string(why).find("EP 2 on a model without experts"), std::string::npos) << why;
}

// The search tries EP for a mixture (the divisors of DP that divide its 8 experts, under
// every strategy over all of DP) and keeps the fastest EP layout beside the ranking; a dense
// model's search has EP 1 only.
TEST(PlanEp, SearchTriesEpForAMixtureOnly) {
    tpd_plan_cluster cl = cluster("dgx-h100");
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 64;
    opt.top_k = 100;
    tpd_config c = load("mixtral-8x7b.yaml", {});
    tpd_plan_search s;
    ASSERT_EQ(tpd_plan_search_run(&c, &cl, &opt, &s), TPD_OK);
    ASSERT_GT(s.n_top, 0);
    int with_ep = 0;
    double fastest_ep = 1e30;
    for (int i = 0; i < s.n_top; i++) {
        const tpd_plan_layout &l = s.top[i].layout;
        int ep = tpd_plan_ep(&l);
        EXPECT_EQ(l.dp % ep, 0) << i;
        EXPECT_EQ(8 % ep, 0) << i;
        if (ep > 1) {
            with_ep++;
            EXPECT_EQ(l.shard_size % ep, 0) << i; // HSDP groups of whole EP runs
            EXPECT_GT(s.top[i].time.ep_comm, 0.0) << i;
            fastest_ep = std::min(fastest_ep, s.top[i].step_time_s);
        }
    }
    EXPECT_GT(with_ep, 0);
    ASSERT_NE(s.best_ep, nullptr);
    EXPECT_GT(tpd_plan_ep(&s.best_ep->layout), 1);
    EXPECT_TRUE(s.best_ep->fits);
    EXPECT_GE(s.best_ep->step_time_s, s.top[0].step_time_s);
    EXPECT_NEAR(s.best_ep->step_time_s, fastest_ep, 1e-9 * fastest_ep);
    tpd_plan_search_free(&s);

    tpd_config dense = load("llama3-8b.yaml", {});
    ASSERT_EQ(tpd_plan_search_run(&dense, &cl, &opt, &s), TPD_OK);
    ASSERT_GT(s.n_top, 0);
    for (int i = 0; i < s.n_top; i++)
        EXPECT_EQ(tpd_plan_ep(&s.top[i].layout), 1) << i;
    EXPECT_EQ(s.best_ep, nullptr);
    tpd_plan_search_free(&s);
}

using plan_test::run;

// `tripod plan configs/mixtral-8x7b.yaml --cluster dgx-h100`: --layout's fifth value is EP
// (the preset's is 8), the breakdown shows the all-to-all line, the JSON the EP fields; the
// search prints the fastest EP layout beside the best when that one runs EP 1.
TEST(PlanEp, CliLayoutAndJson) {
    std::string cfg = std::string(tpd_source_dir()) + "/configs/mixtral-8x7b.yaml";
    std::string out;
    ASSERT_EQ(run({"plan", cfg, "--cluster", "dgx-h100", "--layout", "1,4,16"}, &out), 0) << out;
    for (const char *k : {"EP=8", "all-to-all (EP)", "EP all-to-all", "EP nvlink",
                          "parallel.expert_model_parallel_size=8", "published: Megatron-Core"})
        EXPECT_NE(out.find(k), std::string::npos) << k << " in\n" << out;
    // EP under ZeRO-2 is planned as trained; a file's hybrid shard groups are dropped
    ASSERT_EQ(run({"plan", cfg, "--cluster", "dgx-h100", "--layout", "2,4,8,1,4",
                   "parallel.use_distributed_optimizer=true",
                   "parallel.data_parallel_sharding_strategy=optim_grads",
                   "parallel.data_parallel_shard_size=2"},
                  &out),
              0)
        << out;
    for (const char *k : {"EP=4 from --layout", "its hybrid shard groups of 2 are dropped",
                          "parallel.data_parallel_sharding_strategy=optim_grads",
                          "parallel.expert_model_parallel_size=4"})
        EXPECT_NE(out.find(k), std::string::npos) << k << " in\n" << out;
    ASSERT_EQ(run({"plan", cfg, "--cluster", "dgx-h100", "--layout", "1,4,16,1,1"}, &out), 0);
    EXPECT_EQ(out.find("all-to-all (EP)"), std::string::npos) << out;
    EXPECT_NE(out.find("parallel.expert_model_parallel_size=1"), std::string::npos) << out;

    ASSERT_EQ(run({"plan", cfg, "--cluster", "dgx-h100", "--layout", "1,4,16", "--json"}, &out), 0);
    cJSON *arr = cJSON_Parse(out.c_str());
    ASSERT_NE(arr, nullptr) << out;
    cJSON *o = cJSON_GetArrayItem(arr, 0);
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(cJSON_GetObjectItem(o, "ep")->valuedouble, 8);
    EXPECT_TRUE(cJSON_IsTrue(cJSON_GetObjectItem(o, "planned_only")));
    EXPECT_GT(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "time_breakdown"), "ep_comm")->valuedouble,
              0.0);
    EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "links"), "ep")->valuestring, "nvlink");
    cJSON *epo = cJSON_GetObjectItem(o, "expert_parallel");
    ASSERT_NE(epo, nullptr);
    EXPECT_EQ(cJSON_GetObjectItem(epo, "local_experts")->valuedouble, 1);
    EXPECT_GT(cJSON_GetObjectItem(epo, "a2a_s")->valuedouble, 0.0);
    cJSON_Delete(arr);

    // the search: its best layout runs EP (with ZeRO-1), or the fastest EP one follows it
    ASSERT_EQ(run({"plan", cfg, "--cluster", "dgx-h100", "--gpus", "64", "--top", "3"}, &out), 0);
    size_t best = out.find("best layout:\nlayout: ");
    ASSERT_NE(best, std::string::npos) << out;
    std::string line = out.substr(best, out.find('\n', best + 13) - best);
    EXPECT_TRUE(line.find(" EP=") != std::string::npos ||
                out.find("best layout with expert parallelism (EP > 1)") != std::string::npos)
        << out;
    EXPECT_NE(out.find("all-to-all (EP)"), std::string::npos) << out;
}

} // namespace

// A stack that mixes dense and MoE layers (model.moe_layer_freq 2: 16 of Mixtral's 32 layers
// dense MLPs of ffn_hidden_size): its parameters and FLOPs are the mean of the all-MoE and the
// all-dense model's (the ends being the same), each stage's compute the mean of the two at
// PP 4 (4 layers of each kind a stage), and the EP all-to-alls run in the MoE layers only:
// half of the all-MoE stack's. (Its memory is held to the allocation by PlanMemory.)
TEST(PlanEp, MixedStackPricesEachKind) {
    tpd_config moe = mixtral(), mixed = mixtral({"model.moe_layer_freq=2"}), dense = moe;
    dense.model.num_moe_experts = 0; // the same layers without their experts
    EXPECT_DOUBLE_EQ(tpd_plan_params_count(&mixed),
                     (tpd_plan_params_count(&moe) + tpd_plan_params_count(&dense)) / 2);
    EXPECT_DOUBLE_EQ(tpd_model_flops(&mixed, 256, 32000),
                     (tpd_model_flops(&moe, 256, 32000) + tpd_model_flops(&dense, 256, 32000)) / 2);
    tpd_plan_cluster cl = cluster("dgx-h100");
    // one chunk a stage (the preset's 8 virtual stages would give each stage one kind:
    // chunk c of stage s is layer 4c + s)
    auto one = [](tpd_plan_layout l) {
        l.virtual_stages = 1;
        l.schedule = TPD_SCHEDULE_1F1B;
        return l;
    };
    tpd_plan_result rm = evaluate(moe, cl, one(layout(moe, 1, 1, 4, 16, 1))),
                    rx = evaluate(mixed, cl, one(layout(mixed, 1, 1, 4, 16, 1))),
                    rd = evaluate(dense, cl, one(layout(dense, 1, 1, 4, 16, 1)));
    EXPECT_LT(rd.time.compute, rx.time.compute);
    EXPECT_LT(rx.time.compute, rm.time.compute);
    EXPECT_NEAR(rx.time.compute, (rm.time.compute + rd.time.compute) / 2, 1e-9 * rm.time.compute);
    tpd_plan_result em = evaluate(moe, cl, one(layout(moe, 1, 1, 4, 16, 8))),
                    ex = evaluate(mixed, cl, one(layout(mixed, 1, 1, 4, 16, 8)));
    EXPECT_GT(ex.time.ep_comm, 0.0);
    EXPECT_NEAR(ex.time.ep_comm, em.time.ep_comm / 2, 1e-9 * em.time.ep_comm);
}
