// Agreement with Hugging Face transformers on fixtures written by tools/hf_fixtures.py:
// a tiny LlamaForCausalLM (grouped-query attention, untied head, rope_theta 50000, bf16
// shards with an index), a Qwen2ForCausalLM (QKV biases, tied head, fp32) and a
// GPT2LMHeadModel (fp16), a MixtralForCausalLM (4 experts, top-2, fp32) and a
// Qwen2MoeForCausalLM (4 experts, top-2 renormalized, a gated shared expert, QKV biases; and the
// same with dense layers 1 and 3 of 4, mlp_only_layers: model.moe_layer_freq 2). Each is
// imported, trained for one step at lr 0 on a stream that repeats the fixture's tokens, and its
// logits (read at the end of the last stage's forward) and loss are compared with transformers'
// fp32 ones: on one rank and at TP2 x PP2. Then export -> import -> export is byte-identical, and a
// bf16 export gives back the fixture's bf16 tensors bit for bit.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ckpt_test_util.h"
#include "common/mpi_tests.h"

extern "C" {
#include "base/bf16.h"
#include "engine/checkpoint/interchange.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/model/model.h"
#include "parallel/mesh.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_root;

constexpr double kLogitsRel = 1e-4; // max |ours - theirs| / max |theirs|
constexpr double kLossAbs = 1e-5;

struct Golden {
    std::vector<int32_t> tokens, targets;
    std::vector<float> logits; // (T, V)
    double loss = 0;
    int T = 0, V = 0;
};

std::string fixture(const std::string &name) {
    return std::string(TPD_HF_FIXTURES) + "/" + name;
}

Golden golden(const std::string &name) {
    Golden g;
    std::string text = ckt::slurp(fixture(name) + "/golden.json");
    cJSON *j = cJSON_Parse(text.c_str());
    EXPECT_NE(j, nullptr) << name;
    if (!j) return g;
    g.T = cJSON_GetObjectItem(j, "seq_length")->valueint;
    g.V = cJSON_GetObjectItem(j, "vocab_size")->valueint;
    g.loss = cJSON_GetObjectItem(j, "loss")->valuedouble;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "tokens")) g.tokens.push_back(e->valueint);
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "targets")) g.targets.push_back(e->valueint);
    cJSON_Delete(j);
    std::string raw = ckt::slurp(fixture(name) + "/logits.f32");
    g.logits.resize(raw.size() / 4);
    memcpy(g.logits.data(), raw.data(), raw.size());
    EXPECT_EQ(g.logits.size(), (size_t)g.T * g.V);
    return g;
}

// An llm.c token shard whose stream repeats the tokens: every window of T+1 tokens that
// starts at a multiple of T reads them, with the targets shifted cyclically.
void write_stream(const std::string &path, const std::vector<int32_t> &tokens, int repeats) {
    std::vector<int32_t> hdr(256, 0);
    hdr[0] = 20240520;
    hdr[1] = 1;
    hdr[2] = (int32_t)(tokens.size() * repeats);
    std::string data((const char *)hdr.data(), 1024);
    for (int r = 0; r < repeats; r++)
        for (int32_t t : tokens) {
            uint16_t u = (uint16_t)t;
            data.append((const char *)&u, 2);
        }
    ckt::spit(path, data);
}

// Imports a Hugging Face folder (world rank 0) into a checkpoint for the layout; returns
// its config.
tpd_config import_dir(const std::string &dir, int tp, int pp, const std::string &out) {
    tpd_config cfg;
    float *w[TPD_P_COUNT] = {};
    EXPECT_EQ(tpd_ckpt_import_hf(dir.c_str(), &cfg, w), TPD_OK) << tpd_last_error();
    EXPECT_EQ(tpd_ckpt_write_weights(&cfg, tp, pp, 1, w, out.c_str()), TPD_OK) << tpd_last_error();
    tpd_ckpt_free_weights(w);
    return cfg;
}

tpd_config import_fixture(const std::string &name, int tp, int pp, const std::string &out) {
    return import_dir(fixture(name + "/model"), tp, pp, out);
}

struct LogitsProbe {
    tpd_trainer *tr = nullptr;
    int mb = 0;
    std::vector<float> local; // (N, Vl) of this rank's vocab slice
    bool seen = false;
};

// After the last stage's forward of the last chunk: its head block holds the logits.
void probe(void *user, const tpd_pp_action *a, double, double) {
    auto *p = static_cast<LogitsProbe *>(user);
    tpd_model *m = tpd_trainer_model(p->tr);
    const tpd_model_dims *d = &m->d;
    if (a->kind != TPD_PP_FWD || !d->last || a->chunk != d->v - 1 || p->seen) return;
    tpd_model_mb at = {a->chunk, 0, 0}; // one micro-batch: the first slot and head block
    const float *l = static_cast<const float *>(tpd_model_logits(m, &at));
    p->local.assign(l, l + (size_t)d->B * d->T * d->Vl);
    p->seen = true;
}

