// Pipeline schedules: structure of the action lists and the simulated bubble.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <vector>

extern "C" {
#include "parallel/pipeline/schedule.h"
}

namespace {

struct Pipeline {
    std::vector<tpd_pp_schedule> s;
    Pipeline(int p, int m, int v, tpd_pp_kind kind = TPD_PP_KIND_1F1B) : s(p) {
        if (v > 1) kind = TPD_PP_KIND_INTERLEAVED;
        for (int i = 0; i < p; i++) {
            tpd_status st = tpd_pp_schedule_make(kind, p, i, m, v, &s[i]);
            EXPECT_EQ(st, TPD_OK) << "p=" << p << " stage=" << i << " m=" << m;
        }
    }
    ~Pipeline() {
        for (auto &x : s)
            tpd_pp_schedule_free(&x);
    }
};

// The same durations on every stage.
std::vector<tpd_pp_sim_times> times(int p, double tf, double tb, double p2p = 0.0,
                                    double tw = 0.0) {
    return std::vector<tpd_pp_sim_times>(p, tpd_pp_sim_times{tf, tb, tw, p2p});
}

// Every (micro-batch, chunk) runs FWD exactly once and later BWD exactly once; every
// compute is preceded by its receive and followed by its send, except where the
// virtual stage is the first (no RECV_ACT / SEND_GRAD) or the last (no SEND_ACT /
// RECV_GRAD).
void check_structure(const tpd_pp_schedule &sc, int p, int m, int v) {
    std::vector<int> fwd(m * v, 0), bwd(m * v, 0), wgt(m * v, 0);
    for (int i = 0; i < sc.count; i++) {
        const tpd_pp_action &a = sc.actions[i];
        ASSERT_GE(a.micro_batch, 0);
        ASSERT_LT(a.micro_batch, m);
        ASSERT_GE(a.chunk, 0);
        ASSERT_LT(a.chunk, v);
        int id = a.micro_batch * v + a.chunk;
        bool first = sc.stage == 0 && a.chunk == 0;
        bool last = sc.stage == p - 1 && a.chunk == v - 1;
        if (a.kind == TPD_PP_FWD) {
            EXPECT_EQ(fwd[id], 0) << "double FWD mb " << a.micro_batch;
            fwd[id]++;
            if (!first) {
                ASSERT_GT(i, 0);
                EXPECT_EQ(sc.actions[i - 1].kind, TPD_PP_RECV_ACT);
                EXPECT_EQ(sc.actions[i - 1].micro_batch, a.micro_batch);
            }
            if (!last) {
                ASSERT_LT(i + 1, sc.count);
                EXPECT_EQ(sc.actions[i + 1].kind, TPD_PP_SEND_ACT);
            }
        } else if (a.kind == TPD_PP_BWD) {
            EXPECT_EQ(fwd[id], 1) << "BWD before FWD, mb " << a.micro_batch;
            EXPECT_EQ(bwd[id], 0) << "double BWD mb " << a.micro_batch;
            bwd[id]++;
            if (!last) EXPECT_EQ(sc.actions[i - 1].kind, TPD_PP_RECV_GRAD);
            if (!first) EXPECT_EQ(sc.actions[i + 1].kind, TPD_PP_SEND_GRAD);
        } else if (a.kind == TPD_PP_WGRAD) {
            EXPECT_TRUE(sc.split_backward) << "W in a list without a split backward";
            EXPECT_EQ(bwd[id], 1) << "W before B, mb " << a.micro_batch;
            EXPECT_EQ(wgt[id], 0) << "double W mb " << a.micro_batch;
            wgt[id]++;
        } else if (a.kind == TPD_PP_RECV_ACT || a.kind == TPD_PP_SEND_GRAD) {
            EXPECT_FALSE(first) << "stage 0 chunk 0 has no previous stage";
        } else {
            EXPECT_FALSE(last) << "last stage's last chunk has no next stage";
        }
    }
    for (int id = 0; id < m * v; id++) {
        EXPECT_EQ(fwd[id], 1);
        EXPECT_EQ(bwd[id], 1);
        EXPECT_EQ(wgt[id], sc.split_backward ? 1 : 0);
    }
}

TEST(Schedule, OneFOneBStructureAndBubbleForAllSmallPipelines) {
    for (int p = 1; p <= 8; p++) {
        for (int m = 1; m <= 32; m++) {
            Pipeline pl(p, m, 1);
            for (int s = 0; s < p; s++) {
                SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m << " s=" << s);
                check_structure(pl.s[s], p, m, 1);
                int peak = tpd_pp_schedule_peak_in_flight(&pl.s[s]);
                EXPECT_LE(peak, p - s);
                EXPECT_EQ(peak, std::min(p - s, m));
            }
            // t_bwd = 2 t_fwd, free p2p: the idle fraction of the step is exactly
            // (p-1)/(m+p-1), i.e. (p-1)/m of the ideal compute time.
            tpd_pp_sim_result r;
            const double tf = 1.5, tb = 3.0;
            ASSERT_EQ(
                tpd_pp_simulate(pl.s.data(), p, times(p, tf, tb).data(), nullptr, nullptr, &r),
                TPD_OK);
            EXPECT_NEAR(r.idle_fraction, double(p - 1) / double(m + p - 1), 1e-12)
                << "p=" << p << " m=" << m;
            EXPECT_NEAR(r.makespan, (m + p - 1) * (tf + tb), 1e-9);
            EXPECT_NEAR(r.busy_total, p * m * (tf + tb), 1e-9);
        }
    }
}

