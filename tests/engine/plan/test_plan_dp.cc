// The planner's DP communication against the trainer's engine/optim/grad_sync.c: buckets of
// parallel.ddp_bucket_size elements over the layer-major gradient buffer, started once the
// simulated last backward has made them final (overlap_grad_reduce) or after the pipeline,
// one after another on the DP link; ZeRO-1 gathers against the next step's first forwards.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "plan_test_util.h"

extern "C" {
#include "engine/plan/plan.h"
}

using namespace plan_test;

namespace {

// Ring all-reduce of `bytes` over n ranks inside one node of the profile, s (a ring moves
// 2(n-1)/n of the data over each link, in 2(n-1) steps of latency).
double ring_allreduce(const tpd_plan_cluster &cl, double bytes, int n) {
    double bw = cl.intra_bw * cl.coll_efficiency;
    return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * cl.intra_latency;
}

// The serial reduction of a buffer of `elems` fp32 gradients padded to a multiple of DP,
// in buckets of `bucket` elements (a multiple of DP; the last one shorter).
double serial_reduction(const tpd_plan_cluster &cl, double elems, double bucket, int dp) {
    double padded = std::ceil(elems / dp) * dp, sum = 0;
    bucket = std::floor(bucket / dp) * dp;
    for (double b0 = 0; b0 < padded; b0 += bucket)
        sum += ring_allreduce(cl, 4.0 * std::min(bucket, padded - b0), dp);
    return sum;
}

// Per-layer parameters of the GPT model at TP 1: 12h^2 + 13h (SC21 Eq. 2's per layer).
double layer_params(double h) {
    return 12.0 * h * h + 13.0 * h;
}

tpd_plan_result eval(const tpd_config &c, const tpd_plan_layout &lay, int overlap, int gpus) {
    return evaluate(c, a100(), lay, overlap, gpus);
}

const double kH = 2048;

// Without overlap every bucket runs after the pipeline, back to back: the exposed time is
// the serial sum of the ring all-reduces (a single stage holds wte, wpe, the layers, lnf).
TEST(PlanDp, WithoutOverlapTheReductionIsTheSerialSum) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(16, 2048, 24, 512, 4);
    c.parallel.ddp_bucket_size = 50000000;
    tpd_plan_layout lay = {1, 1, 8, 4, 1, TPD_RECOMPUTE_SELECTIVE, 0, 0, TPD_SCHEDULE_1F1B, 0, 0};
    tpd_plan_result r = eval(c, lay, 0, 8);
    double vp = tpd_config_padded_vocab(&c, 1);
    double elems = vp * kH + 2048 * kH + 24 * layer_params(kH) + 2 * kH;
    double serial = serial_reduction(cl, elems, 50000000, 8);
    EXPECT_NEAR(r.dp_exposed[0], serial, 1e-9 * serial);
    EXPECT_NEAR(r.time.dp_comm_exposed, serial, 1e-9 * serial);
    EXPECT_NEAR(r.time.dp_comm_total, serial, 1e-9 * serial);
    EXPECT_EQ(r.time.dp_gather_exposed, 0.0);
    // a middle stage of a pipeline holds only its layers; and the step adds up
    tpd_plan_layout l4 = {1, 4, 2, 4, 1, TPD_RECOMPUTE_SELECTIVE, 0, 0, TPD_SCHEDULE_1F1B, 0, 0};
    tpd_plan_result p4 = eval(c, l4, 0, 8);
    double mid = serial_reduction(cl, 6 * layer_params(kH), 50000000, 2);
    EXPECT_NEAR(p4.dp_exposed[1], mid, 1e-9 * mid);
    EXPECT_NEAR(p4.dp_exposed[2], mid, 1e-9 * mid);
    EXPECT_NEAR(p4.step_time_s, step_sum(p4.time), 1e-12 * p4.step_time_s);
}

// With overlap and small buckets, a middle stage's reduction runs during its last backward
// (six layers of it). A layer's gradients are final together, when the backward has passed
// it, so what is left past the pipeline is the reduction of the layer it finishes last (the
// stage's first): its buckets, and one more it shares with the next layer.
TEST(PlanDp, SmallBucketsHideBehindTheLastBackward) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(16, 2048, 24, 512, 4);
    double bucket = 2000000; // 2M elements: a layer (50M) is 25 buckets
    c.parallel.ddp_bucket_size = (int64_t)bucket;
    tpd_plan_layout l4 = {1, 4, 2, 4, 1, TPD_RECOMPUTE_SELECTIVE, 0, 0, TPD_SCHEDULE_1F1B, 1, 0};
    tpd_plan_result on = eval(c, l4, 1, 8), off = eval(c, l4, 0, 8);
    double one_bucket = ring_allreduce(cl, 4.0 * bucket, 2);
    double serial = serial_reduction(cl, 6 * layer_params(kH), bucket, 2);
    double last_layer = (std::ceil(layer_params(kH) / bucket) + 1) * one_bucket;
    // the last backward (a micro-batch's on this stage) is longer than the reduction
    ASSERT_GT(on.stage_times[1].bwd, serial);
    for (int s : {1, 2}) {
        EXPECT_NEAR(off.dp_exposed[s], serial, 1e-9 * serial);
        EXPECT_GT(on.dp_exposed[s], 0.0);
        EXPECT_LE(on.dp_exposed[s], last_layer * (1 + 1e-9)) << "stage " << s;
        EXPECT_LT(on.dp_exposed[s], serial / 5) << "stage " << s;
    }
    EXPECT_LT(on.step_time_s, off.step_time_s);
    // the embedding's buckets wait for the pipeline (and the tied all-reduce) even so
    EXPECT_GT(on.dp_exposed[0], 10 * one_bucket);
    // what was hidden shows: the total is the same, the exposed part smaller
    EXPECT_NEAR(on.time.dp_comm_total, off.time.dp_comm_total, 1e-12);
    EXPECT_LT(on.time.dp_comm_exposed, off.time.dp_comm_exposed);
}

