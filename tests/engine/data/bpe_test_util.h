// Shared by the tokenizer tests: a loaded tpd_bpe with encode/decode returning vectors and
// strings (each call checked). Subclasses load it from GPT-2's files or a tokenizer.json.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "engine/data/tokenizer.h"
}

struct BpeHandle {
    tpd_bpe *b = nullptr;
    BpeHandle() = default;
    BpeHandle(const BpeHandle &) = delete;
    BpeHandle &operator=(const BpeHandle &) = delete;
    ~BpeHandle() {
        tpd_bpe_destroy(b);
    }
    // special: add the post-processor's tokens (BOS); 0 goes through tpd_bpe_encode
    std::vector<int32_t> encode(const std::string &text, int special = 0) const {
        int32_t *ids = nullptr;
        size_t n = 0, cap = 0;
        tpd_status st =
            special ? tpd_bpe_encode_ex(b, text.data(), text.size(), special, &ids, &n, &cap)
                    : tpd_bpe_encode(b, text.data(), text.size(), &ids, &n, &cap);
        EXPECT_EQ(st, TPD_OK);
        std::vector<int32_t> v(ids, ids + n);
        free(ids);
        return v;
    }
    std::string decode(const std::vector<int32_t> &ids) const {
        char *text = nullptr;
        size_t len = 0;
        EXPECT_EQ(tpd_bpe_decode(b, ids.data(), ids.size(), &text, &len), TPD_OK);
        std::string s(text, len);
        free(text);
        return s;
    }
    // 300 strings of 0-39 pieces, a third of them single random bytes (valid UTF-8 or not),
    // from a fixed seed: every id is in the vocabulary and decoding gives the string back.
    void expect_round_trips(const std::vector<std::string> &pieces, const std::string &what) const {
        std::mt19937 rng(7);
        for (int k = 0; k < 300; k++) {
            std::string s;
            int n = (int)(rng() % 40);
            for (int i = 0; i < n; i++) {
                if (rng() % 3 == 0)
                    s += (char)(rng() % 256);
                else
                    s += pieces[rng() % pieces.size()];
            }
            std::vector<int32_t> ids = encode(s);
            for (int32_t id : ids)
                ASSERT_TRUE(id >= 0 && id < tpd_bpe_vocab_size(b)) << what << " case " << k;
            ASSERT_EQ(decode(ids), s) << what << " case " << k;
        }
    }
};
