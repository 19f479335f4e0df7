// The planner's arithmetic: parameter counts, FLOPs, Korthikanti activation terms,
// memory bytes per parameter, the simulated bubble, and the cluster profile loader.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "plan_test_util.h"

extern "C" {
#include "engine/model/model_flops.h"
#include "engine/model/model_memory.h"
#include "engine/plan/plan_internal.h"
}

using namespace plan_test;

namespace {

TEST(PlanModel, Eq2ReproducesSc21Table1) {
    for (const Sc21Row &r : kSc21) {
        double p = tpd_plan_params_eq2(r.layers, r.hidden, 51200, 2048) / 1e9;
        EXPECT_NEAR(p, r.params_b, 0.05 + 1e-9) << r.params_b << "B";
    }
}

TEST(PlanModel, TensorShapeCountAgreesWithEq2) {
    // Eq. 2 counts the same tensors as the planner: 12h^2 + 13h per layer, (V + s)h of
    // embeddings; it leaves out the final LayerNorm (2h), which is all that differs.
    for (const Sc21Row &r : kSc21) {
        tpd_config c = gpt(r.heads, r.hidden, r.layers, r.batch, r.mbs);
        double own = tpd_plan_params_count(&c);
        double eq2 = tpd_plan_params_eq2(r.layers, r.hidden, 51200, 2048);
        EXPECT_NEAR(own - eq2, 2.0 * r.hidden, 1e-3 * r.hidden) << r.params_b << "B";
        EXPECT_LT(std::fabs(own - eq2) / eq2, 1e-5);
    }
}

TEST(PlanModel, FlopsFollowMegatronFormulas) {
    tpd_config c = gpt(96, 12288, 96, 1536, 1);
    double B = 1536, s = 2048, l = 96, h = 12288, V = 51200;
    double model = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    double full = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    EXPECT_NEAR(tpd_model_flops(&c, B, V) / model, 1.0, 1e-12);
    EXPECT_NEAR(tpd_plan_hw_flops(&c, B, V, TPD_RECOMPUTE_FULL) / full, 1.0, 1e-12);
    EXPECT_DOUBLE_EQ(tpd_plan_hw_flops(&c, B, V, TPD_RECOMPUTE_NONE), model);
    // Selective recomputes QK^T and AV: 4*s*h FLOPs per token per layer (4*s^2*h per
    // sequence).
    EXPECT_NEAR(tpd_plan_hw_flops(&c, B, V, TPD_RECOMPUTE_SELECTIVE) - model, B * l * 4 * s * s * h,
                1e-6 * model);
}

TEST(PlanModel, ActivationTermsMatchKorthikantiTable2) {
    const double s = 2048, b = 1, h = 12288, a = 96;
    const double sbh = s * b * h;
    for (int t : {1, 2, 8}) {
        SCOPED_TRACE(t);
        // TP only (t = 1 is "no parallelism": 10 + 24 = 34).
        EXPECT_DOUBLE_EQ(
            tpd_plan_activation_bytes_per_layer(s, b, h, a, t, 0, TPD_RECOMPUTE_NONE, 0),
            sbh * (10 + 24.0 / t + 5 * a * s / (h * t)));
        EXPECT_DOUBLE_EQ(
            tpd_plan_activation_bytes_per_layer(s, b, h, a, t, 1, TPD_RECOMPUTE_NONE, 0),
            sbh * (34 + 5 * a * s / h) / t);
        EXPECT_DOUBLE_EQ(
            tpd_plan_activation_bytes_per_layer(s, b, h, a, t, 0, TPD_RECOMPUTE_SELECTIVE, 0),
            sbh * (10 + 24.0 / t));
        EXPECT_DOUBLE_EQ(
            tpd_plan_activation_bytes_per_layer(s, b, h, a, t, 1, TPD_RECOMPUTE_SELECTIVE, 0),
            34 * sbh / t);
        EXPECT_DOUBLE_EQ(
            tpd_plan_activation_bytes_per_layer(s, b, h, a, t, 0, TPD_RECOMPUTE_FULL, 0), 2 * sbh);
        // Flash attention drops exactly the 5as/h term.
        EXPECT_DOUBLE_EQ(
            tpd_plan_activation_bytes_per_layer(s, b, h, a, t, 0, TPD_RECOMPUTE_NONE, 1),
            sbh * (10 + 24.0 / t));
    }
    EXPECT_DOUBLE_EQ(tpd_plan_activation_bytes_per_layer(s, b, h, a, 1, 0, TPD_RECOMPUTE_NONE, 0),
                     s * b * h * (34 + 5 * a * s / h));
}

TEST(PlanModel, InFlightMatchesScheduleRules) {
    EXPECT_EQ(tpd_plan_in_flight(8, 0, 64, 1, TPD_SCHEDULE_1F1B), 8);
    EXPECT_EQ(tpd_plan_in_flight(8, 7, 64, 1, TPD_SCHEDULE_1F1B), 1);
    EXPECT_EQ(tpd_plan_in_flight(8, 0, 4, 1, TPD_SCHEDULE_1F1B), 4);
    // ZB-H1 holds a micro-batch until its W: every stage holds p (stage 0's 1F1B peak).
    EXPECT_EQ(tpd_plan_in_flight(8, 7, 64, 1, TPD_SCHEDULE_ZB_H1), 8);
    EXPECT_EQ(tpd_plan_in_flight(8, 7, 4, 1, TPD_SCHEDULE_ZB_H1), 4);
    // Interleaved stage 0 holds p*(1 + (p-1)/(p*v)) micro-batches' worth of layers.
    int p = 8, v = 2;
    double chunks = tpd_plan_in_flight(p, 0, 64, v, TPD_SCHEDULE_INTERLEAVED);
    EXPECT_DOUBLE_EQ(chunks / v, p * (1.0 + (p - 1.0) / (p * v)));
}

TEST(PlanModel, BytesPerParameterFollowMegatron) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(96, 12288, 96, 1536, 1);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.evaluate_time = 0;
    opt.gpus = 1024;
    tpd_plan_layout lay = {8, 8, 16, 1, 1, TPD_RECOMPUTE_FULL, 1, 0};
    tpd_plan_result plain, zero;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &plain), TPD_OK);
    lay.distributed_optimizer = 1;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &zero), TPD_OK);
    const tpd_plan_stage_mem &p = plain.mem[3], &z = zero.mem[3];
    double n = p.params / 2.0; // bf16 weights
    EXPECT_DOUBLE_EQ((p.params + p.grads + p.optimizer) / n, 18.0);
    EXPECT_NEAR((z.params + z.grads + z.optimizer) / n, 6.0 + 12.0 / 16, 1e-12);
    // A middle stage holds l/p layers of t-sharded weights and no embeddings.
    EXPECT_NEAR(
        n, 12 * (12 * 12288.0 * 12288 / 8 + 6 * 12288.0 + 3 * 12288.0 / 8 + 4 * 12288.0 / 8), 1.0);
    // Stage 0 holds p in-flight micro-batches of 12 layers: 12 * 8 * 2sbh/t (+ masks,
    // + one recomputed layer).
    EXPECT_GT(plain.mem[0].activations, 12 * 8 * 2 * 2048.0 * 12288 / 8);
}

