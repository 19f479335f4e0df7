// Context parallelism in the planner: activations per rank at seq/CP tokens (the closed
// form and Korthikanti's terms), the CP group's link from the rank order, the ring's
// transfers hidden behind its attention blocks only on a fast link, a2a's head rule, the
// search finding a CP layout where no other fits (Llama 3 8B at 128K tokens on 64 H100s),
// and the prediction for Llama 3 405B's long-context layout beside Dubey et al.'s Table 4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "plan_test_util.h"

extern "C" {
#include "base/file.h"
#include "engine/plan/plan_internal.h"
}

namespace {

using plan_test::cluster;
using plan_test::load;

// TP x CP x PP x DP with the config's other settings.
tpd_plan_layout layout(const tpd_config &c, int tp, int cp, int pp, int dp, tpd_cp_comm comm) {
    tpd_plan_layout l;
    tpd_plan_layout_from_config(&c, 0, &l);
    l.tp = tp;
    l.cp = cp;
    l.pp = pp;
    l.dp = dp;
    l.cp_comm = comm;
    l.virtual_stages = 1;
    l.schedule = TPD_SCHEDULE_1F1B;
    l.sequence_parallel = tp > 1;
    return l;
}

// Llama 3 8B at 32K tokens (bf16, cuDNN's fused attention on cuda).
tpd_config llama8b_32k() {
    return load("llama3-8b.yaml", {"model.seq_length=32768", "model.max_position_embeddings=32768",
                                   "training.global_batch_size=64", "training.micro_batch_size=1",
                                   "parallel.virtual_pipeline_model_parallel_size=1"});
}

// Activations per rank scale with the rank's tokens: at CP 2 half of CP 1's, at CP 4 a
// quarter, in the engine's buffer plan (cuda, bf16: cuDNN's (B,NH,T) statistics at CP 1
// and the ring's LSE of the same shape at CP > 1, so every term is per token) and in
// Korthikanti's terms (each term at s/CP tokens, the s^2 terms at s/CP queries). The
// weights do not split; ZeRO-1 shards them over DP x CP, as over DP alone. On the cpu
// backend the ring keeps its LSE instead of CP 1's (T,T) probabilities: below half.
TEST(PlanCp, ActivationsHalveAndQuarterWithCp) {
    tpd_config c = llama8b_32k();
    ASSERT_EQ(c.training.attention, TPD_ATTENTION_FUSED);
    double act[5] = {}, params[5] = {};
    for (int cp : {1, 2, 4}) {
        tpd_plan_layout l = layout(c, 1, cp, 1, 1, TPD_CP_COMM_P2P);
        l.recompute = TPD_RECOMPUTE_NONE;
        tpd_plan_stage_mem m;
        ASSERT_EQ(tpd_plan_cpu_memory(&c, &l, 0, &m), TPD_OK) << "CP " << cp;
        act[cp] = m.activations;
        params[cp] = m.params;
    }
    EXPECT_NEAR(act[2] / act[1], 0.5, 1e-3);
    EXPECT_NEAR(act[4] / act[1], 0.25, 1e-3);
    EXPECT_DOUBLE_EQ(params[4], params[1]);
    for (int flash : {0, 1})
        for (tpd_recompute r : {TPD_RECOMPUTE_NONE, TPD_RECOMPUTE_SELECTIVE})
            for (int cp : {2, 4}) {
                double one = tpd_plan_layer_activation_bytes_cp(&c, 1, 2, 1, r, flash, 1);
                double per = tpd_plan_layer_activation_bytes_cp(&c, 1, 2, 1, r, flash, cp);
                EXPECT_NEAR(per * cp / one, 1.0, 1e-12) << "flash " << flash << " CP " << cp;
            }
    EXPECT_EQ(tpd_plan_layer_activation_bytes_cp(&c, 1, 2, 1, TPD_RECOMPUTE_NONE, 0, 1),
              tpd_plan_layer_activation_bytes(&c, 1, 2, 1, TPD_RECOMPUTE_NONE, 0));
    // ZeRO-1 over DP x CP: CP 4 x DP 1 shards as DP 4 does
    tpd_plan_layout a = layout(c, 1, 4, 1, 1, TPD_CP_COMM_P2P), b = layout(c, 1, 1, 1, 4, {});
    a.distributed_optimizer = b.distributed_optimizer = 1;
    tpd_plan_stage_mem ma, mb;
    ASSERT_EQ(tpd_plan_cpu_memory(&c, &a, 0, &ma), TPD_OK);
    ASSERT_EQ(tpd_plan_cpu_memory(&c, &b, 0, &mb), TPD_OK);
    EXPECT_DOUBLE_EQ(ma.optimizer, mb.optimizer);
    EXPECT_LT(ma.optimizer, 0.3 * ma.optimizer_full);
    // the cpu backend (fp32): the (T,T) probabilities at CP 1, the LSE under the ring
    tpd_config cpu = c;
    cpu.model.seq_length = cpu.model.max_position_embeddings = 4096;
    cpu.training.device = TPD_DEVICE_CPU;
    cpu.training.precision = TPD_PRECISION_FP32;
    tpd_plan_layout l1 = layout(cpu, 1, 1, 1, 1, {}), l2 = layout(cpu, 1, 2, 1, 1, {});
    tpd_plan_stage_mem m1, m2;
    ASSERT_EQ(tpd_plan_cpu_memory(&cpu, &l1, 0, &m1), TPD_OK);
    ASSERT_EQ(tpd_plan_cpu_memory(&cpu, &l2, 0, &m2), TPD_OK);
    EXPECT_LT(m2.activations, 0.4 * m1.activations);
}

// The CP group is CP ranks TP apart (TP fastest, then CP): TP x CP consecutive ranks, one
// NVLink domain when that is at most the node's 8 GPUs, the network beyond.
TEST(PlanCp, CpLinkFollowsTheRankOrder) {
    tpd_plan_cluster cl = cluster("dgx-h100");
    const struct {
        int tp, cp;
        tpd_plan_hop hop;
    } rows[] = {{1, 8, TPD_PLAN_HOP_NVLINK},   {2, 4, TPD_PLAN_HOP_NVLINK},
                {4, 2, TPD_PLAN_HOP_NVLINK},   {4, 4, TPD_PLAN_HOP_NETWORK},
                {1, 16, TPD_PLAN_HOP_NETWORK}, {8, 16, TPD_PLAN_HOP_NETWORK}};
    tpd_config c = llama8b_32k();
    for (const auto &r : rows) {
        double bw, lat;
        tpd_plan_hop hop;
        tpd_plan_cp_link(&cl, r.cp, r.tp, &bw, &lat, &hop);
        EXPECT_EQ(hop, r.hop) << "TP " << r.tp << " CP " << r.cp;
        bool nv = r.hop == TPD_PLAN_HOP_NVLINK;
        EXPECT_DOUBLE_EQ(bw, nv ? cl.intra_bw * cl.coll_efficiency
                                : cl.inter_bw * cl.net_coll_efficiency);
        EXPECT_DOUBLE_EQ(lat, nv ? cl.intra_latency : cl.inter_latency);
        // and the evaluated layout reports it
        tpd_plan_layout l = layout(c, r.tp, r.cp, 1, 1, TPD_CP_COMM_P2P);
        tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
        opt.gpus = r.tp * r.cp;
        tpd_plan_result res;
        ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &l, &opt, &res), TPD_OK);
        ASSERT_GT(res.stages, 0) << res.reject_reason;
        EXPECT_EQ(res.hop_cp, r.hop) << "TP " << r.tp << " CP " << r.cp;
    }
}

