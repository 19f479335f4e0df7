// Blended data sets (data.data_path "W1 PREFIX1 W2 PREFIX2 ..."): the assignment of samples
// to data sets is Megatron's build_blending_indices, checked against a plain re-implementation
// here; random access agrees with sequential access; one prefix samples exactly as an
// unblended sampler; bad specs name the key and the rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "engine/data/data.h"
}

namespace {

// tokens base, base+1, ..., base+n-1 in one document
std::string write_iota(const std::string &name, int n, int base) {
    std::string prefix = tiny::temp_prefix(name.c_str());
    std::vector<int32_t> toks(n);
    for (int i = 0; i < n; i++)
        toks[i] = base + i;
    std::vector<uint64_t> offs = {0, (uint64_t)n};
    EXPECT_EQ(tpd_indexed_write(prefix.c_str(), toks.data(), offs.data(), 1, 100000), TPD_OK);
    return prefix;
}

// Megatron's helper: sample i goes to argmax_d w_d * max(i, 1) - count_d (first on ties).
std::vector<int> reference(const std::vector<double> &w, int n) {
    std::vector<double> count(w.size(), 0.0);
    std::vector<int> out;
    for (int i = 0; i < n; i++) {
        double x = std::max((double)i, 1.0), best = -1e300;
        int d = 0;
        for (size_t k = 0; k < w.size(); k++) {
            double e = w[k] * x - count[k];
            if (e > best) best = e, d = (int)k;
        }
        count[d] += 1;
        out.push_back(d);
    }
    return out;
}

TEST(DataBlend, AssignsLikeMegatronInAnyOrder) {
    std::string a = write_iota("blend_a", 3000, 0), b = write_iota("blend_b", 3000, 10000),
                c = write_iota("blend_c", 3000, 20000);
    tpd_data_source src;
    // weights need not sum to 1
    std::string spec = "2 " + a + " 5 " + b + " 3 " + c;
    ASSERT_EQ(tpd_data_source_open(spec.c_str(), 100000, &src), TPD_OK) << tpd_last_error();
    ASSERT_EQ(src.n, 3);
    EXPECT_DOUBLE_EQ(src.weight[1], 0.5);
    tpd_blend_sampler s;
    ASSERT_EQ(tpd_blend_sampler_init(&src, "1,0,0", TPD_SPLIT_TRAIN, 8, 1, 77, &s), TPD_OK);
    const int N = 20000; // several snapshot blocks
    std::vector<int> want = reference({0.2, 0.5, 0.3}, N);
    std::vector<int> seen(3, 0);
    std::vector<uint64_t> index(N);
    for (int g = 0; g < N; g++) {
        int d;
        tpd_blend_sampler_locate(&s, g, &d, &index[g]);
        ASSERT_EQ(d, want[g]) << "sample " << g;
        EXPECT_EQ(index[g], (uint64_t)seen[d]) << "the k-th sample of a data set is its sample k";
        seen[d]++;
    }
    for (int d = 0; d < 3; d++)
        EXPECT_NEAR(seen[d], src.weight[d] * N, 1.0);
    // random access, backwards and far jumps included
    std::vector<int> order(N);
    for (int i = 0; i < N; i++)
        order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(5));
    for (int k = 0; k < 3000; k++) {
        int g = order[k], d;
        uint64_t idx;
        tpd_blend_sampler_locate(&s, g, &d, &idx);
        ASSERT_EQ(d, want[g]) << g;
        ASSERT_EQ(idx, index[g]) << g;
    }
    // the tokens come from that data set's own (shuffled) sampler
    std::vector<int32_t> got(9), direct(9);
    for (int g : {0, 1, 2, 4095, 4096, 12345}) {
        ASSERT_EQ(tpd_blend_sampler_get(&s, g, got.data()), TPD_OK);
        ASSERT_EQ(tpd_sampler_get(&s.s[want[g]], index[g], direct.data()), TPD_OK);
        EXPECT_EQ(got, direct);
        EXPECT_EQ(got[0] / 10000, want[g]) << "tokens of data set " << want[g];
    }
    tpd_blend_sampler_free(&s);
    tpd_data_source_close(&src);
}