TEST(PlanModel, InvalidLayoutsExplainWhy) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(96, 12288, 96, 1536, 1);
    char why[192];
    tpd_plan_layout l = {16, 8, 8, 1, 1, TPD_RECOMPUTE_NONE, 0, 0};
    c.model.num_attention_heads = 40;
    EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &l, 1024, why, sizeof why));
    EXPECT_STREQ(why, "heads 40 not divisible by TP 16");
    c.model.num_attention_heads = 96;
    tpd_plan_layout l2 = {8, 5, 24, 1, 2, TPD_RECOMPUTE_NONE, 0, 0};
    EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &l2, 960, why, sizeof why));
    EXPECT_STREQ(why, "layers 96 not divisible by PP*v 5*2");
    tpd_plan_layout l3 = {8, 1, 40, 4, 1, TPD_RECOMPUTE_NONE, 0, 0};
    EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &l3, 320, why, sizeof why));
    EXPECT_STREQ(why, "global batch 1536 not divisible by mbs*dp 4*40");
}

TEST(PlanModel, OomReasonHasNumbers) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(96, 12288, 96, 1536, 1);
    tpd_plan_layout l = {8, 1, 8, 1, 1, TPD_RECOMPUTE_NONE, 0, 0};
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 64;
    opt.evaluate_time = 0;
    tpd_plan_result r;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &l, &opt, &r), TPD_OK);
    EXPECT_FALSE(r.fits);
    double over = 0.0;
    int stage = -1;
    ASSERT_EQ(std::sscanf(r.reject_reason, "OOM by %lf GiB at stage %d", &over, &stage), 2)
        << r.reject_reason;
    EXPECT_EQ(stage, 0);
    EXPECT_NEAR(over, (r.memory_bytes - 0.92 * 80 * 1073741824.0) / 1073741824.0, 0.06);
}

