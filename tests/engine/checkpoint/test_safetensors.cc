// safetensors and Hugging Face folders: fp16 widening against a plain reference, header
// validation, and every refusal of a bad or unsupported folder naming the file and the
// tensor or key (each made by editing a copy of a fixture of hf/); llm.c model headers
// with a field out of bounds refused by field.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fcntl.h>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "ckpt_test_util.h"

extern "C" {
#include "base/bf16.h"
#include "engine/checkpoint/checkpoint_internal.h"
#include "engine/checkpoint/interchange.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/cli/cli.h"
}

namespace {

// Every fp16 bit pattern: sign * 2^(e-15) * (1 + m/1024), subnormals 2^-14 * m/1024.
TEST(Safetensors, Fp16WidensExactlyForEveryBitPattern) {
    for (uint32_t h = 0; h < 65536; h++) {
        int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        float got = tpd_f16_to_f32((uint16_t)h);
        if (e == 31) {
            EXPECT_TRUE(m ? std::isnan(got) : std::isinf(got)) << h;
            continue;
        }
        double mag = e ? std::ldexp(1.0 + m / 1024.0, e - 15) : std::ldexp(m / 1024.0, -14);
        ASSERT_EQ((double)got, s ? -mag : mag) << "fp16 bits " << h;
        ASSERT_EQ(std::signbit(got), s != 0) << h;
    }
}

TEST(Safetensors, HeaderValidationNamesTheTensor) {
    const struct {
        const char *json, *want;
    } cases[] = {
        {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", nullptr},
        {R"({"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})", "'a' has dtype I8"},
        {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "'a': data_offsets"},
        {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", "'a': data_offsets"},
        {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "'a': shape[0]"},
        {R"({"a":{"dtype":"F32","shape":[2]}})", "'a' needs dtype, shape and data_offsets"},
        {R"([1,2])", "not a JSON object"},
        // the data is the tensors back to back from 0: no shared bytes, holes or tail
        {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
         R"("b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
         "'b': data_offsets [4, 8] overlap tensor 'a'"},
        {R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})",
         "4 bytes after the last tensor"},
        {R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
         "'a': data_offsets start at 4, leaving bytes [0, 4)"},
        {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
         R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
         "'a' appears twice"},
    };
    for (const auto &c : cases) {
        tpd_st_set *set = nullptr;
        ASSERT_EQ(tpd_st_create(&set), TPD_OK);
        tpd_status st = tpd_st_parse_header(set, 0, "x.safetensors", c.json, strlen(c.json), 8);
        if (!c.want) {
            EXPECT_EQ(st, TPD_OK) << c.json;
            EXPECT_EQ(tpd_st_count(set), 1);
        } else {
            EXPECT_NE(st, TPD_OK) << c.json;
            std::string err = tpd_last_error();
            EXPECT_NE(err.find("x.safetensors"), std::string::npos) << err;
            EXPECT_NE(err.find(c.want), std::string::npos) << err;
        }
        tpd_st_close(set);
    }
}

// A copy of fixture `name`'s model folder to edit.
std::string copy_fixture(const std::string &name, const std::string &tag) {
    std::string dst = ckt::fresh_dir(tiny::temp_prefix(tag.c_str()));
    std::filesystem::copy(std::string(TPD_HF_FIXTURES) + "/" + name + "/model", dst);
    return dst;
}

// Applies `edit(header, data)` to a single-file folder's model.safetensors, then writes
// it back with the new header's length.
template <class F> void edit_file(const std::string &dir, F edit) {
    std::string f = ckt::slurp(dir + "/model.safetensors");
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)(uint8_t)f[i] << (8 * i);
    cJSON *h = cJSON_ParseWithLength(f.data() + 8, n);
    ASSERT_NE(h, nullptr);
    std::string data = f.substr(8 + n);
    edit(h, data);
    char *text = cJSON_PrintUnformatted(h);
    std::string hdr = text;
    free(text);
    cJSON_Delete(h);
    std::string len(8, '\0');
    for (int i = 0; i < 8; i++)
        len[i] = (char)((hdr.size() >> (8 * i)) & 0xff);
    ckt::spit(dir + "/model.safetensors", len + hdr + data);
}

