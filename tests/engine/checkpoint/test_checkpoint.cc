// Checkpoints on one rank: bit-exact resume, the run loop's saves and pruning, the
// manifest, every corruption case with an error naming the file, fallback to the previous
// checkpoint, SIGTERM save-and-stop, and a writer killed (SIGKILL) in the middle of a save.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>
#include <csignal>
#include <openssl/evp.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_test_util.h"

extern "C" {
#include "engine/checkpoint/checkpoint_internal.h"
#include "engine/optim/lr.h"
#include "engine/train/signals.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_data, g_self;

tpd_config base_config(const std::string &save) {
    tpd_config cfg = tiny::config(g_data);
    cfg.training.train_iters = 6;
    snprintf(cfg.checkpoint.save, sizeof cfg.checkpoint.save, "%s", save.c_str());
    return cfg;
}

std::vector<double> steps(tpd_trainer *tr, int n) {
    std::vector<double> l;
    for (int i = 0; i < n; i++) {
        tpd_step_stats s;
        EXPECT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
        l.push_back(s.lm_loss);
    }
    return l;
}

// Trains `iters` steps from scratch and saves; returns the checkpoint directory.
std::string train_and_save(const tpd_config &cfg, int iters) {
    tpd_trainer *tr = nullptr;
    EXPECT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    if (!tr) return "";
    steps(tr, iters);
    EXPECT_EQ(tpd_trainer_save(tr, cfg.checkpoint.save), TPD_OK);
    tpd_trainer_destroy(tr);
    char dir[64];
    snprintf(dir, sizeof dir, "/iter_%07d", iters);
    return std::string(cfg.checkpoint.save) + dir;
}

// Creating a trainer with checkpoint.load must fail with an error naming `needle`.
void expect_load_error(tpd_config cfg, const char *load, const std::string &needle) {
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "%s", load);
    tpd_trainer *tr = nullptr;
    EXPECT_NE(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tr, nullptr);
    if (tr) tpd_trainer_destroy(tr);
    std::string err = tpd_last_error();
    EXPECT_NE(err.find(needle), std::string::npos) << "error: " << err << "\nexpected: " << needle;
}

// Trains 6 steps, and 3 + resume + 3: the losses and the parameters must be the same bits.
void resume_case(const char *name, tpd_precision precision, int fp32_grads) {
    SCOPED_TRACE(name);
    std::string save = ckt::fresh_dir(tiny::temp_prefix(name));
    tpd_config cfg = base_config(save);
    cfg.training.precision = precision;
    cfg.training.accumulate_allreduce_grads_in_fp32 = fp32_grads;
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    std::vector<double> ref = steps(tr, 6);
    std::vector<float> wte_ref(
        tpd_model_layout_global_numel(&tpd_trainer_model(tr)->plan.lay, TPD_P_WTE));
    ASSERT_EQ(tpd_trainer_gather_param(tr, TPD_P_WTE, wte_ref.data()), TPD_OK);
    std::vector<float> master_ref(wte_ref.size());
    ASSERT_EQ(tpd_trainer_gather_master(tr, TPD_P_WTE, master_ref.data()), TPD_OK);
    tpd_trainer_destroy(tr);

    train_and_save(cfg, 3);
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "auto");
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(tr), 3);
    EXPECT_EQ(tpd_trainer_consumed_samples(tr), 3u * 16u);
    std::vector<double> cont = steps(tr, 3);
    std::vector<float> wte(wte_ref.size()), master(wte_ref.size());
    ASSERT_EQ(tpd_trainer_gather_param(tr, TPD_P_WTE, wte.data()), TPD_OK);
    ASSERT_EQ(tpd_trainer_gather_master(tr, TPD_P_WTE, master.data()), TPD_OK);
    tpd_trainer_destroy(tr);
    for (int i = 0; i < 3; i++)
        EXPECT_EQ(0, memcmp(&cont[i], &ref[3 + i], sizeof(double)))
            << "step " << 4 + i << ": " << cont[i] << " vs " << ref[3 + i];
    EXPECT_EQ(0, memcmp(wte.data(), wte_ref.data(), wte.size() * 4));
    EXPECT_EQ(0, memcmp(master.data(), master_ref.data(), master.size() * 4));
}

TEST(Checkpoint, ResumeIsBitIdentical) {
    resume_case("resume", TPD_PRECISION_FP32, 1);
}

