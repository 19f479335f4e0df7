// Shared helpers of the planner tests: GPT configs built in code and the SC21 Table 1 rows.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <unistd.h>

extern "C" {
#include "base/file.h"
#include "engine/cli/cli.h"
#include "engine/config/config.h"
#include "engine/plan/plan.h"
}

namespace plan_test {

// A file name private to this test process. CTest runs every discovered test as its own
// process, in parallel, from the same directory: a fixed name would be shared between them.
inline std::string scratch_path(const char *name) {
    return std::string("/tmp/tripod_plan_") + std::to_string(getpid()) + "_" + name;
}

// A GPT config of the SC21/Korthikanti family: V = 51200, s = 2048, bf16.
inline tpd_config gpt(int heads, int hidden, int layers, int gbs, int mbs) {
    tpd_config c;
    tpd_config_defaults(&c);
    c.model.num_attention_heads = heads;
    c.model.hidden_size = hidden;
    c.model.num_layers = layers;
    c.model.vocab_size = 51200;
    c.model.seq_length = 2048;
    c.model.make_vocab_size_divisible_by = 128;
    c.training.global_batch_size = gbs;
    c.training.micro_batch_size = mbs;
    c.training.precision = TPD_PRECISION_BF16;
    c.training.device = TPD_DEVICE_CUDA;
    c.training.recompute = TPD_RECOMPUTE_NONE;
    c.training.attention = TPD_ATTENTION_FUSED;
    c.parallel.num_pipeline_layers = 0;
    EXPECT_EQ(tpd_config_resolve(&c), TPD_OK); // ffn 4h, positions s
    return c;
}

// A Llama-block config built in code (bf16, cuda, flash attention, s = 8192).
inline tpd_config llama(int layers, int hidden, int heads, int groups, int ffn) {
    tpd_config c;
    tpd_config_defaults(&c);
    c.model.num_layers = layers;
    c.model.hidden_size = hidden;
    c.model.num_attention_heads = heads;
    c.model.group_query_attention = 1;
    c.model.num_query_groups = groups;
    c.model.ffn_hidden_size = ffn;
    c.model.swiglu = 1;
    c.model.normalization = TPD_NORM_RMSNORM;
    c.model.position_embedding_type = TPD_POS_ROPE;
    c.model.rotary_base = 500000;
    c.model.untie_embeddings_and_output_weights = 1;
    c.model.add_bias_linear = 0;
    c.model.vocab_size = 128256;
    c.model.seq_length = c.model.max_position_embeddings = 8192;
    c.model.make_vocab_size_divisible_by = 128;
    c.training.global_batch_size = 2048;
    c.training.micro_batch_size = 1;
    c.training.precision = TPD_PRECISION_BF16;
    c.training.device = TPD_DEVICE_CUDA;
    c.training.attention = TPD_ATTENTION_FUSED;
    return c;
}

// The A100 profile every published-run check uses.
inline tpd_plan_cluster a100() {
    tpd_plan_cluster c;
    EXPECT_EQ(tpd_plan_cluster_load("dgx-a100-80g", &c), TPD_OK);
    return c;
}

// A calibrated cpu profile with round numbers: 4 ranks measured on 2 cores.
inline tpd_plan_cluster sample_cpu_profile() {
    tpd_plan_cluster c;
    EXPECT_EQ(tpd_plan_cluster_load("cpu", &c), TPD_OK);
    std::snprintf(c.name, sizeof c.name, "unit-cpu");
    c.calibrated = 1;
    c.cpu_cores = 2;
    c.calibration_ranks = 4;
    c.gpus_per_node = 8;
    c.peak_flops = 20e9;
    c.gemm_curve_len = 2;
    c.gemm_curve_flops[0] = 1e5, c.gemm_curve_eff[0] = 0.5;
    c.gemm_curve_flops[1] = 1e7, c.gemm_curve_eff[1] = 0.8;
    c.attn_curve_len = 1;
    c.attn_curve_flops[0] = 1e6, c.attn_curve_eff[0] = 0.3;
    c.gemm_bwd_ratio = 2.1;
    c.attn_bwd_ratio = 1.4;
    c.ew_add = 0.25e-9, c.ew_layernorm_fwd = 2e-9, c.ew_layernorm_bwd = 3e-9;
    c.ew_gelu_fwd = 14e-9, c.ew_gelu_bwd = 17e-9, c.ew_xent_fwd = 6e-9, c.ew_xent_bwd = 5e-9;
    c.ew_adamw = 4e-9, c.ew_sumsq = 0.7e-9, c.ew_zero = 0.1e-9;
    c.p2p_bw = 4e9;
    c.p2p_latency = 5e-6;
    c.intra_bw = 1.2e9;
    c.intra_latency = 7e-6;
    return c;
}

// One layout's prediction: its stages split as given (no balancing), the DP reduction's
// overlap as asked.
inline tpd_plan_result evaluate(const tpd_config &c, const tpd_plan_cluster &cl,
                                const tpd_plan_layout &lay, int overlap, int gpus) {
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = gpus;
    opt.balance_stages = 0;
    opt.dp_overlap = overlap;
    tpd_plan_result r;
    EXPECT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &r), TPD_OK);
    EXPECT_GT(r.step_time_s, 0.0) << r.reject_reason;
    return r;
}

