/* GPU communicator backends: NCCL, and an MPI-staged fallback for ranks that share a GPU.
 *
 * Both take device pointers and a cudaStream_t (as void *) in every call of comm.h.
 *
 * NCCL: collectives are enqueued on the caller's stream and complete asynchronously
 * (->sync(stream) waits). Sends and receives are posted on a per-communicator
 * communication stream after an event recorded on the caller's stream, so a send never
 * blocks the compute stream and the pipeline can post sends eagerly; ->wait makes the
 * caller's stream (and, for a receive, the host) wait for the transfer. An isend outside an
 * explicit group is held until the next call on the communicator and issued in one NCCL
 * group with it when that is an irecv, so that two stages exchanging activations and
 * gradients never each queue a lone send ahead of the receive the other's send needs.
 *
 * Failure handling: a watchdog thread polls ncclCommGetAsyncError on every live
 * communicator and times every enqueued operation. On an error, or when an operation has
 * not completed within timeout_s, it aborts every communicator (ncclCommAbort) and exits
 * the process with TPD_EXIT_COMM. This is the one place in the library that exits: the
 * peers are blocked inside NCCL kernels that only an abort (here, or by the launcher when
 * this process dies) can release, and returning an error to a caller that is itself stuck
 * in a stream synchronization is impossible. */
#ifndef TPD_PARALLEL_COMM_NCCL_H
#define TPD_PARALLEL_COMM_NCCL_H

#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* World communicator over NCCL. mpi_world: the MPI communicator whose ranks form the world
 * (NULL = MPI_COMM_WORLD; MPI must be initialized). Rank 0 creates the unique id and
 * broadcasts it over MPI; every rank then selects `device` (tpd_mesh_choose_gpu) and joins with a
 * non-blocking ncclCommInitRankConfig, polled until it completes, fails, or timeout_s
 * passes. timeout_s also bounds every later operation (<= 0: no timeout, errors only). */
tpd_status tpd_comm_nccl_world(tpd_comm *mpi_world, int device, double timeout_s,
                               tpd_comm **world_p);

/* A GPU-pointer communicator over an MPI one (from tpd_comm_mpi_world or a split of it):
 * every call copies device data into pinned host buffers on the given stream, runs the
 * MPI operation, and copies the result back (the call has completed when it returns).
 * bf16 reductions are converted to fp32 on the host, reduced, and converted back. The new
 * communicator takes ownership of mpi_comm (it is destroyed with it); splits wrap the MPI
 * split. The fallback when several ranks share one GPU. */
tpd_status tpd_comm_staged_create(tpd_comm *mpi_comm, tpd_comm **comm_p);

#ifdef __cplusplus
}
#endif
#endif