TEST(Schedule, OneFOneBWarmupCount) {
    // Stage s of p runs min(p-s-1, m) forwards before its first backward.
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 12; m++) {
            Pipeline pl(p, m, 1);
            for (int s = 0; s < p; s++) {
                int fwd = 0;
                for (int i = 0; i < pl.s[s].count; i++) {
                    if (pl.s[s].actions[i].kind == TPD_PP_BWD) break;
                    fwd += pl.s[s].actions[i].kind == TPD_PP_FWD;
                }
                EXPECT_EQ(fwd, std::min(p - s - 1, m) + (p - s - 1 < m ? 1 : 0));
                EXPECT_EQ(pl.s[s].actions[0].chunk, 0);
            }
        }
}

TEST(Schedule, SimulatorReportsTimesAndP2PDelays) {
    // Two stages, one micro-batch: FWD0, send, (p2p), FWD1, BWD1, send, (p2p), BWD0.
    Pipeline pl(2, 1, 1);
    std::vector<double *> start(2, nullptr), end(2, nullptr);
    tpd_pp_sim_result r;
    ASSERT_EQ(tpd_pp_simulate(pl.s.data(), 2, times(2, 1.0, 2.0, 0.25).data(), start.data(),
                              end.data(), &r),
              TPD_OK);
    EXPECT_NEAR(r.makespan, 1 + 0.25 + 1 + 2 + 0.25 + 2, 1e-12);
    // Stage 1's BWD ends at 1 + 0.25 + 1 + 2.
    for (int i = 0; i < pl.s[1].count; i++)
        if (pl.s[1].actions[i].kind == TPD_PP_BWD) {
            EXPECT_NEAR(end[1][i], 4.25, 1e-12);
            EXPECT_NEAR(start[1][i], 2.25, 1e-12);
        }
    for (int s = 0; s < 2; s++) {
        free(start[s]);
        free(end[s]);
    }
}

