/* Staged GPU communicator: device buffers go through pinned host memory and an MPI
 * communicator. Slower than NCCL (two PCIe copies per call, host reductions), but it works
 * when several ranks share one GPU, which NCCL refuses.
 *
 * Every call has completed when it returns (as on the MPI backend): the device-to-host copy
 * is queued on the caller's stream after the work that produced the data and waited for,
 * and the result is copied back and waited for before returning. The non-blocking
 * collectives are the blocking ones returning a NULL (complete) request: no overlap through
 * host staging, whose copies are waited for anyway and whose pinned buffers every call of
 * the communicator shares. */
#include "parallel/comm_nccl.h"
#include "parallel/comm_internal.h"

#include "base/bf16.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STAGED_BUFS 3

typedef struct staged_ctx {
    tpd_comm *mpi;           /* owned */
    void *host[STAGED_BUFS]; /* pinned staging buffers, grown on demand */
    size_t cap[STAGED_BUFS]; /* bytes */
} staged_ctx;

typedef struct staged_req {
    tpd_comm_req *inner;
    void *host; /* malloc'ed: several p2p requests may be in flight */
    void *dev;  /* receive destination, NULL for a send */
    size_t bytes;
    cudaStream_t stream;
} staged_req;

static staged_ctx *CTX(tpd_comm *c) {
    return (staged_ctx *)c->ctx;
}

static tpd_status cuda_check(tpd_comm *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return TPD_OK;
    tpd_log_error("comm %s (staged): %s failed: %s", c->name, what, cudaGetErrorString(e));
    return TPD_ERR_BACKEND;
}

static tpd_status host_buf(tpd_comm *c, int which, size_t bytes, void **p) {
    staged_ctx *x = CTX(c);
    if (bytes > x->cap[which] || x->host[which] == NULL) {
        if (x->host[which] != NULL) cudaFreeHost(x->host[which]);
        x->host[which] = NULL;
        x->cap[which] = 0;
        size_t want = bytes > 4096 ? bytes : 4096;
        TPD_CHECK(cuda_check(c, cudaMallocHost(&x->host[which], want), "cudaMallocHost"));
        x->cap[which] = want;
    }
    *p = x->host[which];
    return TPD_OK;
}

static tpd_status to_host(tpd_comm *c, void *dst, const void *src, size_t bytes, void *stream) {
    if (bytes == 0) return TPD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    TPD_CHECK(cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s),
                         "cudaMemcpyAsync (to host)"));
    return cuda_check(c, cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

static tpd_status to_device(tpd_comm *c, void *dst, const void *src, size_t bytes, void *stream) {
    if (bytes == 0) return TPD_OK;
    cudaStream_t s = (cudaStream_t)stream;
    TPD_CHECK(cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s),
                         "cudaMemcpyAsync (to device)"));
    return cuda_check(c, cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

static void bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = tpd_bf16_to_f32(src[i]);
}

static void f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = tpd_bf16_from_f32(src[i]);
}

/* Reductions: in_count elements in, out_count out (all-reduce: equal; reduce-scatter:
 * out = in / size). bf16 is widened to fp32 for the MPI reduction, then narrowed back. */
typedef enum { RED_ALLREDUCE, RED_REDUCE_SCATTER } red_kind;

