/* The communicator interface: an opaque handle per group, behind which sit a backend's
 * ops table and context (parallel/comm_internal.h). Callers use the functions below.
 *
 * Each parallel dimension (TP, DP, PP, embedding, model-parallel) gets its own
 * communicator split from the world one (tpd_comm_split); there is never a shared one.
 *
 * Completion semantics, chosen so that the NCCL backend fits the same calls:
 * - Every data call takes a `stream` (NULL on the MPI backend, a cudaStream_t on NCCL).
 *   Calls are ordered on that stream. On MPI they have completed when the call returns;
 *   on NCCL they have been enqueued, and tpd_comm_sync(stream) waits.
 * - Point-to-point: isend/irecv return a request that tpd_comm_wait completes. A send
 *   never blocks the caller (MPI: MPI_Isend; NCCL: enqueued on a communication stream),
 *   so the pipeline's action lists can post sends eagerly and only receives wait.
 * - Non-blocking collectives: iallreduce, ireduce_scatter and iallgather take the blocking
 *   call's arguments and in-place forms plus a request; tpd_comm_wait completes and frees
 *   it, tpd_comm_test polls any request (p2p too) and leaves it to wait. The buffers belong
 *   to the operation until wait returns, and every rank posts a communicator's collectives,
 *   blocking or not, in one order. MPI: MPI moves non-blocking collectives on only inside
 *   MPI calls, so a caller that overlaps them calls tpd_comm_test between pieces of work
 *   (cheap; it progresses every outstanding request); recv holds the result once test
 *   reports done or wait returns. Only wait runs under the watchdog. NCCL: enqueued on the
 *   communication stream after the work already queued on `stream`, which computes on;
 *   wait makes `stream` wait for the collective but not the host (ordered as a blocking
 *   one would be; tpd_comm_sync(stream) waits). Staged and self: complete when the call
 *   returns, with a NULL request (no overlap through host staging).
 * - group_start/group_end bracket several p2p calls that must be issued together
 *   (NCCL requires it for paired send/recv; MPI posts them non-blocking anyway).
 * - gather and gatherv are host-only (MPI and self backends): traces, sweep records,
 *   calibration.
 * - abort tears a communicator down without waiting for peers; used when a collective
 *   failed or timed out, so no rank hangs.
 *
 * Counts are elements of the dtype; TPD_DTYPE_U8 moves bytes (structs, strings) and
 * TPD_DTYPE_F64 host scalars (norms, timings) without rounding. */
#ifndef TPD_PARALLEL_COMM_H
#define TPD_PARALLEL_COMM_H

#include <stddef.h>

#include "base/status.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpd_comm_op {
    TPD_COMM_OP_SUM = 0,
    TPD_COMM_OP_MAX = 1,
    TPD_COMM_OP_MIN = 2,
} tpd_comm_op;

typedef struct tpd_comm tpd_comm;         /* opaque */
typedef struct tpd_comm_req tpd_comm_req; /* backend-private */

int tpd_comm_rank(const tpd_comm *c); /* in this communicator */
int tpd_comm_size(const tpd_comm *c);
/* "world", "tp", "dp", "pp", "emb", "mp": used in error messages. */
const char *tpd_comm_name(const tpd_comm *c);
/* The backend behind it: "mpi", "nccl", "staged" or "self". */
const char *tpd_comm_backend(const tpd_comm *c);

tpd_status tpd_comm_allreduce(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                              tpd_comm_op op, void *stream);
/* recv gets this rank's `recvcount` block of the reduction of send (size*recvcount). */
tpd_status tpd_comm_reduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                   tpd_dtype dt, tpd_comm_op op, void *stream);
/* recv (size*sendcount) gets every rank's send block in rank order. */
tpd_status tpd_comm_allgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                              tpd_dtype dt, void *stream);
tpd_status tpd_comm_broadcast(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int root,
                              void *stream);
/* Host only. recv (size*count, root only; may be NULL elsewhere) gets every rank's send
 * block in rank order. */