// bf16 (the cuda backend's recipe on the cpu backend) saves its fp32 master weights, so a
// resumed run continues bit for bit, with fp32 main gradients or bf16 ones.
TEST(Checkpoint, Bf16ResumeIsBitIdentical) {
    resume_case("resume-bf16", TPD_PRECISION_BF16, 1);
    resume_case("resume-bf16-grads", TPD_PRECISION_BF16, 0);
}

// The checkpoint format does not depend on the precision: a bf16 run's checkpoint loads into
// an fp32 run, whose weights are then the bf16 run's fp32 master weights, bit for bit.
TEST(Checkpoint, Bf16CheckpointLoadsIntoAnFp32Run) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("bf16-to-fp32"));
    tpd_config cfg = base_config(save);
    cfg.training.precision = TPD_PRECISION_BF16;
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    steps(tr, 3);
    ASSERT_EQ(tpd_trainer_save(tr, cfg.checkpoint.save), TPD_OK);
    std::vector<std::vector<float>> master(TPD_P_COUNT);
    for (int p = 0; p < TPD_P_COUNT; p++) {
        master[p].resize(
            tpd_model_layout_global_numel(&tpd_trainer_model(tr)->plan.lay, (tpd_param)p));
        ASSERT_EQ(tpd_trainer_gather_master(tr, (tpd_param)p, master[p].data()), TPD_OK);
    }
    tpd_trainer_destroy(tr);

    cfg.training.precision = TPD_PRECISION_FP32;
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "auto");
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(tr), 3);
    for (int p = 0; p < TPD_P_COUNT; p++) {
        std::vector<float> w(master[p].size());
        ASSERT_EQ(tpd_trainer_gather_param(tr, (tpd_param)p, w.data()), TPD_OK);
        if (!w.empty())
            EXPECT_EQ(0, memcmp(w.data(), master[p].data(), w.size() * 4))
                << tpd_param_get_info((tpd_param)p)->name;
    }
    steps(tr, 1); // and it trains on
    tpd_trainer_destroy(tr);
}

TEST(Checkpoint, AutoWithoutLatestStartsFresh) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("fresh"));
    tpd_config cfg = base_config(save);
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "auto");
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(tr), 0);
    tpd_trainer_destroy(tr);
}

TEST(Checkpoint, RunSavesEveryIntervalAndPrunes) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("interval"));
    tpd_config cfg = base_config(save);
    cfg.training.train_iters = 5;
    cfg.checkpoint.save_interval = 2;
    cfg.checkpoint.keep_last = 2;
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    ASSERT_EQ(tpd_trainer_run(tr), TPD_OK);
    tpd_trainer_destroy(tr);
    // saves at 2, 4 and the end (5); keep_last 2 prunes 2
    EXPECT_FALSE(ckt::exists(save + "/iter_0000002/manifest.json"));
    EXPECT_TRUE(ckt::exists(save + "/iter_0000004/manifest.json"));
    EXPECT_TRUE(ckt::exists(save + "/iter_0000005/manifest.json"));
    EXPECT_EQ(ckt::slurp(save + "/latest"), "iter_0000005\n");
    EXPECT_FALSE(ckt::exists(save + "/latest.tmp"));
    // a resumed run with the same train_iters has nothing left to do and saves nothing new
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "auto");
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(tr), 5);
    ASSERT_EQ(tpd_trainer_run(tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(tr), 5);
    tpd_trainer_destroy(tr);
}

