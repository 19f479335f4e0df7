// safetensors and Hugging Face folders: fp16 widening against a plain reference, header
// validation, and every refusal of a bad or unsupported folder naming the file and the
// tensor or key (each made by editing a copy of a fixture of hf/).
#include <gtest/gtest.h>

#include <cjson/cJSON.h>
#include <cmath>
#include <filesystem>
#include <string>

#include "ckpt_test_util.h"

extern "C" {
#include "base/bf16.h"
#include "engine/checkpoint/interchange.h"
#include "engine/checkpoint/safetensors.h"
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

// Applies `edit` to the header of a single-file folder's model.safetensors.
template <class F> void edit_header(const std::string &dir, F edit) {
    std::string f = ckt::slurp(dir + "/model.safetensors");
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)(uint8_t)f[i] << (8 * i);
    cJSON *h = cJSON_ParseWithLength(f.data() + 8, n);
    ASSERT_NE(h, nullptr);
    edit(h);
    char *text = cJSON_PrintUnformatted(h);
    std::string hdr = text;
    free(text);
    cJSON_Delete(h);
    std::string len(8, '\0');
    for (int i = 0; i < 8; i++)
        len[i] = (char)((hdr.size() >> (8 * i)) & 0xff);
    ckt::spit(dir + "/model.safetensors", len + hdr + f.substr(8 + n));
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
    for (const char *name : {"llama", "qwen2", "gpt2"}) {
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
        {"head_dim",
         [](cJSON *c) { cJSON_ReplaceItemInObject(c, "head_dim", cJSON_CreateNumber(32)); }},
        {"attention_bias true with mlp_bias false",
         [](cJSON *c) { cJSON_ReplaceItemInObject(c, "attention_bias", cJSON_CreateTrue()); }},
    };
    for (const Case &c : cases) {
        std::string dir = copy_fixture("llama", "hfbadcfg");
        edit_config(dir, c.edit);
        expect_refused(dir, "config.json", c.what);
    }
}

TEST(HfImport, TensorProblemsNameTheFileAndTensor) {
    const std::string up = "model.layers.1.mlp.up_proj.weight";
    const std::string k = "model.layers.0.self_attn.k_proj.weight";
    {
        std::string dir = copy_fixture("qwen2", "hfmissing");
        edit_header(dir, [&](cJSON *h) { cJSON_DeleteItemFromObject(h, up.c_str()); });
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
            cJSON_AddItemToObject(h, "model.layers.7.mlp.up_proj.weight",
                                  cJSON_Duplicate(cJSON_GetObjectItem(h, up.c_str()), 1));
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
        // a shard that the index names but that is not there
        std::string dir = copy_fixture("llama", "hfshard");
        std::filesystem::remove(dir + "/model-00003-of-00004.safetensors");
        expect_refused(dir, "model-00003-of-00004.safetensors", "cannot open");
    }
}

} // namespace
