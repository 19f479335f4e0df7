// The kernels' scratch plan (kernels/scratch.c): each op's size follows its shapes by the
// formula the cuda kernels use, the plan is their max, the cpu backend plans none, and bad
// input is refused with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>

extern "C" {
#include "base/align.h"
#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"
}

namespace {

// GPT-2 124M at micro-batch 4, sequence 1024, on one rank.
tpd_kern_shapes gpt2_small(tpd_dtype dt, int fused) {
    tpd_kern_shapes s{};
    s.B = 4;
    s.T = 1024;
    s.Nl = 4096;
    s.C = 768;
    s.NH = 12;
    s.NKV = 12;
    s.HS = 64;
    s.bias_oc = 3072;
    s.Vl = 50304;
    s.rmsnorm = 0;
    s.dtype = dt;
    s.fused_attention = fused;
    return s;
}

TEST(ScratchPlan, EachOpFollowsItsShapes) {
    tpd_kern_shapes s = gpt2_small(TPD_DTYPE_BF16, 0);
    tpd_kern_scratch p;
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s, &p), TPD_OK);
    size_t N = 4096;
    // LayerNorm: one fp32 (dw | db) row of 2C per block of 32 rows
    EXPECT_EQ(p.norm_bwd, (N / 32) * 2 * 768 * 4);
    // bias gradient: one fp32 row of OC per 256 rows
    EXPECT_EQ(p.bias_grad, (N / 256) * 3072 * 4);
    // embedding: four (N) int32 arrays, the sort's temp bound (three more and 64 KiB) and
    // the first pass's fp32 partial sums, an (N, C) block
    EXPECT_EQ(p.embed_bwd, 7 * tpd_align_up(N * 4) + (64u << 10) + tpd_align_up(N * 768 * 4));
    // unfused attention (bf16, attention: unfused): dS of P's size in the backward; P itself
    // is saved activation state, so the forward takes only one batch index's fp32 scores
    EXPECT_EQ(p.attention_fwd, (size_t)12 * 1024 * 1024 * 4);
    EXPECT_EQ(p.attention_bwd, (size_t)4 * 12 * 1024 * 1024 * 2);
    EXPECT_EQ(p.total,
              std::max({p.norm_bwd, p.bias_grad, p.embed_bwd, p.attention_fwd, p.attention_bwd}));

    // twice the rows: twice the norm and bias partials; an odd row count rounds up
    tpd_kern_shapes s2 = s;
    s2.B = 8;
    s2.Nl = 8192;
    tpd_kern_scratch p2;
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s2, &p2), TPD_OK);
    EXPECT_EQ(p2.norm_bwd, 2 * p.norm_bwd);
    EXPECT_EQ(p2.bias_grad, 2 * p.bias_grad);
    s2.Nl = 33;
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s2, &p2), TPD_OK);
    EXPECT_EQ(p2.norm_bwd, 2u * 2 * 768 * 4);
    // RMSNorm: dw only, one row of C per 256 rows
    s2 = s;
    s2.rmsnorm = 1;
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s2, &p2), TPD_OK);
    EXPECT_EQ(p2.norm_bwd, (N / 256) * 768 * 4);
    // no biases, no embedding on this rank: none of their scratch
    s2.bias_oc = 0;
    s2.Vl = 0;
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s2, &p2), TPD_OK);
    EXPECT_EQ(p2.bias_grad, 0u);
    EXPECT_EQ(p2.embed_bwd, 0u);
}