static tpd_status staged_reduce(tpd_comm *c, red_kind kind, const void *send, void *recv,
                                size_t in_count, size_t out_count, tpd_dtype dt, tpd_comm_op op,
                                void *stream) {
    tpd_comm *m = CTX(c)->mpi;
    size_t es = tpd_dtype_size(dt);
    void *h_in = NULL, *h_out = NULL, *h_raw = NULL;
    tpd_dtype mdt = dt == TPD_DTYPE_BF16 ? TPD_DTYPE_F32 : dt;
    size_t mes = tpd_dtype_size(mdt);
    TPD_CHECK(host_buf(c, 0, in_count * es, &h_raw));
    TPD_CHECK(to_host(c, h_raw, send, in_count * es, stream));
    if (dt == TPD_DTYPE_BF16) {
        TPD_CHECK(host_buf(c, 1, in_count * mes, &h_in));
        bf16_to_f32((float *)h_in, (const uint16_t *)h_raw, in_count);
    } else {
        h_in = h_raw;
    }
    TPD_CHECK(host_buf(c, 2, out_count * mes, &h_out));
    if (kind == RED_ALLREDUCE)
        TPD_CHECK(tpd_comm_allreduce(m, h_in, h_out, out_count, mdt, op, NULL));
    else
        TPD_CHECK(tpd_comm_reduce_scatter(m, h_in, h_out, out_count, mdt, op, NULL));
    if (dt == TPD_DTYPE_BF16) {
        /* h_raw (buffer 0) held in_count >= out_count bf16: reuse it for the result. */
        f32_to_bf16((uint16_t *)h_raw, (const float *)h_out, out_count);
        h_out = h_raw;
    }
    return to_device(c, recv, h_out, out_count * es, stream);
}

static tpd_status staged_allreduce(tpd_comm *c, const void *send, void *recv, size_t count,
                                   tpd_dtype dt, tpd_comm_op op, void *stream) {
    return staged_reduce(c, RED_ALLREDUCE, send, recv, count, count, dt, op, stream);
}

static tpd_status staged_reduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                        tpd_dtype dt, tpd_comm_op op, void *stream) {
    return staged_reduce(c, RED_REDUCE_SCATTER, send, recv, recvcount * (size_t)c->size, recvcount,
                         dt, op, stream);
}

/* Data movement without arithmetic keeps the element type (the MPI backend moves bf16 as
 * 16-bit words). */
static tpd_status staged_allgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                                   tpd_dtype dt, void *stream) {
    tpd_comm *m = CTX(c)->mpi;
    size_t es = tpd_dtype_size(dt);
    void *h_in = NULL, *h_out = NULL;
    TPD_CHECK(host_buf(c, 0, sendcount * es, &h_in));
    TPD_CHECK(host_buf(c, 1, sendcount * es * (size_t)c->size, &h_out));
    TPD_CHECK(to_host(c, h_in, send, sendcount * es, stream));
    TPD_CHECK(tpd_comm_allgather(m, h_in, h_out, sendcount, dt, NULL));
    return to_device(c, recv, h_out, sendcount * es * (size_t)c->size, stream);
}

static tpd_status staged_iallreduce(tpd_comm *c, const void *send, void *recv, size_t count,
                                    tpd_dtype dt, tpd_comm_op op, void *stream,
                                    tpd_comm_req **req_p) {
    TPD_CHECK(staged_allreduce(c, send, recv, count, dt, op, stream));
    *req_p = NULL;
    return TPD_OK;
}

static tpd_status staged_ireduce_scatter(tpd_comm *c, const void *send, void *recv,
                                         size_t recvcount, tpd_dtype dt, tpd_comm_op op,
                                         void *stream, tpd_comm_req **req_p) {
    TPD_CHECK(staged_reduce_scatter(c, send, recv, recvcount, dt, op, stream));
    *req_p = NULL;
    return TPD_OK;
}

static tpd_status staged_iallgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                                    tpd_dtype dt, void *stream, tpd_comm_req **req_p) {
    TPD_CHECK(staged_allgather(c, send, recv, sendcount, dt, stream));
    *req_p = NULL;
    return TPD_OK;
}

/* bf16 wire: the fp32 data staged through the host, the MPI backend's compressed
 * reduction on it (waited for here), the fp32 result back. */