struct Result {
    double loss = NAN, logits_err = NAN;
};

// Trains one step at lr 0 on the layout's ranks; returns the loss, and on the last stage's
// ranks the logits' error against the golden ones over their vocab slice.
Result run_layout(const std::string &name, const tpd_config &imported, int tp, int pp,
                  const std::string &ckpt, const std::string &data, const Golden &g) {
    Result r;
    int n = tp * pp, member = tpd_comm_rank(g_world) < n;
    tpd_comm *sub = nullptr;
    EXPECT_EQ(tpd_comm_split(g_world, member ? 0 : -1, tpd_comm_rank(g_world), "layout", &sub),
              TPD_OK);
    if (member) {
        tpd_config cfg = imported;
        cfg.model.seq_length = g.T;
        cfg.model.make_vocab_size_divisible_by = 8;
        cfg.training.micro_batch_size = 1;
        cfg.training.global_batch_size = 1;
        cfg.training.train_iters = 1;
        cfg.training.num_threads = 1;
        cfg.optimizer.lr = 0;
        cfg.optimizer.min_lr = 0;
        cfg.optimizer.lr_warmup_iters = 0;
        cfg.optimizer.weight_decay = 0;
        cfg.parallel.tensor_model_parallel_size = tp;
        cfg.parallel.pipeline_model_parallel_size = pp;
        cfg.parallel.data_parallel_size = 1;
        cfg.logging.eval_interval = 0;
        cfg.logging.metrics_file[0] = 0;
        cfg.checkpoint.finetune = 1;
        snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "%s", ckpt.c_str());
        snprintf(cfg.data.data_path, sizeof cfg.data.data_path, "%s", data.c_str());
        tpd_trainer *tr = nullptr;
        EXPECT_EQ(tpd_trainer_create(&cfg, sub, &tr), TPD_OK) << name;
        if (tr) {
            LogitsProbe p;
            p.tr = tr;
            tpd_trainer_set_observer(tr, probe, &p);
            tpd_step_stats s;
            EXPECT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
            r.loss = s.lm_loss;
            if (p.seen) {
                const tpd_model_dims *d = &tpd_trainer_model(tr)->d;
                double num = 0, den = 0;
                for (float x : g.logits)
                    den = std::max(den, (double)std::fabs(x));
                for (int t = 0; t < g.T; t++)
                    for (int c = 0; c < d->Vl && d->v0 + c < g.V; c++)
                        num = std::max(num, std::fabs((double)p.local[(size_t)t * d->Vl + c] -
                                                      g.logits[(size_t)t * g.V + d->v0 + c]));
                r.logits_err = num / den;
            }
            tpd_trainer_destroy(tr);
        }
        tpd_comm_destroy(sub);
    }
    tpd_comm_barrier(g_world);
    return r;
}

class Agreement : public testing::TestWithParam<const char *> {};

