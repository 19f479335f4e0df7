// GPT-2 byte-level BPE (engine/data/tokenizer.c).
//
// bpe/vocab.json and bpe/merges.txt are a small byte-level BPE (800 tokens) trained with
// Hugging Face `tokenizers` (ByteLevelBPETokenizer, add_prefix_space=False) on fortune
// text; bpe/golden.json holds texts and the ids that `tokenizers` gives them. Our encoder
// must give the same ids, and decode them back to the text.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
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

const std::string kDir = TPD_BPE_DIR;

using tiny::slurp;

struct Bpe : BpeHandle {
    Bpe() {
        EXPECT_EQ(tpd_bpe_load((kDir + "/vocab.json").c_str(), (kDir + "/merges.txt").c_str(), &b),
                  TPD_OK);
    }
};

TEST(Tokenizer, MatchesHuggingFaceTokenizers) {
    Bpe bpe;
    ASSERT_NE(bpe.b, nullptr);
    EXPECT_EQ(tpd_bpe_vocab_size(bpe.b), 800);
    EXPECT_EQ(tpd_bpe_eod(bpe.b), 0);
    std::string text = slurp(kDir + "/golden.json");
    cJSON *root = cJSON_Parse(text.c_str());
    ASSERT_TRUE(cJSON_IsArray(root));
    int cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, root) {
        std::string t = cJSON_GetObjectItem(c, "text")->valuestring;
        std::vector<int32_t> want;
        const cJSON *id;
        cJSON_ArrayForEach(id, cJSON_GetObjectItem(c, "ids")) want.push_back(id->valueint);
        EXPECT_EQ(bpe.encode(t), want) << t;
        EXPECT_EQ(bpe.decode(want), t);
        cases++;
    }
    cJSON_Delete(root);
    EXPECT_GE(cases, 8);
}

TEST(Tokenizer, EveryByteStringRoundTrips) {
    Bpe bpe;
    ASSERT_NE(bpe.b, nullptr);
    ASSERT_EQ(tpd_bpe_vocab_size(bpe.b), 800);
    // "\0" as a C string is an empty piece, as it always was here
    bpe.expect_round_trips({"the ", "'s", " 42", "é", "東", "\xff", "\xc3", "\x80", "  ", "\n",
                            "\t", "!?", "\xe6\x9d", "\0", "ing"},
                           "gpt-2 files");
}

std::string load_error(const std::string &vocab_text, const std::string &merges_text) {
    std::string dir = tiny::temp_prefix("bpe");
    std::ofstream(dir + "_vocab.json") << vocab_text;
    std::ofstream(dir + "_merges.txt") << merges_text;
    tpd_bpe *b = nullptr;
    testing::internal::CaptureStderr();
    tpd_status st = tpd_bpe_load((dir + "_vocab.json").c_str(), (dir + "_merges.txt").c_str(), &b);
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(st, TPD_OK);
    EXPECT_EQ(b, nullptr);
    return err;
}

TEST(Tokenizer, BadFilesNameTheFileAndLine) {
    std::string vocab = slurp(kDir + "/vocab.json"), merges = slurp(kDir + "/merges.txt");
    EXPECT_NE(load_error("[1, 2]", merges).find("_vocab.json: not a JSON object"),
              std::string::npos);
    EXPECT_NE(load_error("{\"a\": -1}", merges).find("token 'a': id must be an integer"),
              std::string::npos);
    EXPECT_NE(load_error("{\"a\": 0}", merges).find("has no token"), std::string::npos);
    std::string err = load_error(vocab, "#version: 0.2\nĠ t\nqq zz\n");
    EXPECT_NE(err.find("_merges.txt:3: merge 'qq zz': 'qq' is not in the vocabulary"),
              std::string::npos)
        << err;
    err = load_error(vocab, "#version: 0.2\nĠt\n");
    EXPECT_NE(err.find("_merges.txt:2: 'Ġt' is not a merge"), std::string::npos) << err;
    tpd_bpe *b = nullptr;
    testing::internal::CaptureStderr();
    EXPECT_EQ(tpd_bpe_load("/nonexistent/vocab.json", (kDir + "/merges.txt").c_str(), &b),
              TPD_ERR_IO);
    EXPECT_NE(testing::internal::GetCapturedStderr().find(
                  "/nonexistent/vocab.json: cannot read: No such file"),
              std::string::npos);
}

