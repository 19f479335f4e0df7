// DiLoCo in the planner on a cluster of two islands (configs/clusters/dgx-h100-2islands.yaml):
// the outer all-reduce over the slow link against every-step sync of the same layout, the
// fragments and the overlap, the every-step figures beside it, the search that never turns
// DiLoCo on by itself, and the report that prints both.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <cjson/cJSON.h>

#include "plan_test_util.h"

extern "C" {
#include "base/file.h"
#include "engine/cli/cli.h"
#include "engine/plan/plan_internal.h"
}

using namespace plan_test;

namespace {

constexpr int kGpus = 1024;

tpd_plan_cluster islands() {
    tpd_plan_cluster c;
    EXPECT_EQ(tpd_plan_cluster_load("dgx-h100-2islands", &c), TPD_OK);
    return c;
}

// An 18B GPT (SC21's row 4), gbs 1024: TP 8, PP 1, DP 128 fits an H100 and its DP group
// spans all 1024 ranks, so every-step sync runs on the link between the islands.
tpd_config gpt18b() {
    return gpt(48, 6144, 40, 1024, 1);
}

tpd_config with_diloco(tpd_config c, int replicas, int h, int fragments, int overlap) {
    c.parallel.dp_sync = TPD_DP_SYNC_DILOCO;
    c.diloco.replicas = replicas;
    c.diloco.sync_interval = h;
    c.diloco.fragments = fragments;
    c.diloco.overlap_steps = overlap;
    return c;
}

tpd_plan_layout layout(int tp, int pp, int dp) {
    tpd_plan_layout l;
    std::memset(&l, 0, sizeof l);
    l.tp = tp;
    l.pp = pp;
    l.dp = dp;
    l.micro_batch_size = 1;
    l.virtual_stages = 1;
    l.recompute = TPD_RECOMPUTE_SELECTIVE;
    l.sequence_parallel = 1;
    l.distributed_optimizer = 1;
    l.overlap_grad_reduce = 1;
    l.overlap_param_gather = 1;
    l.schedule = TPD_SCHEDULE_1F1B;
    return l;
}

tpd_plan_result eval(const tpd_config &c, const tpd_plan_cluster &cl, const tpd_plan_layout &l) {
    return evaluate(c, cl, l, -1, l.tp * l.pp * l.dp);
}

std::string printed(const tpd_plan_result &r) {
    FILE *f = std::tmpfile();
    EXPECT_NE(f, nullptr);
    if (!f) return "";
    tpd_plan_print_breakdown(f, &r);
    std::string s;
    std::rewind(f);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;)
        s.append(buf, n);
    std::fclose(f);
    return s;
}

std::string fixed3(double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.3f", v);
    return b;
}

TEST(PlanDiloco, BeatsEveryStepWhereDpCrossesIslandsAndHAmortizesTheOuterSync) {
    tpd_plan_cluster cl = islands();
    tpd_plan_layout l = layout(8, 1, 128);
    // the layout's whole DP group crosses islands; one replica of 64 stays inside one
    ASSERT_EQ(tpd_plan_group_hop(&cl, l.dp, l.tp), TPD_PLAN_HOP_ISLAND);
    ASSERT_NE(tpd_plan_group_hop(&cl, l.dp / 2, l.tp), TPD_PLAN_HOP_ISLAND);
    double prev = 0.0;
    for (int h : {5, 20, 50}) {
        tpd_plan_result r = eval(with_diloco(gpt18b(), 2, h, 1, 0), cl, l);
        ASSERT_EQ(r.diloco, 1);
        EXPECT_EQ(r.dp_replicas, 2);
        EXPECT_EQ(r.dp_inner, 64);
        EXPECT_EQ(r.every_step_hop_dp, TPD_PLAN_HOP_ISLAND);
        EXPECT_NE(r.hop_dp, TPD_PLAN_HOP_ISLAND);
        EXPECT_EQ(r.hop_outer, TPD_PLAN_HOP_ISLAND);
        ASSERT_GT(r.every_step_time_s, 0.0);
        EXPECT_LT(r.step_time_s, r.every_step_time_s) << "H=" << h;
        EXPECT_GT(r.tokens_per_s, r.every_step_tokens_per_s);
        // without overlap the whole outer all-reduce is exposed, once every H steps
        ASSERT_GT(r.outer_comm_s, 0.0);
        EXPECT_NEAR(r.time.dp_outer, r.outer_comm_s / h, 1e-12 * r.outer_comm_s);
        if (prev > 0.0) EXPECT_LT(r.time.dp_outer, prev) << "H=" << h;
        prev = r.time.dp_outer;
    }
}

