// Sizes: every integer key has an upper bound, the products formed from the keys stay in
// their types (the padded vocabulary, tokens per micro-batch), values past the bounds are
// config errors naming the key and the bound, and files that are no config (a directory,
// megabytes of YAML) are refused before parsing, as is nesting past 16 levels.
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/config/config_internal.h"

namespace {

struct Loaded {
    tpd_status st;
    std::string err;
    tpd_config cfg;
};

Loaded load(const char *path, const std::vector<std::string> &ov) {
    std::vector<const char *> argv;
    for (const auto &o : ov)
        argv.push_back(o.c_str());
    Loaded r;
    tpd_last_error_clear();
    r.st = tpd_config_load(path, (int)argv.size(), argv.data(), &r.cfg);
    r.err = tpd_last_error();
    return r;
}

TEST(ConfigLimits, EveryIntegerKeyHasAnUpperBoundThatFitsItsType) {
    for (int i = 0; i < tpd_cfg_nkeys; i++) {
        const tpd_cfg_key &k = tpd_cfg_keys[i];
        if (k.type != TPD_CFG_INT && k.type != TPD_CFG_INT64 && k.type != TPD_CFG_INTLIST) continue;
        EXPECT_EQ(k.range, TPD_CFG_CLOSED) << k.name << " has no upper bound";
        if (k.type != TPD_CFG_INT64) EXPECT_LE(k.hi, (double)INT_MAX) << k.name;
        EXPECT_LE(k.lo, k.hi) << k.name;
    }
}

TEST(ConfigLimits, ValuesPastTheBoundsNameTheKeyAndTheBound) {
    const struct {
        const char *override_;
        const char *message;
    } cases[] = {
        // a padded vocabulary that wrapped to 4 in 32 bits trained a wrong model
        {"model.make_vocab_size_divisible_by=1073741825",
         "model.make_vocab_size_divisible_by: 1073741825 is out of range (expected an integer "
         "in [1, 65536])"},
        {"model.vocab_size=2147483647",
         "model.vocab_size: 2147483647 is out of range (expected an integer in [1, 16777216])"},
        {"training.global_batch_size=1073741824",
         "training.global_batch_size: 1073741824 is out of range (expected an integer in [1, "
         "1048576])"},
        {"training.num_threads=100000",
         "training.num_threads: 100000 is out of range (expected an integer in [0, 4096])"},
        {"parallel.tensor_model_parallel_size=5000",
         "parallel.tensor_model_parallel_size: 5000 is out of range (expected an integer in [1, "
         "4096])"},
        {"training.max_skipped_iterations=-1",
         "training.max_skipped_iterations: -1 is out of range (expected an integer in [0, "
         "1000000000])"},
    };
    for (const auto &c : cases) {
        Loaded r = load(nullptr, {c.override_});
        EXPECT_EQ(r.st, TPD_ERR_INVALID) << c.override_;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    }
}

TEST(ConfigLimits, TokensPerMicroBatchAreBounded) {
    Loaded r = load(nullptr, {"training.micro_batch_size=65536", "training.global_batch_size=65536",
                              "model.seq_length=65536", "model.max_position_embeddings=65536"});
    EXPECT_EQ(r.st, TPD_ERR_INVALID);
    EXPECT_NE(r.err.find("training.micro_batch_size: micro_batch_size * seq_length (65536 * "
                         "65536) must be at most 67108864"),
              std::string::npos)
        << r.err;
}

TEST(ConfigLimits, PaddedVocabFitsAtTheBoundsAndNeverWraps) {
    tpd_config c;
    tpd_config_defaults(&c);
    c.model.vocab_size = 16777216;
    c.model.make_vocab_size_divisible_by = 65536;
    int vp = tpd_config_padded_vocab(&c, 4096); // the largest TP a config allows
    EXPECT_GE(vp, c.model.vocab_size);
    EXPECT_EQ(vp % (65536 * 4096), 0);
    // past the bounds (a config built by hand): refused with -1, never a wrapped value
    c.model.vocab_size = 257;
    c.model.make_vocab_size_divisible_by = 1073741825;
    EXPECT_EQ(tpd_config_padded_vocab(&c, 4), -1);
    c.model.make_vocab_size_divisible_by = 128;
    c.model.vocab_size = INT_MAX;
    EXPECT_EQ(tpd_config_padded_vocab(&c, 1), -1);
}

TEST(ConfigLimits, NewKeysHaveTheirDefaults) {
    Loaded r = load(nullptr, {});
    ASSERT_EQ(r.st, TPD_OK) << r.err;
    EXPECT_EQ(r.cfg.training.max_skipped_iterations, 10);
    EXPECT_EQ(r.cfg.checkpoint.overwrite, 0);
}

// Megatron's accumulate_allreduce_grads_in_fp32: on by default, so bf16 keeps fp32 main
// gradients (4 bytes); false keeps bf16 ones (2 bytes); fp32 precision has 4 bytes either
// way (the key is a no-op there, not an error). Only true/false are booleans.
TEST(ConfigLimits, Fp32MainGradientsAreTheDefaultUnderBf16) {
    const char *key = "training.accumulate_allreduce_grads_in_fp32";
    Loaded d = load(nullptr, {});
    ASSERT_EQ(d.st, TPD_OK) << d.err;
    EXPECT_EQ(d.cfg.training.accumulate_allreduce_grads_in_fp32, 1);
    EXPECT_EQ(tpd_config_grad_bytes(&d.cfg), 4); // fp32 precision
    const struct {
        const char *precision, *value;
        int on, bytes;
    } cases[] = {{"bf16", nullptr, 1, 4},
                 {"bf16", "true", 1, 4},
                 {"bf16", "false", 0, 2},
                 {"fp32", "false", 0, 4},
                 {"fp32", "true", 1, 4}};
    for (const auto &c : cases) {
        std::vector<std::string> ov = {std::string("training.precision=") + c.precision};
        if (c.value) ov.push_back(std::string(key) + "=" + c.value);
        Loaded r = load(nullptr, ov);
        ASSERT_EQ(r.st, TPD_OK) << r.err;
        std::string what = std::string(c.precision) + " " + (c.value ? c.value : "(default)");
        EXPECT_EQ(r.cfg.training.accumulate_allreduce_grads_in_fp32, c.on) << what;
        EXPECT_EQ(tpd_config_grad_bytes(&r.cfg), c.bytes) << what;
    }
    Loaded bad = load(nullptr, {std::string(key) + "=yes"});
    EXPECT_EQ(bad.st, TPD_ERR_INVALID);
    EXPECT_NE(bad.err.find(std::string(key) + ": 'yes' is not a boolean (expected true or false)"),
              std::string::npos)
        << bad.err;
}

TEST(ConfigLimits, ADirectoryOrMegabytesOfYamlAreRefusedBeforeParsing) {
    Loaded d = load("/tmp", {});
    EXPECT_EQ(d.st, TPD_ERR_INVALID);
    EXPECT_EQ(d.err, "/tmp: is a directory, not a YAML file");
    std::string path = testing::TempDir() + "tripod_huge_config.yaml";
    FILE *f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs("parallel:\n  pipeline_layers: [", f);
    for (int i = 0; i < 400000; i++)
        fputs("1, ", f);
    fputs("1]\n", f);
    fclose(f);
    Loaded h = load(path.c_str(), {});
    EXPECT_EQ(h.st, TPD_ERR_INVALID);
    EXPECT_NE(h.err.find("more than the 1048576 a YAML file here may hold"), std::string::npos)
        << h.err;
    remove(path.c_str());
}

std::string write_file(const char *name, const std::string &text) {
    std::string path = testing::TempDir() + name;
    FILE *f = fopen(path.c_str(), "w");
    if (f) {
        fwrite(text.data(), 1, text.size(), f);
        fclose(f);
    }
    return path;
}

// libyaml's scanner costs O(depth) a token: a megabyte of '[' took minutes to refuse.
TEST(ConfigLimits, DeepNestingIsRefusedAtOnceWithItsPlace) {
    std::string path = write_file("tripod_deep_config.yaml", std::string(1u << 20, '['));
    auto t0 = std::chrono::steady_clock::now();
    Loaded r = load(path.c_str(), {});
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 0.5);
    EXPECT_EQ(r.st, TPD_ERR_INVALID);
    EXPECT_NE(r.err.find(path + ":1:17: YAML nested deeper than 16 lists or mappings"),
              std::string::npos)
        << r.err;
    // block mappings count the same, at the line of the 17th
    std::string block;
    for (int i = 0; i < 40; i++)
        block += std::string(2 * i, ' ') + "k" + std::to_string(i) + ":\n";
    path = write_file("tripod_deep_block.yaml", block);
    r = load(path.c_str(), {});
    EXPECT_NE(r.err.find(path + ":17:33: YAML nested deeper than 16"), std::string::npos) << r.err;
    // 16 levels are no nesting error (whatever else is wrong with them)
    path = write_file("tripod_deep16.yaml", std::string(16, '[') + std::string(16, ']'));
    r = load(path.c_str(), {});
    EXPECT_NE(r.st, TPD_OK);
    EXPECT_EQ(r.err.find("nested deeper"), std::string::npos) << r.err;
    remove(path.c_str());
}

} // namespace