// Applies `edit` to the header alone.
template <class F> void edit_header(const std::string &dir, F edit) {
    edit_file(dir, [&](cJSON *h, std::string &) { edit(h); });
}

// Removes tensor `name` from a single-file folder, its bytes with it (the later tensors
// move down), so the file stays well formed.
void drop_tensor(const std::string &dir, const std::string &name) {
    edit_file(dir, [&](cJSON *h, std::string &data) {
        cJSON *of = cJSON_GetObjectItem(cJSON_GetObjectItem(h, name.c_str()), "data_offsets");
        ASSERT_NE(of, nullptr) << name;
        double b = cJSON_GetArrayItem(of, 0)->valuedouble;
        double e = cJSON_GetArrayItem(of, 1)->valuedouble;
        cJSON_DeleteItemFromObject(h, name.c_str());
        for (cJSON *t = h->child; t; t = t->next)
            if (cJSON *o = cJSON_GetObjectItem(t, "data_offsets"))
                for (int i = 0; i < 2; i++)
                    if (cJSON_GetArrayItem(o, i)->valuedouble >= e)
                        cJSON_SetNumberValue(cJSON_GetArrayItem(o, i),
                                             cJSON_GetArrayItem(o, i)->valuedouble - (e - b));
        data.erase((size_t)b, (size_t)(e - b));
    });
}

template <class F> void edit_config(const std::string &dir, F edit) {
    cJSON *c = cJSON_Parse(ckt::slurp(dir + "/config.json").c_str());
    ASSERT_NE(c, nullptr);
    edit(c);
    char *text = cJSON_Print(c);
    ckt::spit(dir + "/config.json", text);
    free(text);
    cJSON_Delete(c);
}

void expect_refused(const std::string &dir, const std::string &file, const std::string &what) {
    tpd_config cfg;
    float *w[TPD_P_COUNT] = {};
    EXPECT_NE(tpd_ckpt_import_hf(dir.c_str(), &cfg, w), TPD_OK) << what;
    std::string err = tpd_last_error();
    EXPECT_NE(err.find(dir + "/" + file), std::string::npos) << err;
    EXPECT_NE(err.find(what), std::string::npos) << err;
    for (float *p : w)
        EXPECT_EQ(p, nullptr);
}

TEST(HfImport, TheFixturesImport) {
    for (const char *name :
         {"llama", "qwen2", "gpt2", "mixtral", "qwen2moe", "qwen3", "qwen3moe"}) {
        tpd_config cfg;
        float *w[TPD_P_COUNT] = {};
        std::string dir = std::string(TPD_HF_FIXTURES) + "/" + name + "/model";
        ASSERT_EQ(tpd_ckpt_import_hf(dir.c_str(), &cfg, w), TPD_OK) << tpd_last_error();
        tpd_ckpt_free_weights(w);
        EXPECT_EQ(cfg.model.vocab_size, 300) << name;
    }
}

