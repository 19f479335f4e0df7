// Context parallelism's sequence split (engine/model/model_cp.c): which positions a CP rank
// holds, that the chunk rule balances the causal attention work, and that the buffer plan
// keeps activations per rank near 1/CP of the whole sequence's.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "engine/model/model.h"
#include "engine/model/model_layout.h"
}

namespace {

tpd_model_dims dims_of(int seq, int cp) {
    tpd_config cfg = tiny::config("");
    cfg.model.seq_length = seq;
    cfg.model.max_position_embeddings = seq;
    cfg.parallel.context_parallel_size = cp;
    tpd_model_dims d{};
    EXPECT_EQ(tpd_model_dims_init(&cfg, 1, 0, 1, 0, &d), TPD_OK);
    return d;
}

// Rank r holds chunks r and 2CP-1-r of seq/(2CP) positions, in that order; the ranks
// together hold every position once.
TEST(ModelCp, RanksHoldTheirTwoChunksAndTogetherTheSequence) {
    for (int cp : {1, 2, 4, 8}) {
        const int seq = 64;
        tpd_model_dims d = dims_of(seq, cp);
        ASSERT_EQ(d.T, seq / cp);
        ASSERT_EQ(d.Tg, seq);
        std::multiset<int> all;
        for (int r = 0; r < cp; r++) {
            int c = seq / (2 * cp);
            for (int t = 0; t < d.T; t++) {
                int p = tpd_model_cp_pos(&d, r, t);
                int want = cp == 1 ? t : (t < c ? r * c + t : (2 * cp - 1 - r) * c + t - c);
                EXPECT_EQ(p, want) << "CP " << cp << " rank " << r << " row " << t;
                all.insert(p);
            }
        }
        ASSERT_EQ((int)all.size(), seq);
        for (int p = 0; p < seq; p++)
            EXPECT_EQ(all.count(p), 1u) << "position " << p << " at CP " << cp;
    }
}

// Under the causal mask each rank scores the (query, key) pairs whose key is not after the
// query: counted here pair by pair from the rank's positions, the chunk rule gives every
// rank the same work (within 10%, exactly in fact), where a contiguous split of the
// sequence would give the last rank 2CP-1 times the first's.
TEST(ModelCp, ChunkRuleBalancesTheCausalWork) {
    for (int cp : {2, 4, 8}) {
        const int seq = 256;
        tpd_model_dims d = dims_of(seq, cp);
        std::vector<double> pairs(cp, 0.0), contiguous(cp, 0.0);
        for (int r = 0; r < cp; r++)
            for (int t = 0; t < d.T; t++) {
                pairs[r] += tpd_model_cp_pos(&d, r, t) + 1; // keys at positions 0 .. pos
                contiguous[r] += r * d.T + t + 1;
            }
        double lo = *std::min_element(pairs.begin(), pairs.end());
        double hi = *std::max_element(pairs.begin(), pairs.end());
        EXPECT_LE(hi / lo, 1.10) << "CP " << cp;
        double total = 0;
        for (int r = 0; r < cp; r++) {
            EXPECT_DOUBLE_EQ(pairs[r], tpd_model_cp_causal_pairs(seq, cp, r)) << "rank " << r;
            total += pairs[r];
        }
        EXPECT_DOUBLE_EQ(total, tpd_model_cp_causal_pairs(seq, 1, 0)); // the whole triangle
        double clo = *std::min_element(contiguous.begin(), contiguous.end());
        double chi = *std::max_element(contiguous.begin(), contiguous.end());
        EXPECT_GT(chi / clo, 1.10) << "a contiguous split is unbalanced: the test can fail";
    }
}

// Activations scale with the tokens a rank holds: at CP 4 the activation slots are a
// quarter of CP 1's within the ring's small per-layer LSE difference (the cpu backend keeps
// CP 1's (T,T) probabilities, the ring only their LSE, so CP 4 is in fact below a quarter).
TEST(ModelCp, ActivationsPerRankShrinkWithCp) {
    tpd_config cfg = tiny::config("");
    cfg.model.seq_length = 64;
    cfg.model.max_position_embeddings = 64;
    tpd_buffer_plan one, four, a2a;
    ASSERT_EQ(tpd_buffer_plan_init(&cfg, 1, 0, 1, 1, 0, &one), TPD_OK);
    cfg.parallel.context_parallel_size = 4;
    ASSERT_EQ(tpd_buffer_plan_init(&cfg, 1, 0, 1, 1, 0, &four), TPD_OK);
    cfg.parallel.cp_comm_type = TPD_CP_COMM_A2A;
    ASSERT_EQ(tpd_buffer_plan_init(&cfg, 1, 0, 1, 1, 0, &a2a), TPD_OK);
    double r = (double)four.mem.activations / one.mem.activations;
    EXPECT_LT(r, 0.25);
    EXPECT_GT(r, 0.05);
    // a2a keeps the whole sequence's probabilities of a quarter of the heads: CP 1's
    // attention state over 4, and the rest over 4
    EXPECT_NEAR((double)a2a.mem.activations / one.mem.activations, 0.25, 0.02);
    EXPECT_EQ(four.mem.params, one.mem.params); // CP splits no weights
    EXPECT_GT(four.w_cpkv + four.w_cpdkv, 0u);
}

} // namespace
