// The planner and the Llama block: parameter counts of the Llama 3 presets against the
// published ones, the activation bytes derived for GQA/SwiGLU/RMSNorm against their closed
// form (and GPT-2's against Korthikanti's), what GQA and SwiGLU change in memory, FLOPs and
// time, the untied output layer (no embedding group, its memory on the last stage), stage
// balancing with the ends, and the cpu backend's memory left unsupported for now.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "plan_test_util.h"

extern "C" {
#include "base/file.h"
#include "engine/model/model_flops.h"
#include "engine/plan/plan_internal.h"
}

namespace {

tpd_config load_preset(const char *name) {
    std::string path = std::string(tpd_source_dir()) + "/configs/" + name;
    tpd_config c;
    EXPECT_EQ(tpd_config_load(path.c_str(), 0, nullptr, &c), TPD_OK) << tpd_last_error();
    return c;
}

using plan_test::llama;

tpd_config llama70b() {
    return llama(80, 8192, 64, 8, 28672);
}

// Published counts (Meta's model cards: 8.03B, 70.6B, 405.9B) within 0.5%, and the exact
// count of the tensors' shapes worked out here: per layer Q and the output projection
// (h x h each), K and V (h x 8*128 each), gate, up and down (h x f each), two RMSNorm
// weights; the embedding and the untied output layer (V x h each); the final RMSNorm.
TEST(PlanLlama, PresetParameterCountsMatchThePublishedOnes) {
    const struct {
        const char *file;
        double published;
        long long l, h, f;
    } presets[] = {
        {"llama3-8b.yaml", 8.03e9, 32, 4096, 14336},
        {"llama3-70b.yaml", 70.6e9, 80, 8192, 28672},
        {"llama3-405b.yaml", 405.9e9, 126, 16384, 53248},
    };
    for (const auto &p : presets) {
        SCOPED_TRACE(p.file);
        tpd_config c = load_preset(p.file);
        double n = tpd_plan_params_count(&c);
        EXPECT_LT(std::fabs(n - p.published) / p.published, 0.005) << n;
        const long long V = 128256, kv = 8 * 128;
        long long layer = 2 * p.h * p.h + 2 * p.h * kv + 3 * p.h * p.f + 2 * p.h;
        long long exact = p.l * layer + 2 * V * p.h + p.h;
        EXPECT_EQ(n, (double)exact);
    }
    // what the Hugging Face checkpoints hold: model.safetensors.index.json's total_size, in
    // bf16 bytes, of meta-llama/Meta-Llama-3-8B and -70B
    tpd_config c8 = load_preset("llama3-8b.yaml"), c70 = load_preset("llama3-70b.yaml");
    EXPECT_EQ(2 * tpd_plan_params_count(&c8), 16060522496.0);
    EXPECT_EQ(2 * tpd_plan_params_count(&c70), 141107412992.0);
}

// GPT-2's block through the general function is Korthikanti's Table 2, term for term.
TEST(PlanLlama, GptBlockActivationsAreKorthikantis) {
    tpd_config g = plan_test::gpt(96, 12288, 96, 1536, 1);
    ASSERT_TRUE(tpd_plan_gpt_block(&g));
    for (int t : {1, 2, 8})
        for (int sp : {0, 1})
            for (int r : {0, 1, 2})
                for (int flash : {0, 1}) {
                    SCOPED_TRACE(testing::Message()
                                 << "t " << t << " sp " << sp << " r " << r << " flash " << flash);
                    EXPECT_DOUBLE_EQ(
                        tpd_plan_layer_activation_bytes(&g, 2, t, sp, (tpd_recompute)r, flash),
                        tpd_plan_activation_bytes_per_layer(2048, 2, 12288, 96, t, sp,
                                                            (tpd_recompute)r, flash));
                }
}

// The Llama block's bytes per layer (plan/memory.c derives them term by term): without SP
// sbh(8 + (4 + 4g/a)/t) + 6sbf/t + 2as^2b/t, with SP all of it over t; flash and selective
// recompute drop the s^2 term, full recompute keeps the layer input.
TEST(PlanLlama, LlamaActivationsFollowTheirDerivation) {
    tpd_config c = llama70b();
    c.training.attention = TPD_ATTENTION_UNFUSED;
    ASSERT_FALSE(tpd_plan_gpt_block(&c));
    const double s = 8192, b = 2, h = 8192, a = 64, g = 8, f = 28672, sbh = s * b * h;
    for (int t : {1, 4, 8}) {
        SCOPED_TRACE(t);
        double scores = 2 * a * s * s * b / t, mlp = 6 * s * b * f / t;
        EXPECT_DOUBLE_EQ(tpd_plan_layer_activation_bytes(&c, b, t, 0, TPD_RECOMPUTE_NONE, 0),
                         sbh * (8 + (4 + 4 * g / a) / t) + mlp + scores);
        EXPECT_DOUBLE_EQ(tpd_plan_layer_activation_bytes(&c, b, t, 1, TPD_RECOMPUTE_NONE, 0),
                         (sbh * (12 + 4 * g / a) + 6 * s * b * f + 2 * a * s * s * b) / t);
        EXPECT_DOUBLE_EQ(tpd_plan_layer_activation_bytes(&c, b, t, 0, TPD_RECOMPUTE_NONE, 1),
                         sbh * (8 + (4 + 4 * g / a) / t) + mlp);
        EXPECT_DOUBLE_EQ(tpd_plan_layer_activation_bytes(&c, b, t, 1, TPD_RECOMPUTE_SELECTIVE, 0),
                         (sbh * (12 + 4 * g / a) + 6 * s * b * f) / t);
        EXPECT_DOUBLE_EQ(tpd_plan_layer_activation_bytes(&c, b, t, 0, TPD_RECOMPUTE_FULL, 0),
                         2 * sbh);
        EXPECT_DOUBLE_EQ(tpd_plan_layer_activation_bytes(&c, b, t, 1, TPD_RECOMPUTE_FULL, 0),
                         2 * sbh / t);
    }
    // Llama 3 70B with SP keeps 33.5sbh/t a layer where GPT keeps 34sbh/t
    EXPECT_DOUBLE_EQ(tpd_plan_layer_activation_bytes(&c, b, 8, 1, TPD_RECOMPUTE_SELECTIVE, 1),
                     33.5 * sbh / 8);
}

// Grouped-query attention: K and V shrink by g/a, in activations and in weights; nothing
// else changes. MHA is the same config with one K/V head per query head.
TEST(PlanLlama, GqaShrinksKeysAndValuesByTheGroupRatio) {
    tpd_config gqa = llama70b(), mha = llama70b();
    mha.model.group_query_attention = 0;
    ASSERT_EQ(tpd_config_kv_heads(&gqa), 8);
    ASSERT_EQ(tpd_config_kv_heads(&mha), 64);
    const double s = 8192, b = 1, h = 8192, a = 64, g = 8;
    for (int t : {1, 8})
        for (int sp : {0, 1}) {
            SCOPED_TRACE(testing::Message() << "t " << t << " sp " << sp);
            // K and V of MHA hold 4sbh/t bytes; GQA's g/a of that
            double kv_mha = 4 * s * b * h / t, kv_gqa = kv_mha * g / a;
            double d = tpd_plan_layer_activation_bytes(&mha, b, t, sp, TPD_RECOMPUTE_NONE, 1) -
                       tpd_plan_layer_activation_bytes(&gqa, b, t, sp, TPD_RECOMPUTE_NONE, 1);
            EXPECT_DOUBLE_EQ(d, kv_mha - kv_gqa);
            // K and V weights: 2h^2/t against 2h*(g/a)h/t
            EXPECT_DOUBLE_EQ(tpd_plan_layer_params(&mha, t) - tpd_plan_layer_params(&gqa, t),
                             2 * h * h * (1 - g / a) / t);
        }
    // FLOPs: the K and V projections only (attention itself still runs every query head)
    double tokens = 2048 * 8192.0;
    EXPECT_NEAR(tpd_model_flops(&mha, 2048, 128256) - tpd_model_flops(&gqa, 2048, 128256),
                3 * tokens * 80 * 2 * 2 * h * h * (1 - g / a),
                1e-9 * tpd_model_flops(&mha, 2048, 1));
    // and a layer's time: MHA's QKV GEMM is larger
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("h200", &cl), TPD_OK);
    tpd_plan_layout lay = {8, 4, 32, 1, 1, TPD_RECOMPUTE_NONE, 1, 1};
    double f1, b1, c1, f2, b2, c2;
    tpd_plan_stage_time(&gqa, &cl, &lay, 1, &f1, &b1, &c1);
    tpd_plan_stage_time(&mha, &cl, &lay, 1, &f2, &b2, &c2);
    EXPECT_LT(f1, f2);
    EXPECT_LT(b1, b2);
    EXPECT_DOUBLE_EQ(c1, c2); // the same TP collectives
}

