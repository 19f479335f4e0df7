// Shared by the decoding tests (cpu and gpu): a tiny model of each block on one backend,
// with non-trivial parameters, and its logits from the full forward and from the
// key/value-cache decode, position by position.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "engine/model/model.h"
#include "engine/model/model_decode.h"
#include "kernels/kernels.h"
}

namespace dec {

using Rows = std::vector<std::vector<float>>; // (T, Vp) logits

// "gpt2": learned positions, LayerNorm, GELU, biases, tied head. "llama": RMSNorm, RoPE,
// SwiGLU, 4 query heads on 2 K/V heads, untied head, no biases. "llama31": the same with
// Llama 3.1's RoPE frequency scaling. Vocab 37 padded to 40; seq_length 12 below
// max_position_embeddings 16, so wpe rows past T exist and must not be read.
inline tpd_config config(const std::string &block) {
    tpd_config cfg = tiny::config("");
    cfg.model.num_layers = 2;
    cfg.model.hidden_size = 32;
    cfg.model.num_attention_heads = 4;
    cfg.model.ffn_hidden_size = 40;
    cfg.model.vocab_size = 37;
    cfg.model.make_vocab_size_divisible_by = 8;
    cfg.model.seq_length = 12;
    cfg.model.max_position_embeddings = 16;
    cfg.model.init_method_std = 0.3; // attention far from uniform: history matters
    cfg.training.micro_batch_size = 1;
    cfg.training.global_batch_size = 1;
    if (block != "gpt2") {
        tiny::llama(cfg);
        cfg.model.ffn_hidden_size = 24;
        cfg.model.num_query_groups = 2;
    }
    if (block == "llama31") {
        cfg.model.rope_scaling = 1;
        cfg.model.rope_scaling_factor = 8;
        cfg.model.rope_scaling_low_freq_factor = 1;
        cfg.model.rope_scaling_high_freq_factor = 4;
        cfg.model.rope_scaling_original_max_position_embeddings = 4;
    }
    return cfg;
}

// A whole model (TP = PP = DP = 1) on kb, its parameters from the counter-based init plus a
// smooth perturbation, so that norms' weights and biases are not 1 and 0. build() reports a
// failure through gtest (check HasFatalFailure()).
struct Model {
    tpd_model *m = nullptr;
    tpd_dp_plan dpp{};
    bool have_dpp = false;
    Model() = default;
    void build(const tpd_config &cfg, tpd_kern_backend *kb) {
        ASSERT_EQ(tpd_model_create(&cfg, kb, nullptr, 1, 0, 1, 1, 0, &m), TPD_OK);
        ASSERT_EQ(tpd_dp_plan_init(m->plan.lay.numel, 1 << 20, 1, 0, 0, &dpp), TPD_OK);
        have_dpp = true;
        ASSERT_EQ(tpd_model_init_params(m, &dpp), TPD_OK);
        size_t n = m->plan.numel_padded;
        std::vector<float> host(n);
        ASSERT_EQ(tpd_model_params_f32(m, host.data()), TPD_OK);
        for (size_t i = 0; i < m->plan.lay.numel; i++)
            host[i] += 0.05f * (float)std::sin(0.7 * i);
        void *f32 = nullptr;
        ASSERT_EQ(tpd_kern_alloc(kb, n * 4, &f32), TPD_OK);
        ASSERT_EQ(tpd_kern_copy_to_device(kb, f32, host.data(), n * 4), TPD_OK);
        ASSERT_EQ(tpd_kern_cast(kb, m->params, tpd_kern_param_dtype(kb), f32, TPD_DTYPE_F32, n),
                  TPD_OK);
        ASSERT_EQ(tpd_kern_synchronize(kb), TPD_OK);
        tpd_kern_free(kb, f32);
    }
    ~Model() {
        if (have_dpp) tpd_dp_plan_free(&dpp);
        tpd_model_destroy(m);
    }
    Model(const Model &) = delete;
    Model &operator=(const Model &) = delete;
};

// Tokens in [0, 37) in which token 5 repeats at positions 2 and 8 (and 1 at 0 and 10).
inline std::vector<int32_t> tokens(int T, int salt = 0) {
    std::vector<int32_t> t(T);
    for (int i = 0; i < T; i++)
        t[i] = (i * 11 + 7 + salt * 13) % 37;
    t[2] = t[8] = 5;
    t[0] = t[10 % T] = 1;
    return t;
}

// The full forward's logits at every position of toks (T of them).
inline Rows full_logits(tpd_model *m, const std::vector<int32_t> &toks) {
    int T = m->d.T, Vl = m->d.Vl;
    std::vector<int32_t> batch(toks);
    batch.push_back(0); // the targets' last entry: unused here
    const tpd_model_mb at = {0, 0, 0};
    Rows r(T, std::vector<float>(Vl));
    EXPECT_EQ(tpd_model_set_batch(m, &at, batch.data()), TPD_OK);
    EXPECT_EQ(tpd_model_forward(m, &at), TPD_OK);
    for (int t = 0; t < T; t++)
        EXPECT_EQ(tpd_model_logits_f32(m, &at, t, r[t].data()), TPD_OK);
    return r;
}

// Decodes toks[from..] at positions from.. (the cache holds positions < from already) and
// returns the logits of each, rows from.. of the result (earlier rows empty).
inline Rows decode_logits(tpd_model_decode *d, const std::vector<int32_t> &toks, int from, int Vl) {
    Rows r(toks.size());
    for (int t = from; t < (int)toks.size(); t++) {
        r[t].resize(Vl);
        EXPECT_EQ(tpd_model_decode_step(d, t, toks[t], r[t].data()), TPD_OK) << "position " << t;
        EXPECT_EQ(tpd_model_decode_len(d), t + 1);
    }
    return r;
}

// max over v of |a - b| / (floor + |b|)
inline double worst_rel(const std::vector<float> &a, const std::vector<float> &b, double floor) {
    double w = 0;
    for (size_t v = 0; v < b.size(); v++)
        w = std::max(w, std::fabs((double)a[v] - b[v]) / (floor + std::fabs((double)b[v])));
    return w;
}

inline double rms_of(const Rows &r) {
    double ss = 0;
    size_t n = 0;
    for (const auto &row : r)
        for (float x : row) {
            ss += (double)x * x;
            n++;
        }
    return n ? std::sqrt(ss / n) : 0.0;
}

} // namespace dec
