// The start-up placement table (parallel/placement.c): hosts in order of their lowest
// rank, rank and local-rank ranges, which dimensions cross hosts, and the warnings for a
// TP group across hosts and for node-local numbers that disagree with the hosts; the
// node-local numbers read from each launcher's variables.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

extern "C" {
#include "parallel/placement.h"
}

namespace {

struct Lines {
    std::vector<std::string> info, warn;
};

void collect(void *user, int warn, const char *line) {
    Lines *l = static_cast<Lines *>(user);
    (warn ? l->warn : l->info).push_back(line);
}

// hosts[r], local ranks and the local size every rank reports
Lines describe(int tp, int pp, int dp, const std::vector<const char *> &hosts,
               const std::vector<int> &local, const std::vector<int> &local_size, int *warnings) {
    tpd_mesh m;
    EXPECT_EQ(tpd_mesh_init((int)hosts.size(), 0, tp, pp, dp, &m), TPD_OK);
    std::vector<tpd_rank_place> p(hosts.size());
    for (size_t r = 0; r < hosts.size(); r++) {
        memset(&p[r], 0, sizeof p[r]);
        snprintf(p[r].host, sizeof p[r].host, "%s", hosts[r]);
        p[r].local_rank = local[r];
        p[r].local_size = local_size[r];
    }
    Lines l;
    *warnings = tpd_placement_describe(&m, p.data(), collect, &l);
    return l;
}

} // namespace

TEST(Placement, TwoNodesTpInsidePpAcross) {
    int w;
    Lines l =
        describe(2, 2, 1, {"nodeA", "nodeA", "nodeB", "nodeB"}, {0, 1, 0, 1}, {2, 2, 2, 2}, &w);
    EXPECT_EQ(w, 0);
    EXPECT_TRUE(l.warn.empty());
    ASSERT_EQ(l.info.size(), 3u);
    EXPECT_EQ(l.info[0], "4 ranks on 2 hosts; TP groups inside one host, PP groups span hosts, "
                         "DP groups inside one host");
    EXPECT_EQ(l.info[1], "host nodeA: ranks 0-1 (local ranks 0-1 of 2)");
    EXPECT_EQ(l.info[2], "host nodeB: ranks 2-3 (local ranks 0-1 of 2)");
}

TEST(Placement, HostsInOrderOfTheirLowestRank) {
    int w;
    // TP2 x DP2 x PP2 on two hosts of 4: DP inside a host, PP across
    Lines l = describe(2, 2, 2, {"z", "z", "z", "z", "a", "a", "a", "a"}, {0, 1, 2, 3, 0, 1, 2, 3},
                       {4, 4, 4, 4, 4, 4, 4, 4}, &w);
    EXPECT_EQ(w, 0);
    ASSERT_EQ(l.info.size(), 3u);
    EXPECT_EQ(l.info[0], "8 ranks on 2 hosts; TP groups inside one host, PP groups span hosts, "
                         "DP groups inside one host");
    EXPECT_EQ(l.info[1], "host z: ranks 0-3 (local ranks 0-3 of 4)");
    EXPECT_EQ(l.info[2], "host a: ranks 4-7 (local ranks 0-3 of 4)");
}

TEST(Placement, RoundRobinSplitsTpGroups) {
    int w;
    // a launcher that deals ranks out round-robin (mpirun --map-by node)
    Lines l = describe(2, 2, 1, {"a", "b", "a", "b"}, {0, 0, 1, 1}, {2, 2, 2, 2}, &w);
    EXPECT_EQ(w, 1);
    ASSERT_EQ(l.info.size(), 3u);
    EXPECT_EQ(l.info[0], "4 ranks on 2 hosts; TP groups span hosts, PP groups inside one host, "
                         "DP groups inside one host");
    EXPECT_EQ(l.info[1], "host a: ranks 0,2 (local ranks 0-1 of 2)");
    ASSERT_EQ(l.warn.size(), 1u);
    EXPECT_NE(l.warn[0].find("2 of 2 TP groups span hosts (ranks 0 and 1 are on a and b)"),
              std::string::npos)
        << l.warn[0];
}