TEST(PlanModel, CpuBackendMemoryIsWhatTrainAllocates) {
    // On a `backend: cpu` cluster every stage's bytes are tpd_model_memory's.
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("cpu", &cl), TPD_OK);
    tpd_config c;
    tpd_config_defaults(&c);
    c.model.num_layers = 4;
    c.model.hidden_size = 64;
    c.model.num_attention_heads = 4;
    c.model.ffn_hidden_size = 256;
    c.model.vocab_size = 257;
    c.model.seq_length = 32;
    c.model.max_position_embeddings = 32;
    c.training.global_batch_size = 16;
    c.training.micro_batch_size = 2;
    c.training.precision = TPD_PRECISION_FP32;
    c.training.device = TPD_DEVICE_CPU;
    double activations[2] = {0, 0};
    for (int sp : {0, 1}) {
        SCOPED_TRACE(sp ? "sequence parallel" : "no sequence parallel");
        tpd_plan_layout lay = {2, 2, 2, 2, 1, TPD_RECOMPUTE_NONE, sp, 1};
        tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
        opt.gpus = 8;
        opt.balance_stages = 0; // the even split `tripod train` runs below
        tpd_plan_result r;
        ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &r), TPD_OK);
        ASSERT_EQ(r.stages, 2) << r.reject_reason;
        // The config `tripod train` would run with this layout.
        tpd_config t = c;
        t.parallel.use_distributed_optimizer = 1;
        t.parallel.sequence_parallel = sp;
        t.parallel.tensor_model_parallel_size = 2;
        t.parallel.pipeline_model_parallel_size = 2;
        t.parallel.data_parallel_size = 2;
        for (int s = 0; s < 2; s++) {
            tpd_mem_breakdown mb;
            ASSERT_EQ(tpd_model_memory(&t, 2, 2, 2, s, &mb), TPD_OK);
            EXPECT_EQ(r.mem[s].total, (double)mb.total);
            EXPECT_EQ(r.mem[s].params, (double)mb.params);
            EXPECT_EQ(r.mem[s].optimizer, (double)(mb.optimizer + mb.master));
            EXPECT_GT(mb.total, 0u);
        }
        activations[sp] = r.mem[0].activations;
    }
    // Sequence parallel keeps a 1/TP share of the LayerNorm and residual rows.
    EXPECT_LT(activations[1], activations[0]);
}

// A large vocabulary makes the last stage (head and loss) worth several layers: the planner
// splits the stages by predicted time, and says so; the even split stays where it is best.
TEST(PlanModel, LargeVocabularyPipelineIsSplitByTime) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("h200", &cl), TPD_OK);
    tpd_config c = plan_test::gpt(16, 2048, 24, 512, 1);
    c.model.vocab_size = 128256; // Llama 3's
    c.model.seq_length = c.model.max_position_embeddings = 4096;
    tpd_plan_layout lay = {1, 4, 8, 1, 1, TPD_RECOMPUTE_NONE, 0, 0};
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 32;
    tpd_plan_result bal, even;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &bal), TPD_OK);
    opt.balance_stages = 0;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &even), TPD_OK);
    ASSERT_TRUE(bal.fits);
    EXPECT_TRUE(bal.balanced);
    EXPECT_FALSE(even.balanced);
    int sum = 0;
    for (int s = 0; s < 4; s++) {
        EXPECT_GE(bal.stage_layers[s], 1);
        EXPECT_EQ(even.stage_layers[s], 6);
        sum += bal.stage_layers[s];
    }
    EXPECT_EQ(sum, 24);
    EXPECT_LT(bal.stage_layers[3], bal.stage_layers[0]); // the head's stage holds fewer
    EXPECT_LT(bal.step_time_s, 0.9 * even.step_time_s);
    // the balanced split, given as parallel.pipeline_layers, is what the planner timed
    for (int s = 0; s < 4; s++)
        c.parallel.pipeline_layers[s] = bal.stage_layers[s];
    c.parallel.num_pipeline_layers = 4;
    tpd_plan_result given;
    opt.balance_stages = 1;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &given), TPD_OK);
    EXPECT_FALSE(given.balanced); // an explicit split is never changed
    EXPECT_DOUBLE_EQ(given.step_time_s, bal.step_time_s);

    // GPT-3 175B, TP 8 x PP 16: six layers a stage stays best
    tpd_config g = plan_test::gpt(96, 12288, 96, 1536, 1);
    tpd_plan_layout lg = {8, 16, 8, 1, 1, TPD_RECOMPUTE_FULL, 0, 1};
    ASSERT_EQ(tpd_plan_cluster_load("dgx-a100-80g", &cl), TPD_OK);
    opt.gpus = 1024;
    tpd_plan_result r;
    ASSERT_EQ(tpd_plan_evaluate(&g, &cl, &lg, &opt, &r), TPD_OK);
    EXPECT_FALSE(r.balanced);
    for (int s = 0; s < 16; s++)
        EXPECT_EQ(r.stage_layers[s], 6);
}

