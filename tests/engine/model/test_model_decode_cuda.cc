// Single-position decoding on the cuda backend against its own full forward (label `gpu`:
// skips without a CUDA device), for GPT-2 and the Llama block with grouped-query attention,
// in bf16 (the production dtype; fused attention for the full forward) and f32. The two
// paths round at different points (cuDNN or the unfused attention beside the decoding
// kernel, GEMMs of T rows beside one), so the bound is relative to the logits' scale:
// |a - b| <= tol (rms + |b|), tol 5e-2 in bf16 and 1e-4 in f32.
#include "decode_test_util.h"

#include "common/gpu.h"

namespace {

struct Case {
    const char *block;
    tpd_precision precision;
};

class ModelDecodeCuda : public ::testing::TestWithParam<Case> {};

TEST_P(ModelDecodeCuda, CachedDecodeMatchesTheFullForward) {
    TPD_SKIP_WITHOUT_GPU();
    Case c = GetParam();
    tpd_config cfg = dec::config(c.block);
    cfg.training.device = TPD_DEVICE_CUDA;
    cfg.training.precision = c.precision;
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    kc.dtype = c.precision == TPD_PRECISION_BF16 ? TPD_DTYPE_BF16 : TPD_DTYPE_F32;
    kc.fp32_grads = tpd_config_grad_bytes(&cfg) == 4;
    kc.fused_attention = cfg.training.attention == TPD_ATTENTION_FUSED;
    tpd_kern_backend *kb = nullptr;
    ASSERT_EQ(tpd_kern_cuda_create(&kc, &kb), TPD_OK);
    {
        dec::Model model;
        model.build(cfg, kb);
        ASSERT_FALSE(HasFatalFailure());
        int T = model.m->d.T;
        std::vector<int32_t> toks = dec::tokens(T);
        dec::Rows full = dec::full_logits(model.m, toks);
        tpd_model_decode *d = nullptr;
        ASSERT_EQ(tpd_model_decode_create(model.m, &d), TPD_OK);
        dec::Rows got = dec::decode_logits(d, toks, 0, model.m->d.Vl);
        double rms = dec::rms_of(full), tol = kc.dtype == TPD_DTYPE_BF16 ? 5e-2 : 1e-4;
        for (int t = 0; t < T; t++)
            EXPECT_LE(dec::worst_rel(got[t], full[t], rms), tol) << "position " << t;
        EXPECT_GT(dec::worst_rel(full[8], full[2], rms), 10 * tol); // history matters
        tpd_model_decode_destroy(d);
    }
    tpd_kern_backend_destroy(kb);
}

INSTANTIATE_TEST_SUITE_P(Block, ModelDecodeCuda,
                         ::testing::Values(Case{"gpt2", TPD_PRECISION_BF16},
                                           Case{"llama", TPD_PRECISION_BF16},
                                           Case{"gpt2", TPD_PRECISION_FP32},
                                           Case{"llama", TPD_PRECISION_FP32}),
                         [](const testing::TestParamInfo<Case> &i) {
                             return std::string(i.param.block) +
                                    (i.param.precision == TPD_PRECISION_BF16 ? "_bf16" : "_f32");
                         });

} // namespace
