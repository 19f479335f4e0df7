/* Private to the NCCL communicator: its state, shared by comm_nccl.c (lifetime, watchdog,
 * blocking collectives) and comm_nccl_p2p.c (sends, receives and the held send,
 * non-blocking collectives, groups). */
#ifndef TPD_PARALLEL_COMM_NCCL_INTERNAL_H
#define TPD_PARALLEL_COMM_NCCL_INTERNAL_H

#include "parallel/comm_internal.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>

#define NCCL_MAX_LIVE 64    /* communicators per world (world, tp, dp, pp, emb, mp, ...) */
#define NCCL_TRACK_SLOTS 64 /* in-flight operations timed per communicator */
#define NCCL_GROUP_MAX 32   /* p2p requests and streams inside one group */
#define WATCHDOG_PERIOD_MS 100

typedef struct nccl_ctx nccl_ctx;

typedef struct nccl_shared {
    pthread_mutex_t mu;
    pthread_t thread;
    int thread_started;
    /* The watchdog's state is under mu (the live list, the timeouts, every track slot);
     * the two flags read without it are _Atomic: stop (polled by the watchdog's loop) and
     * each context's aborted. The MPI watchdog (comm_mpi.c) follows the same design. */
    _Atomic int stop;
    double timeout_s; /* <= 0: errors only, no deadline */
    int device;
    nccl_ctx *live[NCCL_MAX_LIVE];
    int nlive;
} nccl_shared;

/* One timed operation: its completion event and when it was enqueued. */
typedef struct nccl_track {
    cudaEvent_t ev;
    double t0;
    int busy;
} nccl_track;

/* A p2p transfer or a non-blocking collective, both on the communication stream. */
typedef struct nccl_req {
    cudaEvent_t done;    /* recorded on the communication stream after the operation */
    cudaStream_t stream; /* the caller's stream, made to wait in ->wait */
    int recorded;        /* 0 while its group has not ended or it is held (below) */
    int stream_only;     /* collectives: ->wait orders the stream but leaves the host be */
} nccl_req;

/* A p2p call not yet handed to NCCL. */
typedef struct nccl_p2p_op {
    nccl_req *q;
    void *buf;
    size_t count;
    ncclDataType_t dt;
    int peer;
    int is_send;
} nccl_p2p_op;

struct nccl_ctx {
    ncclComm_t comm;
    /* Held around every NCCL call on comm, never across a wait: the watchdog thread polls
     * and aborts the same communicator, and NCCL communicators are not thread-safe. Lock
     * order: sh->mu before mu. */
    pthread_mutex_t mu;
    _Atomic int aborted; /* written under mu; read anywhere (an atomic load) */
    nccl_shared *sh;
    tpd_comm *self;
    cudaStream_t comm_stream; /* p2p and non-blocking collectives, off the compute stream */
    int *barrier_buf;         /* device, 1 int */
    nccl_track track[NCCL_TRACK_SLOTS];
    int group_depth;
    cudaStream_t group_streams[NCCL_GROUP_MAX]; /* to time when the group ends */
    int n_group_streams;
    nccl_req *group_reqs[NCCL_GROUP_MAX]; /* to record when the group ends */
    int n_group_reqs;
    /* The last isend outside an explicit group, held back so that it is issued together
     * with the next irecv in one NCCL group (see p2p()). */
    nccl_p2p_op held;
    int has_held;
};

static inline nccl_ctx *CTX(tpd_comm *c) {
    return (nccl_ctx *)c->ctx;
}

static inline void tpd_nccl_lock(nccl_ctx *x) {
    pthread_mutex_lock(&x->mu);
}

static inline ncclResult_t tpd_nccl_unlock_with(nccl_ctx *x, ncclResult_t r) {
    pthread_mutex_unlock(&x->mu);
    return r;
}

/* CALL (an NCCL call on x->comm) under x's lock; an aborted communicator is not touched
 * (NCCL has freed it). The comma operator takes the lock before CALL is evaluated. */
#define NCCL_LOCKED(x, CALL)                                                                       \
    (tpd_nccl_lock(x), tpd_nccl_unlock_with((x), (x)->aborted ? ncclInvalidUsage : (CALL)))

/* The result of an NCCL call on x: ncclInProgress is waited out (under the deadline); a
 * failure aborts every communicator of the world (TPD_ERR_COMM). */
tpd_status tpd_nccl_check_result(nccl_ctx *x, ncclResult_t r, const char *what);
#define check(x, CALL, what) tpd_nccl_check_result((x), NCCL_LOCKED((x), CALL), (what))
tpd_status tpd_nccl_cuda_check(cudaError_t e, const char *what);
/* Times the work enqueued so far on stream (the watchdog's deadline). */
tpd_status tpd_nccl_track_now(nccl_ctx *x, cudaStream_t stream);
/* After enqueueing on stream: time it now, or when the enclosing group ends. */
tpd_status tpd_nccl_enqueued(nccl_ctx *x, cudaStream_t stream);
tpd_status tpd_nccl_map_dtype(tpd_comm *c, tpd_dtype dt, ncclDataType_t *out);
ncclRedOp_t tpd_nccl_map_op(tpd_comm_op op);
/* TPD_ERR_COMM, logged, once the communicator was aborted. */
tpd_status tpd_nccl_usable(tpd_comm *c);
/* Issues the held send, if any, on its own (comm_nccl_p2p.c). */
tpd_status tpd_nccl_flush_held(nccl_ctx *x);

/* The ops of comm_nccl_p2p.c. */
tpd_status tpd_nccl_isend(tpd_comm *c, const void *buf, size_t count, tpd_dtype dt, int peer,
                          int tag, void *stream, tpd_comm_req **req_p);
tpd_status tpd_nccl_irecv(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int peer, int tag,
                          void *stream, tpd_comm_req **req_p);
tpd_status tpd_nccl_iallreduce(tpd_comm *c, const void *send, void *recv, size_t count,
                               tpd_dtype dt, tpd_comm_op op, void *stream, tpd_comm_req **req_p);
tpd_status tpd_nccl_ireduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                    tpd_dtype dt, tpd_comm_op op, void *stream,
                                    tpd_comm_req **req_p);
tpd_status tpd_nccl_iallgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                               tpd_dtype dt, void *stream, tpd_comm_req **req_p);
tpd_status tpd_nccl_wait(tpd_comm *c, tpd_comm_req *req);
tpd_status tpd_nccl_test(tpd_comm *c, tpd_comm_req *req, int *done_p);
tpd_status tpd_nccl_group_start(tpd_comm *c);
tpd_status tpd_nccl_group_end(tpd_comm *c);

#endif
