// `tripod sweep` under mpirun -np 4: a small demo-like model over TP {1,2,3} x PP {1,2}
// (DP derived; TP 3 cannot divide 4 ranks and is listed as skipped), after calibrating
// the planner on this machine inside the same job.
//   - every output file is written (summary.csv, failed.csv, summary.json, sweep.png when
//     gnuplot is installed, real and predicted traces);
//   - each trial's losses equal a plain trainer's of that layout over the same steps;
//   - the predicted step time of each trial is within 25% of its measured median (held
//     when no other job loads the machine; always printed), and the predicted memory is
//     the allocated memory;
//   - a sweep whose trials all fail records the errors and finishes.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "common/mpi_tests.h"
#include "common/tiny.h"

extern "C" {
#include "base/file.h"
#include "engine/bench/calibrate.h"
#include "engine/plan/plan.h"
#include "engine/bench/sweep.h"
#include "engine/train/train.h"
#include "parallel/comm.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_data, g_dir;
double g_load_before = 0; // 1-minute load average when the job started (rank 0)
int g_cores = 1;

const int kSteps = 12, kWarmup = 3;

std::string demo_path() {
    return std::string(tpd_source_dir()) + "/configs/demo.yaml";
}

// The small demo-like model of the sweep (overrides of configs/demo.yaml).
std::vector<std::string> overrides() {
    return {"model.num_layers=2",          "model.hidden_size=64",
            "model.seq_length=64",         "training.global_batch_size=8",
            "training.micro_batch_size=1", "data.data_path=" + g_data};
}

std::vector<const char *> cstrs(const std::vector<std::string> &v) {
    std::vector<const char *> out;
    for (const std::string &s : v)
        out.push_back(s.c_str());
    return out;
}

std::string slurp(const std::string &path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

bool exists(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && st.st_size > 0;
}

// Losses of a plain trainer of one layout: the reference for the sweep's.
std::vector<double> plain_losses(int tp, int pp, int steps) {
    std::vector<std::string> o = overrides();
    o.push_back("parallel.tensor_model_parallel_size=" + std::to_string(tp));
    o.push_back("parallel.pipeline_model_parallel_size=" + std::to_string(pp));
    std::vector<const char *> oc = cstrs(o);
    tpd_config cfg;
    EXPECT_EQ(tpd_config_load(demo_path().c_str(), (int)oc.size(), oc.data(), &cfg), TPD_OK)
        << tpd_last_error();
    cfg.logging.eval_interval = 0;
    cfg.logging.metrics_file[0] = 0;
    std::vector<double> loss;
    tpd_trainer *tr = nullptr;
    EXPECT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    for (int i = 0; tr && i < steps; i++) {
        tpd_step_stats s;
        EXPECT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
        loss.push_back(s.lm_loss);
    }
    tpd_trainer_destroy(tr);
    return loss;
}

// Calibrates the planner on this machine (the same 4 ranks sharing the cores), then runs
// the sweep TP {1,2,3} x PP {1,2} with that profile. Collective.
void calibrate_and_sweep(tpd_sweep_options *opt, tpd_sweep_result *res) {
    std::vector<std::string> o = overrides();
    std::vector<const char *> oc = cstrs(o);
    tpd_config cfg;
    ASSERT_EQ(tpd_config_load(demo_path().c_str(), (int)oc.size(), oc.data(), &cfg), TPD_OK)
        << tpd_last_error();
    tpd_calib_options co = TPD_CALIB_OPTIONS_INIT;
    co.budget_s = 0.01;
    snprintf(co.name, sizeof co.name, "test-cpu");
    tpd_plan_cluster cl;
    char *notes = nullptr;
    ASSERT_EQ(tpd_calib_run(&cfg, g_world, &co, &cl, &notes), TPD_OK);
    std::string profile = g_dir + "/calibrated.yaml";
    int saved = 1;
    if (tpd_comm_rank(g_world) == 0)
        saved = tpd_plan_cluster_save(&cl, profile.c_str(), notes) == TPD_OK;
    free(notes);
    tpd_comm_broadcast(g_world, &saved, 1, TPD_DTYPE_I32, 0, nullptr);
    ASSERT_TRUE(saved);
    EXPECT_EQ(cl.calibrated, 1);
    EXPECT_GT(cl.peak_flops, 1e8);
    EXPECT_GT(cl.intra_bw, 0.0);

    *opt = TPD_SWEEP_OPTIONS_INIT;
    opt->tp[0] = 1, opt->tp[1] = 2, opt->tp[2] = 3, opt->n_tp = 3;
    opt->pp[0] = 1, opt->pp[1] = 2, opt->n_pp = 2;
    opt->steps = kSteps;
    opt->warmup = kWarmup;
    opt->verbose = tpd_comm_rank(g_world) == 0;
    snprintf(opt->out_dir, sizeof opt->out_dir, "%s/sweep", g_dir.c_str());
    snprintf(opt->cluster, sizeof opt->cluster, "%s", profile.c_str());
    ASSERT_EQ(tpd_sweep_run(demo_path().c_str(), (int)oc.size(), oc.data(), g_world, opt, res),
              TPD_OK);
}

double worst_error(const tpd_sweep_result &res) {
    double worst = 0;
    for (int i = 0; i < res.n; i++)
        if (res.trials[i].state == TPD_SWEEP_OK)
            worst = std::max(worst, std::fabs(res.trials[i].err_pct));
    return worst;
}

TEST(Sweep, CalibratedSweepWritesEverythingAndPredictsItsTrials) {
    tpd_sweep_options opt;
    tpd_sweep_result res;
    // Timing on a shared (virtual) machine: its speed drifts by tens of percent between
    // minutes, so when calibration and sweep disagree, both are measured again, up to
    // four times (every rank sees the same result, so all agree).
    for (int attempt = 0;; attempt++) {
        calibrate_and_sweep(&opt, &res);
        if (HasFatalFailure()) return;
        if (worst_error(res) <= 25.0 || attempt == 3 || g_load_before > g_cores + 0.5) break;
        if (tpd_comm_rank(g_world) == 0)
            printf("worst prediction error %.1f%%: calibrating and sweeping again\n",
                   worst_error(res));
        tpd_sweep_result_free(&res);
    }
    ASSERT_EQ(res.n, 6);
    int ok = 0, skipped = 0;
    for (int i = 0; i < res.n; i++) {
        const tpd_sweep_trial &t = res.trials[i];
        if (t.tp == 3) {
            EXPECT_EQ(t.state, TPD_SWEEP_SKIPPED);
            EXPECT_NE(std::string(t.reason).find("world size"), std::string::npos) << t.reason;
            skipped++;
            continue;
        }
        ASSERT_EQ(t.state, TPD_SWEEP_OK) << t.reason;
        EXPECT_EQ(t.tp * t.pp * t.dp, 4);
        EXPECT_EQ(t.steps, kSteps);
        EXPECT_GT(t.t_median, 0.0);
        EXPECT_LE(t.t_min, t.t_median);
        EXPECT_GE(t.t_max, t.t_median);
        EXPECT_GT(t.tokens_per_s, 0.0);
        EXPECT_GE(t.mfu, 0.0); // the calibrated profile knows its peak
        ASSERT_TRUE(t.have_pred);
        // The planner's cpu memory is what the trainer allocates, byte for byte.
        EXPECT_EQ(t.pred_mem, t.peak_mem);
        ok++;
    }
    EXPECT_EQ(ok, 4);
    EXPECT_EQ(skipped, 2);
    ASSERT_GE(res.best, 0);

    // 3. Files (rank 0).
    if (tpd_comm_rank(g_world) == 0) {
        opt.plot = 1;
        ASSERT_EQ(tpd_sweep_write(&res, &opt), TPD_OK);
        std::string dir = opt.out_dir;
        std::string csv = slurp(dir + "/summary.csv");
        EXPECT_EQ(csv.rfind("model,tp,pp,dp,mbs,gbs,zero,sp,recompute,world,", 0), 0u) << csv;
        EXPECT_NE(csv.find("time_per_step_s"), std::string::npos);
        EXPECT_NE(csv.find("predicted_time_s"), std::string::npos);
        EXPECT_NE(csv.find("peak_memory_bytes"), std::string::npos);
        int lines = 0;
        for (char ch : csv)
            lines += ch == '\n';
        EXPECT_EQ(lines, 1 + 4);
        std::string failed = slurp(dir + "/failed.csv");
        EXPECT_NE(failed.find("3,1,"), std::string::npos) << failed;
        EXPECT_NE(failed.find("skipped"), std::string::npos);
        cJSON *js = cJSON_Parse(slurp(dir + "/summary.json").c_str());
        ASSERT_NE(js, nullptr);
        EXPECT_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(js, "trials")), 6);
        EXPECT_EQ(
            std::string(cJSON_GetObjectItem(js, "best")->valuestring).rfind("Best layout:", 0), 0u);
        cJSON_Delete(js);
        char best[512];
        tpd_sweep_best_line(&res, best, sizeof best);
        printf("%s\n", best);
        if (tpd_file_on_path("gnuplot")) EXPECT_TRUE(exists(dir + "/sweep.png"));
        // Real and predicted traces of the same layout, with the same event names.
        std::string real = slurp(dir + "/trace_tp1_pp2_dp2_mbs1_zero0.json");
        std::string pred = slurp(dir + "/trace_tp1_pp2_dp2_mbs1_zero0_predicted.json");
        cJSON *rj = cJSON_Parse(real.c_str()), *pj = cJSON_Parse(pred.c_str());
        ASSERT_NE(rj, nullptr);
        ASSERT_NE(pj, nullptr);
        cJSON_Delete(rj);
        cJSON_Delete(pj);
        for (const char *name : {"\"FWD mb=0 chunk=0\"", "\"BWD mb=1 chunk=0\"", "\"SEND_ACT\"",
                                 "\"RECV_GRAD\"", "\"OPTIMIZER\"", "\"DP_REDUCE\""}) {
            EXPECT_NE(real.find(name), std::string::npos) << name;
            EXPECT_NE(pred.find(name), std::string::npos) << name;
        }
        for (int r = 0; r < 4; r++)
            EXPECT_NE(real.find("\"rank " + std::to_string(r) + " (stage"), std::string::npos);
    }

    // 4. Each trial's losses are a plain trainer's of that layout.
    for (int i = 0; i < res.n; i++) {
        const tpd_sweep_trial &t = res.trials[i];
        if (t.state != TPD_SWEEP_OK) continue;
        std::vector<double> ref = plain_losses(t.tp, t.pp, kWarmup + kSteps);
        ASSERT_EQ((int)ref.size(), t.n_loss);
        for (int s = 0; s < t.n_loss; s++)
            EXPECT_EQ(t.loss[s], ref[s]) << "TP " << t.tp << " PP " << t.pp << " step " << s + 1;
    }

    // 5. Prediction against measurement. The bound is for a machine that runs only this
    // job: other jobs' load moves between calibration and sweep, so on a busy machine the
    // errors are printed and not held to it.
    if (tpd_comm_rank(g_world) == 0) {
        bool quiet = g_load_before <= g_cores + 0.5;
        if (!quiet)
            printf("load average %.1f on %d cores before the test: other jobs share this "
                   "machine, prediction errors are reported only\n",
                   g_load_before, g_cores);
        for (int i = 0; i < res.n; i++) {
            const tpd_sweep_trial &t = res.trials[i];
            if (t.state != TPD_SWEEP_OK) continue;
            printf("TP %d PP %d DP %d: measured %.2f ms (min %.2f, max %.2f), predicted %.2f ms, "
                   "error %+.1f%%\n",
                   t.tp, t.pp, t.dp, 1e3 * t.t_median, 1e3 * t.t_min, 1e3 * t.t_max,
                   1e3 * t.pred_time, t.err_pct);
            if (quiet) EXPECT_LE(std::fabs(t.err_pct), 25.0) << "TP " << t.tp << " PP " << t.pp;
        }
    }
    tpd_sweep_result_free(&res);
}

