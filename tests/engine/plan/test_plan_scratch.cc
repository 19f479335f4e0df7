// The kernels' scratch in the memory plan: the planner derives from a layout the shapes the
// engine runs its ops at (so both plan the same scratch, kernels/scratch.c), the engine's
// buffer plan counts that scratch in its workspace, and the planner's cuda workspace
// includes it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/tiny.h"
#include "plan_test_util.h"

extern "C" {
#include "engine/model/model.h"
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"
#include "kernels/kernels.h"
}

namespace {

void expect_same_shapes(const tpd_kern_shapes &a, const tpd_kern_shapes &b, const std::string &w) {
    EXPECT_EQ(a.B, b.B) << w;
    EXPECT_EQ(a.T, b.T) << w;
    EXPECT_EQ(a.Nl, b.Nl) << w;
    EXPECT_EQ(a.C, b.C) << w;
    EXPECT_EQ(a.NH, b.NH) << w;
    EXPECT_EQ(a.NKV, b.NKV) << w;
    EXPECT_EQ(a.HS, b.HS) << w;
    EXPECT_EQ(a.bias_oc, b.bias_oc) << w;
    EXPECT_EQ(a.Vl, b.Vl) << w;
    EXPECT_EQ(a.rmsnorm, b.rmsnorm) << w;
    EXPECT_EQ(a.dtype, b.dtype) << w;
    EXPECT_EQ(a.fused_attention, b.fused_attention) << w;
}

TEST(PlanScratch, PlannerShapesAreTheEngines) {
    for (int llama = 0; llama <= 1; llama++)
        for (int tp : {1, 2})
            for (int pp : {1, 2})
                for (int sp = 0; sp <= (tp > 1 ? 1 : 0); sp++) {
                    tpd_config cfg = tiny::config("unused");
                    if (llama) tiny::llama(cfg);
                    cfg.model.seq_length = 16;
                    cfg.training.micro_batch_size = 2;
                    cfg.training.device = TPD_DEVICE_CUDA;
                    cfg.training.precision = TPD_PRECISION_BF16;
                    cfg.training.attention = TPD_ATTENTION_FUSED;
                    cfg.parallel.tensor_model_parallel_size = tp;
                    cfg.parallel.pipeline_model_parallel_size = pp;
                    cfg.parallel.sequence_parallel = sp;
                    tpd_plan_layout lay;
                    tpd_plan_layout_from_config(&cfg, tp * pp, &lay);
                    for (int stage = 0; stage < pp; stage++) {
                        std::string w = "llama " + std::to_string(llama) + " tp " +
                                        std::to_string(tp) + " pp " + std::to_string(pp) + " sp " +
                                        std::to_string(sp) + " stage " + std::to_string(stage);
                        tpd_model_dims d;
                        ASSERT_EQ(tpd_model_dims_init(&cfg, tp, 0, pp, stage, &d), TPD_OK) << w;
                        tpd_kern_shapes engine, plan;
                        tpd_model_kern_shapes(&cfg, &d, &engine);
                        tpd_plan_kern_shapes(&cfg, &lay, stage, &plan);
                        expect_same_shapes(engine, plan, w);
                        // the buffer plan holds the same scratch in its workspace
                        tpd_buffer_plan b;
                        ASSERT_EQ(tpd_buffer_plan_init(&cfg, tp, 0, pp, 1, stage, &b), TPD_OK);
                        tpd_kern_scratch s;
                        ASSERT_EQ(tpd_plan_scratch(&cfg, &lay, stage, "cuda", &s), TPD_OK);
                        EXPECT_GT(s.total, 0u) << w;
                        EXPECT_EQ(b.scratch_bytes, s.total) << w;
                        EXPECT_EQ(b.mem.workspace, b.ws_bytes + b.scratch_bytes + b.host_bytes)
                            << w;
                    }
                }
}

// GPT-2 124M at mbs 4, seq 1024 on one H100-class rank: the workspace of the cuda plan
// moves by exactly the scratch plan's change when only the attention path changes (the
// other workspace terms do not depend on it), and holds the whole scratch.
TEST(PlanScratch, CudaWorkspaceIncludesTheScratch) {
    tpd_config cfg = plan_test::gpt(12, 768, 12, 32, 4);
    cfg.model.vocab_size = 50257;
    cfg.model.seq_length = 1024;
    cfg.model.max_position_embeddings = 1024;
    tpd_plan_cluster cl = plan_test::a100();
    double ws[2];
    size_t scratch[2];
    for (int fused = 0; fused <= 1; fused++) {
        cfg.training.attention = fused ? TPD_ATTENTION_FUSED : TPD_ATTENTION_UNFUSED;
        tpd_plan_result res;
        memset(&res, 0, sizeof res);
        tpd_plan_layout_from_config(&cfg, 1, &res.layout);
        ASSERT_EQ(tpd_plan_memory(&cfg, &cl, &res), TPD_OK);
        tpd_kern_scratch s;
        ASSERT_EQ(tpd_plan_scratch(&cfg, &res.layout, 0, "cuda", &s), TPD_OK);
        ws[fused] = res.mem[0].workspace;
        scratch[fused] = s.total;
        std::printf("GPT-2 124M mbs 4 seq 1024 bf16, attention %s, cuda scratch (MiB): "
                    "norm_bwd %.3f bias_grad %.3f embed_bwd %.3f attention_fwd %.3f "
                    "attention_bwd %.3f total %.3f; planned workspace %.1f MiB\n",
                    fused ? "fused" : "unfused", s.norm_bwd / 1048576.0, s.bias_grad / 1048576.0,
                    s.embed_bwd / 1048576.0, s.attention_fwd / 1048576.0,
                    s.attention_bwd / 1048576.0, s.total / 1048576.0, ws[fused] / 1048576.0);
        // one rank creates no communicator: the cuBLASLt workspace, not the profile's NCCL
        // buffers beside it
        EXPECT_GE(ws[fused], (double)TPD_KERN_GEMM_WORKSPACE_BYTES + (double)s.total);
        EXPECT_LT(ws[fused], cl.workspace_bytes + (double)s.total);
        tpd_plan_result two;
        memset(&two, 0, sizeof two);
        tpd_plan_layout_from_config(&cfg, 2, &two.layout); // DP 2
        ASSERT_EQ(tpd_plan_memory(&cfg, &cl, &two), TPD_OK);
        EXPECT_GE(two.mem[0].workspace, cl.workspace_bytes + (double)s.total);
    }
    EXPECT_NE(scratch[0], scratch[1]);
    EXPECT_DOUBLE_EQ(ws[1] - ws[0], (double)scratch[1] - (double)scratch[0]);
}

} // namespace
