/* NCCL backend of the communicator interface (device memory, GPU collectives).
 *
 * Communicators are non-blocking (config.blocking = 0): every NCCL call may return
 * ncclInProgress, after which ncclCommGetAsyncError is polled until the communicator
 * settles, under the deadline. A world and all communicators split from it share one
 * `nccl_shared` record: the registry of live communicators, the timeout, and the watchdog
 * thread (see comm_nccl.h for why it is the one place that exits the process). */
#include "parallel/comm_nccl.h"
#include "parallel/comm_internal.h"

#include "base/fatal.h"
#include "base/clock.h"

#include <mpi.h>
#include <nccl.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NCCL_MAX_LIVE 64    /* communicators per world (world, tp, dp, pp, emb, mp, ...) */
#define NCCL_TRACK_SLOTS 64 /* in-flight operations timed per communicator */
#define NCCL_GROUP_MAX 32   /* p2p requests and streams inside one group */
#define WATCHDOG_PERIOD_MS 100

typedef struct nccl_ctx nccl_ctx;

typedef struct nccl_shared {
    pthread_mutex_t mu;
    pthread_t thread;
    int thread_started;
    volatile int stop;
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
    int aborted;
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

static tpd_status flush_held(nccl_ctx *x);

static nccl_ctx *CTX(tpd_comm *c) {
    return (nccl_ctx *)c->ctx;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- abort everything ---- */

/* Caller holds sh->mu. */
static void abort_all_locked(nccl_shared *sh) {
    for (int i = 0; i < sh->nlive; i++) {
        nccl_ctx *x = sh->live[i];
        if (!x->aborted && x->comm != NULL) ncclCommAbort(x->comm);
        x->aborted = 1;
    }
}

/* A failed call on the caller's thread: log, abort every communicator of the world so no
 * peer keeps waiting on this rank, and report TPD_ERR_COMM (the engine then exits with
 * TPD_EXIT_COMM). */
static tpd_status fail_all(nccl_ctx *x, const char *what, ncclResult_t r) {
    const char *last = x->comm != NULL ? ncclGetLastError(x->comm) : NULL;
    tpd_log_error("comm %s (nccl): %s failed: %s%s%s; aborting every communicator",
                  x->self != NULL ? x->self->name : "?", what, ncclGetErrorString(r),
                  last != NULL && last[0] ? ": " : "", last != NULL ? last : "");
    pthread_mutex_lock(&x->sh->mu);
    abort_all_locked(x->sh);
    pthread_mutex_unlock(&x->sh->mu);
    return TPD_ERR_COMM;
}

/* Waits for a non-blocking communicator to leave ncclInProgress. */
static ncclResult_t settle(ncclComm_t comm, double timeout_s, int *timed_out) {
    double deadline = timeout_s > 0 ? tpd_clock_s() + timeout_s : 0;
    ncclResult_t state = ncclInProgress;
    *timed_out = 0;
    for (;;) {
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess) return r;
        if (state != ncclInProgress) return state;
        if (deadline > 0 && tpd_clock_s() > deadline) {
            *timed_out = 1;
            return ncclInProgress;
        }
        sleep_ms(1);
    }
}

static tpd_status check(nccl_ctx *x, ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return TPD_OK;
    if (r == ncclInProgress) {
        int timed_out = 0;
        r = settle(x->comm, x->sh->timeout_s, &timed_out);
        if (timed_out) {
            tpd_log_error("comm %s (nccl): %s did not complete within %.0f s",
                          x->self != NULL ? x->self->name : "?", what, x->sh->timeout_s);
            return fail_all(x, what, ncclInProgress);
        }
        if (r == ncclSuccess) return TPD_OK;
    }
    return fail_all(x, what, r);
}

static tpd_status cuda_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return TPD_OK;
    tpd_log_error("comm (nccl): %s failed: %s", what, cudaGetErrorString(e));
    return TPD_ERR_BACKEND;
}

/* ---- operation timing ---- */

/* Records a timing event at the current end of `stream`. Completed slots are reused; when
 * every slot is in flight the newest slot is moved forward, keeping its (older) start time,
 * which can only make a timeout fire earlier, never hide one. */
