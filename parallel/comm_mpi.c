/* MPI backend of the communicator interface (host memory, CPU collectives).
 *
 * Errors: communicators use MPI_ERRORS_RETURN so that a failure is logged with the
 * group's name before the process leaves. A watchdog thread bounds every blocking call by
 * the timeout given to tpd_comm_mpi_set_timeout: past it the process logs and leaves with
 * TPD_EXIT_COMM through tpd_fatal, and the launcher (mpirun, srun) tears the job down, so no rank
 * waits forever on a dead peer. */
#include "parallel/comm.h"
#include "parallel/comm_internal.h"

#include "base/bf16.h"
#include "base/fatal.h"
#include "base/clock.h"

#include <mpi.h>
#include <stdio.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct tpd_comm_ctx {
    MPI_Comm comm;
    MPI_Comm wire_comm; /* the compressed all-reduce's messages (wire_post); NULL until then */
    unsigned wire_seq;  /* compressed all-reduces posted: their tags */
};

/* A point-to-point transfer (one MPI request) or a non-blocking collective (one per chunk
 * of a large all-reduce). */
typedef struct wire_op wire_op;

struct tpd_comm_req {
    const char *what; /* for the watchdog and error messages */
    wire_op *wire;    /* a compressed reduction's later stages (wire_step), or NULL */
    /* In-place reduce-scatter: MPI leaves the result at the start of the buffer; it moves
     * to this rank's block when the operation is first seen complete. */
    void *move_to;
    const void *move_from;
    size_t move_bytes;
    int n;
    MPI_Request mreq[];
};

static tpd_status req_new(const char *what, int n, tpd_comm_req **r_p) {
    size_t bytes = sizeof(tpd_comm_req) + (size_t)n * sizeof(MPI_Request);
    tpd_comm_req *r = calloc(1, bytes);
    if (!r) return tpd_fail_nomem(what, bytes);
    r->what = what;
    r->n = n;
    for (int i = 0; i < n; i++)
        r->mreq[i] = MPI_REQUEST_NULL;
    *r_p = r;
    return TPD_OK;
}

/* The completed operation's last step, run once. */
static void req_finish(tpd_comm_req *r) {
    if (r->move_bytes) memmove(r->move_to, r->move_from, r->move_bytes);
    r->move_bytes = 0;
}

/* ---- watchdog: one per process ----
 * The same design as the NCCL watchdog's (comm_nccl.c): what the watchdog thread reads is
 * guarded by the watchdog's mutex, so it never sees a new start time with the previous
 * operation's name; nothing is shared through volatile. */
static struct {
    pthread_t thread;
    int started; /* the main thread's alone */
    pthread_mutex_t mu;
    double timeout_s;  /* under mu */
    double busy_since; /* under mu: monotonic seconds; 0 when idle */
    const char *busy_what;
    const char *busy_comm; /* the communicator's name ("world", "tp", ...) */
} g_wd = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *watchdog_main(void *arg) {
    (void)arg;
    for (;;) {
        sleep(1);
        pthread_mutex_lock(&g_wd.mu);
        double since = g_wd.busy_since, timeout_s = g_wd.timeout_s;
        const char *what = g_wd.busy_what, *comm = g_wd.busy_comm;
        pthread_mutex_unlock(&g_wd.mu);
        if (since > 0 && timeout_s > 0 && tpd_clock_s() - since > timeout_s) {
            tpd_log_error("communication: %s on communicator %s did not complete within "
                          "comm.timeout_s = %.0f s; a peer rank is dead or stuck. Aborting.",
                          what, comm, timeout_s);
            /* Other ranks are blocked in the same collective: leaving is the only way to
             * let the launcher tear the job down (base/fatal.h). */
            tpd_fatal(TPD_EXIT_COMM, "MPI watchdog");
        }
    }
    return NULL;
}

void tpd_comm_mpi_set_timeout(double timeout_s) {
    pthread_mutex_lock(&g_wd.mu);
    g_wd.timeout_s = timeout_s;
    pthread_mutex_unlock(&g_wd.mu);
    if (!g_wd.started && timeout_s > 0) {
        if (pthread_create(&g_wd.thread, NULL, watchdog_main, NULL) == 0) {
            pthread_detach(g_wd.thread);
            g_wd.started = 1;
        }
    }
}

