// The rehearsal config of `tripod verify` (tpd_verify_shrink): on every preset and on the
// layouts the planner and the README use, it keeps every structural choice (TP, PP, the
// stated DP, virtual stages, schedule, SP, ZeRO-1, recompute, overlap, the stage split as
// `train` cuts it, the layer count, heads and K/V groups, the model family's options),
// shrinks the widths, obeys every rule the loader checks (it loads back from its own
// YAML), keeps vocabulary padding when the real model has it, and gives as many DP buckets
// per stage as the real model.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "base/file.h"
#include "engine/plan/plan.h"
#include "engine/verify/verify.h"
}

namespace {

tpd_config load(const std::string &name, const std::vector<std::string> &ov) {
    std::vector<const char *> o;
    for (const auto &s : ov)
        o.push_back(s.c_str());
    tpd_config c;
    std::string path = std::string(tpd_source_dir()) + "/configs/" + name;
    EXPECT_EQ(tpd_config_load(path.c_str(), (int)o.size(), o.data(), &c), TPD_OK)
        << tpd_last_error();
    return c;
}

struct Case {
    const char *config;
    std::vector<std::string> overrides;
    int dp;
};

// Every stage's and chunk's layers as `train` cuts them (tpd_config_stage_layers).
std::vector<int> split(const tpd_config &c) {
    std::vector<int> v;
    const int pp = c.parallel.pipeline_model_parallel_size;
    const int vpp = c.parallel.virtual_pipeline_model_parallel_size;
    for (int s = 0; s < pp; s++)
        for (int k = 0; k < vpp; k++) {
            int first = -1;
            v.push_back(tpd_config_stage_layers(&c, pp, vpp, s, k, &first));
            v.push_back(first);
        }
    return v;
}

double buckets(const tpd_config &c) {
    double per_rank = tpd_plan_params_count(&c) / (c.parallel.tensor_model_parallel_size *
                                                   c.parallel.pipeline_model_parallel_size);
    return per_rank / (double)c.parallel.ddp_bucket_size;
}

void check(const Case &k) {
    SCOPED_TRACE(std::string(k.config) + " DP " + std::to_string(k.dp));
    tpd_config r = load(k.config, k.overrides), c;
    char err[1024] = {0};
    ASSERT_EQ(tpd_verify_shrink(&r, k.dp, 3, &c, err, sizeof err), TPD_OK) << err;
    const tpd_config_parallel &a = r.parallel, &b = c.parallel;
    // the structure
    EXPECT_EQ(b.tensor_model_parallel_size, a.tensor_model_parallel_size);
    EXPECT_EQ(b.pipeline_model_parallel_size, a.pipeline_model_parallel_size);
    EXPECT_EQ(b.data_parallel_size, k.dp);
    EXPECT_EQ(b.virtual_pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size);
    EXPECT_EQ(tpd_config_schedule(&c), tpd_config_schedule(&r));
    EXPECT_EQ(b.sequence_parallel, a.sequence_parallel);
    EXPECT_EQ(b.use_distributed_optimizer, a.use_distributed_optimizer);
    EXPECT_EQ(b.overlap_grad_reduce, a.overlap_grad_reduce);
    EXPECT_EQ(b.overlap_param_gather, a.overlap_param_gather);
    EXPECT_EQ(c.training.recompute, r.training.recompute);
    EXPECT_EQ(c.training.recompute_num_layers, r.training.recompute_num_layers);
    EXPECT_EQ(c.training.micro_batch_size, r.training.micro_batch_size);
    EXPECT_EQ(split(c), split(r)) << "the stage split differs from train's";
    const tpd_config_model &m = c.model, &n = r.model;
    EXPECT_EQ(m.num_layers, n.num_layers);
    EXPECT_EQ(m.num_attention_heads, n.num_attention_heads);
    EXPECT_EQ(tpd_config_kv_heads(&c), tpd_config_kv_heads(&r));
    EXPECT_EQ(m.group_query_attention, n.group_query_attention);
    EXPECT_EQ(m.untie_embeddings_and_output_weights, n.untie_embeddings_and_output_weights);
    EXPECT_EQ(m.add_bias_linear, n.add_bias_linear);
    EXPECT_EQ(m.normalization, n.normalization);
    EXPECT_EQ(m.position_embedding_type, n.position_embedding_type);
    EXPECT_EQ(m.swiglu, n.swiglu);
    EXPECT_EQ(m.make_vocab_size_divisible_by, n.make_vocab_size_divisible_by);
    // the widths shrink, by the rules
    int tp = b.tensor_model_parallel_size, pp = b.pipeline_model_parallel_size;
    EXPECT_LE(m.hidden_size, n.hidden_size);
    EXPECT_LE(m.ffn_hidden_size, n.ffn_hidden_size);
    EXPECT_LE(m.vocab_size, n.vocab_size);
    EXPECT_LE(m.seq_length, n.seq_length);
    EXPECT_LE(tpd_plan_params_count(&c), 100e6) << "too large to rehearse on one machine";
    EXPECT_EQ(m.hidden_size % m.num_attention_heads, 0);
    EXPECT_EQ(m.ffn_hidden_size % tp, 0);
    if (b.sequence_parallel) EXPECT_EQ(m.seq_length % tp, 0);
    if (m.position_embedding_type == TPD_POS_ROPE)
        EXPECT_EQ(m.hidden_size / m.num_attention_heads % 2, 0);
    int unit = m.make_vocab_size_divisible_by * tp;
    EXPECT_EQ(m.vocab_size % unit != 0, n.vocab_size % unit != 0) << "padding kept or absent";
    int M = tpd_config_num_micro_batches(&c, k.dp);
    EXPECT_GE(M, pp);
    EXPECT_EQ(tpd_config_check_world(&c, tp * pp * k.dp), TPD_OK) << tpd_last_error();
    // as many DP buckets per stage (within one) as the real model
    double rb = buckets(r), sb = buckets(c);
    if (rb >= 1) EXPECT_NEAR(sb, rb, 1.0 + 0.01 * rb);
    // every rule the loader checks: the config loads back from its own YAML
    std::string path = tiny::temp_prefix("shrunk.yaml");
    snprintf(c.data.data_path, sizeof c.data.data_path, "/tmp/none");
    FILE *f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    tpd_config_print(&c, f);
    fclose(f);
    tpd_config back;
    EXPECT_EQ(tpd_config_load(path.c_str(), 0, nullptr, &back), TPD_OK) << tpd_last_error();
    EXPECT_EQ(tpd_config_check_trainable(&back), TPD_OK) << tpd_last_error();
    EXPECT_EQ(back.model.hidden_size, m.hidden_size);
}

TEST(VerifyShrink, KeepsTheStructureOfEveryPreset) {
    const std::string tp = "parallel.tensor_model_parallel_size=";
    const std::string pp = "parallel.pipeline_model_parallel_size=";
    const std::string v = "parallel.virtual_pipeline_model_parallel_size=";
    const Case cases[] = {
        {"gpt3-175b.yaml", {tp + "2", pp + "8", v + "6"}, 1},
        {"gpt3-175b.yaml", {}, 2},
        {"llama3-70b.yaml", {tp + "8", pp + "2"}, 1},
        {"llama3-405b.yaml", {}, 1},
        {"llama3-8b.yaml", {}, 2},
        {"gpt-1t.yaml", {}, 1},
        {"gpt2-124m.yaml", {tp + "4", pp + "3"}, 2}, // 12 layers, heads 12
        {"demo.yaml", {pp + "3", "model.num_layers=5", "parallel.pipeline_layers=[2,1,2]"}, 2},
        {"demo.yaml",
         {tp + "2", pp + "2", v + "2", "model.num_layers=6", "parallel.pipeline_layers=[1,2,2,1]",
          "training.recompute=full", "training.recompute_num_layers=1",
          "parallel.sequence_parallel=true", "parallel.use_distributed_optimizer=true"},
         2},
        {"demo-llama.yaml", {tp + "2", pp + "4", "parallel.pipeline_schedule=zb-h1"}, 1},
    };
    for (const Case &k : cases)
        check(k);
}

TEST(VerifyShrink, RefusesWhatCannotBeShrunk) {
    tpd_config r = load("demo.yaml", {}), c;
    char err[256] = {0};
    EXPECT_EQ(tpd_verify_shrink(&r, 0, 3, &c, err, sizeof err), TPD_ERR_INVALID);
    EXPECT_NE(std::string(err).find("DP 0"), std::string::npos) << err;
}

// A layout whose ranks cannot all live in this machine's memory is refused with the figure.
TEST(VerifyShrink, RefusesALayoutTooLargeForTheMachine) {
    tpd_config r = load("demo.yaml", {}), c;
    char err[1024] = {0};
    ASSERT_EQ(tpd_verify_shrink(&r, 1000000, 3, &c, err, sizeof err), TPD_OK) << err;
    EXPECT_EQ(tpd_verify_check_machine(&c, 1000000, 1, err, sizeof err), TPD_ERR_INVALID);
    EXPECT_NE(std::string(err).find("needs 1000000 ranks"), std::string::npos) << err;
    EXPECT_NE(std::string(err).find("GiB available: pass --ranks N"), std::string::npos) << err;
    ASSERT_EQ(tpd_verify_shrink(&r, 1, 3, &c, err, sizeof err), TPD_OK) << err;
    EXPECT_EQ(tpd_verify_check_machine(&c, 1, 1, err, sizeof err), TPD_OK) << err;
    EXPECT_EQ(tpd_verify_check_machine(&c, 2, 1, err, sizeof err), TPD_ERR_INVALID);
    EXPECT_NE(std::string(err).find("launch it with mpirun -np 2"), std::string::npos) << err;
}

} // namespace