// training.recompute_num_layers (Megatron's block method): only the first n layers of a
// stage are recomputed, so memory, time and hardware FLOPs fall between none and full.
// GPT-3 175B at TP 8 x PP 16 x DP 8 on A100s (even stages), evaluated without and with
// full recompute; l is left at full.
class Gpt3Recompute : public ::testing::Test {
  protected:
    void SetUp() override {
        ASSERT_TRUE(init());
    }
    tpd_plan_cluster cl;
    tpd_config g = plan_test::gpt(96, 12288, 96, 1536, 1);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    tpd_plan_layout l = {8, 16, 8, 1, 1, TPD_RECOMPUTE_NONE, 0, 1};
    tpd_plan_result none, full;
    bool init() {
        opt.gpus = 1024;
        opt.balance_stages = 0;
        if (tpd_plan_cluster_load("dgx-a100-80g", &cl) != TPD_OK) return false;
        if (tpd_plan_evaluate(&g, &cl, &l, &opt, &none) != TPD_OK) return false;
        l.recompute = TPD_RECOMPUTE_FULL;
        return tpd_plan_evaluate(&g, &cl, &l, &opt, &full) == TPD_OK;
    }
};

TEST_F(Gpt3Recompute, BlockRecomputeSitsBetweenNoneAndFull) {
    tpd_plan_result block;
    g.training.recompute_num_layers = 2; // of 6 per stage
    ASSERT_EQ(tpd_plan_evaluate(&g, &cl, &l, &opt, &block), TPD_OK);
    EXPECT_EQ(tpd_plan_recomputed_layers(&g, &l, 0), 2);
    EXPECT_LT(full.mem[0].activations, block.mem[0].activations);
    EXPECT_LT(block.mem[0].activations, none.mem[0].activations);
    EXPECT_LT(none.step_time_s, block.step_time_s);
    EXPECT_LT(block.step_time_s, full.step_time_s);
    // a third of the layers recomputed: a third of full recompute's extra FLOPs
    EXPECT_NEAR(block.hw_flops - block.model_flops, (full.hw_flops - full.model_flops) / 3.0,
                1e-9 * full.hw_flops);
    EXPECT_DOUBLE_EQ(none.hw_flops, none.model_flops);
}

// The search's block method: with memory between what full and no recompute need, the
// fewest recomputed layers per stage that fit, and one fewer would not.
TEST_F(Gpt3Recompute, SearchFitsTheFewestRecomputedLayers) {
    ASSERT_LT(full.memory_bytes, none.memory_bytes);
    // usable memory half way between the two
    cl.hbm_bytes = (full.memory_bytes + none.memory_bytes) / 2 / cl.hbm_usable_fraction;
    tpd_config scratch;
    tpd_plan_result r;
    memset(&r, 0, sizeof r);
    r.layout = l;
    const tpd_config *c = nullptr;
    ASSERT_EQ(tpd_plan_memory_split(&g, &cl, &opt, &r, &scratch, &c), TPD_OK);
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(r.fits) << r.reject_reason;
    ASSERT_EQ(tpd_plan_fit_recompute_layers(&g, &cl, &r, &scratch), TPD_OK);
    ASSERT_GT(r.recompute_layers, 0);
    ASSERT_LT(r.recompute_layers, 6);
    EXPECT_TRUE(r.fits);
    tpd_config fewer = g;
    fewer.training.recompute_num_layers = r.recompute_layers - 1;
    tpd_plan_result f;
    if (fewer.training.recompute_num_layers > 0) {
        ASSERT_EQ(tpd_plan_evaluate(&fewer, &cl, &l, &opt, &f), TPD_OK);
        EXPECT_FALSE(f.fits) << "one layer fewer would have fit";
    }
    ASSERT_EQ(tpd_plan_time_split(&g, &cl, &opt, 1, &r, &scratch), TPD_OK);
    tpd_plan_result all;
    ASSERT_EQ(tpd_plan_evaluate(&g, &cl, &l, &opt, &all), TPD_OK);
    EXPECT_LT(r.step_time_s, all.step_time_s); // less recompute, faster
}

