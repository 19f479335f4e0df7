// What a run leaves for people: TensorBoard event files (the record framing and its CRCs
// against a plain bitwise CRC32C, the events decoded back, a training run whose event file
// holds the same scalars as its JSONL metrics), `tripod report`'s join of a resumed run's
// segments and its pictures, and the progress line's arithmetic.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/tiny.h"
#include "engine/checkpoint/ckpt_test_util.h" // fresh_dir, slurp
#include <sstream>

extern "C" {
#include "base/file.h"
#include "base/progress.h"
#include "engine/train/metrics.h"
#include "engine/train/metrics_plot.h"
#include "engine/train/tensorboard.h"
#include "engine/train/train.h"
#include "tb_event.pb-c.h"
}

namespace {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), one bit at a time.
uint32_t crc32c_ref(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

uint32_t masked_ref(const uint8_t *p, size_t n) {
    uint32_t c = crc32c_ref(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

uint64_t le(const std::string &s, size_t at, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)(uint8_t)s[at + i] << (8 * i);
    return v;
}

struct Scalar {
    int64_t step;
    std::string tag;
    float value;
};

// Every record of an event file, framing and CRCs checked; the first must be the version.
std::vector<Scalar> read_events(const std::string &path) {
    std::string f = ckt::slurp(path);
    std::vector<Scalar> out;
    size_t at = 0;
    int records = 0;
    while (at < f.size()) {
        EXPECT_GE(f.size() - at, 16u) << "truncated record at byte " << at;
        if (f.size() - at < 16) break;
        uint64_t n = le(f, at, 8);
        const uint8_t *base = reinterpret_cast<const uint8_t *>(f.data());
        EXPECT_EQ(le(f, at + 8, 4), masked_ref(base + at, 8)) << "length CRC at " << at;
        EXPECT_LE(at + 12 + n + 4, f.size());
        EXPECT_EQ(le(f, at + 12 + n, 4), masked_ref(base + at + 12, n)) << "data CRC at " << at;
        TpdTb__Event *ev = tpd_tb__event__unpack(nullptr, n, base + at + 12);
        EXPECT_NE(ev, nullptr);
        if (!ev) break;
        if (records == 0) EXPECT_STREQ(ev->file_version, "brain.Event:2");
        EXPECT_GT(ev->wall_time, 1.7e9);
        if (ev->summary)
            for (size_t i = 0; i < ev->summary->n_value; i++) {
                // present on the wire even when 0: TensorBoard drops it otherwise
                EXPECT_EQ(ev->summary->value[i]->value_case,
                          TPD_TB__SUMMARY_VALUE__VALUE_SIMPLE_VALUE);
                out.push_back(
                    {ev->step, ev->summary->value[i]->tag, ev->summary->value[i]->simple_value});
            }
        tpd_tb__event__free_unpacked(ev, nullptr);
        at += 12 + n + 4;
        records++;
    }
    EXPECT_GE(records, 1);
    return out;
}

TEST(TensorBoard, MaskedCrcMatchesTheBitwiseReference) {
    const char *check = "123456789";
    EXPECT_EQ(crc32c_ref(reinterpret_cast<const uint8_t *>(check), 9), 0xE3069283u);
    std::vector<uint8_t> buf(1000);
    for (size_t i = 0; i < buf.size(); i++)
        buf[i] = (uint8_t)(i * 131 + 7);
    for (size_t n : {0u, 1u, 7u, 8u, 63u, 1000u})
        EXPECT_EQ(tpd_tb_masked_crc(buf.data(), n), masked_ref(buf.data(), n)) << n;
}

TEST(TensorBoard, EventsDecodeToTheWrittenScalars) {
    std::string dir = ckt::fresh_dir(tiny::temp_prefix("tb_unit"));
    tpd_tb_writer *w = nullptr;
    ASSERT_EQ(tpd_tb_open(dir.c_str(), &w), TPD_OK);
    std::string path = tpd_tb_path(w);
    EXPECT_NE(path.find("/events.out.tfevents."), std::string::npos);
    const char *tags[] = {"lm loss", "learning-rate"};
    for (int step = 1; step <= 3; step++) {
        double v[] = {10.0 / step, 1e-4 * step};
        ASSERT_EQ(tpd_tb_scalars(w, step, 2, tags, v), TPD_OK);
    }
    tpd_tb_close(w);
    std::vector<Scalar> s = read_events(path);
    ASSERT_EQ(s.size(), 6u);
    for (int i = 0; i < 6; i++) {
        int step = i / 2 + 1;
        EXPECT_EQ(s[i].step, step);
        EXPECT_EQ(s[i].tag, tags[i % 2]);
        EXPECT_EQ(s[i].value, (float)(i % 2 ? 1e-4 * step : 10.0 / step));
    }
}

TEST(TensorBoard, TrainingWritesTheMetricsScalars) {
    std::string root = ckt::fresh_dir(tiny::temp_prefix("tb_train"));
    std::filesystem::create_directories(root);
    std::string data = tiny::write_corpus(root + "/corpus");
    tpd_config cfg = tiny::config(data);
    cfg.training.train_iters = 3;
    cfg.logging.log_params_norm = 1;
    snprintf(cfg.logging.metrics_file, sizeof cfg.logging.metrics_file, "%s/m.jsonl", root.c_str());
    snprintf(cfg.logging.tensorboard_dir, sizeof cfg.logging.tensorboard_dir, "%s/tb",
             root.c_str());
    tpd_comm *world = nullptr;
    ASSERT_EQ(tpd_comm_self_create(&world), TPD_OK);
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, world, &tr), TPD_OK);
    ASSERT_EQ(tpd_trainer_run(tr), TPD_OK);
    tpd_trainer_destroy(tr);
    tpd_comm_destroy(world);
    std::vector<std::string> files;
    for (const auto &e : std::filesystem::directory_iterator(root + "/tb"))
        files.push_back(e.path());
    ASSERT_EQ(files.size(), 1u);
    std::map<std::pair<int64_t, std::string>, float> tb;
    for (const Scalar &s : read_events(files[0]))
        tb[{s.step, s.tag}] = s.value;
    std::istringstream jsonl(ckt::slurp(cfg.logging.metrics_file));
    std::string line;
    int lines = 0;
    const std::pair<const char *, const char *> keys[] = {
        {"lm_loss", "lm loss"},
        {"lr", "learning-rate"},
        {"grad_norm", "grad-norm"},
        {"params_norm", "params-norm"},
        {"tokens_per_s", "throughput/tokens-per-s"},
        {"tflops_per_gpu", "throughput/tflops-per-gpu"},
        {"skipped_iterations", "skipped-iterations"},
        {"elapsed_ms", "iteration-time-ms"}};
    while (std::getline(jsonl, line)) {
        cJSON *o = cJSON_Parse(line.c_str());
        ASSERT_NE(o, nullptr);
        int64_t it = cJSON_GetObjectItem(o, "iteration")->valueint;
        for (const auto &k : keys) {
            auto f = tb.find({it, k.second});
            ASSERT_NE(f, tb.end()) << k.second << " at step " << it;
            EXPECT_EQ(f->second, (float)cJSON_GetObjectItem(o, k.first)->valuedouble)
                << k.second << " at step " << it;
        }
        cJSON_Delete(o);
        lines++;
    }
    EXPECT_EQ(lines, 3);
}