static void busy_begin(const tpd_comm *c, const char *what) {
    double now = tpd_clock_s();
    pthread_mutex_lock(&g_wd.mu);
    g_wd.busy_what = what;
    g_wd.busy_comm = c->name;
    g_wd.busy_since = now;
    pthread_mutex_unlock(&g_wd.mu);
}
static void busy_end(void) {
    pthread_mutex_lock(&g_wd.mu);
    g_wd.busy_since = 0;
    pthread_mutex_unlock(&g_wd.mu);
}

/* ---- bf16 reductions (MPI has no bf16 type) ---- */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    uint16_t *a = in, *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = tpd_bf16_from_f32(tpd_bf16_to_f32(a[i]) + tpd_bf16_to_f32(b[i]));
}
static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    uint16_t *a = in, *b = inout;
    for (int i = 0; i < *len; i++)
        if (tpd_bf16_to_f32(a[i]) > tpd_bf16_to_f32(b[i])) b[i] = a[i];
}
static MPI_Op g_bf16_ops[2] = {MPI_OP_NULL, MPI_OP_NULL};

static tpd_status map_types(tpd_comm *c, tpd_dtype dt, tpd_comm_op op, MPI_Datatype *mdt,
                            MPI_Op *mop) {
    switch (dt) {
    case TPD_DTYPE_F32:
        *mdt = MPI_FLOAT;
        break;
    case TPD_DTYPE_I32:
        *mdt = MPI_INT32_T;
        break;
    case TPD_DTYPE_BF16:
        *mdt = MPI_UINT16_T;
        break;
    case TPD_DTYPE_U8:
        *mdt = MPI_UINT8_T;
        break;
    case TPD_DTYPE_F64:
        *mdt = MPI_DOUBLE;
        break;
    default:
        tpd_log_error("comm %s: unsupported dtype %d", c->name, (int)dt);
        return TPD_ERR_INVALID;
    }
    if (!mop) return TPD_OK;
    if (dt == TPD_DTYPE_BF16) {
        if (op == TPD_COMM_OP_MIN) {
            tpd_log_error("comm %s: no bf16 minimum", c->name);
            return TPD_ERR_INVALID;
        }
        if (g_bf16_ops[0] == MPI_OP_NULL) {
            MPI_Op_create(bf16_sum, 1, &g_bf16_ops[0]);
            MPI_Op_create(bf16_max, 1, &g_bf16_ops[1]);
        }
        *mop = g_bf16_ops[op == TPD_COMM_OP_MAX];
    } else {
        *mop = op == TPD_COMM_OP_MAX ? MPI_MAX : op == TPD_COMM_OP_MIN ? MPI_MIN : MPI_SUM;
    }
    return TPD_OK;
}

static tpd_status mpi_fail(tpd_comm *c, const char *what, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    tpd_log_error("comm %s: %s failed: %s", c->name, what, msg);
    return TPD_ERR_COMM;
}

#define MPI_CALL(c, what, call)                                                                    \
    do {                                                                                           \
        busy_begin((c), what);                                                                     \
        int mpi_rc_ = (call);                                                                      \
        busy_end();                                                                                \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_fail((c), (what), mpi_rc_);                         \
    } while (0)

/* MPI counts are int: large buffers go in chunks. */
#define CHUNK ((size_t)1 << 30)

/* A count that MPI takes as one int; larger ones are an error naming the call. */
static tpd_status int_count(tpd_comm *c, const char *what, size_t count) {
    if (count <= (size_t)INT32_MAX) return TPD_OK;
    tpd_log_error("comm %s: %s of %zu elements exceeds MPI's int count", c->name, what, count);
    return TPD_ERR_UNSUPPORTED;
}

static tpd_status m_allreduce(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                              tpd_comm_op op, void *stream) {
    (void)stream;
    MPI_Datatype mdt;
    MPI_Op mop;
    TPD_CHECK(map_types(c, dt, op, &mdt, &mop));
    size_t es = tpd_dtype_size(dt);
    for (size_t off = 0; off < count; off += CHUNK) {
        size_t n = count - off < CHUNK ? count - off : CHUNK;
        const void *s = send == recv ? MPI_IN_PLACE : (const char *)send + off * es;
        MPI_CALL(c, "all-reduce",
                 MPI_Allreduce(s, (char *)recv + off * es, (int)n, mdt, mop, c->ctx->comm));
    }
    return TPD_OK;
}

