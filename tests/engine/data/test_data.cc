// Token data sets: writers and readers of both formats, validation messages, the split
// sampler, `data prepare` record modes, detokenization and the data CLI.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

extern "C" {
#include "engine/cli/cli.h"
#include "base/rng.h"
#include "engine/data/data.h"
}

namespace {

class DataTest : public ::testing::Test {
  protected:
    void SetUp() override {
        const char *tmp = getenv("TMPDIR");
        std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/tpd_data_XXXXXX";
        std::vector<char> buf(templ.begin(), templ.end());
        buf.push_back('\0');
        ASSERT_NE(mkdtemp(buf.data()), nullptr);
        dir_ = buf.data();
    }
    void TearDown() override {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
        ASSERT_FALSE(ec) << dir_ << ": " << ec.message();
    }
    std::string path(const std::string &name) const {
        return dir_ + "/" + name;
    }

    std::string dir_;
};

std::vector<uint8_t> read_bytes(const std::string &p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                                std::istreambuf_iterator<char>());
}

void write_bytes(const std::string &p, const std::vector<uint8_t> &b) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char *>(b.data()), (std::streamsize)b.size());
}

void write_text(const std::string &p, const std::string &s) {
    write_bytes(p, std::vector<uint8_t>(s.begin(), s.end()));
}

bool exists(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}

template <typename T> void put(std::vector<uint8_t> &b, T v) {
    uint8_t raw[sizeof(T)];
    memcpy(raw, &v, sizeof(T));
    b.insert(b.end(), raw, raw + sizeof(T));
}

template <typename T> T get(const std::vector<uint8_t> &b, size_t at) {
    T v;
    memcpy(&v, b.data() + at, sizeof(T));
    return v;
}

// A hand-made Megatron index: one sequence per document, back to back.
std::vector<uint8_t> make_idx(uint8_t dtype, int item, const std::vector<int32_t> &sizes,
                              uint64_t version = 1) {
    std::vector<uint8_t> b = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    put<uint64_t>(b, version);
    b.push_back(dtype);
    put<uint64_t>(b, sizes.size());
    put<uint64_t>(b, sizes.size() + 1);
    for (int32_t s : sizes)
        put<int32_t>(b, s);
    int64_t ptr = 0;
    for (int32_t s : sizes) {
        put<int64_t>(b, ptr);
        ptr += (int64_t)s * item;
    }
    for (size_t d = 0; d <= sizes.size(); d++)
        put<int64_t>(b, (int64_t)d);
    return b;
}

std::vector<int32_t> stream_of(const tpd_dataset *ds) {
    std::vector<int32_t> out(tpd_dataset_num_tokens(ds));
    for (size_t i = 0; i < out.size(); i++)
        out[i] = tpd_dataset_token(ds, i);
    return out;
}

bool contains(const std::string &hay, const std::string &needle) {
    return hay.find(needle) != std::string::npos;
}

// Writes docs as an indexed data set and returns the concatenated stream.
std::vector<int32_t> write_docs(const std::string &prefix,
                                const std::vector<std::vector<int32_t>> &docs, int vocab) {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> offsets = {0};
    for (const auto &d : docs) {
        tokens.insert(tokens.end(), d.begin(), d.end());
        offsets.push_back(tokens.size());
    }
    EXPECT_EQ(tpd_indexed_write(prefix.c_str(), tokens.data(), offsets.data(), docs.size(), vocab),
              TPD_OK);
    return tokens;
}

// ---- Megatron indexed data set ----

TEST_F(DataTest, IndexedRoundTripUint16) {
    std::string prefix = path("u16");
    std::vector<int32_t> tokens =
        write_docs(prefix, {{1, 2, 3, 256}, {0}, {255, 7, 256}, {}, {42, 256}}, 257);

    // The files follow Megatron's layout byte for byte.
    std::vector<uint8_t> idx = read_bytes(prefix + ".idx");
    ASSERT_EQ(idx.size(), 34u + 12 * 5 + 8 * 6);
    EXPECT_EQ(memcmp(idx.data(), "MMIDIDX\0\0", 9), 0);
    EXPECT_EQ(get<uint64_t>(idx, 9), 1u);
    EXPECT_EQ(idx[17], 8); // uint16
    EXPECT_EQ(get<uint64_t>(idx, 18), 5u);
    EXPECT_EQ(get<uint64_t>(idx, 26), 6u); // count + 1 document indices
    const int32_t sizes[5] = {4, 1, 3, 0, 2};
    const int64_t ptrs[5] = {0, 8, 10, 16, 16};
    for (int i = 0; i < 5; i++) {
        EXPECT_EQ(get<int32_t>(idx, 34 + 4 * i), sizes[i]);
        EXPECT_EQ(get<int64_t>(idx, 34 + 20 + 8 * i), ptrs[i]);
    }
    for (int d = 0; d <= 5; d++)
        EXPECT_EQ(get<int64_t>(idx, 34 + 60 + 8 * d), d);
    EXPECT_EQ(read_bytes(prefix + ".bin").size(), 2 * tokens.size());
    EXPECT_FALSE(exists(prefix + ".bin.tmp"));
    EXPECT_FALSE(exists(prefix + ".idx.tmp"));

    tpd_dataset *ds = nullptr;
    ASSERT_EQ(tpd_dataset_open(prefix.c_str(), 257, &ds), TPD_OK);
    EXPECT_STREQ(tpd_dataset_format(ds), "megatron");
    EXPECT_STREQ(tpd_dataset_dtype(ds), "uint16");
    EXPECT_EQ(tpd_dataset_num_tokens(ds), tokens.size());
    EXPECT_EQ(tpd_dataset_num_documents(ds), 5u);
    EXPECT_EQ(tpd_dataset_max_token(ds), 256);
    EXPECT_EQ(stream_of(ds), tokens);
    std::vector<int32_t> part(4);
    ASSERT_EQ(tpd_dataset_read(ds, 3, 4, part.data()), TPD_OK);
    EXPECT_EQ(part, std::vector<int32_t>({256, 0, 255, 7}));
    EXPECT_EQ(tpd_dataset_read(ds, 8, 3, part.data()), TPD_ERR_INVALID);
    tpd_dataset_close(ds);
}

