/* The NCCL communicator's sends and receives (with the held send that pairs a lone isend
 * with the next irecv), its non-blocking collectives on the communication stream, requests
 * (wait, test) and explicit groups. Lifetime, the watchdog and the blocking collectives
 * are in comm_nccl.c. */
#include "parallel/comm_nccl_internal.h"

#include <stdio.h>
#include <stdlib.h>

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
        TPD_CHECK(tpd_nccl_cuda_check(cudaEventRecord(ops[i].q->done, x->comm_stream),
                                      "cudaEventRecord"));
        ops[i].q->recorded = 1;
    }
    return tpd_nccl_track_now(x, x->comm_stream);
}

/* Issues the held send, if any, on its own. */
tpd_status tpd_nccl_flush_held(nccl_ctx *x) {
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
    TPD_CHECK_GOTO(tpd_nccl_cuda_check(cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming),
                                       "cudaEventCreate"),
                   st, fail);
    TPD_CHECK_GOTO(tpd_nccl_cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming),
                                       "cudaEventCreate"),
                   st, fail);
    TPD_CHECK_GOTO(tpd_nccl_cuda_check(cudaEventRecord(ready, q->stream), "cudaEventRecord"), st,
                   fail);
    TPD_CHECK_GOTO(
        tpd_nccl_cuda_check(cudaStreamWaitEvent(x->comm_stream, ready, 0), "cudaStreamWaitEvent"),
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
    TPD_CHECK(tpd_nccl_usable(c));
    TPD_CHECK(tpd_nccl_map_dtype(c, dt, &ndt));
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
        TPD_CHECK_GOTO(tpd_nccl_enqueued(x, x->comm_stream), st, fail);
    } else if (is_send) {
        TPD_CHECK_GOTO(tpd_nccl_flush_held(x), st, fail);
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

tpd_status tpd_nccl_isend(tpd_comm *c, const void *buf, size_t count, tpd_dtype dt, int peer,
                          int tag, void *stream, tpd_comm_req **req_p) {
    (void)tag; /* NCCL matches p2p by order per peer, which the schedules keep */
    return p2p(c, 1, (void *)buf, count, dt, peer, stream, req_p);
}

tpd_status tpd_nccl_irecv(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int peer, int tag,
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
    TPD_CHECK(tpd_nccl_usable(c));
    TPD_CHECK(tpd_nccl_map_dtype(c, dt, &ndt));
    if (x->group_depth > 0 && x->n_group_reqs == NCCL_GROUP_MAX) {
        tpd_log_error("comm %s (nccl): more than %d requests in one group", c->name,
                      NCCL_GROUP_MAX);
        return TPD_ERR_INVALID;
    }
    TPD_CHECK(tpd_nccl_flush_held(x));
    TPD_CHECK(req_after(c, stream, &q));
    q->stream_only = 1;
    cudaStream_t s = x->comm_stream;
    switch (kind) {
    case ICOLL_ALLREDUCE:
        st = check(x, ncclAllReduce(send, recv, count, ndt, tpd_nccl_map_op(op), x->comm, s),
                   "ncclAllReduce");
        break;
    case ICOLL_REDUCE_SCATTER:
        st = check(x, ncclReduceScatter(send, recv, count, ndt, tpd_nccl_map_op(op), x->comm, s),
                   "ncclReduceScatter");
        break;
    case ICOLL_ALLGATHER:
        st = check(x, ncclAllGather(send, recv, count, ndt, x->comm, s), "ncclAllGather");
        break;
    }
    if (st != TPD_OK) goto fail;
    if (x->group_depth > 0) {
        /* issued at ncclGroupEnd, which records the completion event */
        TPD_CHECK_GOTO(tpd_nccl_enqueued(x, s), st, fail);
        x->group_reqs[x->n_group_reqs++] = q;
    } else {
        TPD_CHECK_GOTO(tpd_nccl_cuda_check(cudaEventRecord(q->done, s), "cudaEventRecord"), st,
                       fail);
        q->recorded = 1;
        TPD_CHECK_GOTO(tpd_nccl_track_now(x, s), st, fail);
    }
    *req_p = (tpd_comm_req *)q;
    return TPD_OK;

fail:
    req_free(q);
    return st;
}

tpd_status tpd_nccl_iallreduce(tpd_comm *c, const void *send, void *recv, size_t count,
                               tpd_dtype dt, tpd_comm_op op, void *stream, tpd_comm_req **req_p) {
    return icoll(c, ICOLL_ALLREDUCE, send, recv, count, dt, op, stream, req_p);
}

tpd_status tpd_nccl_ireduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                    tpd_dtype dt, tpd_comm_op op, void *stream,
                                    tpd_comm_req **req_p) {
    return icoll(c, ICOLL_REDUCE_SCATTER, send, recv, recvcount, dt, op, stream, req_p);
}