TEST(PlanDiloco, FragmentsDivideThePeakOuterBytes) {
    tpd_plan_cluster cl = islands();
    tpd_plan_layout l = layout(8, 1, 128);
    tpd_plan_result one = eval(with_diloco(gpt18b(), 2, 20, 1, 0), cl, l);
    tpd_plan_result four = eval(with_diloco(gpt18b(), 2, 20, 4, 0), cl, l);
    ASSERT_GT(four.outer_frag_bytes, 0.0);
    // ceil(shard / 4) elements: 4 fragments within 4 elements of fp32 of the whole
    EXPECT_NEAR(4.0 * four.outer_frag_bytes, one.outer_frag_bytes, 4.0 * 4.0);
    EXPECT_EQ(four.diloco_fragments, 4);
    // the same bytes per sync in all, one more ring's latency per fragment
    EXPECT_GE(four.outer_comm_s, one.outer_comm_s * (1.0 - 1e-9));
    EXPECT_LT(four.outer_comm_s, one.outer_comm_s * 1.05);
}

TEST(PlanDiloco, OverlapStepsNeverSlowTheStep) {
    tpd_plan_cluster cl = islands();
    for (tpd_plan_layout l : {layout(8, 1, 128), layout(8, 4, 32)}) {
        double prev = 0.0;
        for (int k : {0, 1, 2, 4}) { // below H / F = 5
            tpd_plan_result r = eval(with_diloco(gpt18b(), 2, 20, 4, k), cl, l);
            EXPECT_EQ(r.diloco_overlap_steps, k);
            // each of the F fragments' all-reduces is hidden behind k steps of compute
            double frag = r.outer_comm_s / 4, hidden = k * r.time.compute;
            EXPECT_NEAR(r.time.dp_outer, (frag > hidden ? frag - hidden : 0.0) * 4 / 20,
                        1e-12 * r.outer_comm_s);
            if (k > 0) EXPECT_LE(r.step_time_s, prev) << "overlap_steps " << k;
            prev = r.step_time_s;
        }
    }
}

TEST(PlanDiloco, EveryStepFiguresAreThePlainEveryStepEvaluation) {
    tpd_plan_cluster cl = islands();
    for (tpd_plan_layout l : {layout(8, 1, 128), layout(8, 4, 32), layout(4, 2, 128)}) {
        SCOPED_TRACE(l.tp * 1000 + l.pp * 100 + l.dp);
        tpd_plan_result d = eval(with_diloco(gpt18b(), 2, 50, 1, 0), cl, l);
        tpd_plan_result e = eval(gpt18b(), cl, l);
        ASSERT_EQ(e.diloco, 0);
        EXPECT_EQ(e.every_step_time_s, 0.0); // nothing to compare with
        EXPECT_DOUBLE_EQ(d.every_step_time_s, e.step_time_s);
        EXPECT_DOUBLE_EQ(d.every_step_tokens_per_s, e.tokens_per_s);
        EXPECT_DOUBLE_EQ(d.every_step_mfu, e.mfu);
        EXPECT_DOUBLE_EQ(d.every_step_dp_bytes, e.dp_bytes_step);
        EXPECT_EQ(d.every_step_hop_dp, e.hop_dp);
    }
}

TEST(PlanDiloco, SearchPlansDilocoOnlyWhenTheConfigAsks) {
    tpd_plan_cluster cl = islands();
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = kGpus;
    opt.top_k = 10;
    // DiLoCo would win on this cluster (the test above): the search must still not pick it
    tpd_config every = gpt18b();
    tpd_plan_search s;
    ASSERT_EQ(tpd_plan_search_run(&every, &cl, &opt, &s), TPD_OK);
    ASSERT_GT(s.n_top, 0);
    for (int i = 0; i < s.n_top; i++) {
        EXPECT_EQ(s.top[i].diloco, 0) << i;
        EXPECT_EQ(s.top[i].dp_replicas, 1) << i;
        EXPECT_EQ(s.top[i].time.dp_outer, 0.0) << i;
        EXPECT_EQ(s.top[i].every_step_time_s, 0.0) << i;
    }
    tpd_plan_search_free(&s);
    tpd_config asks = with_diloco(gpt18b(), 2, 50, 1, 0);
    ASSERT_EQ(tpd_plan_search_run(&asks, &cl, &opt, &s), TPD_OK);
    ASSERT_GT(s.n_top, 0);
    for (int i = 0; i < s.n_top; i++) {
        EXPECT_EQ(s.top[i].diloco, 1) << i;
        EXPECT_GT(s.top[i].every_step_time_s, 0.0) << i; // the reports' pass timed both
    }
    tpd_plan_search_free(&s);
}

