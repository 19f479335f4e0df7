// Compressed reductions (tpd_comm_iallreduce_wire, tpd_comm_ireduce_scatter_wire: bf16 on
// the wire, fp32 sums at the chunk's owner) on the MPI backend inside one mpirun -np 8,
// on communicators of 2, 4 and 8 ranks split from the world, and on the self backend.
//
// The bound. With u = 2^-8 (a bf16 rounding, relative: 8 significant bits) and inputs of one sign,
// the all-reduce rounds each contribution once (error <= u * sum|x|), sums n of them in fp32
// (<= (n-1) 2^-24 * sum|x|) and rounds the sum once more (<= u * |sum|):
//   |bf16-wire - exact| / |exact| <= 2u + (n-1) 2^-24 + u^2,
// and the fp32 reference all-reduce is itself off by up to (n-1) 2^-24, hence the test's
// bound 2^-7 + 2^-16 + 2 (n-1) 2^-24: about 2^-7 for every n. The reduce-scatter skips the
// last rounding: u + 2^-16 + 2 (n-1) 2^-24. A bf16 ring (the contrast, simulated here from
// the same inputs: the partial sum rounded to bf16 at each of its n-1 hops) is bounded by
// about (n+1) u instead, and its measured error grows with n (clearest in the root mean
// square, which for the bf16 wire falls with n as the contributions' roundings average). The
// measured errors are printed ("bf16-wire error") for the record.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

extern "C" {
#include "base/bf16.h"
#include "base/clock.h"
#include "parallel/comm.h"
#include "parallel/data/dp.h"
}

#include "common/mpi_tests.h"