TEST(Placement, LauncherCountDisagreesWithHosts) {
    int w;
    // no node-local size from the launcher: every rank assumed the whole world is local
    Lines l = describe(2, 2, 1, {"a", "a", "b", "b"}, {0, 1, 2, 3}, {4, 4, 4, 4}, &w);
    EXPECT_EQ(w, 3); // both hosts' counts, and host b's local ranks 2-3 past its 2 ranks
    ASSERT_EQ(l.warn.size(), 3u);
    EXPECT_NE(l.warn[0].find("host a runs 2 ranks, but the launcher told rank 0 that 4 share"),
              std::string::npos)
        << l.warn[0];
    EXPECT_NE(l.warn[1].find("host b runs 2 ranks, but the launcher told rank 2 that 4 share"),
              std::string::npos)
        << l.warn[1];
    EXPECT_NE(l.warn[2].find("host b: the launcher's local ranks (2-3) are not 0..1"),
              std::string::npos)
        << l.warn[2];
}

TEST(Placement, RepeatedLocalRank) {
    int w;
    Lines l = describe(2, 1, 1, {"a", "a"}, {0, 0}, {2, 2}, &w);
    EXPECT_EQ(w, 1);
    ASSERT_EQ(l.warn.size(), 1u);
    EXPECT_NE(l.warn[0].find("local ranks (0,0) are not 0..1, each once"), std::string::npos)
        << l.warn[0];
}

TEST(Placement, OneHost) {
    int w;
    Lines l = describe(1, 1, 3, {"h", "h", "h"}, {0, 1, 2}, {3, 3, 3}, &w);
    EXPECT_EQ(w, 0);
    ASSERT_EQ(l.info.size(), 2u);
    EXPECT_EQ(l.info[0], "3 ranks on 1 host; TP groups inside one host, PP groups inside one "
                         "host, DP groups inside one host");
    EXPECT_EQ(l.info[1], "host h: ranks 0-2 (local ranks 0-2 of 3)");
}

TEST(Placement, LargeJobListsTheFirstHosts) {
    int w;
    // DP 40 on 40 hosts of one rank; the last host's launcher got the local size wrong
    std::vector<std::string> names(40);
    std::vector<const char *> hosts(40);
    for (int r = 0; r < 40; r++) {
        names[r] = "n" + std::to_string(r);
        hosts[r] = names[r].c_str();
    }
    std::vector<int> local(40, 0), size(40, 1);
    size[39] = 2;
    Lines l = describe(1, 1, 40, hosts, local, size, &w);
    EXPECT_EQ(w, 1);
    ASSERT_EQ(l.info.size(), 1u + 32u + 1u);
    EXPECT_EQ(l.info[1], "host n0: ranks 0 (local ranks 0 of 1)");
    EXPECT_EQ(l.info[32], "host n31: ranks 31 (local ranks 0 of 1)");
    EXPECT_EQ(l.info[33], "8 more hosts not listed");
    ASSERT_EQ(l.warn.size(), 1u);
    EXPECT_EQ(l.warn[0], "1 of the hosts not listed have node-local numbers from the launcher "
                         "that disagree with the ranks they run");
}

namespace {

const char *const kLauncherVars[] = {
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_LOCALID",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NODEID",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
};

// The environment of a process its launcher started: only the given variables set.
tpd_rank_place launched(const std::vector<std::pair<const char *, const char *>> &env,
                        const char *host = "h") {
    for (const char *v : kLauncherVars)
        unsetenv(v);
    for (const auto &kv : env)
        setenv(kv.first, kv.second, 1);
    tpd_rank_place p;
    memset(&p, 0, sizeof p);
    snprintf(p.host, sizeof p.host, "%s", host);
    tpd_placement_from_launcher(&p);
    for (const char *v : kLauncherVars)
        unsetenv(v);
    return p;
}

Lines describe_places(int tp, int pp, int dp, const std::vector<tpd_rank_place> &p, int *warnings) {
    tpd_mesh m;
    EXPECT_EQ(tpd_mesh_init((int)p.size(), 0, tp, pp, dp, &m), TPD_OK);
    Lines l;
    *warnings = tpd_placement_describe(&m, p.data(), collect, &l);
    return l;
}

} // namespace

TEST(PlacementLauncher, OpenMpi) {
    tpd_rank_place p = launched({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"},
                                 {"SLURM_LOCALID", "1"}}); // mpirun inside an allocation
    EXPECT_EQ(p.local_rank, 3);
    EXPECT_EQ(p.local_size, 8);
    EXPECT_STREQ(p.rank_var, "OMPI_COMM_WORLD_LOCAL_RANK");
    EXPECT_STREQ(p.size_var, "OMPI_COMM_WORLD_LOCAL_SIZE");
    EXPECT_STREQ(p.host, "h");
}

