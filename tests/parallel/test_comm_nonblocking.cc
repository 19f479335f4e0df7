// Non-blocking collectives (tpd_comm_iallreduce, _ireduce_scatter, _iallgather, polled with
// tpd_comm_test) on the MPI backend, inside one mpirun -np 4, and on the self backend.
// Inputs are small integers known on every rank, so sums are exact and each result is
// checked against a reference computed locally; on 2-rank communicators (where a float sum
// does not depend on the order) the results must also be bitwise equal to the blocking
// calls' on the same non-integer input. In-place forms are those the data-parallel code
// uses: reduce-scatter into recv = send + rank*recvcount, all-gather from send = recv +
// rank*sendcount.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

extern "C" {
#include "base/clock.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"
}

#include "common/mpi_tests.h"

namespace {

tpd_comm *g_world = nullptr;

template <class T> struct Dtype;
template <> struct Dtype<float> { static constexpr tpd_dtype value = TPD_DTYPE_F32; };
template <> struct Dtype<double> { static constexpr tpd_dtype value = TPD_DTYPE_F64; };

// Rank r's element i: an integer in [-44, 44], so any sum over 4 ranks is exact in f32.
template <class T> T val(int r, size_t i) {
    return (T)(((int)((i * 7 + (size_t)r * 13) % 23) - 11) * (r + 1));
}

template <class T> T reduce_ref(tpd_comm_op op, int size, size_t i) {
    T acc = val<T>(0, i);
    for (int r = 1; r < size; r++)
        acc = op == TPD_COMM_OP_SUM ? acc + val<T>(r, i) : std::max(acc, val<T>(r, i));
    return acc;
}

const char *op_name(tpd_comm_op op) {
    return op == TPD_COMM_OP_SUM ? "sum" : "max";
}

// Polls req with tpd_comm_test until it reports done (the polling alone must move the
// operation on: nothing else enters MPI meanwhile); a done request stays done. Does not
// wait. Returns false when it failed or did not complete within 60 s.
bool poll(tpd_comm *c, tpd_comm_req *req) {
    double t0 = tpd_clock_s();
    int done = 0;
    while (!done) {
        if (tpd_comm_test(c, req, &done) != TPD_OK) {
            ADD_FAILURE() << "tpd_comm_test failed";
            return false;
        }
        if (!done && tpd_clock_s() - t0 > 60) {
            ADD_FAILURE() << "tpd_comm_test never reported done";
            return false;
        }
    }
    done = 0;
    EXPECT_EQ(tpd_comm_test(c, req, &done), TPD_OK);
    EXPECT_EQ(done, 1) << "a completed request must stay completed";
    return true;
}

// ---- each op against its reference, in place and not, f32 and f64, sum and max ----

template <class T> void check_iallreduce(tpd_comm *c, size_t n) {
    const tpd_dtype dt = Dtype<T>::value;
    int rank = tpd_comm_rank(c), size = tpd_comm_size(c);
    for (tpd_comm_op op : {TPD_COMM_OP_SUM, TPD_COMM_OP_MAX}) {
        for (int in_place = 0; in_place < 2; in_place++) {
            SCOPED_TRACE(testing::Message()
                         << tpd_comm_name(c) << " iallreduce " << sizeof(T) * 8 << "-bit "
                         << op_name(op) << (in_place ? " in place" : " out of place"));
            std::vector<T> send(n), recv(n, (T)-1000);
            for (size_t i = 0; i < n; i++)
                send[i] = val<T>(rank, i);
            T *out = in_place ? send.data() : recv.data();
            tpd_comm_req *req = nullptr;
            ASSERT_EQ(tpd_comm_iallreduce(c, send.data(), out, n, dt, op, nullptr, &req), TPD_OK);
            ASSERT_TRUE(poll(c, req));
            ASSERT_EQ(tpd_comm_wait(c, req), TPD_OK);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += out[i] != reduce_ref<T>(op, size, i);
            EXPECT_EQ(bad, 0u);
            if (!in_place) // out of place leaves send alone
                for (size_t i = 0; i < n; i++)
                    ASSERT_EQ(send[i], val<T>(rank, i));
        }
    }
}

template <class T> void check_ireduce_scatter(tpd_comm *c, size_t block) {
    const tpd_dtype dt = Dtype<T>::value;
    int rank = tpd_comm_rank(c), size = tpd_comm_size(c);
    size_t n = block * (size_t)size;
    for (tpd_comm_op op : {TPD_COMM_OP_SUM, TPD_COMM_OP_MAX}) {
        for (int in_place = 0; in_place < 2; in_place++) {
            SCOPED_TRACE(testing::Message()
                         << tpd_comm_name(c) << " ireduce_scatter " << sizeof(T) * 8 << "-bit "
                         << op_name(op) << (in_place ? " in place" : " out of place"));
            std::vector<T> send(n), recv(block, (T)-1000);
            for (size_t i = 0; i < n; i++)
                send[i] = val<T>(rank, i);
            T *out = in_place ? send.data() + (size_t)rank * block : recv.data();
            tpd_comm_req *req = nullptr;
            ASSERT_EQ(tpd_comm_ireduce_scatter(c, send.data(), out, block, dt, op, nullptr, &req),
                      TPD_OK);
            ASSERT_TRUE(poll(c, req));
            // done means done: the in-place result is in its block before the wait
            size_t bad = 0;
            for (size_t j = 0; j < block; j++)
                bad += out[j] != reduce_ref<T>(op, size, (size_t)rank * block + j);
            EXPECT_EQ(bad, 0u) << "after test reported done";
            ASSERT_EQ(tpd_comm_wait(c, req), TPD_OK);
            bad = 0;
            for (size_t j = 0; j < block; j++)
                bad += out[j] != reduce_ref<T>(op, size, (size_t)rank * block + j);
            EXPECT_EQ(bad, 0u) << "after wait";
        }
    }
}

template <class T> void check_iallgather(tpd_comm *c, size_t block) {
    const tpd_dtype dt = Dtype<T>::value;
    int rank = tpd_comm_rank(c), size = tpd_comm_size(c);
    size_t n = block * (size_t)size;
    for (int in_place = 0; in_place < 2; in_place++) {
        SCOPED_TRACE(testing::Message() << tpd_comm_name(c) << " iallgather " << sizeof(T) * 8
                                        << "-bit" << (in_place ? " in place" : " out of place"));
        std::vector<T> send(block), recv(n, (T)-1000);
        T *mine = recv.data() + (size_t)rank * block;
        T *src = in_place ? mine : send.data();
        for (size_t j = 0; j < block; j++)
            src[j] = val<T>(rank, j);
        tpd_comm_req *req = nullptr;
        ASSERT_EQ(tpd_comm_iallgather(c, src, recv.data(), block, dt, nullptr, &req), TPD_OK);
        ASSERT_TRUE(poll(c, req));
        ASSERT_EQ(tpd_comm_wait(c, req), TPD_OK);
        size_t bad = 0;
        for (int r = 0; r < size; r++)
            for (size_t j = 0; j < block; j++)
                bad += recv[(size_t)r * block + j] != val<T>(r, j);
        EXPECT_EQ(bad, 0u);
    }
}

TEST(CommNonblocking, AllreduceMatchesReference) {
    check_iallreduce<float>(g_world, 1003);
    check_iallreduce<double>(g_world, 1003);
    check_iallreduce<float>(g_world, (size_t)1 << 20); // large enough for a pipelined algorithm
}

TEST(CommNonblocking, ReduceScatterMatchesReference) {
    check_ireduce_scatter<float>(g_world, 257);
    check_ireduce_scatter<double>(g_world, 257);
    check_ireduce_scatter<float>(g_world, (size_t)1 << 18);
}

TEST(CommNonblocking, AllgatherMatchesReference) {
    check_iallgather<float>(g_world, 129);
    check_iallgather<double>(g_world, 129);
    check_iallgather<double>(g_world, (size_t)1 << 17);
}

TEST(CommNonblocking, SplitCommunicatorsMatchReference) {
    // The DP groups of a 2-way TP layout: {0, 2} and {1, 3}.
    tpd_comm *dp = nullptr;
    int rank = tpd_comm_rank(g_world);
    ASSERT_EQ(tpd_comm_split(g_world, rank % 2, rank, "dp", &dp), TPD_OK);
    ASSERT_NE(dp, nullptr);
    check_iallreduce<float>(dp, 1000);
    check_ireduce_scatter<double>(dp, 100);
    check_iallgather<float>(dp, 100);
    tpd_comm_destroy(dp);
}

// ---- several outstanding at once, interleaved with point-to-point ----

TEST(CommNonblocking, ManyOutstandingInterleavedWithP2P) {
    tpd_comm *c = g_world;
    int rank = tpd_comm_rank(c), size = tpd_comm_size(c);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    const size_t n = 5000, block = 700, p2p_n = 3000;

    // ZeRO-1 style: gradients reduce-scattered in place, parameters all-gathered in place,
    // a norm all-reduced, activations passed around the ring meanwhile.
    std::vector<float> grads(block * (size_t)size), grads2(block * (size_t)size);
    std::vector<double> params(block * (size_t)size, -1.0), norm(n), norm_out(n, 0.0);
    std::vector<float> act_out(p2p_n), act_in(p2p_n, 0.0f), act2_out(p2p_n), act2_in(p2p_n);
    for (size_t i = 0; i < grads.size(); i++) {
        grads[i] = val<float>(rank, i);
        grads2[i] = val<float>(rank, i + 11);
    }
    for (size_t j = 0; j < block; j++)
        params[(size_t)rank * block + j] = val<double>(rank, j);
    for (size_t i = 0; i < n; i++)
        norm[i] = val<double>(rank, i + 5);
    for (size_t i = 0; i < p2p_n; i++) {
        act_out[i] = val<float>(rank, i + 3);
        act2_out[i] = val<float>(rank, i + 9);
    }

    float *g_mine = grads.data() + (size_t)rank * block;
    double *p_mine = params.data() + (size_t)rank * block;
    tpd_comm_req *rq[8] = {};
    ASSERT_EQ(tpd_comm_irecv(c, act_in.data(), p2p_n, TPD_DTYPE_F32, prev, 1, nullptr, &rq[0]),
              TPD_OK);
    ASSERT_EQ(tpd_comm_ireduce_scatter(c, grads.data(), g_mine, block, TPD_DTYPE_F32,
                                       TPD_COMM_OP_SUM, nullptr, &rq[1]),
              TPD_OK);
    ASSERT_EQ(tpd_comm_isend(c, act_out.data(), p2p_n, TPD_DTYPE_F32, next, 1, nullptr, &rq[2]),
              TPD_OK);
    ASSERT_EQ(tpd_comm_iallgather(c, p_mine, params.data(), block, TPD_DTYPE_F64, nullptr, &rq[3]),
              TPD_OK);
    ASSERT_EQ(tpd_comm_iallreduce(c, norm.data(), norm_out.data(), n, TPD_DTYPE_F64,
                                  TPD_COMM_OP_MAX, nullptr, &rq[4]),
              TPD_OK);
    ASSERT_EQ(tpd_comm_isend(c, act2_out.data(), p2p_n, TPD_DTYPE_F32, prev, 2, nullptr, &rq[5]),
              TPD_OK);
    ASSERT_EQ(tpd_comm_iallreduce(c, grads2.data(), grads2.data(), grads2.size(), TPD_DTYPE_F32,
                                  TPD_COMM_OP_SUM, nullptr, &rq[6]),
              TPD_OK);
    ASSERT_EQ(tpd_comm_irecv(c, act2_in.data(), p2p_n, TPD_DTYPE_F32, next, 2, nullptr, &rq[7]),
              TPD_OK);

    // Poll all of them round robin, as the engine does between layers, until every one
    // reports done; then wait in an order unlike the posting one.
    int done[8] = {}, left = 8;
    double t0 = tpd_clock_s();
    while (left > 0 && tpd_clock_s() - t0 < 60)
        for (int k = 0; k < 8; k++)
            if (!done[k]) {
                ASSERT_EQ(tpd_comm_test(c, rq[k], &done[k]), TPD_OK);
                left -= done[k];
            }
    EXPECT_EQ(left, 0) << "requests still outstanding after 60 s of polling";
    for (int k : {6, 3, 0, 7, 1, 5, 4, 2})
        ASSERT_EQ(tpd_comm_wait(c, rq[k]), TPD_OK);

    size_t bad = 0;
    for (size_t j = 0; j < block; j++)
        bad += g_mine[j] != reduce_ref<float>(TPD_COMM_OP_SUM, size, (size_t)rank * block + j);
    EXPECT_EQ(bad, 0u) << "ireduce_scatter in place";
    bad = 0;
    for (int r = 0; r < size; r++)
        for (size_t j = 0; j < block; j++)
            bad += params[(size_t)r * block + j] != val<double>(r, j);
    EXPECT_EQ(bad, 0u) << "iallgather in place";
    bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += norm_out[i] != reduce_ref<double>(TPD_COMM_OP_MAX, size, i + 5);
    EXPECT_EQ(bad, 0u) << "iallreduce max";
    bad = 0;
    for (size_t i = 0; i < grads2.size(); i++)
        bad += grads2[i] != reduce_ref<float>(TPD_COMM_OP_SUM, size, i + 11);
    EXPECT_EQ(bad, 0u) << "iallreduce in place";
    bad = 0;
    for (size_t i = 0; i < p2p_n; i++) {
        bad += act_in[i] != val<float>(prev, i + 3);
        bad += act2_in[i] != val<float>(next, i + 9);
    }
    EXPECT_EQ(bad, 0u) << "p2p between the collectives";
}

// ---- bitwise equal to the blocking calls on 2 ranks ----

// Non-integer inputs: rounding happens, but a + b == b + a, so on 2 ranks the blocking and
// non-blocking algorithms must agree to the bit.
template <class T> T rough(int r, size_t i) {
    return (T)(std::sin(0.37 * (double)i + 1.3 * r) * 1000.0 / (double)(i % 97 + 1));
}

template <class T> void check_bitwise(tpd_comm *pair) {
    const tpd_dtype dt = Dtype<T>::value;
    int rank = tpd_comm_rank(pair);
    const size_t block = 4099, n = 2 * block;
    std::vector<T> in(n);
    for (size_t i = 0; i < n; i++)
        in[i] = rough<T>(tpd_comm_rank(g_world), i);
    for (tpd_comm_op op : {TPD_COMM_OP_SUM, TPD_COMM_OP_MAX}) {
        for (int in_place = 0; in_place < 2; in_place++) {
            SCOPED_TRACE(testing::Message() << sizeof(T) * 8 << "-bit " << op_name(op)
                                            << (in_place ? " in place" : " out of place"));
            // all-reduce
            std::vector<T> b_send = in, nb_send = in, b_out(n), nb_out(n);
            T *b = in_place ? b_send.data() : b_out.data();
            T *nb = in_place ? nb_send.data() : nb_out.data();
            ASSERT_EQ(tpd_comm_allreduce(pair, b_send.data(), b, n, dt, op, nullptr), TPD_OK);
            tpd_comm_req *req = nullptr;
            ASSERT_EQ(tpd_comm_iallreduce(pair, nb_send.data(), nb, n, dt, op, nullptr, &req),
                      TPD_OK);
            ASSERT_TRUE(poll(pair, req));
            ASSERT_EQ(tpd_comm_wait(pair, req), TPD_OK);
            EXPECT_EQ(0, std::memcmp(b, nb, n * sizeof(T))) << "allreduce";

            // reduce-scatter
            b_send = in;
            nb_send = in;
            b = in_place ? b_send.data() + (size_t)rank * block : b_out.data();
            nb = in_place ? nb_send.data() + (size_t)rank * block : nb_out.data();
            ASSERT_EQ(tpd_comm_reduce_scatter(pair, b_send.data(), b, block, dt, op, nullptr),
                      TPD_OK);
            ASSERT_EQ(
                tpd_comm_ireduce_scatter(pair, nb_send.data(), nb, block, dt, op, nullptr, &req),
                TPD_OK);
            ASSERT_TRUE(poll(pair, req));
            ASSERT_EQ(tpd_comm_wait(pair, req), TPD_OK);
            EXPECT_EQ(0, std::memcmp(b, nb, block * sizeof(T))) << "reduce_scatter";
        }
    }
    // all-gather (no arithmetic, but the same in-place rules)
    for (int in_place = 0; in_place < 2; in_place++) {
        std::vector<T> b_out(n, (T)0), nb_out(n, (T)0);
        const T *b_src = in_place ? b_out.data() + (size_t)rank * block : in.data();
        const T *nb_src = in_place ? nb_out.data() + (size_t)rank * block : in.data();
        if (in_place) {
            std::memcpy(b_out.data() + (size_t)rank * block, in.data(), block * sizeof(T));
            std::memcpy(nb_out.data() + (size_t)rank * block, in.data(), block * sizeof(T));
        }
        ASSERT_EQ(tpd_comm_allgather(pair, b_src, b_out.data(), block, dt, nullptr), TPD_OK);
        tpd_comm_req *req = nullptr;
        ASSERT_EQ(tpd_comm_iallgather(pair, nb_src, nb_out.data(), block, dt, nullptr, &req),
                  TPD_OK);
        ASSERT_TRUE(poll(pair, req));
        ASSERT_EQ(tpd_comm_wait(pair, req), TPD_OK);
        EXPECT_EQ(0, std::memcmp(b_out.data(), nb_out.data(), n * sizeof(T)))
            << "allgather" << (in_place ? " in place" : "");
    }
}

// tpd_comm_alltoallv (expert parallelism's token exchange): rank r sends (r + 2p) % 3
// elements to rank p (so some blocks are empty, the own one included where the count is
// 0), packed with its displacements; each block's values name (source, destination, i),
// and every received block is checked against them. On the world and on 2-rank splits.
TEST(CommNonblocking, AlltoallvDeliversEveryBlock) {
    auto count = [](int src, int dst) { return (size_t)((src + 2 * dst) % 3); };
    auto value = [](int src, int dst, size_t i) { return (int32_t)(1000 * src + 10 * dst + i); };
    tpd_comm *half = nullptr;
    int me = tpd_comm_rank(g_world);
    ASSERT_EQ(tpd_comm_split(g_world, me / 2, me, "half", &half), TPD_OK);
    for (tpd_comm *c : {g_world, half}) {
        int n = tpd_comm_size(c), r = tpd_comm_rank(c);
        std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
        size_t ns = 0, nr = 0;
        for (int p = 0; p < n; p++) {
            sc[p] = count(r, p);
            sd[p] = ns;
            ns += sc[p];
            rc[p] = count(p, r);
            rd[p] = nr + 1; /* a gap before each block: displacements are honoured */
            nr += rc[p] + 1;
        }
        std::vector<int32_t> send(ns + 1), recv(nr + 1, -1);
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < sc[p]; i++)
                send[sd[p] + i] = value(r, p, i);
        ASSERT_EQ(tpd_comm_alltoallv(c, send.data(), sc.data(), sd.data(), recv.data(), rc.data(),
                                     rd.data(), TPD_DTYPE_I32, 77, nullptr),
                  TPD_OK);
        for (int p = 0; p < n; p++) {
            for (size_t i = 0; i < rc[p]; i++)
                EXPECT_EQ(recv[rd[p] + i], value(p, r, i)) << "from " << p << " element " << i;
            EXPECT_EQ(recv[rd[p] - 1], -1) << "the gap before rank " << p << "'s block";
        }
    }
    tpd_comm_destroy(half);
}