namespace {

tpd_comm *g_world = nullptr;
const double kU = std::ldexp(1.0, -8); // 8 significant bits: half an ulp

// Rank r's element i: a positive value in [0.5, 1.5) with a full fp32 mantissa (a hash of
// r and i, so every rank knows every rank's input).
float val(int r, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)((r + 1) * 40503u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return 0.5f + (float)(h & 0xffffff) / (float)(1u << 24);
}

float bf16_round(float x) {
    return tpd_bf16_to_f32(tpd_bf16_from_f32(x));
}

// A bf16 ring's result for element i of chunk `chunk`: the partial sum starts at the rank
// after the chunk's owner and is rounded to bf16 at every hop (inputs in bf16, as a ring
// all-reduce of bf16 gradients has them).
float ring_bf16(int n, size_t i, int chunk) {
    int r = (chunk + 1) % n;
    float acc = bf16_round(val(r, i));
    for (int h = 1; h < n; h++) {
        r = (r + 1) % n;
        acc = bf16_round(acc + bf16_round(val(r, i)));
    }
    return acc;
}

double allreduce_bound(int n) {
    return 2 * kU + std::ldexp(1.0, -16) + 2.0 * (n - 1) * std::ldexp(1.0, -24);
}

double reduce_scatter_bound(int n) {
    return kU + std::ldexp(1.0, -16) + 2.0 * (n - 1) * std::ldexp(1.0, -24);
}

// Polls req with tpd_comm_test until done (nothing else enters MPI meanwhile), then waits.
void poll_wait(tpd_comm *c, tpd_comm_req *req) {
    double t0 = tpd_clock_s();
    int done = 0;
    while (!done) {
        ASSERT_EQ(tpd_comm_test(c, req, &done), TPD_OK);
        ASSERT_LT(tpd_clock_s() - t0, 60.0) << "tpd_comm_test never reported done";
    }
    ASSERT_EQ(tpd_comm_test(c, req, &done), TPD_OK);
    EXPECT_EQ(done, 1) << "a completed request must stay completed";
    ASSERT_EQ(tpd_comm_wait(c, req), TPD_OK);
}

struct Errors {
    double wire = 0, ring = 0;         // max relative
    double wire_rms = 0, ring_rms = 0; // root mean square relative
};

// max relative error of the bf16-wire all-reduce (against the fp32 all-reduce) and of the
// simulated bf16 ring, on communicator c.
Errors measure_allreduce(tpd_comm *c, size_t count) {
    int rank = tpd_comm_rank(c), n = tpd_comm_size(c);
    std::vector<float> x(count), ref(count), got(count, -1.0f);
    for (size_t i = 0; i < count; i++)
        x[i] = val(rank, i);
    EXPECT_EQ(
        tpd_comm_allreduce(c, x.data(), ref.data(), count, TPD_DTYPE_F32, TPD_COMM_OP_SUM, nullptr),
        TPD_OK);
    tpd_comm_req *req = nullptr;
    EXPECT_EQ(tpd_comm_iallreduce_wire(c, x.data(), got.data(), count, TPD_DTYPE_F32,
                                       TPD_DTYPE_BF16, TPD_COMM_OP_SUM, nullptr, &req),
              TPD_OK);
    poll_wait(c, req);
    Errors e;
    for (size_t i = 0; i < count; i++) {
        e.wire = std::max(e.wire, std::fabs((double)got[i] - ref[i]) / ref[i]);
        int chunk = (int)(i % (size_t)n);
        double rr = std::fabs((double)ring_bf16(n, i, chunk) - ref[i]) / ref[i];
        double rw = std::fabs((double)got[i] - ref[i]) / ref[i];
        e.ring = std::max(e.ring, rr);
        e.wire_rms += rw * rw;
        e.ring_rms += rr * rr;
    }
    e.wire_rms = std::sqrt(e.wire_rms / (double)count);
    e.ring_rms = std::sqrt(e.ring_rms / (double)count);
    // every rank holds the same bits (each chunk was rounded once, by its owner)
    std::vector<float> first(got);
    EXPECT_EQ(tpd_comm_broadcast(c, first.data(), count, TPD_DTYPE_F32, 0, nullptr), TPD_OK);
    EXPECT_EQ(first, got) << "ranks disagree on the bf16-wire all-reduce";
    return e;
}

// The max over the communicator of a rank's error.
double comm_max(tpd_comm *c, double v) {
    double m = v;
    EXPECT_EQ(tpd_comm_allreduce(c, &v, &m, 1, TPD_DTYPE_F64, TPD_COMM_OP_MAX, nullptr), TPD_OK);
    return m;
}

// Runs f on communicators of 2, 4 and 8 ranks (every world rank in one of each size).
template <class F> void on_sizes(F f) {
    for (int n : {2, 4, 8}) {
        tpd_comm *c = nullptr;
        int wr = tpd_comm_rank(g_world);
        ASSERT_EQ(tpd_comm_split(g_world, wr / n, wr, "dp", &c), TPD_OK);
        ASSERT_EQ(tpd_comm_size(c), n);
        f(c, n);
        tpd_comm_destroy(c);
    }
}

TEST(CommWire, AllReduceErrorBoundedAndFlatInRanks) {
    double wire[9] = {0}, ring[9] = {0}, wrms[9] = {0}, rrms[9] = {0};
    on_sizes([&](tpd_comm *c, int n) {
        Errors e = measure_allreduce(c, 8192 + 3);
        wire[n] = comm_max(c, e.wire);
        ring[n] = comm_max(c, e.ring);
        wrms[n] = comm_max(c, e.wire_rms);
        rrms[n] = comm_max(c, e.ring_rms);
        EXPECT_LE(wire[n], allreduce_bound(n)) << n << " ranks";
        EXPECT_GT(wire[n], 0.0) << "bf16 on the wire must round something";
    });
    for (int n : {2, 4, 8}) { // every world rank reports all three sizes
        wire[n] = comm_max(g_world, wire[n]), ring[n] = comm_max(g_world, ring[n]);
        wrms[n] = comm_max(g_world, wrms[n]), rrms[n] = comm_max(g_world, rrms[n]);
    }
    // flat in the rank count (the max is the final rounding's ~u; the rms falls) ...
    EXPECT_LE(wire[8], wire[2] * 1.25);
    EXPECT_LE(wrms[8], wrms[2]);
    // ... while the ring grows: n-1 roundings of a growing partial sum
    EXPECT_GT(rrms[8], rrms[2] * 1.2);
    EXPECT_GT(rrms[8], wrms[8] * 1.5);
    EXPECT_GT(ring[8], wire[8] * 1.5);
    if (tpd_comm_rank(g_world) == 0)
        for (int n : {2, 4, 8})
            std::printf("bf16-wire error vs fp32 all-reduce, %d ranks: max relative %.3g, rms "
                        "%.3g (bound %.3g = %.3f * 2^-7); simulated bf16 ring: max %.3g, rms "
                        "%.3g\n",
                        n, wire[n], wrms[n], allreduce_bound(n), allreduce_bound(n) / (2 * kU),
                        ring[n], rrms[n]);
}

TEST(CommWire, ReduceScatterErrorBoundedInPlaceAndNot) {
    on_sizes([&](tpd_comm *c, int n) {
        int rank = tpd_comm_rank(c);
        const size_t rc = 1001;
        std::vector<float> x(rc * n), ref(rc), got(rc), inplace(rc * n);
        for (size_t i = 0; i < x.size(); i++)
            x[i] = inplace[i] = val(rank, i);
        ASSERT_EQ(tpd_comm_reduce_scatter(c, x.data(), ref.data(), rc, TPD_DTYPE_F32,
                                          TPD_COMM_OP_SUM, nullptr),
                  TPD_OK);
        tpd_comm_req *a = nullptr, *b = nullptr;
        ASSERT_EQ(tpd_comm_ireduce_scatter_wire(c, x.data(), got.data(), rc, TPD_DTYPE_F32,
                                                TPD_DTYPE_BF16, TPD_COMM_OP_SUM, nullptr, &a),
                  TPD_OK);
        float *mine = inplace.data() + rc * (size_t)rank; // the DP code's in-place form
        ASSERT_EQ(tpd_comm_ireduce_scatter_wire(c, inplace.data(), mine, rc, TPD_DTYPE_F32,
                                                TPD_DTYPE_BF16, TPD_COMM_OP_SUM, nullptr, &b),
                  TPD_OK);
        ASSERT_EQ(tpd_comm_wait(c, b), TPD_OK); // out of posting order
        poll_wait(c, a);
        double err = 0;
        for (size_t i = 0; i < rc; i++) {
            err = std::max(err, std::fabs((double)got[i] - ref[i]) / ref[i]);
            EXPECT_EQ(mine[i], got[i]) << "in place, element " << i;
        }
        err = comm_max(c, err);
        EXPECT_LE(err, reduce_scatter_bound(n)) << n << " ranks";
        if (tpd_comm_rank(g_world) == 0)
            std::printf("bf16-wire reduce-scatter error, %d ranks: max relative %.3g (bound "
                        "%.3g)\n",
                        n, err, reduce_scatter_bound(n));
    });
}

TEST(CommWire, NonFiniteValuesPassThrough) {
    on_sizes([&](tpd_comm *c, int n) {
        (void)n;
        int rank = tpd_comm_rank(c);
        const float inf = std::numeric_limits<float>::infinity();
        const size_t count = 37;
        std::vector<float> x(count, 1.0f), got(count);
        if (rank == 0) {
            x[0] = std::numeric_limits<float>::quiet_NaN();
            x[1] = inf;
            x[2] = inf;
            x[3] = std::numeric_limits<float>::max(); // rounds to bf16 +inf
        }
        if (rank == 1) {
            x[2] = -inf;
            x[4] = -inf;
        }
        tpd_comm_req *req = nullptr;
        ASSERT_EQ(tpd_comm_iallreduce_wire(c, x.data(), got.data(), count, TPD_DTYPE_F32,
                                           TPD_DTYPE_BF16, TPD_COMM_OP_SUM, nullptr, &req),
                  TPD_OK);
        ASSERT_EQ(tpd_comm_wait(c, req), TPD_OK);
        EXPECT_TRUE(std::isnan(got[0]));
        EXPECT_EQ(got[1], inf);
        EXPECT_TRUE(std::isnan(got[2])) << "inf + -inf";
        EXPECT_EQ(got[3], inf);
        EXPECT_EQ(got[4], -inf);
        for (size_t i = 5; i < count; i++)
            EXPECT_EQ(got[i], (float)tpd_comm_size(c)) << i;
    });
}

TEST(CommWire, UnevenAndZeroCountsAndManyOutstanding) {
    on_sizes([&](tpd_comm *c, int n) {
        int rank = tpd_comm_rank(c);
        // counts below, at and above the rank count, none a multiple of 8 but the last
        const std::vector<size_t> counts = {1, 3, 7, 9, 1001, 64};
        std::vector<std::vector<float>> x(counts.size()), got(counts.size());
        std::vector<tpd_comm_req *> reqs(counts.size(), nullptr);
        for (size_t k = 0; k < counts.size(); k++) {
            x[k].resize(counts[k]);
            for (size_t i = 0; i < counts[k]; i++)
                x[k][i] = (float)((int)((i + k) % 5) + rank); // small integers: exact sums
            got[k].assign(counts[k], -1.0f);
            float *recv = k % 2 ? x[k].data() : got[k].data(); // odd ones in place
            ASSERT_EQ(tpd_comm_iallreduce_wire(c, x[k].data(), recv, counts[k], TPD_DTYPE_F32,
                                               TPD_DTYPE_BF16, TPD_COMM_OP_SUM, nullptr, &reqs[k]),
                      TPD_OK);
        }
        // completed in reverse order, the odd ones by polling
        for (size_t k = counts.size(); k-- > 0;) {
            if (k % 2)
                poll_wait(c, reqs[k]);
            else
                ASSERT_EQ(tpd_comm_wait(c, reqs[k]), TPD_OK);
        }
        for (size_t k = 0; k < counts.size(); k++) {
            const float *r = k % 2 ? x[k].data() : got[k].data();
            for (size_t i = 0; i < counts[k]; i++) {
                float want = 0;
                for (int q = 0; q < n; q++)
                    want += (float)((int)((i + k) % 5) + q);
                ASSERT_EQ(r[i], want) << "count " << counts[k] << " element " << i;
            }
        }
        float dummy = 0;
        tpd_comm_req *req = reinterpret_cast<tpd_comm_req *>(&dummy); // must be set to NULL
        ASSERT_EQ(tpd_comm_iallreduce_wire(c, &dummy, &dummy, 0, TPD_DTYPE_F32, TPD_DTYPE_BF16,
                                           TPD_COMM_OP_SUM, nullptr, &req),
                  TPD_OK);
        EXPECT_EQ(req, nullptr) << "count 0 is complete at once";
        ASSERT_EQ(tpd_comm_ireduce_scatter_wire(c, &dummy, &dummy, 0, TPD_DTYPE_F32, TPD_DTYPE_BF16,
                                                TPD_COMM_OP_SUM, nullptr, &req),
                  TPD_OK);
        EXPECT_EQ(req, nullptr);
    });
}

TEST(CommWire, RejectsWhatItCannotCarry) {
    float a[4] = {1, 2, 3, 4}, b[4];
    tpd_comm_req *req = nullptr;
    EXPECT_EQ(tpd_comm_iallreduce_wire(g_world, a, b, 4, TPD_DTYPE_F32, TPD_DTYPE_BF16,
                                       TPD_COMM_OP_MAX, nullptr, &req),
              TPD_ERR_INVALID);
    EXPECT_EQ(tpd_comm_iallreduce_wire(g_world, a, b, 2, TPD_DTYPE_BF16, TPD_DTYPE_F32,
                                       TPD_COMM_OP_SUM, nullptr, &req),
              TPD_ERR_INVALID);
    // wire == dtype is the plain all-reduce
    ASSERT_EQ(tpd_comm_iallreduce_wire(g_world, a, b, 4, TPD_DTYPE_F32, TPD_DTYPE_F32,
                                       TPD_COMM_OP_SUM, nullptr, &req),
              TPD_OK);
    ASSERT_EQ(tpd_comm_wait(g_world, req), TPD_OK);
    for (int i = 0; i < 4; i++)
        EXPECT_EQ(b[i], a[i] * (float)tpd_comm_size(g_world));
}

TEST(CommWire, SelfBackendRoundsOnce) {
    tpd_comm *s = nullptr;
    ASSERT_EQ(tpd_comm_self_create(&s), TPD_OK);
    float x[3] = {1.00390625f + 1e-6f, 3.0f, std::numeric_limits<float>::quiet_NaN()}, y[3];
    tpd_comm_req *req = nullptr;
    ASSERT_EQ(tpd_comm_iallreduce_wire(s, x, y, 3, TPD_DTYPE_F32, TPD_DTYPE_BF16, TPD_COMM_OP_SUM,
                                       nullptr, &req),
              TPD_OK);
    ASSERT_EQ(tpd_comm_wait(s, req), TPD_OK);
    EXPECT_EQ(y[0], bf16_round(x[0]));
    EXPECT_NE(y[0], x[0]);
    EXPECT_EQ(y[1], 3.0f);
    EXPECT_TRUE(std::isnan(y[2]));
    tpd_comm_destroy(s);
}

// parallel.grad_reduce_dtype: bf16 through the DP plan: every bucket's reduction (the
// all-reduce, ZeRO-1's reduce-scatter) within the bounds above of the fp32 plan's, and the
// key named when the gradients are not fp32.
TEST(CommWire, DataParallelBucketsOnTheBf16Wire) {
    tpd_comm *c = nullptr;
    int wr = tpd_comm_rank(g_world);
    ASSERT_EQ(tpd_comm_split(g_world, wr / 4, wr, "dp", &c), TPD_OK);
    int rank = tpd_comm_rank(c), n = tpd_comm_size(c);
    const size_t numel = 1000; // padded to 1000, buckets of 256: the last one shorter
    for (int zero = 0; zero < 2; zero++) {
        SCOPED_TRACE(zero ? "ZeRO-1" : "all-reduce");
        tpd_dp_plan p32, p16;
        ASSERT_EQ(tpd_dp_plan_init(numel, 256, n, rank, zero, &p32), TPD_OK);
        ASSERT_EQ(tpd_dp_plan_init(numel, 256, n, rank, zero, &p16), TPD_OK);
        EXPECT_EQ(tpd_dp_plan_set_reduce_dtype(&p16, TPD_DTYPE_BF16, TPD_DTYPE_BF16),
                  TPD_ERR_INVALID);
        ASSERT_EQ(tpd_dp_plan_set_reduce_dtype(&p16, TPD_DTYPE_BF16, TPD_DTYPE_F32), TPD_OK);
        std::vector<float> g32(p32.numel_padded), g16(p32.numel_padded);
        for (size_t i = 0; i < g32.size(); i++)
            g32[i] = g16[i] = val(rank, i);
        for (int b = 0; b < p32.nbuckets; b++) {
            tpd_comm_req *r32 = nullptr, *r16 = nullptr;
            ASSERT_EQ(tpd_dp_reduce_bucket(&p32, c, b, g32.data(), TPD_DTYPE_F32, nullptr, &r32),
                      TPD_OK);
            ASSERT_EQ(tpd_dp_reduce_bucket(&p16, c, b, g16.data(), TPD_DTYPE_F32, nullptr, &r16),
                      TPD_OK);
            ASSERT_EQ(tpd_comm_wait(c, r32), TPD_OK);
            ASSERT_EQ(tpd_comm_wait(c, r16), TPD_OK);
        }
        double err = 0, bound = zero ? reduce_scatter_bound(n) : allreduce_bound(n);
        int differ = 0;
        for (int k = 0; k < p32.nranges; k++)
            for (size_t i = p32.ranges[k].begin; i < p32.ranges[k].end; i++) {
                err = std::max(err, std::fabs((double)g16[i] - g32[i]) / g32[i]);
                differ += g16[i] != g32[i];
            }
        EXPECT_LE(err, bound);
        EXPECT_GT(differ, 0) << "the bf16 wire must round something";
        tpd_dp_plan_free(&p32);
        tpd_dp_plan_free(&p16);
    }
    tpd_comm_destroy(c);
}

} // namespace

int main(int argc, char **argv) {
    testing::InitGoogleTest(&argc, argv);
    if (tpd_comm_mpi_start(&g_world) != TPD_OK) return 1;
    int rc = tiny::mpi_run_all_tests(g_world);
    tpd_comm_mpi_finish(g_world);
    return rc;
}