// checkpoint.async_save: the shards come from a host snapshot written by a thread while
// training goes on, and commit at a later boundary. Every checkpoint of the run commits
// (the last one before the run returns), with the same bytes as a synchronous save.
TEST(Checkpoint, AsyncSaveCommitsTheSameShards) {
    std::string dirs[2];
    for (int async = 0; async < 2; async++) {
        dirs[async] = ckt::fresh_dir(tiny::temp_prefix(async ? "async" : "sync"));
        tpd_config cfg = base_config(dirs[async]);
        cfg.training.train_iters = 6;
        cfg.checkpoint.save_interval = 2;
        cfg.checkpoint.async_save = async;
        tpd_trainer *tr = nullptr;
        ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
        ASSERT_EQ(tpd_trainer_run(tr), TPD_OK);
        EXPECT_EQ(tpd_trainer_save_in_flight(tr), 0) << "the run returned with a save in flight";
        tpd_trainer_destroy(tr);
        EXPECT_EQ(ckt::slurp(dirs[async] + "/latest"), "iter_0000006\n");
        for (const char *it : {"/iter_0000002", "/iter_0000004", "/iter_0000006"}) {
            EXPECT_TRUE(ckt::exists(dirs[async] + it + "/manifest.json")) << it;
            EXPECT_FALSE(ckt::exists(dirs[async] + it + ".tmp")) << it;
        }
    }
    for (const char *f :
         {"/iter_0000004/model_tp00_pp00.bin", "/iter_0000004/optim_tp00_pp00_dp00.bin",
          "/iter_0000006/model_tp00_pp00.bin"}) {
        std::string a = ckt::slurp(dirs[0] + f), b = ckt::slurp(dirs[1] + f);
        EXPECT_FALSE(a.empty()) << f;
        EXPECT_TRUE(a == b) << f << " differs between the synchronous and asynchronous save";
    }
    // an asynchronous checkpoint verifies and resumes
    tpd_ckpt_info info;
    ASSERT_EQ(tpd_ckpt_open((dirs[1] + "/iter_0000004").c_str(), &info), TPD_OK)
        << tpd_last_error();
    EXPECT_EQ(info.iteration, 4);
    tpd_ckpt_close(&info);
}

std::string sha256_hex(const std::string &data) {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    EVP_Digest(data.data(), data.size(), d, &n, EVP_sha256(), nullptr);
    char hex[65];
    for (unsigned i = 0; i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return hex;
}

TEST(Checkpoint, ManifestHoldsStateConfigTensorsAndHashes) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("manifest"));
    tpd_config cfg = base_config(save);
    std::string dir = train_and_save(cfg, 2);
    std::string text = ckt::slurp(dir + "/manifest.json");
    EXPECT_EQ(ckt::slurp(dir + "/manifest.sha256"), sha256_hex(text));
    cJSON *o = cJSON_Parse(text.c_str());
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(cJSON_GetObjectItem(o, "iteration")->valueint, 2);
    EXPECT_EQ(cJSON_GetObjectItem(o, "consumed_samples")->valueint, 32);
    EXPECT_EQ(cJSON_GetObjectItem(o, "skipped_iterations")->valueint, 0);
    EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "rng"), "seed")->valuestring, "1234");
    cJSON *lr = cJSON_GetObjectItem(o, "lr_schedule");
    EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(lr, "next_lr")->valuedouble, tpd_lr_at(&cfg, 2));
    EXPECT_EQ(cJSON_GetObjectItem(lr, "lr_warmup_iters")->valueint, 2);
    std::string yaml = cJSON_GetObjectItem(o, "config_yaml")->valuestring;
    EXPECT_NE(yaml.find("hidden_size: 32"), std::string::npos);
    EXPECT_NE(yaml.find("save_interval"), std::string::npos);
    cJSON *files = cJSON_GetObjectItem(o, "files");
    ASSERT_EQ(cJSON_GetArraySize(files), 2); // model and optimizer shard of the one rank
    for (cJSON *f = files->child; f; f = f->next) {
        std::string data = ckt::slurp(dir + "/" + cJSON_GetObjectItem(f, "name")->valuestring);
        EXPECT_EQ(sha256_hex(data), cJSON_GetObjectItem(f, "sha256")->valuestring);
        EXPECT_EQ((double)data.size(), cJSON_GetObjectItem(f, "bytes")->valuedouble);
    }
    cJSON *ts = cJSON_GetObjectItem(o, "tensors");
    ASSERT_EQ(cJSON_GetArraySize(ts), TPD_P_COUNT);
    cJSON *wte = cJSON_GetArrayItem(ts, 0), *qkvw = cJSON_GetArrayItem(ts, TPD_P_QKVW);
    EXPECT_STREQ(cJSON_GetObjectItem(wte, "name")->valuestring, "wte");
    EXPECT_STREQ(cJSON_GetObjectItem(wte, "hf_name")->valuestring, "transformer.wte.weight");
    EXPECT_STREQ(cJSON_GetObjectItem(qkvw, "hf_name")->valuestring,
                 "transformer.h.{i}.attn.c_attn.weight");
    cJSON *shape = cJSON_GetObjectItem(qkvw, "shape");
    ASSERT_EQ(cJSON_GetArraySize(shape), 3);
    EXPECT_EQ(cJSON_GetArrayItem(shape, 0)->valueint, 4);
    EXPECT_EQ(cJSON_GetArrayItem(shape, 1)->valueint, 96);
    EXPECT_EQ(cJSON_GetArrayItem(shape, 2)->valueint, 32);
    for (const char *k : {"param", "exp_avg", "exp_avg_sq"}) {
        cJSON *runs = cJSON_GetObjectItem(wte, k);
        ASSERT_GT(cJSON_GetArraySize(runs), 0) << k;
        cJSON *r = runs->child;
        for (const char *f :
             {"file", "rank", "global_offset", "count", "repeat", "global_stride", "file_offset"})
            EXPECT_NE(cJSON_GetObjectItem(r, f), nullptr) << f;
    }
    EXPECT_EQ(cJSON_GetObjectItem(wte, "master"), nullptr); // fp32 on cpu: no master weights
    cJSON_Delete(o);
}

