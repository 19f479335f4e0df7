// Hugging Face tokenizer.json (engine/data/tokenizer_hf.c) against `tokenizers`.
//
// hf_tokenizer/{llama3,qwen2,gpt2} are tiny byte-level BPEs trained with `tokenizers`
// (tools/hf_tokenizer_fixture.py) under Llama 3's and Qwen2's Split regexes and GPT-2's
// ByteLevel regex; golden.jsonl holds texts (hex) and the ids `tokenizers` gives them,
// without and with special tokens (Llama 3's BOS). llama3 has merges as pairs, the others
// as strings. llama3/pre_tokenizers.jsonl holds the same model's ids under every Split
// behavior and ByteLevel's add_prefix_space.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include <cjson/cJSON.h>

#include "engine/data/data.h"
#include "engine/data/tokenizer.h"
}

#include "common/tiny.h"
#include "engine/data/bpe_test_util.h"

namespace {

const std::string kDir = TPD_HF_TOKENIZER_DIR;

using tiny::slurp;

std::string unhex(const std::string &h) {
    std::string s;
    for (size_t i = 0; i + 1 < h.size(); i += 2)
        s += (char)std::stoi(h.substr(i, 2), nullptr, 16);
    return s;
}

std::vector<int32_t> id_list(const cJSON *arr) {
    std::vector<int32_t> v;
    const cJSON *id;
    cJSON_ArrayForEach(id, arr) v.push_back(id->valueint);
    return v;
}

struct Hf : BpeHandle {
    explicit Hf(const std::string &path) {
        EXPECT_EQ(tpd_bpe_load_hf(path.c_str(), &b), TPD_OK) << path;
    }
};

struct Golden {
    std::string text;
    std::vector<int32_t> ids, ids_special;
    bool utf8;
};

std::vector<Golden> golden(const std::string &name) {
    std::vector<Golden> out;
    std::ifstream f(kDir + "/" + name + "/golden.jsonl");
    std::string line;
    while (std::getline(f, line)) {
        cJSON *o = cJSON_Parse(line.c_str());
        EXPECT_NE(o, nullptr) << line;
        if (!o) continue;
        out.push_back({unhex(cJSON_GetObjectItem(o, "hex")->valuestring),
                       id_list(cJSON_GetObjectItem(o, "ids")),
                       id_list(cJSON_GetObjectItem(o, "ids_special")),
                       cJSON_IsTrue(cJSON_GetObjectItem(o, "utf8")) != 0});
        cJSON_Delete(o);
    }
    return out;
}

// Every golden text encodes to exactly the golden ids, with and without special tokens,
// and decodes back to its bytes.
void check_golden(const std::string &name, const std::string &file) {
    Hf hf(file);
    ASSERT_NE(hf.b, nullptr);
    std::vector<Golden> cases = golden(name);
    int invalid = 0;
    for (const Golden &g : cases) {
        EXPECT_EQ(hf.encode(g.text), g.ids) << name << ": " << g.text;
        EXPECT_EQ(hf.encode(g.text, 1), g.ids_special) << name << ": " << g.text;
        EXPECT_EQ(hf.decode(g.ids), g.text) << name;
        size_t k = g.ids_special.size() - g.ids.size(); // the post-processor's ids
        std::vector<int32_t> pre(g.ids_special.begin(), g.ids_special.begin() + (long)k);
        EXPECT_EQ(hf.decode(g.ids_special), hf.decode(pre) + g.text) << name;
        invalid += !g.utf8;
    }
    EXPECT_GE(cases.size(), 25u);
    EXPECT_GE(invalid, 5);
}

TEST(TokenizerHf, Llama3MatchesTokenizers) {
    check_golden("llama3", kDir + "/llama3/tokenizer.json");
    Hf hf(kDir + "/llama3"); // the model folder works as well
    ASSERT_NE(hf.b, nullptr);
    EXPECT_EQ(tpd_bpe_vocab_size(hf.b), 403);
    ASSERT_GE(tpd_bpe_eod(hf.b), 0);
    EXPECT_STREQ(tpd_bpe_token(hf.b, tpd_bpe_eod(hf.b)), "<|end_of_text|>");
    std::vector<int32_t> bos = hf.encode("", 1);
    ASSERT_EQ(bos.size(), 1u);
    EXPECT_STREQ(tpd_bpe_token(hf.b, bos[0]), "<|begin_of_text|>");
}

TEST(TokenizerHf, Qwen2MatchesTokenizers) {
    check_golden("qwen2", kDir + "/qwen2/tokenizer.json");
    Hf hf(kDir + "/qwen2/tokenizer.json");
    ASSERT_NE(hf.b, nullptr);
    EXPECT_STREQ(tpd_bpe_token(hf.b, tpd_bpe_eod(hf.b)), "<|endoftext|>");
    EXPECT_TRUE(hf.encode("", 1).empty()); // no BOS
}

TEST(TokenizerHf, Gpt2MatchesTokenizers) {
    check_golden("gpt2", kDir + "/gpt2/tokenizer.json");
}

// tokenizer.json rewritten by f, saved under a temporary name; returns its path.
template <class F> std::string rewrite(const std::string &from, const std::string &name, F f) {
    cJSON *root = cJSON_Parse(slurp(from).c_str());
    EXPECT_NE(root, nullptr);
    f(root);
    char *text = cJSON_PrintUnformatted(root);
    std::string dir = tiny::temp_prefix(name.c_str());
    std::filesystem::create_directories(dir);
    std::string path = dir + "/tokenizer.json";
    std::ofstream(path) << text;
    free(text);
    cJSON_Delete(root);
    return path;
}

cJSON *model_of(cJSON *root) {
    return cJSON_GetObjectItem(root, "model");
}

// Merges as "a b" strings and as ["a", "b"] pairs read the same: llama3 (pairs) with its
// merges rewritten as strings, qwen2 (strings) as pairs, still match the goldens.
TEST(TokenizerHf, BothMergeFormsRead) {
    std::string llama = rewrite(kDir + "/llama3/tokenizer.json", "hf_llama_str", [](cJSON *r) {
        cJSON *merges = cJSON_GetObjectItem(model_of(r), "merges"), *strs = cJSON_CreateArray();
        const cJSON *m;
        cJSON_ArrayForEach(m, merges) {
            ASSERT_TRUE(cJSON_IsArray(m));
            std::string s = std::string(cJSON_GetArrayItem(m, 0)->valuestring) + " " +
                            cJSON_GetArrayItem(m, 1)->valuestring;
            cJSON_AddItemToArray(strs, cJSON_CreateString(s.c_str()));
        }
        cJSON_ReplaceItemInObject(model_of(r), "merges", strs);
    });
    check_golden("llama3", llama);
    std::string qwen = rewrite(kDir + "/qwen2/tokenizer.json", "hf_qwen_pairs", [](cJSON *r) {
        cJSON *merges = cJSON_GetObjectItem(model_of(r), "merges"), *pairs = cJSON_CreateArray();
        const cJSON *m;
        cJSON_ArrayForEach(m, merges) {
            ASSERT_TRUE(cJSON_IsString(m));
            std::string s = m->valuestring;
            size_t sp = s.find(' ');
            const char *two[2] = {nullptr, nullptr};
            std::string a = s.substr(0, sp), b = s.substr(sp + 1);
            two[0] = a.c_str();
            two[1] = b.c_str();
            cJSON_AddItemToArray(pairs, cJSON_CreateStringArray(two, 2));
        }
        cJSON_ReplaceItemInObject(model_of(r), "merges", pairs);
    });
    check_golden("qwen2", qwen);
}

// Llama 3's ignore_merges: "zzzz" is a token no merge makes; a pre-token spelled so is one
// token with the flag (the golden), single bytes without it.
TEST(TokenizerHf, IgnoreMergesEmitsVocabularyPretokensWhole) {
    Hf with(kDir + "/llama3/tokenizer.json");
    ASSERT_NE(with.b, nullptr);
    std::vector<int32_t> one = with.encode("zzzz");
    ASSERT_EQ(one.size(), 1u);
    EXPECT_STREQ(tpd_bpe_token(with.b, one[0]), "zzzz");
    std::string path = rewrite(kDir + "/llama3/tokenizer.json", "hf_no_ignore", [](cJSON *r) {
        cJSON_ReplaceItemInObject(model_of(r), "ignore_merges", cJSON_CreateFalse());
    });
    Hf without(path);
    ASSERT_NE(without.b, nullptr);
    std::vector<int32_t> ids = without.encode("zzzz");
    EXPECT_EQ(ids.size(), 4u);
    EXPECT_EQ(without.decode(ids), "zzzz");
}

// The Llama 3 model under every Split behavior (inverted or not), a String pattern, and
// ByteLevel with add_prefix_space: the ids `tokenizers` gives.
TEST(TokenizerHf, PreTokenizersMatchTokenizers) {
    std::ifstream f(kDir + "/llama3/pre_tokenizers.jsonl");
    std::string line;
    int variants = 0;
    while (std::getline(f, line)) {
        cJSON *o = cJSON_Parse(line.c_str());
        ASSERT_NE(o, nullptr);
        cJSON *pre = cJSON_DetachItemFromObject(o, "pre_tokenizer");
        std::string path = rewrite(kDir + "/llama3/tokenizer.json", "hf_pre", [&](cJSON *r) {
            cJSON_ReplaceItemInObject(r, "pre_tokenizer", cJSON_Duplicate(pre, 1));
        });
        char *spec = cJSON_PrintUnformatted(pre);
        Hf hf(path);
        ASSERT_NE(hf.b, nullptr) << spec;
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(o, "cases")) {
            std::string text = unhex(cJSON_GetObjectItem(c, "hex")->valuestring);
            EXPECT_EQ(hf.encode(text), id_list(cJSON_GetObjectItem(c, "ids")))
                << spec << ": '" << text << "'";
        }
        free(spec);
        cJSON_Delete(pre);
        cJSON_Delete(o);
        variants++;
    }
    EXPECT_GE(variants, 13);
}

