// DiLoCo (parallel.dp_sync diloco) in the trainer, on 4 ranks:
//  - with H = 1, outer lr 1, momentum 0 and plain SGD (no clipping, no weight decay) it is
//    every-step data parallelism, so it matches the single-rank every-step run;
//  - under AdamW, with H > 1, fragments and an overlapped all-reduce, it matches the one-rank
//    reference of the algorithm (tpd_verify_diloco_reference: one single-rank trainer per
//    replica on that replica's share of each global batch, and the outer Nesterov step in
//    plain loops on their weights, apart from the trainer's kernels and communicators);
//  - it resumes bit-exactly from a checkpoint taken between two outer steps, and a
//    checkpoint is refused while an outer all-reduce is in flight.
// Tolerances as the equivalence matrix's: loss and gradient norm relative 1e-5 per step,
// final parameters relative 1e-4 per tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/mpi_tests.h"
#include "common/tiny.h"

extern "C" {
#include "engine/model/model.h"
#include "engine/train/train.h"
#include "parallel/data/dp.h"
#include "engine/verify/verify.h"
#include "parallel/comm.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_data, g_dir;

struct Plan {
    int tp = 1, pp = 1, dp = 4, zero = 0;
    int diloco = 1, replicas = 0, H = 3, fragments = 1, overlap = 0;
    double outer_lr = 0.7, outer_momentum = 0.9;
    bool sgd = false;
    int steps = 8;
};

tpd_config config_of(const Plan &S) {
    tpd_config c = tiny::config(g_data);
    c.parallel.tensor_model_parallel_size = S.tp;
    c.parallel.pipeline_model_parallel_size = S.pp;
    c.parallel.use_distributed_optimizer = S.zero;
    c.training.train_iters = S.steps;
    if (S.diloco) {
        c.parallel.dp_sync = TPD_DP_SYNC_DILOCO;
        c.diloco.replicas = S.replicas;
        c.diloco.sync_interval = S.H;
        c.diloco.fragments = S.fragments;
        c.diloco.overlap_steps = S.overlap;
        c.diloco.outer_lr = S.outer_lr;
        c.diloco.outer_momentum = S.outer_momentum;
    }
    if (S.sgd) {
        // the linear inner optimizer under which H = 1 DiLoCo is every-step DP
        c.optimizer.type = TPD_OPTIM_SGD;
        c.optimizer.lr = 0.05;
        c.optimizer.min_lr = 0.005;
        c.optimizer.clip_grad = 0;
        c.optimizer.weight_decay = 0;
    }
    return c;
}

struct Result {
    std::vector<double> loss, norm;
    std::vector<int> outer; // fragment started after each step, -1: none
    std::vector<std::vector<float>> params;
    std::vector<std::vector<float>> saved; // replica 0's when the checkpoint was taken
};

void gather_all(tpd_trainer *tr, tpd_comm *c, Result &r) {
    for (int p = 0; p < TPD_P_COUNT; p++) {
        std::vector<float> g(
            tpd_model_layout_global_numel(&tpd_trainer_model(tr)->plan.lay, (tpd_param)p));
        EXPECT_EQ(
            tpd_trainer_gather_param(tr, (tpd_param)p, tpd_comm_rank(c) == 0 ? g.data() : nullptr),
            TPD_OK);
        r.params.push_back(g);
    }
}

// Trains S on the first tp*pp*dp ranks (collective over g_world); the save/load hooks
// take a checkpoint after step `save_at` into `save_dir`, or start from `load_dir`.
Result run(const Plan &S, int save_at = 0, const std::string &load_dir = "") {
    Result r;
    int n = S.tp * S.pp * S.dp;
    tpd_comm *sub = nullptr;
    int member = tpd_comm_rank(g_world) < n;
    EXPECT_EQ(tpd_comm_split(g_world, member ? 0 : -1, tpd_comm_rank(g_world), "layout", &sub),
              TPD_OK);
    if (member) {
        tpd_config cfg = config_of(S);
        if (!load_dir.empty())
            snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "%s", load_dir.c_str());
        tpd_trainer *tr = nullptr;
        EXPECT_EQ(tpd_trainer_create(&cfg, sub, &tr), TPD_OK);
        if (tr) {
            while (tpd_trainer_iteration(tr) < S.steps) {
                tpd_step_stats s;
                EXPECT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
                r.loss.push_back(s.lm_loss);
                r.norm.push_back(s.grad_norm);
                r.outer.push_back(s.outer_started);
                if (save_at && s.iteration == save_at) {
                    EXPECT_EQ(tpd_trainer_save(tr, g_dir.c_str()), TPD_OK);
                    EXPECT_EQ(tpd_trainer_sync_params(tr), TPD_OK);
                    Result at;
                    gather_all(tr, sub, at);
                    r.saved = at.params;
                }
            }
            EXPECT_EQ(tpd_trainer_sync_params(tr), TPD_OK);
            gather_all(tr, sub, r);
            tpd_trainer_destroy(tr);
        }
        tpd_comm_destroy(sub);
    }
    tpd_comm_barrier(g_world);
    return r;
}

