// Interchange and generation: Hugging Face safetensors and llm.c files round-trip exactly
// (export, import, export again gives the same bytes), the exported safetensors header is
// valid (golden checks of lengths, offsets, dtypes and the HF shapes), Hub-style names are
// accepted, imported checkpoints load as weights only, and sampling is reproducible.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ckpt_test_util.h"

extern "C" {
#include "engine/cli/cli.h"
#include "engine/generate/generate.h"
#include "engine/checkpoint/interchange.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_data, g_ckpt, g_llama_ckpt;

// A trained tiny checkpoint shared by the tests.
// A trained checkpoint of the tiny GPT-2, or of the tiny Llama.
std::string checkpoint(bool llama = false) {
    std::string &cached = llama ? g_llama_ckpt : g_ckpt;
    if (!cached.empty()) return cached;
    std::string save = ckt::fresh_dir(tiny::temp_prefix(llama ? "xchg_llama" : "xchg"));
    tpd_config cfg = tiny::config(g_data);
    if (llama) tiny::llama(cfg);
    cfg.training.train_iters = 3;
    snprintf(cfg.checkpoint.save, sizeof cfg.checkpoint.save, "%s", save.c_str());
    tpd_trainer *tr = nullptr;
    EXPECT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_run(tr), TPD_OK);
    tpd_trainer_destroy(tr);
    cached = save + "/iter_0000003";
    return cached;
}

struct Weights {
    float *w[TPD_P_COUNT] = {};
    tpd_config cfg;
    ~Weights() {
        tpd_ckpt_free_weights(w);
    }
};

void load_weights(const std::string &path, Weights *out) {
    tpd_ckpt_info info;
    ASSERT_EQ(tpd_ckpt_open(path.c_str(), &info), TPD_OK);
    out->cfg = info.cfg;
    ASSERT_EQ(tpd_ckpt_read_weights(&info, out->w), TPD_OK);
    tpd_ckpt_close(&info);
}

size_t numel(const tpd_config &cfg, int p) {
    tpd_model_layout g;
    tpd_model_layout_init(&cfg, 1, 0, 1, 0, &g);
    return tpd_model_layout_global_numel(&g, (tpd_param)p);
}

void expect_same(const Weights &a, const Weights &b) {
    for (int p = 0; p < TPD_P_COUNT; p++) {
        ASSERT_NE(b.w[p], nullptr);
        EXPECT_EQ(0, memcmp(a.w[p], b.w[p], numel(a.cfg, p) * 4))
            << tpd_param_get_info((tpd_param)p)->name;
    }
}

int run_cli(std::vector<std::string> args) {
    std::vector<char *> argv;
    for (auto &s : args)
        argv.push_back(&s[0]);
    return tpd_cli_ckpt((int)argv.size(), argv.data());
}

TEST(Interchange, HuggingFaceRoundTripIsExact) {
    Weights orig, back;
    load_weights(checkpoint(), &orig);
    std::string out = ckt::fresh_dir(tiny::temp_prefix("hf"));
    ASSERT_EQ(run_cli({"export", checkpoint(), "--format", "hf", "--output", out + "/a"}), 0);
    ASSERT_EQ(run_cli({"import", out + "/a", "--format", "hf", "--output", out + "/ck", "--layout",
                       "2,2,1"}),
              0);
    load_weights(out + "/ck", &back);
    expect_same(orig, back);
    EXPECT_EQ(back.cfg.model.num_attention_heads, 4);
    EXPECT_EQ(back.cfg.model.ffn_hidden_size, 128);
    EXPECT_EQ(back.cfg.model.max_position_embeddings, 16);
    ASSERT_EQ(run_cli({"export", out + "/ck", "--format", "hf", "--output", out + "/b"}), 0);
    std::string a = ckt::slurp(out + "/a/model.safetensors"),
                b = ckt::slurp(out + "/b/model.safetensors");
    EXPECT_GT(a.size(), 100000u);
    EXPECT_TRUE(a == b) << "re-exported safetensors differ";
}