// The ring sends one K/V block per step beside one block of attention: on NVLink the
// transfer is shorter and nothing is exposed; on a link 450 times slower each of the CP - 1
// steps is exposed for transfer - block, forward, and twice that backward (K/V and dK/dV
// against twice the compute): 3 (CP - 1) (transfer - block) per layer and micro-batch.
// a2a's all-to-alls are never hidden.
TEST(PlanCp, RingIsHiddenOnAFastLinkAndExposedOnASlowOne) {
    tpd_config c = llama8b_32k();
    tpd_plan_cluster fast = cluster("dgx-h100"), slow = fast;
    slow.intra_bw = fast.intra_bw / 450.0; // 1 GB/s
    const int tp = 2, cp = 4;
    tpd_plan_layout l = layout(c, tp, cp, 1, 1, TPD_CP_COMM_P2P);
    l.recompute = TPD_RECOMPUTE_NONE;
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = tp * cp;
    tpd_plan_result rf, rs;
    ASSERT_EQ(tpd_plan_evaluate(&c, &fast, &l, &opt, &rf), TPD_OK);
    ASSERT_EQ(tpd_plan_evaluate(&c, &slow, &l, &opt, &rs), TPD_OK);
    ASSERT_GT(rf.stages, 0) << rf.reject_reason;
    EXPECT_LT(rf.cp_step_comm_s, rf.cp_step_attn_s);
    EXPECT_EQ(rf.time.cp_comm, 0.0);
    EXPECT_GT(rf.time.cp_comm_hidden, 0.0);
    EXPECT_GT(rs.cp_step_comm_s, rs.cp_step_attn_s);
    double per_layer = 3.0 * (cp - 1) * (rs.cp_step_comm_s - rs.cp_step_attn_s);
    EXPECT_NEAR(rs.time.cp_comm, rs.num_micro_batches * c.model.num_layers * per_layer,
                1e-9 * rs.time.cp_comm);
    EXPECT_GT(rs.step_time_s, rf.step_time_s + 0.9 * rs.time.cp_comm);
    // the K/V bytes: CP - 1 blocks of (s/CP, 2 h_kv / TP) bf16 forward, twice backward
    double block = 2.0 * (32768.0 / cp) * 2 * 1024 / tp;
    EXPECT_DOUBLE_EQ(rf.cp_bytes_layer, 3.0 * (cp - 1) * block);
    // a2a on the fast link: exposed whole
    l.cp_comm = TPD_CP_COMM_A2A;
    tpd_plan_result ra;
    ASSERT_EQ(tpd_plan_evaluate(&c, &fast, &l, &opt, &ra), TPD_OK);
    ASSERT_GT(ra.stages, 0) << ra.reject_reason;
    EXPECT_GT(ra.time.cp_comm, 0.0);
    EXPECT_EQ(ra.time.cp_comm_hidden, 0.0);
}