// The token file is memory-mapped: cut short underneath, a read past its new end would
// be SIGBUS. Every read checks the open file first and names it instead.
TEST_F(DataTest, ATokenFileTruncatedWhileOpenIsAnErrorNotASignal) {
    std::string prefix = path("cut");
    std::vector<int32_t> tokens = write_docs(prefix, {{1, 2, 3}, {4, 5}}, 257);
    tpd_dataset *ds = nullptr;
    ASSERT_EQ(tpd_dataset_open(prefix.c_str(), 257, &ds), TPD_OK);
    std::vector<int32_t> got(tokens.size());
    ASSERT_EQ(tpd_dataset_read(ds, 0, got.size(), got.data()), TPD_OK);
    ASSERT_EQ(truncate((prefix + ".bin").c_str(), 0), 0);
    tpd_log_quiet_begin();
    EXPECT_EQ(tpd_dataset_read(ds, 0, got.size(), got.data()), TPD_ERR_IO);
    tpd_log_quiet_end();
    EXPECT_TRUE(contains(tpd_last_error(), prefix + ".bin: changed while in use (" +
                                               std::to_string(2 * tokens.size()) +
                                               " bytes at open, 0 now, truncated)"))
        << tpd_last_error();
    tpd_dataset_close(ds);
}

TEST_F(DataTest, IndexedRoundTripInt32) {
    std::string prefix = path("i32");
    std::vector<int32_t> tokens =
        write_docs(prefix, {{65535, 70000, 3}, {99999, 0}, {12345, 65536, 50256, 1}}, 100000);
    std::vector<uint8_t> idx = read_bytes(prefix + ".idx");
    EXPECT_EQ(idx[17], 4); // int32 once the vocab reaches 65500, as Megatron chooses
    EXPECT_EQ(get<int64_t>(idx, 34 + 12 + 8 * 2), 5 * 4); // byte offset of the third doc
    EXPECT_EQ(read_bytes(prefix + ".bin").size(), 4 * tokens.size());

    tpd_dataset *ds = nullptr;
    ASSERT_EQ(tpd_dataset_open(prefix.c_str(), 100000, &ds), TPD_OK);
    EXPECT_STREQ(tpd_dataset_dtype(ds), "int32");
    EXPECT_EQ(tpd_dataset_num_documents(ds), 3u);
    EXPECT_EQ(tpd_dataset_max_token(ds), 99999);
    EXPECT_EQ(stream_of(ds), tokens);
    std::vector<int32_t> all(tokens.size());
    ASSERT_EQ(tpd_dataset_read(ds, 0, all.size(), all.data()), TPD_OK);
    EXPECT_EQ(all, tokens);
    tpd_dataset_close(ds);
}

TEST_F(DataTest, IndexedOpensByBinOrIdxPath) {
    std::string prefix = path("named");
    write_docs(prefix, {{5, 6, 7}}, 257);
    for (const char *suffix : {".bin", ".idx"}) {
        tpd_dataset *ds = nullptr;
        ASSERT_EQ(tpd_dataset_open((prefix + suffix).c_str(), 257, &ds), TPD_OK) << suffix;
        EXPECT_EQ(tpd_dataset_num_tokens(ds), 3u);
        EXPECT_STREQ(tpd_dataset_format(ds), "megatron");
        tpd_dataset_close(ds);
    }
}

TEST_F(DataTest, IndexedReadsOtherIntegerDtypes) {
    struct Case {
        uint8_t code;
        int item;
        const char *name;
    };
    const std::vector<int64_t> values = {0, 1, 100, 127, 2, 50};
    for (Case c :
         {Case{1, 1, "uint8"}, Case{2, 1, "int8"}, Case{3, 2, "int16"}, Case{5, 8, "int64"}}) {
        std::string prefix = path(std::string("dt_") + c.name);
        write_bytes(prefix + ".idx", make_idx(c.code, c.item, {4, 2}));
        std::vector<uint8_t> bin;
        for (int64_t v : values) {
            uint8_t raw[8];
            memcpy(raw, &v, 8); // little-endian: the low bytes come first
            bin.insert(bin.end(), raw, raw + c.item);
        }
        write_bytes(prefix + ".bin", bin);
        tpd_dataset *ds = nullptr;
        ASSERT_EQ(tpd_dataset_open(prefix.c_str(), 257, &ds), TPD_OK) << c.name;
        EXPECT_STREQ(tpd_dataset_dtype(ds), c.name);
        EXPECT_EQ(tpd_dataset_num_documents(ds), 2u);
        EXPECT_EQ(stream_of(ds), std::vector<int32_t>(values.begin(), values.end())) << c.name;
        tpd_dataset_close(ds);
    }
}