TEST(HfImport, ConfigProblemsNameTheKey) {
    struct Case {
        const char *what;
        void (*edit)(cJSON *);
    } cases[] = {
        {"architecture 'FalconForCausalLM' is not supported",
         [](cJSON *c) {
             static const char *const falcon[] = {"FalconForCausalLM"};
             cJSON_ReplaceItemInObject(c, "architectures", cJSON_CreateStringArray(falcon, 1));
         }},
        {"rope_scaling",
         [](cJSON *c) {
             cJSON *r = cJSON_CreateObject();
             cJSON_AddStringToObject(r, "rope_type", "llama3");
             cJSON_AddItemToObject(c, "rope_scaling", r);
         }},
        {"rope_parameters",
         [](cJSON *c) {
             cJSON_ReplaceItemInObject(cJSON_GetObjectItem(c, "rope_parameters"), "rope_type",
                                       cJSON_CreateString("yarn"));
         }},
        {"sliding_window", [](cJSON *c) { cJSON_AddNumberToObject(c, "sliding_window", 8); }},
        {"hidden_act must be \"silu\"",
         [](cJSON *c) { cJSON_ReplaceItemInObject(c, "hidden_act", cJSON_CreateString("gelu")); }},
        {"num_key_value_heads must divide",
         [](cJSON *c) {
             cJSON_ReplaceItemInObject(c, "num_key_value_heads", cJSON_CreateNumber(3));
         }},
        {"key 'hidden_size' must be an integer",
         [](cJSON *c) { cJSON_ReplaceItemInObject(c, "hidden_size", cJSON_CreateNumber(64.5)); }},
        {"key 'head_dim' must be null or an integer",
         [](cJSON *c) { cJSON_ReplaceItemInObject(c, "head_dim", cJSON_CreateNumber(2.5)); }},
        {"attention_bias true with mlp_bias false",
         [](cJSON *c) { cJSON_ReplaceItemInObject(c, "attention_bias", cJSON_CreateTrue()); }},
    };
    for (const Case &c : cases) {
        std::string dir = copy_fixture("llama", "hfbadcfg");
        edit_config(dir, c.edit);
        expect_refused(dir, "config.json", c.what);
    }
}

TEST(HfImport, Gpt2ConfigValuesAreChecked) {
    struct Case {
        const char *what;
        void (*edit)(cJSON *);
    } cases[] = {
        {"key 'layer_norm_epsilon' must be a number in (0, 1)",
         [](cJSON *c) {
             cJSON_ReplaceItemInObject(c, "layer_norm_epsilon", cJSON_CreateNumber(-1));
         }},
        {"key 'layer_norm_epsilon' must be a number in (0, 1)",
         [](cJSON *c) {
             cJSON_ReplaceItemInObject(c, "layer_norm_epsilon", cJSON_CreateNumber(1e30));
         }},
        {"key 'layer_norm_epsilon' must be a number in (0, 1) (it is not a number)",
         [](cJSON *c) {
             cJSON_ReplaceItemInObject(c, "layer_norm_epsilon", cJSON_CreateString("1e-5"));
         }},
        {"key 'n_inner' must be null (4 * n_embd) or an integer",
         [](cJSON *c) { cJSON_ReplaceItemInObject(c, "n_inner", cJSON_CreateNumber(-1)); }},
        {"key 'n_inner' must be null (4 * n_embd) or an integer",
         [](cJSON *c) { cJSON_ReplaceItemInObject(c, "n_inner", cJSON_CreateNumber(64.5)); }},
        {"key 'n_head' must be an integer in [1, ",
         [](cJSON *c) { cJSON_DeleteItemFromObject(c, "n_head"); }},
        {"key 'n_positions' must be an integer in [1, ",
         [](cJSON *c) { cJSON_ReplaceItemInObject(c, "n_positions", cJSON_CreateNumber(0)); }},
    };
    for (const Case &c : cases) {
        std::string dir = copy_fixture("gpt2", "hfgpt2cfg");
        edit_config(dir, c.edit);
        expect_refused(dir, "config.json", c.what);
    }
    {
        std::string dir = copy_fixture("llama", "hfllamaeps");
        edit_config(dir, [](cJSON *c) {
            cJSON_ReplaceItemInObject(c, "rms_norm_eps", cJSON_CreateNumber(-1));
        });
        expect_refused(dir, "config.json", "key 'rms_norm_eps' must be a number in (0, 1)");
    }
    {
        // Python's json writes NaN; JSON has none: the error says so, with where
        std::string dir = copy_fixture("gpt2", "hfnancfg");
        std::string text = ckt::slurp(dir + "/config.json");
        size_t at = text.find("1e-05");
        ASSERT_NE(at, std::string::npos);
        ckt::spit(dir + "/config.json", text.replace(at, 5, "NaN"));
        expect_refused(dir, "config.json", "(near 'NaN,'): NaN and Infinity are not JSON numbers");
        ckt::spit(dir + "/config.json", "{\"n_head\": 4,\n  \"n_layer\": [1,");
        expect_refused(dir, "config.json", "line 2");
        ckt::spit(dir + "/config.json", "[1, 2]");
        expect_refused(dir, "config.json", "valid JSON, but not an object");
    }
    {
        std::string missing = ckt::fresh_dir(tiny::temp_prefix("hfmissing_folder"));
        tpd_config cfg;
        float *w[TPD_P_COUNT] = {};
        EXPECT_EQ(tpd_ckpt_import_hf(missing.c_str(), &cfg, w), TPD_ERR_IO);
        std::string err = tpd_last_error();
        EXPECT_NE(err.find("interchange " + missing + ": No such file or directory"),
                  std::string::npos)
            << err;
    }
}

