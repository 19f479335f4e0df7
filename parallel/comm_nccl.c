/* NCCL backend of the communicator interface (device memory, GPU collectives).
 *
 * Communicators are non-blocking (config.blocking = 0), so that initialization, splits and
 * finalization obey the deadline and the watchdog can abort any of them: an NCCL call may
 * return ncclInProgress, after which ncclCommGetAsyncError is polled, first without
 * sleeping, until the communicator settles. Every NCCL call on a communicator holds its
 * lock (NCCL_LOCKED), as the watchdog thread polls and aborts the same communicators; p2p
 * and the non-blocking collectives are in comm_nccl_p2p.c. A world and all communicators split from
 * it share one `nccl_shared` record: the registry of live communicators, the timeout, and the
 * watchdog thread (see comm_nccl.h for why it is the one place that exits the process). */
#include "parallel/comm_nccl.h"
#include "parallel/comm_nccl_internal.h"

#include "base/fatal.h"
#include "base/clock.h"

#include <mpi.h>
#include <nccl.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Aborts x once. Caller holds no lock of x. */
static void abort_one(nccl_ctx *x) {
    tpd_nccl_lock(x);
    if (!x->aborted && x->comm != NULL) ncclCommAbort(x->comm);
    x->aborted = 1;
    pthread_mutex_unlock(&x->mu);
}

/* ---- abort everything ---- */

/* Caller holds sh->mu. */
static void abort_all_locked(nccl_shared *sh) {
    for (int i = 0; i < sh->nlive; i++)
        abort_one(sh->live[i]);
}

/* A failed call on the caller's thread: log, abort every communicator of the world so no
 * peer keeps waiting on this rank, and report TPD_ERR_COMM (the engine then exits with
 * TPD_EXIT_COMM). */
static tpd_status fail_all(nccl_ctx *x, const char *what, ncclResult_t r) {
    char last[256] = "";
    tpd_nccl_lock(x);
    if (!x->aborted && x->comm != NULL) {
        const char *l = ncclGetLastError(x->comm);
        if (l != NULL) snprintf(last, sizeof last, "%s", l);
    }
    pthread_mutex_unlock(&x->mu);
    tpd_log_error("comm %s (nccl): %s failed: %s%s%s; aborting every communicator",
                  x->self != NULL ? x->self->name : "?", what, ncclGetErrorString(r),
                  last[0] ? ": " : "", last);
    pthread_mutex_lock(&x->sh->mu);
    abort_all_locked(x->sh);
    pthread_mutex_unlock(&x->sh->mu);
    return TPD_ERR_COMM;
}

/* Waits for a non-blocking communicator to leave ncclInProgress. x: its context, whose
 * lock each poll takes; NULL while no other thread knows comm (initialization, a split's
 * child). An enqueued collective settles in microseconds: the first SPIN_S are polled
 * without sleeping (with TP that is ~50 collectives per micro-batch, where a 1 ms sleep
 * each would stall the host), and only a long wait (initialization, a split, a finalize)
 * backs off to 1 ms sleeps. */
#define SPIN_S 0.02
static ncclResult_t settle_comm(nccl_ctx *x, ncclComm_t comm, double timeout_s, int *timed_out) {
    double t0 = tpd_clock_s();
    ncclResult_t state = ncclInProgress;
    *timed_out = 0;
    for (;;) {
        ncclResult_t r = x != NULL ? NCCL_LOCKED(x, ncclCommGetAsyncError(comm, &state))
                                   : ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess) return r;
        if (state != ncclInProgress) return state;
        double waited = tpd_clock_s() - t0;
        if (timeout_s > 0 && waited > timeout_s) {
            *timed_out = 1;
            return ncclInProgress;
        }
        if (waited < SPIN_S)
            sched_yield();
        else
            sleep_ms(1);
    }
}

static ncclResult_t settle(nccl_ctx *x, double timeout_s, int *timed_out) {
    return settle_comm(x, x->comm, timeout_s, timed_out);
}

tpd_status tpd_nccl_check_result(nccl_ctx *x, ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return TPD_OK;
    if (r == ncclInProgress) {
        int timed_out = 0;
        r = settle(x, x->sh->timeout_s, &timed_out);
        if (timed_out) {
            tpd_log_error("comm %s (nccl): %s did not complete within %.0f s",
                          x->self != NULL ? x->self->name : "?", what, x->sh->timeout_s);
            return fail_all(x, what, ncclInProgress);
        }
        if (r == ncclSuccess) return TPD_OK;
    }
    return fail_all(x, what, r);
}

tpd_status tpd_nccl_cuda_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return TPD_OK;
    tpd_log_error("comm (nccl): %s failed: %s", what, cudaGetErrorString(e));
    return TPD_ERR_BACKEND;
}

/* ---- operation timing ---- */