tpd_status tpd_comm_gather(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                           int root);
/* Host only. Rank r sends counts[r] elements; root's recv gets them at displs[r]
 * (elements). counts and displs are read on the root only. */
tpd_status tpd_comm_gatherv(tpd_comm *c, const void *send, size_t sendcount, void *recv,
                            const size_t *counts, const size_t *displs, tpd_dtype dt, int root);
tpd_status tpd_comm_isend(tpd_comm *c, const void *buf, size_t count, tpd_dtype dt, int peer,
                          int tag, void *stream, tpd_comm_req **req_p);
tpd_status tpd_comm_irecv(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int peer, int tag,
                          void *stream, tpd_comm_req **req_p);
/* All-to-all with per-peer counts, from isend/irecv (so every backend with p2p has it):
 * sendcounts[p] elements at send + sdispls[p] go to rank p, and rank p's block for this
 * rank lands at recv + rdispls[p] (recvcounts[p] elements); displacements in elements. The
 * own block travels too (to self). Blocks of 0 elements are not posted. Returns when every
 * transfer has completed (on NCCL, enqueued on `stream`); send and recv must not overlap.
 * `tag` keeps concurrent exchanges on one communicator apart. */
tpd_status tpd_comm_alltoallv(tpd_comm *c, const void *send, const size_t *sendcounts,
                              const size_t *sdispls, void *recv, const size_t *recvcounts,
                              const size_t *rdispls, tpd_dtype dt, int tag, void *stream);
/* Non-blocking forms of allreduce, reduce_scatter and allgather: same arguments and
 * in-place rules as the blocking calls, plus a request (possibly NULL: already complete)
 * for tpd_comm_wait. */
tpd_status tpd_comm_iallreduce(tpd_comm *c, const void *send, void *recv, size_t count,
                               tpd_dtype dt, tpd_comm_op op, void *stream, tpd_comm_req **req_p);
tpd_status tpd_comm_ireduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                    tpd_dtype dt, tpd_comm_op op, void *stream,
                                    tpd_comm_req **req_p);
tpd_status tpd_comm_iallgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                               tpd_dtype dt, void *stream, tpd_comm_req **req_p);
/* Compressed reductions: the sum of fp32 data (dt TPD_DTYPE_F32, op TPD_COMM_OP_SUM) with
 * `wire` TPD_DTYPE_BF16 on the wire and every sum accumulated in fp32 at the receiver; the
 * same arguments, in-place rules and completion (tpd_comm_wait, tpd_comm_test) as
 * tpd_comm_iallreduce and tpd_comm_ireduce_scatter. wire == dt is the plain call.
 *
 * What the wire carries: each rank rounds its contribution to bf16 once (round to
 * nearest even, NaN kept a NaN) and sends chunk r of it to rank r (an all-to-all: the
 * all-reduce cuts count into size chunks of count/size, the first count%size one longer;
 * the reduce-scatter's chunks are the recvcount blocks). The owner widens every rank's
 * chunk to fp32 and sums them in rank order in fp32; the reduce-scatter ends there (recv
 * is that fp32 sum), the all-reduce rounds the sum to bf16 once and all-gathers it, so
 * every rank gets the same bits. Bytes on the wire: half the fp32 all-reduce's
 * ((size-1)/size * count * 2 bytes each way per rank for the all-reduce, the ring's
 * ratio), with no reduction step in bf16.
 *
 * Error bound (independent of the number of ranks, unlike a bf16 ring whose partial sum
 * is rounded at each of its size-1 hops): with u = 2^-8 (half a bf16 ulp, relative: 8
 * significant bits),
 *   |result - exact| <= u * sum_r |x_r| (the inputs' rounding)
 *                     + (size-1) * 2^-24 * sum_r |x_r| (the fp32 sum)
 *                     + u * |result| (the all-reduce's final rounding),
 * so about 2^-7 relative for inputs of one sign, 2^-8 for the reduce-scatter (measured on
 * 2/4/8 ranks by tests/parallel/test_comm_wire.cc: max 0.0069/0.0065/0.0054, rms
 * 0.0024/0.0020/0.0017, where a simulated bf16 ring reaches 0.0069/0.0096/0.0105, rms
 * 0.0024/0.0026/0.0031). Infinities
 * and NaNs pass through as in an fp32 sum. On 1 rank the result is the input rounded
 * through bf16 (the same numerics). Backends: MPI (host), self, and staged (host-staged,
 * complete on return, NULL request); the NCCL backend reports TPD_ERR_UNSUPPORTED. */