// ---- integrity ----

class Corruption : public ::testing::Test {
  protected:
    void SetUp() override {
        save = ckt::fresh_dir(tiny::temp_prefix("corrupt"));
        cfg = base_config(save);
        train_and_save(cfg, 1);
        newest = train_and_save(cfg, 2);
    }
    std::string save, newest;
    tpd_config cfg;
};

TEST_F(Corruption, TruncatedShard) {
    std::string f = newest + "/optim_tp00_pp00_dp00.bin", d = ckt::slurp(f);
    ckt::spit(f, d.substr(0, d.size() / 2));
    expect_load_error(cfg, "auto", f);
    EXPECT_NE(std::string(tpd_last_error()).find("truncated"), std::string::npos);
}

// Readers of the weights alone (generate, export) verify the files that hold them: a
// damaged optimizer shard of an fp32 run stops a resume but not them; a damaged model
// shard stops both.
TEST_F(Corruption, WeightReadersVerifyWhatTheyRead) {
    std::string opt = newest + "/optim_tp00_pp00_dp00.bin", d = ckt::slurp(opt);
    d[d.size() / 2] ^= 0x01;
    ckt::spit(opt, d);
    tpd_ckpt_info info;
    ASSERT_EQ(tpd_ckpt_open_weights(newest.c_str(), &info), TPD_OK) << tpd_last_error();
    tpd_ckpt_close(&info);
    testing::internal::CaptureStderr();
    EXPECT_NE(tpd_ckpt_open(newest.c_str(), &info), TPD_OK);
    testing::internal::GetCapturedStderr();
    EXPECT_NE(std::string(tpd_last_error()).find(opt), std::string::npos);
    std::string model = newest + "/model_tp00_pp00.bin";
    d = ckt::slurp(model);
    d[d.size() / 2] ^= 0x01;
    ckt::spit(model, d);
    testing::internal::CaptureStderr();
    EXPECT_NE(tpd_ckpt_open_weights(newest.c_str(), &info), TPD_OK);
    testing::internal::GetCapturedStderr();
    EXPECT_NE(std::string(tpd_last_error()).find(model), std::string::npos);
}

TEST_F(Corruption, FlippedBit) {
    std::string f = newest + "/model_tp00_pp00.bin", d = ckt::slurp(f);
    d[d.size() / 3] ^= 0x10;
    ckt::spit(f, d);
    expect_load_error(cfg, "auto", f);
    EXPECT_NE(std::string(tpd_last_error()).find("SHA-256"), std::string::npos);
}

TEST_F(Corruption, MissingShard) {
    std::string f = newest + "/model_tp00_pp00.bin";
    ASSERT_EQ(unlink(f.c_str()), 0);
    expect_load_error(cfg, newest.c_str(), f);
}

TEST_F(Corruption, FlippedManifest) {
    std::string f = newest + "/manifest.json", d = ckt::slurp(f);
    size_t at = d.find("\"iteration\":\t2");
    ASSERT_NE(at, std::string::npos);
    d[at + 13] = '7';
    ckt::spit(f, d);
    expect_load_error(cfg, "auto", f);
}

TEST_F(Corruption, WrongModelShape) {
    tpd_config other = cfg;
    other.model.hidden_size = 64;
    expect_load_error(other, "auto",
                      "model.hidden_size is 32 in the checkpoint but 64 in the config");
    EXPECT_NE(std::string(tpd_last_error()).find(newest), std::string::npos);
}