TEST(TokenizerHf, EveryByteStringRoundTrips) {
    for (const char *name : {"llama3", "qwen2", "gpt2"}) {
        Hf hf(kDir + "/" + name + "/tokenizer.json");
        ASSERT_NE(hf.b, nullptr);
        hf.expect_round_trips({"the ", "'S", " 4242", "é", "東", "\xff", "\xc3", "\x80", "  ", "\n",
                               "\r\n", "!?", "\xe6\x9d", std::string(1, '\0'), "<|end_of_text|>",
                               "<|endoftext|>", "😀", "\xc2\x85"},
                              name);
    }
}

// Loading path fails; returns the error printed.
std::string load_error(const std::string &path, tpd_status want = TPD_ERR_UNSUPPORTED) {
    tpd_bpe *b = nullptr;
    testing::internal::CaptureStderr();
    tpd_status st = tpd_bpe_load_hf(path.c_str(), &b);
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(st, want) << err;
    EXPECT_EQ(b, nullptr);
    tpd_bpe_destroy(b);
    return err;
}

void expect_has(const std::string &err, const std::string &part) {
    EXPECT_NE(err.find(part), std::string::npos) << "'" << part << "' not in: " << err;
}

TEST(TokenizerHf, UnsupportedTokenizersAreRefusedNamingFileAndKey) {
    const std::string src = kDir + "/llama3/tokenizer.json";
    std::string path = rewrite(src, "hf_unigram", [](cJSON *r) {
        cJSON_ReplaceItemInObject(model_of(r), "type", cJSON_CreateString("Unigram"));
    });
    std::string err = load_error(path);
    expect_has(err, path + ": model.type \"Unigram\" is not supported");
    expect_has(err, "supported: byte-level BPE");

    path = rewrite(src, "hf_no_merges",
                   [](cJSON *r) { cJSON_DeleteItemFromObject(model_of(r), "merges"); });
    err = load_error(path, TPD_ERR_FORMAT);
    expect_has(err, path + ": model.merges is missing");

    path = rewrite(src, "hf_metaspace", [](cJSON *r) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "type", "Metaspace");
        cJSON_ReplaceItemInObject(r, "pre_tokenizer", m);
    });
    expect_has(load_error(path), path + ": pre_tokenizer.type \"Metaspace\" is not supported");

    path = rewrite(src, "hf_nfc", [](cJSON *r) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "type", "NFC");
        cJSON_ReplaceItemInObject(r, "normalizer", m);
    });
    expect_has(load_error(path), path + ": normalizer.type \"NFC\"");

    path = rewrite(src, "hf_fallback", [](cJSON *r) {
        cJSON_ReplaceItemInObject(model_of(r), "byte_fallback", cJSON_CreateTrue());
    });
    expect_has(load_error(path), path + ": model.byte_fallback true is not supported");

    path = rewrite(src, "hf_lstrip", [](cJSON *r) {
        cJSON *a = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "added_tokens"), 1);
        cJSON_ReplaceItemInObject(a, "lstrip", cJSON_CreateTrue());
    });
    expect_has(load_error(path), path + ": added_tokens[1].lstrip true is not supported");

    path = rewrite(src, "hf_no_bytelevel", [](cJSON *r) {
        cJSON *seq = cJSON_GetObjectItem(r, "pre_tokenizer");
        cJSON_DeleteItemFromArray(cJSON_GetObjectItem(seq, "pretokenizers"), 1);
    });
    expect_has(load_error(path), path + ": a pre_tokenizer without ByteLevel");

    path = rewrite(src, "hf_behavior", [](cJSON *r) {
        cJSON *split = cJSON_GetArrayItem(
            cJSON_GetObjectItem(cJSON_GetObjectItem(r, "pre_tokenizer"), "pretokenizers"), 0);
        cJSON_ReplaceItemInObject(split, "behavior", cJSON_CreateString("Sideways"));
    });
    expect_has(load_error(path, TPD_ERR_FORMAT),
               path + ": pre_tokenizer.pretokenizers[0].behavior: must be one of");

    path = rewrite(src, "hf_bad_merge", [](cJSON *r) {
        const char *two[2] = {"q", "nope"};
        cJSON_AddItemToArray(cJSON_GetObjectItem(model_of(r), "merges"),
                             cJSON_CreateStringArray(two, 2));
    });
    expect_has(load_error(path, TPD_ERR_INVALID),
               "merge 'q nope': 'nope' is not in the vocabulary");
}