// TP {1, 2} at one PP, no warm-up, no plot, quiet, writing to g_dir/name.
tpd_sweep_options quick_options(int pp, int steps, const char *name) {
    tpd_sweep_options opt = TPD_SWEEP_OPTIONS_INIT;
    opt.tp[0] = 1, opt.tp[1] = 2, opt.n_tp = 2;
    opt.pp[0] = pp, opt.n_pp = 1;
    opt.steps = steps;
    opt.warmup = 0;
    opt.plot = 0;
    opt.verbose = 0;
    snprintf(opt.out_dir, sizeof opt.out_dir, "%s/%s", g_dir.c_str(), name);
    return opt;
}

TEST(Sweep, FailingTrialsAreRecordedAndTheSweepGoesOn) {
    std::vector<std::string> o = overrides();
    o.back() = "data.data_path=" + g_dir + "/no_such_data";
    std::vector<const char *> oc = cstrs(o);
    tpd_sweep_options opt = quick_options(2, 1, "sweep_fail");
    tpd_sweep_result res;
    ASSERT_EQ(tpd_sweep_run(demo_path().c_str(), (int)oc.size(), oc.data(), g_world, &opt, &res),
              TPD_OK);
    ASSERT_EQ(res.n, 2);
    for (int i = 0; i < res.n; i++) {
        EXPECT_EQ(res.trials[i].state, TPD_SWEEP_FAILED);
        EXPECT_NE(std::string(res.trials[i].reason).find("creating the trainer failed"),
                  std::string::npos);
    }
    EXPECT_EQ(res.best, -1);
    if (tpd_comm_rank(g_world) == 0) {
        ASSERT_EQ(tpd_sweep_write(&res, &opt), TPD_OK);
        std::string failed = slurp(std::string(opt.out_dir) + "/failed.csv");
        EXPECT_NE(failed.find("1,2,2,1,0,0,none,failed,"), std::string::npos) << failed;
        char best[256];
        tpd_sweep_best_line(&res, best, sizeof best);
        EXPECT_NE(std::string(best).find("none"), std::string::npos);
    }
    tpd_sweep_result_free(&res);
}

