// Pipeline schedules: structure of the action lists and the simulated bubble.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

extern "C" {
#include "parallel/pipeline/schedule.h"
}

namespace {

struct Pipeline {
    std::vector<tpd_pp_schedule> s;
    Pipeline(int p, int m, int v) : s(p) {
        for (int i = 0; i < p; i++) {
            tpd_status st = v == 1 ? tpd_pp_schedule_1f1b(p, i, m, &s[i])
                                   : tpd_pp_schedule_interleaved(p, i, m, v, &s[i]);
            EXPECT_EQ(st, TPD_OK) << "p=" << p << " stage=" << i << " m=" << m;
        }
    }
    ~Pipeline() {
        for (auto &x : s)
            tpd_pp_schedule_free(&x);
    }
};

// Every (micro-batch, chunk) runs FWD exactly once and later BWD exactly once; every
// compute is preceded by its receive and followed by its send, except where the
// virtual stage is the first (no RECV_ACT / SEND_GRAD) or the last (no SEND_ACT /
// RECV_GRAD).
void check_structure(const tpd_pp_schedule &sc, int p, int m, int v) {
    std::vector<int> fwd(m * v, 0), bwd(m * v, 0);
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
        } else if (a.kind == TPD_PP_RECV_ACT || a.kind == TPD_PP_SEND_GRAD) {
            EXPECT_FALSE(first) << "stage 0 chunk 0 has no previous stage";
        } else {
            EXPECT_FALSE(last) << "last stage's last chunk has no next stage";
        }
    }
    for (int id = 0; id < m * v; id++) {
        EXPECT_EQ(fwd[id], 1);
        EXPECT_EQ(bwd[id], 1);
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
            ASSERT_EQ(tpd_pp_simulate(pl.s.data(), p, tf, tb, 0.0, nullptr, nullptr, &r), TPD_OK);
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
    ASSERT_EQ(tpd_pp_simulate(pl.s.data(), 2, 1.0, 2.0, 0.25, start.data(), end.data(), &r),
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
    EXPECT_EQ(tpd_pp_simulate(pl.s.data(), 2, 1.0, 2.0, 0.0, nullptr, nullptr, &r),
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
                ASSERT_EQ(
                    tpd_pp_simulate(pl.s.data(), p, tf / v, tb / v, 0.0, nullptr, nullptr, &r),
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

} // namespace