TEST(CommNonblocking, TwoRanksBitwiseEqualToBlocking) {
    int rank = tpd_comm_rank(g_world);
    tpd_comm *pair = nullptr;
    ASSERT_EQ(tpd_comm_split(g_world, rank / 2, rank, "pair", &pair), TPD_OK);
    ASSERT_NE(pair, nullptr);
    if (tpd_comm_size(pair) == 2) {
        check_bitwise<float>(pair);
        check_bitwise<double>(pair);
    }
    tpd_comm_destroy(pair);
}

// ---- edge cases ----

TEST(CommNonblocking, NullRequestIsDone) {
    int done = 0;
    EXPECT_EQ(tpd_comm_test(g_world, nullptr, &done), TPD_OK);
    EXPECT_EQ(done, 1);
    EXPECT_EQ(tpd_comm_wait(g_world, nullptr), TPD_OK);
}

TEST(CommNonblocking, ZeroCountCompletes) {
    float x = 0;
    tpd_comm_req *req = nullptr;
    ASSERT_EQ(
        tpd_comm_iallreduce(g_world, &x, &x, 0, TPD_DTYPE_F32, TPD_COMM_OP_SUM, nullptr, &req),
        TPD_OK);
    ASSERT_TRUE(poll(g_world, req));
    EXPECT_EQ(tpd_comm_wait(g_world, req), TPD_OK);
}