// --sp and --recompute are sweep axes. Neither changes the arithmetic, so every trial's
// losses match; sequence parallel with TP 1 is skipped with its reason.
TEST(Sweep, SequenceParallelAndRecomputeAxes) {
    std::vector<std::string> o = overrides();
    std::vector<const char *> oc = cstrs(o);
    tpd_sweep_options opt = quick_options(1, 2, "sweep_axes");
    opt.sp[0] = 0, opt.sp[1] = 1, opt.n_sp = 2;
    opt.recompute[0] = TPD_RECOMPUTE_NONE, opt.recompute[1] = TPD_RECOMPUTE_SELECTIVE;
    opt.n_recompute = 2;
    opt.traces = 0;
    tpd_sweep_result res;
    ASSERT_EQ(tpd_sweep_run(demo_path().c_str(), (int)oc.size(), oc.data(), g_world, &opt, &res),
              TPD_OK);
    ASSERT_EQ(res.n, 8);
    const tpd_sweep_trial *ref = nullptr;
    int ok = 0, skipped = 0, sp_runs = 0, selective_runs = 0;
    for (int i = 0; i < res.n; i++) {
        const tpd_sweep_trial &t = res.trials[i];
        if (t.state == TPD_SWEEP_SKIPPED) {
            EXPECT_EQ(t.tp, 1);
            EXPECT_NE(std::string(t.reason).find("sequence parallel needs TP > 1"),
                      std::string::npos);
            skipped++;
            continue;
        }
        ASSERT_EQ(t.state, TPD_SWEEP_OK) << t.reason;
        ok++;
        sp_runs += t.sp;
        selective_runs += t.recompute == TPD_RECOMPUTE_SELECTIVE;
        if (!ref) ref = &t;
        ASSERT_EQ(t.n_loss, ref->n_loss);
        for (int s = 0; s < t.n_loss; s++)
            EXPECT_NEAR(t.loss[s], ref->loss[s], 1e-5 * std::fabs(ref->loss[s]))
                << "TP " << t.tp << " SP " << t.sp << " recompute " << t.recompute;
    }
    EXPECT_EQ(ok, 6);
    EXPECT_EQ(skipped, 2);
    EXPECT_EQ(sp_runs, 2);
    EXPECT_EQ(selective_runs, 3);
    if (tpd_comm_rank(g_world) == 0) {
        ASSERT_EQ(tpd_sweep_write(&res, &opt), TPD_OK);
        std::string csv = slurp(std::string(opt.out_dir) + "/summary.csv");
        EXPECT_NE(csv.find(",2,1,2,1,8,0,1,selective,"), std::string::npos) << csv;
    }
    tpd_sweep_result_free(&res);
}