TEST_F(DataTest, IndexedRejectsFloatDtype) {
    std::string prefix = path("f32");
    write_bytes(prefix + ".idx", make_idx(7, 4, {2}));
    write_bytes(prefix + ".bin", std::vector<uint8_t>(8, 0));
    tpd_dataset *ds = nullptr;
    EXPECT_EQ(tpd_dataset_open(prefix.c_str(), 257, &ds), TPD_ERR_FORMAT);
    EXPECT_EQ(ds, nullptr);
    std::string msg = tpd_last_error();
    EXPECT_TRUE(contains(msg, prefix + ".idx")) << msg;
    EXPECT_TRUE(contains(msg, "float32")) << msg;
}

// ---- validation messages name the file (and the byte offset) ----

struct OpenResult {
    tpd_status st;
    std::string msg;
};

OpenResult try_open(const std::string &p, int vocab) {
    tpd_dataset *ds = nullptr;
    tpd_status st = tpd_dataset_open(p.c_str(), vocab, &ds);
    if (ds) tpd_dataset_close(ds);
    return {st, tpd_last_error()};
}

TEST_F(DataTest, TruncatedIdx) {
    std::string prefix = path("t_idx");
    write_docs(prefix, {{1, 2}, {3}}, 257);
    std::vector<uint8_t> idx = read_bytes(prefix + ".idx");
    idx.resize(idx.size() - 8);
    write_bytes(prefix + ".idx", idx);
    OpenResult r = try_open(prefix, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, prefix + ".idx: truncated")) << r.msg;

    idx.resize(20); // shorter than the header
    write_bytes(prefix + ".idx", idx);
    r = try_open(prefix, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, prefix + ".idx: truncated: 20 bytes")) << r.msg;
}

TEST_F(DataTest, TruncatedBin) {
    std::string prefix = path("t_bin");
    write_docs(prefix, {{1, 2}, {3, 4, 5}}, 257);
    std::vector<uint8_t> bin = read_bytes(prefix + ".bin");
    bin.resize(bin.size() - 1);
    write_bytes(prefix + ".bin", bin);
    OpenResult r = try_open(prefix, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, prefix + ".bin: truncated: 9 bytes, expected 10")) << r.msg;
}

TEST_F(DataTest, MissingBin) {
    std::string prefix = path("no_bin");
    write_docs(prefix, {{1}}, 257);
    ASSERT_EQ(unlink((prefix + ".bin").c_str()), 0);
    OpenResult r = try_open(prefix, 257);
    EXPECT_EQ(r.st, TPD_ERR_IO);
    EXPECT_TRUE(contains(r.msg, prefix + ".bin: cannot open")) << r.msg;
}

TEST_F(DataTest, WrongIdxMagic) {
    std::string prefix = path("magic");
    write_docs(prefix, {{1, 2}}, 257);
    std::vector<uint8_t> idx = read_bytes(prefix + ".idx");
    idx[0] = 'X';
    write_bytes(prefix + ".idx", idx);
    OpenResult r = try_open(prefix, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, prefix + ".idx: bad magic at byte offset 0")) << r.msg;
}

TEST_F(DataTest, WrongIdxVersion) {
    std::string prefix = path("version");
    write_bytes(prefix + ".idx", make_idx(8, 2, {2}, 2));
    write_bytes(prefix + ".bin", std::vector<uint8_t>(4, 0));
    OpenResult r = try_open(prefix, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, prefix + ".idx: version 2 at byte offset 9")) << r.msg;
}

TEST_F(DataTest, IdxSequencesNotBackToBack) {
    std::string prefix = path("ptr");
    std::vector<uint8_t> idx = make_idx(8, 2, {2, 2});
    int64_t bad = 6; // the second sequence should start at byte 4
    memcpy(idx.data() + 34 + 8 + 8, &bad, 8);
    write_bytes(prefix + ".idx", idx);
    write_bytes(prefix + ".bin", std::vector<uint8_t>(8, 0));
    OpenResult r = try_open(prefix, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, prefix + ".idx: sequence 1 points at .bin byte 6")) << r.msg;
}

TEST_F(DataTest, IdxBadDocumentIndices) {
    std::string prefix = path("docidx");
    std::vector<uint8_t> idx = make_idx(8, 2, {1, 1});
    int64_t bad = 1; // the last index must equal sequence_count (2)
    memcpy(idx.data() + 34 + 24 + 16, &bad, 8);
    write_bytes(prefix + ".idx", idx);
    write_bytes(prefix + ".bin", std::vector<uint8_t>(4, 0));
    OpenResult r = try_open(prefix, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, prefix + ".idx: document index 2 is 1 at byte offset 74")) << r.msg;
}