// The one-rank reference (tpd_verify_diloco_reference, the algorithm in plain loops on
// one single-rank trainer per replica), on world rank 0 alone.
Result reference(const Plan &S) {
    Result r;
    tpd_comm *one = nullptr;
    int me = tpd_comm_rank(g_world) == 0;
    EXPECT_EQ(tpd_comm_split(g_world, me ? 0 : -1, 0, "reference", &one), TPD_OK);
    if (me) {
        tpd_config cfg = config_of(S);
        r.loss.resize(S.steps);
        r.norm.resize(S.steps);
        float *params[TPD_P_COUNT] = {};
        EXPECT_EQ(tpd_verify_diloco_reference(&cfg, S.dp, S.steps, one, r.loss.data(),
                                              r.norm.data(), params),
                  TPD_OK);
        for (int c = 1; c <= S.steps; c++)
            r.outer.push_back(tpd_diloco_sync_fragment(&cfg, c));
        tpd_model_layout lay;
        tpd_model_layout_init(&cfg, 1, 0, 1, 0, &lay);
        for (int p = 0; p < TPD_P_COUNT; p++) {
            size_t n = tpd_model_layout_global_numel(&lay, (tpd_param)p);
            r.params.emplace_back(params[p], params[p] + (params[p] ? n : 0));
            free(params[p]);
        }
        tpd_comm_destroy(one);
    }
    tpd_comm_barrier(g_world);
    return r;
}

// world rank 0: a run against its reference within the matrix's tolerances.
// norms: compare the gradient norms too (the logging rank's replica's own norm under DiLoCo,
// of a smaller batch than every-step DP's, so only against a reference of the replica).
void expect_close(const Result &got, const Result &want, const char *what, bool norms = true) {
    if (tpd_comm_rank(g_world) != 0) return;
    SCOPED_TRACE(what);
    ASSERT_EQ(got.loss.size(), want.loss.size());
    double worst = 0;
    for (size_t i = 0; i < want.loss.size(); i++) {
        EXPECT_LE(std::fabs(got.loss[i] - want.loss[i]) / std::fabs(want.loss[i]), 1e-5)
            << "step " << i + 1 << " loss " << got.loss[i] << " vs " << want.loss[i];
        if (norms)
            EXPECT_LE(std::fabs(got.norm[i] - want.norm[i]) / std::fabs(want.norm[i]), 1e-5)
                << "step " << i + 1 << " grad norm " << got.norm[i] << " vs " << want.norm[i];
        worst = std::max(worst, std::fabs(got.loss[i] - want.loss[i]) / std::fabs(want.loss[i]));
    }
    ASSERT_EQ(got.params.size(), want.params.size());
    double wp = 0;
    for (size_t p = 0; p < want.params.size(); p++) {
        double e =
            tpd_verify_rel_diff(got.params[p].data(), want.params[p].data(), want.params[p].size());
        EXPECT_LE(e, 1e-4) << "parameter " << tpd_param_get_info((tpd_param)p)->name;
        wp = std::max(wp, e);
    }
    printf("%s: worst relative error loss %.2e, params %.2e\n", what, worst, wp);
}