static tpd_status track_now(nccl_ctx *x, cudaStream_t stream) {
    if (x->sh->timeout_s <= 0) return TPD_OK;
    pthread_mutex_lock(&x->sh->mu);
    nccl_track *slot = NULL, *newest = NULL;
    for (int i = 0; i < NCCL_TRACK_SLOTS; i++) {
        nccl_track *t = &x->track[i];
        if (t->busy && cudaEventQuery(t->ev) == cudaSuccess) t->busy = 0;
        if (!t->busy && slot == NULL) slot = t;
        if (t->busy && (newest == NULL || t->t0 > newest->t0)) newest = t;
    }
    double t0 = tpd_clock_s();
    if (slot == NULL) {
        slot = newest;
        t0 = newest->t0;
    }
    cudaError_t e = cudaEventRecord(slot->ev, stream);
    if (e == cudaSuccess) {
        slot->busy = 1;
        slot->t0 = t0;
    }
    pthread_mutex_unlock(&x->sh->mu);
    return cuda_check(e, "cudaEventRecord (operation timing)");
}

/* After enqueueing on `stream`: time it now, or when the enclosing group ends. */
static tpd_status enqueued(nccl_ctx *x, cudaStream_t stream) {
    if (x->group_depth == 0) return track_now(x, stream);
    for (int i = 0; i < x->n_group_streams; i++)
        if (x->group_streams[i] == stream) return TPD_OK;
    if (x->n_group_streams == NCCL_GROUP_MAX) {
        tpd_log_error("comm %s (nccl): more than %d streams in one group", x->self->name,
                      NCCL_GROUP_MAX);
        return TPD_ERR_INVALID;
    }
    x->group_streams[x->n_group_streams++] = stream;
    return TPD_OK;
}

static void *watchdog_main(void *arg) {
    nccl_shared *sh = (nccl_shared *)arg;
    cudaSetDevice(sh->device); /* event queries run against this rank's device */
    while (!sh->stop) {
        sleep_ms(WATCHDOG_PERIOD_MS);
        pthread_mutex_lock(&sh->mu);
        const char *bad_name = NULL;
        const char *why = NULL;
        ncclResult_t bad_r = ncclSuccess;
        double now = tpd_clock_s();
        for (int i = 0; i < sh->nlive && bad_name == NULL; i++) {
            nccl_ctx *x = sh->live[i];
            if (x->aborted || x->comm == NULL) continue;
            ncclResult_t state = ncclSuccess;
            ncclResult_t r = ncclCommGetAsyncError(x->comm, &state);
            if (r != ncclSuccess) state = r;
            if (state != ncclSuccess && state != ncclInProgress) {
                bad_name = x->self->name;
                bad_r = state;
                why = "asynchronous error";
                break;
            }
            if (sh->timeout_s <= 0) continue;
            for (int k = 0; k < NCCL_TRACK_SLOTS; k++) {
                nccl_track *t = &x->track[k];
                if (!t->busy) continue;
                if (cudaEventQuery(t->ev) == cudaSuccess) {
                    t->busy = 0;
                } else if (now - t->t0 > sh->timeout_s) {
                    bad_name = x->self->name;
                    why = "timeout";
                    break;
                }
            }
        }
        if (bad_name != NULL) {
            if (bad_r != ncclSuccess)
                tpd_log_error("comm %s (nccl): %s: %s; aborting every communicator and exiting",
                              bad_name, why, ncclGetErrorString(bad_r));
            else
                tpd_log_error("comm %s (nccl): an operation did not complete within "
                              "comm.timeout_s = %.0f s (a peer rank is dead or stuck); "
                              "aborting every communicator and exiting",
                              bad_name, sh->timeout_s);
            abort_all_locked(sh);
            /* The main thread may be blocked in a stream synchronization that nothing else
             * will release: leave (base/fatal.h). */
            fflush(NULL);
            tpd_fatal(TPD_EXIT_COMM, "NCCL watchdog");
        }
        pthread_mutex_unlock(&sh->mu);
    }
    return NULL;
}

/* ---- communicator lifetime ---- */

static const tpd_comm_ops nccl_ops;

static void ctx_free(nccl_ctx *x) {
    for (int i = 0; i < NCCL_TRACK_SLOTS; i++)
        if (x->track[i].ev != NULL) cudaEventDestroy(x->track[i].ev);
    if (x->barrier_buf != NULL) cudaFree(x->barrier_buf);
    if (x->comm_stream != NULL) cudaStreamDestroy(x->comm_stream);
    free(x);
}