TEST_F(DataTest, TokenOutOfVocabNamesFileAndOffset) {
    std::string prefix = path("vocab");
    write_docs(prefix, {{1, 2, 3}, {4, 300, 5}}, 1000);
    OpenResult r = try_open(prefix, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    // Token index 4, two bytes each.
    EXPECT_EQ(r.msg, prefix + ".bin: token 300 at byte offset 8 is >= vocab_size 257");
    EXPECT_EQ(try_open(prefix, 301).st, TPD_OK);
}

TEST_F(DataTest, NegativeTokenRejected) {
    std::string prefix = path("neg");
    write_bytes(prefix + ".idx", make_idx(4, 4, {2}));
    std::vector<uint8_t> bin;
    put<int32_t>(bin, 7);
    put<int32_t>(bin, -3);
    write_bytes(prefix + ".bin", bin);
    OpenResult r = try_open(prefix, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_EQ(r.msg, prefix + ".bin: token -3 at byte offset 4 is negative");
}

TEST_F(DataTest, MissingFile) {
    std::string p = path("nothing_here");
    OpenResult r = try_open(p, 257);
    EXPECT_EQ(r.st, TPD_ERR_IO);
    EXPECT_TRUE(contains(r.msg, p + ": no such data set")) << r.msg;
    EXPECT_EQ(try_open(p, 0).st, TPD_ERR_INVALID);
}

// ---- llm.c shards ----

TEST_F(DataTest, LlmcRoundTrip) {
    std::string p = path("shard.bin");
    std::vector<uint16_t> toks = {50256, 15496, 11, 995, 50256, 40, 716, 0, 50256};
    ASSERT_EQ(tpd_llmc_shard_write(p.c_str(), toks.data(), toks.size()), TPD_OK);
    std::vector<uint8_t> raw = read_bytes(p);
    ASSERT_EQ(raw.size(), 1024 + 2 * toks.size());
    EXPECT_EQ(get<int32_t>(raw, 0), 20240520);
    EXPECT_EQ(get<int32_t>(raw, 4), 1);
    EXPECT_EQ(get<int32_t>(raw, 8), (int32_t)toks.size());
    for (int i = 3; i < 256; i++)
        ASSERT_EQ(get<int32_t>(raw, 4 * i), 0) << i;

    tpd_dataset *ds = nullptr;
    ASSERT_EQ(tpd_dataset_open(p.c_str(), 50257, &ds), TPD_OK);
    EXPECT_STREQ(tpd_dataset_format(ds), "llm.c");
    EXPECT_STREQ(tpd_dataset_dtype(ds), "uint16");
    EXPECT_EQ(tpd_dataset_num_tokens(ds), toks.size());
    EXPECT_EQ(tpd_dataset_num_documents(ds), 3u); // one <|endoftext|> per document
    EXPECT_EQ(stream_of(ds), std::vector<int32_t>(toks.begin(), toks.end()));
    tpd_dataset_close(ds);

    OpenResult r = try_open(p, 50000); // 50256 is out of a 50000 vocab
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_EQ(r.msg, p + ": token 50256 at byte offset 1024 is >= vocab_size 50000");
}

TEST_F(DataTest, LlmcWrongMagic) {
    std::string p = path("bad_magic.bin");
    std::vector<uint16_t> toks = {1, 2, 3};
    ASSERT_EQ(tpd_llmc_shard_write(p.c_str(), toks.data(), toks.size()), TPD_OK);
    std::vector<uint8_t> raw = read_bytes(p);
    int32_t magic = 20240326; // an llm.c model file, not a token shard
    memcpy(raw.data(), &magic, 4);
    write_bytes(p, raw);
    OpenResult r = try_open(p, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, p + ": bad magic 20240326 at byte offset 0")) << r.msg;

    int32_t version[2] = {20240520, 2};
    memcpy(raw.data(), version, 8);
    write_bytes(p, raw);
    r = try_open(p, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, p + ": version 2 at byte offset 4")) << r.msg;
}

TEST_F(DataTest, LlmcTruncated) {
    std::string p = path("short.bin");
    std::vector<uint16_t> toks(100, 7);
    ASSERT_EQ(tpd_llmc_shard_write(p.c_str(), toks.data(), toks.size()), TPD_OK);
    std::vector<uint8_t> raw = read_bytes(p);
    raw.resize(raw.size() - 3);
    write_bytes(p, raw);
    OpenResult r = try_open(p, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, p + ": truncated: 1221 bytes, expected 1224")) << r.msg;

    raw.resize(100); // not even a header
    write_bytes(p, raw);
    r = try_open(p, 257);
    EXPECT_EQ(r.st, TPD_ERR_FORMAT);
    EXPECT_TRUE(contains(r.msg, p + ": truncated: 100 bytes")) << r.msg;
}

// ---- writers ----

