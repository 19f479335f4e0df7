// The planner's pipeline against the schedules the trainer runs: the in-flight counts of
// its memory model against the action lists' peaks, the simulated bubble and idle fraction
// against the published formulas when all stages are equal, ZB-H1 against 1F1B on a real
// model, and the layout's validity against what the config loader rejects.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "plan_test_util.h"

extern "C" {
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"
#include "parallel/pipeline/schedule.h"
}

using namespace plan_test;

namespace {

tpd_pp_kind kind_of(tpd_schedule s) {
    return s == TPD_SCHEDULE_ZB_H1         ? TPD_PP_KIND_ZB_H1
           : s == TPD_SCHEDULE_INTERLEAVED ? TPD_PP_KIND_INTERLEAVED
                                           : TPD_PP_KIND_1F1B;
}

// The closed form of the memory model equals the peak of the very list the executor walks,
// for every schedule, stage, micro-batch count and v; and the last stage's head holds one
// micro-batch of its last chunk at a time (the cpu memory model's one head block).
TEST(PlanSchedule, InFlightClosedFormIsTheListPeak) {
    int checked = 0;
    for (tpd_schedule sch : {TPD_SCHEDULE_1F1B, TPD_SCHEDULE_ZB_H1, TPD_SCHEDULE_INTERLEAVED})
        for (int p = 1; p <= 6; p++)
            for (int v = 1; v <= (sch == TPD_SCHEDULE_INTERLEAVED ? 4 : 1); v++)
                for (int M = 1; M <= 13; M++) {
                    if (sch == TPD_SCHEDULE_INTERLEAVED && (v < 2 || p < 2 || M % p)) continue;
                    for (int s = 0; s < p; s++) {
                        tpd_pp_schedule l;
                        ASSERT_EQ(tpd_pp_schedule_make(kind_of(sch), p, s, M, v, &l), TPD_OK);
                        EXPECT_EQ(tpd_plan_in_flight(p, s, M, v, sch),
                                  tpd_pp_schedule_peak_in_flight(&l))
                            << tpd_config_choice("parallel.pipeline_schedule", sch) << " p " << p
                            << " stage " << s << " M " << M << " v " << v;
                        if (s == p - 1)
                            EXPECT_EQ(tpd_pp_schedule_peak_in_flight_chunk(&l, v - 1), 1);
                        tpd_pp_schedule_free(&l);
                        checked++;
                    }
                }
    EXPECT_GT(checked, 500);
}

tpd_plan_layout pipe_layout(int pp, int v, tpd_schedule s) {
    tpd_plan_layout l = {1, pp, 1, 1, v, TPD_RECOMPUTE_NONE, 0, 0, s, 1, 1};
    return l;
}

// Every stage equal, p2p free: the simulated bubble is the schedules' formula, per
// micro-batch times (f, b the whole stage's forward and backward, W of b under ZB-H1):
//   1F1B (p-1)(f+b); interleaved (p-1)(f+b)/v;
//   ZB-H1 (p-1)(f + B - W), B = b - W, while W <= f (Qi et al.: the W's fill what would
//   otherwise idle; with T_F = T_B = T_W it is a third of 1F1B's). Past that, W cannot fill
//   the last stage's wait for the first forward, nor stage 0's for the first B: the bubble
//   is (p-1) max(f + B - W, B, f).
TEST(PlanSchedule, EqualStagesGiveThePublishedBubbles) {
    const double f = 1.0, b = 2.0;
    for (int p : {2, 3, 4, 8}) {
        for (int M : {8, 16, 24}) {
            for (double w : {0.3, 0.9, 1.0, 1.4, 1.8}) {
                std::vector<tpd_pp_sim_times> t(p, tpd_pp_sim_times{f, b, 0.0, 0.0});
                tpd_plan_pipe one, zb;
                tpd_plan_layout l1 = pipe_layout(p, 1, TPD_SCHEDULE_1F1B);
                ASSERT_EQ(tpd_plan_pipe_simulate(&l1, M, t.data(), &one), TPD_OK);
                EXPECT_NEAR(one.makespan - M * (f + b), (p - 1) * (f + b), 1e-9);
                for (auto &x : t)
                    x.wgrad = w;
                tpd_plan_layout lz = pipe_layout(p, 1, TPD_SCHEDULE_ZB_H1);
                ASSERT_EQ(tpd_plan_pipe_simulate(&lz, M, t.data(), &zb), TPD_OK);
                double B = b - w;
                EXPECT_NEAR(zb.makespan - M * (f + b), (p - 1) * std::max({f + B - w, B, f}), 1e-9)
                    << "p " << p << " M " << M << " W " << w;
                if (w <= f) EXPECT_NEAR(zb.makespan - M * (f + b), (p - 1) * (f + B - w), 1e-9);
                EXPECT_LT(zb.makespan, one.makespan);
                tpd_plan_pipe_free(&one);
                tpd_plan_pipe_free(&zb);
            }
            for (int v : {2, 3}) {
                if (M % p) continue;
                // per (micro-batch, chunk): a chunk holds 1/v of the stage
                std::vector<tpd_pp_sim_times> t(p, tpd_pp_sim_times{f / v, b / v, 0.0, 0.0});
                tpd_plan_layout li = pipe_layout(p, v, TPD_SCHEDULE_INTERLEAVED);
                tpd_plan_pipe il;
                ASSERT_EQ(tpd_plan_pipe_simulate(&li, M, t.data(), &il), TPD_OK);
                EXPECT_NEAR(il.makespan - M * (f + b), (p - 1) * (f + b) / v, 1e-9)
                    << "p " << p << " M " << M << " v " << v;
                tpd_plan_pipe_free(&il);
            }
        }
    }
}

// The idle fraction is the trainer's measure: 1 - compute / pipeline time summed over the
// ranks, each rank's pipeline ending with its own last action. Under 1F1B with equal stages
// stage s ends s backwards before stage 0, whose end is the makespan (M+p-1)(f+b).
TEST(PlanSchedule, IdleFractionIsTheTrainersMeasure) {
    const double f = 1.0, b = 2.0;
    for (int p : {2, 4, 8})
        for (int M : {4, 8, 32}) {
            std::vector<tpd_pp_sim_times> t(p, tpd_pp_sim_times{f, b, 0.0, 0.0});
            tpd_plan_layout l = pipe_layout(p, 1, TPD_SCHEDULE_1F1B);
            tpd_plan_pipe r;
            ASSERT_EQ(tpd_plan_pipe_simulate(&l, M, t.data(), &r), TPD_OK);
            double mk = (M + p - 1) * (f + b), total = 0;
            for (int s = 0; s < p; s++) {
                EXPECT_NEAR(r.end[s], mk - s * b, 1e-9) << "stage " << s;
                EXPECT_NEAR(r.busy[s], M * (f + b), 1e-9);
                total += mk - s * b;
            }
            EXPECT_NEAR(r.idle_fraction, 1.0 - p * M * (f + b) / total, 1e-12);
            // below (p-1)/(M+p-1), which charges every stage the whole makespan
            EXPECT_LT(r.idle_fraction, (p - 1.0) / (M + p - 1.0));
            tpd_plan_pipe_free(&r);
        }
}

// The planner's bubble on a real model: every stage's own times, so the published share
// (p-1)/(m v) of the slowest stage's compute is an upper bound (raising every stage to
// the slowest gives it exactly), and the fastest-to-slowest ratio of it a lower one (the
// slowest stage, the head's, waits for the first micro-batch through the others).
TEST(PlanSchedule, PlannerBubbleLiesBetweenTheFormulaBounds) {
    tpd_plan_cluster cl = a100();
    struct Case {
        int pp, v, gbs;
    } cases[] = {{8, 1, 64}, {8, 2, 64}, {4, 3, 32}, {16, 1, 128}, {16, 2, 256}};
    for (const Case &k : cases) {
        tpd_config c = gpt(96, 12288, 96, k.gbs, 1);
        tpd_plan_layout lay = {8, k.pp, 1,
                               1, k.v,  TPD_RECOMPUTE_SELECTIVE,
                               1, 0,    k.v > 1 ? TPD_SCHEDULE_INTERLEAVED : TPD_SCHEDULE_1F1B,
                               1, 1};
        tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
        opt.gpus = 8 * k.pp;
        tpd_plan_result r;
        ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lay, &opt, &r), TPD_OK);
        ASSERT_GT(r.step_time_s, 0) << r.reject_reason;
        double lo = 1e300, hi = 0;
        for (int s = 0; s < k.pp; s++) {
            double f, b, comm;
            tpd_plan_stage_time(&c, &cl, &lay, s, &f, &b, &comm);
            lo = std::min(lo, f + b);
            hi = std::max(hi, f + b);
        }
        double formula = (k.pp - 1) / ((double)k.gbs * k.v),
               share = r.time.pp_bubble / r.time.compute;
        EXPECT_LE(share, formula + 1e-9) << "pp=" << k.pp << " v=" << k.v;
        EXPECT_GE(share, formula * lo / hi - 1e-9) << "pp=" << k.pp << " v=" << k.v;
        EXPECT_LT(lo, hi); // the ends differ: the bound is not the formula itself
        EXPECT_GT(r.time.pp_p2p, 0.0);
    }
}