// SwiGLU: three matrices of width f where GELU's MLP has two; gate, up and their product
// kept for the backward where GELU keeps its input and output.
TEST(PlanLlama, SwigluHasThreeMatrices) {
    tpd_config glu = llama70b(), gelu = llama70b();
    gelu.model.swiglu = 0;
    const double h = 8192, f = 28672, s = 8192, L = 80;
    EXPECT_DOUBLE_EQ(tpd_plan_params_count(&glu) - tpd_plan_params_count(&gelu), L * h * f);
    for (int t : {1, 8})
        EXPECT_DOUBLE_EQ(tpd_plan_layer_params(&glu, t) - tpd_plan_layer_params(&gelu, t),
                         h * f / t);
    double tokens = 2048 * s;
    EXPECT_NEAR(tpd_model_flops(&glu, 2048, 128256) - tpd_model_flops(&gelu, 2048, 128256),
                3 * tokens * L * 2 * h * f, 1e-9 * tpd_model_flops(&glu, 2048, 128256));
    EXPECT_DOUBLE_EQ(tpd_plan_layer_activation_bytes(&glu, 1, 8, 0, TPD_RECOMPUTE_NONE, 1) -
                         tpd_plan_layer_activation_bytes(&gelu, 1, 8, 0, TPD_RECOMPUTE_NONE, 1),
                     2 * s * f / 8);
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("h200", &cl), TPD_OK);
    tpd_plan_layout lay = {8, 4, 32, 1, 1, TPD_RECOMPUTE_NONE, 1, 1};
    double f1, b1, c1, f2, b2, c2;
    tpd_plan_stage_time(&glu, &cl, &lay, 1, &f1, &b1, &c1);
    tpd_plan_stage_time(&gelu, &cl, &lay, 1, &f2, &b2, &c2);
    EXPECT_GT(f1, f2);
    EXPECT_GT(b1, b2);
}

