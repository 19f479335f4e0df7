// `tripod plan` end to end: the table, --json (parsed with cJSON, every field present),
// --trace (valid Chrome trace JSON with FWD/BWD events for every stage), --ranks.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/status.h"
#include "engine/cli/cli.h"
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"
}

#include "plan_test_util.h"

namespace {

const std::string kConfigPath = plan_test::scratch_path("cli_test.yaml");
const char *kConfig = kConfigPath.c_str();
struct RemoveAtExit {
    ~RemoveAtExit() {
        std::remove(kConfigPath.c_str());
    }
} g_remove_config;

void write_config() {
    std::ofstream f(kConfig);
    f << "model:\n  num_layers: 24\n  hidden_size: 2048\n  num_attention_heads: 16\n"
         "  vocab_size: 50257\n  seq_length: 2048\n"
         "parallel:\n  tensor_model_parallel_size: 2\n  pipeline_model_parallel_size: 4\n"
         "  data_parallel_size: 2\n"
         "training:\n  micro_batch_size: 2\n  global_batch_size: 64\n  precision: bf16\n"
         "  device: cuda\n  train_iters: 10\n";
}

using plan_test::run;

std::string slurp(const char *path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

TEST(PlanCli, SearchPrintsRankedTable) {
    write_config();
    std::string out;
    ASSERT_EQ(run({"plan", kConfig, "--cluster", "dgx-a100-80g", "--gpus", "16"}, &out), 0) << out;
    EXPECT_NE(out.find("TFLOP/s/GPU"), std::string::npos) << out;
    EXPECT_NE(out.find("best layout:"), std::string::npos);
    EXPECT_NE(out.find("pipeline bubble"), std::string::npos);
    EXPECT_NE(out.find("   1 "), std::string::npos);
}

TEST(PlanCli, JsonHasEveryField) {
    write_config();
    std::string out;
    ASSERT_EQ(
        run({"plan", kConfig, "--cluster", "dgx-a100-80g", "--gpus", "16", "--top", "4", "--json"},
            &out),
        0);
    cJSON *arr = cJSON_Parse(out.c_str());
    ASSERT_NE(arr, nullptr) << out;
    ASSERT_TRUE(cJSON_IsArray(arr));
    ASSERT_EQ(cJSON_GetArraySize(arr), 4);
    const char *fields[] = {"pipeline_schedule",
                            "overlap_grad_reduce",
                            "overlap_param_gather",
                            "virtual_stage_layers",
                            "tp",
                            "pp",
                            "dp",
                            "cp",
                            "cp_comm_type",
                            "world",
                            "planned_only",
                            "micro_batch_size",
                            "num_micro_batches",
                            "virtual_stages",
                            "recompute",
                            "sequence_parallel",
                            "distributed_optimizer",
                            "fits",
                            "reject_reason",
                            "memory_bytes_per_rank",
                            "memory_breakdown",
                            "step_time_s",
                            "time_breakdown",
                            "tflops_per_gpu",
                            "hw_tflops_per_gpu",
                            "mfu",
                            "tokens_per_s",
                            "pipeline_layers",
                            "pipeline_layers_balanced"};
    double prev = 0.0;
    cJSON *o;
    cJSON_ArrayForEach(o, arr) {
        for (const char *f : fields)
            EXPECT_TRUE(cJSON_HasObjectItem(o, f)) << f;
        int tp = cJSON_GetObjectItem(o, "tp")->valueint,
            pp = cJSON_GetObjectItem(o, "pp")->valueint,
            dp = cJSON_GetObjectItem(o, "dp")->valueint;
        EXPECT_EQ(tp * pp * dp, 16);
        EXPECT_TRUE(cJSON_IsTrue(cJSON_GetObjectItem(o, "fits")));
        double step = cJSON_GetObjectItem(o, "step_time_s")->valuedouble;
        EXPECT_GE(step, prev); // ranked fastest first
        prev = step;
        cJSON *mb = cJSON_GetObjectItem(o, "memory_breakdown");
        ASSERT_EQ(cJSON_GetArraySize(mb), pp);
        double maxtotal = 0.0;
        cJSON *st;
        cJSON_ArrayForEach(st, mb) {
            double sum = 0.0;
            for (const char *k :
                 {"params", "grads", "optimizer", "activations", "workspace", "gather"}) {
                ASSERT_TRUE(cJSON_HasObjectItem(st, k)) << k;
                sum += cJSON_GetObjectItem(st, k)->valuedouble;
            }
            EXPECT_NEAR(sum, cJSON_GetObjectItem(st, "total")->valuedouble, 1.0);
            maxtotal = std::max(maxtotal, sum);
        }
        EXPECT_NEAR(cJSON_GetObjectItem(o, "memory_bytes_per_rank")->valuedouble, maxtotal, 1.0);
        cJSON *tb = cJSON_GetObjectItem(o, "time_breakdown");
        double parts = 0.0;
        for (const char *k : {"compute", "pp_bubble", "pp_p2p", "dp_comm_exposed", "optimizer",
                              "dp_gather_exposed", "dp_shard_exposed", "dp_replica_allreduce",
                              "straggler", "global_sync", "step_host"}) {
            ASSERT_TRUE(cJSON_HasObjectItem(tb, k)) << k;
            parts += cJSON_GetObjectItem(tb, k)->valuedouble;
        }
        EXPECT_TRUE(cJSON_HasObjectItem(tb, "tp_comm"));
        EXPECT_NEAR(parts, step, 1e-9 * step); // the parts add up to the step
        // beside them: the idle fraction and how much DP communication was hidden
        double idle = cJSON_GetObjectItem(tb, "pp_idle_fraction")->valuedouble;
        EXPECT_GE(idle, 0.0);
        EXPECT_LT(idle, 1.0);
        EXPECT_GE(cJSON_GetObjectItem(tb, "dp_comm_total")->valuedouble,
                  cJSON_GetObjectItem(tb, "dp_comm_exposed")->valuedouble);
        EXPECT_TRUE(cJSON_HasObjectItem(tb, "dp_exposed_max"));
        // what trains it: every parallel.* key, and the schedule the layout runs
        std::string sched = cJSON_GetObjectItem(o, "pipeline_schedule")->valuestring;
        cJSON *ov = cJSON_GetObjectItem(o, "overrides");
        ASSERT_TRUE(cJSON_IsArray(ov));
        std::string all;
        cJSON *it;
        cJSON_ArrayForEach(it, ov) all += std::string(it->valuestring) + " ";
        for (const char *k :
             {"parallel.tensor_model_parallel_size=", "parallel.pipeline_model_parallel_size=",
              "parallel.virtual_pipeline_model_parallel_size=", "parallel.pipeline_layers=",
              "parallel.overlap_grad_reduce=", "parallel.overlap_param_gather=",
              "parallel.sequence_parallel=", "parallel.use_distributed_optimizer=",
              "training.recompute="})
            EXPECT_NE(all.find(k), std::string::npos) << k << " in " << all;
        EXPECT_NE(all.find("parallel.pipeline_schedule=" + sched + " "), std::string::npos) << all;
        double mfu = cJSON_GetObjectItem(o, "mfu")->valuedouble;
        EXPECT_GT(mfu, 0.0);
        EXPECT_LT(mfu, 1.0);
    }
    cJSON_Delete(arr);
}

// Each prediction carries the held-out error of its class (plan/heldout.c): in the report beside
// the step time and in the JSON; a cpu profile has none.
TEST(PlanCli, PredictionsCarryTheHeldOutErrorOfTheirClass) {
    write_config();
    std::string out;
    ASSERT_EQ(run({"plan", kConfig, "--cluster", "dgx-a100-80g", "--gpus", "16"}, &out), 0) << out;
    EXPECT_NE(out.find(", held-out error of this class "), std::string::npos) << out;
    EXPECT_NE(out.find("(A100 profiles, "), std::string::npos) << out;
    ASSERT_EQ(
        run({"plan", kConfig, "--cluster", "dgx-h100", "--gpus", "16", "--top", "2", "--json"},
            &out),
        0);
    cJSON *arr = cJSON_Parse(out.c_str());
    ASSERT_NE(arr, nullptr) << out;
    cJSON *o;
    cJSON_ArrayForEach(o, arr) {
        cJSON *h = cJSON_GetObjectItem(o, "heldout_error");
        ASSERT_NE(h, nullptr);
        EXPECT_STREQ(cJSON_GetStringValue(cJSON_GetObjectItem(h, "class")), "H100 profiles");
        double lo = cJSON_GetObjectItem(h, "lo")->valuedouble;
        double hi = cJSON_GetObjectItem(h, "hi")->valuedouble;
        EXPECT_LT(lo, 0.0);
        EXPECT_GT(hi, 0.0);
        EXPECT_GT(cJSON_GetObjectItem(h, "runs")->valueint, 0);
    }
    cJSON_Delete(arr);
    tpd_plan_cluster cpu;
    ASSERT_EQ(tpd_plan_cluster_load("cpu", &cpu), TPD_OK);
    tpd_plan_band band;
    tpd_plan_heldout_band(&cpu, &band);
    EXPECT_EQ(band.cls, nullptr);
}

TEST(PlanCli, OneLayoutTraceHasEveryStage) {
    write_config();
    const std::string trace_path = plan_test::scratch_path("cli_trace.json");
    const char *trace = trace_path.c_str();
    std::string out;
    ASSERT_EQ(run({"plan", kConfig, "--cluster", "dgx-a100-80g", "--layout", "2,4,2", "--trace",
                   trace, "parallel.virtual_pipeline_model_parallel_size=2",
                   "parallel.pipeline_schedule=interleaved"},
                  &out),
              0)
        << out;
    EXPECT_NE(out.find("v=2"), std::string::npos) << out;
    std::string text = slurp(trace);
    cJSON *root = cJSON_Parse(text.c_str());
    ASSERT_NE(root, nullptr) << text.substr(0, 400);
    cJSON *ev = cJSON_GetObjectItem(root, "traceEvents");
    ASSERT_TRUE(cJSON_IsArray(ev));
    std::set<int> fwd_stages, bwd_stages;
    int fwd = 0, bwd = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, ev) {
        const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
        if (std::string(cJSON_GetObjectItem(e, "ph")->valuestring) != "X") continue;
        int pid = cJSON_GetObjectItem(e, "pid")->valueint;
        EXPECT_GE(cJSON_GetObjectItem(e, "dur")->valuedouble, 0.0);
        if (std::string(name).rfind("FWD mb=", 0) == 0) {
            fwd_stages.insert(pid);
            fwd++;
        }
        if (std::string(name).rfind("BWD mb=", 0) == 0) {
            bwd_stages.insert(pid);
            bwd++;
        }
    }
    EXPECT_EQ(fwd_stages, (std::set<int>{0, 1, 2, 3}));
    EXPECT_EQ(bwd_stages, (std::set<int>{0, 1, 2, 3}));
    // 64 / (2*2) = 16 micro-batches x 2 chunks on each of 4 stages.
    EXPECT_EQ(fwd, 16 * 2 * 4);
    EXPECT_EQ(bwd, 16 * 2 * 4);
    cJSON_Delete(root);
    std::remove(trace);
}

TEST(PlanCli, RanksTableMatchesMegatronOrder) {
    write_config();
    std::string out;
    ASSERT_EQ(run({"plan", kConfig, "--ranks", "--layout", "2,4,2"}, &out), 0) << out;
    // Megatron's example: world 16, TP=2, PP=4, DP=2.
    EXPECT_NE(out.find("[0,1] [2,3]"), std::string::npos) << out;
    EXPECT_NE(out.find("[0,2] [1,3] [4,6] [5,7]"), std::string::npos) << out;
    EXPECT_NE(out.find("[0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]"), std::string::npos);
    EXPECT_NE(out.find("[0,12] [1,13] [2,14] [3,15]"), std::string::npos);
}

// With CP (--layout TP,PP,DP,CP): rank = tp + TP*(cp + CP*(dp + DP*pp)); the CP groups are
// CP ranks TP apart, the gradients' group DP x CP, and the breakdown and JSON carry CP.
TEST(PlanCli, RanksTableWithContextParallelism) {
    write_config();
    std::string out;
    ASSERT_EQ(run({"plan", kConfig, "--ranks", "--layout", "2,2,2,2"}, &out), 0) << out;
    EXPECT_NE(out.find("rank = tp + TP*(cp + CP*(dp + DP*pp))"), std::string::npos) << out;
    EXPECT_NE(out.find("cp groups: [0,2] [1,3] [4,6] [5,7] [8,10]"), std::string::npos) << out;
    EXPECT_NE(out.find("dp groups (DP x CP): [0,2,4,6] [1,3,5,7] [8,10,12,14]"), std::string::npos)
        << out;
    EXPECT_NE(out.find("pp groups: [0,8] [1,9]"), std::string::npos) << out;
    // rank 6: tp 0, cp 1, dp 1, pp 0
    EXPECT_NE(out.find("       6    0    1    1    0\n"), std::string::npos) << out;
    ASSERT_EQ(run({"plan", kConfig, "--cluster", "dgx-a100-80g", "--layout", "2,2,2,2"}, &out), 0)
        << out;
    for (const char *k : {"TP=2 CP=2(p2p) PP=2 DP=2", "CP comm", "context parallel: CP=2 p2p",
                          "links (rank order TP fastest, then CP, then DP, then PP)",
                          "parallel.context_parallel_size=2 parallel.cp_comm_type=p2p"})
        EXPECT_NE(out.find(k), std::string::npos) << k << " in\n" << out;
    ASSERT_EQ(run({"plan", kConfig, "--cluster", "dgx-a100-80g", "--layout", "2,2,2,2", "--json",
                   "parallel.cp_comm_type=a2a"},
                  &out),
              0)
        << out;
    cJSON *arr = cJSON_Parse(out.c_str());
    ASSERT_NE(arr, nullptr) << out;
    cJSON *o = cJSON_GetArrayItem(arr, 0);
    EXPECT_EQ(cJSON_GetObjectItem(o, "cp")->valueint, 2);
    EXPECT_STREQ(cJSON_GetObjectItem(o, "cp_comm_type")->valuestring, "a2a");
    EXPECT_EQ(cJSON_GetObjectItem(o, "world")->valueint, 16);
    EXPECT_TRUE(cJSON_IsTrue(cJSON_GetObjectItem(o, "planned_only"))); // CP on cuda
    EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "links"), "cp")->valuestring, "nvlink");
    EXPECT_GT(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "time_breakdown"), "cp_comm")->valuedouble,
              0.0);
    EXPECT_GT(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "context_parallel"), "bytes_per_layer")
                  ->valuedouble,
              0.0);
    cJSON_Delete(arr);
}