// ZB-H1 against 1F1B on the same layout: W's share fills the bubble, and its W share of the
// backward is the four linear layers' weight gradients (half the GEMM work of the backward).
// Under sequence parallelism the split costs two more all-gathers per layer (W gathers
// d(out) and d(x1) again), which the planner charges.
TEST(PlanSchedule, ZbH1BubbleIsBelow1F1BOnARealModel) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(32, 4096, 32, 64, 1);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 64;
    opt.balance_stages = 0;
    tpd_plan_layout l1 = {8, 8, 1, 1, 1, TPD_RECOMPUTE_SELECTIVE, 0, 0, TPD_SCHEDULE_1F1B, 0, 0};
    tpd_plan_layout lz = l1;
    lz.schedule = TPD_SCHEDULE_ZB_H1;
    tpd_plan_result one, zb;
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &l1, &opt, &one), TPD_OK);
    ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lz, &opt, &zb), TPD_OK);
    ASSERT_TRUE(one.fits && zb.fits) << one.reject_reason << zb.reject_reason;
    // (p-1)(f + B - W) against (p-1)(f + b) with W about 0.4 b and b about 2 f, the ends'
    // imbalance aside
    EXPECT_LT(zb.time.pp_bubble, 0.75 * one.time.pp_bubble);
    EXPECT_LT(zb.step_time_s, one.step_time_s);
    EXPECT_LT(zb.time.pp_idle_fraction, one.time.pp_idle_fraction);
    // W is part of B+W, and a third to a half of it (the weight GEMMs of a backward that
    // also holds the input GEMMs, attention and elementwise work)
    double w = tpd_plan_stage_wgrad_time(&c, &cl, &lz, 3);
    double f, b, comm;
    tpd_plan_stage_time(&c, &cl, &lz, 3, &f, &b, &comm);
    EXPECT_GT(w, 0.2 * b);
    EXPECT_LT(w, 0.5 * b);
    EXPECT_DOUBLE_EQ(zb.t_wgrad_chunk, zb.stage_times[7].wgrad);
    EXPECT_EQ(one.t_wgrad_chunk, 0.0);
    // ZB-H1 holds p micro-batches on every stage: the last stage's activations grow
    EXPECT_GT(zb.mem[7].activations, 4 * one.mem[7].activations);
    EXPECT_DOUBLE_EQ(zb.mem[0].activations, one.mem[0].activations);
    // the split's price under SP: more backward, W's share includes its gathers
    tpd_plan_layout s1 = l1, sz = lz;
    s1.sequence_parallel = sz.sequence_parallel = 1;
    double f1, b1, fz, bz;
    tpd_plan_stage_time(&c, &cl, &s1, 3, &f1, &b1, &comm);
    tpd_plan_stage_time(&c, &cl, &sz, 3, &fz, &bz, &comm);
    EXPECT_DOUBLE_EQ(f1, fz);
    EXPECT_GT(bz, b1);
    EXPECT_GT(tpd_plan_stage_wgrad_time(&c, &cl, &sz, 3), w);
}