TEST(Interchange, SafetensorsHeaderIsValid) {
    std::string out = ckt::fresh_dir(tiny::temp_prefix("hfgold"));
    ASSERT_EQ(run_cli({"export", checkpoint(), "--format", "hf", "--output", out}), 0);
    std::string f = ckt::slurp(out + "/model.safetensors");
    ASSERT_GE(f.size(), 8u);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)(uint8_t)f[i] << (8 * i);
    ASSERT_LE(n, f.size() - 8);
    EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
    cJSON *h = cJSON_ParseWithLength(f.data() + 8, n);
    ASSERT_NE(h, nullptr);
    EXPECT_TRUE(cJSON_IsObject(cJSON_GetObjectItem(h, "__metadata__")));
    // offsets: contiguous from 0 to the end of the file, no holes, no overlaps
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    int count = 0;
    for (cJSON *e = h->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        count++;
        EXPECT_STREQ(cJSON_GetObjectItem(e, "dtype")->valuestring, "F32") << e->string;
        cJSON *off = cJSON_GetObjectItem(e, "data_offsets");
        uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
        uint64_t en = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        uint64_t elems = 1;
        for (cJSON *d = cJSON_GetObjectItem(e, "shape")->child; d; d = d->next)
            elems *= (uint64_t)d->valuedouble;
        EXPECT_EQ(en - b, elems * 4) << e->string;
        spans.push_back({b, en});
    }
    std::sort(spans.begin(), spans.end());
    uint64_t at = 0;
    for (auto &s : spans) {
        EXPECT_EQ(s.first, at);
        at = s.second;
    }
    EXPECT_EQ(at, f.size() - 8 - n);
    EXPECT_EQ(count, 2 + 12 * 4 + 2); // wte, wpe, 12 per layer, ln_f
    EXPECT_EQ(cJSON_GetObjectItem(h, "lm_head.weight"), nullptr) << "tied head is not written";
    const struct {
        const char *name;
        std::vector<int> shape;
    } golden[] = {
        {"transformer.wte.weight", {257, 32}},
        {"transformer.wpe.weight", {16, 32}},
        {"transformer.h.0.ln_1.weight", {32}},
        {"transformer.h.3.attn.c_attn.weight", {32, 96}},
        {"transformer.h.1.attn.c_attn.bias", {96}},
        {"transformer.h.2.attn.c_proj.weight", {32, 32}},
        {"transformer.h.0.mlp.c_fc.weight", {32, 128}},
        {"transformer.h.0.mlp.c_fc.bias", {128}},
        {"transformer.h.3.mlp.c_proj.weight", {128, 32}},
        {"transformer.ln_f.bias", {32}},
    };
    for (const auto &g : golden) {
        cJSON *e = cJSON_GetObjectItem(h, g.name);
        ASSERT_NE(e, nullptr) << g.name;
        cJSON *s = cJSON_GetObjectItem(e, "shape");
        ASSERT_EQ(cJSON_GetArraySize(s), (int)g.shape.size()) << g.name;
        for (size_t d = 0; d < g.shape.size(); d++)
            EXPECT_EQ(cJSON_GetArrayItem(s, (int)d)->valueint, g.shape[d]) << g.name;
    }
    // Conv1D layout: c_attn.weight[in][out] == qkvw[out][in] of layer 0
    Weights w;
    load_weights(checkpoint(), &w);
    cJSON *qkv = cJSON_GetObjectItem(h, "transformer.h.0.attn.c_attn.weight");
    uint64_t b =
        (uint64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(qkv, "data_offsets"), 0)->valuedouble;
    const float *hf = reinterpret_cast<const float *>(f.data() + 8 + n + b);
    for (int in : {0, 5, 31})
        for (int o : {0, 40, 95})
            EXPECT_EQ(hf[in * 96 + o], w.w[TPD_P_QKVW][o * 32 + in]);
    cJSON_Delete(h);
    cJSON *c = cJSON_Parse(ckt::slurp(out + "/config.json").c_str());
    ASSERT_NE(c, nullptr);
    EXPECT_STREQ(cJSON_GetObjectItem(c, "model_type")->valuestring, "gpt2");
    EXPECT_STREQ(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "architectures"), 0)->valuestring,
                 "GPT2LMHeadModel");
    EXPECT_STREQ(cJSON_GetObjectItem(c, "activation_function")->valuestring, "gelu_new");
    EXPECT_EQ(cJSON_GetObjectItem(c, "vocab_size")->valueint, 257);
    EXPECT_EQ(cJSON_GetObjectItem(c, "n_positions")->valueint, 16);
    EXPECT_EQ(cJSON_GetObjectItem(c, "n_embd")->valueint, 32);
    EXPECT_EQ(cJSON_GetObjectItem(c, "n_layer")->valueint, 4);
    EXPECT_EQ(cJSON_GetObjectItem(c, "n_head")->valueint, 4);
    EXPECT_EQ(cJSON_GetObjectItem(c, "n_inner")->valueint, 128);
    EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(c, "layer_norm_epsilon")->valuedouble, 1e-5);
    EXPECT_TRUE(cJSON_IsTrue(cJSON_GetObjectItem(c, "tie_word_embeddings")));
    cJSON_Delete(c);
}