// hf_tokenizer/missing_bytes (tools/hf_tokenizer_missing_bytes.py): a vocabulary without
// the tokens of bytes 0x04, 0x7f, 'q' and 0xa9 loads (with a warning naming them), and
// texts holding them encode to the ids `tokenizers` gives: the bytes are dropped before
// merging ("aqb" is the one token "ab"). The ids decode to the text without them.
TEST(TokenizerHf, MissingByteTokensAreDroppedAsTokenizersDoes) {
    const std::string file = kDir + "/missing_bytes/tokenizer.json";
    tpd_bpe *b = nullptr;
    testing::internal::CaptureStderr();
    ASSERT_EQ(tpd_bpe_load_hf(file.c_str(), &b), TPD_OK) << tpd_last_error();
    std::string warn = testing::internal::GetCapturedStderr();
    expect_has(warn, file + ": 4 of the 256 bytes have no token in model.vocab (0x04 0x71 "
                            "0x7f 0xa9)");
    BpeHandle hf;
    hf.b = b;
    std::ifstream f(kDir + "/missing_bytes/golden.jsonl");
    std::string line;
    int cases = 0, dropped = 0;
    while (std::getline(f, line)) {
        cJSON *o = cJSON_Parse(line.c_str());
        ASSERT_NE(o, nullptr) << line;
        std::string text = unhex(cJSON_GetObjectItem(o, "hex")->valuestring);
        std::string kept = unhex(cJSON_GetObjectItem(o, "decoded_hex")->valuestring);
        std::vector<int32_t> ids = id_list(cJSON_GetObjectItem(o, "ids"));
        cJSON_Delete(o);
        EXPECT_EQ(hf.encode(text), ids) << "text hex " << line;
        EXPECT_EQ(hf.decode(ids), kept) << "text hex " << line;
        cases++;
        dropped += kept.size() < text.size();
    }
    EXPECT_GE(cases, 12);
    EXPECT_GE(dropped, 8);
    // with an unk_token, `tokenizers` would emit it for those bytes: refused
    std::string path = rewrite(file, "hf_missing_unk", [](cJSON *r) {
        cJSON_ReplaceItemInObject(model_of(r), "unk_token", cJSON_CreateString("<|endoftext|>"));
    });
    expect_has(load_error(path), path + ": model.unk_token \"<|endoftext|>\" with 4 of the 256 "
                                        "bytes missing from model.vocab");
}