// The untied output layer lives on the last stage (on the only stage with pp = 1, beside
// the embedding); RoPE has no position table on the first stage; each stage's parameters
// are what the test counts from the shapes.
TEST(PlanLlama, StagesHoldTheEmbeddingAndTheOutputLayer) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("h200", &cl), TPD_OK);
    tpd_config c = llama70b();
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.evaluate_time = 0;
    opt.balance_stages = 0;
    const double h = 8192, kv = 1024, f = 28672, t = 8;
    const double Vp = 129024; // 128256 padded to a multiple of 128 * 8
    const double layer = (2 * h * h + 2 * h * kv + 3 * h * f) / t + 2 * h;
    opt.gpus = 8 * 4 * 32;
    tpd_plan_layout lay = {8, 4, 32, 1, 1, TPD_RECOMPUTE_FULL, 1, 1};
    tpd_plan_result r;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &r), TPD_OK);
    ASSERT_EQ(r.stages, 4) << r.reject_reason;
    // bf16 weights: 2 bytes a parameter
    EXPECT_DOUBLE_EQ(r.mem[0].params / 2, 20 * layer + Vp * h / t);     // embedding, no wpe
    EXPECT_DOUBLE_EQ(r.mem[1].params / 2, 20 * layer);                  // layers only
    EXPECT_DOUBLE_EQ(r.mem[3].params / 2, 20 * layer + h + Vp * h / t); // final norm, output
    // one stage: embedding and output layer both (a tied model holds one of them)
    opt.gpus = 8;
    tpd_plan_layout one = {8, 1, 1, 1, 1, TPD_RECOMPUTE_FULL, 1, 0};
    tpd_plan_result u, tied;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &one, &opt, &u), TPD_OK);
    c.model.untie_embeddings_and_output_weights = 0;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &one, &opt, &tied), TPD_OK);
    EXPECT_DOUBLE_EQ(u.mem[0].params / 2 - tied.mem[0].params / 2, Vp * h / t);
    // learned positions would add their table to the first stage
    tpd_config learned = llama70b();
    learned.model.position_embedding_type = TPD_POS_LEARNED;
    tpd_plan_result lr;
    opt.gpus = 8 * 4 * 32;
    ASSERT_EQ(tpd_plan_evaluate(&learned, &cl, &lay, &opt, &lr), TPD_OK);
    EXPECT_DOUBLE_EQ(lr.mem[0].params / 2 - r.mem[0].params / 2, 8192.0 * h);
    EXPECT_DOUBLE_EQ(lr.mem[3].params, r.mem[3].params);
}