TEST(Diloco, H1WithOuterLr1AndSgdIsEveryStepDataParallelism) {
    Plan single;
    single.dp = 1;
    single.diloco = 0;
    single.sgd = true;
    Result ref = run(single);
    struct Case {
        Plan s;
        const char *what;
    };
    std::vector<Case> cases;
    auto add = [&](int tp, int pp, int dp, int zero, int replicas, const char *what) {
        Plan s;
        s.tp = tp, s.pp = pp, s.dp = dp, s.zero = zero, s.replicas = replicas;
        s.H = 1, s.outer_lr = 1.0, s.outer_momentum = 0.0, s.sgd = true;
        cases.push_back({s, what});
    };
    add(1, 1, 4, 0, 0, "DP 4 as 4 replicas");
    add(1, 1, 4, 1, 2, "DP 4 as 2 replicas of a ZeRO-1 pair");
    add(2, 1, 2, 0, 2, "TP 2 x 2 replicas");
    add(1, 2, 2, 0, 2, "PP 2 x 2 replicas");
    for (const Case &c : cases) {
        Result r = run(c.s);
        expect_close(r, ref, c.what, false);
        if (tpd_comm_rank(g_world) == 0)
            for (size_t i = 0; i < r.outer.size(); i++)
                EXPECT_EQ(r.outer[i], 0) << c.what << ": an outer step after every step";
    }
    // the same SGD every-step layout agrees too (the plain DP path under SGD)
    Plan dp4 = single;
    dp4.dp = 4;
    expect_close(run(dp4), ref, "every-step DP 4 under SGD");
}

TEST(Diloco, MatchesTheOneRankReferenceUnderAdamW) {
    struct Case {
        Plan s;
        const char *what;
    };
    std::vector<Case> cases;
    Plan a; // DP 4 as 4 replicas, H 3, 8 steps: outer steps after 3 and 6, and the last
    cases.push_back({a, "4 replicas, H 3"});
    Plan b;
    b.replicas = 2, b.zero = 1;
    cases.push_back({b, "2 replicas of a ZeRO-1 pair, H 3"});
    Plan c;
    c.tp = 2, c.dp = 2;
    cases.push_back({c, "TP 2 x 2 replicas, H 3"});
    Plan d;
    d.pp = 2, d.dp = 2, d.H = 4;
    cases.push_back({d, "PP 2 x 2 replicas, H 4"});
    Plan e; // streaming: fragment 0 after steps 2, 6; fragment 1 after 4, 8
    e.H = 4, e.fragments = 2;
    cases.push_back({e, "4 replicas, H 4, 2 fragments"});
    Plan f = e; // and each all-reduce lands one step later
    f.overlap = 1, f.replicas = 2;
    cases.push_back({f, "2 replicas of 2, H 4, 2 fragments, overlap 1"});
    for (const Case &k : cases) {
        Result want = reference(k.s);
        Result got = run(k.s);
        expect_close(got, want, k.what);
        if (tpd_comm_rank(g_world) == 0) EXPECT_EQ(got.outer, want.outer) << k.what;
    }
}

TEST(Diloco, DiffersFromEveryStepWhereTheAlgorithmsDiffer) {
    // the reference check above could pass with an outer step that does nothing: DiLoCo
    // at H 3 must not be every-step DP, and its replicas must agree after an outer step
    Plan d;
    Plan e = d;
    e.diloco = 0;
    Result a = run(d), b = run(e);
    if (tpd_comm_rank(g_world) != 0) return;
    ASSERT_EQ(a.loss.size(), b.loss.size());
    EXPECT_EQ(a.loss[0], b.loss[0]); // the same first step: no communication differs yet
    double diff = 0;
    for (size_t i = 1; i < a.loss.size(); i++)
        diff = std::max(diff, std::fabs(a.loss[i] - b.loss[i]));
    EXPECT_GT(diff, 1e-6) << "DiLoCo at H 3 trained exactly as every-step DP";
}