// The terms whose sum is the step (tpd_plan_time).
inline double step_sum(const tpd_plan_time &t) {
    return t.compute + t.pp_bubble + t.pp_p2p + t.dp_comm_exposed + t.optimizer +
           t.dp_gather_exposed + t.straggler + t.global_sync + t.step_host;
}

struct Sc21Row {
    double params_b;
    int heads, hidden, layers, tp, pp, dp, gpus, batch, mbs, v;
    double tflops;
};

// Narayanan et al. (SC21) Table 1.
inline const Sc21Row kSc21[10] = {
    {1.7, 24, 2304, 24, 1, 1, 32, 32, 512, 16, 1, 137},
    {3.6, 32, 3072, 30, 2, 1, 32, 64, 512, 16, 1, 138},
    {7.5, 32, 4096, 36, 4, 1, 32, 128, 512, 16, 1, 142},
    {18.4, 48, 6144, 40, 8, 1, 32, 256, 1024, 8, 1, 135},
    {39.1, 64, 8192, 48, 8, 2, 32, 512, 1536, 4, 1, 138},
    {76.1, 80, 10240, 60, 8, 4, 32, 1024, 1792, 2, 3, 140},
    {145.6, 96, 12288, 80, 8, 8, 24, 1536, 2304, 2, 2, 148},
    {310.1, 128, 16384, 96, 8, 16, 15, 1920, 2160, 1, 2, 155},
    {529.6, 128, 20480, 105, 8, 35, 9, 2520, 2520, 1, 3, 163},
    {1008.0, 160, 25600, 128, 8, 64, 6, 3072, 3072, 1, 1, 163},
};

inline tpd_plan_layout layout_of(const Sc21Row &r, tpd_recompute rc) {
    tpd_plan_layout l;
    std::memset(&l, 0, sizeof l);
    l.tp = r.tp;
    l.pp = r.pp;
    l.dp = r.dp;
    l.micro_batch_size = r.mbs;
    l.virtual_stages = r.v;
    l.recompute = rc;
    return l;
}

// A preset of configs/ under overrides, as `tripod plan CONFIG key=value ...` loads it.
inline tpd_config load(const char *name, std::vector<std::string> overrides) {
    std::string path = std::string(tpd_source_dir()) + "/configs/" + name;
    std::vector<const char *> ov;
    for (const std::string &o : overrides)
        ov.push_back(o.c_str());
    tpd_config c;
    EXPECT_EQ(tpd_config_load(path.c_str(), (int)ov.size(), ov.data(), &c), TPD_OK)
        << tpd_last_error();
    return c;
}

inline tpd_plan_cluster cluster(const char *name) {
    tpd_plan_cluster cl;
    EXPECT_EQ(tpd_plan_cluster_load(name, &cl), TPD_OK);
    return cl;
}

// `tripod plan ARGS...` in process; its stdout in *out, its exit code returned.
inline int run(std::vector<std::string> args, std::string *out) {
    std::vector<char *> argv;
    for (auto &a : args)
        argv.push_back(a.data());
    testing::internal::CaptureStdout();
    int rc = tpd_cli_plan((int)argv.size(), argv.data());
    *out = testing::internal::GetCapturedStdout();
    return rc;
}

} // namespace plan_test