// Untied: no embedding group, so the ends do not all-reduce an embedding gradient and the
// DP communication of the busiest stage is that all-reduce shorter than the tied model's,
// whose last stage holds a copy of the same size.
TEST(PlanLlama, UntiedModelHasNoEmbeddingGroup) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("h200", &cl), TPD_OK);
    tpd_config untied = llama(32, 4096, 32, 8, 14336), tied = untied;
    tied.model.untie_embeddings_and_output_weights = 0;
    tpd_plan_layout lay = {2, 4, 16, 1, 1, TPD_RECOMPUTE_NONE, 1, 1};
    EXPECT_FALSE(tpd_plan_embedding_group(&untied, &lay));
    EXPECT_TRUE(tpd_plan_embedding_group(&tied, &lay));
    tpd_plan_layout one = lay;
    one.pp = 1;
    EXPECT_FALSE(tpd_plan_embedding_group(&tied, &one));
    tpd_plan_dp_cost du, dt;
    tpd_plan_gpu_dp_cost(&untied, &cl, &lay, &du);
    tpd_plan_gpu_dp_cost(&tied, &cl, &lay, &dt);
    EXPECT_EQ(du.emb_allreduce, 0.0);
    EXPECT_GT(dt.emb_allreduce, 0.0);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 128;
    opt.balance_stages = 0;
    tpd_plan_result ru, rt;
    ASSERT_EQ(tpd_plan_evaluate(&untied, &cl, &lay, &opt, &ru), TPD_OK);
    ASSERT_EQ(tpd_plan_evaluate(&tied, &cl, &lay, &opt, &rt), TPD_OK);
    EXPECT_DOUBLE_EQ(ru.mem[3].params, rt.mem[3].params);
    EXPECT_NEAR(rt.time.dp_comm_total - ru.time.dp_comm_total, dt.emb_allreduce,
                1e-9 * rt.time.dp_comm_total);
}