/* Wraps an initialized NCCL communicator and registers it with the world's watchdog. */
static tpd_status wrap(nccl_shared *sh, ncclComm_t comm, const char *name, tpd_comm **out_p) {
    tpd_status st = TPD_OK;
    tpd_comm *c = calloc(1, sizeof *c);
    nccl_ctx *x = calloc(1, sizeof *x);
    if (c == NULL || x == NULL) {
        free(c);
        free(x);
        tpd_log_error("comm (nccl): out of memory");
        return TPD_ERR_NOMEM;
    }
    x->comm = comm;
    x->sh = sh;
    x->self = c;
    TPD_CHECK_GOTO(cuda_check(cudaStreamCreateWithFlags(&x->comm_stream, cudaStreamNonBlocking),
                              "cudaStreamCreate"),
                   st, fail);
    TPD_CHECK_GOTO(cuda_check(cudaMalloc((void **)&x->barrier_buf, sizeof(int)), "cudaMalloc"), st,
                   fail);
    for (int i = 0; i < NCCL_TRACK_SLOTS; i++)
        TPD_CHECK_GOTO(cuda_check(cudaEventCreateWithFlags(&x->track[i].ev, cudaEventDisableTiming),
                                  "cudaEventCreate"),
                       st, fail);
    int rank = 0, size = 0;
    if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &size) != ncclSuccess) {
        tpd_log_error("comm %s (nccl): cannot query rank and size", name);
        st = TPD_ERR_COMM;
        goto fail;
    }
    c->ops = &nccl_ops;
    c->ctx = (tpd_comm_ctx *)x;
    c->rank = rank;
    c->size = size;
    snprintf(c->name, sizeof c->name, "%s", name);

    pthread_mutex_lock(&sh->mu);
    if (sh->nlive == NCCL_MAX_LIVE) {
        pthread_mutex_unlock(&sh->mu);
        tpd_log_error("comm %s (nccl): more than %d live communicators", name, NCCL_MAX_LIVE);
        st = TPD_ERR_INVALID;
        goto fail;
    }
    sh->live[sh->nlive++] = x;
    pthread_mutex_unlock(&sh->mu);
    *out_p = c;
    return TPD_OK;

fail:
    ctx_free(x);
    free(c);
    return st;
}

static void shared_free(nccl_shared *sh) {
    if (sh->thread_started) {
        sh->stop = 1;
        pthread_join(sh->thread, NULL);
    }
    pthread_mutex_destroy(&sh->mu);
    free(sh);
}

tpd_status tpd_comm_nccl_world(tpd_comm *mpi_world, int local_rank, double timeout_s,
                               tpd_comm **world_p) {
    void *handle = mpi_world != NULL ? tpd_comm_mpi_handle(mpi_world) : NULL;
    if (mpi_world != NULL && handle == NULL) {
        tpd_log_error("comm world (nccl): the bootstrap needs an MPI communicator");
        return TPD_ERR_INVALID;
    }
    MPI_Comm mc = handle != NULL ? *(MPI_Comm *)handle : MPI_COMM_WORLD;
    int rank = 0, size = 0, ndev = 0;
    MPI_Comm_rank(mc, &rank);
    MPI_Comm_size(mc, &size);

    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || local_rank < 0 || local_rank >= ndev) {
        tpd_log_error("comm world (nccl): local rank %d has no GPU (%d visible%s%s)", local_rank,
                      ce == cudaSuccess ? ndev : 0, ce != cudaSuccess ? ": " : "",
                      ce != cudaSuccess ? cudaGetErrorString(ce) : "");
        return TPD_ERR_UNSUPPORTED;
    }
    if (cuda_check(cudaSetDevice(local_rank), "cudaSetDevice") != TPD_OK) return TPD_ERR_BACKEND;

    /* Rank 0 makes the id; its status travels with it so every rank fails together. */
    struct {
        int ok;
        ncclUniqueId id;
    } boot;
    memset(&boot, 0, sizeof boot);
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&boot.id);
        boot.ok = r == ncclSuccess;
        if (!boot.ok)
            tpd_log_error("comm world (nccl): ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    }
    if (MPI_Bcast(&boot, (int)sizeof boot, MPI_BYTE, 0, mc) != MPI_SUCCESS) {
        tpd_log_error("comm world (nccl): MPI_Bcast of the unique id failed");
        return TPD_ERR_COMM;
    }
    if (!boot.ok) return TPD_ERR_COMM;

    nccl_shared *sh = calloc(1, sizeof *sh);
    if (sh == NULL) {
        tpd_log_error("comm world (nccl): out of memory");
        return TPD_ERR_NOMEM;
    }
    pthread_mutex_init(&sh->mu, NULL);
    sh->timeout_s = timeout_s;
    sh->device = local_rank;

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, size, boot.id, rank, &config);
    if (r == ncclInProgress) {
        int timed_out = 0;
        r = settle(comm, timeout_s, &timed_out);
        if (timed_out) {
            tpd_log_error("comm world (nccl): ncclCommInitRankConfig did not complete within "
                          "%.0f s (rank %d of %d, device %d)",
                          timeout_s, rank, size, local_rank);
            ncclCommAbort(comm);
            shared_free(sh);
            return TPD_ERR_COMM;
        }
    }
    if (r != ncclSuccess) {
        tpd_log_error("comm world (nccl): ncclCommInitRankConfig failed on rank %d of %d "
                      "(device %d): %s",
                      rank, size, local_rank, ncclGetErrorString(r));
        if (comm != NULL) ncclCommAbort(comm);
        shared_free(sh);
        return TPD_ERR_COMM;
    }

    tpd_comm *world = NULL;
    tpd_status st = wrap(sh, comm, "world", &world);
    if (st != TPD_OK) {
        ncclCommAbort(comm);
        shared_free(sh);
        return st;
    }
    if (pthread_create(&sh->thread, NULL, watchdog_main, sh) == 0)
        sh->thread_started = 1;
    else
        tpd_log_warn("comm world (nccl): could not start the watchdog thread; NCCL errors and "
                     "timeouts will not be detected asynchronously");
    *world_p = world;
    return TPD_OK;
}