TEST(Interchange, HubNamesBuffersAndHeadAreAccepted) {
    std::string out = ckt::fresh_dir(tiny::temp_prefix("hub"));
    ASSERT_EQ(run_cli({"export", checkpoint(), "--format", "hf", "--output", out}), 0);
    std::string f = ckt::slurp(out + "/model.safetensors");
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)(uint8_t)f[i] << (8 * i);
    cJSON *h = cJSON_ParseWithLength(f.data() + 8, n);
    std::string data = f.substr(8 + n);
    cJSON *hub = cJSON_CreateObject();
    for (cJSON *e = h->child; e; e = e->next) {
        std::string name = e->string;
        if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
        cJSON_AddItemToObject(hub, name.c_str(), cJSON_Duplicate(e, 1));
    }
    // the causal-mask buffer and a head copy, as Hub files carry them
    cJSON *mask = cJSON_AddObjectToObject(hub, "h.0.attn.bias");
    cJSON_AddStringToObject(mask, "dtype", "F32");
    int shape[4] = {1, 1, 16, 16};
    cJSON_AddItemToObject(mask, "shape", cJSON_CreateIntArray(shape, 4));
    double offs[2] = {(double)data.size(), (double)data.size() + 1024};
    cJSON_AddItemToObject(mask, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
    data += std::string(1024, '\0');
    // the head copy has bytes of its own: safetensors tensors never share bytes
    cJSON *head = cJSON_Duplicate(cJSON_GetObjectItem(h, "transformer.wte.weight"), 1);
    cJSON *hoff = cJSON_GetObjectItem(head, "data_offsets");
    size_t b = (size_t)cJSON_GetArrayItem(hoff, 0)->valuedouble;
    size_t e = (size_t)cJSON_GetArrayItem(hoff, 1)->valuedouble;
    cJSON_SetNumberValue(cJSON_GetArrayItem(hoff, 0), (double)data.size());
    cJSON_SetNumberValue(cJSON_GetArrayItem(hoff, 1), (double)(data.size() + e - b));
    data += data.substr(b, e - b);
    cJSON_AddItemToObject(hub, "lm_head.weight", head);
    char *text = cJSON_PrintUnformatted(hub);
    std::string hdr = text;
    free(text);
    cJSON_Delete(hub);
    cJSON_Delete(h);
    std::string len(8, '\0');
    for (int i = 0; i < 8; i++)
        len[i] = (char)((hdr.size() >> (8 * i)) & 0xff);
    ckt::spit(out + "/model.safetensors", len + hdr + data);
    Weights orig, back;
    load_weights(checkpoint(), &orig);
    ASSERT_EQ(tpd_ckpt_import_hf((out + "/model.safetensors").c_str(), &back.cfg, back.w), TPD_OK);
    back.cfg = orig.cfg;
    expect_same(orig, back);
}