TEST(Schedule, SimulatorDetectsDeadlock) {
    // Drop stage 0's SEND_ACTs: stage 1's first RECV_ACT can never complete, and stage 0
    // then waits for a gradient that never comes.
    Pipeline pl(2, 2, 1);
    tpd_pp_schedule &s0 = pl.s[0];
    int w = 0;
    for (int i = 0; i < s0.count; i++)
        if (s0.actions[i].kind != TPD_PP_SEND_ACT) s0.actions[w++] = s0.actions[i];
    s0.count = w;
    tpd_pp_sim_result r;
    EXPECT_EQ(tpd_pp_simulate(pl.s.data(), 2, times(2, 1.0, 2.0).data(), nullptr, nullptr, &r),
              TPD_ERR_INTERNAL);
}

TEST(Schedule, InterleavedRejectsMicroBatchesNotMultipleOfStages) {
    tpd_pp_schedule s;
    EXPECT_EQ(tpd_pp_schedule_interleaved(4, 0, 6, 2, &s), TPD_ERR_INVALID);
}

// Interleaved: with per-chunk times t_f/v and t_b/v (the stage's layers split into v
// chunks) and free p2p, every stage is busy m*(t_f+t_b), and its idle time (makespan
// minus busy) divided by that ideal compute time is (p-1)/(m*v), Narayanan et al.'s
// bubble fraction. Asserted for p in {2,4,8}, v in {2,3,4}, m = p, 2p, ..., 32.
TEST(Schedule, InterleavedStructureAndBubble) {
    for (int p : {2, 4, 8})
        for (int v : {2, 3, 4})
            for (int m = p; m <= 32; m += p) {
                SCOPED_TRACE(testing::Message() << "p=" << p << " v=" << v << " m=" << m);
                Pipeline pl(p, m, v);
                for (int s = 0; s < p; s++) {
                    check_structure(pl.s[s], p, m, v);
                    int peak = tpd_pp_schedule_peak_in_flight(&pl.s[s]);
                    int warm = std::min((p - s - 1) * 2 + (v - 1) * p, m * v);
                    EXPECT_EQ(peak, std::min(warm + 1, m * v));
                }
                const double tf = 1.0, tb = 2.0;
                tpd_pp_sim_result r;
                ASSERT_EQ(tpd_pp_simulate(pl.s.data(), p, times(p, tf / v, tb / v).data(), nullptr,
                                          nullptr, &r),
                          TPD_OK);
                double ideal = m * (tf + tb);
                EXPECT_NEAR(r.busy_total, p * ideal, 1e-9);
                double bubble = (r.makespan - ideal) / ideal;
                EXPECT_NEAR(bubble, double(p - 1) / double(m * v), 1e-12);
            }
}

TEST(Schedule, InterleavedChunkOrderMatchesMegatron) {
    // p=2, v=2, m=4, stage 0: forwards walk mb 0,1 on chunk 0, then 0,1 on chunk 1, then
    // 2,3 on chunk 0 ...; backwards start on the last chunk.
    Pipeline pl(2, 4, 2);
    std::vector<std::pair<int, int>> f, b;
    for (int i = 0; i < pl.s[0].count; i++) {
        const tpd_pp_action &a = pl.s[0].actions[i];
        if (a.kind == TPD_PP_FWD) f.push_back({a.micro_batch, a.chunk});
        if (a.kind == TPD_PP_BWD) b.push_back({a.micro_batch, a.chunk});
    }
    std::vector<std::pair<int, int>> ef = {{0, 0}, {1, 0}, {0, 1}, {1, 1},
                                           {2, 0}, {3, 0}, {2, 1}, {3, 1}};
    std::vector<std::pair<int, int>> eb = {{0, 1}, {1, 1}, {0, 0}, {1, 0},
                                           {2, 1}, {3, 1}, {2, 0}, {3, 0}};
    EXPECT_EQ(f, ef);
    EXPECT_EQ(b, eb);
}