// --vp, --schedule and --overlap are sweep axes too: virtual stages run interleaved, zb-h1
// splits the backward, overlap moves the DP reduction into the backward; none changes the
// arithmetic, so every trial's losses match. zb-h1 with virtual stages is skipped with the
// config's reason. Each trial has the planner's idle fraction and exposed DP beside the
// measured ones.
TEST(Sweep, ScheduleVirtualStagesAndOverlapAxes) {
    std::vector<std::string> o = overrides();
    o[0] = "model.num_layers=4"; // two chunks of one layer on each of two stages
    std::vector<const char *> oc = cstrs(o);
    tpd_sweep_options opt = quick_options(2, 2, "sweep_sched");
    opt.vp[0] = 1, opt.vp[1] = 2, opt.n_vp = 2;
    opt.schedule[0] = TPD_SCHEDULE_1F1B, opt.schedule[1] = TPD_SCHEDULE_ZB_H1;
    opt.n_schedule = 2;
    opt.overlap[0] = 0, opt.overlap[1] = 1, opt.n_overlap = 2;
    opt.zero[0] = 1, opt.n_zero = 1;
    opt.traces = 0;
    tpd_sweep_result res;
    ASSERT_EQ(tpd_sweep_run(demo_path().c_str(), (int)oc.size(), oc.data(), g_world, &opt, &res),
              TPD_OK);
    ASSERT_EQ(res.n, 16);
    const tpd_sweep_trial *ref = nullptr;
    int ok = 0, skipped = 0, interleaved = 0, zb = 0, overlapped = 0;
    for (int i = 0; i < res.n; i++) {
        const tpd_sweep_trial &t = res.trials[i];
        if (t.state == TPD_SWEEP_SKIPPED) {
            EXPECT_EQ(t.vp, 2);
            EXPECT_EQ(t.schedule, TPD_SCHEDULE_ZB_H1);
            EXPECT_NE(std::string(t.reason).find("zb-h1"), std::string::npos) << t.reason;
            skipped++;
            continue;
        }
        ASSERT_EQ(t.state, TPD_SWEEP_OK) << t.reason;
        ok++;
        interleaved += t.schedule == TPD_SCHEDULE_INTERLEAVED;
        EXPECT_EQ(t.schedule == TPD_SCHEDULE_INTERLEAVED, t.vp == 2);
        zb += t.schedule == TPD_SCHEDULE_ZB_H1;
        overlapped += t.overlap;
        ASSERT_TRUE(t.have_pred);
        EXPECT_EQ(t.pred_mem, t.peak_mem); // the cpu memory plan holds for every schedule
        EXPECT_GT(t.pred_ovl.idle_fraction, 0.0);
        EXPECT_LT(t.pred_ovl.idle_fraction, 1.0);
        EXPECT_GE(t.meas_ovl.idle_fraction, 0.0);
        EXPECT_LT(t.meas_ovl.idle_fraction, 1.0);
        EXPECT_GE(t.meas_ovl.dp_exposed, 0.0);
        EXPECT_GT(t.pred_ovl.dp_exposed, 0.0); // the tied embedding's all-reduce at least
        if (!ref) ref = &t;
        ASSERT_EQ(t.n_loss, ref->n_loss);
        for (int s = 0; s < t.n_loss; s++)
            EXPECT_NEAR(t.loss[s], ref->loss[s], 1e-5 * std::fabs(ref->loss[s]))
                << "TP " << t.tp << " v " << t.vp << " schedule " << t.schedule << " overlap "
                << t.overlap;
    }
    EXPECT_EQ(ok, 12);
    EXPECT_EQ(skipped, 4);
    EXPECT_EQ(interleaved, 4);
    EXPECT_EQ(zb, 4);
    EXPECT_EQ(overlapped, 6);
    if (tpd_comm_rank(g_world) == 0) {
        ASSERT_EQ(tpd_sweep_write(&res, &opt), TPD_OK);
        std::string csv = slurp(std::string(opt.out_dir) + "/summary.csv");
        for (const char *col : {",vp,schedule,overlap,idle_fraction,pred_idle_fraction,",
                                "dp_exposed_s,pred_dp_exposed_s,param_wait_s,pred_param_wait_s"})
            EXPECT_NE(csv.find(col), std::string::npos) << col;
        EXPECT_NE(csv.find(",2,interleaved,1,"), std::string::npos) << csv;
        EXPECT_NE(csv.find(",1,zb-h1,0,"), std::string::npos) << csv;
        std::string failed = slurp(std::string(opt.out_dir) + "/failed.csv");
        EXPECT_NE(failed.find("skipped,2,zb-h1,"), std::string::npos) << failed;
    }
    tpd_sweep_result_free(&res);
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    tpd_comm_mpi_start(&g_world);
    char path[256] = {0};
    if (tpd_comm_rank(g_world) == 0) {
        if (FILE *f = fopen("/proc/loadavg", "r")) {
            if (fscanf(f, "%lf", &g_load_before) != 1) g_load_before = 0;
            fclose(f);
        }
        g_cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
        std::string dir = tiny::temp_prefix("sweep");
        mkdir(dir.c_str(), 0755);
        snprintf(path, sizeof path, "%s", dir.c_str());
        tiny::write_corpus(dir + "/corpus");
    }
    tpd_comm_broadcast(g_world, path, sizeof path, TPD_DTYPE_U8, 0, nullptr);
    // Every rank decides the same way whether to measure again.
    tpd_comm_broadcast(g_world, &g_load_before, 1, TPD_DTYPE_F64, 0, nullptr);
    tpd_comm_broadcast(g_world, &g_cores, 1, TPD_DTYPE_I32, 0, nullptr);
    g_dir = path;
    g_data = g_dir + "/corpus";
    int all = tiny::mpi_run_all_tests(g_world);
    tpd_comm_mpi_finish(g_world);

    return all;
}