TEST(Interchange, LlmcRoundTripIsExact) {
    Weights orig, back;
    load_weights(checkpoint(), &orig);
    std::string out = ckt::fresh_dir(tiny::temp_prefix("llmc"));
    ASSERT_TRUE(std::filesystem::create_directories(out));
    ASSERT_EQ(run_cli({"export", checkpoint(), "--format", "llmc", "--output", out + "/m.bin"}), 0);
    std::string f = ckt::slurp(out + "/m.bin");
    const int32_t *hd = reinterpret_cast<const int32_t *>(f.data());
    // [magic, version, maxT, V, L, NH, C, Vp]; Vp = 257 padded to a multiple of 8
    EXPECT_EQ(hd[0], 20240326);
    EXPECT_EQ(hd[1], 3);
    EXPECT_EQ(hd[2], 16);
    EXPECT_EQ(hd[3], 257);
    EXPECT_EQ(hd[4], 4);
    EXPECT_EQ(hd[5], 4);
    EXPECT_EQ(hd[6], 32);
    EXPECT_EQ(hd[7], 264);
    size_t params = 0;
    for (int p = 0; p < TPD_P_COUNT; p++)
        params += numel(orig.cfg, p);
    EXPECT_EQ(f.size(), 1024 + 4 * (params + 7 * 32));
    const float *wte = reinterpret_cast<const float *>(f.data() + 1024);
    EXPECT_EQ(wte[256 * 32 + 5], orig.w[TPD_P_WTE][256 * 32 + 5]);
    for (int i = 257 * 32; i < 264 * 32; i++)
        ASSERT_EQ(wte[i], 0.0f) << "pad rows are zero";
    ASSERT_EQ(run_cli({"import", out + "/m.bin", "--format", "llmc", "--output", out + "/ck",
                       "--layout", "1,2,2"}),
              0);
    load_weights(out + "/ck", &back);
    expect_same(orig, back);
    ASSERT_EQ(run_cli({"export", out + "/ck", "--format", "llmc", "--output", out + "/m2.bin"}), 0);
    EXPECT_TRUE(f == ckt::slurp(out + "/m2.bin"));
    // llm.c cannot hold a non-4C MLP: a clear refusal
    orig.cfg.model.ffn_hidden_size = 64;
    EXPECT_EQ(tpd_ckpt_export_llmc(&orig.cfg, orig.w, (out + "/bad.bin").c_str()),
              TPD_ERR_UNSUPPORTED);
}

TEST(Interchange, ImportedCheckpointLoadsAsWeightsOnly) {
    Weights orig;
    load_weights(checkpoint(), &orig);
    std::string out = ckt::fresh_dir(tiny::temp_prefix("imported"));
    ASSERT_EQ(tpd_ckpt_write_weights(&orig.cfg, 1, 1, 1, orig.w, out.c_str()), TPD_OK);
    tpd_config cfg = tiny::config(g_data);
    cfg.parallel.use_distributed_optimizer = 0;
    snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "%s", out.c_str());
    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_EQ(tpd_trainer_iteration(tr), 0);
    std::vector<float> wte(numel(cfg, TPD_P_WTE));
    ASSERT_EQ(tpd_trainer_gather_param(tr, TPD_P_WTE, wte.data()), TPD_OK);
    EXPECT_EQ(0, memcmp(wte.data(), orig.w[TPD_P_WTE], wte.size() * 4));
    tpd_step_stats s;
    EXPECT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
    EXPECT_TRUE(std::isfinite(s.lm_loss));
    tpd_trainer_destroy(tr);
    cfg.model.num_layers = 2;
    ASSERT_NE(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    EXPECT_NE(std::string(tpd_last_error())
                  .find("model.num_layers is 4 in the checkpoint but 2 in the config"),
              std::string::npos)
        << tpd_last_error();
    // a directory that holds a checkpoint is never overwritten
    EXPECT_EQ(tpd_ckpt_write_weights(&orig.cfg, 1, 1, 1, orig.w, out.c_str()), TPD_ERR_INVALID);
}

class Generate : public ::testing::TestWithParam<bool> {};

// The key/value cache decodes one position at a time. For every prefix that fits in
// seq_length (16 here), its next-token logits equal those of a full forward; greedy
// generation then gives the same tokens, and past the window it still runs. The Llama
// block's cache holds its 2 K/V heads per layer, and RoPE rotates each new position at
// its place in the cache (after a restart, positions begin again at 0, as the full forward
// of the same window does).
TEST_P(Generate, KvCacheMatchesFullForward) {
    const bool llama = GetParam();
    const char *text = "the quick brown "; // 16 bytes
    std::vector<int32_t> toks(text, text + 16);
    std::vector<float> a(257), b(257);
    double worst = 0;
    for (size_t n = 1; n <= toks.size(); n++) {
        ASSERT_EQ(tpd_generate_logits(checkpoint(llama).c_str(), toks.data(), n, 1, a.data()),
                  TPD_OK);
        ASSERT_EQ(tpd_generate_logits(checkpoint(llama).c_str(), toks.data(), n, 0, b.data()),
                  TPD_OK);
        for (int v = 0; v < 257; v++) {
            double e = std::fabs(a[v] - b[v]) / (1.0 + std::fabs(b[v]));
            worst = std::max(worst, e);
            ASSERT_LE(e, 1e-5) << "prefix " << n << " token " << v << ": " << a[v] << " vs "
                               << b[v];
        }
    }
    printf("kv cache against full forward: worst relative logit error %.2e\n", worst);
    EXPECT_EQ(tpd_generate_logits(checkpoint(llama).c_str(), toks.data(), 17, 1, a.data()),
              TPD_ERR_INVALID);

    tpd_gen_opts o = TPD_GEN_OPTS_INIT;
    o.prompt = "the";
    o.num_threads = 1;
    o.temperature = 0;
    for (int max_new : {13, 40}) {
        SCOPED_TRACE(max_new);
        o.max_new_tokens = max_new;
        int32_t *x = nullptr, *y = nullptr;
        size_t nx = 0, ny = 0;
        o.kv_cache = 1;
        ASSERT_EQ(tpd_generate(checkpoint(llama).c_str(), &o, &x, &nx), TPD_OK);
        o.kv_cache = 0;
        ASSERT_EQ(tpd_generate(checkpoint(llama).c_str(), &o, &y, &ny), TPD_OK);
        ASSERT_EQ(nx, (size_t)max_new);
        ASSERT_EQ(ny, (size_t)max_new);
        EXPECT_EQ(0, memcmp(x, y, 13 * sizeof *x)) << "3 + 13 tokens fit in seq_length";
        for (size_t i = 0; i < nx; i++)
            EXPECT_LT(x[i], 257);
        free(x);
        free(y);
    }
}

