// Shared helpers of the planner tests: GPT configs built in code and the SC21 Table 1 rows.
#pragma once

#include <cstring>
#include <string>

#include <unistd.h>

extern "C" {
#include "engine/config.h"
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
    c.model.ffn_hidden_size = 4 * hidden;
    c.model.vocab_size = 51200;
    c.model.seq_length = 2048;
    c.model.max_position_embeddings = 2048;
    c.model.make_vocab_size_divisible_by = 128;
    c.training.global_batch_size = gbs;
    c.training.micro_batch_size = mbs;
    std::strcpy(c.training.precision, "bf16");
    std::strcpy(c.training.device, "cuda");
    std::strcpy(c.training.recompute, "none");
    std::strcpy(c.training.attention, "fused");
    c.parallel.num_pipeline_layers = 0;
    return c;
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

inline tpd_plan_layout layout_of(const Sc21Row &r, tpd_plan_recompute rc) {
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

} // namespace plan_test