// data prepare with the BPE files: every document is its text's ids and <|endoftext|>.
TEST(Tokenizer, DataPrepareWritesBpeDocuments) {
    Bpe bpe;
    ASSERT_NE(bpe.b, nullptr);
    std::string dir = tiny::temp_prefix("bpe_prep");
    std::vector<std::string> texts = {"The quick brown fox.\n", "Ein Käse, bitte! 42 times.\n"};
    std::vector<std::string> files;
    for (size_t i = 0; i < texts.size(); i++) {
        files.push_back(dir + "_" + std::to_string(i) + ".txt");
        std::ofstream(files.back()) << texts[i];
    }
    std::vector<const char *> in = {files[0].c_str(), files[1].c_str()};
    uint64_t docs = 0, tokens = 0;
    tpd_prepare_opts po = TPD_PREPARE_OPTS_INIT;
    po.bpe = bpe.b;
    ASSERT_EQ(tpd_data_prepare(in.data(), 2, &po, (dir + "_ds").c_str(), &docs, &tokens), TPD_OK);
    EXPECT_EQ(docs, 2u);
    tpd_dataset *ds = nullptr;
    ASSERT_EQ(tpd_dataset_open((dir + "_ds").c_str(), 800, &ds), TPD_OK);
    ASSERT_EQ(tpd_dataset_num_documents(ds), 2u);
    std::vector<int32_t> want;
    for (const std::string &t : texts) {
        std::vector<int32_t> ids = bpe.encode(t);
        want.insert(want.end(), ids.begin(), ids.end());
        want.push_back(0); // <|endoftext|>
    }
    uint64_t total = tpd_dataset_num_tokens(ds);
    std::vector<int32_t> got(total);
    ASSERT_EQ(tpd_dataset_read(ds, 0, total, got.data()), TPD_OK);
    EXPECT_EQ(got, want);
    EXPECT_EQ(bpe.decode(got), texts[0] + "<|endoftext|>" + texts[1] + "<|endoftext|>");
    EXPECT_EQ(total, tokens);
    tpd_dataset_close(ds);
}

// Records are encoded on several threads; the data set is the same as encoding them one
// after another.
TEST(Tokenizer, DataPrepareInParallelMatchesSequential) {
    Bpe bpe;
    ASSERT_NE(bpe.b, nullptr);
    std::string dir = tiny::temp_prefix("bpe_par");
    std::string text;
    std::vector<int32_t> want;
    std::mt19937 rng(11);
    const char *words[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "über ", "42 ", "!? "};
    for (int r = 0; r < 300; r++) {
        std::string rec;
        for (int w = 0, n = 1 + (int)(rng() % 20); w < n; w++)
            rec += words[rng() % 8];
        rec += "\n";
        text += rec + "\n"; // blank line: next record
        std::vector<int32_t> ids = bpe.encode(rec);
        want.insert(want.end(), ids.begin(), ids.end());
        want.push_back(0);
    }
    std::ofstream(dir + ".txt") << text;
    const char *in[] = {nullptr};
    std::string input = dir + ".txt";
    in[0] = input.c_str();
    int threads = omp_get_max_threads();
    omp_set_num_threads(3);
    uint64_t docs = 0, tokens = 0;
    tpd_prepare_opts po = {TPD_RECORDS_BLANK, bpe.b, "text"};
    tpd_status st = tpd_data_prepare(in, 1, &po, (dir + "_ds").c_str(), &docs, &tokens);
    omp_set_num_threads(threads);
    ASSERT_EQ(st, TPD_OK);
    EXPECT_EQ(docs, 300u);
    tpd_dataset *ds = nullptr;
    ASSERT_EQ(tpd_dataset_open((dir + "_ds").c_str(), 800, &ds), TPD_OK);
    std::vector<int32_t> got(tpd_dataset_num_tokens(ds));
    ASSERT_EQ(tpd_dataset_read(ds, 0, got.size(), got.data()), TPD_OK);
    EXPECT_EQ(got, want);
    tpd_dataset_close(ds);
}

} // namespace
