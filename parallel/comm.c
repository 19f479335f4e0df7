/* The backend-independent side of comm.h: accessors, and one function per op that calls
 * the communicator's table. */
#include "parallel/comm.h"

#include <stdio.h>
#include <stdlib.h>

#include "parallel/comm_internal.h"

int tpd_comm_rank(const tpd_comm *c) {
    return c->rank;
}

int tpd_comm_size(const tpd_comm *c) {
    return c->size;
}

const char *tpd_comm_name(const tpd_comm *c) {
    return c->name;
}

const char *tpd_comm_backend(const tpd_comm *c) {
    return c->ops->name;
}

tpd_status tpd_comm_allreduce(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                              tpd_comm_op op, void *stream) {
    return c->ops->allreduce(c, send, recv, count, dt, op, stream);
}

tpd_status tpd_comm_reduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                   tpd_dtype dt, tpd_comm_op op, void *stream) {
    return c->ops->reduce_scatter(c, send, recv, recvcount, dt, op, stream);
}

tpd_status tpd_comm_allgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                              tpd_dtype dt, void *stream) {
    return c->ops->allgather(c, send, recv, sendcount, dt, stream);
}

tpd_status tpd_comm_broadcast(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int root,
                              void *stream) {
    return c->ops->broadcast(c, buf, count, dt, root, stream);
}

int tpd_comm_is_host(const tpd_comm *c) {
    return c && c->ops->gather != NULL;
}

static tpd_status host_only(const tpd_comm *c, const char *what) {
    tpd_log_error("comm %s (%s): %s is available on host (MPI) communicators only", c->name,
                  c->ops->name, what);
    return TPD_ERR_UNSUPPORTED;
}

tpd_status tpd_comm_gather(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                           int root) {
    if (!c->ops->gather) return host_only(c, "gather");
    return c->ops->gather(c, send, recv, count, dt, root);
}

tpd_status tpd_comm_gatherv(tpd_comm *c, const void *send, size_t sendcount, void *recv,
                            const size_t *counts, const size_t *displs, tpd_dtype dt, int root) {
    if (!c->ops->gatherv) return host_only(c, "gatherv");
    return c->ops->gatherv(c, send, sendcount, recv, counts, displs, dt, root);
}

tpd_status tpd_comm_isend(tpd_comm *c, const void *buf, size_t count, tpd_dtype dt, int peer,
                          int tag, void *stream, tpd_comm_req **req_p) {
    return c->ops->isend(c, buf, count, dt, peer, tag, stream, req_p);
}

tpd_status tpd_comm_irecv(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int peer, int tag,
                          void *stream, tpd_comm_req **req_p) {
    return c->ops->irecv(c, buf, count, dt, peer, tag, stream, req_p);
}

tpd_status tpd_comm_alltoallv(tpd_comm *c, const void *send, const size_t *sendcounts,
                              const size_t *sdispls, void *recv, const size_t *recvcounts,
                              const size_t *rdispls, tpd_dtype dt, int tag, void *stream) {
    const int n = c->size;
    const size_t es = tpd_dtype_size(dt);
    tpd_comm_req **req = calloc(2 * (size_t)n, sizeof *req);
    if (!req) return tpd_fail_nomem("an all-to-all's requests", 2 * (size_t)n * sizeof *req);
    int nreq = 0;
    tpd_status st = tpd_comm_group_start(c);
    for (int p = 0; p < n && st == TPD_OK; p++) {
        if (recvcounts[p])
            st = tpd_comm_irecv(c, (char *)recv + rdispls[p] * es, recvcounts[p], dt, p, tag,
                                stream, &req[nreq++]);
        if (st == TPD_OK && sendcounts[p])
            st = tpd_comm_isend(c, (const char *)send + sdispls[p] * es, sendcounts[p], dt, p, tag,
                                stream, &req[nreq++]);
    }
    TPD_CHECK_KEEP(tpd_comm_group_end(c), st);
    for (int i = 0; i < nreq; i++)
        if (req[i]) TPD_CHECK_KEEP(tpd_comm_wait(c, req[i]), st);
    free(req);
    return st;
}

tpd_status tpd_comm_iallreduce(tpd_comm *c, const void *send, void *recv, size_t count,
                               tpd_dtype dt, tpd_comm_op op, void *stream, tpd_comm_req **req_p) {
    return c->ops->iallreduce(c, send, recv, count, dt, op, stream, req_p);
}