// The executor's send completions: stage 0 receives mb 1's gradient before mb 0's. Stage
// 1's BWD of mb 1 waits for its previous gradient send (mb 0) to be received, which stage 0
// posts only after mb 1's gradient has arrived: a deadlock that blocking receives alone
// would not show.
TEST(Schedule, SimulatorDetectsDeadlockOnSendCompletion) {
    Pipeline pl(2, 2, 1);
    tpd_pp_schedule &s0 = pl.s[0];
    std::vector<tpd_pp_action> a = {{TPD_PP_FWD, 0, 0},       {TPD_PP_SEND_ACT, 0, 0},
                                    {TPD_PP_FWD, 1, 0},       {TPD_PP_SEND_ACT, 1, 0},
                                    {TPD_PP_RECV_GRAD, 1, 0}, {TPD_PP_BWD, 1, 0},
                                    {TPD_PP_RECV_GRAD, 0, 0}, {TPD_PP_BWD, 0, 0}};
    ASSERT_LE((int)a.size(), s0.count);
    for (size_t i = 0; i < a.size(); i++)
        s0.actions[i] = a[i];
    s0.count = (int)a.size();
    tpd_pp_sim_result r;
    EXPECT_EQ(tpd_pp_simulate(pl.s.data(), 2, times(2, 1.0, 2.0).data(), nullptr, nullptr, &r),
              TPD_ERR_INTERNAL);
}

// A backward waits until its stage's previous gradient send has been received: with two
// stages and one micro-batch nothing waits, but a slow receiver delays the sender's next
// backward (p2p of 5 makes stage 0's receive of mb 0 end at 5 + ... ).
TEST(Schedule, BackwardWaitsForThePreviousGradientSend) {
    Pipeline pl(2, 2, 1);
    std::vector<double *> start(2, nullptr), end(2, nullptr);
    tpd_pp_sim_result r;
    const double tf = 1.0, tb = 2.0, p2p = 5.0;
    ASSERT_EQ(
        tpd_pp_simulate(pl.s.data(), 2, times(2, tf, tb, p2p).data(), start.data(), end.data(), &r),
        TPD_OK);
    // stage 1: RECV_ACT 0 (arrives 1+5), FWD 0, BWD 0 (ends 9), SEND_GRAD 0 at 9, RECV_ACT 1
    // (sent at 2, arrives 7), FWD 1 (9..10), then BWD 1 waits for the gradient of mb 0 to
    // reach stage 0 (posted at 2, data at 9 + 5 = 14).
    const tpd_pp_schedule &s1 = pl.s[1];
    int bwd = 0;
    for (int i = 0; i < s1.count; i++)
        if (s1.actions[i].kind == TPD_PP_BWD && bwd++ == 1) EXPECT_NEAR(start[1][i], 14.0, 1e-12);
    EXPECT_EQ(bwd, 2);
    for (int s = 0; s < 2; s++) {
        free(start[s]);
        free(end[s]);
    }
}

// NCCL has no tags: every list must send to each peer in the order the peer receives.
TEST(Schedule, EveryListSendsInTheOrderThePeerReceives) {
    struct Kind {
        tpd_pp_kind k;
        int v;
    };
    for (Kind kd : {Kind{TPD_PP_KIND_1F1B, 1}, Kind{TPD_PP_KIND_ZB_H1, 1},
                    Kind{TPD_PP_KIND_INTERLEAVED, 2}, Kind{TPD_PP_KIND_INTERLEAVED, 3}})
        for (int p = 2; p <= 6; p++)
            for (int m = p; m <= 4 * p; m += p) {
                SCOPED_TRACE(testing::Message()
                             << "kind=" << kd.k << " v=" << kd.v << " p=" << p << " m=" << m);
                Pipeline pl(p, m, kd.v, kd.k);
                // (from, to) -> messages (is_grad, mb, receiving chunk) in order
                std::vector<std::vector<std::vector<std::array<int, 3>>>> sent(
                    p, std::vector<std::vector<std::array<int, 3>>>(p)),
                    recvd = sent;
                for (int s = 0; s < p; s++)
                    for (int i = 0; i < pl.s[s].count; i++) {
                        const tpd_pp_action &a = pl.s[s].actions[i];
                        int nx = (s + 1) % p, pv = (s + p - 1) % p;
                        switch (a.kind) {
                        case TPD_PP_SEND_ACT:
                            sent[s][nx].push_back(
                                {0, a.micro_batch, s == p - 1 ? a.chunk + 1 : a.chunk});
                            break;
                        case TPD_PP_SEND_GRAD:
                            sent[s][pv].push_back(
                                {1, a.micro_batch, s == 0 ? a.chunk - 1 : a.chunk});
                            break;
                        case TPD_PP_RECV_ACT:
                            recvd[pv][s].push_back({0, a.micro_batch, a.chunk});
                            break;
                        case TPD_PP_RECV_GRAD:
                            recvd[nx][s].push_back({1, a.micro_batch, a.chunk});
                            break;
                        default:
                            break;
                        }
                    }
                EXPECT_EQ(sent, recvd);
            }
}