// SentencePiece's tokenizer.model, given as a file, found in a folder, or under another
// name: refused, saying SentencePiece is not supported.
TEST(TokenizerHf, SentencePieceIsRefused) {
    std::string dir = tiny::temp_prefix("hf_sp");
    std::filesystem::create_directories(dir);
    std::string model = dir + "/tokenizer.model";
    std::ofstream(model, std::ios::binary) << std::string("\x0a\x0b\x0a\x05<unk>\x15\0\0\0\0", 14);
    expect_has(load_error(model),
               model + ": a SentencePiece model: SentencePiece is not supported");
    expect_has(load_error(dir), model + ": a SentencePiece model: SentencePiece is not supported");
    std::string renamed = dir + "/tokenizer.json";
    std::filesystem::copy_file(model, renamed);
    expect_has(load_error(renamed), renamed + ": not a tokenizer.json");
    expect_has(load_error(renamed), "SentencePiece is not supported");
    expect_has(load_error("/nonexistent/tokenizer.json", TPD_ERR_IO),
               "/nonexistent/tokenizer.json: cannot read");
}

// data prepare with a tokenizer.json: each document is BOS + its ids, then EOD when asked.
TEST(TokenizerHf, DataPrepareWritesBosAndEod) {
    Hf hf(kDir + "/llama3/tokenizer.json");
    ASSERT_NE(hf.b, nullptr);
    std::string dir = tiny::temp_prefix("hf_prep");
    std::vector<std::string> texts = {"The quick brown fox.\n", "東京は日本の首都です。 😀\n"};
    std::ofstream(dir + "_in.txt") << texts[0] << "\n" << texts[1];
    std::string in = dir + "_in.txt";
    const char *inputs[] = {in.c_str()};
    for (int eod : {0, 1}) {
        tpd_prepare_opts po = {TPD_RECORDS_BLANK, hf.b, "text", !eod};
        std::string out = dir + "_ds" + std::to_string(eod);
        uint64_t docs = 0, tokens = 0;
        ASSERT_EQ(tpd_data_prepare(inputs, 1, &po, out.c_str(), &docs, &tokens), TPD_OK);
        EXPECT_EQ(docs, 2u);
        std::vector<int32_t> want;
        for (const std::string &t : texts) {
            std::vector<int32_t> ids = hf.encode(t, 1);
            EXPECT_STREQ(tpd_bpe_token(hf.b, ids[0]), "<|begin_of_text|>");
            want.insert(want.end(), ids.begin(), ids.end());
            if (eod) want.push_back(tpd_bpe_eod(hf.b));
        }
        tpd_dataset *ds = nullptr;
        ASSERT_EQ(tpd_dataset_open(out.c_str(), tpd_bpe_vocab_size(hf.b), &ds), TPD_OK);
        std::vector<int32_t> got(tpd_dataset_num_tokens(ds));
        ASSERT_EQ(tpd_dataset_read(ds, 0, got.size(), got.data()), TPD_OK);
        EXPECT_EQ(got, want);
        EXPECT_EQ(tokens, want.size());
        tpd_dataset_close(ds);
    }
}

// A tokenizer_config.json beside tokenizer.json names the end-of-document token, as
// Megatron's HuggingFaceTokenizer takes eos_token from it.
TEST(TokenizerHf, TokenizerConfigNamesTheEod) {
    std::string path = rewrite(kDir + "/llama3/tokenizer.json", "hf_cfg", [](cJSON *) {});
    std::string cfg = std::filesystem::path(path).parent_path().string() + "/tokenizer_config.json";
    std::ofstream(cfg) << R"({"eos_token": {"content": "<|begin_of_text|>"}})";
    {
        Hf hf(path);
        ASSERT_NE(hf.b, nullptr);
        EXPECT_STREQ(tpd_bpe_token(hf.b, tpd_bpe_eod(hf.b)), "<|begin_of_text|>");
    }
    std::ofstream(cfg) << R"({"eos_token": "<|no_such|>"})";
    expect_has(load_error(path, TPD_ERR_FORMAT), cfg + ": eos_token '<|no_such|>' is not a token");
}

} // namespace