// What the config loader and the world check reject, the planner rejects, saying why.
TEST(PlanSchedule, InvalidScheduleLayoutsExplainWhy) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(32, 4096, 32, 64, 1);
    char why[192];
    struct Case {
        tpd_plan_layout l;
        int gpus;
        const char *reason;
    } cases[] = {
        {{8, 4, 2, 1, 2, TPD_RECOMPUTE_NONE, 0, 0, TPD_SCHEDULE_ZB_H1, 1, 1},
         64,
         "zb-h1 with v=2 (zb-h1 runs one model chunk per stage)"},
        {{8, 4, 2, 1, 1, TPD_RECOMPUTE_FULL, 0, 0, TPD_SCHEDULE_ZB_H1, 1, 1},
         64,
         "zb-h1 with recompute full (W needs the activations full recompute drops)"},
        {{8, 4, 2, 1, 1, TPD_RECOMPUTE_NONE, 0, 0, TPD_SCHEDULE_INTERLEAVED, 1, 1},
         64,
         "interleaved with v=1 (it needs virtual stages)"},
        {{8, 1, 8, 1, 2, TPD_RECOMPUTE_NONE, 0, 0, TPD_SCHEDULE_INTERLEAVED, 1, 1},
         64,
         "interleaving (v=2) needs PP > 1"},
        {{8, 4, 2, 1, 3, TPD_RECOMPUTE_NONE, 0, 0, TPD_SCHEDULE_INTERLEAVED, 1, 1},
         64,
         "layers 32 not divisible by PP*v 4*3"},
        // 64 / (4 * 2) = 8 micro-batches, not a multiple of PP 16 when interleaved
        {{4, 16, 2, 4, 2, TPD_RECOMPUTE_NONE, 0, 0, TPD_SCHEDULE_INTERLEAVED, 1, 1},
         128,
         "micro-batches 8 not divisible by PP 16 (interleaved schedule)"},
        {{8, 64, 1, 1, 8, TPD_RECOMPUTE_NONE, 0, 0, TPD_SCHEDULE_INTERLEAVED, 1, 1},
         512,
         "PP*v 64*8 is more than 256 virtual stages"},
    };
    for (const Case &k : cases) {
        EXPECT_FALSE(tpd_plan_layout_valid(&c, &cl, &k.l, k.gpus, why, sizeof why)) << k.reason;
        EXPECT_STREQ(why, k.reason);
    }
    // the config lists every virtual stage: uneven chunks are fine
    c.parallel.num_pipeline_layers = 12;
    int list[12] = {3, 3, 3, 3, 2, 3, 3, 3, 3, 3, 2, 1};
    for (int i = 0; i < 12; i++)
        c.parallel.pipeline_layers[i] = list[i];
    tpd_plan_layout ok = {8, 4, 2, 1, 3, TPD_RECOMPUTE_NONE, 0, 0, TPD_SCHEDULE_INTERLEAVED, 1, 1};
    EXPECT_TRUE(tpd_plan_layout_valid(&c, &cl, &ok, 64, why, sizeof why)) << why;
    // stage s holds the virtual stages s, s + PP, s + 2 PP
    EXPECT_EQ(tpd_plan_stage_layers(&c, &ok, 0), 3 + 2 + 3);
    EXPECT_EQ(tpd_plan_stage_layers(&c, &ok, 3), 3 + 3 + 1);
    EXPECT_EQ(tpd_plan_chunk_layers(&c, &ok, 3, 2), 1);
}