TEST(HfImport, TensorProblemsNameTheFileAndTensor) {
    const std::string up = "model.layers.1.mlp.up_proj.weight";
    const std::string k = "model.layers.0.self_attn.k_proj.weight";
    {
        std::string dir = copy_fixture("qwen2", "hfmissing");
        drop_tensor(dir, up);
        expect_refused(dir, "model.safetensors", "tensor '" + up + "' is missing");
    }
    {
        std::string dir = copy_fixture("qwen2", "hfshape");
        edit_header(dir, [&](cJSON *h) {
            cJSON *shape = cJSON_GetObjectItem(cJSON_GetObjectItem(h, k.c_str()), "shape");
            cJSON_ReplaceItemInArray(shape, 0, cJSON_CreateNumber(8));
            cJSON_ReplaceItemInArray(shape, 1, cJSON_CreateNumber(32));
        });
        // the offsets still say 16 x 32: the header itself is inconsistent
        expect_refused(dir, "model.safetensors", "tensor '" + k + "'");
    }
    {
        std::string dir = copy_fixture("qwen2", "hfdtype");
        edit_header(dir, [&](cJSON *h) {
            cJSON_ReplaceItemInObject(cJSON_GetObjectItem(h, k.c_str()), "dtype",
                                      cJSON_CreateString("F8_E4M3"));
        });
        expect_refused(dir, "model.safetensors", "tensor '" + k + "' has dtype F8_E4M3");
    }
    {
        std::string dir = copy_fixture("qwen2", "hfextra");
        edit_header(dir, [&](cJSON *h) {
            // an empty tensor at the end of the data, so the header stays well formed
            double end = 0;
            for (cJSON *e = h->child; e; e = e->next)
                if (cJSON *of = cJSON_GetObjectItem(e, "data_offsets"))
                    end = std::max(end, cJSON_GetArrayItem(of, 1)->valuedouble);
            cJSON *t = cJSON_Duplicate(cJSON_GetObjectItem(h, up.c_str()), 1);
            cJSON_ReplaceItemInArray(cJSON_GetObjectItem(t, "shape"), 0, cJSON_CreateNumber(0));
            cJSON *of = cJSON_GetObjectItem(t, "data_offsets");
            cJSON_ReplaceItemInArray(of, 0, cJSON_CreateNumber(end));
            cJSON_ReplaceItemInArray(of, 1, cJSON_CreateNumber(end));
            cJSON_AddItemToObject(h, "model.layers.7.mlp.up_proj.weight", t);
        });
        expect_refused(dir, "model.safetensors",
                       "unexpected tensor 'model.layers.7.mlp.up_proj.weight'");
    }
    {
        // the model's shapes follow config.json: a narrower hidden size
        std::string dir = copy_fixture("qwen2", "hfcfgshape");
        edit_config(dir, [](cJSON *c) {
            cJSON_ReplaceItemInObject(c, "intermediate_size", cJSON_CreateNumber(48));
        });
        expect_refused(dir, "model.safetensors", "config.json implies");
    }
    {
        // mixtures whose MoE layers are not every Nth from layer 0 (model.moe_layer_freq),
        // or that drop a Mixtral's sliding window, are refused by key
        std::string dir = copy_fixture("qwen2moe", "hfmoeonly");
        edit_config(dir, [](cJSON *c) {
            cJSON *only = cJSON_CreateArray();
            cJSON_AddItemToArray(only, cJSON_CreateNumber(0));
            cJSON_ReplaceItemInObject(c, "mlp_only_layers", only);
        });
        expect_refused(dir, "config.json", "not every Nth from layer 0");
        dir = copy_fixture("qwen2moe", "hfmoestep");
        edit_config(dir, [](cJSON *c) {
            cJSON_ReplaceItemInObject(c, "decoder_sparse_step", cJSON_CreateNumber(2));
        });
        expect_refused(dir, "config.json", "decoder_sparse_step 2");
        dir = copy_fixture("mixtral", "hfmoewindow");
        edit_config(dir, [](cJSON *c) {
            cJSON_ReplaceItemInObject(c, "sliding_window", cJSON_CreateNumber(16));
        });
        expect_refused(dir, "config.json", "sliding-window attention");
        dir = copy_fixture("mixtral", "hfmoek");
        edit_config(dir, [](cJSON *c) {
            cJSON_ReplaceItemInObject(c, "num_experts_per_tok", cJSON_CreateNumber(5));
        });
        expect_refused(dir, "config.json", "no more than them per token");
    }
    {
        // Qwen3: biases on its attention are not modelled; a head_dim that the tensors do
        // not have is refused at the first tensor it shapes
        std::string dir = copy_fixture("qwen3", "hfq3bias");
        edit_config(dir, [](cJSON *c) {
            cJSON_ReplaceItemInObject(c, "attention_bias", cJSON_CreateBool(1));
        });
        expect_refused(dir, "config.json", "attention_bias true");
        dir = copy_fixture("qwen3moe", "hfq3hd");
        edit_config(
            dir, [](cJSON *c) { cJSON_ReplaceItemInObject(c, "head_dim", cJSON_CreateNumber(8)); });
        expect_refused(dir, "model.safetensors",
                       "tensor 'model.layers.0.self_attn.k_norm.weight' has shape [16], "
                       "config.json implies [8]");
    }
    {
        // a shard that the index names but that is not there
        std::string dir = copy_fixture("llama", "hfshard");
        std::filesystem::remove(dir + "/model-00003-of-00004.safetensors");
        expect_refused(dir, "model-00003-of-00004.safetensors", "cannot open");
    }
}