TEST(ScratchPlan, FusedAttentionPlansTheCudnnBoundAndGroupedQueryFallback) {
    tpd_kern_shapes s = gpt2_small(TPD_DTYPE_BF16, 1);
    tpd_kern_scratch p;
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s, &p), TPD_OK);
    size_t rows = (size_t)4 * 12 * 1024, dq = rows * 64 * 4;
    size_t bound = 2 * dq + 2 * tpd_align_up(rows * 4) + (1u << 20);
    EXPECT_EQ(tpd_kern_cudnn_plan_workspace_bound(4, 1024, 12, 64), bound);
    EXPECT_EQ(p.attention_fwd, bound + 256);
    size_t ssum = tpd_align_up(rows * 4);
    EXPECT_EQ(p.attention_bwd, bound + dq + ssum); // with the dQ accumulator and softmax_sum
    // grouped-query heads may leave cuDNN for the statistics path: P and the backward's
    // work (dS, and the per-query-head dK/dV) are planned too
    s.NKV = 4;
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s, &p), TPD_OK);
    size_t probs = rows * 1024 * 2, full = (size_t)4 * 1024 * 2 * 12 * 64 * 2;
    size_t scores = (size_t)12 * 1024 * 1024 * 4; // one batch index, fp32
    EXPECT_EQ(p.attention_fwd, std::max(bound + 256, probs + scores));
    EXPECT_EQ(p.attention_bwd, std::max(bound + dq + ssum, 2 * probs + full + scores));
    // f32 has no fused path: the unfused backward in 4-byte elements
    s = gpt2_small(TPD_DTYPE_F32, 1);
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s, &p), TPD_OK);
    EXPECT_EQ(p.attention_bwd, rows * 1024 * 4);
}

// The experts' scatter_add_rows sorts its N*topk rows as the embedding backward sorts its
// tokens: four (rows) int32 arrays and the sort's temp bound; nothing without experts.
TEST(ScratchPlan, MoeScatterFollowsItsRows) {
    tpd_kern_shapes s = gpt2_small(TPD_DTYPE_BF16, 0);
    tpd_kern_scratch p;
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s, &p), TPD_OK);
    EXPECT_EQ(p.moe_scatter, 0u);
    s.moe_rows = 4096 * 2;
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s, &p), TPD_OK);
    size_t rows = 8192;
    EXPECT_EQ(p.moe_scatter, 7 * tpd_align_up(rows * 4) + (64u << 10));
    EXPECT_EQ(p.moe_scatter, tpd_kern_scatter_rows_scratch(8192));
    EXPECT_EQ(p.total, std::max({p.norm_bwd, p.bias_grad, p.embed_bwd, p.attention_fwd,
                                 p.attention_bwd, p.moe_scatter}));
    s.Vl = 0;
    s.NH = 0; // no attention, and many rows: the scatter is the largest take
    s.moe_rows = 1 << 22;
    ASSERT_EQ(tpd_kern_scratch_plan("cuda", &s, &p), TPD_OK);
    EXPECT_EQ(p.total, p.moe_scatter);
    ASSERT_EQ(tpd_kern_scratch_plan("cpu", &s, &p), TPD_OK);
    EXPECT_EQ(p.total, 0u);
    s.moe_rows = -1;
    EXPECT_EQ(tpd_kern_scratch_plan("cuda", &s, &p), TPD_ERR_INVALID);
}

TEST(ScratchPlan, CpuPlansNoneAndBadInputIsRefused) {
    tpd_kern_shapes s = gpt2_small(TPD_DTYPE_F32, 0);
    tpd_kern_scratch p;
    ASSERT_EQ(tpd_kern_scratch_plan("cpu", &s, &p), TPD_OK);
    EXPECT_EQ(p.total, 0u);
    EXPECT_EQ(tpd_kern_scratch_plan("tpu", &s, &p), TPD_ERR_INVALID);
    s.NKV = 5; // does not divide 12
    EXPECT_EQ(tpd_kern_scratch_plan("cuda", &s, &p), TPD_ERR_INVALID);
    s.NKV = 12;
    s.B = -1;
    EXPECT_EQ(tpd_kern_scratch_plan("cuda", &s, &p), TPD_ERR_INVALID);
}

// The cpu backend's reservation reports its plan: nothing.
TEST(ScratchPlan, CpuBackendReservesItsPlan) {
    tpd_kern_backend *kb = nullptr;
    ASSERT_EQ(tpd_kern_cpu_create(nullptr, &kb), TPD_OK);
    tpd_kern_shapes s = gpt2_small(TPD_DTYPE_F32, 0);
    size_t got = 1;
    EXPECT_EQ(tpd_kern_scratch_reserve(kb, &s, &got), TPD_OK);
    EXPECT_EQ(got, 0u);
    tpd_kern_backend_destroy(kb);
}

} // namespace
