// Rank layout (Megatron's order: TP fastest, then DP, then PP) against the tables of
// README.md's "Rank layout" and Megatron's 16-rank example, and the data-parallel
// bucket/shard plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

extern "C" {
#include "parallel/data/dp.h"
#include "parallel/mesh.h"
}

static std::vector<int> members(const tpd_mesh &m, tpd_mesh_group g, int rank) {
    int buf[64];
    int n = tpd_mesh_group_members(&m, g, rank, buf, 64);
    return std::vector<int>(buf, buf + n);
}

using V = std::vector<int>;

TEST(Mesh, EightRanksDesignTable) {
    tpd_mesh m;
    ASSERT_EQ(tpd_mesh_init(8, 0, 2, 2, 2, &m), TPD_OK);
    EXPECT_EQ(members(m, TPD_MESH_GROUP_TP, 0), (V{0, 1}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_TP, 5), (V{4, 5}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 0), (V{0, 2}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 1), (V{1, 3}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 4), (V{4, 6}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 7), (V{5, 7}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_PP, 0), (V{0, 4}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_PP, 3), (V{3, 7}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_EMB, 2), (V{2, 6}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_MP, 0), (V{0, 1, 4, 5}));
    for (int r = 0; r < 8; r++) {
        int tp, dp, pp;
        tpd_mesh_coords_of(&m, r, &tp, &dp, &pp);
        EXPECT_EQ(r, tp + 2 * (dp + 2 * pp));
        EXPECT_EQ(tpd_mesh_rank_of(&m, tp, dp, pp), r);
    }
}

TEST(Mesh, SixteenRanksReferenceTable) {
    tpd_mesh m;
    ASSERT_EQ(tpd_mesh_init(16, 0, 2, 4, 2, &m), TPD_OK);
    EXPECT_EQ(members(m, TPD_MESH_GROUP_TP, 14), (V{14, 15}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 0), (V{0, 2}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 5), (V{5, 7}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_PP, 0), (V{0, 4, 8, 12}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_PP, 3), (V{3, 7, 11, 15}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_EMB, 1), (V{1, 13}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_EMB, 15), (V{3, 15}));
    EXPECT_TRUE(members(m, TPD_MESH_GROUP_EMB, 5).empty()); // a middle stage
}

// Ranks with equal color must be exactly the members of group g, ordered by key.
void expect_colors_match(const tpd_mesh &m, int g, const std::string &what) {
    for (int r = 0; r < m.world_size; r++) {
        int color, key;
        tpd_mesh_group_color(&m, (tpd_mesh_group)g, r, &color, &key);
        V mem = members(m, (tpd_mesh_group)g, r);
        if (color < 0) {
            EXPECT_TRUE(mem.empty());
            continue;
        }
        std::vector<std::pair<int, int>> same;
        for (int q = 0; q < m.world_size; q++) {
            int c2, k2;
            tpd_mesh_group_color(&m, (tpd_mesh_group)g, q, &c2, &k2);
            if (c2 == color) same.push_back({k2, q});
        }
        std::sort(same.begin(), same.end());
        V ordered;
        for (auto &p : same)
            ordered.push_back(p.second);
        EXPECT_EQ(ordered, mem) << "group " << tpd_mesh_group_name((tpd_mesh_group)g) << " rank "
                                << r << what;
    }
}

TEST(Mesh, SplitColorsMatchMembers) {
    tpd_mesh m;
    ASSERT_EQ(tpd_mesh_init(16, 0, 2, 4, 2, &m), TPD_OK);
    for (int g = 0; g < TPD_MESH_GROUP_COUNT; g++)
        expect_colors_match(m, g, "");
}