// `tripod import SRC --format hf --output OUT`: its exit code and what it printed.
int import_printing(const std::string &src, const std::string &out, std::string *printed) {
    std::string log = out + ".log";
    fflush(stdout);
    int saved = dup(1), fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    close(fd);
    std::vector<std::string> args = {"import", src, "--format", "hf", "--output", out};
    std::vector<char *> argv;
    for (auto &a : args)
        argv.push_back(&a[0]);
    int rc = tpd_cli_ckpt((int)argv.size(), argv.data());
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    *printed = ckt::slurp(log);
    return rc;
}

// The model section that import prints, pasted into a config, loads the import: the printed
// text and the stored value are one double, also where cJSON's 15 digits would not be.
TEST(HfImport, PrintedModelSectionLoadsBack) {
    const struct {
        const char *fixture, *key, *value;
    } cases[] = {
        {"llama", "rms_norm_eps", "1e-05"},
        {"llama", "rms_norm_eps", "1.0000000000000003e-05"}, // 15 digits read back 1e-05
        {"llama", "rope_theta", "50000.000000000007"},
        {"gpt2", "layer_norm_epsilon", "3.0000000000000004e-05"},
        // the QK norm, heads of 16 at hidden 32 (kv_channels) and the mixtures' keys
        {"qwen3", "rms_norm_eps", "1e-06"},
        {"qwen3moe", "rms_norm_eps", "1e-06"},
        {"qwen2moe", "rms_norm_eps", "1e-06"},
        {"mixtral", "rms_norm_eps", "1e-05"},
    };
    for (const auto &c : cases) {
        std::string dir = copy_fixture(c.fixture, "hfprint");
        std::string text = ckt::slurp(dir + "/config.json");
        size_t at = text.find(std::string("\"") + c.key + "\": ");
        ASSERT_NE(at, std::string::npos) << c.key;
        at += strlen(c.key) + 4;
        text.replace(at, text.find_first_of(",\n", at) - at, c.value);
        ckt::spit(dir + "/config.json", text);
        std::string out = ckt::fresh_dir(dir + "_ck"), printed;
        ASSERT_EQ(import_printing(dir, out, &printed), 0) << tpd_last_error();
        size_t sec = printed.find("\nmodel:\n");
        ASSERT_NE(sec, std::string::npos) << printed;
        std::string yaml = printed.substr(sec + 1) +
                           "  seq_length: 16\ntraining:\n  micro_batch_size: 1\n"
                           "  global_batch_size: 1\n  train_iters: 1\n";
        ckt::spit(out + ".yaml", yaml);
        tpd_config cfg;
        ASSERT_EQ(tpd_config_load((out + ".yaml").c_str(), 0, nullptr, &cfg), TPD_OK)
            << tpd_last_error() << "\n"
            << yaml;
        tpd_ckpt_info info;
        ASSERT_EQ(tpd_ckpt_open(out.c_str(), &info), TPD_OK) << tpd_last_error();
        EXPECT_EQ(tpd_ckpt_check_model(&info, &cfg), TPD_OK)
            << c.key << " " << c.value << ": " << tpd_last_error() << "\n"
            << yaml;
        tpd_ckpt_close(&info);
    }
}