// a2a gives each CP rank whole heads: the query heads (32) and the K/V heads (8) must both
// divide by TP x CP. The ring has no such rule.
TEST(PlanCp, A2aIsRefusedWhereTheHeadsDoNotDivide) {
    tpd_config c = llama8b_32k();
    tpd_plan_cluster cl = cluster("dgx-h100");
    char why[192];
    tpd_plan_layout ok = layout(c, 1, 8, 1, 1, TPD_CP_COMM_A2A);
    EXPECT_TRUE(tpd_plan_layout_valid(&c, &cl, &ok, 8, why, sizeof why)) << why;
    tpd_plan_layout bad = layout(c, 2, 8, 1, 1, TPD_CP_COMM_A2A);
    EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &bad, 16, why, sizeof why));
    EXPECT_NE(std::string(why).find("a2a: heads 32 and K/V heads 8 not both divisible by TP*CP 16"),
              std::string::npos)
        << why;
    bad.cp_comm = TPD_CP_COMM_P2P;
    EXPECT_TRUE(tpd_plan_layout_valid(&c, &cl, &bad, 16, why, sizeof why)) << why;
    // and 2 x CP chunks of the sequence: 32768 splits 64 ways, not 3 x 2
    tpd_plan_layout three = layout(c, 1, 3, 1, 1, TPD_CP_COMM_P2P);
    EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &three, 3, why, sizeof why));
    EXPECT_NE(std::string(why).find("not divisible by 2*CP 6"), std::string::npos) << why;
}

// `tripod plan configs/llama3-8b.yaml model.seq_length=131072 --cluster dgx-h100 --gpus 64`
// (with the positions the sequence needs): 128K tokens of activations fit no layout of TP,
// PP and DP alone; the search finds CP layouts that fit, each of the 64 GPUs, a2a only where
// the heads divide. The best one at CP 1 (its CP folded into DP) does not fit.
TEST(PlanCp, Llama8bAt128kFindsAFittingCpLayout) {
    tpd_config c =
        load("llama3-8b.yaml", {"model.seq_length=131072", "model.max_position_embeddings=131072"});
    tpd_plan_cluster cl = cluster("dgx-h100");
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 64;
    tpd_plan_search s;
    ASSERT_EQ(tpd_plan_search_run(&c, &cl, &opt, &s), TPD_OK);
    ASSERT_GT(s.n_top, 0);
    for (int i = 0; i < s.n_top; i++) {
        const tpd_plan_layout &l = s.top[i].layout;
        EXPECT_TRUE(s.top[i].fits);
        EXPECT_GT(tpd_plan_cp(&l), 1) << i;
        EXPECT_EQ(tpd_plan_world(&l), 64) << i;
        EXPECT_EQ(131072 % (2 * tpd_plan_cp(&l)), 0) << i;
        if (l.cp_comm == TPD_CP_COMM_A2A) EXPECT_EQ(8 % (l.tp * l.cp), 0) << i;
    }
    const tpd_plan_result &best = s.top[0];
    std::printf("  Llama 3 8B at 131072 tokens on 64 H100s: TP %d CP %d %s PP %d DP %d, %.1f GiB, "
                "%.1f s per step, %.1f TFLOP/s/GPU, MFU %.1f%%\n",
                best.layout.tp, best.layout.cp,
                tpd_config_choice("parallel.cp_comm_type", best.layout.cp_comm), best.layout.pp,
                best.layout.dp, best.memory_bytes / 1073741824.0, best.step_time_s,
                best.tflops_per_gpu, 100 * best.mfu);
    tpd_plan_layout one = best.layout;
    one.dp *= one.cp;
    one.cp = 1;
    tpd_plan_result r1;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &one, &opt, &r1), TPD_OK);
    EXPECT_FALSE(r1.fits) << r1.reject_reason;
    tpd_plan_search_free(&s);
}