// Hybrid sharding: 16 ranks at TP 2, DP 8, shard groups of 2 consecutive dp indices (world
// ranks TP apart), replicated across the 4 groups; no rank moves, and the split colors give
// exactly the members. With 2 DiLoCo replicas the groups stay inside a replica.
TEST(Mesh, HsdpShardAndReplicateGroups) {
    tpd_mesh m;
    ASSERT_EQ(tpd_mesh_init(16, 0, 2, 1, 8, &m), TPD_OK);
    ASSERT_EQ(tpd_mesh_set_shard_size(&m, 2), TPD_OK);
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP_SHARD, 0), (V{0, 2}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP_SHARD, 5), (V{5, 7}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP_REPLICATE, 0), (V{0, 4, 8, 12}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP_REPLICATE, 7), (V{3, 7, 11, 15}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 0), (V{0, 2, 4, 6, 8, 10, 12, 14}));
    tpd_mesh r6;
    ASSERT_EQ(tpd_mesh_init(16, 6, 2, 1, 8, &r6), TPD_OK);
    ASSERT_EQ(tpd_mesh_set_shard_size(&r6, 2), TPD_OK);
    EXPECT_EQ(r6.dp, 3);
    EXPECT_EQ(r6.dp_shard, 1);
    EXPECT_EQ(r6.dp_rep, 1);
    EXPECT_EQ(tpd_mesh_set_shard_size(&r6, 3), TPD_ERR_INVALID);
    for (int replicas : {1, 2}) {
        tpd_mesh h;
        ASSERT_EQ(tpd_mesh_init(16, 0, 2, 1, 8, &h), TPD_OK);
        ASSERT_EQ(tpd_mesh_set_replicas(&h, replicas), TPD_OK);
        ASSERT_EQ(tpd_mesh_set_shard_size(&h, 2), TPD_OK);
        for (int g : {TPD_MESH_GROUP_DP_SHARD, TPD_MESH_GROUP_DP_REPLICATE})
            expect_colors_match(h, g, " replicas " + std::to_string(replicas));
        // a replicate group never leaves its DiLoCo replica
        V rep0 = members(h, TPD_MESH_GROUP_DP_REPLICATE, 0);
        EXPECT_EQ((int)rep0.size(), 8 / replicas / 2);
    }
}