// Writes the NaN of the tensor's dtype (4 or 2 bytes) at element i of tensor `name` of a
// single-file folder.
void poison(const std::string &dir, const std::string &name, int i) {
    edit_file(dir, [&](cJSON *h, std::string &data) {
        cJSON *e = cJSON_GetObjectItem(h, name.c_str());
        ASSERT_NE(e, nullptr) << name;
        std::string dt = cJSON_GetObjectItem(e, "dtype")->valuestring;
        size_t at =
            (size_t)cJSON_GetArrayItem(cJSON_GetObjectItem(e, "data_offsets"), 0)->valuedouble;
        if (dt == "F32") {
            float nan = NAN;
            memcpy(&data[at + 4 * i], &nan, 4);
        } else {
            ASSERT_TRUE(dt == "F16" || dt == "BF16") << dt;
            uint16_t nan = dt == "F16" ? 0x7e00 : 0x7fc0;
            memcpy(&data[at + 2 * i], &nan, 2);
        }
    });
}

TEST(HfImport, NonFiniteWeightsAreRefusedByTensorAndIndex) {
    // a Conv1D weight (transposed on import) and a plain one: the index is in file order
    for (const char *name : {"transformer.h.1.attn.c_attn.weight", "transformer.wpe.weight"}) {
        std::string dir = copy_fixture("gpt2", "hfnan");
        poison(dir, name, 37);
        expect_refused(dir, "model.safetensors",
                       std::string("tensor '") + name +
                           "' has a non-finite value (nan) at element 37");
    }
}

