// Single-position decoding with a key/value cache (engine/model/model_decode.h) against the
// full forward on the cpu backend, for GPT-2 and the Llama block with grouped-query
// attention (and Llama 3.1's RoPE scaling): at every position the cached decode's logits
// equal the full forward's row within |a - b| <= 1e-5 (1 + |b|) (fp32; the two differ only
// in the attention's summation order). The model is such that history matters: a token
// repeated at two positions gets different logits, so a cache that ignored the earlier
// positions (or stored them at the wrong rows, or rotated them at the wrong position) would
// fail.
#include "decode_test_util.h"

#include <cstdio>

namespace {

constexpr double kTol = 1e-5;

struct CpuKb {
    tpd_kern_backend *kb = nullptr;
    CpuKb() {
        tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
        kc.num_threads = 2;
        EXPECT_EQ(tpd_kern_cpu_create(&kc, &kb), TPD_OK);
    }
    ~CpuKb() {
        tpd_kern_backend_destroy(kb);
    }
};

class ModelDecode : public ::testing::TestWithParam<const char *> {};

TEST_P(ModelDecode, CachedDecodeEqualsFullForwardAtEveryPosition) {
    tpd_config cfg = dec::config(GetParam());
    CpuKb be;
    dec::Model model;
    model.build(cfg, be.kb);
    ASSERT_FALSE(HasFatalFailure());
    tpd_model *m = model.m;
    int T = m->d.T, Vl = m->d.Vl;
    std::vector<int32_t> toks = dec::tokens(T);
    dec::Rows full = dec::full_logits(m, toks);

    tpd_model_decode *d = nullptr;
    ASSERT_EQ(tpd_model_decode_create(m, &d), TPD_OK);
    EXPECT_EQ(tpd_model_decode_len(d), 0);
    dec::Rows got = dec::decode_logits(d, toks, 0, Vl);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double e = dec::worst_rel(got[t], full[t], 1.0);
        worst = std::max(worst, e);
        EXPECT_LE(e, kTol) << "position " << t;
    }
    printf("%s: cached decode vs full forward, worst relative logit error %.2e\n", GetParam(),
           worst);
    // history matters: token 5 at positions 2 and 8 (and 1 at 0 and 10) is seen differently
    EXPECT_GT(dec::worst_rel(full[8], full[2], 1.0), 1e-2);
    EXPECT_GT(dec::worst_rel(full[10], full[0], 1.0), 1e-2);

    // Back to position 5 with another continuation: positions 0..4 stay cached, 5.. are
    // replaced, and the logits are those of the full forward of the new sequence.
    std::vector<int32_t> other = dec::tokens(T, 1);
    for (int t = 0; t < 5; t++)
        other[t] = toks[t];
    dec::Rows full2 = dec::full_logits(m, other);
    dec::Rows got2 = dec::decode_logits(d, other, 5, Vl);
    for (int t = 5; t < T; t++)
        EXPECT_LE(dec::worst_rel(got2[t], full2[t], 1.0), kTol) << "continued at position " << t;
    EXPECT_GT(dec::worst_rel(full2[T - 1], full[T - 1], 1.0), 1e-2);

    // a step without logits still extends the cache; reset starts again at position 0
    tpd_model_decode_reset(d);
    EXPECT_EQ(tpd_model_decode_len(d), 0);
    ASSERT_EQ(tpd_model_decode_step(d, 0, toks[0], nullptr), TPD_OK);
    std::vector<float> row(Vl);
    ASSERT_EQ(tpd_model_decode_step(d, 1, toks[1], row.data()), TPD_OK);
    EXPECT_LE(dec::worst_rel(row, full[1], 1.0), kTol);
    tpd_model_decode_destroy(d);
}

INSTANTIATE_TEST_SUITE_P(Block, ModelDecode, ::testing::Values("gpt2", "llama", "llama31"),
                         [](const testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param);
                         });

TEST(ModelDecode, RejectsPositionsOutsideTheCacheAndModelsSplitOverRanks) {
    tpd_config cfg = dec::config("llama");
    CpuKb be;
    dec::Model model;
    model.build(cfg, be.kb);
    ASSERT_FALSE(HasFatalFailure());
    tpd_model_decode *d = nullptr;
    ASSERT_EQ(tpd_model_decode_create(model.m, &d), TPD_OK);
    int T = model.m->d.T;
    EXPECT_EQ(tpd_model_decode_step(d, 1, 3, nullptr), TPD_ERR_INVALID); // a gap
    EXPECT_EQ(tpd_model_decode_step(d, -1, 3, nullptr), TPD_ERR_INVALID);
    for (int t = 0; t < T; t++)
        ASSERT_EQ(tpd_model_decode_step(d, t, 3, nullptr), TPD_OK);
    EXPECT_EQ(tpd_model_decode_step(d, T, 3, nullptr), TPD_ERR_INVALID); // past seq_length
    EXPECT_EQ(tpd_model_decode_len(d), T);
    tpd_model_decode_destroy(d);
    tpd_model_decode_destroy(nullptr);

    // a pipeline stage holds only some layers: no decoding there
    tpd_model *stage = nullptr;
    ASSERT_EQ(tpd_model_create(&cfg, be.kb, nullptr, 1, 0, 2, 1, 0, &stage), TPD_OK);
    EXPECT_EQ(tpd_model_decode_create(stage, &d), TPD_ERR_UNSUPPORTED);
    tpd_model_destroy(stage);
}

} // namespace