int tpd_comm_nccl_usable(int local_ranks_on_node, int devices) {
    return devices > 0 && local_ranks_on_node <= devices;
}

static tpd_status nccl_split(tpd_comm *c, int color, int key, tpd_comm **out_p) {
    nccl_ctx *x = CTX(c);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t sub = NULL;
    ncclResult_t r =
        ncclCommSplit(x->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config);
    TPD_CHECK(check(x, r, "ncclCommSplit"));
    if (sub == NULL) { /* this rank passed no color */
        *out_p = NULL;
        return TPD_OK;
    }
    int timed_out = 0;
    r = settle(sub, x->sh->timeout_s, &timed_out);
    if (timed_out || r != ncclSuccess) {
        ncclCommAbort(sub);
        return fail_all(x, "ncclCommSplit (child initialization)", timed_out ? ncclInProgress : r);
    }
    tpd_status st = wrap(x->sh, sub, c->name, out_p);
    if (st != TPD_OK) ncclCommAbort(sub);
    return st;
}

static void unregister(nccl_ctx *x, int *remaining_p) {
    nccl_shared *sh = x->sh;
    pthread_mutex_lock(&sh->mu);
    for (int i = 0; i < sh->nlive; i++)
        if (sh->live[i] == x) {
            sh->live[i] = sh->live[--sh->nlive];
            break;
        }
    *remaining_p = sh->nlive;
    pthread_mutex_unlock(&sh->mu);
}

static void nccl_abort(tpd_comm *c) {
    nccl_ctx *x = CTX(c);
    pthread_mutex_lock(&x->sh->mu);
    if (!x->aborted && x->comm != NULL) ncclCommAbort(x->comm);
    x->aborted = 1;
    pthread_mutex_unlock(&x->sh->mu);
}

/* Finalize (flush outstanding work) then destroy; an aborted communicator is already freed
 * inside NCCL. The world's shared record goes with the last communicator. */
static void nccl_destroy(tpd_comm *c) {
    if (c == NULL) return;
    nccl_ctx *x = CTX(c);
    nccl_shared *sh = x->sh;
    if (!x->aborted && x->comm != NULL && x->has_held) {
        /* A send nobody waited for: issue it so the peer's receive is not left hanging. */
        if (flush_held(x) != TPD_OK) x->has_held = 0;
    }
    if (!x->aborted && x->comm != NULL) {
        ncclResult_t r = ncclCommFinalize(x->comm);
        int timed_out = 0;
        if (r == ncclInProgress) r = settle(x->comm, sh->timeout_s, &timed_out);
        if (r == ncclSuccess)
            ncclCommDestroy(x->comm);
        else
            ncclCommAbort(x->comm);
    }
    x->comm = NULL;
    if (x->comm_stream != NULL) cudaStreamSynchronize(x->comm_stream);
    int remaining = 0;
    unregister(x, &remaining);
    ctx_free(x);
    free(c);
    if (remaining == 0) shared_free(sh);
}

/* ---- collectives ---- */

static tpd_status map_dtype(tpd_comm *c, tpd_dtype dt, ncclDataType_t *out) {
    switch (dt) {
    case TPD_DTYPE_F32:
        *out = ncclFloat32;
        return TPD_OK;
    case TPD_DTYPE_BF16:
        *out = ncclBfloat16;
        return TPD_OK;
    case TPD_DTYPE_I32:
        *out = ncclInt32;
        return TPD_OK;
    case TPD_DTYPE_U8:
        *out = ncclUint8;
        return TPD_OK;
    case TPD_DTYPE_F64:
        *out = ncclFloat64;
        return TPD_OK;
    }
    tpd_log_error("comm %s (nccl): unsupported dtype %d", c->name, (int)dt);
    return TPD_ERR_INVALID;
}

