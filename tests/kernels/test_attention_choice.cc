// The cuda backend's attention path rule (kernels/attention_choice.h) on the cpu: which of
// cuDNN's backward patterns is taken, when attention falls back to the unfused path, what
// the warning says, and that the saved-buffer size follows the decision.
#include <gtest/gtest.h>

#include <string>

extern "C" {
#include "kernels/attention_choice.h"
}

namespace {

// GPT-2 124M's attention on an H200 with cuDNN 9.19, every graph built.
tpd_attn_choice_in h200_all_built() {
    tpd_attn_choice_in in{};
    in.B = 4;
    in.T = 1024;
    in.NH = 12;
    in.HS = 64;
    in.dtype = TPD_DTYPE_BF16;
    in.fused_requested = 1;
    in.force = TPD_ATTN_FORCE_NONE;
    in.sm = 90;
    in.cudnn_version = 91900;
    in.fwd = TPD_ATTN_BUILD_OK;
    in.bwd_new = TPD_ATTN_BUILD_OK;
    in.bwd_old = TPD_ATTN_BUILD_OK;
    return in;
}

const size_t kStats = (size_t)4 * 12 * 1024 * 4;        // (B,NH,T) fp32
const size_t kProbs = (size_t)4 * 12 * 1024 * 1024 * 2; // (B,NH,T,T) bf16

TEST(AttentionChoice, CurrentPatternBuiltTakesFusedAndSavesStatistics) {
    tpd_attn_choice c;
    tpd_attn_choice_in in = h200_all_built();
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_FUSED);
    EXPECT_EQ(c.warn, 0);
    EXPECT_EQ(c.saved_bytes, kStats);
}

TEST(AttentionChoice, OnlyOlderPatternBuiltTakesIt) {
    tpd_attn_choice c;
    tpd_attn_choice_in in = h200_all_built();
    in.bwd_new = TPD_ATTN_BUILD_FAILED;
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_FUSED_OLD);
    EXPECT_EQ(c.warn, 0);
    EXPECT_EQ(c.saved_bytes, kStats);
    EXPECT_NE(std::string(c.reason).find("older backward pattern"), std::string::npos) << c.reason;
}

TEST(AttentionChoice, ForcingTheOlderPatternSkipsTheCurrentOne) {
    tpd_attn_choice c;
    tpd_attn_choice_in in = h200_all_built();
    in.force = TPD_ATTN_FORCE_OLD;
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_FUSED_OLD);
    // ... and without the older graph built, forcing it does not pick the current one.
    in.bwd_old = TPD_ATTN_BUILD_FAILED;
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_UNFUSED);
}

TEST(AttentionChoice, BothPatternsFailFallsBackUnfusedWithAWarning) {
    tpd_attn_choice c;
    tpd_attn_choice_in in = h200_all_built();
    in.bwd_new = TPD_ATTN_BUILD_FAILED;
    in.bwd_old = TPD_ATTN_BUILD_FAILED;
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_UNFUSED);
    EXPECT_EQ(c.warn, 1);
    EXPECT_EQ(c.saved_bytes, kProbs);
    std::string r = c.reason;
    EXPECT_NE(r.find("unfused"), std::string::npos) << r;
    EXPECT_NE(r.find("current pattern failed, older pattern failed"), std::string::npos) << r;
    EXPECT_NE(r.find("cuDNN 9.19 on sm_90"), std::string::npos) << r;

    testing::internal::CaptureStderr();
    tpd_attn_choice_log(&c);
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find(r), std::string::npos) << err;
    EXPECT_NE(err.find("warning: "), std::string::npos) << err;
}

TEST(AttentionChoice, ForwardFailingAloneAlsoFallsBack) {
    tpd_attn_choice c;
    tpd_attn_choice_in in = h200_all_built();
    in.fwd = TPD_ATTN_BUILD_FAILED;
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_UNFUSED);
    EXPECT_EQ(c.warn, 1);
    EXPECT_EQ(c.saved_bytes, kProbs);
}