// The overrides the planner prints train what it timed: loaded through the config loader
// (every relation check of `tripod train`) and the world check, they give back the layout,
// its schedule, its overlap flags and its split (per virtual stage when balanced).
TEST(PlanSchedule, OverridesTrainWhatThePlannerTimed) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("h200", &cl), TPD_OK);
    // Llama 3's vocabulary makes the head's stage worth fewer layers: balanced splits
    std::vector<std::string> model = {
        "model.num_layers=24",     "model.hidden_size=2048", "model.num_attention_heads=16",
        "model.vocab_size=128256", "model.seq_length=4096",  "training.global_batch_size=512",
        "training.precision=bf16", "training.device=cuda",   "model.max_position_embeddings=4096"};
    std::vector<const char *> mv;
    for (auto &x : model)
        mv.push_back(x.c_str());
    tpd_config c;
    ASSERT_EQ(tpd_config_load(nullptr, (int)mv.size(), mv.data(), &c), TPD_OK) << tpd_last_error();
    struct Case {
        tpd_plan_layout l;
        bool balanced;
    } cases[] = {
        {{1, 4, 8, 1, 2, TPD_RECOMPUTE_NONE, 0, 0, TPD_SCHEDULE_INTERLEAVED, 1, 1}, true},
        {{1, 4, 8, 1, 3, TPD_RECOMPUTE_NONE, 0, 1, TPD_SCHEDULE_INTERLEAVED, 0, 1}, true},
        {{1, 4, 8, 1, 1, TPD_RECOMPUTE_SELECTIVE, 0, 1, TPD_SCHEDULE_ZB_H1, 1, 0}, true},
        {{2, 4, 4, 2, 1, TPD_RECOMPUTE_FULL, 1, 1, TPD_SCHEDULE_1F1B, 1, 1}, false},
    };
    for (const Case &k : cases) {
        tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
        opt.gpus = 32;
        tpd_plan_result r;
        ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &k.l, &opt, &r), TPD_OK);
        ASSERT_GT(r.stages, 0) << r.reject_reason;
        if (k.balanced) EXPECT_TRUE(r.balanced) << "v " << k.l.virtual_stages;
        char ov[4096];
        ASSERT_GT(tpd_plan_overrides(&c, &r, ov, sizeof ov), 10);
        std::vector<std::string> all = model;
        for (char *save = nullptr, *t = strtok_r(ov, " ", &save); t;
             t = strtok_r(nullptr, " ", &save))
            all.push_back(t);
        std::vector<const char *> av;
        for (auto &x : all)
            av.push_back(x.c_str());
        tpd_config t;
        ASSERT_EQ(tpd_config_load(nullptr, (int)av.size(), av.data(), &t), TPD_OK)
            << tpd_last_error();
        ASSERT_EQ(tpd_config_check_world(&t, 32), TPD_OK) << tpd_last_error();
        tpd_plan_layout back;
        tpd_plan_layout_from_config(&t, 32, &back);
        const tpd_plan_layout &l = r.layout;
        EXPECT_EQ(back.tp, l.tp);
        EXPECT_EQ(back.pp, l.pp);
        EXPECT_EQ(back.dp, l.dp);
        EXPECT_EQ(back.micro_batch_size, l.micro_batch_size);
        EXPECT_EQ(back.virtual_stages, l.virtual_stages);
        EXPECT_EQ(tpd_plan_layout_schedule(&back), tpd_plan_layout_schedule(&l));
        EXPECT_EQ(back.recompute, l.recompute);
        EXPECT_EQ(back.sequence_parallel, l.sequence_parallel);
        EXPECT_EQ(back.distributed_optimizer, l.distributed_optimizer);
        EXPECT_EQ(back.overlap_grad_reduce, l.overlap_grad_reduce);
        EXPECT_EQ(back.overlap_param_gather, l.overlap_param_gather);
        for (int s = 0; s < l.pp; s++) {
            EXPECT_EQ(tpd_config_stage_layers(&t, l.pp, l.virtual_stages, s, TPD_CONFIG_ALL_CHUNKS,
                                              nullptr),
                      r.stage_layers[s]);
            for (int ch = 0; ch < l.virtual_stages; ch++)
                EXPECT_EQ(tpd_config_stage_layers(&t, l.pp, l.virtual_stages, s, ch, nullptr),
                          r.chunk_layers[ch * l.pp + s]);
        }
        // and the planner, asked about the config that trains it, predicts the same step
        opt.balance_stages = 0;
        tpd_plan_result again;
        ASSERT_EQ(tpd_plan_evaluate(&t, &cl, &back, &opt, &again), TPD_OK);
        EXPECT_DOUBLE_EQ(again.step_time_s, r.step_time_s);
        EXPECT_DOUBLE_EQ(again.memory_bytes, r.memory_bytes);
    }
}

