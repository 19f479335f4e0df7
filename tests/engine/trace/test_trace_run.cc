// The recorder of real steps on one rank: every action of the recorded steps, in order,
// in valid Chrome trace JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cjson/cJSON.h>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "common/tiny.h"

extern "C" {
#include "engine/trace/trace_run.h"
#include "engine/train/train.h"
#include "parallel/comm.h"
}

namespace {

tpd_comm *g_world = nullptr;

TEST(SweepTrace, RecorderWritesEveryActionOfOneRank) {
    std::string data = tiny::write_corpus(tiny::temp_prefix("trace"));
    tpd_config cfg = tiny::config(data);
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    tpd_trace_run *rec = nullptr;
    ASSERT_EQ(tpd_trace_run_create(g_world, 0, 0, 0, 2, &rec), TPD_OK);
    tpd_trainer_set_observer(tr, tpd_trace_run_on_action, rec);
    for (int i = 0; i < 3; i++) { // the third step is past max_steps: not recorded
        tpd_step_stats s;
        ASSERT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
        tpd_trace_run_step_end(rec, s.t_reduce_s, s.t_optim_s);
    }
    std::string path = tiny::temp_prefix("trace") + ".json";
    ASSERT_EQ(tpd_trace_run_write(rec, path.c_str()), TPD_OK);
    tpd_trainer_set_observer(tr, nullptr, nullptr);
    tpd_trace_run_destroy(rec);
    int M = tpd_trainer_micro_batches(tr);
    tpd_trainer_destroy(tr);
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    cJSON *js = cJSON_Parse(ss.str().c_str());
    ASSERT_NE(js, nullptr);
    int fwd = 0, bwd = 0, opt = 0, named = 0;
    double last_end = 0, prev_ts = -1;
    bool ordered = true;
    cJSON *ev;
    cJSON_ArrayForEach(ev, cJSON_GetObjectItem(js, "traceEvents")) {
        std::string name = cJSON_GetObjectItem(ev, "name")->valuestring;
        if (name == "process_name") {
            named++;
            continue;
        }
        double ts = cJSON_GetObjectItem(ev, "ts")->valuedouble;
        double dur = cJSON_GetObjectItem(ev, "dur")->valuedouble;
        EXPECT_GE(dur, 0.0);
        EXPECT_GE(ts, 0.0);
        if (ts < prev_ts) ordered = false;
        prev_ts = ts;
        last_end = std::max(last_end, ts + dur);
        fwd += name.rfind("FWD mb=", 0) == 0;
        bwd += name.rfind("BWD mb=", 0) == 0;
        opt += name == "OPTIMIZER";
    }
    EXPECT_EQ(named, 1);
    EXPECT_EQ(fwd, 2 * M);
    EXPECT_EQ(bwd, 2 * M);
    EXPECT_EQ(opt, 2);
    EXPECT_TRUE(ordered);
    EXPECT_GT(last_end, 0.0);
    cJSON_Delete(js);
    std::remove(path.c_str());
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    if (tpd_comm_mpi_start(&g_world) != TPD_OK) return 1;
    int rc = RUN_ALL_TESTS();
    tpd_comm_mpi_finish(g_world);
    return rc;
}