TEST(PlacementLauncher, SlurmCountOfThisNode) {
    // 2 tasks on each of nodes 0-2, 1 on node 3
    auto on = [](const char *node) {
        return launched({{"SLURM_LOCALID", "0"},
                         {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
                         {"SLURM_NODEID", node}});
    };
    EXPECT_EQ(on("0").local_size, 2);
    EXPECT_EQ(on("2").local_size, 2);
    EXPECT_EQ(on("3").local_size, 1);
    EXPECT_EQ(on("4").local_size, -1); // no such node
    tpd_rank_place p = on("3");
    EXPECT_EQ(p.local_rank, 0);
    EXPECT_STREQ(p.rank_var, "SLURM_LOCALID");
    EXPECT_STREQ(p.size_var, "SLURM_STEP_TASKS_PER_NODE");
    for (const char *bad : {"2(3)", "2(x0)", "x", "2,", "2(x3", "-1"})
        EXPECT_EQ(
            launched(
                {{"SLURM_LOCALID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", bad}, {"SLURM_NODEID", "0"}})
                .local_size,
            -1)
            << bad;
    EXPECT_EQ(launched({{"SLURM_LOCALID", "1"}, {"SLURM_STEP_TASKS_PER_NODE", "4"}}).local_size,
              -1); // no SLURM_NODEID
}

TEST(PlacementLauncher, TorchrunAndMalformed) {
    tpd_rank_place p = launched({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
    EXPECT_EQ(p.local_rank, 1);
    EXPECT_EQ(p.local_size, 2);
    EXPECT_STREQ(p.size_var, "LOCAL_WORLD_SIZE");
    p = launched({{"LOCAL_RANK", "1x"}, {"LOCAL_WORLD_SIZE", ""}});
    EXPECT_EQ(p.local_rank, -1);
    EXPECT_EQ(p.local_size, -1);
}

TEST(PlacementLauncher, NoLauncherIsNotChecked) {
    tpd_rank_place p = launched({});
    EXPECT_EQ(p.local_rank, -1);
    EXPECT_EQ(p.local_size, -1);
    EXPECT_STREQ(p.rank_var, "");
    int w;
    Lines l = describe_places(2, 1, 1, {launched({}, "a"), launched({}, "a")}, &w);
    EXPECT_EQ(w, 0);
    EXPECT_TRUE(l.warn.empty());
    ASSERT_EQ(l.info.size(), 2u);
    EXPECT_EQ(l.info[1], "host a: ranks 0-1 (no node-local ranks from the launcher)");
}

TEST(PlacementLauncher, WrongCountNamesTheVariable) {
    // mpirun told every rank of two hosts of 2 that 4 share its node
    std::vector<tpd_rank_place> p;
    for (int r = 0; r < 4; r++) {
        std::string local = std::to_string(r % 2);
        p.push_back(launched(
            {{"OMPI_COMM_WORLD_LOCAL_RANK", local.c_str()}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}},
            r < 2 ? "a" : "b"));
    }
    int w;
    Lines l = describe_places(2, 2, 1, p, &w);
    EXPECT_EQ(w, 2);
    ASSERT_EQ(l.warn.size(), 2u);
    EXPECT_NE(l.warn[0].find("host a runs 2 ranks, but the launcher told rank 0 that 4 share its "
                             "node (OMPI_COMM_WORLD_LOCAL_SIZE)"),
              std::string::npos)
        << l.warn[0];
    EXPECT_NE(l.warn[1].find("host b runs 2 ranks, but the launcher told rank 2 that 4 share its "
                             "node (OMPI_COMM_WORLD_LOCAL_SIZE)"),
              std::string::npos)
        << l.warn[1];
    // the same launch with the right count passes
    for (auto &q : p)
        q.local_size = 2;
    l = describe_places(2, 2, 1, p, &w);
    EXPECT_EQ(w, 0);
    EXPECT_EQ(l.info[1], "host a: ranks 0-1 (local ranks 0-1 of 2)");
}

TEST(PlacementLauncher, RepeatedLocalRankNamesTheVariable) {
    // srun gave both ranks of host a local id 0
    std::vector<tpd_rank_place> p(
        2, launched(
               {{"SLURM_LOCALID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_NODEID", "0"}},
               "a"));
    int w;
    Lines l = describe_places(2, 1, 1, p, &w);
    EXPECT_EQ(w, 1);
    ASSERT_EQ(l.warn.size(), 1u);
    EXPECT_NE(l.warn[0].find("local ranks (0,0) are not 0..1, each once (SLURM_LOCALID)"),
              std::string::npos)
        << l.warn[0];
}
