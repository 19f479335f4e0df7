/* A communicator of this process alone, without MPI: collectives are copies (or nothing),
 * splits give another one, and there is no peer to send to. For single-process tools and
 * for tests that must run without an MPI runtime (a forked child, say). Host memory. */
#include "parallel/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "parallel/comm_internal.h"

static tpd_status s_copy(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                         tpd_comm_op op, void *stream) {
    (void)c, (void)op, (void)stream;
    if (send != recv && count) memmove(recv, send, count * tpd_dtype_size(dt));
    return TPD_OK;
}

static tpd_status s_allgather(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                              void *stream) {
    return s_copy(c, send, recv, count, dt, TPD_COMM_OP_SUM, stream);
}

/* Non-blocking forms: done at post, so the request is NULL. */
static tpd_status s_icopy(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                          tpd_comm_op op, void *stream, tpd_comm_req **req_p) {
    TPD_CHECK(s_copy(c, send, recv, count, dt, op, stream));
    *req_p = NULL;
    return TPD_OK;
}

static tpd_status s_iallgather(tpd_comm *c, const void *send, void *recv, size_t count,
                               tpd_dtype dt, void *stream, tpd_comm_req **req_p) {
    return s_icopy(c, send, recv, count, dt, TPD_COMM_OP_SUM, stream, req_p);
}

/* bf16 wire on one rank: the input rounded through bf16 once, as the multi-rank call's
 * reduce-scatter would leave it (the all-reduce's second rounding of a bf16 value is
 * exact). */
static tpd_status s_iwire(tpd_comm *c, const float *send, float *recv, size_t count, void *stream,
                          tpd_comm_req **req_p) {
    (void)c, (void)stream;
    for (size_t i = 0; i < count; i++)
        recv[i] = tpd_bf16_to_f32(tpd_bf16_from_f32(send[i]));
    *req_p = NULL;
    return TPD_OK;
}

static tpd_status s_broadcast(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int root,
                              void *stream) {
    (void)c, (void)buf, (void)count, (void)dt, (void)root, (void)stream;
    return TPD_OK;
}

static tpd_status s_gather(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                           int root) {
    (void)root;
    return s_copy(c, send, recv, count, dt, TPD_COMM_OP_SUM, NULL);
}

static tpd_status s_gatherv(tpd_comm *c, const void *send, size_t sendcount, void *recv,
                            const size_t *counts, const size_t *displs, tpd_dtype dt, int root) {
    (void)counts, (void)root;
    char *at = (char *)recv + displs[0] * tpd_dtype_size(dt);
    return s_copy(c, send, at, sendcount, dt, TPD_COMM_OP_SUM, NULL);
}

static tpd_status s_p2p(tpd_comm *c) {
    tpd_log_error("comm %s (self): no peer to send to or receive from", c->name);
    return TPD_ERR_UNSUPPORTED;
}

static tpd_status s_isend(tpd_comm *c, const void *buf, size_t count, tpd_dtype dt, int peer,
                          int tag, void *stream, tpd_comm_req **req_p) {
    (void)buf, (void)count, (void)dt, (void)peer, (void)tag, (void)stream, (void)req_p;
    return s_p2p(c);
}

static tpd_status s_irecv(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int peer, int tag,
                          void *stream, tpd_comm_req **req_p) {
    (void)buf, (void)count, (void)dt, (void)peer, (void)tag, (void)stream, (void)req_p;
    return s_p2p(c);
}

static tpd_status s_wait(tpd_comm *c, tpd_comm_req *req) {
    (void)c, (void)req;
    return TPD_OK;
}

static tpd_status s_test(tpd_comm *c, tpd_comm_req *req, int *done_p) {
    (void)c, (void)req;
    *done_p = 1;
    return TPD_OK;
}

static tpd_status s_noop(tpd_comm *c) {
    (void)c;
    return TPD_OK;
}

static tpd_status s_sync(tpd_comm *c, void *stream) {
    (void)c, (void)stream;
    return TPD_OK;
}

static tpd_status s_split(tpd_comm *c, int color, int key, tpd_comm **out_p) {
    (void)c, (void)key;
    if (color < 0) {
        *out_p = NULL;
        return TPD_OK;
    }
    return tpd_comm_self_create(out_p);
}

static void s_abort(tpd_comm *c) {
    (void)c;
}

static void s_destroy(tpd_comm *c) {
    free(c);
}

static const tpd_comm_ops g_self_ops = {
    .name = "self",
    .allreduce = s_copy,
    .reduce_scatter = s_copy,
    .allgather = s_allgather,
    .broadcast = s_broadcast,
    .gather = s_gather,
    .gatherv = s_gatherv,
    .isend = s_isend,
    .irecv = s_irecv,
    .iallreduce = s_icopy,
    .ireduce_scatter = s_icopy,
    .iallgather = s_iallgather,
    .iallreduce_wire = s_iwire,
    .ireduce_scatter_wire = s_iwire,
    .wait = s_wait,
    .test = s_test,
    .group_start = s_noop,
    .group_end = s_noop,
    .barrier = s_noop,
    .sync = s_sync,
    .split = s_split,
    .abort = s_abort,
    .destroy = s_destroy,
};

tpd_status tpd_comm_self_create(tpd_comm **c_p) {
    tpd_comm *c = calloc(1, sizeof *c);
    if (!c) return tpd_fail_nomem("the self communicator", sizeof *c);
    c->ops = &g_self_ops;
    c->rank = 0;
    c->size = 1;
    snprintf(c->name, sizeof c->name, "self");
    *c_p = c;
    return TPD_OK;
}