// Head sizes outside the backward's range are refused before any graph is built, with a
// message naming the head size: 256 is beyond sm_80's 128, 264 beyond sm_90's 256, and 60
// is no multiple of 8. The graph results are ignored (all "built" here).
TEST(AttentionChoice, HeadSizeOutsideTheBackwardRangeFallsBackNamingIt) {
    tpd_attn_choice c;
    char why[256];
    struct {
        int sm, hs;
    } cases[] = {{80, 256}, {90, 264}, {90, 60}, {86, 136}};
    for (auto k : cases) {
        tpd_attn_choice_in in = h200_all_built();
        in.sm = k.sm;
        in.HS = k.hs;
        EXPECT_EQ(tpd_attn_fused_eligible(&in, why, sizeof why), 0) << k.sm << " " << k.hs;
        tpd_attn_choose(&in, &c);
        EXPECT_EQ(c.path, TPD_ATTN_PATH_UNFUSED) << k.sm << " " << k.hs;
        EXPECT_EQ(c.warn, 1);
        EXPECT_EQ(c.saved_bytes,
                  tpd_attn_saved_bytes(TPD_ATTN_PATH_UNFUSED, TPD_DTYPE_BF16, 4, 1024, 12));
        std::string r = c.reason;
        EXPECT_NE(r.find("head size " + std::to_string(k.hs)), std::string::npos) << r;
    }
    // In range: 256 on sm_90, 128 on sm_80, 8 anywhere.
    struct {
        int sm, hs;
    } ok[] = {{90, 256}, {80, 128}, {80, 8}};
    for (auto k : ok) {
        tpd_attn_choice_in in = h200_all_built();
        in.sm = k.sm;
        in.HS = k.hs;
        EXPECT_EQ(tpd_attn_fused_eligible(&in, why, sizeof why), 1) << why;
        tpd_attn_choose(&in, &c);
        EXPECT_EQ(c.path, TPD_ATTN_PATH_FUSED) << k.sm << " " << k.hs;
    }
    EXPECT_EQ(tpd_attn_fused_max_head_size(90), 256);
    EXPECT_EQ(tpd_attn_fused_max_head_size(80), 128);
    EXPECT_EQ(tpd_attn_fused_max_head_size(100), 128);
}

TEST(AttentionChoice, NotEligibleForOtherReasons) {
    tpd_attn_choice c;
    tpd_attn_choice_in in = h200_all_built();
    in.dtype = TPD_DTYPE_F32; // f32 compute: unfused, the f32 probabilities saved
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_UNFUSED);
    EXPECT_EQ(c.saved_bytes, (size_t)4 * 12 * 1024 * 1024 * 4);
    EXPECT_NE(std::string(c.reason).find("bf16"), std::string::npos) << c.reason;
    EXPECT_EQ(c.warn, 0); // by design in f32, not a fallback

    in = h200_all_built();
    in.dtype = TPD_DTYPE_F32; // ... even when every graph "built"
    in.bwd_new = TPD_ATTN_BUILD_FAILED;
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_UNFUSED);

    in = h200_all_built();
    in.sm = 75;
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_UNFUSED);
    EXPECT_NE(std::string(c.reason).find("sm_75"), std::string::npos) << c.reason;

    in = h200_all_built();
    in.cudnn_version = 8907;
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_UNFUSED);

    // Asked for unfused (config or environment): no warning, it is what was asked.
    in = h200_all_built();
    in.fused_requested = 0;
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_UNFUSED);
    EXPECT_EQ(c.warn, 0);
    EXPECT_EQ(c.saved_bytes, kProbs);
    in = h200_all_built();
    in.force = TPD_ATTN_FORCE_UNFUSED;
    tpd_attn_choose(&in, &c);
    EXPECT_EQ(c.path, TPD_ATTN_PATH_UNFUSED);
    EXPECT_EQ(c.warn, 0);
}

TEST(AttentionChoice, SavedBytesPerPath) {
    EXPECT_EQ(tpd_attn_saved_bytes(TPD_ATTN_PATH_FUSED, TPD_DTYPE_BF16, 2, 9, 3),
              (size_t)2 * 3 * 9 * 4);
    EXPECT_EQ(tpd_attn_saved_bytes(TPD_ATTN_PATH_FUSED_OLD, TPD_DTYPE_BF16, 2, 9, 3),
              (size_t)2 * 3 * 9 * 4);
    EXPECT_EQ(tpd_attn_saved_bytes(TPD_ATTN_PATH_UNFUSED, TPD_DTYPE_BF16, 2, 9, 3),
              (size_t)2 * 3 * 9 * 9 * 2);
    EXPECT_EQ(tpd_attn_saved_bytes(TPD_ATTN_PATH_UNFUSED, TPD_DTYPE_F32, 2, 9, 3),
              (size_t)2 * 3 * 9 * 9 * 4);
}

TEST(AttentionChoice, ForceVariableParses) {
    tpd_attn_force f = TPD_ATTN_FORCE_OLD;
    EXPECT_EQ(tpd_attn_force_parse(nullptr, &f), TPD_OK);
    EXPECT_EQ(f, TPD_ATTN_FORCE_NONE);
    EXPECT_EQ(tpd_attn_force_parse("old", &f), TPD_OK);
    EXPECT_EQ(f, TPD_ATTN_FORCE_OLD);
    EXPECT_EQ(tpd_attn_force_parse("unfused", &f), TPD_OK);
    EXPECT_EQ(f, TPD_ATTN_FORCE_UNFUSED);
    EXPECT_EQ(tpd_attn_force_parse("auto", &f), TPD_OK);
    EXPECT_EQ(f, TPD_ATTN_FORCE_NONE);
    testing::internal::CaptureStderr();
    f = TPD_ATTN_FORCE_OLD;
    EXPECT_EQ(tpd_attn_force_parse("new", &f), TPD_ERR_INVALID);
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(f, TPD_ATTN_FORCE_OLD); // untouched on error
    EXPECT_NE(err.find("TRIPOD_CUDNN_ATTN=new"), std::string::npos) << err;
    EXPECT_NE(err.find("auto, old or unfused"), std::string::npos) << err;
}

} // namespace