static ncclRedOp_t map_op(tpd_comm_op op) {
    return op == TPD_COMM_OP_MAX ? ncclMax : op == TPD_COMM_OP_MIN ? ncclMin : ncclSum;
}

static tpd_status usable(tpd_comm *c) {
    if (CTX(c)->aborted) {
        tpd_log_error("comm %s (nccl): used after it was aborted", c->name);
        return TPD_ERR_COMM;
    }
    return TPD_OK;
}

static tpd_status nccl_allreduce(tpd_comm *c, const void *send, void *recv, size_t count,
                                 tpd_dtype dt, tpd_comm_op op, void *stream) {
    nccl_ctx *x = CTX(c);
    ncclDataType_t ndt;
    TPD_CHECK(usable(c));
    TPD_CHECK(map_dtype(c, dt, &ndt));
    TPD_CHECK(flush_held(x));
    TPD_CHECK(
        check(x, ncclAllReduce(send, recv, count, ndt, map_op(op), x->comm, (cudaStream_t)stream),
              "ncclAllReduce"));
    return enqueued(x, (cudaStream_t)stream);
}

static tpd_status nccl_reduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                      tpd_dtype dt, tpd_comm_op op, void *stream) {
    nccl_ctx *x = CTX(c);
    ncclDataType_t ndt;
    TPD_CHECK(usable(c));
    TPD_CHECK(map_dtype(c, dt, &ndt));
    TPD_CHECK(flush_held(x));
    TPD_CHECK(check(
        x, ncclReduceScatter(send, recv, recvcount, ndt, map_op(op), x->comm, (cudaStream_t)stream),
        "ncclReduceScatter"));
    return enqueued(x, (cudaStream_t)stream);
}

static tpd_status nccl_allgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                                 tpd_dtype dt, void *stream) {
    nccl_ctx *x = CTX(c);
    ncclDataType_t ndt;
    TPD_CHECK(usable(c));
    TPD_CHECK(map_dtype(c, dt, &ndt));
    TPD_CHECK(flush_held(x));
    TPD_CHECK(check(x, ncclAllGather(send, recv, sendcount, ndt, x->comm, (cudaStream_t)stream),
                    "ncclAllGather"));
    return enqueued(x, (cudaStream_t)stream);
}

static tpd_status nccl_broadcast(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int root,
                                 void *stream) {
    nccl_ctx *x = CTX(c);
    ncclDataType_t ndt;
    TPD_CHECK(usable(c));
    TPD_CHECK(map_dtype(c, dt, &ndt));
    TPD_CHECK(flush_held(x));
    TPD_CHECK(check(x, ncclBroadcast(buf, buf, count, ndt, root, x->comm, (cudaStream_t)stream),
                    "ncclBroadcast"));
    return enqueued(x, (cudaStream_t)stream);
}

/* ---- point-to-point ---- */

/* All p2p calls of a communicator run on its one communication stream, and NCCL runs the
 * operations of a communicator in order anyway. A send posted alone cannot finish before
 * the peer's receive runs, so the pipeline's steady state, where stage s posts
 * send(act -> s+1) then recv(grad <- s+1) while stage s+1 posts send(grad -> s) then
 * recv(act <- s), would deadlock: each send waits for a receive queued behind the other
 * rank's send (any message larger than NCCL's p2p buffer). So an isend outside an explicit
 * group is held back and issued in one NCCL group with the next irecv on the
 * communicator, as Megatron's send_forward_recv_backward does; a held send is issued
 * alone when the next call on the communicator is anything else (another isend, a wait on
 * it, a collective, a barrier, sync or destroy; testing it does not). The only cost is
 * that a send followed by compute rather than a receive (the first stage's warm-up
 * forwards) leaves one compute step later.
 *
 * Issues ops[0..n) (one call, or one group), then records their completion events. */