static tpd_status m_reduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                   tpd_dtype dt, tpd_comm_op op, void *stream) {
    (void)stream;
    MPI_Datatype mdt;
    MPI_Op mop;
    TPD_CHECK(map_types(c, dt, op, &mdt, &mop));
    TPD_CHECK(int_count(c, "reduce-scatter block", recvcount));
    size_t bytes = recvcount * tpd_dtype_size(dt);
    if ((const char *)recv == (const char *)send + (size_t)c->rank * bytes) {
        /* In place (NCCL's convention: recv is this rank's block of send). MPI's in-place
         * form leaves the result at the start of the buffer; move it to the block. */
        MPI_CALL(c, "reduce-scatter",
                 MPI_Reduce_scatter_block(MPI_IN_PLACE, (void *)send, (int)recvcount, mdt, mop,
                                          c->ctx->comm));
        if (c->rank) memmove(recv, send, bytes);
        return TPD_OK;
    }
    MPI_CALL(c, "reduce-scatter",
             MPI_Reduce_scatter_block(send, recv, (int)recvcount, mdt, mop, c->ctx->comm));
    return TPD_OK;
}

static tpd_status m_allgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                              tpd_dtype dt, void *stream) {
    (void)stream;
    MPI_Datatype mdt;
    TPD_CHECK(map_types(c, dt, TPD_COMM_OP_SUM, &mdt, NULL));
    TPD_CHECK(int_count(c, "all-gather block", sendcount));
    /* In place when send is this rank's block of recv. */
    const char *mine = (const char *)recv + (size_t)c->rank * sendcount * tpd_dtype_size(dt);
    const void *s = (const char *)send == mine ? MPI_IN_PLACE : send;
    MPI_CALL(c, "all-gather",
             MPI_Allgather(s, (int)sendcount, mdt, recv, (int)sendcount, mdt, c->ctx->comm));
    return TPD_OK;
}

/* ---- non-blocking collectives: the blocking ones' chunking and in-place forms ---- */

/* Hands r to the caller, or frees it after a failed post. Chunks posted before the one
 * that failed stay with MPI: a communicator that fails a post is aborted, not reused. */
static tpd_status posted(tpd_comm *c, tpd_comm_req *r, int rc, tpd_comm_req **req_p) {
    if (rc != MPI_SUCCESS) {
        const char *what = r->what;
        free(r);
        return mpi_fail(c, what, rc);
    }
    *req_p = r;
    return TPD_OK;
}

static tpd_status m_iallreduce(tpd_comm *c, const void *send, void *recv, size_t count,
                               tpd_dtype dt, tpd_comm_op op, void *stream, tpd_comm_req **req_p) {
    (void)stream;
    MPI_Datatype mdt;
    MPI_Op mop;
    TPD_CHECK(map_types(c, dt, op, &mdt, &mop));
    size_t es = tpd_dtype_size(dt);
    tpd_comm_req *r = NULL;
    TPD_CHECK(req_new("non-blocking all-reduce", (int)((count + CHUNK - 1) / CHUNK), &r));
    int rc = MPI_SUCCESS;
    for (int i = 0; i < r->n && rc == MPI_SUCCESS; i++) {
        size_t off = (size_t)i * CHUNK;
        size_t n = count - off < CHUNK ? count - off : CHUNK;
        const void *s = send == recv ? MPI_IN_PLACE : (const char *)send + off * es;
        rc =
            MPI_Iallreduce(s, (char *)recv + off * es, (int)n, mdt, mop, c->ctx->comm, &r->mreq[i]);
    }
    return posted(c, r, rc, req_p);
}

