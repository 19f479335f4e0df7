// Single-rank training: the loss falls, runs are bit-identical, the LR schedule and the
// metrics file follow their definitions.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>
#include <cmath>
#include <fstream>
#include <vector>

#include "common/run.h"
#include "common/tiny.h"

extern "C" {
#include "engine/optim/lr.h"
#include "kernels/cpu/cpu.h"
#include "engine/train/metrics.h"
#include "engine/train/train.h"
#include "parallel/comm.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_data;

std::vector<double> train_losses(const tpd_config &cfg, int steps, std::vector<float> *wte) {
    tpd_trainer *tr = nullptr;
    EXPECT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    std::vector<double> losses;
    if (!tr) return losses;
    for (int i = 0; i < steps; i++) {
        tpd_step_stats s;
        EXPECT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
        losses.push_back(s.lm_loss);
    }
    if (wte) {
        wte->resize(tpd_model_layout_global_numel(&tpd_trainer_model(tr)->plan.lay, TPD_P_WTE));
        EXPECT_EQ(tpd_trainer_gather_param(tr, TPD_P_WTE, wte->data()), TPD_OK);
    }
    tpd_trainer_destroy(tr);
    return losses;
}

TEST(Train, LossFallsOnTinyModel) {
    tpd_config cfg = tiny::config(g_data);
    cfg.model.seq_length = 32;
    cfg.model.max_position_embeddings = 32;
    cfg.training.micro_batch_size = 4;
    cfg.training.global_batch_size = 8;
    cfg.training.train_iters = 200;
    cfg.optimizer.lr = 3e-3;
    cfg.optimizer.min_lr = 3e-4;
    cfg.optimizer.lr_warmup_iters = 5;
    std::vector<double> l = train_losses(cfg, 200, nullptr);
    ASSERT_EQ(l.size(), 200u);
    // The untrained model is near uniform over 257 tokens: ln(257) = 5.55.
    EXPECT_NEAR(l[0], std::log(257.0), 0.3);
    // A model that ignored the context could at best reach the corpus's unigram entropy;
    // this one must use the context to get well below it.
    std::string text = tiny::corpus_text();
    std::vector<double> count(256, 0);
    for (unsigned char ch : text)
        count[ch]++;
    double h1 = 0;
    for (double c : count)
        if (c > 0) h1 -= c / text.size() * std::log(c / text.size());
    printf("tiny model loss: first %.3f, last %.3f; corpus unigram entropy %.3f nats\n", l[0],
           l.back(), h1);
    EXPECT_LT(l.back(), h1 - 0.5) << "loss after 200 steps";
}

TEST(Train, TwoRunsAreBitIdentical) {
    tpd_config cfg = tiny::config(g_data);
    std::vector<float> w1, w2;
    std::vector<double> a = train_losses(cfg, 4, &w1), b = train_losses(cfg, 4, &w2);
    ASSERT_EQ(a.size(), 4u);
    EXPECT_EQ(0, memcmp(a.data(), b.data(), a.size() * sizeof(double)));
    ASSERT_EQ(w1.size(), w2.size());
    EXPECT_EQ(0, memcmp(w1.data(), w2.data(), w1.size() * 4));
}

TEST(Train, LearningRateSchedule) {
    tpd_config cfg = tiny::config(g_data);
    cfg.training.train_iters = 100;
    cfg.optimizer.lr = 1.0;
    cfg.optimizer.min_lr = 0.1;
    cfg.optimizer.lr_warmup_iters = 10;
    tiny::set(cfg.optimizer.lr_decay_style, "optimizer.lr_decay_style", "cosine");
    EXPECT_DOUBLE_EQ(tpd_lr_at(&cfg, 0), 0.1);
    EXPECT_DOUBLE_EQ(tpd_lr_at(&cfg, 9), 1.0);
    EXPECT_DOUBLE_EQ(tpd_lr_at(&cfg, 10), 1.0);
    EXPECT_NEAR(tpd_lr_at(&cfg, 55), 0.1 + 0.9 * 0.5, 1e-12); // half way: cos = 0
    EXPECT_DOUBLE_EQ(tpd_lr_at(&cfg, 100), 0.1);
    tiny::set(cfg.optimizer.lr_decay_style, "optimizer.lr_decay_style", "linear");
    EXPECT_NEAR(tpd_lr_at(&cfg, 32), 1.0 - 0.9 * 22.0 / 90.0, 1e-12);
    tiny::set(cfg.optimizer.lr_decay_style, "optimizer.lr_decay_style", "constant");
    EXPECT_DOUBLE_EQ(tpd_lr_at(&cfg, 80), 1.0);
    // Megatron's inverse-square-root: lr * sqrt(warmup / step), floored at min_lr
    tiny::set(cfg.optimizer.lr_decay_style, "optimizer.lr_decay_style", "inverse-square-root");
    EXPECT_NEAR(tpd_lr_at(&cfg, 39), 0.5, 1e-12);
    EXPECT_DOUBLE_EQ(tpd_lr_at(&cfg, 99999), 0.1);
    // WSD: warmup, stable at lr, then the last 20 iterations anneal to min_lr
    tiny::set(cfg.optimizer.lr_decay_style, "optimizer.lr_decay_style", "WSD");
    cfg.optimizer.lr_wsd_decay_iters = 20;
    struct {
        const char *style;
        double mid; // coefficient half way through the anneal
    } styles[] = {{"exponential", 2.0 * std::sqrt(0.5) - 1.0},
                  {"linear", 0.5},
                  {"cosine", 0.5},
                  {"minus_sqrt", 1.0 - std::sqrt(0.5)}};
    for (const auto &w : styles) {
        tiny::set(cfg.optimizer.lr_wsd_decay_style, "optimizer.lr_wsd_decay_style", w.style);
        EXPECT_DOUBLE_EQ(tpd_lr_at(&cfg, 50), 1.0) << w.style;
        EXPECT_NEAR(tpd_lr_at(&cfg, 80), 1.0, 1e-12) << w.style;
        EXPECT_NEAR(tpd_lr_at(&cfg, 90), 0.1 + 0.9 * w.mid, 1e-12) << w.style;
        EXPECT_DOUBLE_EQ(tpd_lr_at(&cfg, 100), 0.1) << w.style;
    }
}

TEST(Train, RunWritesMetricsFile) {
    tpd_config cfg = tiny::config(g_data);
    cfg.training.train_iters = 3;
    cfg.logging.log_interval = 1;
    cfg.logging.eval_interval = 3;
    cfg.logging.eval_iters = 1;
    std::string path = tiny::temp_prefix("metrics") + "/m.jsonl";
    snprintf(cfg.logging.metrics_file, sizeof cfg.logging.metrics_file, "%s", path.c_str());
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    ASSERT_EQ(tpd_trainer_run(tr), TPD_OK);
    tpd_trainer_destroy(tr);
    std::ifstream in(path);
    std::string line;
    int n = 0;
    const char *keys[] = {"iteration",    "consumed_samples", "lm_loss",
                          "lr",           "grad_norm",        "elapsed_ms",
                          "tokens_per_s", "tflops_per_gpu",   "skipped_iterations"};
    while (std::getline(in, line)) {
        cJSON *o = cJSON_Parse(line.c_str());
        ASSERT_NE(o, nullptr) << line;
        for (const char *k : keys)
            EXPECT_NE(cJSON_GetObjectItem(o, k), nullptr) << k;
        n++;
        EXPECT_EQ(cJSON_GetObjectItem(o, "iteration")->valueint, n);
        EXPECT_EQ(cJSON_GetObjectItem(o, "consumed_samples")->valueint, 16 * n);
        EXPECT_EQ(cJSON_GetObjectItem(o, "val_loss") != nullptr, n == 3);
        cJSON_Delete(o);
    }
    EXPECT_EQ(n, 3);
}

TEST(Metrics, LogLineHasMegatronFields) {
    tpd_iter_record r = {};
    r.iteration = 50;
    r.train_iters = 100;
    r.consumed_samples = 25600;
    r.elapsed_ms = 263.6;
    r.lr = 1.092267e-4;
    r.global_batch_size = 512;
    r.lm_loss = 8.184724;
    r.grad_norm = 1.128;
    r.mfu = -1;
    r.val_loss = NAN;
    char buf[1024];
    tpd_metrics_format_line(&r, buf, sizeof buf);
    std::string s(buf);
    for (const char *f :
         {"iteration       50/     100",
          "consumed samples:", "elapsed time per iteration (ms): 263.6",
          "throughput per GPU (TFLOP/s/GPU):", "tokens/s:", "learning rate: 1.092267E-04",
          "global batch size:   512", "lm loss: 8.184724E+00", "grad norm: 1.128",
          "number of skipped iterations:   0"})
        EXPECT_NE(s.find(f), std::string::npos) << "missing '" << f << "' in " << s;
    EXPECT_EQ(s.find("params norm"), std::string::npos); // only when logged
    r.has_params_norm = 1;
    r.params_norm = 37.0291;
    tpd_metrics_format_line(&r, buf, sizeof buf);
    s = buf;
    EXPECT_NE(s.find("grad norm: 1.128 | params norm: 37.029 | number of skipped"),
              std::string::npos)
        << s;
    tpd_step_timers t = {250.25, 10.5, 12.0, 0.0457, 1.25, 3.0, 0.5};
    tpd_metrics_format_timers(&t, buf, sizeof buf);
    EXPECT_STREQ(buf, " time (ms) | forward-backward compute: 250.2 (TP comm 10.5) | pipeline "
                      "wait: 12.0 (idle 4.6%) | grads reduce exposed: 1.2 | params gather wait: "
                      "3.0 | optimizer: 0.5 |");
}

} // namespace