TEST_F(Corruption, GarbageLatest) {
    ckt::spit(save + "/latest", "\x01garbage\xff\n");
    expect_load_error(cfg, "auto", save + "/latest");
}

TEST_F(Corruption, FallbackPreviousLoadsTheNewestThatVerifies) {
    std::string f = newest + "/model_tp00_pp00.bin", d = ckt::slurp(f);
    d[100] ^= 1;
    ckt::spit(f, d);
    cfg.checkpoint.fallback = TPD_FALLBACK_PREVIOUS;
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "auto");
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(tr), 1);
    tpd_trainer_destroy(tr);
    // garbage `latest` too: the newest directory that verifies
    ckt::spit(save + "/latest", "nonsense");
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(tr), 1);
    tpd_trainer_destroy(tr);
}

TEST_F(Corruption, FinetuneLoadsWeightsOnly) {
    cfg.checkpoint.finetune = 1;
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "%s", newest.c_str());
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(tr), 0);
    EXPECT_EQ(tpd_trainer_consumed_samples(tr), 0u);
    size_t n = tpd_trainer_model(tr)->plan.shard_numel;
    std::vector<float> m(n);
    memcpy(m.data(), tpd_trainer_model(tr)->opt_m, n * 4);
    for (float x : m)
        ASSERT_EQ(x, 0.0f);
    std::vector<float> wte(
        tpd_model_layout_global_numel(&tpd_trainer_model(tr)->plan.lay, TPD_P_WTE));
    ASSERT_EQ(tpd_trainer_gather_param(tr, TPD_P_WTE, wte.data()), TPD_OK);
    tpd_trainer_destroy(tr);
    ckt::Globals g = ckt::read_globals(newest);
    EXPECT_EQ(0, memcmp(wte.data(), g.t[TPD_P_WTE][TPD_CKPT_PARAM].data(), wte.size() * 4));
}

// ---- one run per save directory ----

TEST(SaveLock, ASecondHolderIsRefusedWithTheFirstOnesPid) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("lock")) + "/sub";
    int a = -1, b = -1;
    ASSERT_EQ(tpd_ckpt_lock_save_dir(save.c_str(), &a), TPD_OK); // creates the directory
    ASSERT_GE(a, 0);
    // another open file description: what a second process would have
    EXPECT_EQ(tpd_ckpt_lock_save_dir(save.c_str(), &b), TPD_ERR_INVALID);
    EXPECT_EQ(b, -1);
    std::string err = tpd_last_error();
    EXPECT_NE(err.find(save), std::string::npos) << err;
    EXPECT_NE(err.find("pid " + std::to_string(getpid()) + " "), std::string::npos) << err;
    tpd_ckpt_unlock_save_dir(a);
    ASSERT_EQ(tpd_ckpt_lock_save_dir(save.c_str(), &b), TPD_OK); // released
    tpd_ckpt_unlock_save_dir(b);
}

TEST(SaveLock, ARunHoldsItsSaveDirectoryUntilDestroyed) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("lockrun"));
    tpd_config cfg = base_config(save);
    cfg.training.train_iters = 2;
    tpd_trainer *first = nullptr, *second = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &first), TPD_OK);
    ASSERT_EQ(tpd_trainer_run(first), TPD_OK);
    // a second run on the directory, even one that resumes it, is refused at creation:
    // before checkpoint.load=auto reads a directory the other run may be committing into
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "auto");
    cfg.training.train_iters = 4;
    EXPECT_EQ(tpd_trainer_create(&cfg, g_world, &second), TPD_ERR_INVALID);
    EXPECT_EQ(second, nullptr);
    std::string err = tpd_last_error();
    EXPECT_NE(err.find(save + " is in use by another run"), std::string::npos) << err;
    EXPECT_EQ(ckt::slurp(save + "/latest"), "iter_0000002\n");
    tpd_trainer_destroy(first);
    // the first one gone, the resume goes ahead
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &second), TPD_OK);
    EXPECT_EQ(tpd_trainer_run(second), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(second), 4);
    tpd_trainer_destroy(second);
}

// ---- signals ----

void raise_at_third_step(void *user, const tpd_pp_action *a, double, double) {
    tpd_trainer *tr = static_cast<tpd_trainer *>(user);
    if (tpd_trainer_iteration(tr) == 2 && a->kind == TPD_PP_FWD && a->micro_batch == 0)
        raise(SIGTERM);
}