static tpd_status m_ireduce_scatter(tpd_comm *c, const void *send, void *recv, size_t recvcount,
                                    tpd_dtype dt, tpd_comm_op op, void *stream,
                                    tpd_comm_req **req_p) {
    (void)stream;
    MPI_Datatype mdt;
    MPI_Op mop;
    TPD_CHECK(map_types(c, dt, op, &mdt, &mop));
    TPD_CHECK(int_count(c, "reduce-scatter block", recvcount));
    size_t bytes = recvcount * tpd_dtype_size(dt);
    tpd_comm_req *r = NULL;
    TPD_CHECK(req_new("non-blocking reduce-scatter", 1, &r));
    int rc;
    if ((const char *)recv == (const char *)send + (size_t)c->rank * bytes) {
        /* In place, as in m_reduce_scatter; the move waits for completion. */
        rc = MPI_Ireduce_scatter_block(MPI_IN_PLACE, (void *)send, (int)recvcount, mdt, mop,
                                       c->ctx->comm, &r->mreq[0]);
        if (c->rank) {
            r->move_to = recv;
            r->move_from = send;
            r->move_bytes = bytes;
        }
    } else {
        rc = MPI_Ireduce_scatter_block(send, recv, (int)recvcount, mdt, mop, c->ctx->comm,
                                       &r->mreq[0]);
    }
    return posted(c, r, rc, req_p);
}

static tpd_status m_iallgather(tpd_comm *c, const void *send, void *recv, size_t sendcount,
                               tpd_dtype dt, void *stream, tpd_comm_req **req_p) {
    (void)stream;
    MPI_Datatype mdt;
    TPD_CHECK(map_types(c, dt, TPD_COMM_OP_SUM, &mdt, NULL));
    TPD_CHECK(int_count(c, "all-gather block", sendcount));
    const char *mine = (const char *)recv + (size_t)c->rank * sendcount * tpd_dtype_size(dt);
    const void *s = (const char *)send == mine ? MPI_IN_PLACE : send;
    tpd_comm_req *r = NULL;
    TPD_CHECK(req_new("non-blocking all-gather", 1, &r));
    int rc = MPI_Iallgather(s, (int)sendcount, mdt, recv, (int)sendcount, mdt, c->ctx->comm,
                            &r->mreq[0]);
    return posted(c, r, rc, req_p);
}

/* ---- compressed reductions: bf16 on the wire, fp32 sums (tpd_comm_iallreduce_wire) ----
 * Stage 1, posted by the call: this rank's contribution rounded to bf16 once, chunk r sent
 * to rank r (MPI_Ialltoallv of 16-bit words, mreq[0]). Stage 2, run by test or wait once
 * the all-to-all completed: the owner sums its chunk's contributions in fp32; the
 * reduce-scatter writes that sum and is done, the all-reduce rounds it to bf16 and sends
 * it to every other rank. That all-gather is point-to-point on a duplicate of the
 * communicator (wire_comm), tagged with the operation's sequence number, and its receives
 * are posted with stage 1: a collective posted from test or wait would start in the order
 * each rank happens to see operations complete, which MPI forbids across ranks. */
struct wire_op {
    int stage; /* 1: all-to-all in flight, 2: the all-gather's messages; 0: done */
    int allreduce;
    size_t count; /* all-reduce: elements of recv */
    size_t mine;  /* elements of this rank's chunk */
    float *recv;
    int *cnt, *dsp;   /* per rank: chunk length and offset in the buffer (elements) */
    int *rcnt, *rdsp; /* the all-to-all's receive side: `mine` from rank r at r*mine */
    int tag;
    uint16_t *out;  /* count words: this rank's contribution */
    uint16_t *in;   /* size*mine words: the contributions to this rank's chunk; then its
                       first `mine` hold the reduced chunk */
    uint16_t *gath; /* all-reduce, count words: every rank's reduced chunk */
};

static void wire_free(wire_op *w) {
    if (!w) return;
    free(w->cnt);
    free(w->dsp);
    free(w->rcnt);
    free(w->rdsp);
    free(w->out);
    free(w->in);
    free(w->gath);
    free(w);
}