TEST_F(DataTest, WriterRejectsOutOfVocabAndLeavesNothing) {
    std::string prefix = path("w");
    std::vector<int32_t> toks = {1, 2, 257};
    std::vector<uint64_t> offs = {0, 3};
    EXPECT_EQ(tpd_indexed_write(prefix.c_str(), toks.data(), offs.data(), 1, 257), TPD_ERR_INVALID);
    EXPECT_TRUE(contains(tpd_last_error(), "token 257 at index 2")) << tpd_last_error();
    EXPECT_FALSE(exists(prefix + ".idx"));
    EXPECT_FALSE(exists(prefix + ".bin"));
    EXPECT_FALSE(exists(prefix + ".bin.tmp"));

    tpd_indexed_builder *b = nullptr;
    ASSERT_EQ(tpd_indexed_builder_create(prefix.c_str(), 257, &b), TPD_OK);
    ASSERT_EQ(tpd_indexed_builder_add(b, toks.data(), 2), TPD_OK);
    tpd_indexed_builder_destroy(b); // never finished: no files remain
    EXPECT_FALSE(exists(prefix + ".bin.tmp"));
    EXPECT_FALSE(exists(prefix + ".idx"));

    EXPECT_EQ(tpd_indexed_builder_create(path("no/such/dir/x").c_str(), 257, &b), TPD_ERR_IO);
    EXPECT_TRUE(contains(tpd_last_error(), "no/such/dir/x.bin.tmp: cannot create"));
}

// ---- sampler ----

// Tokens 0..n-1, so a token's value is its position in the stream.
tpd_dataset *open_iota(const std::string &prefix, int n) {
    std::vector<int32_t> toks(n);
    for (int i = 0; i < n; i++)
        toks[i] = i;
    std::vector<uint64_t> offs = {0, (uint64_t)n};
    EXPECT_EQ(tpd_indexed_write(prefix.c_str(), toks.data(), offs.data(), 1, n), TPD_OK);
    tpd_dataset *ds = nullptr;
    EXPECT_EQ(tpd_dataset_open(prefix.c_str(), n, &ds), TPD_OK);
    return ds;
}

TEST_F(DataTest, SamplerWindowsInOrder) {
    tpd_dataset *ds = open_iota(path("iota"), 1000);
    ASSERT_NE(ds, nullptr);
    tpd_sampler s;
    ASSERT_EQ(tpd_sampler_init(ds, "1,0,0", TPD_SPLIT_TRAIN, 10, 0, 1234, &s), TPD_OK);
    EXPECT_EQ(s.begin, 0u);
    EXPECT_EQ(s.end, 1000u);
    EXPECT_EQ(s.num_windows, 99u); // (1000 - 1) / 10
    std::vector<int32_t> out(11);
    for (uint64_t g : {0ull, 1ull, 57ull, 98ull, 99ull, 99ull * 7 + 5}) {
        ASSERT_EQ(tpd_sampler_get(&s, g, out.data()), TPD_OK);
        uint64_t w = g % 99; // next epoch starts over
        for (int i = 0; i <= 10; i++)
            ASSERT_EQ(out[i], (int32_t)(w * 10 + i)) << g;
    }
    tpd_sampler_free(&s);
    tpd_dataset_close(ds);
}

TEST_F(DataTest, SamplerSplitsProportional) {
    tpd_dataset *ds = open_iota(path("iota"), 10000);
    ASSERT_NE(ds, nullptr);
    const uint64_t want[3][2] = {{0, 9490}, {9490, 9990}, {9990, 10000}};
    for (int k = 0; k < 3; k++) {
        tpd_sampler s;
        ASSERT_EQ(tpd_sampler_init(ds, "949,50,1", (tpd_split)k, 4, 0, 1, &s), TPD_OK);
        EXPECT_EQ(s.begin, want[k][0]) << k;
        EXPECT_EQ(s.end, want[k][1]) << k;
        EXPECT_EQ(s.num_windows, (want[k][1] - want[k][0] - 1) / 4);
        // Samples stay inside their split, so train never sees a valid token.
        std::vector<int32_t> out(5);
        ASSERT_EQ(tpd_sampler_get(&s, s.num_windows - 1, out.data()), TPD_OK);
        EXPECT_GE(out[0], (int32_t)want[k][0]);
        EXPECT_LT(out[4], (int32_t)want[k][1]);
        tpd_sampler_free(&s);
    }
    tpd_sampler s;
    ASSERT_EQ(tpd_sampler_init(ds, "8, 1, 1", TPD_SPLIT_VALID, 4, 0, 1, &s), TPD_OK);
    EXPECT_EQ(s.begin, 8000u);
    EXPECT_EQ(s.end, 9000u);
    tpd_sampler_free(&s);
    ASSERT_EQ(tpd_sampler_init(ds, "1", TPD_SPLIT_TRAIN, 4, 0, 1, &s), TPD_OK);
    EXPECT_EQ(s.end, 10000u); // missing weights are 0
    tpd_sampler_free(&s);

    // The test split holds 10 tokens: too few for seq_length 16.
    EXPECT_EQ(tpd_sampler_init(ds, "949,50,1", TPD_SPLIT_TEST, 16, 0, 1, &s), TPD_ERR_INVALID);
    std::string msg = tpd_last_error();
    EXPECT_TRUE(contains(msg, "the test split holds 10 tokens")) << msg;
    EXPECT_TRUE(contains(msg, "seq_length+1 = 17")) << msg;
    for (const char *bad : {"a,b", "0,0,0", "1,2,3,4", "-1,2", "1;2"})
        EXPECT_EQ(tpd_sampler_init(ds, bad, TPD_SPLIT_TRAIN, 4, 0, 1, &s), TPD_ERR_INVALID) << bad;
    tpd_dataset_close(ds);
}

