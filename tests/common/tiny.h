// Shared by the engine and parallel tests: a tiny GPT config and a small learnable corpus
// written as a Megatron indexed data set.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

extern "C" {
#include "engine/config/config.h"
#include "engine/data/data.h"
}

namespace tiny {

// Sets an enum key of a config by the name a config file would use, e.g.
// tiny::set(cfg.training.recompute, "training.recompute", "full").
template <class E> void set(E &field, const char *key, const char *name) {
    int v = tpd_config_choice_value(key, name);
    if (v < 0) throw std::invalid_argument(std::string(key) + " has no choice '" + name + "'");
    field = static_cast<E>(v);
}

// Byte-level text with plenty of structure, cut into documents.
inline std::string corpus_text() {
    static const char *lines[] = {
        "the quick brown fox jumps over the lazy dog. ",
        "a stitch in time saves nine. ",
        "all that glitters is not gold. ",
        "to be or not to be, that is the question. ",
        "early to bed and early to rise makes a man healthy, wealthy and wise. ",
    };
    std::string s;
    for (int i = 0; i < 400; i++)
        s += lines[(i * 7 + i / 5) % 5];
    return s;
}

// Writes PREFIX.bin/.idx once per path; returns the prefix.
inline std::string write_corpus(const std::string &prefix) {
    std::string text = corpus_text();
    std::vector<int32_t> toks;
    std::vector<uint64_t> offs{0};
    for (size_t i = 0; i < text.size(); i++) {
        toks.push_back((unsigned char)text[i]);
        if ((i + 1) % 997 == 0 || i + 1 == text.size()) {
            toks.push_back(TPD_BYTE_EOD);
            offs.push_back(toks.size());
        }
    }
    tpd_indexed_write(prefix.c_str(), toks.data(), offs.data(), offs.size() - 1, TPD_BYTE_VOCAB);
    return prefix;
}

// A model small enough for finite differences and for 8 ranks on 2 cores, divisible by
// TP in {1,2,4} (heads 4) and PP in {1,2,4} (layers 4).
inline tpd_config config(const std::string &data_prefix) {
    tpd_config c;
    tpd_config_defaults(&c);
    c.model.num_layers = 4;
    c.model.hidden_size = 32;
    c.model.num_attention_heads = 4;
    c.model.ffn_hidden_size = 128;
    c.model.vocab_size = TPD_BYTE_VOCAB;
    c.model.seq_length = 16;
    c.model.max_position_embeddings = 16;
    c.model.make_vocab_size_divisible_by = 8;
    c.model.init_method_std = 0.02;
    c.training.micro_batch_size = 1;
    c.training.global_batch_size = 16;
    c.training.train_iters = 10;
    c.training.seed = 1234;
    c.training.num_threads = 1;
    c.optimizer.lr = 1e-3;
    c.optimizer.min_lr = 1e-4;
    c.optimizer.lr_warmup_iters = 2;
    c.optimizer.weight_decay = 0.1;
    c.optimizer.clip_grad = 1.0;
    c.parallel.data_parallel_size = 0;
    c.parallel.ddp_bucket_size = 5000;
    c.logging.eval_interval = 0;
    c.logging.metrics_file[0] = 0;
    snprintf(c.data.data_path, sizeof c.data.data_path, "%s", data_prefix.c_str());
    return c;
}

// The Llama block on the same tiny shape: RMSNorm, rotary positions, SwiGLU (ffn 96),
// grouped-query attention with 2 K/V heads of 4 (so TP up to 2 splits whole groups), an
// untied output layer, no linear biases.
inline void llama(tpd_config &c) {
    c.model.normalization = TPD_NORM_RMSNORM;
    c.model.position_embedding_type = TPD_POS_ROPE;
    c.model.swiglu = 1;
    c.model.ffn_hidden_size = 96;
    c.model.group_query_attention = 1;
    c.model.num_query_groups = 2;
    c.model.untie_embeddings_and_output_weights = 1;
    c.model.add_bias_linear = 0;
}

// A two-layer model of width 8 with top-2 of 4 experts, a gated shared expert and both
// router losses (the Llama block: 4 heads in 2 K/V groups, HF's renormalized
// softmax-then-top-k), small enough for finite differences.
inline tpd_config moe_small(bool llama) {
    tpd_config cfg = config("");
    cfg.model.num_layers = 2;
    cfg.model.hidden_size = 8;
    cfg.model.num_attention_heads = 2;
    cfg.model.ffn_hidden_size = 6;
    cfg.model.vocab_size = 11;
    cfg.model.make_vocab_size_divisible_by = 8;
    cfg.model.seq_length = 5;
    cfg.model.max_position_embeddings = 6;
    cfg.model.init_method_std = 0.3;
    cfg.training.micro_batch_size = 2;
    cfg.training.global_batch_size = 2;
    if (llama) {
        tiny::llama(cfg);
        cfg.model.num_attention_heads = 4;
        cfg.model.num_query_groups = 2;
        cfg.model.ffn_hidden_size = 6;
        cfg.model.max_position_embeddings = 5;
        cfg.model.moe_router_pre_softmax = 1;
        cfg.model.moe_norm_topk_prob = 1;
    }
    cfg.model.num_moe_experts = 4;
    cfg.model.moe_router_topk = 2;
    cfg.model.moe_ffn_hidden_size = 6;
    cfg.model.moe_shared_expert_intermediate_size = 4;
    cfg.model.moe_shared_expert_gate = 1;
    cfg.model.moe_aux_loss_coeff = 0.1;
    cfg.model.moe_z_loss_coeff = 0.05;
    return cfg;
}

inline void remove_corpus(const std::string &prefix) {
    unlink((prefix + ".bin").c_str());
    unlink((prefix + ".idx").c_str());
}

// Scratch files of one test process live in /tmp/tripod_test_<pid>/, removed when the
// process exits (kept when TRIPOD_KEEP_TEST_FILES is set, to look at after a failure).
struct TempRoot {
    std::string dir;
    pid_t owner = 0;
    ~TempRoot() {
        if (!dir.empty() && owner == getpid() && !getenv("TRIPOD_KEEP_TEST_FILES")) {
            std::error_code ec;
            std::filesystem::remove_all(dir, ec);
        }
    }
};

// A whole file's bytes ("" when it cannot be read).
inline std::string slurp(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

inline std::string temp_prefix(const char *name) {
    static TempRoot root;
    if (root.dir.empty()) {
        root.owner = getpid();
        root.dir = "/tmp/tripod_test_" + std::to_string(root.owner);
        std::filesystem::create_directories(root.dir);
    }
    return root.dir + "/" + name;
}

} // namespace tiny