/* Moves r on: block waits for its current stage, else only tests it. */
static tpd_status wire_progress(tpd_comm *c, tpd_comm_req *r, int block) {
    wire_op *w = r->wire;
    size_t n = w->mine, size = (size_t)c->size;
    int flag = 0, rc;
    if (w->stage == 1) {
        if (block) {
            busy_begin(c, r->what);
            rc = MPI_Wait(&r->mreq[0], MPI_STATUS_IGNORE);
            busy_end();
            flag = 1;
        } else {
            rc = MPI_Test(&r->mreq[0], &flag, MPI_STATUS_IGNORE);
        }
        if (rc != MPI_SUCCESS) return mpi_fail(c, r->what, rc);
        if (!flag) return TPD_OK;
        for (size_t i = 0; i < n; i++) {
            float acc = 0.0f;
            for (size_t k = 0; k < size; k++)
                acc += tpd_bf16_to_f32(w->in[k * n + i]);
            if (w->allreduce)
                w->in[i] = tpd_bf16_from_f32(acc); /* in[i] is read for i only */
            else
                w->recv[i] = acc;
        }
        if (!w->allreduce) {
            w->stage = 0;
            return TPD_OK;
        }
        if (n) memcpy(w->gath + w->dsp[c->rank], w->in, n * sizeof(uint16_t));
        for (int k = 0; k < c->size; k++) {
            if (k == c->rank) continue;
            rc = MPI_Isend(w->in, (int)n, MPI_UINT16_T, k, w->tag, c->ctx->wire_comm,
                           &r->mreq[1 + c->size + k]);
            if (rc != MPI_SUCCESS) return mpi_fail(c, r->what, rc);
        }
        w->stage = 2;
    }
    if (w->stage == 2) {
        if (block) {
            busy_begin(c, r->what);
            rc = MPI_Waitall(r->n, r->mreq, MPI_STATUSES_IGNORE);
            busy_end();
            flag = 1;
        } else {
            rc = MPI_Testall(r->n, r->mreq, &flag, MPI_STATUSES_IGNORE);
        }
        if (rc != MPI_SUCCESS) return mpi_fail(c, r->what, rc);
        if (!flag) return TPD_OK;
        for (size_t i = 0; i < w->count; i++)
            w->recv[i] = tpd_bf16_to_f32(w->gath[i]);
        w->stage = 0;
    }
    return TPD_OK;
}

/* total elements in send; chunk r is [dsp[r], dsp[r] + cnt[r]). */
static tpd_status wire_post(tpd_comm *c, int allreduce, const float *send, float *recv,
                            size_t total, size_t recvcount, tpd_comm_req **req_p) {
    const char *what = allreduce ? "all-reduce (bf16 wire)" : "reduce-scatter (bf16 wire)";
    TPD_CHECK(int_count(c, what, total));
    if (allreduce && c->ctx->wire_comm == MPI_COMM_NULL) {
        /* first compressed all-reduce: every rank is here, in the same order */
        MPI_CALL(c, what, MPI_Comm_dup(c->ctx->comm, &c->ctx->wire_comm));
        MPI_Comm_set_errhandler(c->ctx->wire_comm, MPI_ERRORS_RETURN);
    }
    size_t size = (size_t)c->size;
    size_t mine = allreduce ? total / size + ((size_t)c->rank < total % size) : recvcount;
    wire_op *w = calloc(1, sizeof *w);
    tpd_comm_req *r = NULL;
    if (w) {
        w->allreduce = allreduce;
        w->count = total;
        w->mine = mine;
        w->recv = recv;
        w->cnt = malloc(size * sizeof(int));
        w->dsp = malloc(size * sizeof(int));
        w->rcnt = malloc(size * sizeof(int));
        w->rdsp = malloc(size * sizeof(int));
        w->out = malloc((total ? total : 1) * sizeof(uint16_t));
        w->in = malloc((mine ? size * mine : 1) * sizeof(uint16_t));
        w->gath = allreduce ? malloc((total ? total : 1) * sizeof(uint16_t)) : NULL;
    }
    if (!w || !w->cnt || !w->dsp || !w->rcnt || !w->rdsp || !w->out || !w->in ||
        (allreduce && !w->gath)) {
        wire_free(w);
        return tpd_fail_nomem("a compressed reduction's buffers", total * 6);
    }
    /* mreq[0]: the all-to-all; [1 + k]: the receive from rank k; [1 + size + k]: the send */
    tpd_status st = req_new(what, allreduce ? 1 + 2 * c->size : 1, &r);
    if (st != TPD_OK) {
        wire_free(w);
        return st;
    }
    r->wire = w;
    size_t off = 0;
    for (size_t k = 0; k < size; k++) {
        size_t len = allreduce ? total / size + (k < total % size) : recvcount;
        w->cnt[k] = (int)len;
        w->dsp[k] = (int)off;
        w->rcnt[k] = (int)mine;
        w->rdsp[k] = (int)(k * mine);
        off += len;
    }
    for (size_t i = 0; i < total; i++)
        w->out[i] = tpd_bf16_from_f32(send[i]);
    w->stage = 1;
    int rc = MPI_Ialltoallv(w->out, w->cnt, w->dsp, MPI_UINT16_T, w->in, w->rcnt, w->rdsp,
                            MPI_UINT16_T, c->ctx->comm, &r->mreq[0]);
    if (allreduce) {
        w->tag = c->ctx->wire_seq++ % 32768; /* MPI guarantees tags up to 32767 */
        for (int k = 0; k < c->size && rc == MPI_SUCCESS; k++)
            if (k != c->rank)
                rc = MPI_Irecv(w->gath + w->dsp[k], w->cnt[k], MPI_UINT16_T, k, w->tag,
                               c->ctx->wire_comm, &r->mreq[1 + k]);
    }
    if (rc != MPI_SUCCESS) {
        /* as posted(): a communicator that fails a post is aborted, not reused */
        wire_free(w);
        free(r);
        return mpi_fail(c, what, rc);
    }
    *req_p = r;
    return TPD_OK;
}