TEST(Diloco, ResumesBitExactlyBetweenTwoOuterSteps) {
    for (int streaming = 0; streaming < 2; streaming++) {
        Plan s;
        s.tp = 2, s.dp = 2, s.H = 4, s.steps = 10;
        int save_at = 6; // after the outer step at 4, before the one at 8
        if (streaming) {
            s.tp = 1, s.dp = 4, s.replicas = 2, s.zero = 1, s.fragments = 2, s.overlap = 1;
            save_at = 7; // fragment 0's all-reduce (started at 6) has landed
        }
        std::error_code ec;
        if (tpd_comm_rank(g_world) == 0) std::filesystem::remove_all(g_dir, ec);
        tpd_comm_barrier(g_world);
        Result whole = run(s, save_at);
        char it[32];
        snprintf(it, sizeof it, "/iter_%07d", save_at);
        Result resumed = run(s, 0, g_dir + it);
        if (tpd_comm_rank(g_world) != 0) continue;
        SCOPED_TRACE(streaming ? "streaming, ZeRO-1 replicas" : "TP 2 x 2 replicas");
        ASSERT_EQ(resumed.loss.size(), (size_t)(s.steps - save_at));
        for (int i = save_at; i < s.steps; i++) {
            EXPECT_EQ(resumed.loss[i - save_at], whole.loss[i]) << "step " << i + 1;
            EXPECT_EQ(resumed.norm[i - save_at], whole.norm[i]) << "step " << i + 1;
        }
        for (size_t p = 0; p < whole.params.size(); p++)
            EXPECT_EQ(whole.params[p], resumed.params[p])
                << "parameter " << tpd_param_get_info((tpd_param)p)->name;
    }
}

TEST(Diloco, ACheckpointLoadsIntoOtherLayoutsAsReplicaZero) {
    // every replica's files are saved; a run at another replica count (every-step DP, one
    // rank, or DiLoCo with fewer replicas) loads replica 0's parameters byte for byte
    Plan s;
    s.tp = 2, s.dp = 2, s.H = 4, s.steps = 6;
    std::error_code ec;
    if (tpd_comm_rank(g_world) == 0) std::filesystem::remove_all(g_dir, ec);
    tpd_comm_barrier(g_world);
    Result saved = run(s, 6);
    // after step 6 the replicas differ (the last outer step was after step 4)
    Plan every = s;
    every.diloco = 0, every.tp = 1, every.dp = 1, every.steps = 6;
    Plan two = s;
    two.tp = 1, two.dp = 2, two.replicas = 2;
    Plan four = s;
    four.tp = 1, four.dp = 4, four.replicas = 2;
    for (const Plan &p : {every, two, four}) {
        Result loaded = run(p, 0, g_dir + "/iter_0000006");
        if (tpd_comm_rank(g_world) != 0) continue;
        // no step runs (steps == the checkpoint's iteration): the gathered weights are
        // what was loaded
        EXPECT_TRUE(loaded.loss.empty());
        ASSERT_EQ(loaded.params.size(), saved.saved.size());
        for (size_t t = 0; t < saved.saved.size(); t++)
            EXPECT_EQ(loaded.params[t], saved.saved[t])
                << "parameter " << tpd_param_get_info((tpd_param)t)->name << " at DP " << p.dp
                << (p.diloco ? " DiLoCo" : " every-step");
    }
}