// Expert parallelism: 16 ranks at TP 2, PP 2, DP 4, EP 2: the EP groups are runs of 2
// consecutive dp indices (world ranks TP apart), the expert-DP groups the ranks of equal
// ep index across them; both inside one stage and one TP index, and every DP group is
// exactly their product.
TEST(Mesh, ExpertParallelGroups) {
    tpd_mesh m;
    ASSERT_EQ(tpd_mesh_init(16, 0, 2, 2, 4, &m), TPD_OK);
    ASSERT_EQ(tpd_mesh_set_ep(&m, 2), TPD_OK);
    EXPECT_EQ(members(m, TPD_MESH_GROUP_EP, 0), (V{0, 2}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_EP, 5), (V{5, 7}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_EDP, 0), (V{0, 4}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_EDP, 11), (V{11, 15}));
    for (int g : {TPD_MESH_GROUP_EP, TPD_MESH_GROUP_EDP})
        expect_colors_match(m, g, " ep 2");
    tpd_mesh r7;
    ASSERT_EQ(tpd_mesh_init(16, 7, 2, 2, 4, &r7), TPD_OK);
    ASSERT_EQ(tpd_mesh_set_ep(&r7, 2), TPD_OK);
    EXPECT_EQ(r7.dp, 3);
    EXPECT_EQ(r7.ep, 1);
    EXPECT_EQ(r7.edp, 1);
    EXPECT_EQ(tpd_mesh_set_ep(&r7, 3), TPD_ERR_INVALID);
    // HSDP under EP: shard groups of 4 dp indices hold two EP runs; an expert's copies in
    // one group (EDP_SHARD) are its 2 ranks of equal ep there, and DP_REPLICATE (equal dp %
    // 4) joins ranks of equal ep across the groups
    tpd_mesh h;
    ASSERT_EQ(tpd_mesh_init(16, 0, 2, 1, 8, &h), TPD_OK);
    ASSERT_EQ(tpd_mesh_set_ep(&h, 2), TPD_OK);
    ASSERT_EQ(tpd_mesh_set_shard_size(&h, 4), TPD_OK);
    EXPECT_TRUE(tpd_mesh_has_edp_shard(&h));
    EXPECT_EQ(members(h, TPD_MESH_GROUP_EDP_SHARD, 0), (V{0, 4}));
    EXPECT_EQ(members(h, TPD_MESH_GROUP_EDP_SHARD, 3), (V{3, 7}));
    EXPECT_EQ(members(h, TPD_MESH_GROUP_EDP_SHARD, 10), (V{10, 14}));
    EXPECT_EQ(members(h, TPD_MESH_GROUP_DP_REPLICATE, 2), (V{2, 10}));
    for (int g : {TPD_MESH_GROUP_EDP_SHARD, TPD_MESH_GROUP_DP_SHARD, TPD_MESH_GROUP_DP_REPLICATE})
        expect_colors_match(h, g, " hsdp 4 ep 2");
    EXPECT_EQ(tpd_mesh_set_shard_size(&h, 8), TPD_OK); // no HSDP: no such group
    EXPECT_FALSE(tpd_mesh_has_edp_shard(&h));
    tpd_mesh bad;
    ASSERT_EQ(tpd_mesh_init(16, 0, 2, 1, 8, &bad), TPD_OK);
    ASSERT_EQ(tpd_mesh_set_ep(&bad, 4), TPD_OK);
    EXPECT_EQ(tpd_mesh_set_shard_size(&bad, 2), TPD_ERR_INVALID); // cuts an EP run
    tpd_mesh cp;
    ASSERT_EQ(tpd_mesh_init(16, 0, 2, 2, 4, &cp), TPD_OK);
    ASSERT_EQ(tpd_mesh_set_cp(&cp, 2), TPD_OK);
    EXPECT_EQ(tpd_mesh_set_ep(&cp, 2), TPD_ERR_INVALID);
}

TEST(Mesh, DilocoReplicaGroups) {
    // TP=2, DP=4, PP=2 (16 ranks), 2 replicas of 2 consecutive dp indices each, each
    // replica a run of 8 consecutive ranks.
    tpd_mesh m;
    ASSERT_EQ(tpd_mesh_init(16, 0, 2, 2, 4, &m), TPD_OK);
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 0), (V{0, 2, 4, 6}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP_OUTER, 0), (V{0}));
    EXPECT_EQ(tpd_mesh_set_replicas(&m, 3), TPD_ERR_INVALID);
    EXPECT_EQ(tpd_mesh_set_replicas(&m, 0), TPD_ERR_INVALID);
    ASSERT_EQ(tpd_mesh_set_replicas(&m, 2), TPD_OK);
    EXPECT_EQ(m.dp_inner_size, 2);
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 0), (V{0, 2}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 5), (V{5, 7}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 13), (V{13, 15}));
    // the replicas are outermost: replica 0 is ranks 0-7, replica 1 ranks 8-15
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP_OUTER, 0), (V{0, 8}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP_OUTER, 3), (V{3, 11}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP_OUTER, 10), (V{2, 10}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_PP, 0), (V{0, 4}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_PP, 9), (V{9, 13}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_TP, 12), (V{12, 13}));
    for (int r = 0; r < 16; r++) {
        int t, d, p;
        tpd_mesh_coords_of(&m, r, &t, &d, &p);
        EXPECT_EQ(tpd_mesh_rank_of(&m, t, d, p), r);
        EXPECT_EQ(d / m.dp_inner_size, r / 8) << "rank " << r << " outside its replica's run";
    }
    tpd_mesh r6;
    ASSERT_EQ(tpd_mesh_init(16, 6, 2, 2, 4, &r6), TPD_OK);
    ASSERT_EQ(tpd_mesh_set_replicas(&r6, 2), TPD_OK);
    EXPECT_EQ(r6.dp, 1);
    EXPECT_EQ(r6.pp, 1);
    EXPECT_EQ(r6.replica, 0);
    EXPECT_EQ(r6.dp_inner, 1);
    tpd_mesh r10;
    ASSERT_EQ(tpd_mesh_init(16, 10, 2, 2, 4, &r10), TPD_OK);
    EXPECT_EQ(r10.dp, 1); // Megatron's order before the split
    EXPECT_EQ(r10.pp, 1);
    ASSERT_EQ(tpd_mesh_set_replicas(&r10, 2), TPD_OK);
    EXPECT_EQ(r10.dp, 3);
    EXPECT_EQ(r10.pp, 0);
    EXPECT_EQ(r10.replica, 1);
    EXPECT_EQ(r10.dp_inner, 1);
    // colors agree with members for both groups, every rank
    for (int g : {(int)TPD_MESH_GROUP_DP, (int)TPD_MESH_GROUP_DP_OUTER})
        expect_colors_match(m, g, "");
}