static tpd_status m_iallreduce_wire(tpd_comm *c, const float *send, float *recv, size_t count,
                                    void *stream, tpd_comm_req **req_p) {
    (void)stream;
    return wire_post(c, 1, send, recv, count, 0, req_p);
}

static tpd_status m_ireduce_scatter_wire(tpd_comm *c, const float *send, float *recv,
                                         size_t recvcount, void *stream, tpd_comm_req **req_p) {
    (void)stream;
    return wire_post(c, 0, send, recv, recvcount * (size_t)c->size, recvcount, req_p);
}

static tpd_status m_broadcast(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int root,
                              void *stream) {
    (void)stream;
    MPI_Datatype mdt;
    TPD_CHECK(map_types(c, dt, TPD_COMM_OP_SUM, &mdt, NULL));
    size_t es = tpd_dtype_size(dt);
    for (size_t off = 0; off < count; off += CHUNK) {
        size_t n = count - off < CHUNK ? count - off : CHUNK;
        MPI_CALL(c, "broadcast",
                 MPI_Bcast((char *)buf + off * es, (int)n, mdt, root, c->ctx->comm));
    }
    return TPD_OK;
}

static tpd_status m_gather(tpd_comm *c, const void *send, void *recv, size_t count, tpd_dtype dt,
                           int root) {
    MPI_Datatype mdt;
    TPD_CHECK(map_types(c, dt, TPD_COMM_OP_SUM, &mdt, NULL));
    TPD_CHECK(int_count(c, "gather block", count));
    MPI_CALL(c, "gather",
             MPI_Gather(send, (int)count, mdt, recv, (int)count, mdt, root, c->ctx->comm));
    return TPD_OK;
}

static tpd_status m_gatherv(tpd_comm *c, const void *send, size_t sendcount, void *recv,
                            const size_t *counts, const size_t *displs, tpd_dtype dt, int root) {
    MPI_Datatype mdt;
    TPD_CHECK(map_types(c, dt, TPD_COMM_OP_SUM, &mdt, NULL));
    TPD_CHECK(int_count(c, "gatherv block", sendcount));
    int *ic = NULL, *id = NULL, ok = 1;
    if (c->rank == root) {
        ic = malloc((size_t)c->size * sizeof *ic);
        id = malloc((size_t)c->size * sizeof *id);
        ok = ic && id;
        for (int r = 0; ok && r < c->size; r++) {
            ok = counts[r] <= (size_t)INT32_MAX && displs[r] <= (size_t)INT32_MAX;
            if (ok) {
                ic[r] = (int)counts[r];
                id[r] = (int)displs[r];
            }
        }
    }
    /* every rank learns whether the root can receive before anyone sends */
    tpd_status st = TPD_OK;
    busy_begin(c, "gatherv");
    int rc = MPI_Bcast(&ok, 1, MPI_INT, root, c->ctx->comm);
    busy_end();
    if (rc != MPI_SUCCESS) {
        st = mpi_fail(c, "gatherv", rc);
    } else if (!ok) {
        if (c->rank == root)
            tpd_log_error("comm %s: gatherv of more than MPI's int count (or out of memory)",
                          c->name);
        st = TPD_ERR_UNSUPPORTED;
    } else {
        busy_begin(c, "gatherv");
        rc = MPI_Gatherv(send, (int)sendcount, mdt, recv, ic, id, mdt, root, c->ctx->comm);
        busy_end();
        if (rc != MPI_SUCCESS) st = mpi_fail(c, "gatherv", rc);
    }
    free(ic);
    free(id);
    return st;
}