// Reduce-scatter and all-gather blocks go to MPI as one int count (all-reduce is chunked,
// so it has no such limit). A count past it fails before touching any buffer, so small
// buffers stand in for huge ones; every rank fails alike, so nothing is left posted.
TEST(CommNonblocking, OverIntMaxCountFailsLikeBlocking) {
    const size_t huge = (size_t)INT32_MAX + 1;
    float a[4] = {}, b[4] = {};
    tpd_status blocking =
        tpd_comm_reduce_scatter(g_world, a, b, huge, TPD_DTYPE_F32, TPD_COMM_OP_SUM, nullptr);
    EXPECT_EQ(blocking, TPD_ERR_UNSUPPORTED);
    tpd_comm_req *sentinel = reinterpret_cast<tpd_comm_req *>(&a[0]);
    tpd_comm_req *req = sentinel;
    EXPECT_EQ(tpd_comm_ireduce_scatter(g_world, a, b, huge, TPD_DTYPE_F32, TPD_COMM_OP_SUM, nullptr,
                                       &req),
              blocking);
    EXPECT_EQ(req, sentinel) << "the request must be written only on success";

    blocking = tpd_comm_allgather(g_world, a, b, huge, TPD_DTYPE_F32, nullptr);
    EXPECT_EQ(blocking, TPD_ERR_UNSUPPORTED);
    EXPECT_EQ(tpd_comm_iallgather(g_world, a, b, huge, TPD_DTYPE_F32, nullptr, &req), blocking);
    EXPECT_EQ(req, sentinel);
    // the communicator is still usable
    check_iallreduce<float>(g_world, 10);
}