TEST_P(Agreement, LogitsAndLossMatchTransformersOnOneRankAndTp2Pp2) {
    std::string name = GetParam();
    Golden g = golden(name);
    ASSERT_FALSE(g.tokens.empty());
    std::string base = g_root + "/" + name;
    tpd_config cfg1;
    if (tpd_comm_rank(g_world) == 0) {
        ckt::fresh_dir(base);
        cfg1 = import_fixture(name, 1, 1, base + "/ck1");
        import_fixture(name, 2, 2, base + "/ck4");
        write_stream(base + "/stream.bin", g.tokens, 64);
    }
    tpd_comm_broadcast(g_world, &cfg1, sizeof cfg1, TPD_DTYPE_U8, 0, nullptr);
    const struct {
        int tp, pp;
        std::string ckpt;
    } layouts[] = {{1, 1, base + "/ck1"}, {2, 2, base + "/ck4"}};
    for (const auto &L : layouts) {
        Result r = run_layout(name, cfg1, L.tp, L.pp, L.ckpt, base + "/stream.bin", g);
        int rank = tpd_comm_rank(g_world);
        if (rank < L.tp * L.pp) {
            EXPECT_NEAR(r.loss, g.loss, kLossAbs) << name << " TP" << L.tp << " PP" << L.pp;
            // the last stage's ranks hold the logits
            if (rank >= L.tp * (L.pp - 1)) {
                EXPECT_LE(r.logits_err, kLogitsRel) << name << " TP" << L.tp << " PP" << L.pp;
                if (rank == L.tp * (L.pp - 1))
                    printf("%s TP%d PP%d: loss %.7f (transformers %.7f), logits max rel error "
                           "%.2e\n",
                           name.c_str(), L.tp, L.pp, r.loss, g.loss, r.logits_err);
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Hf, Agreement,
                         testing::Values("llama", "llama31", "qwen2", "gpt2", "mixtral", "qwen2moe",
                                         "qwen2moe_mixed", "qwen3", "qwen3moe"),
                         [](const testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param);
                         });

std::vector<float> read_tensor(const tpd_st_set *set, const tpd_st_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    std::vector<float> v(n);
    EXPECT_EQ(tpd_st_read_f32(set, t, v.data(), n), TPD_OK) << t->name;
    return v;
}

// import -> export (fp32) -> import -> export gives the same files byte for byte, and a
// bf16 export of the imported bf16 model gives back every tensor of the fixture exactly.
TEST(HfRoundTrip, ExportImportExportIsByteIdenticalAndBf16IsExact) {
    if (tpd_comm_rank(g_world) != 0) return;
    std::string base = ckt::fresh_dir(g_root + "/roundtrip");
    for (const char *name : {"llama", "llama31", "qwen2", "gpt2", "mixtral", "qwen2moe",
                             "qwen2moe_mixed", "qwen3", "qwen3moe"}) {
        std::string b = base + "/" + name;
        import_fixture(name, 2, 1, b + "/a");
        tpd_ckpt_info info;
        float *w[TPD_P_COUNT] = {};
        ASSERT_EQ(tpd_ckpt_open_weights((b + "/a").c_str(), &info), TPD_OK);
        ASSERT_EQ(tpd_ckpt_read_weights(&info, w), TPD_OK);
        tpd_hf_export small = TPD_HF_EXPORT_INIT;
        small.max_shard_bytes = 40000; // several shards and an index
        ASSERT_EQ(tpd_ckpt_export_hf(&info.cfg, w, (b + "/x").c_str(), &small), TPD_OK)
            << tpd_last_error();
        tpd_hf_export bf16 = TPD_HF_EXPORT_INIT;
        bf16.bf16 = 1;
        ASSERT_EQ(tpd_ckpt_export_hf(&info.cfg, w, (b + "/h").c_str(), &bf16), TPD_OK);
        tpd_ckpt_free_weights(w);
        tpd_ckpt_close(&info);
        import_dir(b + "/x", 1, 2, b + "/b"); // from the export
        ASSERT_EQ(tpd_ckpt_open_weights((b + "/b").c_str(), &info), TPD_OK);
        ASSERT_EQ(tpd_ckpt_read_weights(&info, w), TPD_OK);
        ASSERT_EQ(tpd_ckpt_export_hf(&info.cfg, w, (b + "/y").c_str(), &small), TPD_OK);
        tpd_ckpt_free_weights(w);
        tpd_ckpt_close(&info);
        int files = 0;
        for (const auto &e : std::filesystem::directory_iterator(b + "/x")) {
            std::string f = e.path().filename();
            EXPECT_EQ(ckt::slurp(b + "/x/" + f), ckt::slurp(b + "/y/" + f)) << name << " " << f;
            files++;
        }
        EXPECT_GE(files, 3) << name << ": config.json, an index and shards";
        // the bf16 export against the fixture's own tensors (bf16, fp32 or fp16 there)
        tpd_st_set *fx = nullptr, *ours = nullptr;
        ASSERT_EQ(tpd_st_open(fixture(std::string(name) + "/model").c_str(), &fx), TPD_OK);
        ASSERT_EQ(tpd_st_open((b + "/h").c_str(), &ours), TPD_OK);
        int compared = 0;
        for (int i = 0; i < tpd_st_count(fx); i++) {
            const tpd_st_tensor *t = tpd_st_get(fx, i);
            const tpd_st_tensor *u = tpd_st_find(ours, t->name);
            if (!u) {
                // GPT-2's causal-mask buffers are not weights
                EXPECT_NE(std::string(t->name).find(".attn."), std::string::npos) << t->name;
                continue;
            }
            std::vector<float> a = read_tensor(fx, t), c = read_tensor(ours, u);
            ASSERT_EQ(a.size(), c.size()) << t->name;
            // a bf16 fixture comes back exactly; fp32 and fp16 ones rounded to bf16
            for (size_t k = 0; k < a.size(); k++)
                ASSERT_EQ(tpd_bf16_to_f32(tpd_bf16_from_f32(a[k])), c[k])
                    << name << " " << t->name << "[" << k << "]";
            compared++;
        }
        EXPECT_GT(compared, 5) << name;
        tpd_st_close(fx);
        tpd_st_close(ours);
    }
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    tpd_comm_mpi_start(&g_world);
    char path[256] = {0};
    if (tpd_comm_rank(g_world) == 0)
        snprintf(path, sizeof path, "%s", tiny::temp_prefix("hfa").c_str());
    tpd_comm_broadcast(g_world, path, sizeof path, TPD_DTYPE_U8, 0, nullptr);
    g_root = path;
    int rc = tiny::mpi_run_all_tests(g_world);
    tpd_comm_mpi_finish(g_world);
    return rc;
}
