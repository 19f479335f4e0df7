// The NCCL and staged communicators on one rank: a world of size 1 (a singleton MPI
// process, no mpirun needed), split into size-1 TP/DP/PP communicators; all-reduce,
// all-gather, reduce-scatter, broadcast and p2p to self must return the right values, and
// so must the non-blocking collectives, polled with tpd_comm_test and ordered on the
// caller's stream by tpd_comm_wait.
// Label `gpu`: every test skips when no CUDA device is visible, and MPI is only
// initialized when one is.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/gpu.h"

#include <cuda_runtime.h>
#include <unistd.h>

extern "C" {
#include "base/bf16.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
}

namespace {

bool g_mpi_ready = false;
tpd_comm *g_mpi = nullptr; // the MPI world

#define SKIP_WITHOUT_GPU()                                                                         \
    do {                                                                                           \
        TPD_SKIP_WITHOUT_GPU();                                                                    \
        if (!g_mpi_ready) TPD_GPU_SKIP("MPI did not start");                                       \
    } while (0)

struct Dev {
    void *p = nullptr;
    size_t bytes = 0;
    explicit Dev(size_t b) : bytes(b) {
        EXPECT_EQ(cudaMalloc(&p, b), cudaSuccess);
    }
    ~Dev() {
        cudaFree(p);
    }
    void put(const void *h) {
        EXPECT_EQ(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
    void get(void *h) {
        EXPECT_EQ(cudaMemcpy(h, p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    }
};

// Checks one communicator of size 1: every collective is the identity (or a copy).
void check_size_one(tpd_comm *c, cudaStream_t s) {
    ASSERT_NE(c, nullptr);
    ASSERT_EQ(tpd_comm_size(c), 1);
    ASSERT_EQ(tpd_comm_rank(c), 0);
    const size_t n = 1000;
    std::vector<float> a(n), out(n);
    for (size_t i = 0; i < n; i++)
        a[i] = 0.25f * (float)i - 7.0f;

    Dev src(n * 4), dst(n * 4);
    src.put(a.data());
    ASSERT_EQ(tpd_comm_allreduce(c, src.p, dst.p, n, TPD_DTYPE_F32, TPD_COMM_OP_SUM, s), TPD_OK);
    ASSERT_EQ(tpd_comm_sync(c, s), TPD_OK);
    dst.get(out.data());
    EXPECT_EQ(out, a) << tpd_comm_name(c) << " allreduce f32";

    ASSERT_EQ(tpd_comm_allreduce(c, src.p, dst.p, n, TPD_DTYPE_F32, TPD_COMM_OP_MAX, s), TPD_OK);
    ASSERT_EQ(tpd_comm_sync(c, s), TPD_OK);
    dst.get(out.data());
    EXPECT_EQ(out, a) << tpd_comm_name(c) << " allreduce max";

    // bf16 in place
    std::vector<uint16_t> hb(n), hb_out(n);
    for (size_t i = 0; i < n; i++)
        hb[i] = tpd_bf16_from_f32(a[i]);
    Dev b16(n * 2);
    b16.put(hb.data());
    ASSERT_EQ(tpd_comm_allreduce(c, b16.p, b16.p, n, TPD_DTYPE_BF16, TPD_COMM_OP_SUM, s), TPD_OK);
    ASSERT_EQ(tpd_comm_sync(c, s), TPD_OK);
    b16.get(hb_out.data());
    EXPECT_EQ(hb_out, hb) << tpd_comm_name(c) << " allreduce bf16";

    ASSERT_EQ(tpd_comm_allgather(c, src.p, dst.p, n, TPD_DTYPE_F32, s), TPD_OK);
    ASSERT_EQ(tpd_comm_sync(c, s), TPD_OK);
    dst.get(out.data());
    EXPECT_EQ(out, a) << tpd_comm_name(c) << " allgather";

    ASSERT_EQ(tpd_comm_reduce_scatter(c, src.p, dst.p, n, TPD_DTYPE_F32, TPD_COMM_OP_SUM, s),
              TPD_OK);
    ASSERT_EQ(tpd_comm_sync(c, s), TPD_OK);
    dst.get(out.data());
    EXPECT_EQ(out, a) << tpd_comm_name(c) << " reduce_scatter";

    ASSERT_EQ(tpd_comm_broadcast(c, src.p, n, TPD_DTYPE_F32, 0, s), TPD_OK);
    ASSERT_EQ(tpd_comm_sync(c, s), TPD_OK);
    src.get(out.data());
    EXPECT_EQ(out, a) << tpd_comm_name(c) << " broadcast";

    // p2p to self: both sides inside one group, as NCCL requires.
    Dev rcv(n * 4);
    EXPECT_EQ(cudaMemset(rcv.p, 0, n * 4), cudaSuccess);
    tpd_comm_req *rs = nullptr, *rr = nullptr;
    ASSERT_EQ(tpd_comm_group_start(c), TPD_OK);
    ASSERT_EQ(tpd_comm_isend(c, src.p, n, TPD_DTYPE_F32, 0, 7, s, &rs), TPD_OK);
    ASSERT_EQ(tpd_comm_irecv(c, rcv.p, n, TPD_DTYPE_F32, 0, 7, s, &rr), TPD_OK);
    ASSERT_EQ(tpd_comm_group_end(c), TPD_OK);
    ASSERT_EQ(tpd_comm_wait(c, rr), TPD_OK);
    ASSERT_EQ(tpd_comm_wait(c, rs), TPD_OK);
    rcv.get(out.data());
    EXPECT_EQ(out, a) << tpd_comm_name(c) << " p2p to self";

    ASSERT_EQ(tpd_comm_barrier(c), TPD_OK);
}

// Polls req until tpd_comm_test reports it done (60 s at most).
void poll_done(tpd_comm *c, tpd_comm_req *req) {
    int done = 0;
    for (int i = 0; i < 60000 && !done; i++) {
        ASSERT_EQ(tpd_comm_test(c, req, &done), TPD_OK);
        if (!done) usleep(1000);
    }
    EXPECT_EQ(done, 1) << tpd_comm_name(c) << ": request never completed";
}

bool is_nccl(tpd_comm *c) {
    return std::strcmp(tpd_comm_backend(c), "nccl") == 0;
}

// The non-blocking collectives on a communicator of size 1: copies that tpd_comm_test sees
// complete. Reads go through the caller's stream after tpd_comm_wait, which must order it
// after the collective (NCCL runs it on the communication stream); the buffer is cleared
// on that stream first, which the collective must see too.
void check_nonblocking_size_one(tpd_comm *c, cudaStream_t s) {
    const size_t n = 1000;
    std::vector<float> a(n), out(n);
    for (size_t i = 0; i < n; i++)
        a[i] = 0.5f * (float)i - 100.0f;
    Dev src(n * 4), dst(n * 4);
    src.put(a.data());
    const char *what[3] = {"iallreduce", "ireduce_scatter", "iallgather"};
    for (int k = 0; k < 3; k++) {
        ASSERT_EQ(cudaMemsetAsync(dst.p, 0, n * 4, s), cudaSuccess);
        tpd_comm_req *req = nullptr;
        tpd_status st = k == 0   ? tpd_comm_iallreduce(c, src.p, dst.p, n, TPD_DTYPE_F32,
                                                       TPD_COMM_OP_SUM, s, &req)
                        : k == 1 ? tpd_comm_ireduce_scatter(c, src.p, dst.p, n, TPD_DTYPE_F32,
                                                            TPD_COMM_OP_SUM, s, &req)
                                 : tpd_comm_iallgather(c, src.p, dst.p, n, TPD_DTYPE_F32, s, &req);
        ASSERT_EQ(st, TPD_OK) << what[k];
        poll_done(c, req);
        ASSERT_EQ(tpd_comm_wait(c, req), TPD_OK);
        ASSERT_EQ(cudaMemcpyAsync(out.data(), dst.p, n * 4, cudaMemcpyDeviceToHost, s),
                  cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        EXPECT_EQ(out, a) << tpd_comm_name(c) << " " << what[k];
    }

    // In place: f64 max, bf16 sum.
    std::vector<double> d(n), d_out(n);
    for (size_t i = 0; i < n; i++)
        d[i] = 1.0 / (double)(i + 3);
    Dev d64(n * 8);
    d64.put(d.data());
    tpd_comm_req *req = nullptr;
    ASSERT_EQ(tpd_comm_iallreduce(c, d64.p, d64.p, n, TPD_DTYPE_F64, TPD_COMM_OP_MAX, s, &req),
              TPD_OK);
    ASSERT_EQ(tpd_comm_wait(c, req), TPD_OK);
    ASSERT_EQ(tpd_comm_sync(c, s), TPD_OK);
    d64.get(d_out.data());
    EXPECT_EQ(d_out, d) << tpd_comm_name(c) << " iallreduce f64 max in place";
    std::vector<uint16_t> hb(n), hb_out(n);
    for (size_t i = 0; i < n; i++)
        hb[i] = tpd_bf16_from_f32(a[i]);
    Dev b16(n * 2);
    b16.put(hb.data());
    ASSERT_EQ(
        tpd_comm_ireduce_scatter(c, b16.p, b16.p, n, TPD_DTYPE_BF16, TPD_COMM_OP_SUM, s, &req),
        TPD_OK);
    ASSERT_EQ(tpd_comm_wait(c, req), TPD_OK);
    ASSERT_EQ(tpd_comm_sync(c, s), TPD_OK);
    b16.get(hb_out.data());
    EXPECT_EQ(hb_out, hb) << tpd_comm_name(c) << " ireduce_scatter bf16 in place";

    // Several outstanding, around a send/receive pair to self (outside a group the NCCL
    // backend holds the send and issues it with the receive; a collective between them
    // would issue it alone, which deadlocks on one rank).
    Dev ar(n * 4), rs(n * 4), ag(n * 4), rcv(n * 4);
    tpd_comm_req *rq[5] = {};
    ASSERT_EQ(tpd_comm_iallreduce(c, src.p, ar.p, n, TPD_DTYPE_F32, TPD_COMM_OP_SUM, s, &rq[0]),
              TPD_OK);
    ASSERT_EQ(tpd_comm_isend(c, src.p, n, TPD_DTYPE_F32, 0, 3, s, &rq[1]), TPD_OK);
    if (is_nccl(c)) { // held: not issued, so not done, and testing does not issue it
        int done = 1;
        ASSERT_EQ(tpd_comm_test(c, rq[1], &done), TPD_OK);
        EXPECT_EQ(done, 0);
    }
    ASSERT_EQ(tpd_comm_irecv(c, rcv.p, n, TPD_DTYPE_F32, 0, 3, s, &rq[2]), TPD_OK);
    ASSERT_EQ(
        tpd_comm_ireduce_scatter(c, src.p, rs.p, n, TPD_DTYPE_F32, TPD_COMM_OP_MAX, s, &rq[3]),
        TPD_OK);
    ASSERT_EQ(tpd_comm_iallgather(c, src.p, ag.p, n, TPD_DTYPE_F32, s, &rq[4]), TPD_OK);
    for (int k : {4, 2, 0, 3, 1})
        poll_done(c, rq[k]);
    for (int k : {3, 0, 4, 1, 2})
        ASSERT_EQ(tpd_comm_wait(c, rq[k]), TPD_OK);
    ASSERT_EQ(tpd_comm_sync(c, s), TPD_OK);
    Dev *bufs[4] = {&ar, &rs, &ag, &rcv};
    const char *names[4] = {"iallreduce", "ireduce_scatter", "iallgather", "p2p"};
    for (int k = 0; k < 4; k++) {
        bufs[k]->get(out.data());
        EXPECT_EQ(out, a) << tpd_comm_name(c) << " outstanding " << names[k];
    }

    // Inside an explicit group the collective is issued at group_end.
    ASSERT_EQ(cudaMemsetAsync(dst.p, 0, n * 4, s), cudaSuccess);
    ASSERT_EQ(tpd_comm_group_start(c), TPD_OK);
    ASSERT_EQ(tpd_comm_iallreduce(c, src.p, dst.p, n, TPD_DTYPE_F32, TPD_COMM_OP_SUM, s, &req),
              TPD_OK);
    if (is_nccl(c)) {
        int done = 1;
        ASSERT_EQ(tpd_comm_test(c, req, &done), TPD_OK);
        EXPECT_EQ(done, 0) << "done before its group ended";
    }
    ASSERT_EQ(tpd_comm_group_end(c), TPD_OK);
    poll_done(c, req);
    ASSERT_EQ(tpd_comm_wait(c, req), TPD_OK);
    ASSERT_EQ(tpd_comm_sync(c, s), TPD_OK);
    dst.get(out.data());
    EXPECT_EQ(out, a) << tpd_comm_name(c) << " iallreduce in a group";

    int done = 0;
    EXPECT_EQ(tpd_comm_test(c, nullptr, &done), TPD_OK);
    EXPECT_EQ(done, 1);
    EXPECT_EQ(tpd_comm_wait(c, nullptr), TPD_OK);
}

void check_world_and_splits(tpd_comm *world) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    check_size_one(world, s);
    check_nonblocking_size_one(world, s);
    // Megatron order on one rank: tp = dp = pp = 0.
    const char *names[3] = {"tp", "dp", "pp"};
    for (int k = 0; k < 3; k++) {
        tpd_comm *sub = nullptr;
        ASSERT_EQ(tpd_comm_split(world, 0, 0, names[k], &sub), TPD_OK);
        ASSERT_NE(sub, nullptr);
        EXPECT_STREQ(tpd_comm_name(sub), names[k]);
        check_size_one(sub, s);
        check_nonblocking_size_one(sub, s);
        tpd_comm_destroy(sub);
    }
    cudaStreamDestroy(s);
}

TEST(CudaNccl, SingleRankWorldAndSplits) {
    SKIP_WITHOUT_GPU();
    tpd_comm *world = nullptr;
    ASSERT_EQ(tpd_comm_nccl_world(g_mpi, 0, 60.0, &world), TPD_OK);
    EXPECT_STREQ(tpd_comm_backend(world), "nccl");
    check_world_and_splits(world);
    tpd_comm_destroy(world);
}

TEST(CudaNccl, StagedSingleRankWorldAndSplits) {
    SKIP_WITHOUT_GPU();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    tpd_comm *mpi = nullptr, *world = nullptr;
    ASSERT_EQ(tpd_comm_mpi_world(&mpi), TPD_OK);
    ASSERT_EQ(tpd_comm_staged_create(mpi, &world), TPD_OK);
    EXPECT_STREQ(tpd_comm_backend(world), "staged");
    check_world_and_splits(world);
    tpd_comm_destroy(world);
}

} // namespace

int main(int argc, char **argv) {
    bool listing = false; /* checked before InitGoogleTest strips the gtest flags */
    for (int i = 1; i < argc; i++)
        if (std::strncmp(argv[i], "--gtest_list_tests", 18) == 0) listing = true;
    ::testing::InitGoogleTest(&argc, argv);
    // MPI only where the tests can run: test discovery and device-less machines skip it.
    if (!listing && tpd_kern_cuda_available()) g_mpi_ready = tpd_comm_mpi_start(&g_mpi) == TPD_OK;
    int rc = RUN_ALL_TESTS();
    if (g_mpi_ready) tpd_comm_mpi_finish(g_mpi);
    return rc;
}