// First token of each sample of one epoch, divided by seq_length: the window index.
std::vector<uint64_t> epoch_windows(tpd_sampler *s, uint64_t epoch) {
    std::vector<uint64_t> w(s->num_windows);
    std::vector<int32_t> out(s->seq_length + 1);
    for (uint64_t p = 0; p < s->num_windows; p++) {
        EXPECT_EQ(tpd_sampler_get(s, epoch * s->num_windows + p, out.data()), TPD_OK);
        w[p] = (uint64_t)out[0] / s->seq_length;
    }
    return w;
}

TEST_F(DataTest, SamplerShuffleIsSeededPermutation) {
    tpd_dataset *ds = open_iota(path("iota"), 2001);
    ASSERT_NE(ds, nullptr);
    tpd_sampler a, b, c;
    ASSERT_EQ(tpd_sampler_init(ds, "1,0,0", TPD_SPLIT_TRAIN, 8, 1, 42, &a), TPD_OK);
    ASSERT_EQ(tpd_sampler_init(ds, "1,0,0", TPD_SPLIT_TRAIN, 8, 1, 42, &b), TPD_OK);
    ASSERT_EQ(tpd_sampler_init(ds, "1,0,0", TPD_SPLIT_TRAIN, 8, 1, 43, &c), TPD_OK);
    ASSERT_EQ(a.num_windows, 250u);

    std::vector<uint64_t> identity(250);
    for (uint64_t i = 0; i < 250; i++)
        identity[i] = i;
    std::vector<uint64_t> e0 = epoch_windows(&a, 0), e1 = epoch_windows(&a, 1);
    for (const auto &e : {e0, e1}) {
        std::vector<uint64_t> sorted = e;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(sorted, identity); // every window once per epoch
        EXPECT_NE(e, identity);
    }
    EXPECT_NE(e0, e1);                   // a new order each epoch
    EXPECT_EQ(epoch_windows(&b, 0), e0); // same seed, same order
    EXPECT_NE(epoch_windows(&c, 0), e0); // another seed, another order

    // The order is the documented Fisher-Yates on tpd_rng (seed, stream=epoch, index).
    std::vector<uint64_t> perm = identity;
    for (uint64_t i = 249; i >= 1; i--)
        std::swap(perm[i], perm[tpd_rng_below(42, 1, i, i + 1)]);
    EXPECT_EQ(e1, perm);

    // A pure function of (seed, g): asked backwards, across epochs, the answers agree.
    std::vector<uint64_t> gs;
    for (uint64_t g = 0; g < 500; g += 7)
        gs.push_back(g);
    for (uint64_t g = 3 * 250; g < 3 * 250 + 30; g++)
        gs.push_back(g);
    std::vector<int32_t> out(9), again(9);
    std::vector<std::vector<int32_t>> forward;
    for (uint64_t g : gs) {
        ASSERT_EQ(tpd_sampler_get(&a, g, out.data()), TPD_OK);
        forward.push_back(out);
    }
    for (size_t k = gs.size(); k-- > 0;) {
        ASSERT_EQ(tpd_sampler_get(&b, gs[k], again.data()), TPD_OK);
        EXPECT_EQ(again, forward[k]) << gs[k];
        for (int i = 1; i <= 8; i++)
            EXPECT_EQ(again[i], again[0] + i); // a contiguous window
    }
    tpd_sampler_free(&a);
    tpd_sampler_free(&b);
    tpd_sampler_free(&c);
    EXPECT_EQ(a.perm, nullptr);
    tpd_dataset_close(ds);
}

// ---- data prepare ----

std::vector<int32_t> bytes_eod(const std::vector<std::string> &docs) {
    std::vector<int32_t> t;
    for (const auto &d : docs) {
        for (unsigned char ch : d)
            t.push_back(ch);
        t.push_back(TPD_BYTE_EOD);
    }
    return t;
}

struct Prepared {
    tpd_status st;
    uint64_t docs, tokens;
    std::vector<int32_t> stream;
    uint64_t stored_docs;
};

Prepared prepare(const std::vector<std::string> &inputs, tpd_records mode,
                 const std::string &prefix) {
    std::vector<const char *> in;
    for (const auto &s : inputs)
        in.push_back(s.c_str());
    Prepared r{};
    tpd_prepare_opts po = TPD_PREPARE_OPTS_INIT;
    po.records = mode;
    r.st = tpd_data_prepare(in.data(), (int)in.size(), &po, prefix.c_str(), &r.docs, &r.tokens);
    if (r.st != TPD_OK) return r;
    tpd_dataset *ds = nullptr;
    EXPECT_EQ(tpd_dataset_open(prefix.c_str(), TPD_BYTE_VOCAB, &ds), TPD_OK);
    if (!ds) return r;
    EXPECT_STREQ(tpd_dataset_dtype(ds), "uint16");
    r.stream = stream_of(ds);
    r.stored_docs = tpd_dataset_num_documents(ds);
    tpd_dataset_close(ds);
    return r;
}

