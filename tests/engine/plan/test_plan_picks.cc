// "Planner picks, trainer runs", under mpirun -np 8: the planner's top layout for a small
// model on `--cluster cpu --gpus 8` is interleaved (few micro-batches over a pipeline, cheap
// p2p: the bubble that Megatron's interleaving cuts dominates), and exactly that layout,
// every override the planner prints applied through the config loader, trains to the
// single-rank run's losses: per step within relative 1e-5, as the equivalence matrix
// (tests/engine/train/test_equivalence.cc) holds every layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/mpi_tests.h"
#include "common/tiny.h"

extern "C" {
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"
#include "engine/train/train.h"
#include "parallel/comm.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_data;
const int kSteps = 4;

// The model: 16 layers of 128, a 16-token context, 8 sequences a step.
std::vector<std::string> model_overrides() {
    return {"model.num_layers=16",
            "model.hidden_size=128",
            "model.num_attention_heads=4",
            "model.vocab_size=257",
            "model.seq_length=16",
            "model.make_vocab_size_divisible_by=8",
            "training.global_batch_size=8",
            "training.micro_batch_size=1",
            "training.train_iters=" + std::to_string(kSteps),
            "training.precision=fp32",
            "training.device=cpu",
            "training.num_threads=1",
            "training.seed=1234",
            "data.data_path=" + g_data};
}

tpd_config load(const std::vector<std::string> &ovr) {
    std::vector<const char *> v;
    for (const std::string &s : ovr)
        v.push_back(s.c_str());
    tpd_config cfg;
    EXPECT_EQ(tpd_config_load(nullptr, (int)v.size(), v.data(), &cfg), TPD_OK) << tpd_last_error();
    return cfg;
}

// Per-step losses of cfg trained on `comm` (every member gets them).
std::vector<double> train(const tpd_config &cfg, tpd_comm *comm) {
    std::vector<double> loss;
    tpd_trainer *tr = nullptr;
    EXPECT_EQ(tpd_trainer_create(&cfg, comm, &tr), TPD_OK);
    for (int i = 0; tr && i < kSteps; i++) {
        tpd_step_stats s;
        EXPECT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
        loss.push_back(s.lm_loss);
    }
    tpd_trainer_destroy(tr);
    return loss;
}

TEST(PlanPicks, TopLayoutIsInterleavedAndTrainsLikeOneRank) {
    ASSERT_EQ(tpd_comm_size(g_world), 8);
    std::vector<std::string> base = model_overrides();
    tpd_config cfg = load(base);

    // 1. The planner's pick, on every rank (deterministic, no communication).
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("cpu", &cl), TPD_OK);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = 8;
    opt.top_k = 5;
    tpd_plan_search s;
    ASSERT_EQ(tpd_plan_search_run(&cfg, &cl, &opt, &s), TPD_OK);
    ASSERT_GT(s.n_top, 0);
    const tpd_plan_result &top = s.top[0];
    if (tpd_comm_rank(g_world) == 0) tpd_plan_print_table(stdout, s.top, s.n_top);
    char layout[256];
    tpd_plan_layout_str(&top.layout, layout, sizeof layout);
    ASSERT_GE(top.layout.virtual_stages, 2)
        << "the planner's top layout for this model on the cpu cluster is not interleaved: "
        << layout;
    EXPECT_EQ(tpd_plan_layout_schedule(&top.layout), TPD_SCHEDULE_INTERLEAVED);
    EXPECT_GT(top.layout.pp, 1);

    // 2. Exactly that layout: every override it prints, through the config loader.
    char ovr[4096];
    ASSERT_GT(tpd_plan_overrides(&cfg, &top, ovr, sizeof ovr), 0);
    if (tpd_comm_rank(g_world) == 0) printf("top layout: %s\n  overrides: %s\n", layout, ovr);
    std::vector<std::string> picked = base;
    int parallel_keys = 0;
    for (char *save = nullptr, *t = strtok_r(ovr, " ", &save); t;
         t = strtok_r(nullptr, " ", &save)) {
        picked.push_back(t);
        parallel_keys += std::strncmp(t, "parallel.", 9) == 0;
    }
    EXPECT_GE(parallel_keys, 10); // sizes, schedule, v, split, SP, ZeRO, both overlaps
    tpd_config run = load(picked);
    ASSERT_EQ(tpd_config_check_world(&run, 8), TPD_OK) << tpd_last_error();
    EXPECT_EQ(tpd_config_schedule(&run), TPD_SCHEDULE_INTERLEAVED);
    EXPECT_EQ(run.parallel.virtual_pipeline_model_parallel_size, top.layout.virtual_stages);
    EXPECT_EQ(run.parallel.tensor_model_parallel_size, top.layout.tp);
    EXPECT_EQ(run.parallel.pipeline_model_parallel_size, top.layout.pp);
    EXPECT_EQ(tpd_config_dp(&run, 8), top.layout.dp);
    std::vector<double> got = train(run, g_world);

    // 3. The single-rank run of the same model and batch (the pick's micro-batch size).
    tpd_config one = run;
    one.parallel.tensor_model_parallel_size = one.parallel.pipeline_model_parallel_size = 1;
    one.parallel.data_parallel_size = 0;
    one.parallel.virtual_pipeline_model_parallel_size = 1;
    one.parallel.pipeline_schedule = TPD_SCHEDULE_1F1B;
    one.parallel.num_pipeline_layers = 0;
    one.parallel.sequence_parallel = 0;
    one.parallel.use_distributed_optimizer = 0;
    tpd_comm *self = nullptr;
    int me = tpd_comm_rank(g_world);
    ASSERT_EQ(tpd_comm_split(g_world, me == 0 ? 0 : -1, me, "one", &self), TPD_OK);
    std::vector<double> ref(kSteps, 0.0);
    if (me == 0) {
        std::vector<double> r = train(one, self);
        for (int i = 0; i < kSteps && i < (int)r.size(); i++)
            ref[i] = r[i];
        tpd_comm_destroy(self);
    }
    ASSERT_EQ(tpd_comm_broadcast(g_world, ref.data(), kSteps, TPD_DTYPE_F64, 0, nullptr), TPD_OK);
    ASSERT_EQ((int)got.size(), kSteps);
    for (int i = 0; i < kSteps; i++) {
        EXPECT_GT(ref[i], 0.0);
        EXPECT_NEAR(got[i], ref[i], 1e-5 * std::fabs(ref[i])) << "step " << i + 1 << " " << layout;
    }
    if (me == 0)
        for (int i = 0; i < kSteps; i++)
            printf("step %d: loss %.8f (one rank %.8f, relative %.1e)\n", i + 1, got[i], ref[i],
                   std::fabs(got[i] - ref[i]) / ref[i]);
    tpd_plan_search_free(&s);
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    tpd_comm_mpi_start(&g_world);
    char path[256] = {0};
    if (tpd_comm_rank(g_world) == 0) {
        std::string p = tiny::write_corpus(tiny::temp_prefix("picks_corpus"));
        snprintf(path, sizeof path, "%s", p.c_str());
    }
    tpd_comm_broadcast(g_world, path, sizeof path, TPD_DTYPE_U8, 0, nullptr);
    g_data = path;
    int all = tiny::mpi_run_all_tests(g_world);
    tpd_comm_mpi_finish(g_world);
    return all;
}