static tpd_status staged_wire(tpd_comm *c, int allreduce, const float *send, float *recv,
                              size_t in_count, size_t out_count, void *stream,
                              tpd_comm_req **req_p) {
    tpd_comm *m = CTX(c)->mpi;
    void *h_in = NULL, *h_out = NULL;
    tpd_comm_req *r = NULL;
    TPD_CHECK(host_buf(c, 0, in_count * sizeof(float), &h_in));
    TPD_CHECK(host_buf(c, 1, out_count * sizeof(float), &h_out));
    TPD_CHECK(to_host(c, h_in, send, in_count * sizeof(float), stream));
    if (allreduce)
        TPD_CHECK(tpd_comm_iallreduce_wire(m, h_in, h_out, out_count, TPD_DTYPE_F32, TPD_DTYPE_BF16,
                                           TPD_COMM_OP_SUM, NULL, &r));
    else
        TPD_CHECK(tpd_comm_ireduce_scatter_wire(m, h_in, h_out, out_count, TPD_DTYPE_F32,
                                                TPD_DTYPE_BF16, TPD_COMM_OP_SUM, NULL, &r));
    TPD_CHECK(tpd_comm_wait(m, r));
    TPD_CHECK(to_device(c, recv, h_out, out_count * sizeof(float), stream));
    *req_p = NULL;
    return TPD_OK;
}

static tpd_status staged_iallreduce_wire(tpd_comm *c, const float *send, float *recv, size_t count,
                                         void *stream, tpd_comm_req **req_p) {
    return staged_wire(c, 1, send, recv, count, count, stream, req_p);
}

static tpd_status staged_ireduce_scatter_wire(tpd_comm *c, const float *send, float *recv,
                                              size_t recvcount, void *stream,
                                              tpd_comm_req **req_p) {
    return staged_wire(c, 0, send, recv, recvcount * (size_t)c->size, recvcount, stream, req_p);
}

static tpd_status staged_broadcast(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int root,
                                   void *stream) {
    tpd_comm *m = CTX(c)->mpi;
    size_t bytes = count * tpd_dtype_size(dt);
    void *h = NULL;
    TPD_CHECK(host_buf(c, 0, bytes, &h));
    if (c->rank == root) TPD_CHECK(to_host(c, h, buf, bytes, stream));
    TPD_CHECK(tpd_comm_broadcast(m, h, count, dt, root, NULL));
    if (c->rank != root) TPD_CHECK(to_device(c, buf, h, bytes, stream));
    return TPD_OK;
}

static tpd_status staged_p2p(tpd_comm *c, int is_send, void *buf, size_t count, tpd_dtype dt,
                             int peer, int tag, void *stream, tpd_comm_req **req_p) {
    tpd_comm *m = CTX(c)->mpi;
    size_t bytes = count * tpd_dtype_size(dt);
    staged_req *q = calloc(1, sizeof *q);
    void *h = malloc(bytes > 0 ? bytes : 1);
    if (q == NULL || h == NULL) {
        free(q);
        free(h);
        tpd_log_error("comm %s (staged): out of memory for a %zu-byte transfer", c->name, bytes);
        return TPD_ERR_NOMEM;
    }
    q->host = h;
    q->bytes = bytes;
    q->stream = (cudaStream_t)stream;
    tpd_status st;
    if (is_send) {
        st = to_host(c, h, buf, bytes, stream);
        if (st == TPD_OK) st = tpd_comm_isend(m, h, count, dt, peer, tag, NULL, &q->inner);
    } else {
        q->dev = buf;
        st = tpd_comm_irecv(m, h, count, dt, peer, tag, NULL, &q->inner);
    }
    if (st != TPD_OK) {
        free(h);
        free(q);
        return st;
    }
    *req_p = (tpd_comm_req *)q;
    return TPD_OK;
}

static tpd_status staged_isend(tpd_comm *c, const void *buf, size_t count, tpd_dtype dt, int peer,
                               int tag, void *stream, tpd_comm_req **req_p) {
    return staged_p2p(c, 1, (void *)buf, count, dt, peer, tag, stream, req_p);
}

static tpd_status staged_irecv(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int peer,
                               int tag, void *stream, tpd_comm_req **req_p) {
    return staged_p2p(c, 0, buf, count, dt, peer, tag, stream, req_p);
}

static tpd_status staged_wait(tpd_comm *c, tpd_comm_req *req) {
    if (req == NULL) return TPD_OK;
    staged_req *q = (staged_req *)req;
    tpd_comm *m = CTX(c)->mpi;
    tpd_status st = tpd_comm_wait(m, q->inner);
    if (st == TPD_OK && q->dev != NULL) st = to_device(c, q->dev, q->host, q->bytes, q->stream);
    free(q->host);
    free(q);
    return st;
}