// An llm.c model file of header h (magic and version filled in) with the bytes it implies.
std::string llmc_file(const std::string &path, std::vector<int32_t> h) {
    std::vector<int32_t> hdr(256, 0);
    hdr[0] = TPD_LLMC_MODEL_MAGIC;
    hdr[1] = 3;
    for (size_t i = 0; i < h.size(); i++)
        hdr[2 + i] = h[i];
    // in double: the bad headers' products overflow any integer type
    double T = hdr[2], L = hdr[4], C = hdr[6], Vp = hdr[7];
    double floats = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    std::string data((const char *)hdr.data(), 1024);
    if (floats > 0 && floats < (1 << 20)) data += std::string((size_t)floats * 4, '\0');
    ckt::spit(path, data);
    return path;
}

TEST(LlmcImport, EveryHeaderFieldIsBounded) {
    std::string dir = ckt::fresh_dir(tiny::temp_prefix("llmchdr"));
    std::filesystem::create_directories(dir);
    {
        tpd_config cfg;
        float *w[TPD_P_COUNT] = {};
        std::string ok = llmc_file(dir + "/ok.bin", {4, 11, 1, 2, 8, 16});
        ASSERT_EQ(tpd_ckpt_import_llmc(ok.c_str(), &cfg, w), TPD_OK) << tpd_last_error();
        EXPECT_EQ(cfg.model.make_vocab_size_divisible_by, 16);
        tpd_ckpt_free_weights(w);
    }
    {
        // a NaN in wpe (after wte's 16 x 8 padded rows): refused by tensor and index
        std::string f = llmc_file(dir + "/nan.bin", {4, 11, 1, 2, 8, 16});
        std::string data = ckt::slurp(f);
        float nan = NAN;
        memcpy(&data[1024 + 4 * (16 * 8 + 5)], &nan, 4);
        ckt::spit(f, data);
        tpd_config cfg;
        float *w[TPD_P_COUNT] = {};
        EXPECT_EQ(tpd_ckpt_import_llmc(f.c_str(), &cfg, w), TPD_ERR_INVALID);
        std::string err = tpd_last_error();
        EXPECT_NE(err.find(f + ": tensor 'wpe' has a non-finite value (nan) at element 5"),
                  std::string::npos)
            << err;
    }
    const struct {
        std::vector<int32_t> h; // maxT, V, L, NH, C, Vp
        const char *field;
    } cases[] = {
        {{4, 11, 1, 2, 8, 1 << 30}, "padded_vocab_size"}, // the power-of-two loop overflowed
        {{4, 11, 1, 2, 8, 10}, "padded_vocab_size"},
        {{4, 11, 1, 2, 8, INT32_MAX}, "padded_vocab_size"},
        {{4, 100000, 1, 2, 8, 100000 + 65537}, "padded_vocab_size"},
        {{0, 11, 1, 2, 8, 16}, "max_seq_len"},
        {{-1, 11, 1, 2, 8, 16}, "max_seq_len"},
        {{1 << 30, 11, 1, 2, 8, 16}, "max_seq_len"},
        {{4, INT32_MAX, 1, 2, 8, INT32_MAX}, "vocab_size"},
        {{4, 11, 0, 2, 8, 16}, "num_layers"},
        {{4, 11, 1 << 20, 2, 8, 16}, "num_layers"},
        {{4, 11, 1, 0, 8, 16}, "num_heads"},
        {{4, 11, 1, 2, 1 << 30, 16}, "channels"},
        {{4, 11, 1, 3, 8, 16}, "multiple of num_heads"},
    };
    for (const auto &c : cases) {
        std::string f = llmc_file(dir + "/bad.bin", c.h);
        tpd_config cfg;
        float *w[TPD_P_COUNT] = {};
        EXPECT_EQ(tpd_ckpt_import_llmc(f.c_str(), &cfg, w), TPD_ERR_INVALID) << c.field;
        std::string err = tpd_last_error();
        EXPECT_NE(err.find(f), std::string::npos) << err;
        EXPECT_NE(err.find(c.field), std::string::npos) << err;
        for (float *p : w)
            EXPECT_EQ(p, nullptr);
    }
}

} // namespace