tpd_status tpd_comm_ireduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                    tpd_dtype dt, tpd_comm_op op, void *stream,
                                    tpd_comm_req **req_p) {
    return c->ops->ireduce_scatter(c, send, recv, recvcount, dt, op, stream, req_p);
}

tpd_status tpd_comm_iallgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                               tpd_dtype dt, void *stream, tpd_comm_req **req_p) {
    return c->ops->iallgather(c, send, recv, sendcount, dt, stream, req_p);
}

/* 1: the plain call (wire == dt); 0: the compressed one; < 0: invalid (logged). */
static int wire_kind(const tpd_comm *c, const char *what, tpd_dtype dt, tpd_dtype wire,
                     tpd_comm_op op) {
    if (wire == dt) return 1;
    if (dt != TPD_DTYPE_F32 || wire != TPD_DTYPE_BF16 || op != TPD_COMM_OP_SUM) {
        tpd_log_error("comm %s (%s): %s carries a bf16 wire for fp32 sums only (dtype %d, "
                      "wire %d, op %d)",
                      c->name, c->ops->name, what, (int)dt, (int)wire, (int)op);
        return -1;
    }
    return 0;
}

static tpd_status no_wire(const tpd_comm *c, const char *what) {
    tpd_log_error("comm %s (%s): %s with a bf16 wire is not implemented on this backend "
                  "(parallel.grad_reduce_dtype / diloco.reduce_dtype: fp32)",
                  c->name, c->ops->name, what);
    return TPD_ERR_UNSUPPORTED;
}

tpd_status tpd_comm_iallreduce_wire(tpd_comm *c, const void *send, void *recv, size_t count,
                                    tpd_dtype dt, tpd_dtype wire, tpd_comm_op op, void *stream,
                                    tpd_comm_req **req_p) {
    *req_p = NULL;
    int k = wire_kind(c, "all-reduce", dt, wire, op);
    if (k < 0) return TPD_ERR_INVALID;
    if (k == 1) return tpd_comm_iallreduce(c, send, recv, count, dt, op, stream, req_p);
    if (!c->ops->iallreduce_wire) return no_wire(c, "all-reduce");
    if (count == 0) return TPD_OK;
    return c->ops->iallreduce_wire(c, send, recv, count, stream, req_p);
}

tpd_status tpd_comm_ireduce_scatter_wire(tpd_comm *c, const void *send, void *recv,
                                         size_t recvcount, tpd_dtype dt, tpd_dtype wire,
                                         tpd_comm_op op, void *stream, tpd_comm_req **req_p) {
    *req_p = NULL;
    int k = wire_kind(c, "reduce-scatter", dt, wire, op);
    if (k < 0) return TPD_ERR_INVALID;
    if (k == 1) return tpd_comm_ireduce_scatter(c, send, recv, recvcount, dt, op, stream, req_p);
    if (!c->ops->ireduce_scatter_wire) return no_wire(c, "reduce-scatter");
    if (recvcount == 0) return TPD_OK;
    return c->ops->ireduce_scatter_wire(c, send, recv, recvcount, stream, req_p);
}

tpd_status tpd_comm_wait(tpd_comm *c, tpd_comm_req *req) {
    return c->ops->wait(c, req);
}

tpd_status tpd_comm_test(tpd_comm *c, tpd_comm_req *req, int *done_p) {
    if (!req) {
        *done_p = 1;
        return TPD_OK;
    }
    return c->ops->test(c, req, done_p);
}

tpd_status tpd_comm_group_start(tpd_comm *c) {
    return c->ops->group_start(c);
}

tpd_status tpd_comm_group_end(tpd_comm *c) {
    return c->ops->group_end(c);
}

tpd_status tpd_comm_barrier(tpd_comm *c) {
    return c->ops->barrier(c);
}

tpd_status tpd_comm_sync(tpd_comm *c, void *stream) {
    return c->ops->sync(c, stream);
}

tpd_status tpd_comm_split(tpd_comm *parent, int color, int key, const char *name,
                          tpd_comm **out_p) {
    tpd_comm *c = NULL;
    TPD_CHECK(parent->ops->split(parent, color, key, &c));
    if (c) snprintf(c->name, sizeof c->name, "%s", name);
    *out_p = c;
    return TPD_OK;
}

void tpd_comm_abort(tpd_comm *c) {
    if (c) c->ops->abort(c);
}

void tpd_comm_destroy(tpd_comm *c) {
    if (c) c->ops->destroy(c);
}