TEST(PlanCli, BadArgumentsAreConfigErrors) {
    write_config();
    std::string out;
    testing::internal::CaptureStderr();
    EXPECT_EQ(run({"plan", kConfig, "--layout", "2,4"}, &out), TPD_EXIT_CONFIG);
    EXPECT_EQ(run({"plan", kConfig, "--cluster", "no-such"}, &out), TPD_EXIT_CONFIG);
    EXPECT_EQ(run({"plan", kConfig, "--layout", "3,4,1", "--cluster", "dgx-a100-80g"}, &out),
              TPD_EXIT_CONFIG);
    EXPECT_EQ(run({"plan", kConfig, "--dp-overlap", "yes"}, &out), TPD_EXIT_CONFIG);
    EXPECT_EQ(run({"plan", kConfig, "--param-gather-overlap", "1"}, &out), TPD_EXIT_CONFIG);
    // a layout the trainer would reject: zb-h1 cannot split a backward full recompute drops
    EXPECT_EQ(run({"plan", kConfig, "--layout", "2,4,2", "--cluster", "dgx-a100-80g",
                   "parallel.pipeline_schedule=zb-h1", "training.recompute=selective",
                   "parallel.virtual_pipeline_model_parallel_size=1"},
                  &out),
              0)
        << out;
    std::string err = testing::internal::GetCapturedStderr();
    // --layout is validated as the config it makes
    EXPECT_NE(err.find("with --layout 3,4,1"), std::string::npos) << err;
    EXPECT_NE(err.find("num_attention_heads (16) must be a multiple of "
                       "tensor_model_parallel_size (3)"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("--dp-overlap 'yes' must be on or off"), std::string::npos) << err;
    EXPECT_NE(err.find("--param-gather-overlap '1' must be on or off"), std::string::npos) << err;
}

// The overlap flags come from the config unless a flag says otherwise, and the report
// shows the schedule, the idle fraction, the exposed DP and what trains the layout.
TEST(PlanCli, OverlapFollowsTheConfigAndTheReportSaysHowToTrain) {
    write_config();
    std::string out;
    auto overlap_of = [&](std::vector<std::string> extra) {
        std::vector<std::string> args = {"plan",     kConfig, "--cluster", "dgx-a100-80g",
                                         "--layout", "2,4,2", "--json"};
        args.insert(args.end(), extra.begin(), extra.end());
        EXPECT_EQ(run(args, &out), 0) << out;
        cJSON *arr = cJSON_Parse(out.c_str());
        EXPECT_NE(arr, nullptr) << out;
        if (!arr) return -1;
        cJSON *o = cJSON_GetArrayItem(arr, 0);
        int v = cJSON_IsTrue(cJSON_GetObjectItem(o, "overlap_grad_reduce")) * 2 +
                cJSON_IsTrue(cJSON_GetObjectItem(o, "overlap_param_gather"));
        cJSON_Delete(arr);
        return v;
    };
    EXPECT_EQ(overlap_of({}), 3); // the config's defaults: both on
    EXPECT_EQ(overlap_of({"parallel.overlap_grad_reduce=false"}), 1);
    EXPECT_EQ(overlap_of({"parallel.overlap_grad_reduce=false", "--dp-overlap", "on"}), 3);
    EXPECT_EQ(overlap_of({"parallel.overlap_param_gather=false"}), 2);
    EXPECT_EQ(overlap_of({"--param-gather-overlap", "off", "--dp-overlap", "off"}), 0);
    ASSERT_EQ(run({"plan", kConfig, "--cluster", "dgx-a100-80g", "--layout", "2,4,2",
                   "parallel.pipeline_schedule=zb-h1"},
                  &out),
              0);
    for (const char *k :
         {"zb-h1", "idle", "DP comm (exposed)", "param gather (exposed)",
          "to train it: tripod train", "parallel.pipeline_schedule=zb-h1", "(of which W"})
        EXPECT_NE(out.find(k), std::string::npos) << k << " in\n" << out;
}

// `tripod plan configs/llama3-70b.yaml --gpus 1024`: layouts of the Llama block that fit
// H200s, ranked, the best one's breakdown and, after it, what the preset says Meta
// published, to read beside the prediction.
TEST(PlanCli, Llama70bOn1024Gpus) {
    std::string cfg = std::string(tpd_source_dir()) + "/configs/llama3-70b.yaml";
    std::string out;
    ASSERT_EQ(run({"plan", cfg, "--gpus", "1024"}, &out), 0) << out;
    for (const char *k : {"cluster h200", "best layout:", "fits: yes", "to train it: tripod train",
                          "published: Llama 3 70B", "not published", "6.4M"})
        EXPECT_NE(out.find(k), std::string::npos) << k << " in\n" << out;
    EXPECT_LT(out.find("throughput:"), out.find("published:"));
    // every comment line of the preset marked "# published:", and no other line
    std::ifstream f(cfg);
    int marked = 0;
    for (std::string line; std::getline(f, line);)
        if (line.rfind("# published:", 0) == 0) {
            marked++;
            EXPECT_NE(out.find("\n" + line.substr(2) + "\n"), std::string::npos) << line;
        }
    EXPECT_GE(marked, 3);
    size_t printed = 0;
    for (size_t at = out.find("\npublished:"); at != std::string::npos;
         at = out.find("\npublished:", at + 1))
        printed++;
    EXPECT_EQ(printed, (size_t)marked);

    ASSERT_EQ(run({"plan", cfg, "--gpus", "1024", "--top", "5", "--json"}, &out), 0);
    cJSON *arr = cJSON_Parse(out.c_str());
    ASSERT_NE(arr, nullptr) << out;
    ASSERT_EQ(cJSON_GetArraySize(arr), 5);
    cJSON *o;
    cJSON_ArrayForEach(o, arr) {
        int tp = cJSON_GetObjectItem(o, "tp")->valueint,
            pp = cJSON_GetObjectItem(o, "pp")->valueint,
            dp = cJSON_GetObjectItem(o, "dp")->valueint,
            cp = cJSON_GetObjectItem(o, "cp")->valueint;
        EXPECT_EQ(tp * cp * pp * dp, 1024);
        EXPECT_EQ(cJSON_GetObjectItem(o, "world")->valueint, 1024);
        EXPECT_EQ(8 % tp, 0) << "the 8 K/V groups split whole over TP";
        EXPECT_TRUE(cJSON_IsTrue(cJSON_GetObjectItem(o, "fits")));
        EXPECT_LE(cJSON_GetObjectItem(o, "memory_bytes_per_rank")->valuedouble,
                  0.92 * 131 * 1073741824.0);
        double step = cJSON_GetObjectItem(o, "step_time_s")->valuedouble;
        EXPECT_NEAR(cJSON_GetObjectItem(o, "tokens_per_s")->valuedouble * step, 2048 * 8192.0,
                    1e-6 * 2048 * 8192.0);
        // model FLOPs of a step at its TP's padded vocabulary over the step: MFU
        double mfu = cJSON_GetObjectItem(o, "mfu")->valuedouble;
        EXPECT_GT(mfu, 0.2);
        EXPECT_LT(mfu, 0.8);
    }
    cJSON_Delete(arr);
}

// A preset's published lines, whatever their length, and nothing for a config without them.
TEST(PlanCli, PublishedLinesComeFromTheConfigFile) {
    const std::string path = plan_test::scratch_path("published.yaml");
    std::string longline = "# published: " + std::string(1500, 'x');
    {
        std::ofstream f(path);
        f << "# published: first\n#published: not this one\n  # published: nor this\n"
          << longline << "\n# published: last, without a newline";
    }
    tpd_config c;
    tpd_config_defaults(&c);
    std::snprintf(c.source_path, sizeof c.source_path, "%s", path.c_str());
    char *buf = nullptr;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    tpd_plan_print_published(mem, &c);
    fclose(mem);
    std::string got(buf, len);
    free(buf);
    EXPECT_EQ(got.find("published: first\n"), 0u) << got;
    EXPECT_EQ(got.find("not this"), std::string::npos);
    EXPECT_EQ(got.find("nor this"), std::string::npos);
    EXPECT_NE(got.find("published: xxxx"), std::string::npos);
    EXPECT_NE(got.find("\npublished: last, without a newline\n"), std::string::npos) << got;
    std::remove(path.c_str());
    c.source_path[0] = '\0';
    mem = open_memstream(&buf, &len);
    tpd_plan_print_published(mem, &c);
    fclose(mem);
    EXPECT_EQ(len, 0u);
    free(buf);
}

// --layout wins over the file: the config is validated with the layout's sizes, and a line
// says which sizes were used. GPT-3 175B's file says TP 8, PP 16, which does not divide 24
// layers; --layout 1,1,32 has PP 1.
TEST(PlanCli, LayoutWinsOverTheFile) {
    const std::string gpt3 = std::string(tpd_source_dir()) + "/configs/gpt3-175b.yaml";
    std::string out;
    ASSERT_EQ(run({"plan", gpt3, "model.num_layers=24", "--layout", "1,1,32", "--gpus", "32",
                   "--cluster", "dgx-a100-80g"},
                  &out),
              0)
        << out;
    EXPECT_NE(out.find("layout: TP=1 PP=1 DP=32 from --layout (the file says TP=8 PP=16)\n"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("TP=1 PP=1 DP=32"), std::string::npos) << out;
    EXPECT_NE(out.find("parallel.pipeline_model_parallel_size=1"), std::string::npos) << out;
    // the file's own layout: nothing to say
    ASSERT_EQ(run({"plan", gpt3, "--layout", "8,16,8", "--cluster", "dgx-a100-80g"}, &out), 0)
        << out;
    EXPECT_EQ(out.find("from --layout"), std::string::npos) << out;
    // a pipeline_layers list for 16 stages does not fit 2: dropped, and said so
    const std::string llama = std::string(tpd_source_dir()) + "/configs/llama3-405b.yaml";
    ASSERT_EQ(
        run({"plan", llama, "model.num_layers=32", "--layout", "8,2,4", "--cluster", "dgx-h100"},
            &out),
        0)
        << out;
    EXPECT_NE(out.find("layout: TP=8 PP=2 DP=4 from --layout (the file says TP=8 PP=16; its "
                       "pipeline_layers (16 entries) are dropped)"),
              std::string::npos)
        << out;
    // Megatron-Core's TP overlap in the file (with SP) has nothing to overlap at TP 1
    ASSERT_EQ(run({"plan", gpt3, "parallel.sequence_parallel=true", "parallel.tp_comm_overlap=true",
                   "--layout", "1,16,8", "--gpus", "128", "--cluster", "dgx-a100-80g"},
                  &out),
              0)
        << out;
    EXPECT_NE(out.find("layout: TP=1 PP=16 DP=8 from --layout (the file and its overrides say "
                       "TP=8 PP=16; its tp_comm_overlap is dropped (TP=1 has no TP "
                       "communication))"),
              std::string::npos)
        << out;
    // JSON stays JSON: the line goes to stderr
    testing::internal::CaptureStderr();
    ASSERT_EQ(run({"plan", gpt3, "model.num_layers=24", "--layout", "1,1,32", "--cluster",
                   "dgx-a100-80g", "--json"},
                  &out),
              0);
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("from --layout"), std::string::npos) << err;
    cJSON *js = cJSON_Parse(out.c_str());
    EXPECT_NE(js, nullptr) << out;
    cJSON_Delete(js);
}

// --framework: the profile's keys set on the cluster, named in the text and the JSON; tripod's
// own engine when not given (cuda); a slower framework gives a slower step; an unknown name is a
// configuration error listing the shipped profiles; --help documents the flag.
TEST(PlanCli, FrameworkProfileIsAppliedAndNamed) {
    write_config();
    std::string out;
    ASSERT_EQ(run({"plan", kConfig, "--cluster", "dgx-a100-80g", "--layout", "2,4,2"}, &out), 0)
        << out;
    EXPECT_NE(out.find("cluster dgx-a100-80g ("), std::string::npos) << out;
    EXPECT_NE(out.find(", framework tripod, "), std::string::npos) << out;
    auto step_of = [](const std::string &json) {
        cJSON *arr = cJSON_Parse(json.c_str());
        EXPECT_NE(arr, nullptr) << json;
        cJSON *o = cJSON_IsArray(arr) ? cJSON_GetArrayItem(arr, 0) : arr;
        double step = cJSON_GetObjectItem(o, "step_time_s")->valuedouble;
        std::string fw = cJSON_GetStringValue(cJSON_GetObjectItem(o, "framework"));
        cJSON_Delete(arr);
        return std::make_pair(step, fw);
    };
    ASSERT_EQ(
        run({"plan", kConfig, "--cluster", "dgx-a100-80g", "--layout", "2,4,2", "--json"}, &out),
        0);
    auto tripod = step_of(out);
    EXPECT_EQ(tripod.second, "tripod");
    ASSERT_EQ(run({"plan", kConfig, "--cluster", "dgx-a100-80g", "--layout", "2,4,2", "--framework",
                   "deepspeed-megatron", "--json"},
                  &out),
              0);
    auto ds = step_of(out);
    EXPECT_EQ(ds.second, "deepspeed-megatron");
    // its per-micro-batch host time (tens of ms) on each of the 16 micro-batches' paths
    EXPECT_GT(ds.first, tripod.first * 1.05) << ds.first << " vs " << tripod.first;

    // the same values as the library applies them
    tpd_plan_framework fw;
    ASSERT_EQ(tpd_plan_framework_load("deepspeed-megatron", &fw), TPD_OK);
    EXPECT_STREQ(fw.kind, "deepspeed");
    EXPECT_STREQ(fw.calibrated_from, "mtnlg2022");
    tpd_plan_cluster cl = plan_test::cluster("dgx-a100-80g");
    double launch = cl.kernel_overhead_s;
    tpd_plan_framework_apply(&fw, &cl);
    EXPECT_STREQ(cl.framework, "deepspeed-megatron");
    EXPECT_GT(cl.micro_batch_host_s, 0.0);
    EXPECT_NE(cl.kernel_overhead_s, launch);
    // tripod's own states no per-kernel gap: the cluster's holds
    ASSERT_EQ(tpd_plan_framework_load("tripod", &fw), TPD_OK);
    tpd_plan_cluster c2 = plan_test::cluster("dgx-a100-80g");
    tpd_plan_framework_apply(&fw, &c2);
    EXPECT_EQ(c2.kernel_overhead_s, launch);
    EXPECT_NE(std::string(fw.description).find("tripod's own engine"), std::string::npos);

    testing::internal::CaptureStderr();
    EXPECT_EQ(run({"plan", kConfig, "--framework", "no-such-framework"}, &out), TPD_EXIT_CONFIG);
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("framework profile 'no-such-framework' not found"), std::string::npos)
        << err;
    for (const char *n : {"tripod", "megatron-2021", "megatron-2022", "megatron-2023",
                          "nemo-mcore-2024", "deepspeed-megatron", "meta-llama3", "pytorch-fsdp"})
        EXPECT_NE(err.find(n), std::string::npos) << n << " not listed: " << err;
    char names[1024];
    tpd_plan_framework_names(names, sizeof names);
    EXPECT_NE(std::string(names).find("deepspeed-megatron, megatron-2021, megatron-2022"),
              std::string::npos)
        << names;

    ASSERT_EQ(run({"plan", "--help"}, &out), 0);
    EXPECT_NE(out.find("--framework"), std::string::npos) << out;
}