// The search skips a layout when a lower bound of its step is already slower than the K-th
// best: the bound must never exceed the step the full model predicts, under every schedule
// and overlap setting, with and without CP; with the pipeline's fill and drain in it (the
// first micro-batch's way forward to a stage and its gradient's way back) it comes within
// 10% of the step, so that it prunes.
TEST(PlanSchedule, LowerBoundNeverExceedsTheStep) {
    tpd_plan_cluster cl = a100();
    tpd_config c = gpt(32, 4096, 32, 256, 1);
    c.parallel.ddp_bucket_size = 5000000;
    int n = 0;
    for (int pp : {1, 2, 4, 8})
        for (int v : {1, 2})
            for (tpd_schedule sch : {TPD_SCHEDULE_1F1B, TPD_SCHEDULE_ZB_H1})
                for (int zero : {0, 1})
                    for (int ovl : {0, 1}) {
                        if (v > 1 && (pp == 1 || sch == TPD_SCHEDULE_ZB_H1)) continue;
                        tpd_plan_layout l = {8,   pp,   64 / (8 * pp),
                                             1,   v,    TPD_RECOMPUTE_SELECTIVE,
                                             1,   zero, v > 1 ? TPD_SCHEDULE_INTERLEAVED : sch,
                                             ovl, ovl};
                        for (int cp : {1, 2}) { // CP takes ranks from DP
                            if (l.dp % cp) continue;
                            tpd_plan_layout lc = l;
                            lc.cp = cp;
                            lc.dp = l.dp / cp;
                            tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
                            opt.gpus = 64;
                            tpd_plan_result r;
                            ASSERT_EQ(tpd_plan_evaluate(&c, &cl, &lc, &opt, &r), TPD_OK);
                            ASSERT_GT(r.stages, 0) << r.reject_reason;
                            tpd_config scratch;
                            const tpd_config *rc = tpd_plan_result_config(&c, &r, &scratch);
                            double lb = tpd_plan_time_lower_bound(rc, &cl, &r, &opt);
                            EXPECT_GT(lb, 0.9 * r.step_time_s);
                            EXPECT_LE(lb, r.step_time_s * (1 + 1e-12))
                                << "pp " << pp << " v " << v << " zero " << zero << " overlap "
                                << ovl << " schedule " << sch << " cp " << cp;
                            n++;
                        }
                    }
    EXPECT_GT(n, 50);
}

// recompute_num_layers counts the layers of each model chunk (Megatron's block method per
// chunk): with v chunks a stage recomputes v times as many.
TEST(PlanSchedule, BlockRecomputeCountsPerChunk) {
    tpd_config c = gpt(32, 4096, 24, 64, 1);
    c.training.recompute_num_layers = 1;
    tpd_plan_layout l = {8, 4, 2, 1, 2, TPD_RECOMPUTE_FULL, 0, 0, TPD_SCHEDULE_INTERLEAVED, 1, 1};
    EXPECT_EQ(tpd_plan_recomputed_layers(&c, &l, 0), 2);
    l.virtual_stages = 3;
    EXPECT_EQ(tpd_plan_recomputed_layers(&c, &l, 2), 3);
    c.training.recompute_num_layers = 0; // all of them
    EXPECT_EQ(tpd_plan_recomputed_layers(&c, &l, 2), 6);
}

} // namespace