TEST(Diloco, ARunDefersItsSaveUntilTheOuterStepInFlightLands) {
    // fragments start after steps 2, 4, 6 and land a step later; checkpoint.save_interval
    // 2 falls on each of them, so the run saves after 3, 5, 7 instead, and after its last
    // step (which applies what is in flight)
    Plan s;
    s.H = 4, s.fragments = 2, s.overlap = 1, s.steps = 8;
    std::string dir = g_dir + "_deferred";
    std::error_code ec;
    if (tpd_comm_rank(g_world) == 0) std::filesystem::remove_all(dir, ec);
    tpd_comm_barrier(g_world);
    tpd_comm *sub = nullptr;
    int member = tpd_comm_rank(g_world) < s.dp;
    ASSERT_EQ(tpd_comm_split(g_world, member ? 0 : -1, tpd_comm_rank(g_world), "layout", &sub),
              TPD_OK);
    if (member) {
        tpd_config cfg = config_of(s);
        snprintf(cfg.checkpoint.save, sizeof cfg.checkpoint.save, "%s", dir.c_str());
        cfg.checkpoint.save_interval = 2;
        cfg.logging.log_interval = 100;
        tpd_trainer *tr = nullptr;
        EXPECT_EQ(tpd_trainer_create(&cfg, sub, &tr), TPD_OK);
        if (tr) {
            EXPECT_EQ(tpd_trainer_run(tr), TPD_OK);
            tpd_trainer_destroy(tr);
        }
        tpd_comm_destroy(sub);
    }
    tpd_comm_barrier(g_world);
    if (tpd_comm_rank(g_world) != 0) return;
    for (int it = 1; it <= s.steps; it++) {
        char name[32];
        snprintf(name, sizeof name, "/iter_%07d", it);
        bool want = it == 3 || it == 5 || it == 7 || it == 8;
        EXPECT_EQ(std::filesystem::exists(dir + name), want) << name;
    }
}

TEST(Diloco, NoCheckpointWhileAnOuterAllReduceIsInFlight) {
    Plan s; // fragment 0's all-reduce starts after step 2 and lands after step 3
    s.H = 4, s.fragments = 2, s.overlap = 1;
    tpd_comm *sub = nullptr;
    int member = tpd_comm_rank(g_world) < s.dp;
    ASSERT_EQ(tpd_comm_split(g_world, member ? 0 : -1, tpd_comm_rank(g_world), "layout", &sub),
              TPD_OK);
    if (member) {
        tpd_config cfg = config_of(s);
        tpd_trainer *tr = nullptr;
        EXPECT_EQ(tpd_trainer_create(&cfg, sub, &tr), TPD_OK);
        std::string dir = g_dir + "_inflight";
        tpd_step_stats st;
        for (int i = 0; tr && i < 3; i++) {
            EXPECT_EQ(tpd_trainer_step(tr, &st), TPD_OK);
            if (st.iteration == 2) {
                EXPECT_EQ(st.outer_started, 0);
                EXPECT_EQ(st.outer_applied, -1);
                tpd_last_error_clear();
                EXPECT_EQ(tpd_trainer_save(tr, dir.c_str()), TPD_ERR_INVALID);
                EXPECT_NE(std::string(tpd_last_error()).find("in flight"), std::string::npos)
                    << tpd_last_error();
            }
        }
        if (tr) {
            EXPECT_EQ(st.outer_applied, 0);
            EXPECT_EQ(tpd_trainer_save(tr, dir.c_str()), TPD_OK) << tpd_last_error();
            tpd_trainer_destroy(tr);
        }
        tpd_comm_destroy(sub);
    }
    tpd_comm_barrier(g_world);
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    tpd_comm_mpi_start(&g_world);
    char path[256] = {0};
    if (tpd_comm_rank(g_world) == 0) {
        snprintf(path, sizeof path, "%s", tiny::temp_prefix("diloco").c_str());
        tiny::write_corpus(path);
    }
    tpd_comm_broadcast(g_world, path, sizeof path, TPD_DTYPE_U8, 0, nullptr);
    g_data = path;
    g_dir = g_data + "_ckpt";
    int rc = tiny::mpi_run_all_tests(g_world);
    if (tpd_comm_rank(g_world) == 0) tiny::remove_corpus(g_data);
    tpd_comm_mpi_finish(g_world);
    return rc;
}