// One bucket holds every gradient: it starts when the last of them is final, so overlap
// hides nothing but what runs between the last backward's end and the pipeline's (the
// gradient's send), and on the ends, which hold the embedding, nothing at all.
TEST(PlanDp, OneBucketHidesNothingButTheTail) {
    tpd_config c = gpt(16, 2048, 24, 512, 4);
    c.parallel.ddp_bucket_size = INT64_MAX;
    tpd_plan_layout l4 = {1, 4, 2, 4, 1, TPD_RECOMPUTE_SELECTIVE, 0, 0, TPD_SCHEDULE_1F1B, 1, 0};
    tpd_plan_result on = eval(c, l4, 1, 8), off = eval(c, l4, 0, 8);
    for (int s = 0; s < 4; s++) {
        EXPECT_LE(on.dp_exposed[s], off.dp_exposed[s] + 1e-12) << "stage " << s;
        EXPECT_GE(on.dp_exposed[s], off.dp_exposed[s] - on.t_p2p - 1e-12) << "stage " << s;
    }
    EXPECT_DOUBLE_EQ(on.dp_exposed[0], off.dp_exposed[0]);
    EXPECT_DOUBLE_EQ(on.dp_exposed[3], off.dp_exposed[3]);
}

// ZeRO-1: the all-gathers after the optimizer are all exposed without
// overlap_param_gather; with it, only what the next forward waits for. The buffer's first
// buckets are needed first and gathered first: on stage 0 the embedding at once, then its
// first layer; the rest comes in while the forward runs.
TEST(PlanDp, ParamGatherOverlapsTheNextForward) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(16, 2048, 24, 512, 4);
    c.parallel.ddp_bucket_size = 2000000;
    tpd_plan_layout l = {1, 4, 2, 4, 1, TPD_RECOMPUTE_SELECTIVE, 0, 1, TPD_SCHEDULE_1F1B, 1, 0};
    tpd_plan_result waited = eval(c, l, 1, 8);
    l.overlap_param_gather = 1;
    tpd_plan_result hidden = eval(c, l, 1, 8);
    EXPECT_GT(waited.time.dp_gather_exposed, 0.0);
    EXPECT_LT(hidden.step_time_s, waited.step_time_s);
    // without overlap the exposed gathers are the serial half rings of the biggest stage's
    // bf16 parameters (stage 0: the embeddings and six layers), bucket by bucket
    double bw = cl.intra_bw * cl.coll_efficiency;
    auto gathers = [&](double elems) {
        double sum = 0;
        for (double b0 = 0; b0 < elems; b0 += 2000000)
            sum += 0.5 * 2.0 * std::min(2000000.0, elems - b0) / bw + cl.intra_latency;
        return sum;
    };
    double vp = tpd_config_padded_vocab(&c, 1), emb = vp * kH + 2048 * kH;
    double all = gathers(std::ceil((emb + 6 * layer_params(kH)) / 2) * 2);
    EXPECT_NEAR(waited.time.dp_gather_exposed, all, 1e-9 * all);
    // with it, no more than the embedding's and the first layer's gathers are waited for
    double first = gathers(emb + layer_params(kH)) + gathers(2000000);
    EXPECT_GT(hidden.time.dp_gather_exposed, 0.0);
    EXPECT_LE(hidden.time.dp_gather_exposed, first);
    EXPECT_LT(hidden.time.dp_gather_exposed, 0.5 * all);
}

// On the cpu model too: the same buckets, and overlap never loses.
TEST(PlanDp, CpuModelOverlapNeverLoses) {
    tpd_plan_cluster cl = sample_cpu_profile();
    tpd_config c;
    tpd_config_defaults(&c);
    c.model.num_layers = 8;
    c.model.hidden_size = 128;
    c.model.num_attention_heads = 4;
    c.model.ffn_hidden_size = 512;
    c.model.vocab_size = 257;
    c.model.seq_length = c.model.max_position_embeddings = 64;
    c.training.global_batch_size = 16;
    c.training.micro_batch_size = 2;
    c.parallel.ddp_bucket_size = 20000;
    for (int pp : {1, 2, 4}) {
        tpd_plan_layout l = {1, pp, 8 / pp, 2, 1, TPD_RECOMPUTE_NONE, 0, 1, TPD_SCHEDULE_1F1B,
                             0, 0};
        tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
        opt.gpus = 8;
        opt.balance_stages = 0;
        tpd_plan_result off, on;
        ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &l, &opt, &off), TPD_OK);
        l.overlap_grad_reduce = l.overlap_param_gather = 1;
        ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &l, &opt, &on), TPD_OK);
        EXPECT_LE(on.step_time_s, off.step_time_s + 1e-15) << "PP " << pp;
        EXPECT_LT(on.time.dp_comm_exposed + on.time.dp_gather_exposed,
                  off.time.dp_comm_exposed + off.time.dp_gather_exposed)
            << "PP " << pp;
        EXPECT_NEAR(on.time.dp_comm_total, off.time.dp_comm_total, 1e-12);
    }
}

} // namespace