TEST_F(DataTest, PrepareFileRecords) {
    write_text(path("a.txt"), "ab\n\ncd\n");
    write_text(path("empty.txt"), "");
    write_text(path("b.txt"), "\xc3\xa9t\xc3\xa9");
    Prepared r =
        prepare({path("a.txt"), path("empty.txt"), path("b.txt")}, TPD_RECORDS_FILE, path("out"));
    ASSERT_EQ(r.st, TPD_OK);
    EXPECT_EQ(r.docs, 2u); // the empty file is skipped
    EXPECT_EQ(r.stored_docs, 2u);
    std::vector<int32_t> want = bytes_eod({"ab\n\ncd\n", "\xc3\xa9t\xc3\xa9"});
    EXPECT_EQ(r.tokens, want.size());
    EXPECT_EQ(r.stream, want);
    EXPECT_EQ(r.stream[8], 0xc3); // bytes above 127 stay one token each
}

TEST_F(DataTest, PrepareBlankRecords) {
    write_text(path("a.txt"), "\n\na\nb\n\n\nc\n  \t\r\nd\n\ne");
    write_text(path("b.txt"), "f\r\n\r\ng\n");
    Prepared r = prepare({path("a.txt"), path("b.txt")}, TPD_RECORDS_BLANK, path("out"));
    ASSERT_EQ(r.st, TPD_OK);
    std::vector<int32_t> want = bytes_eod({"a\nb\n", "c\n", "d\n", "e", "f\r\n", "g\n"});
    EXPECT_EQ(r.docs, 6u);
    EXPECT_EQ(r.stored_docs, 6u);
    EXPECT_EQ(r.tokens, want.size());
    EXPECT_EQ(r.stream, want);
}

TEST_F(DataTest, PreparePercentRecords) {
    // Fortune files: records end with a line holding only '%'; blank lines inside a
    // record belong to it; whitespace-only records are skipped; no record spans files.
    write_text(path("f1"), "one\n%\ntwo\n\nlines\n%\n%\n\n%\n 100%\n%\nlast");
    write_text(path("f2"), "crlf\r\n%\r\nx\n%\n");
    Prepared r = prepare({path("f1"), path("f2")}, TPD_RECORDS_PERCENT, path("out"));
    ASSERT_EQ(r.st, TPD_OK);
    std::vector<int32_t> want =
        bytes_eod({"one\n", "two\n\nlines\n", " 100%\n", "last", "crlf\r\n", "x\n"});
    EXPECT_EQ(r.docs, 6u);
    EXPECT_EQ(r.tokens, want.size());
    EXPECT_EQ(r.stream, want);
}

TEST_F(DataTest, PrepareJsonlRecords) {
    // Megatron's JSON Lines: the "text" field of each object, escapes decoded; other
    // fields ignored; blank lines skipped; whitespace-only documents skipped
    write_text(path("a.jsonl"), "{\"text\": \"line one\\nline two\", \"id\": 1}\n"
                                "\n"
                                "{\"id\": 2, \"text\": \"caf\\u00e9 \\\"quoted\\\"\"}\n"
                                "{\"text\": \"   \"}\n"
                                "{\"text\": \"last, no newline\"}");
    Prepared r = prepare({path("a.jsonl")}, TPD_RECORDS_JSONL, path("out"));
    ASSERT_EQ(r.st, TPD_OK) << tpd_last_error();
    std::vector<int32_t> want =
        bytes_eod({"line one\nline two", "caf\xc3\xa9 \"quoted\"", "last, no newline"});
    EXPECT_EQ(r.docs, 3u);
    EXPECT_EQ(r.stream, want);
    // another field, through the options
    write_text(path("b.jsonl"), "{\"content\": \"x\"}\n{\"content\": \"yz\"}\n");
    tpd_prepare_opts po = {TPD_RECORDS_JSONL, nullptr, "content"};
    std::string in = path("b.jsonl"), out = path("out2");
    const char *ins[] = {in.c_str()};
    uint64_t docs = 0, tokens = 0;
    ASSERT_EQ(tpd_data_prepare(ins, 1, &po, out.c_str(), &docs, &tokens), TPD_OK);
    EXPECT_EQ(docs, 2u);
    EXPECT_EQ(tokens, 5u); // x EOD y z EOD
    // errors name the file, the line and the rule; nothing is written
    // a line is one whole object: a raw NUL or a second object is never cut off or dropped
    struct {
        std::string text;
        const char *message, *why;
    } bad[] = {{"{\"text\": \"ok\"}\n[1, 2]\n", ":2: not a JSON object", ""},
               {"{\"text\": \"ok\"}\n\n{\"txt\": \"x\"}\n", ":3: no such field", ""},
               {"{\"text\": 7}\n", ":1: the field is not a string", ""},
               {"{\"text\": \"unterminated}\n", ":1:", "not valid JSON"},
               {std::string("{\"text\": \"a\0b\"}\n", 16), ":1:12: a NUL byte", ""},
               {"{\"text\": \"a\"}{\"text\": \"b\"}\n", ":1:14: text after the record", ""},
               {"{\"text\": \"a\"} junk\n", ":1:15: text after the record", ""}};
    for (const auto &b : bad) {
        write_text(path("bad.jsonl"), b.text);
        Prepared e = prepare({path("bad.jsonl")}, TPD_RECORDS_JSONL, path("out3"));
        EXPECT_EQ(e.st, TPD_ERR_FORMAT) << b.text;
        EXPECT_TRUE(contains(tpd_last_error(), path("bad.jsonl") + b.message)) << tpd_last_error();
        EXPECT_TRUE(contains(tpd_last_error(), b.why)) << tpd_last_error();
        EXPECT_FALSE(exists(path("out3.idx")));
    }
    // a key given twice: its last value, as Python's json.loads
    write_text(path("dup.jsonl"), "{\"text\": \"first\", \"text\": \"zz\"}\n");
    r = prepare({path("dup.jsonl")}, TPD_RECORDS_JSONL, path("out4"));
    ASSERT_EQ(r.st, TPD_OK) << tpd_last_error();
    EXPECT_EQ(r.stream, bytes_eod({"zz"}));
}