/* Only p2p requests reach here (the collectives' are NULL). A receive is done when its
 * host buffer has arrived; wait still copies it to the device. */
static tpd_status staged_test(tpd_comm *c, tpd_comm_req *req, int *done_p) {
    staged_req *q = (staged_req *)req;
    tpd_comm *m = CTX(c)->mpi;
    return tpd_comm_test(m, q->inner, done_p);
}

static tpd_status staged_group_start(tpd_comm *c) {
    tpd_comm *m = CTX(c)->mpi;
    return tpd_comm_group_start(m);
}

static tpd_status staged_group_end(tpd_comm *c) {
    tpd_comm *m = CTX(c)->mpi;
    return tpd_comm_group_end(m);
}

static tpd_status staged_barrier(tpd_comm *c) {
    tpd_comm *m = CTX(c)->mpi;
    return tpd_comm_barrier(m);
}

static tpd_status staged_sync(tpd_comm *c, void *stream) {
    /* Every call has completed on return; this only orders the caller's own stream. */
    return cuda_check(c, cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
}

static tpd_status staged_split(tpd_comm *c, int color, int key, tpd_comm **out_p) {
    tpd_comm *m = CTX(c)->mpi;
    tpd_comm *child = NULL;
    TPD_CHECK(m->ops->split(m, color, key, &child));
    if (child == NULL) {
        *out_p = NULL;
        return TPD_OK;
    }
    snprintf(child->name, sizeof child->name, "%s", c->name);
    tpd_status st = tpd_comm_staged_create(child, out_p);
    if (st != TPD_OK) tpd_comm_destroy(child);
    return st;
}

static void staged_abort(tpd_comm *c) {
    tpd_comm *m = CTX(c)->mpi;
    tpd_comm_abort(m);
}

static void staged_destroy(tpd_comm *c) {
    if (c == NULL) return;
    staged_ctx *x = CTX(c);
    for (int i = 0; i < STAGED_BUFS; i++)
        if (x->host[i] != NULL) cudaFreeHost(x->host[i]);
    if (x->mpi != NULL) tpd_comm_destroy(x->mpi);
    free(x);
    free(c);
}

static const tpd_comm_ops staged_ops = {
    .name = "staged",
    .allreduce = staged_allreduce,
    .reduce_scatter = staged_reduce_scatter,
    .allgather = staged_allgather,
    .broadcast = staged_broadcast,
    .isend = staged_isend,
    .irecv = staged_irecv,
    .iallreduce = staged_iallreduce,
    .ireduce_scatter = staged_ireduce_scatter,
    .iallgather = staged_iallgather,
    .iallreduce_wire = staged_iallreduce_wire,
    .ireduce_scatter_wire = staged_ireduce_scatter_wire,
    .wait = staged_wait,
    .test = staged_test,
    .group_start = staged_group_start,
    .group_end = staged_group_end,
    .barrier = staged_barrier,
    .sync = staged_sync,
    .split = staged_split,
    .abort = staged_abort,
    .destroy = staged_destroy,
};

tpd_status tpd_comm_staged_create(tpd_comm *mpi_comm, tpd_comm **comm_p) {
    if (mpi_comm == NULL) {
        tpd_log_error("comm (staged): no MPI communicator to wrap");
        return TPD_ERR_INVALID;
    }
    tpd_comm *c = calloc(1, sizeof *c);
    staged_ctx *x = calloc(1, sizeof *x);
    if (c == NULL || x == NULL) {
        free(c);
        free(x);
        tpd_log_error("comm %s (staged): out of memory", mpi_comm->name);
        return TPD_ERR_NOMEM;
    }
    x->mpi = mpi_comm;
    c->ops = &staged_ops;
    c->ctx = (tpd_comm_ctx *)x;
    c->rank = mpi_comm->rank;
    c->size = mpi_comm->size;
    snprintf(c->name, sizeof c->name, "%s", mpi_comm->name);
    *comm_p = c;
    return TPD_OK;
}