tpd_status tpd_comm_iallreduce_wire(tpd_comm *c, const void *send, void *recv, size_t count,
                                    tpd_dtype dt, tpd_dtype wire, tpd_comm_op op, void *stream,
                                    tpd_comm_req **req_p);
tpd_status tpd_comm_ireduce_scatter_wire(tpd_comm *c, const void *send, void *recv,
                                         size_t recvcount, tpd_dtype dt, tpd_dtype wire,
                                         tpd_comm_op op, void *stream, tpd_comm_req **req_p);
/* Completes and frees a request. NULL is a no-op. */
tpd_status tpd_comm_wait(tpd_comm *c, tpd_comm_req *req);
/* Progresses outstanding communication and sets *done_p to 1 when req has completed (it
 * still has to be passed to tpd_comm_wait, which then returns at once), 0 otherwise. NULL
 * req: done. */
tpd_status tpd_comm_test(tpd_comm *c, tpd_comm_req *req, int *done_p);
tpd_status tpd_comm_group_start(tpd_comm *c);
tpd_status tpd_comm_group_end(tpd_comm *c);
tpd_status tpd_comm_barrier(tpd_comm *c);
tpd_status tpd_comm_sync(tpd_comm *c, void *stream);

/* New communicator of the ranks that pass the same color (< 0: not a member, *out_p =
 * NULL), ordered by key, named `name`. Collective over parent. */
tpd_status tpd_comm_split(tpd_comm *parent, int color, int key, const char *name, tpd_comm **out_p);
/* Tears the communicator down without waiting for peers. */
void tpd_comm_abort(tpd_comm *c);
/* Frees the communicator (a no-op for NULL). */
void tpd_comm_destroy(tpd_comm *c);

/* 1 when c works on host memory (MPI or self): gather and gatherv are available. */
int tpd_comm_is_host(const tpd_comm *c);

/* A communicator of this process alone, without MPI (rank 0 of 1, host memory):
 * collectives copy, splits give another one, point-to-point is unsupported. For
 * single-process tools, and tests that must not start MPI. */
tpd_status tpd_comm_self_create(tpd_comm **c_p);

/* ---- the MPI backend ----
 * MPI start-up lives here and nowhere else: no file outside parallel/ includes <mpi.h>. */

/* Initializes MPI (thread level FUNNELED) unless it is already, and wraps
 * MPI_COMM_WORLD as "world". */
tpd_status tpd_comm_mpi_start(tpd_comm **world_p);
/* Destroys world and finalizes MPI when tpd_comm_mpi_start initialized it. */
void tpd_comm_mpi_finish(tpd_comm *world);
/* Takes the whole job down with `code` (MPI_Abort on the world): for a rank that failed
 * while others may wait inside a collective. */
void tpd_comm_mpi_abort_job(int code);
/* Wraps MPI_COMM_WORLD (MPI must be initialized by the caller). */
tpd_status tpd_comm_mpi_world(tpd_comm **world_p);
/* The ranks of c that share this node (MPI_Comm_split_type, shared memory), named
 * "node". Collective over c, which must be MPI-backed. */
tpd_status tpd_comm_mpi_split_node(tpd_comm *c, tpd_comm **node_p);
/* Watchdog: a blocking MPI call that takes longer than timeout_s makes the process log
 * and leave with TPD_EXIT_COMM through tpd_fatal (base/fatal.h) (<= 0 disables). */
void tpd_comm_mpi_set_timeout(double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