INSTANTIATE_TEST_SUITE_P(Model, Generate, ::testing::Values(false, true),
                         [](const testing::TestParamInfo<bool> &i) {
                             return std::string(i.param ? "Llama" : "Gpt2");
                         });

// Qwen3's block decodes with its QK norm: each new position's Q and K heads are normalized
// before RoPE and the cache, as the full forward does. The Qwen3 and Qwen3-MoE fixtures
// (tools/hf_fixtures.py; Qwen3-MoE's heads are 16 wide at hidden 32), imported, for every
// prefix of 24 tokens; and the Qwen2-MoE fixture whose layers 1 and 3 are dense MLPs
// (model.moe_layer_freq 2), each decoded layer taking its own kind's MLP.
TEST(Generate, Qwen3KvCacheMatchesFullForward) {
    for (const char *name : {"qwen3", "qwen3moe", "qwen2moe_mixed"}) {
        SCOPED_TRACE(name);
        std::string ck = ckt::fresh_dir(tiny::temp_prefix(name)) + "/ck";
        ASSERT_EQ(run_cli({"import", std::string(TPD_HF_FIXTURES) + "/" + name + "/model",
                           "--format", "hf", "--output", ck}),
                  0);
        std::vector<int32_t> toks;
        for (int i = 0; i < 24; i++)
            toks.push_back((i * 37 + 11) % 300);
        std::vector<float> a(300), b(300);
        double worst = 0;
        for (size_t n = 1; n <= toks.size(); n++) {
            ASSERT_EQ(tpd_generate_logits(ck.c_str(), toks.data(), n, 1, a.data()), TPD_OK);
            ASSERT_EQ(tpd_generate_logits(ck.c_str(), toks.data(), n, 0, b.data()), TPD_OK);
            for (int v = 0; v < 300; v++) {
                double e = std::fabs(a[v] - b[v]) / (1.0 + std::fabs(b[v]));
                worst = std::max(worst, e);
                ASSERT_LE(e, 1e-5) << "prefix " << n << " token " << v;
            }
        }
        printf("%s: kv cache against full forward, worst relative logit error %.2e\n", name, worst);
    }
}

// A trained Llama (grouped-query attention, untied head) goes out as LlamaForCausalLM and
// comes back exactly, at another layout; llm.c's layout is GPT-2's and refuses it by name.
TEST(Interchange, LlamaHuggingFaceRoundTripIsExactAndLlmcRefuses) {
    Weights orig, back;
    load_weights(checkpoint(true), &orig);
    std::string out = ckt::fresh_dir(tiny::temp_prefix("llama_export"));
    ASSERT_EQ(run_cli({"export", checkpoint(true), "--format", "hf", "--output", out + "/hf",
                       "--max-shard-size", "20KB"}),
              0);
    cJSON *c = cJSON_Parse(ckt::slurp(out + "/hf/config.json").c_str());
    EXPECT_STREQ(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "architectures"), 0)->valuestring,
                 "LlamaForCausalLM");
    EXPECT_EQ(cJSON_GetObjectItem(c, "num_key_value_heads")->valueint, 2);
    EXPECT_TRUE(cJSON_IsFalse(cJSON_GetObjectItem(c, "tie_word_embeddings")));
    cJSON_Delete(c);
    EXPECT_FALSE(ckt::slurp(out + "/hf/model.safetensors.index.json").empty());
    ASSERT_EQ(run_cli({"import", out + "/hf", "--format", "hf", "--output", out + "/ck", "--layout",
                       "2,2,1"}),
              0);
    load_weights(out + "/ck", &back);
    expect_same(orig, back);
    EXPECT_EQ(back.cfg.model.num_query_groups, 2);
    EXPECT_TRUE(back.cfg.model.untie_embeddings_and_output_weights);
    EXPECT_EQ(tpd_ckpt_export_llmc(&orig.cfg, orig.w, (out + "/model.bin").c_str()),
              TPD_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(tpd_last_error()).find("this model has RMSNorm"), std::string::npos)
        << tpd_last_error();
}