static tpd_status launch_p2p(nccl_ctx *x, nccl_p2p_op *ops, int n) {
    if (n == 0) return TPD_OK;
    tpd_status st = TPD_OK;
    if (n > 1) TPD_CHECK(check(x, ncclGroupStart(), "ncclGroupStart"));
    for (int i = 0; i < n && st == TPD_OK; i++) {
        nccl_p2p_op *o = &ops[i];
        if (o->is_send)
            st = check(x, ncclSend(o->buf, o->count, o->dt, o->peer, x->comm, x->comm_stream),
                       "ncclSend");
        else
            st = check(x, ncclRecv(o->buf, o->count, o->dt, o->peer, x->comm, x->comm_stream),
                       "ncclRecv");
    }
    if (n > 1) {
        tpd_status st_end = check(x, ncclGroupEnd(), "ncclGroupEnd");
        if (st == TPD_OK) st = st_end;
    }
    if (st != TPD_OK) return st;
    for (int i = 0; i < n; i++) {
        TPD_CHECK(cuda_check(cudaEventRecord(ops[i].q->done, x->comm_stream), "cudaEventRecord"));
        ops[i].q->recorded = 1;
    }
    return track_now(x, x->comm_stream);
}

/* Issues the held send, if any, on its own. */
static tpd_status flush_held(nccl_ctx *x) {
    if (!x->has_held) return TPD_OK;
    x->has_held = 0;
    return launch_p2p(x, &x->held, 1);
}

/* A request for an operation about to go on the communication stream, which is first
 * ordered after an event recorded on the caller's stream: the operation sees everything
 * the caller queued before it (the data is ready), while the caller's stream runs on
 * without waiting for the peers. */
static tpd_status req_after(tpd_comm *c, void *stream, nccl_req **q_p) {
    nccl_ctx *x = CTX(c);
    tpd_status st = TPD_OK;
    nccl_req *q = calloc(1, sizeof *q);
    if (q == NULL) {
        tpd_log_error("comm %s (nccl): out of memory", c->name);
        return TPD_ERR_NOMEM;
    }
    q->stream = (cudaStream_t)stream;
    cudaEvent_t ready = NULL;
    TPD_CHECK_GOTO(
        cuda_check(cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming), "cudaEventCreate"),
        st, fail);
    TPD_CHECK_GOTO(
        cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate"), st,
        fail);
    TPD_CHECK_GOTO(cuda_check(cudaEventRecord(ready, q->stream), "cudaEventRecord"), st, fail);
    TPD_CHECK_GOTO(cuda_check(cudaStreamWaitEvent(x->comm_stream, ready, 0), "cudaStreamWaitEvent"),
                   st, fail);
    cudaEventDestroy(ready); /* safe: the wait above already captured it */
    *q_p = q;
    return TPD_OK;

fail:
    if (ready != NULL) cudaEventDestroy(ready);
    if (q->done != NULL) cudaEventDestroy(q->done);
    free(q);
    return st;
}

static void req_free(nccl_req *q) {
    cudaEventDestroy(q->done);
    free(q);
}

/* The transfer goes on the communication stream after the caller's work (req_after). */
static tpd_status p2p(tpd_comm *c, int is_send, void *buf, size_t count, tpd_dtype dt, int peer,
                      void *stream, tpd_comm_req **req_p) {
    nccl_ctx *x = CTX(c);
    ncclDataType_t ndt;
    nccl_req *q = NULL;
    tpd_status st = TPD_OK;
    TPD_CHECK(usable(c));
    TPD_CHECK(map_dtype(c, dt, &ndt));
    TPD_CHECK(req_after(c, stream, &q));
    nccl_p2p_op op = {q, buf, count, ndt, peer, is_send};
    if (x->group_depth > 0) {
        /* An explicit group: the transfer is issued at ncclGroupEnd, which records its
         * completion event. */
        if (x->n_group_reqs == NCCL_GROUP_MAX) {
            TPD_FAIL_GOTO(TPD_ERR_INVALID, st, fail,
                          "comm %s (nccl): more than %d p2p calls in "
                          "one group",
                          c->name, NCCL_GROUP_MAX);
        }
        if (is_send)
            st = check(x, ncclSend(buf, count, ndt, peer, x->comm, x->comm_stream), "ncclSend");
        else
            st = check(x, ncclRecv(buf, count, ndt, peer, x->comm, x->comm_stream), "ncclRecv");
        if (st != TPD_OK) goto fail;
        x->group_reqs[x->n_group_reqs++] = q;
        TPD_CHECK_GOTO(enqueued(x, x->comm_stream), st, fail);
    } else if (is_send) {
        TPD_CHECK_GOTO(flush_held(x), st, fail);
        x->held = op;
        x->has_held = 1;
    } else if (x->has_held) {
        nccl_p2p_op pair[2] = {x->held, op};
        x->has_held = 0;
        TPD_CHECK_GOTO(launch_p2p(x, pair, 2), st, fail);
    } else {
        TPD_CHECK_GOTO(launch_p2p(x, &op, 1), st, fail);
    }
    *req_p = (tpd_comm_req *)q;
    return TPD_OK;

fail:
    req_free(q);
    return st;
}