// ---- the self backend: done at post ----

TEST(CommNonblocking, SelfBackendCompletesAtPost) {
    tpd_comm *c = nullptr;
    ASSERT_EQ(tpd_comm_self_create(&c), TPD_OK);
    check_iallreduce<float>(c, 100);
    check_iallreduce<double>(c, 100);
    check_ireduce_scatter<float>(c, 100);
    check_ireduce_scatter<double>(c, 100);
    check_iallgather<float>(c, 100);
    check_iallgather<double>(c, 100);
    tpd_comm_destroy(c);
}

// On ranks other than 0 (whose gtest output is silenced): each failure, with the rank.
class RankFailures : public ::testing::EmptyTestEventListener {
  public:
    explicit RankFailures(int rank) : rank_(rank) {}
    void OnTestPartResult(const ::testing::TestPartResult &r) override {
        if (r.failed())
            fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                    r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
    }

  private:
    int rank_;
};

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    if (tpd_comm_mpi_start(&g_world) != TPD_OK) return 1;
    tpd_comm_mpi_set_timeout(120); // a hang ends the job instead of the CTest timeout
    int rc = tiny::mpi_run_all_tests(g_world, new RankFailures(tpd_comm_rank(g_world)));
    tpd_comm_mpi_finish(g_world);
    return rc;
}
