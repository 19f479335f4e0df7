// The decoding attention of the cpu backend: one new position over a key/value cache against
// the plain double reference (the position's row of causal grouped-query attention over the
// cached positions), and against the backend's own full attention_fwd, row by row.
//
// Tolerance: |kernel - reference| <= 1e-5 * |reference| + 1e-5 (fp32 on O(1) inputs).
#include "ref_llama.h"

#include <string>

using ref::FVec;
using ref::Vec;

namespace {

constexpr double kRel = 1e-5;
constexpr double kAbs = 1e-5;

struct DecShape {
    int T, NH, NKV, HS;
};
// multi-head, two groups, one K/V head; T = 70 is longer than the full kernel's row block
const DecShape kShapes[] = {{9, 4, 4, 4}, {9, 4, 2, 4}, {70, 4, 1, 8}, {1, 2, 2, 6}};

// The K (kv = 0) or V (kv = 1) heads of rows 0..len-1 of qkv(T,(NH+2*NKV)*HS) as a cache
// (len, NKV*HS), and row t's Q heads (NH*HS).
FVec cache_of(const FVec &qkv, const DecShape &s, int len, int kv) {
    const int C3 = (s.NH + 2 * s.NKV) * s.HS, KV = s.NKV * s.HS;
    FVec c((size_t)len * KV);
    for (int t = 0; t < len; t++)
        for (int i = 0; i < KV; i++)
            c[(size_t)t * KV + i] = qkv[(size_t)t * C3 + (s.NH + kv * s.NKV) * s.HS + i];
    return c;
}
FVec query_of(const FVec &qkv, const DecShape &s, int t) {
    const int C3 = (s.NH + 2 * s.NKV) * s.HS;
    return FVec(qkv.begin() + (size_t)t * C3, qkv.begin() + (size_t)t * C3 + s.NH * s.HS);
}

TEST(CpuAttentionDecode, MatchesTheCausalRowOfEveryPosition) {
    ref::CpuBackend be;
    for (DecShape s : kShapes) {
        SCOPED_TRACE("T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
                     " NKV=" + std::to_string(s.NKV));
        const int C = s.NH * s.HS, C3 = (s.NH + 2 * s.NKV) * s.HS;
        FVec qkv = ref::randn((size_t)s.T * C3, 71);
        Vec want = ref::attention_gqa(ref::to_d(qkv), 1, s.T, s.NH, s.NKV, s.HS);
        FVec full((size_t)s.T * C),
            saved(tpd_kern_attention_saved_bytes(be.b, 1, s.T, s.NH, s.HS) / 4);
        ASSERT_EQ(tpd_kern_attention_fwd(be.b, full.data(), saved.data(), qkv.data(), 1, s.T, s.NH,
                                         s.NKV, s.HS),
                  TPD_OK);
        for (int t = 0; t < s.T; t++) {
            SCOPED_TRACE("position " + std::to_string(t));
            FVec q = query_of(qkv, s, t), k = cache_of(qkv, s, t + 1, 0),
                 v = cache_of(qkv, s, t + 1, 1), out(C, NAN);
            ASSERT_EQ(tpd_kern_attention_decode(be.b, out.data(), q.data(), k.data(), v.data(),
                                                t + 1, s.NH, s.NKV, s.HS),
                      TPD_OK);
            Vec row(want.begin() + (size_t)t * C, want.begin() + (size_t)(t + 1) * C);
            ref::expect_close(out.data(), row, kRel, kAbs, "decode vs double reference");
            Vec fw(full.begin() + (size_t)t * C, full.begin() + (size_t)(t + 1) * C);
            ref::expect_close(out.data(), fw, kRel, kAbs, "decode vs attention_fwd");
        }
    }
}

// Positions past len are not read: garbage there changes nothing. And the cache's history
// matters: the same query over a cache with one earlier value changed gives another output.
TEST(CpuAttentionDecode, ReadsExactlyTheLenCachedPositions) {
    ref::CpuBackend be;
    const DecShape s = {12, 4, 2, 4};
    const int C = s.NH * s.HS, KV = s.NKV * s.HS, len = 7;
    FVec q = ref::randn(C, 5), k = ref::randn((size_t)s.T * KV, 6),
         v = ref::randn((size_t)s.T * KV, 7);
    FVec a(C), b(C), c(C);
    ASSERT_EQ(tpd_kern_attention_decode(be.b, a.data(), q.data(), k.data(), v.data(), len, s.NH,
                                        s.NKV, s.HS),
              TPD_OK);
    FVec k2 = k, v2 = v;
    for (size_t i = (size_t)len * KV; i < k2.size(); i++)
        k2[i] = v2[i] = NAN;
    ASSERT_EQ(tpd_kern_attention_decode(be.b, b.data(), q.data(), k2.data(), v2.data(), len, s.NH,
                                        s.NKV, s.HS),
              TPD_OK);
    EXPECT_EQ(a, b);
    v2[0] += 1.0f; // position 0, K/V head 0: the first group of query heads sees it
    ASSERT_EQ(tpd_kern_attention_decode(be.b, c.data(), q.data(), k2.data(), v2.data(), len, s.NH,
                                        s.NKV, s.HS),
              TPD_OK);
    EXPECT_NE(a[0], c[0]);
    EXPECT_EQ(a[C - 1], c[C - 1]); // the last query head reads K/V head 1
}

TEST(CpuAttentionDecode, RejectsBadShapes) {
    ref::CpuBackend be;
    FVec q(64), k(64), v(64), out(64);
    EXPECT_EQ(tpd_kern_attention_decode(be.b, out.data(), q.data(), k.data(), v.data(), 0, 4, 2, 4),
              TPD_ERR_INVALID);
    EXPECT_EQ(tpd_kern_attention_decode(be.b, out.data(), q.data(), k.data(), v.data(), 2, 4, 3, 4),
              TPD_ERR_INVALID);
    EXPECT_EQ(tpd_kern_attention_decode(be.b, out.data(), q.data(), k.data(), v.data(), 2, 4, 2, 0),
              TPD_ERR_INVALID);
}

} // namespace