tpd_status tpd_nccl_iallgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                               tpd_dtype dt, void *stream, tpd_comm_req **req_p) {
    return icoll(c, ICOLL_ALLGATHER, send, recv, sendcount, dt, TPD_COMM_OP_SUM, stream, req_p);
}

/* The caller's stream waits for the operation. For a p2p transfer so does the host (a
 * received buffer is ready, a sent one reusable, when wait returns); a collective leaves
 * the host running, as a blocking one would (tpd_comm_sync waits). */
tpd_status tpd_nccl_wait(tpd_comm *c, tpd_comm_req *req) {
    if (req == NULL) return TPD_OK;
    nccl_req *q = (nccl_req *)req;
    nccl_ctx *x = CTX(c);
    tpd_status st = TPD_OK;
    if (!q->recorded && x->has_held && x->held.q == q) st = tpd_nccl_flush_held(x);
    if (st != TPD_OK) {
        /* already reported */
    } else if (!q->recorded) {
        tpd_log_error("comm %s (nccl): wait on a request whose group has not ended", c->name);
        st = TPD_ERR_INVALID;
    } else {
        st = tpd_nccl_cuda_check(cudaStreamWaitEvent(q->stream, q->done, 0), "cudaStreamWaitEvent");
        if (st == TPD_OK && !q->stream_only)
            st = tpd_nccl_cuda_check(cudaEventSynchronize(q->done), "cudaEventSynchronize");
    }
    req_free(q);
    return st;
}

/* The GPU and NCCL's proxy thread move the operation on by themselves: test only asks the
 * completion event. A held send is not issued here (that would undo its pairing with the
 * next receive): it reports not done until the next call on the communicator issues it,
 * as does a request whose group has not ended. */
tpd_status tpd_nccl_test(tpd_comm *c, tpd_comm_req *req, int *done_p) {
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

tpd_status tpd_nccl_group_start(tpd_comm *c) {
    nccl_ctx *x = CTX(c);
    TPD_CHECK(tpd_nccl_usable(c));
    TPD_CHECK(tpd_nccl_flush_held(x));
    TPD_CHECK(check(x, ncclGroupStart(), "ncclGroupStart"));
    if (x->group_depth++ == 0) {
        x->n_group_streams = 0;
        x->n_group_reqs = 0;
    }
    return TPD_OK;
}

tpd_status tpd_nccl_group_end(tpd_comm *c) {
    nccl_ctx *x = CTX(c);
    if (x->group_depth == 0) {
        tpd_log_error("comm %s (nccl): group_end without group_start", c->name);
        return TPD_ERR_INVALID;
    }
    TPD_CHECK(check(x, ncclGroupEnd(), "ncclGroupEnd"));
    if (--x->group_depth > 0) return TPD_OK;
    for (int i = 0; i < x->n_group_reqs; i++) {
        nccl_req *q = x->group_reqs[i];
        TPD_CHECK(tpd_nccl_cuda_check(cudaEventRecord(q->done, x->comm_stream), "cudaEventRecord"));
        q->recorded = 1;
    }
    for (int i = 0; i < x->n_group_streams; i++)
        TPD_CHECK(tpd_nccl_track_now(x, x->group_streams[i]));
    x->n_group_reqs = 0;
    x->n_group_streams = 0;
    return TPD_OK;
}
