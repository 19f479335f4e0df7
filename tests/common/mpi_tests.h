// The main of a GoogleTest binary run under mpirun: only world rank 0 prints gtest's
// output, and every rank returns the whole job's verdict (a failure on any rank fails all).
#ifndef TPD_TESTS_COMMON_MPI_TESTS_H
#define TPD_TESTS_COMMON_MPI_TESTS_H

#include <gtest/gtest.h>

extern "C" {
#include "parallel/comm.h"
}

namespace tiny {

// Runs every test on this rank (a rank other than 0 gets `extra`, a listener of its own,
// when given) and returns the MAX over the world of the per-rank results.
inline int mpi_run_all_tests(tpd_comm *world, testing::TestEventListener *extra = nullptr) {
    if (tpd_comm_rank(world) != 0) {
        auto &listeners = testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        if (extra) listeners.Append(extra);
    } else {
        delete extra;
    }
    int rc = RUN_ALL_TESTS(), all = rc;
    tpd_comm_allreduce(world, &rc, &all, 1, TPD_DTYPE_I32, TPD_COMM_OP_MAX, nullptr);
    return all;
}

} // namespace tiny
#endif