TEST(PlanModel, UnevenStagesWhenLayersDoNotDivide) {
    tpd_config c;
    tpd_config_defaults(&c);
    c.model.num_layers = 30;
    // extra layers go to the middle stages first, then the first, the last one last
    int want4[] = {7, 8, 8, 7};
    int sum = 0;
    for (int s = 0; s < 4; s++) {
        EXPECT_EQ(tpd_config_stage_layers(&c, 4, 1, s, 0, NULL), want4[s]) << "stage " << s;
        sum += tpd_config_stage_layers(&c, 4, 1, s, 0, NULL);
    }
    EXPECT_EQ(sum, 30);
    for (int pp = 1; pp <= 30; pp++) {
        int total = 0, lo = 30, hi = 0;
        for (int s = 0; s < pp; s++) {
            int n = tpd_config_stage_layers(&c, pp, 1, s, 0, NULL);
            total += n;
            lo = std::min(lo, n);
            hi = std::max(hi, n);
        }
        EXPECT_EQ(total, 30) << "PP " << pp;
        EXPECT_LE(hi - lo, 1) << "PP " << pp;
    }
    EXPECT_EQ(tpd_config_stage_layers(&c, 31, 1, 0, 0, NULL), -1);
    c.parallel.num_pipeline_layers = 2; // an explicit split wins
    c.parallel.pipeline_layers[0] = 10;
    c.parallel.pipeline_layers[1] = 20;
    EXPECT_EQ(tpd_config_stage_layers(&c, 2, 1, 1, 0, NULL), 20);

    // On the cpu backend the uneven layout's bytes are those the engine allocates when
    // given the same split as parallel.pipeline_layers.
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("cpu", &cl), TPD_OK);
    tpd_config_defaults(&c);
    c.model.num_layers = 5;
    c.model.hidden_size = 64;
    c.model.num_attention_heads = 4;
    c.model.vocab_size = 257;
    c.model.seq_length = 32;
    c.model.max_position_embeddings = 32;
    c.training.global_batch_size = 8;
    c.training.micro_batch_size = 2;
    ASSERT_EQ(tpd_config_resolve(&c), TPD_OK); // ffn_hidden_size 4h
    tpd_plan_layout lay = {1, 3, 1, 2, 1, TPD_RECOMPUTE_NONE, 0, 0};
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 3;
    tpd_plan_result r;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &r), TPD_OK);
    ASSERT_EQ(r.stages, 3) << r.reject_reason;
    c.parallel.pipeline_model_parallel_size = 3;
    c.parallel.num_pipeline_layers = 3;
    for (int s = 0; s < 3; s++)
        c.parallel.pipeline_layers[s] = r.stage_layers[s];
    EXPECT_EQ(r.stage_layers[0] + r.stage_layers[1] + r.stage_layers[2], 5);
    for (int s = 0; s < 3; s++) {
        tpd_mem_breakdown mb;
        ASSERT_EQ(tpd_model_memory(&c, 1, 3, 1, s, &mb), TPD_OK);
        EXPECT_EQ(r.mem[s].total, (double)mb.total) << "stage " << s;
    }
}