TEST(Mesh, RejectsWorldMismatch) {
    tpd_mesh m;
    EXPECT_EQ(tpd_mesh_init(6, 0, 2, 2, 2, &m), TPD_ERR_INVALID);
    EXPECT_EQ(tpd_mesh_init(8, 8, 2, 2, 2, &m), TPD_ERR_INVALID);
}

TEST(DataParallelPlan, ZeroShardsCoverEveryElementOnce) {
    const size_t numel = 1003;
    for (int dp : {1, 2, 3, 4, 8}) {
        for (size_t bucket : {(size_t)7, (size_t)64, (size_t)100000}) {
            std::vector<int> owner(tpd_dp_padded_numel(numel, dp), 0);
            size_t state_total = 0;
            for (int r = 0; r < dp; r++) {
                tpd_dp_plan p;
                ASSERT_EQ(tpd_dp_plan_init(numel, bucket, dp, r, 1, &p), TPD_OK);
                EXPECT_EQ(p.numel_padded % dp, 0u);
                EXPECT_EQ(p.shard_numel, tpd_dp_shard_numel(numel, dp, dp > 1));
                size_t state = 0;
                for (int i = 0; i < p.nranges; i++) {
                    EXPECT_EQ(p.ranges[i].state, state);
                    for (size_t e = p.ranges[i].begin; e < p.ranges[i].end; e++)
                        owner[e]++;
                    state += p.ranges[i].end - p.ranges[i].begin;
                }
                EXPECT_EQ(state, p.shard_numel);
                state_total += state;
                tpd_dp_plan_free(&p);
            }
            EXPECT_EQ(state_total, owner.size());
            for (size_t e = 0; e < owner.size(); e++)
                ASSERT_EQ(owner[e], 1) << "element " << e;
        }
    }
}

// GPU choice per rank (tpd_mesh_choose_gpu): the node's ranks from MPI_Comm_split_type,
// the devices each rank sees, and each rank's CUDA_VISIBLE_DEVICES.
TEST(MeshGpu, RanksSeeingEveryGpuTakeTheirLocalRank) {
    for (int r = 0; r < 8; r++) {
        tpd_mesh_gpu g = tpd_mesh_choose_gpu(r, 8, 8, nullptr);
        EXPECT_EQ(g.device, r);
        EXPECT_EQ(g.nccl, 1);
    }
}