TEST(GenerateSampling, SamplingIsReproducibleAndRespectsTopK) {
    tpd_gen_opts o = TPD_GEN_OPTS_INIT;
    o.prompt = "the quick ";
    o.max_new_tokens = 12;
    o.num_threads = 1;
    o.temperature = 0; // greedy
    int32_t *a = nullptr, *b = nullptr;
    size_t na = 0, nb = 0;
    ASSERT_EQ(tpd_generate(checkpoint().c_str(), &o, &a, &na), TPD_OK);
    o.temperature = 0.8;
    o.top_k = 1; // top-1 sampling is greedy whatever the draw
    ASSERT_EQ(tpd_generate(checkpoint().c_str(), &o, &b, &nb), TPD_OK);
    ASSERT_EQ(na, 12u);
    ASSERT_EQ(nb, 12u);
    EXPECT_EQ(0, memcmp(a, b, na * 4));
    free(b);
    o.top_k = 20;
    o.seed = 7;
    int32_t *c = nullptr, *d = nullptr;
    ASSERT_EQ(tpd_generate(checkpoint().c_str(), &o, &c, &nb), TPD_OK);
    ASSERT_EQ(tpd_generate(checkpoint().c_str(), &o, &d, &nb), TPD_OK);
    EXPECT_EQ(0, memcmp(c, d, nb * 4)) << "same seed, same text";
    for (size_t i = 0; i < nb; i++)
        EXPECT_LT(c[i], 257);
    free(a);
    free(c);
    free(d);
    // the sampler itself: p = softmax(logits / T) over the top k
    float logits[4] = {0.0f, std::log(3.0f), -1e9f, -1e9f};
    EXPECT_EQ(tpd_generate_sample(logits, 4, 1.0, 0, 1.0, 0.2), 0); // P(0) = 0.25
    EXPECT_EQ(tpd_generate_sample(logits, 4, 1.0, 0, 1.0, 0.3), 1);
    EXPECT_EQ(tpd_generate_sample(logits, 4, 1.0, 1, 1.0, 0.0), 1); // top-1
    EXPECT_EQ(tpd_generate_sample(logits, 4, 0.0, 0, 1.0, 0.0), 1);
    // top-p: token 1 alone holds 0.75 >= 0.5, so every draw is it; at 0.9 both stay
    EXPECT_EQ(tpd_generate_sample(logits, 4, 1.0, 0, 0.5, 0.01), 1);
    EXPECT_EQ(tpd_generate_sample(logits, 4, 1.0, 0, 0.5, 0.99), 1);
    EXPECT_EQ(tpd_generate_sample(logits, 4, 1.0, 0, 0.9, 0.2), 0);
    // with top-k 2 and top-p, the nucleus is taken within the top k
    float four[4] = {0.0f, 0.0f, 0.0f, std::log(2.0f)};            // probs 0.2 0.2 0.2 0.4
    EXPECT_EQ(tpd_generate_sample(four, 4, 1.0, 2, 0.6, 0.99), 3); // top-2: 1/3, 2/3 -> {3}
    // the nucleus edge falls on a 0.2 that ties with two others: all three stay with it
    EXPECT_EQ(tpd_generate_sample(four, 4, 1.0, 0, 0.6, 0.5), 2); // greedy
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    tpd_comm_mpi_start(&g_world);
    g_data = tiny::write_corpus(tiny::temp_prefix("xcorpus"));
    int rc = RUN_ALL_TESTS();
    tpd_comm_mpi_finish(g_world);

    return rc;
}