TEST(PlanCluster, ProfilesLoadWithPhysicalNumbers) {
    tpd_plan_cluster c;
    ASSERT_EQ(tpd_plan_cluster_load("dgx-a100-80g", &c), TPD_OK);
    EXPECT_EQ(c.gpus_per_node, 8);
    EXPECT_DOUBLE_EQ(c.peak_flops, 312e12);
    EXPECT_DOUBLE_EQ(c.intra_bw, 300e9);
    EXPECT_DOUBLE_EQ(c.inter_bw, 25e9);
    ASSERT_EQ(tpd_plan_cluster_load("dgx-h100", &c), TPD_OK);
    EXPECT_DOUBLE_EQ(c.peak_flops, 989e12);
    ASSERT_EQ(tpd_plan_cluster_load("h200", &c), TPD_OK);
    EXPECT_DOUBLE_EQ(c.peak_flops, 989e12);
    EXPECT_GT(c.hbm_bytes, 130.0 * 1073741824.0);
    ASSERT_EQ(tpd_plan_cluster_load("cpu", &c), TPD_OK);
    EXPECT_EQ(c.backend, TPD_PLAN_BACKEND_CPU);
    // The curve is monotone in the profile and interpolated in between.
    ASSERT_EQ(tpd_plan_cluster_load("dgx-a100-80g", &c), TPD_OK);
    double e1 = tpd_plan_gemm_efficiency(&c, 1e9), e2 = tpd_plan_gemm_efficiency(&c, 3e9),
           e3 = tpd_plan_gemm_efficiency(&c, 1e10);
    EXPECT_LT(e1, e2);
    EXPECT_LT(e2, e3);
}

// libyaml's cost per token grows with the nesting depth: a megabyte of '[' took minutes.
TEST(PlanCluster, DeepNestingIsRefusedAtOnce) {
    const std::string path = plan_test::scratch_path("deep_cluster.yaml");
    FILE *f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("gpus_per_node: ", f);
    for (int i = 0; i < (1 << 20) - 64; i++)
        std::fputc('[', f);
    std::fclose(f);
    tpd_plan_cluster c;
    auto t0 = std::chrono::steady_clock::now();
    tpd_log_quiet_begin();
    EXPECT_EQ(tpd_plan_cluster_load(path.c_str(), &c), TPD_ERR_INVALID);
    tpd_log_quiet_end();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);
    EXPECT_NE(std::string(tpd_last_error()).find(path + ":1:31: YAML nested deeper than 16"),
              std::string::npos)
        << tpd_last_error();
    std::remove(path.c_str());
}

TEST(PlanCluster, BadProfilesNameFileAndKey) {
    const std::string path_s = plan_test::scratch_path("bad_cluster.yaml");
    const char *path = path_s.c_str();
    struct Case {
        const char *text;
    } cases[] = {
        {"gpus_per_node: 8\npeak_tflops: 312\nhbm_gib: 80\nhbm_bw_gbs: 2000\n"
         "intra_node_bw_gbs: 300\ninter_node_bw_gbs: 25\npeak_tflop: 3\n"}, // unknown
        {"gpus_per_node: 8\npeak_tflops: 312\nhbm_gib: 80\nhbm_bw_gbs: 2000\n"
         "intra_node_bw_gbs: 300\n"}, // missing
        {"gpus_per_node: 8\npeak_tflops: fast\nhbm_gib: 80\nhbm_bw_gbs: 2000\n"
         "intra_node_bw_gbs: 300\ninter_node_bw_gbs: 25\n"}, // not a number
        {"gpus_per_node: 8\npeak_tflops: 312\nhbm_gib: 80\nhbm_bw_gbs: 2000\n"
         "intra_node_bw_gbs: 300\ninter_node_bw_gbs: 25\nbackend: tpu\n"}, // bad enum
        {"gpus_per_node: 8\npeak_tflops: 312\nhbm_gib: 80\nhbm_bw_gbs: 2000\n"
         "intra_node_bw_gbs: 300\ninter_node_bw_gbs: 25\n"
         "gemm_efficiency: [[10, 0.5], [1, 0.6]]\n"}, // not increasing
    };
    for (const Case &k : cases) {
        FILE *f = std::fopen(path, "w");
        ASSERT_NE(f, nullptr);
        std::fputs(k.text, f);
        std::fclose(f);
        tpd_plan_cluster c;
        testing::internal::CaptureStderr();
        EXPECT_EQ(tpd_plan_cluster_load(path, &c), TPD_ERR_INVALID) << k.text;
        std::string err = testing::internal::GetCapturedStderr();
        EXPECT_NE(err.find(path), std::string::npos) << err;
    }
    std::remove(path);
    tpd_plan_cluster c;
    testing::internal::CaptureStderr();
    EXPECT_EQ(tpd_plan_cluster_load("no-such-cluster", &c), TPD_ERR_IO);
    EXPECT_NE(testing::internal::GetCapturedStderr().find("no-such-cluster"), std::string::npos);
}

} // namespace