// data.data_path as Megatron's weighted blend: the trainer samples from both data sets,
// twice the same way.
TEST(Train, BlendedDataTrains) {
    std::string second = tiny::write_corpus(tiny::temp_prefix("corpus_b"));
    tpd_config cfg = tiny::config(g_data);
    snprintf(cfg.data.data_path, sizeof cfg.data.data_path, "0.25 %s 0.75 %s", g_data.c_str(),
             second.c_str());
    cfg.training.train_iters = 3;
    std::vector<double> runs[2];
    for (auto &losses : runs) {
        tpd_trainer *tr = nullptr;
        ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
        ASSERT_EQ(tpd_trainer_data(tr)->n, 2);
        EXPECT_DOUBLE_EQ(tpd_trainer_data(tr)->weight[1], 0.75);
        for (int i = 0; i < 3; i++) {
            tpd_step_stats st;
            ASSERT_EQ(tpd_trainer_step(tr, &st), TPD_OK);
            EXPECT_TRUE(std::isfinite(st.lm_loss));
            losses.push_back(st.lm_loss);
        }
        tpd_trainer_destroy(tr);
    }
    EXPECT_EQ(runs[0], runs[1]);
    tiny::remove_corpus(second);
}

// `tripod` restarts itself once when OpenBLAS picked kernels weaker than the CPU allows
// (engine/cli/main.c). The binary, started without OPENBLAS_CORETYPE, must report the kernels
// that this process (which does not restart) says are available.
TEST(Train, BinaryRunsTheFastestBlasKernels) {
    const char *mine = getenv("OPENBLAS_CORETYPE");
    const char *up = tpd_kern_cpu_blas_coretype_upgrade();
    // a caller's own choice is kept; then the binary runs what this process runs
    std::string want = !mine && up ? up : tpd_kern_cpu_blas_corename();
    tpd_config cfg = tiny::config(g_data);
    cfg.training.train_iters = 1;
    cfg.logging.eval_interval = 0;
    std::string path = tiny::temp_prefix("blas") + ".yaml";
    FILE *f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    tpd_config_print(&cfg, f);
    fclose(f);
    std::string out;
    int code = tpdtest::run({TPD_TRIPOD_BIN, "train", path.c_str()},
                            TPD_SPAWN_STDOUT | TPD_SPAWN_STDERR, &out);
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("OpenBLAS " + want), std::string::npos) << "want " << want << "\n" << out;
}

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    tpd_comm_mpi_start(&g_world);
    g_data = tiny::write_corpus(tiny::temp_prefix("corpus"));
    int rc = RUN_ALL_TESTS();
    tiny::remove_corpus(g_data);
    tpd_comm_mpi_finish(g_world);

    return rc;
}