static tpd_status m_isend(tpd_comm *c, const void *buf, size_t count, tpd_dtype dt, int peer,
                          int tag, void *stream, tpd_comm_req **req_p) {
    (void)stream;
    MPI_Datatype mdt;
    TPD_CHECK(map_types(c, dt, TPD_COMM_OP_SUM, &mdt, NULL));
    TPD_CHECK(int_count(c, "send", count));
    tpd_comm_req *r = NULL;
    TPD_CHECK(req_new("point-to-point wait", 1, &r));
    int rc = MPI_Isend(buf, (int)count, mdt, peer, tag, c->ctx->comm, &r->mreq[0]);
    if (rc != MPI_SUCCESS) {
        free(r);
        return mpi_fail(c, "send", rc);
    }
    *req_p = r;
    return TPD_OK;
}

static tpd_status m_irecv(tpd_comm *c, void *buf, size_t count, tpd_dtype dt, int peer, int tag,
                          void *stream, tpd_comm_req **req_p) {
    (void)stream;
    MPI_Datatype mdt;
    TPD_CHECK(map_types(c, dt, TPD_COMM_OP_SUM, &mdt, NULL));
    TPD_CHECK(int_count(c, "receive", count));
    tpd_comm_req *r = NULL;
    TPD_CHECK(req_new("point-to-point wait", 1, &r));
    int rc = MPI_Irecv(buf, (int)count, mdt, peer, tag, c->ctx->comm, &r->mreq[0]);
    if (rc != MPI_SUCCESS) {
        free(r);
        return mpi_fail(c, "receive", rc);
    }
    *req_p = r;
    return TPD_OK;
}

static tpd_status m_wait(tpd_comm *c, tpd_comm_req *r) {
    if (!r) return TPD_OK;
    if (r->wire) {
        tpd_status st = wire_progress(c, r, 1);
        wire_free(r->wire);
        free(r);
        return st;
    }
    busy_begin(c, r->what);
    int rc = MPI_Waitall(r->n, r->mreq, MPI_STATUSES_IGNORE);
    busy_end();
    if (rc == MPI_SUCCESS) req_finish(r);
    free(r);
    return rc == MPI_SUCCESS ? TPD_OK : mpi_fail(c, "wait", rc);
}

/* MPI_Testall enters the progress engine, which moves every outstanding operation of the
 * process on, not only r's. Requests it completes become MPI_REQUEST_NULL, so a later
 * wait returns at once. */