static tpd_status nccl_isend(tpd_comm *c, const void *buf, size_t count, tpd_dtype dt, int peer,
                             int tag, void *stream, tpd_comm_req **req_p) {
    (void)tag; /* NCCL matches p2p by order per peer, which the schedules keep */
    return p2p(c, 1, (void *)buf, count, dt, peer, stream, req_p);
}

static tpd_status nccl_irecv(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int peer, int tag,
                             void *stream, tpd_comm_req **req_p) {
    (void)tag;
    return p2p(c, 0, buf, count, dt, peer, stream, req_p);
}

/* ---- non-blocking collectives ---- */

typedef enum { ICOLL_ALLREDUCE, ICOLL_REDUCE_SCATTER, ICOLL_ALLGATHER } icoll_kind;

/* The collective goes on the communication stream after the caller's work (req_after), so
 * the caller's stream computes on while it runs; ->wait joins the two again. count: the
 * blocking call's (all-reduce: elements; reduce-scatter: recvcount; all-gather:
 * sendcount). In place exactly as NCCL's blocking forms. */
static tpd_status icoll(tpd_comm *c, icoll_kind kind, const void *send, void *recv, size_t count,
                        tpd_dtype dt, tpd_comm_op op, void *stream, tpd_comm_req **req_p) {
    nccl_ctx *x = CTX(c);
    ncclDataType_t ndt;
    nccl_req *q = NULL;
    tpd_status st = TPD_OK;
    TPD_CHECK(usable(c));
    TPD_CHECK(map_dtype(c, dt, &ndt));
    if (x->group_depth > 0 && x->n_group_reqs == NCCL_GROUP_MAX) {
        tpd_log_error("comm %s (nccl): more than %d requests in one group", c->name,
                      NCCL_GROUP_MAX);
        return TPD_ERR_INVALID;
    }
    TPD_CHECK(flush_held(x));
    TPD_CHECK(req_after(c, stream, &q));
    q->stream_only = 1;
    cudaStream_t s = x->comm_stream;
    switch (kind) {
    case ICOLL_ALLREDUCE:
        st = check(x, ncclAllReduce(send, recv, count, ndt, map_op(op), x->comm, s),
                   "ncclAllReduce");
        break;
    case ICOLL_REDUCE_SCATTER:
        st = check(x, ncclReduceScatter(send, recv, count, ndt, map_op(op), x->comm, s),
                   "ncclReduceScatter");
        break;
    case ICOLL_ALLGATHER:
        st = check(x, ncclAllGather(send, recv, count, ndt, x->comm, s), "ncclAllGather");
        break;
    }
    if (st != TPD_OK) goto fail;
    if (x->group_depth > 0) {
        /* issued at ncclGroupEnd, which records the completion event */
        TPD_CHECK_GOTO(enqueued(x, s), st, fail);
        x->group_reqs[x->n_group_reqs++] = q;
    } else {
        TPD_CHECK_GOTO(cuda_check(cudaEventRecord(q->done, s), "cudaEventRecord"), st, fail);
        q->recorded = 1;
        TPD_CHECK_GOTO(track_now(x, s), st, fail);
    }
    *req_p = (tpd_comm_req *)q;
    return TPD_OK;

fail:
    req_free(q);
    return st;
}

static tpd_status nccl_iallreduce(tpd_comm *c, const void *send, void *recv, size_t count,
                                  tpd_dtype dt, tpd_comm_op op, void *stream,
                                  tpd_comm_req **req_p) {
    return icoll(c, ICOLL_ALLREDUCE, send, recv, count, dt, op, stream, req_p);
}

static tpd_status nccl_ireduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                       tpd_dtype dt, tpd_comm_op op, void *stream,
                                       tpd_comm_req **req_p) {
    return icoll(c, ICOLL_REDUCE_SCATTER, send, recv, recvcount, dt, op, stream, req_p);
}

static tpd_status nccl_iallgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                                  tpd_dtype dt, void *stream, tpd_comm_req **req_p) {
    return icoll(c, ICOLL_ALLGATHER, send, recv, sendcount, dt, TPD_COMM_OP_SUM, stream, req_p);
}

/* The caller's stream waits for the operation. For a p2p transfer so does the host (a
 * received buffer is ready, a sent one reusable, when wait returns); a collective leaves
 * the host running, as a blocking one would (tpd_comm_sync waits). */