// A run logged 1..5, was stopped, resumed from its checkpoint at 3 and logged 4..7 again
// with other values: the curve is the resumed one from 4 on.
TEST(Report, ResumedSegmentsJoinWithTheLatestRecordWinning) {
    std::string dir = ckt::fresh_dir(tiny::temp_prefix("report"));
    std::filesystem::create_directories(dir);
    std::string text;
    for (int it = 1; it <= 5; it++)
        text += "{\"iteration\":" + std::to_string(it) + ",\"lm_loss\":" + std::to_string(10 - it) +
                ",\"lr\":0.001,\"grad_norm\":1,\"tokens_per_s\":100,\"tflops_per_gpu\":0.5}\n";
    for (int it = 4; it <= 7; it++)
        text += "{\"iteration\":" + std::to_string(it) + ",\"lm_loss\":" + std::to_string(20 - it) +
                ",\"lr\":0.002,\"grad_norm\":2,\"tokens_per_s\":200,\"tflops_per_gpu\":1" +
                (it == 6 ? ",\"val_loss\":3.5" : "") + "}\n";
    ckt::spit(dir + "/metrics.jsonl", text);
    tpd_report_run r;
    ASSERT_EQ(tpd_report_load(dir.c_str(), &r), TPD_OK); // the folder finds metrics.jsonl
    EXPECT_EQ(r.records, 9);
    EXPECT_EQ(r.segments, 2);
    ASSERT_EQ(r.n, 7);
    for (int i = 0; i < 7; i++) {
        int it = i + 1;
        EXPECT_EQ(r.p[i].iteration, it);
        EXPECT_EQ(r.p[i].lm_loss, it <= 3 ? 10 - it : 20 - it) << it;
        EXPECT_EQ(std::isnan(r.p[i].val_loss), it != 6) << it;
    }
    int drawn = -1;
    ASSERT_EQ(tpd_report_draw(&r, (dir + "/pics").c_str(), &drawn), TPD_OK);
    EXPECT_NE(ckt::slurp(dir + "/pics/report.gp").find("throughput.png"), std::string::npos);
    EXPECT_NE(ckt::slurp(dir + "/pics/report.dat").find("# iteration"), std::string::npos);
    // The pictures need gnuplot; without it (a machine with only the build tools) the
    // script is what a user draws them from later.
    ASSERT_EQ(drawn, tpd_file_on_path("gnuplot"));
    for (const char *png : {"loss", "lr", "grad_norm", "throughput"}) {
        if (!drawn) break;
        std::string f = ckt::slurp(dir + "/pics/" + png + ".png");
        ASSERT_GT(f.size(), 1000u) << png;
        EXPECT_EQ(f.substr(1, 3), "PNG") << png;
    }
    tpd_report_free(&r);
    // a line that is not a record is named
    ckt::spit(dir + "/bad.jsonl", text + "not json\n");
    EXPECT_EQ(tpd_report_load((dir + "/bad.jsonl").c_str(), &r), TPD_ERR_FORMAT);
}

