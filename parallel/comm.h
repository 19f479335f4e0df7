/* The communicator interface: an ops table plus a context, one handle per group.
 *
 * Each parallel dimension (TP, DP, PP, embedding, model-parallel) gets its own
 * communicator split from the world one (tpd_comm_split); there is never a shared one.
 *
 * Completion semantics, chosen so that the NCCL backend fits the same calls:
 * - Every call takes a `stream` (NULL on the MPI backend, a cudaStream_t on NCCL). Calls
 *   are ordered on that stream. On MPI they have completed when the call returns; on
 *   NCCL they have been enqueued, and ->sync(stream) waits.
 * - Point-to-point: isend/irecv return a request that ->wait completes. A send never
 *   blocks the caller (MPI: MPI_Isend; NCCL: enqueued on a communication stream), so
 *   the pipeline's action lists can post sends eagerly and only receives wait.
 * - group_start/group_end bracket several p2p calls that must be issued together
 *   (NCCL requires it for paired send/recv; MPI posts them non-blocking anyway).
 * - abort tears a communicator down without waiting for peers; used when a collective
 *   failed or timed out, so no rank hangs. */
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
} tpd_comm_op;

typedef struct tpd_comm tpd_comm;
typedef struct tpd_comm_ctx tpd_comm_ctx; /* backend-private */
typedef struct tpd_comm_req tpd_comm_req; /* backend-private */

typedef struct tpd_comm_ops {
    const char *name;
    tpd_status (*allreduce)(tpd_comm *c, const void *send, void *recv, size_t count,
                            tpd_dtype dt, tpd_comm_op op, void *stream);
    /* recv gets this rank's `recvcount` block of the reduction of send (size*recvcount). */
    tpd_status (*reduce_scatter)(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                 tpd_dtype dt, tpd_comm_op op, void *stream);
    /* recv (size*sendcount) gets every rank's send block in rank order. */
    tpd_status (*allgather)(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                            tpd_dtype dt, void *stream);
    tpd_status (*broadcast)(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int root,
                            void *stream);
    tpd_status (*isend)(tpd_comm *c, const void *buf, size_t count, tpd_dtype dt, int peer,
                        int tag, void *stream, tpd_comm_req **req_p);
    tpd_status (*irecv)(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int peer, int tag,
                        void *stream, tpd_comm_req **req_p);
    /* Completes and frees a request. NULL is a no-op. */
    tpd_status (*wait)(tpd_comm *c, tpd_comm_req *req);
    tpd_status (*group_start)(tpd_comm *c);
    tpd_status (*group_end)(tpd_comm *c);
    tpd_status (*barrier)(tpd_comm *c);
    tpd_status (*sync)(tpd_comm *c, void *stream);
    /* New communicator of the ranks that pass the same color, ordered by key. */
    tpd_status (*split)(tpd_comm *c, int color, int key, tpd_comm **out_p);
    void (*abort)(tpd_comm *c);
    void (*destroy)(tpd_comm *c);
} tpd_comm_ops;

struct tpd_comm {
    const tpd_comm_ops *ops;
    tpd_comm_ctx *ctx;
    int rank; /* in this communicator */
    int size;
    char name[16]; /* "world", "tp", "dp", "pp", "emb", "mp": used in error messages */
};

/* MPI backend. Wraps MPI_COMM_WORLD (MPI must be initialized by the caller). */
tpd_status tpd_comm_mpi_world(tpd_comm **world_p);

/* Watchdog: a blocking MPI call that takes longer than timeout_s makes the process log
 * and exit with TPD_EXIT_COMM (<= 0 disables). */
void tpd_comm_mpi_set_timeout(double timeout_s);
/* Pointer to the MPI_Comm of an MPI-backed communicator, NULL otherwise. */
void *tpd_comm_mpi_handle(tpd_comm *c);

/* Split helper that names the child. */
tpd_status tpd_comm_split(tpd_comm *parent, int color, int key, const char *name,
                          tpd_comm **out_p);

/* Convenience wrappers (NULL stream). */
static inline tpd_status tpd_comm_allreduce(tpd_comm *c, const void *send, void *recv,
                                            size_t count, tpd_dtype dt, tpd_comm_op op) {
    return c->ops->allreduce(c, send, recv, count, dt, op, NULL);
}

#ifdef __cplusplus
}
#endif
#endif