// At 2048 tokens a CP rank's attention blocks are small: GPT-3 175B at TP 8 (so the CP
// group leaves the node) on 128 A100s loses more to the ring's exposed transfers at each
// larger CP, and CP 1 is the fastest. The search holds no threshold on the sequence: this is
// the model deciding (where CP stays on the node it can still win by a little: the 175B search
// on 1024 A100s ranks TP 2 CP 2 0.4% ahead of TP 4 CP 1, inside the model's error).
TEST(PlanCp, ShortSequencesLoseTimeToTheRing) {
    tpd_config c = plan_test::gpt(96, 12288, 96, 1536, 1);
    tpd_plan_cluster cl = cluster("dgx-a100-80g");
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 1024;
    double last_step = 0.0, last_cp = -1.0;
    for (int cp : {1, 2, 4, 8}) {
        tpd_plan_layout l = layout(c, 8, cp, 16, 8 / cp, TPD_CP_COMM_P2P);
        l.recompute = TPD_RECOMPUTE_SELECTIVE;
        tpd_plan_result r;
        ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &l, &opt, &r), TPD_OK);
        ASSERT_GT(r.stages, 0) << r.reject_reason;
        EXPECT_GT(r.step_time_s, last_step) << "CP " << cp;
        EXPECT_GT(r.time.cp_comm, last_cp) << "CP " << cp;
        if (cp > 1) EXPECT_GT(r.cp_step_comm_s, r.cp_step_attn_s) << "CP " << cp;
        last_step = r.step_time_s;
        last_cp = r.time.cp_comm;
    }
}

// Dubey et al. 2024, Table 4: Llama 3 405B at 131,072 tokens, TP 8, CP 16, PP 16, DP 8 on
// 16,384 H100-80GB, 380 TFLOPs/GPU, 38% BF16 MFU. configs/llama3-405b-128k.yaml states the
// rest (interleaved with 2 chunks a stage, the fewest recomputed layers that fit: 2 of 4 a
// chunk). The prediction's band: within 20% of the published MFU (the held-out rows' mean
// error bound, test_plan_heldout.cc; the planner is optimistic there by 19% on average and
// this row comes out 13% low). Printed beside it: every layer recomputed, and selective
// recompute, which does not fit.
TEST(PlanCp, Llama405bLongContextNearTable4) {
    const double published_mfu = 0.38, published_tflops = 380;
    tpd_config c = load("llama3-405b-128k.yaml", {});
    tpd_plan_cluster cl = cluster("dgx-h100");
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 16384;
    auto eval = [&](const tpd_config &cfg, tpd_plan_result *r) {
        tpd_plan_layout l;
        tpd_plan_layout_from_config(&cfg, 0, &l);
        l.cp = 16;
        l.dp = 8;
        ASSERT_EQ(tpd_plan_evaluate(&cfg, &cl, &l, &opt, r), TPD_OK);
        ASSERT_GT(r->stages, 0) << r->reject_reason;
    };
    tpd_plan_result r;
    eval(c, &r);
    double err = r.mfu / published_mfu - 1.0;
    std::printf("  Llama 3 405B, 131072 tokens, TP 8 CP 16 PP 16 DP 8 on 16384 H100s (v 2, 2 "
                "layers of 4 recomputed): predicted %.1f TFLOP/s/GPU, MFU %.1f%%; published "
                "%.0f, %.0f%%: %+.1f%% (mem %.1f GiB, fits %d)\n",
                r.tflops_per_gpu, 100 * r.mfu, published_tflops, 100 * published_mfu, 100 * err,
                r.memory_bytes / 1073741824.0, r.fits);
    EXPECT_TRUE(r.fits) << r.reject_reason;
    EXPECT_LT(std::fabs(err), 0.20);
    EXPECT_EQ(r.time.cp_comm, 0.0); // the ring's K/V hide behind 8192 x 8192 blocks
    EXPECT_EQ(r.hop_cp, TPD_PLAN_HOP_NETWORK);
    for (int k : {0, -1}) { // all layers recomputed; selective
        tpd_config v = c;
        v.training.recompute_num_layers = 0;
        if (k < 0) v.training.recompute = TPD_RECOMPUTE_SELECTIVE;
        tpd_plan_result rv;
        eval(v, &rv);
        std::printf("    with %-22s: MFU %.1f%% (%+.1f%%), mem %.1f GiB, fits %d\n",
                    k < 0 ? "selective recompute" : "every layer recomputed", 100 * rv.mfu,
                    100 * (rv.mfu / published_mfu - 1.0), rv.memory_bytes / 1073741824.0, rv.fits);
        EXPECT_GT(rv.mfu, 0.0);
    }
}

} // namespace