// One JSON object a line, read whole: what a line holds past its object, or a raw NUL,
// is an error at its line and column, never a record cut short or one dropped; a key given
// twice takes its last value (Python's json.loads).
TEST(Report, EachLineIsOneWholeObjectAndTheLastDuplicateKeyWins) {
    std::string dir = ckt::fresh_dir(tiny::temp_prefix("report_lines"));
    std::filesystem::create_directories(dir);
    const std::string good = "{\"iteration\":1,\"lm_loss\":5}\n";
    const struct {
        std::string line;
        const char *message; // column: why
    } bad[] = {
        {std::string("{\"iteration\":2,\"note\":\"a\0b\",\"lm_loss\":1}\n", 41),
         ":2:25: a NUL byte"},
        {"{\"iteration\":2}{\"iteration\":3}\n", ":2:16: text after the record"},
        {"{\"iteration\":2} x\n", ":2:17: text after the record"},
        {"{\"iteration\":2,}\n", "not valid JSON"}, // cJSON places its errors loosely
    };
    tpd_report_run r;
    for (const auto &b : bad) {
        std::string path = dir + "/m.jsonl";
        ckt::spit(path, good + b.line + good);
        tpd_log_quiet_begin();
        EXPECT_EQ(tpd_report_load(path.c_str(), &r), TPD_ERR_FORMAT) << b.message;
        tpd_log_quiet_end();
        std::string err = tpd_last_error();
        EXPECT_EQ(err.find(path + ":2:"), 0u) << err;
        EXPECT_NE(err.find(b.message), std::string::npos) << err;
    }
    std::string path = dir + "/dup.jsonl";
    ckt::spit(path, "{\"iteration\":1,\"lm_loss\":5,\"lm_loss\":7,\"iteration\":3}\n");
    ASSERT_EQ(tpd_report_load(path.c_str(), &r), TPD_OK);
    ASSERT_EQ(r.n, 1);
    EXPECT_EQ(r.p[0].iteration, 3);
    EXPECT_EQ(r.p[0].lm_loss, 7);
    tpd_report_free(&r);
}

TEST(Progress, TheLineHasRateElapsedAndEta) {
    char buf[256];
    tpd_progress_format(buf, sizeof buf, "export", 50e6, 200e6, "MB", 1e6, 10.0);
    EXPECT_STREQ(buf, "export:  25.0% | 50.0 of 200.0 MB | 5.0 MB/s | elapsed 0:10 | ETA 0:30");
    tpd_progress_hms(buf, sizeof buf, 3723.4);
    EXPECT_STREQ(buf, "1:02:03");
    tpd_progress_hms(buf, sizeof buf, -1);
    EXPECT_STREQ(buf, "?");
    tpd_progress_format(buf, sizeof buf, "import", 0, 10, "MB", 1, 0.0);
    EXPECT_NE(std::string(buf).find("ETA ?"), std::string::npos) << buf;
}

TEST(Progress, TheLogLineHasElapsedAndEta) {
    tpd_iter_record r = {};
    r.iteration = 50;
    r.train_iters = 300;
    r.run_elapsed_s = 62;
    r.eta_s = 310;
    r.val_loss = NAN;
    char line[1024];
    tpd_metrics_format_line(&r, line, sizeof line);
    EXPECT_NE(std::string(line).find("iteration       50/     300 | elapsed: 1:02 | ETA: 5:10 |"),
              std::string::npos)
        << line;
}

} // namespace
