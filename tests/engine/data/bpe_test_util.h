// Shared by the tokenizer tests: a loaded tpd_bpe with encode/decode returning vectors and
// strings (each call checked). Subclasses load it from GPT-2's files or a tokenizer.json.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
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
};