// Stage balancing with a 128K vocabulary: the last stage (final norm, output layer, loss)
// takes fewer layers; the first (a lookup) does not need to.
TEST(PlanLlama, BalancingGivesTheOutputLayersStageFewerLayers) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("h200", &cl), TPD_OK);
    tpd_config c = llama(32, 4096, 32, 8, 14336);
    tpd_plan_layout lay = {1, 4, 8, 1, 1, TPD_RECOMPUTE_NONE, 0, 1};
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 32;
    tpd_plan_result bal, even;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &bal), TPD_OK);
    opt.balance_stages = 0;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &even), TPD_OK);
    ASSERT_TRUE(bal.fits) << bal.reject_reason;
    ASSERT_TRUE(bal.balanced);
    int sum = 0;
    for (int s = 0; s < 4; s++)
        sum += bal.stage_layers[s];
    EXPECT_EQ(sum, 32);
    EXPECT_LT(bal.stage_layers[3], bal.stage_layers[1]);
    EXPECT_GE(bal.stage_layers[0], bal.stage_layers[3]);
    EXPECT_LT(bal.step_time_s, even.step_time_s);
}

// The cpu backend's closed form covers the Llama block (held byte-equal to the allocation
// in tests/engine/model/test_model_grad.cc): the demo presets plan on the cpu cluster, and
// the Llama demo's parameter bytes are those of its parameter count.
TEST(PlanLlama, CpuMemoryOfTheLlamaBlockPlans) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("cpu", &cl), TPD_OK);
    tpd_config c = load_preset("demo-llama.yaml");
    tpd_plan_layout lay;
    tpd_plan_layout_from_config(&c, 1, &lay);
    tpd_plan_stage_mem m;
    ASSERT_EQ(tpd_plan_cpu_memory(&c, &lay, 0, &m), TPD_OK);
    // fp32 parameters: the count with the padded vocabulary in wte and the output layer
    double padded =
        tpd_plan_params_count(&c) +
        2.0 * (tpd_config_padded_vocab(&c, 1) - c.model.vocab_size) * c.model.hidden_size;
    EXPECT_EQ(m.params, 4.0 * padded);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 1;
    tpd_plan_result r;
    EXPECT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &r), TPD_OK);
    EXPECT_TRUE(r.fits) << r.reject_reason;
}

// The cpu backend's time model (calibrated rates) prices the Llama block's shapes: fewer
// K/V heads make the QKV GEMMs smaller, no biases drop their adds, and the same block with
// GPT-2's MLP width and no SwiGLU is cheaper.
TEST(PlanLlama, CpuTimeModelSeesTheBlock) {
    tpd_plan_cluster cl = plan_test::sample_cpu_profile();
    tpd_config c = load_preset("demo-llama.yaml");
    tpd_plan_layout lay;
    tpd_plan_layout_from_config(&c, 1, &lay);
    auto fwd_bwd = [&](const tpd_config &x) {
        double f, b, comm;
        tpd_plan_stage_time(&x, &cl, &lay, 0, &f, &b, &comm);
        EXPECT_GT(f, 0.0);
        EXPECT_GT(b, f);
        return f + b;
    };
    double gqa = fwd_bwd(c);
    tpd_config mha = c;
    mha.model.group_query_attention = 0;
    EXPECT_LT(gqa, fwd_bwd(mha));
    tpd_config biased = c;
    biased.model.add_bias_linear = 1;
    EXPECT_LT(gqa, fwd_bwd(biased));
    tpd_config gelu = c;
    gelu.model.swiglu = 0;
    EXPECT_GT(gqa, fwd_bwd(gelu));
}

// A layout the K/V groups cannot split is rejected with the reason.
TEST(PlanLlama, KvGroupsBoundTp) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("h200", &cl), TPD_OK);
    tpd_config c = llama(32, 4096, 32, 2, 14336);
    char why[192];
    tpd_plan_layout l = {4, 1, 8, 1, 1, TPD_RECOMPUTE_NONE, 0, 0};
    EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &l, 32, why, sizeof why));
    EXPECT_STREQ(why, "query groups 2 not divisible by TP 4 (K/V heads split whole, never "
                      "replicated)");
    l.tp = 2;
    l.dp = 16;
    EXPECT_TRUE(tpd_plan_layout_valid(&c, &cl, &l, 32, why, sizeof why)) << why;
}

} // namespace