TEST(PlanDiloco, ReportPrintsBothStepTimes) {
    tpd_plan_cluster cl = islands();
    tpd_plan_layout l = layout(8, 1, 128);
    tpd_plan_result d = eval(with_diloco(gpt18b(), 2, 20, 4, 1), cl, l);
    std::string out = printed(d);
    std::string row = "step time (s)";
    size_t at = out.find(row);
    ASSERT_NE(at, std::string::npos) << out;
    std::string line = out.substr(at, out.find('\n', at) - at);
    size_t every = line.find(fixed3(d.every_step_time_s)), dil = line.find(fixed3(d.step_time_s));
    ASSERT_NE(every, std::string::npos) << line;
    ASSERT_NE(dil, std::string::npos) << line;
    EXPECT_LT(every, dil) << line; // every step first, DiLoCo beside it
    EXPECT_NE(out.find("H=20, 4 fragment(s), overlap_steps 1, 2 replicas x DP 64"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("link inter-island"), std::string::npos) << out;
    EXPECT_NE(out.find(fixed3(d.step_time_s / d.every_step_time_s) + " of the step time"),
              std::string::npos)
        << out;
    // every-step sync prints no DiLoCo block
    EXPECT_EQ(printed(eval(gpt18b(), cl, l)).find("DiLoCo"), std::string::npos);

    char *js = tpd_plan_json(nullptr, &d, 1);
    ASSERT_NE(js, nullptr);
    cJSON *arr = cJSON_Parse(js);
    std::free(js);
    ASSERT_TRUE(cJSON_IsArray(arr));
    const cJSON *o = cJSON_GetArrayItem(arr, 0);
    const cJSON *dl = cJSON_GetObjectItem(o, "diloco");
    ASSERT_TRUE(cJSON_IsObject(dl));
    const cJSON *es = cJSON_GetObjectItem(dl, "every_step");
    ASSERT_TRUE(cJSON_IsObject(es));
    EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(es, "step_time_s")->valuedouble, d.every_step_time_s);
    EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(dl, "step_time_s")->valuedouble, d.step_time_s);
    EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(dl, "outer_fragment_bytes")->valuedouble,
                     d.outer_frag_bytes);
    EXPECT_STREQ(cJSON_GetObjectItem(dl, "outer_link")->valuestring, "inter-island");
    EXPECT_EQ(cJSON_GetObjectItem(dl, "sync_interval")->valueint, 20);
    cJSON_Delete(arr);
    tpd_plan_result e = eval(gpt18b(), cl, l);
    js = tpd_plan_json(nullptr, &e, 1);
    ASSERT_NE(js, nullptr);
    arr = cJSON_Parse(js);
    std::free(js);
    EXPECT_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 0), "diloco"), nullptr);
    cJSON_Delete(arr);
}

// The command of the docs: gpt3-175b on the two islands, DiLoCo asked for by overrides.
TEST(PlanDiloco, CliShowsTheSideBySideForTheBestLayout) {
    std::string cfg = std::string(tpd_source_dir()) + "/configs/gpt3-175b.yaml";
    std::vector<std::string> args = {"plan",
                                     cfg,
                                     "--cluster",
                                     "dgx-h100-2islands",
                                     "--gpus",
                                     "1024",
                                     "--top",
                                     "3",
                                     "parallel.dp_sync=diloco",
                                     "diloco.replicas=2",
                                     "diloco.sync_interval=50"};
    std::vector<char *> argv;
    for (auto &a : args)
        argv.push_back(a.data());
    testing::internal::CaptureStdout();
    int rc = tpd_cli_plan((int)argv.size(), argv.data());
    std::string out = testing::internal::GetCapturedStdout();
    ASSERT_EQ(rc, 0) << out;
    size_t best = out.find("best layout:");
    ASSERT_NE(best, std::string::npos) << out;
    size_t block = out.find("DP sync, the same layout both ways", best);
    ASSERT_NE(block, std::string::npos) << out;
    EXPECT_NE(out.find("H=50, 1 fragment(s), overlap_steps 0, 2 replicas x DP", block),
              std::string::npos);
    EXPECT_NE(out.find("every step", block), std::string::npos);
    EXPECT_NE(out.find("of the step time", block), std::string::npos);
    // without the overrides: no DiLoCo anywhere
    args.resize(8);
    argv.clear();
    for (auto &a : args)
        argv.push_back(a.data());
    testing::internal::CaptureStdout();
    rc = tpd_cli_plan((int)argv.size(), argv.data());
    out = testing::internal::GetCapturedStdout();
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(out.find("DiLoCo"), std::string::npos) << out;
}

} // namespace