static tpd_status m_test(tpd_comm *c, tpd_comm_req *r, int *done_p) {
    if (r->wire) {
        TPD_CHECK(wire_progress(c, r, 0));
        *done_p = r->wire->stage == 0;
        return TPD_OK;
    }
    int flag = 0;
    int rc = MPI_Testall(r->n, r->mreq, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(c, "test", rc);
    if (flag) req_finish(r);
    *done_p = flag;
    return TPD_OK;
}

static tpd_status m_noop(tpd_comm *c) {
    (void)c;
    return TPD_OK;
}

static tpd_status m_barrier(tpd_comm *c) {
    MPI_CALL(c, "barrier", MPI_Barrier(c->ctx->comm));
    return TPD_OK;
}

static tpd_status m_sync(tpd_comm *c, void *stream) {
    (void)c;
    (void)stream;
    return TPD_OK;
}

static tpd_status wrap(MPI_Comm mc, tpd_comm **out_p);

static tpd_status m_split(tpd_comm *c, int color, int key, tpd_comm **out_p) {
    MPI_Comm nc;
    MPI_CALL(c, "split", MPI_Comm_split(c->ctx->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc));
    if (nc == MPI_COMM_NULL) {
        *out_p = NULL;
        return TPD_OK;
    }
    return wrap(nc, out_p);
}

static void m_abort(tpd_comm *c) {
    MPI_Abort(c->ctx->comm, TPD_EXIT_COMM);
}

static void m_destroy(tpd_comm *c) {
    if (!c) return;
    if (c->ctx->wire_comm != MPI_COMM_NULL) MPI_Comm_free(&c->ctx->wire_comm);
    if (c->ctx->comm != MPI_COMM_WORLD) MPI_Comm_free(&c->ctx->comm);
    free(c->ctx);
    free(c);
}

static const tpd_comm_ops g_mpi_ops = {
    .name = "mpi",
    .allreduce = m_allreduce,
    .reduce_scatter = m_reduce_scatter,
    .allgather = m_allgather,
    .broadcast = m_broadcast,
    .gather = m_gather,
    .gatherv = m_gatherv,
    .isend = m_isend,
    .irecv = m_irecv,
    .iallreduce = m_iallreduce,
    .ireduce_scatter = m_ireduce_scatter,
    .iallgather = m_iallgather,
    .iallreduce_wire = m_iallreduce_wire,
    .ireduce_scatter_wire = m_ireduce_scatter_wire,
    .wait = m_wait,
    .test = m_test,
    .group_start = m_noop,
    .group_end = m_noop,
    .barrier = m_barrier,
    .sync = m_sync,
    .split = m_split,
    .abort = m_abort,
    .destroy = m_destroy,
};

static tpd_status wrap(MPI_Comm mc, tpd_comm **out_p) {
    tpd_comm *c = calloc(1, sizeof *c);
    tpd_comm_ctx *ctx = calloc(1, sizeof *ctx);
    if (!c || !ctx) {
        free(c);
        free(ctx);
        return tpd_fail_nomem("a communicator", sizeof *c + sizeof *ctx);
    }
    ctx->comm = mc;
    ctx->wire_comm = MPI_COMM_NULL;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mc, &c->rank);
    MPI_Comm_size(mc, &c->size);
    c->ops = &g_mpi_ops;
    c->ctx = ctx;
    *out_p = c;
    return TPD_OK;
}

tpd_status tpd_comm_mpi_world(tpd_comm **world_p) {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
        tpd_log_error("comm: MPI is not initialized");
        return TPD_ERR_INTERNAL;
    }
    tpd_comm *c = NULL;
    TPD_CHECK(wrap(MPI_COMM_WORLD, &c));
    snprintf(c->name, sizeof c->name, "world");
    *world_p = c;
    return TPD_OK;
}

void *tpd_comm_mpi_handle(tpd_comm *c) {
    return c && c->ops == &g_mpi_ops ? (void *)&c->ctx->comm : NULL;
}

static int is_mpi(const tpd_comm *c) {
    return c && c->ops == &g_mpi_ops;
}

/* 1 when tpd_comm_mpi_start initialized MPI (and so finalizes it). */
static int g_started_mpi;

tpd_status tpd_comm_mpi_start(tpd_comm **world_p) {
    int init = 0, provided = 0;
    MPI_Initialized(&init);
    if (!init) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            tpd_log_error("comm: MPI_Init_thread failed");
            return TPD_ERR_COMM;
        }
        g_started_mpi = 1;
    }
    return tpd_comm_mpi_world(world_p);
}

void tpd_comm_mpi_finish(tpd_comm *world) {
    tpd_comm_destroy(world);
    int fin = 0;
    MPI_Finalized(&fin);
    if (g_started_mpi && !fin) MPI_Finalize();
    g_started_mpi = 0;
}

void tpd_comm_mpi_abort_job(int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
}

tpd_status tpd_comm_mpi_split_node(tpd_comm *c, tpd_comm **node_p) {
    if (!is_mpi(c)) {
        tpd_log_error("comm %s: the node split needs an MPI communicator", c->name);
        return TPD_ERR_UNSUPPORTED;
    }
    MPI_Comm nc;
    MPI_CALL(c, "node split",
             MPI_Comm_split_type(c->ctx->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &nc));
    tpd_comm *n = NULL;
    TPD_CHECK(wrap(nc, &n));
    snprintf(n->name, sizeof n->name, "node");
    *node_p = n;
    return TPD_OK;
}