TEST(Signals, SigtermSavesAtTheNextBoundaryAndStops) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("sigterm"));
    tpd_config cfg = base_config(save);
    cfg.training.train_iters = 50;
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    tpd_trainer_set_observer(tr, raise_at_third_step, tr);
    tpd_signal_clear();
    EXPECT_EQ(tpd_trainer_run(tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_interrupted(tr), 1);
    EXPECT_EQ(tpd_trainer_iteration(tr), 3);
    tpd_trainer_destroy(tr);
    tpd_signal_clear();
    EXPECT_EQ(ckt::slurp(save + "/latest"), "iter_0000003\n");
    EXPECT_EQ(ckt::read_globals(save).iteration, 3);
}

// The child of the tests below: a run of 50 iterations whose third step gets two SIGTERMs
// 1 ms apart (a launcher signalling the process, then its process group); with `later`, a
// third one past the repeat window, still inside that step. Exits 0 when the run stopped
// early with success, 20 + its status otherwise. Runs without MPI.
int g_sig_later = 0;
void raise_twice_at_third_step(void *, const tpd_pp_action *a, double, double) {
    static int stage = 0;
    if (a->micro_batch != 0) return;
    if (stage == 0 && a->kind == TPD_PP_FWD) {
        raise(SIGTERM);
        usleep(1000);
        raise(SIGTERM);
        stage = 1;
    } else if (stage == 1 && g_sig_later && a->kind != TPD_PP_FWD) {
        usleep(1000 * (TPD_SIGNAL_REPEAT_WINDOW_MS + 200));
        raise(SIGTERM); // leaves at once: not reached past here
        stage = 2;
    }
}

void at_third_step(void *user, const tpd_pp_action *a, double t0, double t1) {
    if (tpd_trainer_iteration(static_cast<tpd_trainer *>(user)) == 2)
        raise_twice_at_third_step(user, a, t0, t1);
}

int signal_child(const char *data, const char *save, int later) {
    g_data = data;
    g_sig_later = later;
    tpd_comm *world = nullptr;
    if (tpd_comm_self_create(&world) != TPD_OK) return 9;
    tpd_config cfg = base_config(save);
    cfg.training.train_iters = 50;
    tpd_trainer *tr = nullptr;
    if (tpd_trainer_create(&cfg, world, &tr) != TPD_OK) {
        tpd_comm_destroy(world);
        return 10;
    }
    tpd_trainer_set_observer(tr, at_third_step, tr);
    tpd_status st = tpd_trainer_run(tr);
    int rc = st != TPD_OK ? 20 + (int)st : tpd_trainer_interrupted(tr) ? 0 : 11;
    tpd_trainer_destroy(tr);
    tpd_comm_destroy(world);
    return rc;
}

// The child's exit status (-1: killed by a signal).
int run_signal_child(const std::string &save, int later) {
    pid_t pid = fork();
    if (pid == 0) {
        execl(g_self.c_str(), g_self.c_str(), "--signal-child", g_data.c_str(), save.c_str(),
              later ? "later" : "once", (char *)nullptr);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -2;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Signals, RepeatsWithinTheWindowAreOneRequest) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("sigtwice"));
    EXPECT_EQ(run_signal_child(save, 0), 0) << "two SIGTERMs 1 ms apart must save and stop";
    EXPECT_EQ(ckt::slurp(save + "/latest"), "iter_0000003\n");
    EXPECT_EQ(ckt::read_globals(save).iteration, 3);
}

TEST(Signals, ASignalPastTheWindowLeavesAtOnce) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("sigthird"));
    EXPECT_EQ(run_signal_child(save, 1), TPD_EXIT_SIGNAL);
    EXPECT_FALSE(ckt::exists(save + "/latest")); // left before the boundary's save
}

// Megatron's --exit-interval and --exit-duration-in-mins: save at the boundary and stop
// with success; a resumed run then carries on to train_iters.
// One tpd_trainer_run of cfg: the iteration it stopped at (-1 on failure), and whether it
// stopped early.
int run_to_stop(const tpd_config &cfg, int *interrupted_p) {
    tpd_trainer *tr = nullptr;
    if (tpd_trainer_create(&cfg, g_world, &tr) != TPD_OK) return -1;
    int it = tpd_trainer_run(tr) == TPD_OK ? tpd_trainer_iteration(tr) : -1;
    *interrupted_p = tpd_trainer_interrupted(tr);
    tpd_trainer_destroy(tr);
    return it;
}