TEST(MeshGpu, OneVisibleGpuPerRankIsDeviceZeroWithNccl) {
    // CUDA_VISIBLE_DEVICES set per task: each rank sees one GPU, a different one.
    const char *vis[4] = {"0", "1", "2", "3"};
    for (int r = 0; r < 4; r++) {
        tpd_mesh_gpu g = tpd_mesh_choose_gpu(r, 4, 1, vis);
        EXPECT_EQ(g.device, 0) << r;
        EXPECT_EQ(g.nccl, 1) << r;
    }
    const char *uuids[2] = {"GPU-aaaa", "GPU-bbbb"};
    EXPECT_EQ(tpd_mesh_choose_gpu(1, 2, 1, uuids).nccl, 1);
    const char *pairs[2] = {"0,1", "2,3"};
    EXPECT_EQ(tpd_mesh_choose_gpu(1, 2, 2, pairs).device, 0);
}

TEST(MeshGpu, SharedGpuMeansNoNccl) {
    // Four ranks, one GPU that all of them see (same or unset CUDA_VISIBLE_DEVICES).
    const char *same[4] = {"0", "0", "0", "0"};
    const char *unset[4] = {"", "", "", ""};
    for (int r = 0; r < 4; r++) {
        for (const char *const *vis : {(const char *const *)same, (const char *const *)unset,
                                       (const char *const *)nullptr}) {
            tpd_mesh_gpu g = tpd_mesh_choose_gpu(r, 4, 1, vis);
            EXPECT_EQ(g.device, 0);
            EXPECT_EQ(g.nccl, 0);
        }
    }
    // Overlapping lists are not GPUs of their own.
    const char *overlap[2] = {"0,1", "1,2"};
    tpd_mesh_gpu g = tpd_mesh_choose_gpu(1, 2, 1, overlap);
    EXPECT_EQ(g.nccl, 0);
    // Eight ranks on two GPUs: round robin, staged.
    EXPECT_EQ(tpd_mesh_choose_gpu(5, 8, 2, nullptr).device, 1);
    EXPECT_EQ(tpd_mesh_choose_gpu(5, 8, 2, nullptr).nccl, 0);
}

TEST(MeshGpu, NoDeviceIsMinusOne) {
    tpd_mesh_gpu g = tpd_mesh_choose_gpu(0, 1, 0, nullptr);
    EXPECT_EQ(g.device, -1);
    EXPECT_EQ(g.nccl, 0);
    // A single rank alone on its node with one GPU.
    g = tpd_mesh_choose_gpu(0, 1, 1, nullptr);
    EXPECT_EQ(g.device, 0);
    EXPECT_EQ(g.nccl, 1);
}

// Context parallelism: DP x CP is the mesh's DP coordinate, CP fastest inside it, so rank =
// tp + TP*(cp + CP*(data_dp + DP*pp)) (Megatron's TP, CP, DP, PP); group CP is the CP ranks of
// one sequence, group DP all of DP x CP (the gradient sum).
TEST(Mesh, ContextParallelGroups) {
    tpd_mesh m;
    ASSERT_EQ(tpd_mesh_init(16, 0, 2, 2, 4, &m), TPD_OK); // TP 2, PP 2, DP 2 x CP 2
    ASSERT_EQ(tpd_mesh_set_cp(&m, 2), TPD_OK);
    EXPECT_EQ(m.data_dp_size, 2);
    EXPECT_EQ(members(m, TPD_MESH_GROUP_CP, 0), (V{0, 2}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_CP, 5), (V{5, 7}));
    EXPECT_EQ(members(m, TPD_MESH_GROUP_DP, 0), (V{0, 2, 4, 6}));
    tpd_mesh r6;
    ASSERT_EQ(tpd_mesh_init(16, 6, 2, 2, 4, &r6), TPD_OK);
    ASSERT_EQ(tpd_mesh_set_cp(&r6, 2), TPD_OK);
    EXPECT_EQ(r6.cp, 1);
    EXPECT_EQ(r6.data_dp, 1);
    EXPECT_EQ(r6.tp, 0);
    EXPECT_EQ(tpd_mesh_set_cp(&r6, 3), TPD_ERR_INVALID);
    expect_colors_match(m, TPD_MESH_GROUP_CP, " CP");
}