// A framework profile holds only the framework's keys: a hardware key is refused with the file,
// the line and the keys it may hold.
TEST(PlanCli, FrameworkProfileRefusesHardwareKeys) {
    std::string path = plan_test::scratch_path("fw_bad.yaml");
    {
        std::ofstream f(path);
        f << "name: bad\nstep_host_ms: 5\npeak_tflops: 312\n";
    }
    tpd_plan_framework fw;
    testing::internal::CaptureStderr();
    EXPECT_NE(tpd_plan_framework_load(path.c_str(), &fw), TPD_OK);
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find(path + ":3: a cluster's, not a framework's key 'peak_tflops'"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("micro_batch_host_us"), std::string::npos) << err;
    {
        std::ofstream f(path);
        f << "name: ok\nkind: test\nstep_host_ms: 5\nglobal_sync_algorithm: ring\n";
    }
    ASSERT_EQ(tpd_plan_framework_load(path.c_str(), &fw), TPD_OK);
    EXPECT_EQ(fw.n_set, 2);
    tpd_plan_cluster cl = plan_test::cluster("dgx-h100");
    tpd_plan_framework_apply(&fw, &cl);
    EXPECT_DOUBLE_EQ(cl.step_host_s, 5e-3);
    EXPECT_EQ(cl.sync_ring, 1);
    std::remove(path.c_str());
}

} // namespace