TEST(DataBlend, OnePrefixSamplesAsBefore) {
    std::string a = write_iota("blend_one", 2000, 0);
    tpd_data_source src;
    ASSERT_EQ(tpd_data_source_open(a.c_str(), 100000, &src), TPD_OK);
    ASSERT_EQ(src.n, 1);
    tpd_blend_sampler s;
    ASSERT_EQ(tpd_blend_sampler_init(&src, "949,50,1", TPD_SPLIT_TRAIN, 16, 1, 1234, &s), TPD_OK);
    tpd_sampler plain;
    ASSERT_EQ(tpd_sampler_init(src.ds[0], "949,50,1", TPD_SPLIT_TRAIN, 16, 1, 1234, &plain),
              TPD_OK);
    std::vector<int32_t> x(17), y(17);
    for (uint64_t g : {0ull, 1ull, 100ull, 117ull, 500ull}) {
        ASSERT_EQ(tpd_blend_sampler_get(&s, g, x.data()), TPD_OK);
        ASSERT_EQ(tpd_sampler_get(&plain, g, y.data()), TPD_OK);
        EXPECT_EQ(x, y) << g;
    }
    tpd_sampler_free(&plain);
    tpd_blend_sampler_free(&s);
    tpd_data_source_close(&src);
}

// llm.c's shards by pattern: every match, in name order, weighted by its tokens.
TEST(DataBlend, ShardPatternTakesEveryMatchByTokens) {
    std::string dir = tiny::temp_prefix("shards");
    std::filesystem::create_directories(dir);
    ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
    const int sizes[] = {3000, 1000, 2000};
    for (int i = 0; i < 3; i++) {
        std::vector<uint16_t> t(sizes[i]);
        for (int j = 0; j < sizes[i]; j++)
            t[j] = (uint16_t)(1000 * i + j % 1000);
        char name[64];
        snprintf(name, sizeof name, "/train_%06d.bin", i);
        ASSERT_EQ(tpd_llmc_shard_write((dir + name).c_str(), t.data(), t.size()), TPD_OK);
    }
    tpd_data_source src;
    ASSERT_EQ(tpd_data_source_open((dir + "/train_*.bin").c_str(), 65536, &src), TPD_OK)
        << tpd_last_error();
    ASSERT_EQ(src.n, 3);
    EXPECT_NE(std::string(src.prefix[1]).find("train_000001.bin"), std::string::npos);
    EXPECT_DOUBLE_EQ(src.weight[0], 0.5);
    EXPECT_DOUBLE_EQ(src.weight[1], 1.0 / 6.0);
    tpd_blend_sampler s;
    ASSERT_EQ(tpd_blend_sampler_init(&src, "1,0,0", TPD_SPLIT_TRAIN, 8, 0, 1, &s), TPD_OK);
    int seen[3] = {0, 0, 0};
    for (int g = 0; g < 600; g++) {
        int d;
        tpd_blend_sampler_locate(&s, g, &d, nullptr);
        seen[d]++;
    }
    EXPECT_NEAR(seen[0], 300, 1);
    EXPECT_NEAR(seen[1], 100, 1);
    EXPECT_NEAR(seen[2], 200, 1);
    tpd_blend_sampler_free(&s);
    tpd_data_source_close(&src);
    testing::internal::CaptureStderr();
    EXPECT_EQ(tpd_data_source_open((dir + "/valid_*.bin").c_str(), 65536, &src), TPD_ERR_IO);
    testing::internal::GetCapturedStderr();
    EXPECT_NE(std::string(tpd_last_error()).find("matches no file"), std::string::npos);
}

TEST(DataBlend, BadSpecsNameTheKeyAndRule) {
    std::string a = write_iota("blend_err", 500, 0);
    struct Case {
        std::string spec, message;
    } cases[] = {
        {"", "data.data_path: nothing given"},
        {"0.5 " + a + " 0.5", "must be pairs of WEIGHT PREFIX"},
        {"0.5 " + a + " -1 " + a, "weight '-1' of '" + a + "' must be a positive number"},
        {"0.5 " + a + " x " + a, "weight 'x'"},
        {"1 " + a + " 1 " + a + "_missing", a + "_missing"},
    };
    for (const Case &c : cases) {
        tpd_data_source src;
        testing::internal::CaptureStderr();
        EXPECT_NE(tpd_data_source_open(c.spec.c_str(), 100000, &src), TPD_OK) << c.spec;
        testing::internal::GetCapturedStderr();
        EXPECT_NE(std::string(tpd_last_error()).find(c.message), std::string::npos)
            << c.spec << ": " << tpd_last_error();
    }
}

} // namespace
