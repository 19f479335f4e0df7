// Ring attention's block kernels (kernels.h: attention_block_fwd, _finish, _bwd) against the
// backend's full causal attention, itself checked against the double reference and finite
// differences (test_cpu_kernels, test_cpu_grad). A sequence of T rows is cut into 2 x CP
// chunks; "rank" r holds chunks r and 2 CP - 1 - r (context parallelism's causal load
// balancing) and folds in the blocks of every rank, in ring order. Its output rows, and
// the gradients (dQ of its rows, dK and dV summed over the ranks that saw each block), must
// equal the full kernel's at the same positions. Tolerance 1e-5 relative + 1e-5 (fp32).
#include "ref.h"

#include <cmath>
#include <string>
#include <vector>

using ref::FVec;

namespace {

struct Shape {
    int B, T, NH, NKV, HS, CP;
};
// multi-head and grouped; CP 2 and 4; T = 72 x CP 2 crosses the kernel's 64-row block
const Shape kShapes[] = {
    {2, 16, 4, 4, 4, 2}, {1, 24, 4, 2, 8, 2}, {2, 32, 4, 1, 4, 4}, {1, 144, 2, 2, 4, 2}};

// The rows (global positions) rank r holds: chunks r and 2 CP - 1 - r of length T / (2 CP).
std::vector<int32_t> positions(const Shape &s, int r) {
    int c = s.T / (2 * s.CP);
    std::vector<int32_t> p;
    for (int part : {r, 2 * s.CP - 1 - r})
        for (int i = 0; i < c; i++)
            p.push_back(part * c + i);
    return p;
}

void expect_near(float a, float b, const std::string &what) {
    EXPECT_LE(std::fabs(a - b), 1e-5 * std::fabs(b) + 1e-5) << what << ": " << a << " vs " << b;
}

TEST(AttentionBlock, RingOfBlocksEqualsFullCausalAttention) {
    ref::CpuBackend be;
    for (const Shape &s : kShapes) {
        SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                     " NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV) +
                     " CP=" + std::to_string(s.CP));
        const int C = s.NH * s.HS, C3 = (s.NH + 2 * s.NKV) * s.HS, CKV = 2 * s.NKV * s.HS;
        const int Tl = s.T / s.CP;
        FVec qkv = ref::randn((size_t)s.B * s.T * C3, 7);
        FVec dout = ref::randn((size_t)s.B * s.T * C, 8);
        FVec out((size_t)s.B * s.T * C), dqkv((size_t)s.B * s.T * C3, 0.0f);
        FVec saved(tpd_kern_attention_saved_bytes(be.b, s.B, s.T, s.NH, s.HS) / 4);
        ASSERT_EQ(tpd_kern_attention_fwd(be.b, out.data(), saved.data(), qkv.data(), s.B, s.T, s.NH,
                                         s.NKV, s.HS),
                  TPD_OK);
        ASSERT_EQ(tpd_kern_attention_bwd(be.b, dqkv.data(), dout.data(), qkv.data(), out.data(),
                                         saved.data(), s.B, s.T, s.NH, s.NKV, s.HS),
                  TPD_OK);
        // each rank's local rows: its qkv, dout, and its K/V block
        std::vector<FVec> lq(s.CP), lkv(s.CP), ld(s.CP);
        std::vector<std::vector<int32_t>> pos(s.CP);
        for (int r = 0; r < s.CP; r++) {
            pos[r] = positions(s, r);
            lq[r].resize((size_t)s.B * Tl * C3);
            lkv[r].resize((size_t)s.B * Tl * CKV);
            ld[r].resize((size_t)s.B * Tl * C);
            for (int b = 0; b < s.B; b++)
                for (int t = 0; t < Tl; t++) {
                    size_t g = (size_t)b * s.T + pos[r][t], l = (size_t)b * Tl + t;
                    for (int i = 0; i < C3; i++)
                        lq[r][l * C3 + i] = qkv[g * C3 + i];
                    for (int i = 0; i < CKV; i++)
                        lkv[r][l * CKV + i] = qkv[g * C3 + C + i];
                    for (int i = 0; i < C; i++)
                        ld[r][l * C + i] = dout[g * C + i];
                }
        }
        std::vector<FVec> dkv(s.CP, FVec((size_t)s.B * Tl * CKV, 0.0f));
        size_t state = (size_t)s.B * s.NH * Tl;
        for (int r = 0; r < s.CP; r++) {
            FVec o(state * s.HS, 0.0f), m(state, 0.0f), l(state, 0.0f), lse(state);
            FVec lout((size_t)s.B * Tl * C);
            for (int step = 0; step < s.CP; step++) { /* the ring: rank r - step's block */
                int src = (r - step + s.CP) % s.CP;
                ASSERT_EQ(tpd_kern_attention_block_fwd(
                              be.b, o.data(), m.data(), l.data(), lq[r].data(), lkv[src].data(),
                              pos[r].data(), pos[src].data(), s.B, Tl, Tl, s.NH, s.NKV, s.HS),
                          TPD_OK);
            }
            ASSERT_EQ(tpd_kern_attention_block_finish(be.b, lout.data(), lse.data(), o.data(),
                                                      m.data(), l.data(), s.B, Tl, s.NH, s.HS),
                      TPD_OK);
            FVec dq(state * s.HS, 0.0f);
            for (int step = 0; step < s.CP; step++) {
                int src = (r - step + s.CP) % s.CP;
                ASSERT_EQ(tpd_kern_attention_block_bwd(
                              be.b, dq.data(), dkv[src].data(), ld[r].data(), lout.data(),
                              lse.data(), lq[r].data(), lkv[src].data(), pos[r].data(),
                              pos[src].data(), s.B, Tl, Tl, s.NH, s.NKV, s.HS),
                          TPD_OK);
            }
            for (int b = 0; b < s.B; b++)
                for (int t = 0; t < Tl; t++) {
                    size_t g = (size_t)b * s.T + pos[r][t];
                    for (int h = 0; h < s.NH; h++)
                        for (int d = 0; d < s.HS; d++) {
                            expect_near(lout[((size_t)b * Tl + t) * C + h * s.HS + d],
                                        out[g * C + h * s.HS + d], "out");
                            expect_near(dq[(((size_t)b * s.NH + h) * Tl + t) * s.HS + d],
                                        dqkv[g * C3 + h * s.HS + d], "dq");
                        }
                }
        }
        // dK and dV of every block, summed over the ranks whose queries saw it
        for (int r = 0; r < s.CP; r++)
            for (int b = 0; b < s.B; b++)
                for (int t = 0; t < Tl; t++) {
                    size_t g = (size_t)b * s.T + pos[r][t];
                    for (int i = 0; i < CKV; i++)
                        expect_near(dkv[r][((size_t)b * Tl + t) * CKV + i], dqkv[g * C3 + C + i],
                                    "dkv");
                }
    }
}

// A block wholly after every query (above the causal diagonal) leaves the state as it was.
TEST(AttentionBlock, AFutureBlockIsSkipped) {
    ref::CpuBackend be;
    const int B = 1, T = 4, NH = 2, NKV = 1, HS = 4, C3 = (NH + 2 * NKV) * HS;
    FVec qkv = ref::randn((size_t)B * T * C3, 3), kv = ref::randn((size_t)B * T * 2 * NKV * HS, 4);
    std::vector<int32_t> qpos = {0, 1, 2, 3}, kpos = {4, 5, 6, 7};
    FVec o((size_t)B * NH * T * HS, 0.0f), m((size_t)B * NH * T, 0.0f), l((size_t)B * NH * T, 0.0f);
    ASSERT_EQ(tpd_kern_attention_block_fwd(be.b, o.data(), m.data(), l.data(), qkv.data(),
                                           kv.data(), qpos.data(), kpos.data(), B, T, T, NH, NKV,
                                           HS),
              TPD_OK);
    for (size_t i = 0; i < l.size(); i++) {
        EXPECT_EQ(l[i], 0.0f);
        EXPECT_EQ(m[i], 0.0f);
    }
    for (float x : o)
        EXPECT_EQ(x, 0.0f);
}

} // namespace
