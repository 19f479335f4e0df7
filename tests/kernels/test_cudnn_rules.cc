// The cuDNN version rules of the fused attention (kernels/cuda/cudnn_rules.h) on the cpu:
// the SDPA backward refused on 9.10.0 and 9.10.1 only, the padding mask on 9.15 and older
// when s_kv is not a multiple of 128 (the gpu tests' T = 100 and 64 among them), and the
// words that say which applied.
#include <gtest/gtest.h>

#include <string>

extern "C" {
#include "kernels/cuda/cudnn_rules.h"
}

namespace {

tpd_cudnn_sdpa_rules rules(int version, int s_kv) {
    tpd_cudnn_sdpa_rules r;
    r.bwd_refused = r.padding_mask = -1; // written by the call
    tpd_cudnn_sdpa_rules_of(version, s_kv, &r);
    return r;
}

TEST(CudnnRules, BackwardRefusedOnNineTenZeroAndOneOnly) {
    EXPECT_EQ(rules(91000, 1024).bwd_refused, 1);
    EXPECT_EQ(rules(91001, 1024).bwd_refused, 1);
    for (int v : {90000, 90600, 90900, 90999, 91002, 91100, 91500, 91600, 91900, 100000})
        EXPECT_EQ(rules(v, 1024).bwd_refused, 0) << v;
}

TEST(CudnnRules, PaddingMaskOnOldCudnnWithRaggedKeys) {
    for (int v : {90000, 91000, 91300, 91500, 91599}) {
        EXPECT_EQ(rules(v, 100).padding_mask, 1) << v;
        EXPECT_EQ(rules(v, 64).padding_mask, 1) << v;
        EXPECT_EQ(rules(v, 1000).padding_mask, 1) << v;
        EXPECT_EQ(rules(v, 128).padding_mask, 0) << v;
        EXPECT_EQ(rules(v, 1024).padding_mask, 0) << v;
    }
    for (int v : {91600, 91601, 91900, 100000}) {
        EXPECT_EQ(rules(v, 100).padding_mask, 0) << v;
        EXPECT_EQ(rules(v, 64).padding_mask, 0) << v;
    }
}

TEST(CudnnRules, BothCanApply) {
    tpd_cudnn_sdpa_rules r = rules(91001, 100);
    EXPECT_EQ(r.bwd_refused, 1);
    EXPECT_EQ(r.padding_mask, 1);
    char buf[512];
    EXPECT_EQ(tpd_cudnn_sdpa_rules_describe(&r, 91001, 100, buf, sizeof buf), 2);
    std::string s(buf);
    EXPECT_NE(s.find("cuDNN 9.10.1"), std::string::npos) << s;
    EXPECT_NE(s.find("refused"), std::string::npos) << s;
    EXPECT_NE(s.find("seq_len = 100"), std::string::npos) << s;
}

TEST(CudnnRules, NoneSaysNothing) {
    tpd_cudnn_sdpa_rules r = rules(91900, 100);
    char buf[64] = "x";
    EXPECT_EQ(tpd_cudnn_sdpa_rules_describe(&r, 91900, 100, buf, sizeof buf), 0);
    EXPECT_STREQ(buf, "");
}

TEST(CudnnRules, DescribeStaysInItsBuffer) {
    tpd_cudnn_sdpa_rules r = rules(91000, 100);
    char buf[40];
    buf[39] = 'z';
    EXPECT_EQ(tpd_cudnn_sdpa_rules_describe(&r, 91000, 100, buf, 39), 2);
    EXPECT_EQ(buf[39], 'z');
    EXPECT_LT(std::string(buf).size(), 39u);
}

} // namespace