TEST_F(DataTest, PrepareErrors) {
    std::string missing = path("missing.txt");
    write_text(path("ok.txt"), "text");
    Prepared r = prepare({path("ok.txt"), missing}, TPD_RECORDS_FILE, path("out"));
    EXPECT_EQ(r.st, TPD_ERR_IO);
    EXPECT_TRUE(contains(tpd_last_error(), missing + ": cannot read: No such file"));
    EXPECT_FALSE(exists(path("out.idx")));
    EXPECT_FALSE(exists(path("out.bin.tmp")));

    write_text(path("blank.txt"), "\n \n%\n");
    r = prepare({path("blank.txt")}, TPD_RECORDS_PERCENT, path("out"));
    EXPECT_EQ(r.st, TPD_ERR_INVALID);
    EXPECT_TRUE(contains(tpd_last_error(), "no non-empty record"));
    EXPECT_FALSE(exists(path("out.idx")));
}

TEST(DataDetokenize, BytesAndEod) {
    const int32_t toks[] = {72, 105, 256, 7, 300, -1, 9, 0xc3, 0xa9, 10, 127};
    char out[32];
    size_t n = tpd_bytes_detokenize(toks, 11, out, sizeof out);
    EXPECT_EQ(n, 11u);
    EXPECT_EQ(std::string(out, n), std::string("Hi\n???\t\xc3\xa9\n?"));
    EXPECT_EQ(out[n], '\0');
    EXPECT_EQ(tpd_bytes_detokenize(toks, 11, out, 3), 2u); // room for 2 bytes and the NUL
    EXPECT_STREQ(out, "Hi");
    EXPECT_EQ(tpd_bytes_detokenize(toks, 11, out, 0), 0u);
}

// ---- CLI ----

int run_cli(std::vector<std::string> args) {
    std::vector<char *> argv;
    for (auto &a : args)
        argv.push_back(&a[0]);
    return tpd_cli_data((int)argv.size(), argv.data());
}

TEST_F(DataTest, CliPrepareAndInfo) {
    write_text(path("f"), "a\n%\nbb\n%\n");
    write_text(path("g"), "ccc\n");
    std::string prefix = path("cli");
    testing::internal::CaptureStdout();
    int rc = run_cli({"data", "prepare", "--input", path("f"), path("g"), "--output", prefix,
                      "--records", "percent"});
    std::string out = testing::internal::GetCapturedStdout();
    ASSERT_EQ(rc, 0);
    EXPECT_TRUE(contains(out, "3 documents, 12 tokens")) << out;

    testing::internal::CaptureStdout();
    rc = run_cli({"data", "info", prefix});
    out = testing::internal::GetCapturedStdout();
    EXPECT_EQ(rc, 0);
    EXPECT_TRUE(contains(out, "format:      megatron")) << out;
    EXPECT_TRUE(contains(out, "dtype:       uint16")) << out;
    EXPECT_TRUE(contains(out, "tokens:      12")) << out;
    EXPECT_TRUE(contains(out, "documents:   3")) << out;

    EXPECT_EQ(run_cli({"data", "info", prefix, "--vocab-size", "100"}), 1); // EOD is 256
    EXPECT_TRUE(contains(tpd_last_error(), ">= vocab_size 100"));
    EXPECT_EQ(run_cli({"data", "info", path("nope")}), 1);
}

TEST_F(DataTest, CliUsage) {
    testing::internal::CaptureStdout();
    EXPECT_EQ(run_cli({"data", "prepare", "--help"}), 0);
    std::string help = testing::internal::GetCapturedStdout();
    EXPECT_TRUE(contains(help, "each input file is one document")) << help;
    EXPECT_TRUE(contains(help, "blank-line separated record")) << help;
    EXPECT_TRUE(contains(help, "holding only '%'")) << help;

    testing::internal::CaptureStderr();
    EXPECT_EQ(run_cli({"data"}), 2);
    EXPECT_EQ(run_cli({"data", "frobnicate"}), 2);
    EXPECT_EQ(run_cli({"data", "prepare", "--input", path("x")}), 2); // no --output
    EXPECT_EQ(run_cli({"data", "prepare", "--output", path("o"), "--input"}), 2);
    EXPECT_EQ(run_cli({"data", "prepare", "--input", path("x"), "--output", path("o"), "--records",
                       "lines"}),
              2);
    EXPECT_EQ(run_cli({"data", "info"}), 2);
    testing::internal::GetCapturedStderr();
    EXPECT_FALSE(exists(path("o.idx")));
}

} // namespace