static tpd_status nccl_wait(tpd_comm *c, tpd_comm_req *req) {
    if (req == NULL) return TPD_OK;
    nccl_req *q = (nccl_req *)req;
    nccl_ctx *x = CTX(c);
    tpd_status st = TPD_OK;
    if (!q->recorded && x->has_held && x->held.q == q) st = flush_held(x);
    if (st != TPD_OK) {
        /* already reported */
    } else if (!q->recorded) {
        tpd_log_error("comm %s (nccl): wait on a request whose group has not ended", c->name);
        st = TPD_ERR_INVALID;
    } else {
        st = cuda_check(cudaStreamWaitEvent(q->stream, q->done, 0), "cudaStreamWaitEvent");
        if (st == TPD_OK && !q->stream_only)
            st = cuda_check(cudaEventSynchronize(q->done), "cudaEventSynchronize");
    }
    req_free(q);
    return st;
}

/* The GPU and NCCL's proxy thread move the operation on by themselves: test only asks the
 * completion event. A held send is not issued here (that would undo its pairing with the
 * next receive): it reports not done until the next call on the communicator issues it,
 * as does a request whose group has not ended. */
static tpd_status nccl_test(tpd_comm *c, tpd_comm_req *req, int *done_p) {
    nccl_req *q = (nccl_req *)req;
    if (!q->recorded) {
        *done_p = 0;
        return TPD_OK;
    }
    cudaError_t e = cudaEventQuery(q->done);
    if (e != cudaSuccess && e != cudaErrorNotReady) {
        tpd_log_error("comm %s (nccl): cudaEventQuery failed: %s", c->name, cudaGetErrorString(e));
        return TPD_ERR_BACKEND;
    }
    *done_p = e == cudaSuccess;
    return TPD_OK;
}

static tpd_status nccl_group_start(tpd_comm *c) {
    nccl_ctx *x = CTX(c);
    TPD_CHECK(usable(c));
    TPD_CHECK(flush_held(x));
    TPD_CHECK(check(x, ncclGroupStart(), "ncclGroupStart"));
    if (x->group_depth++ == 0) {
        x->n_group_streams = 0;
        x->n_group_reqs = 0;
    }
    return TPD_OK;
}

static tpd_status nccl_group_end(tpd_comm *c) {
    nccl_ctx *x = CTX(c);
    if (x->group_depth == 0) {
        tpd_log_error("comm %s (nccl): group_end without group_start", c->name);
        return TPD_ERR_INVALID;
    }
    TPD_CHECK(check(x, ncclGroupEnd(), "ncclGroupEnd"));
    if (--x->group_depth > 0) return TPD_OK;
    for (int i = 0; i < x->n_group_reqs; i++) {
        nccl_req *q = x->group_reqs[i];
        TPD_CHECK(cuda_check(cudaEventRecord(q->done, x->comm_stream), "cudaEventRecord"));
        q->recorded = 1;
    }
    for (int i = 0; i < x->n_group_streams; i++)
        TPD_CHECK(track_now(x, x->group_streams[i]));
    x->n_group_reqs = 0;
    x->n_group_streams = 0;
    return TPD_OK;
}

/* NCCL has no barrier: an all-reduce of one int on the communication stream, waited for. */
static tpd_status nccl_barrier(tpd_comm *c) {
    nccl_ctx *x = CTX(c);
    TPD_CHECK(usable(c));
    TPD_CHECK(flush_held(x));
    TPD_CHECK(check(x,
                    ncclAllReduce(x->barrier_buf, x->barrier_buf, 1, ncclInt32, ncclSum, x->comm,
                                  x->comm_stream),
                    "ncclAllReduce (barrier)"));
    TPD_CHECK(track_now(x, x->comm_stream));
    return cuda_check(cudaStreamSynchronize(x->comm_stream), "cudaStreamSynchronize (barrier)");
}

static tpd_status nccl_sync(tpd_comm *c, void *stream) {
    if (!CTX(c)->aborted) TPD_CHECK(flush_held(CTX(c)));
    return cuda_check(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
}

static const tpd_comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .broadcast = nccl_broadcast,
    .isend = nccl_isend,
    .irecv = nccl_irecv,
    .iallreduce = nccl_iallreduce,
    .ireduce_scatter = nccl_ireduce_scatter,
    .iallgather = nccl_iallgather,
    .wait = nccl_wait,
    .test = nccl_test,
    .group_start = nccl_group_start,
    .group_end = nccl_group_end,
    .barrier = nccl_barrier,
    .sync = nccl_sync,
    .split = nccl_split,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};
