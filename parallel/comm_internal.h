/* Private to parallel/comm*.c: the ops table a communicator backend fills, and the
 * handle behind tpd_comm. Each op's contract is documented at its tpd_comm_* function in
 * parallel/comm.h. */
#ifndef TPD_PARALLEL_COMM_INTERNAL_H
#define TPD_PARALLEL_COMM_INTERNAL_H

#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_comm_ctx tpd_comm_ctx; /* backend-private */

typedef struct tpd_comm_ops {
    const char *name;
    tpd_status (*allreduce)(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                            tpd_comm_op op, void *stream);
    tpd_status (*reduce_scatter)(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                 tpd_dtype dt, tpd_comm_op op, void *stream);
    tpd_status (*allgather)(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                            tpd_dtype dt, void *stream);
    tpd_status (*broadcast)(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int root,
                            void *stream);
    /* host-only backends (MPI) set these; NULL elsewhere */
    tpd_status (*gather)(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                         int root);
    tpd_status (*gatherv)(tpd_comm *c, const void *send, size_t sendcount, void *recv,
                          const size_t *counts, const size_t *displs, tpd_dtype dt, int root);
    tpd_status (*isend)(tpd_comm *c, const void *buf, size_t count, tpd_dtype dt, int peer, int tag,
                        void *stream, tpd_comm_req **req_p);
    tpd_status (*irecv)(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int peer, int tag,
                        void *stream, tpd_comm_req **req_p);
    tpd_status (*iallreduce)(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                             tpd_comm_op op, void *stream, tpd_comm_req **req_p);
    tpd_status (*ireduce_scatter)(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                  tpd_dtype dt, tpd_comm_op op, void *stream, tpd_comm_req **req_p);
    tpd_status (*iallgather)(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                             tpd_dtype dt, void *stream, tpd_comm_req **req_p);
    /* fp32 data, bf16 wire, fp32 sums (tpd_comm_iallreduce_wire; arguments checked there,
     * count > 0); NULL where the backend has none */
    tpd_status (*iallreduce_wire)(tpd_comm *c, const float *send, float *recv, size_t count,
                                  void *stream, tpd_comm_req **req_p);
    tpd_status (*ireduce_scatter_wire)(tpd_comm *c, const float *send, float *recv,
                                       size_t recvcount, void *stream, tpd_comm_req **req_p);
    tpd_status (*wait)(tpd_comm *c, tpd_comm_req *req);
    tpd_status (*test)(tpd_comm *c, tpd_comm_req *req, int *done_p); /* req is not NULL */
    tpd_status (*group_start)(tpd_comm *c);
    tpd_status (*group_end)(tpd_comm *c);
    tpd_status (*barrier)(tpd_comm *c);
    tpd_status (*sync)(tpd_comm *c, void *stream);
    tpd_status (*split)(tpd_comm *c, int color, int key, tpd_comm **out_p);
    void (*abort)(tpd_comm *c);
    void (*destroy)(tpd_comm *c);
} tpd_comm_ops;

struct tpd_comm {
    const tpd_comm_ops *ops;
    tpd_comm_ctx *ctx;
    int rank; /* in this communicator */
    int size;
    char name[16];
};

/* The MPI_Comm of an MPI-backed communicator (a pointer to it), NULL otherwise: for the
 * NCCL bootstrap and the staged backend. */
void *tpd_comm_mpi_handle(tpd_comm *c);

#ifdef __cplusplus
}
#endif
#endif