// ZB-H1: structure, every stage holds at most min(p, m) micro-batches (so the peak over
// stages is 1F1B's), and the simulated bubble is (p-1) * max(t_F + t_B - t_W, t_B) for
// m >= p, which is Qi et al.'s (p-1)(t_F + t_B - t_W) whenever t_W <= t_F (t_B: input
// gradients only), one third of 1F1B's when the three are equal.
TEST(Schedule, ZbH1StructurePeakAndBubble) {
    struct T {
        double f, b, w; // b: the whole backward, w its W share
    };
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 24; m++) {
            SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m);
            Pipeline zb(p, m, 1, TPD_PP_KIND_ZB_H1), fb(p, m, 1);
            int peak_zb = 0, peak_fb = 0;
            for (int s = 0; s < p; s++) {
                check_structure(zb.s[s], p, m, 1);
                int pk = tpd_pp_schedule_peak_in_flight(&zb.s[s]);
                EXPECT_LE(pk, std::min(p, m));
                // the head's block: between FWD and B only
                if (s == p - 1) EXPECT_EQ(tpd_pp_schedule_peak_in_flight_chunk(&zb.s[s], 0), 1);
                peak_zb = std::max(peak_zb, pk);
                peak_fb = std::max(peak_fb, tpd_pp_schedule_peak_in_flight(&fb.s[s]));
            }
            EXPECT_EQ(peak_zb, peak_fb);
            for (T t : {T{1, 2, 1}, T{1, 2.5, 1}, T{1, 2, 0.5}, T{1, 3, 1.2}, T{1.3, 2.1, 0.9}}) {
                tpd_pp_sim_result r;
                ASSERT_EQ(tpd_pp_simulate(zb.s.data(), p, times(p, t.f, t.b, 0.0, t.w).data(),
                                          nullptr, nullptr, &r),
                          TPD_OK);
                EXPECT_NEAR(r.busy_total, p * m * (t.f + t.b), 1e-9);
                if (m < p) continue;
                double tB = t.b - t.w;
                double bubble = (p - 1) * std::max(t.f + tB - t.w, tB);
                EXPECT_NEAR(r.makespan - m * (t.f + t.b), bubble, 1e-9)
                    << "f=" << t.f << " b=" << t.b << " w=" << t.w;
            }
        }
}

// The interleaved schedule keeps the last stage's head busy for one micro-batch at a time.
TEST(Schedule, InterleavedLastChunkOfTheLastStageHoldsOneMicroBatch) {
    for (int p : {2, 4})
        for (int v : {2, 3})
            for (int m = p; m <= 4 * p; m += p) {
                Pipeline pl(p, m, v);
                EXPECT_EQ(tpd_pp_schedule_peak_in_flight_chunk(&pl.s[p - 1], v - 1), 1)
                    << "p=" << p << " v=" << v << " m=" << m;
            }
}

} // namespace