/* Records a timing event at the current end of `stream`. Completed slots are reused; when
 * every slot is in flight the newest slot is moved forward, keeping its (older) start time,
 * which can only make a timeout fire earlier, never hide one. */
tpd_status tpd_nccl_track_now(nccl_ctx *x, cudaStream_t stream) {
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
    return tpd_nccl_cuda_check(e, "cudaEventRecord (operation timing)");
}

/* After enqueueing on `stream`: time it now, or when the enclosing group ends. */
tpd_status tpd_nccl_enqueued(nccl_ctx *x, cudaStream_t stream) {
    if (x->group_depth == 0) return tpd_nccl_track_now(x, stream);
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
            if (x->comm == NULL) continue;
            ncclResult_t state = ncclSuccess;
            ncclResult_t r = NCCL_LOCKED(x, ncclCommGetAsyncError(x->comm, &state));
            if (r == ncclInvalidUsage && x->aborted) continue;
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
    pthread_mutex_destroy(&x->mu);
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
    pthread_mutex_init(&x->mu, NULL);
    TPD_CHECK_GOTO(
        tpd_nccl_cuda_check(cudaStreamCreateWithFlags(&x->comm_stream, cudaStreamNonBlocking),
                            "cudaStreamCreate"),
        st, fail);
    TPD_CHECK_GOTO(
        tpd_nccl_cuda_check(cudaMalloc((void **)&x->barrier_buf, sizeof(int)), "cudaMalloc"), st,
        fail);
    for (int i = 0; i < NCCL_TRACK_SLOTS; i++)
        TPD_CHECK_GOTO(
            tpd_nccl_cuda_check(cudaEventCreateWithFlags(&x->track[i].ev, cudaEventDisableTiming),
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

tpd_status tpd_comm_nccl_world(tpd_comm *mpi_world, int device, double timeout_s,
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
    if (ce != cudaSuccess || device < 0 || device >= ndev) {
        tpd_log_error("comm world (nccl): device %d is not among the %d visible%s%s", device,
                      ce == cudaSuccess ? ndev : 0, ce != cudaSuccess ? ": " : "",
                      ce != cudaSuccess ? cudaGetErrorString(ce) : "");
        return TPD_ERR_UNSUPPORTED;
    }
    if (tpd_nccl_cuda_check(cudaSetDevice(device), "cudaSetDevice") != TPD_OK)
        return TPD_ERR_BACKEND;

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
    sh->device = device;

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, size, boot.id, rank, &config);
    if (r == ncclInProgress) {
        int timed_out = 0;
        r = settle_comm(NULL, comm, timeout_s, &timed_out);
        if (timed_out) {
            tpd_log_error("comm world (nccl): ncclCommInitRankConfig did not complete within "
                          "%.0f s (rank %d of %d, device %d)",
                          timeout_s, rank, size, device);
            ncclCommAbort(comm);
            shared_free(sh);
            return TPD_ERR_COMM;
        }
    }
    if (r != ncclSuccess) {
        tpd_log_error("comm world (nccl): ncclCommInitRankConfig failed on rank %d of %d "
                      "(device %d): %s",
                      rank, size, device, ncclGetErrorString(r));
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

static tpd_status nccl_split(tpd_comm *c, int color, int key, tpd_comm **out_p) {
    nccl_ctx *x = CTX(c);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t sub = NULL;
    ncclResult_t r = NCCL_LOCKED(
        x, ncclCommSplit(x->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config));
    TPD_CHECK(tpd_nccl_check_result(x, r, "ncclCommSplit"));
    if (sub == NULL) { /* this rank passed no color */
        *out_p = NULL;
        return TPD_OK;
    }
    int timed_out = 0;
    r = settle_comm(NULL, sub, x->sh->timeout_s, &timed_out);
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
    abort_one(x);
    pthread_mutex_unlock(&x->sh->mu);
}

/* Unregister from the watchdog (which must not poll a communicator being finalized or
 * freed), then finalize (flush outstanding work, under the deadline) and destroy; an
 * aborted communicator is already freed inside NCCL. The world's shared record, and its
 * watchdog, go with the last communicator. */
static void nccl_destroy(tpd_comm *c) {
    if (c == NULL) return;
    nccl_ctx *x = CTX(c);
    nccl_shared *sh = x->sh;
    if (!x->aborted && x->comm != NULL && x->has_held) {
        /* A send nobody waited for: issue it so the peer's receive is not left hanging. */
        if (tpd_nccl_flush_held(x) != TPD_OK) x->has_held = 0;
    }
    int remaining = 0;
    unregister(x, &remaining);
    if (!x->aborted && x->comm != NULL) {
        ncclResult_t r = NCCL_LOCKED(x, ncclCommFinalize(x->comm));
        int timed_out = 0;
        if (r == ncclInProgress) r = settle(x, sh->timeout_s, &timed_out);
        if (r == ncclSuccess)
            ncclCommDestroy(x->comm);
        else
            ncclCommAbort(x->comm);
    }
    x->comm = NULL;
    if (x->comm_stream != NULL) cudaStreamSynchronize(x->comm_stream);
    ctx_free(x);
    free(c);
    if (remaining == 0) shared_free(sh);
}

/* ---- collectives ---- */

tpd_status tpd_nccl_map_dtype(tpd_comm *c, tpd_dtype dt, ncclDataType_t *out) {
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

ncclRedOp_t tpd_nccl_map_op(tpd_comm_op op) {
    return op == TPD_COMM_OP_MAX ? ncclMax : op == TPD_COMM_OP_MIN ? ncclMin : ncclSum;
}

tpd_status tpd_nccl_usable(tpd_comm *c) {
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
    TPD_CHECK(tpd_nccl_usable(c));
    TPD_CHECK(tpd_nccl_map_dtype(c, dt, &ndt));
    TPD_CHECK(tpd_nccl_flush_held(x));
    TPD_CHECK(check(
        x,
        ncclAllReduce(send, recv, count, ndt, tpd_nccl_map_op(op), x->comm, (cudaStream_t)stream),
        "ncclAllReduce"));
    return tpd_nccl_enqueued(x, (cudaStream_t)stream);
}

static tpd_status nccl_reduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                      tpd_dtype dt, tpd_comm_op op, void *stream) {
    nccl_ctx *x = CTX(c);
    ncclDataType_t ndt;
    TPD_CHECK(tpd_nccl_usable(c));
    TPD_CHECK(tpd_nccl_map_dtype(c, dt, &ndt));
    TPD_CHECK(tpd_nccl_flush_held(x));
    TPD_CHECK(check(x,
                    ncclReduceScatter(send, recv, recvcount, ndt, tpd_nccl_map_op(op), x->comm,
                                      (cudaStream_t)stream),
                    "ncclReduceScatter"));
    return tpd_nccl_enqueued(x, (cudaStream_t)stream);
}

static tpd_status nccl_allgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                                 tpd_dtype dt, void *stream) {
    nccl_ctx *x = CTX(c);
    ncclDataType_t ndt;
    TPD_CHECK(tpd_nccl_usable(c));
    TPD_CHECK(tpd_nccl_map_dtype(c, dt, &ndt));
    TPD_CHECK(tpd_nccl_flush_held(x));
    TPD_CHECK(check(x, ncclAllGather(send, recv, sendcount, ndt, x->comm, (cudaStream_t)stream),
                    "ncclAllGather"));
    return tpd_nccl_enqueued(x, (cudaStream_t)stream);
}

static tpd_status nccl_broadcast(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int root,
                                 void *stream) {
    nccl_ctx *x = CTX(c);
    ncclDataType_t ndt;
    TPD_CHECK(tpd_nccl_usable(c));
    TPD_CHECK(tpd_nccl_map_dtype(c, dt, &ndt));
    TPD_CHECK(tpd_nccl_flush_held(x));
    TPD_CHECK(check(x, ncclBroadcast(buf, buf, count, ndt, root, x->comm, (cudaStream_t)stream),
                    "ncclBroadcast"));
    return tpd_nccl_enqueued(x, (cudaStream_t)stream);
}

/* NCCL has no barrier: an all-reduce of one int on the communication stream, waited for. */
static tpd_status nccl_barrier(tpd_comm *c) {
    nccl_ctx *x = CTX(c);
    TPD_CHECK(tpd_nccl_usable(c));
    TPD_CHECK(tpd_nccl_flush_held(x));
    TPD_CHECK(check(x,
                    ncclAllReduce(x->barrier_buf, x->barrier_buf, 1, ncclInt32, ncclSum, x->comm,
                                  x->comm_stream),
                    "ncclAllReduce (barrier)"));
    TPD_CHECK(tpd_nccl_track_now(x, x->comm_stream));
    return tpd_nccl_cuda_check(cudaStreamSynchronize(x->comm_stream),
                               "cudaStreamSynchronize (barrier)");
}

static tpd_status nccl_sync(tpd_comm *c, void *stream) {
    if (!CTX(c)->aborted) TPD_CHECK(tpd_nccl_flush_held(CTX(c)));
    return tpd_nccl_cuda_check(cudaStreamSynchronize((cudaStream_t)stream),
                               "cudaStreamSynchronize");
}

static const tpd_comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .broadcast = nccl_broadcast,
    .isend = tpd_nccl_isend,
    .irecv = tpd_nccl_irecv,
    .iallreduce = tpd_nccl_iallreduce,
    .ireduce_scatter = tpd_nccl_ireduce_scatter,
    .iallgather = tpd_nccl_iallgather,
    .wait = tpd_nccl_wait,
    .test = tpd_nccl_test,
    .group_start = tpd_nccl_group_start,
    .group_end = tpd_nccl_group_end,
    .barrier = nccl_barrier,
    .sync = nccl_sync,
    .split = nccl_split,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};