TEST(Signals, ExitIntervalAndDurationSaveAndStop) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("exit"));
    tpd_config cfg = base_config(save);
    cfg.training.train_iters = 10;
    cfg.training.exit_interval = 4;
    tpd_signal_clear();
    int early = 0;
    EXPECT_EQ(run_to_stop(cfg, &early), 4);
    EXPECT_EQ(early, 1);
    EXPECT_EQ(ckt::slurp(save + "/latest"), "iter_0000004\n");
    // resumed at 4: the next multiple stops it again, not the one it resumed at
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "auto");
    EXPECT_EQ(run_to_stop(cfg, &early), 8);
    // a duration already spent: one step, then save and stop
    cfg.training.exit_interval = 0;
    cfg.training.exit_duration_in_mins = 1e-9;
    EXPECT_EQ(run_to_stop(cfg, &early), 9);
    EXPECT_EQ(early, 1);
    EXPECT_EQ(ckt::slurp(save + "/latest"), "iter_0000009\n");
}

// The child: trains one step, commits a checkpoint, trains another and stops for good in
// the middle of writing the second one (the parent kills it there). Runs without MPI.
std::string g_mid_marker;
void stall_hook(const char *path, uint64_t) {
    if (!strstr(path, "iter_0000002.tmp")) return;
    ckt::spit(g_mid_marker, path);
    for (;;)
        pause();
}

int writer_child(const char *data, const char *save) {
    g_data = data;
    g_mid_marker = std::string(save) + ".mid";
    tpd_comm *world = nullptr;
    if (tpd_comm_self_create(&world) != TPD_OK) return 9;
    tpd_config cfg = base_config(save);
    tpd_trainer *tr = nullptr;
    if (tpd_trainer_create(&cfg, world, &tr) != TPD_OK) return 10;
    steps(tr, 1);
    if (tpd_trainer_save(tr, save) != TPD_OK) return 11;
    steps(tr, 1);
    tpd_ckpt_write_hook = stall_hook;
    tpd_trainer_save(tr, save);
    return 12; // not reached: the hook stalls
}

TEST(Signals, SigkillDuringSaveNeverBecomesLatest) {
    std::string save = ckt::fresh_dir(tiny::temp_prefix("sigkill"));
    std::string marker = save + ".mid";
    unlink(marker.c_str());
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        execl(g_self.c_str(), g_self.c_str(), "--writer-child", g_data.c_str(), save.c_str(),
              (char *)nullptr);
        _exit(127);
    }
    for (int i = 0; i < 600 && !ckt::exists(marker); i++)
        usleep(50000);
    ASSERT_TRUE(ckt::exists(marker)) << "the writer never reached the second save";
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status));
    EXPECT_TRUE(ckt::exists(save + "/iter_0000002.tmp/model_tp00_pp00.bin")); // half written
    EXPECT_FALSE(ckt::exists(save + "/iter_0000002/manifest.json"));
    EXPECT_EQ(ckt::slurp(save + "/latest"), "iter_0000001\n");
    tpd_ckpt_info info;
    ASSERT_EQ(tpd_ckpt_open(save.c_str(), &info), TPD_OK) << "latest must verify";
    EXPECT_EQ(info.iteration, 1);
    tpd_ckpt_close(&info);
    // the next save at that iteration replaces the leftover
    tpd_config cfg = base_config(save);
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "auto");
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(tr), 1);
    steps(tr, 1);
    EXPECT_EQ(tpd_trainer_save(tr, save.c_str()), TPD_OK);
    tpd_trainer_destroy(tr);
    EXPECT_FALSE(ckt::exists(save + "/iter_0000002.tmp/model_tp00_pp00.bin"));
    EXPECT_EQ(ckt::read_globals(save).iteration, 2);
}

} // namespace

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--writer-child")) return writer_child(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "--signal-child"))
        return signal_child(argv[2], argv[3], !strcmp(argv[4], "later"));
    ::testing::InitGoogleTest(&argc, argv);
    g_self = "/proc/self/exe";
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) g_self.assign(buf, (size_t)n);
    tpd_comm_mpi_start(&g_world);
    g_data = tiny::write_corpus(tiny::temp_prefix("ckcorpus"));
    int rc = RUN_ALL_TESTS();
    tpd_comm_mpi_finish(g_world);

    return rc;
}
