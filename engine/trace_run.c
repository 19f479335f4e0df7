/* Real-run trace recorder: pipeline actions from the executor's hook, the DP reduction
 * and the optimizer from the step stats, gathered to rank 0 and written with the
 * planner's Chrome-trace writer (engine/plan/trace.h). */
#include "engine/trace_run.h"
#include "base/clock.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/trace.h"

/* Kinds beyond the pipeline's actions. */
enum { EV_DP_REDUCE = 100, EV_OPTIMIZER = 101 };

/* One event as it crosses the wire: kind, micro-batch, chunk, start, end (s since the
 * origin). Doubles only, so one MPI_Gatherv moves them. */
#define EV_FIELDS 5

struct tpd_trace_run {
    tpd_comm *world;
    double origin; /* tpd_clock_s() right after the creation barrier */
    int max_steps, steps, paused;
    int step_has_events;
    double last_end; /* end of the last recorded action of this step, s since origin */
    double *ev;      /* (n, EV_FIELDS) */
    size_t n, cap;
    int failed;      /* an allocation failed: the trace is incomplete */
    int info[4];     /* world rank, stage, tp rank, dp rank */
};

static int recording(const tpd_trace_run *r) {
    return !r->paused && (r->max_steps <= 0 || r->steps < r->max_steps);
}

static void push(tpd_trace_run *r, int kind, int mb, int chunk, double t0, double t1) {
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 1024;
        double *p = realloc(r->ev, cap * EV_FIELDS * sizeof *p);
        if (!p) {
            if (!r->failed) tpd_log_warn("trace: out of memory; later events are dropped");
            r->failed = 1;
            return;
        }
        r->ev = p;
        r->cap = cap;
    }
    double *e = r->ev + r->n * EV_FIELDS;
    e[0] = kind;
    e[1] = mb;
    e[2] = chunk;
    e[3] = t0;
    e[4] = t1;
    r->n++;
}

static void on_action(void *user, const tpd_pp_action *a, double t0, double t1) {
    tpd_trace_run *r = user;
    if (!recording(r)) return;
    push(r, (int)a->kind, a->micro_batch, a->chunk, t0 - r->origin, t1 - r->origin);
    r->step_has_events = 1;
    r->last_end = t1 - r->origin;
}

tpd_status tpd_trace_run_create(tpd_trainer *tr, tpd_comm *world, int max_steps,
                                tpd_trace_run **rec_p) {
    if (!tpd_comm_mpi_handle(world)) {
        tpd_log_error("trace: the real-run trace needs an MPI world communicator");
        return TPD_ERR_UNSUPPORTED;
    }
    tpd_trace_run *r = calloc(1, sizeof *r);
    if (!r) {
        tpd_log_error("trace: out of memory");
        return TPD_ERR_NOMEM;
    }
    r->world = world;
    r->max_steps = max_steps;
    r->info[0] = world->rank;
    r->info[1] = tr->mesh.pp;
    r->info[2] = tr->mesh.tp;
    r->info[3] = tr->mesh.dp;
    tpd_status st = world->ops->barrier(world);
    if (st != TPD_OK) {
        free(r);
        return st;
    }
    r->origin = tpd_clock_s();
    tr->on_action = on_action;
    tr->on_action_user = r;
    *rec_p = r;
    return TPD_OK;
}

void tpd_trace_run_step_end(tpd_trace_run *r, const tpd_step_stats *s) {
    if (!r || !r->step_has_events) return;
    /* The reduction starts when the pipeline's last action ends (train.c: the executor
     * returns, then tpd_optim_reduce_grads), and the optimizer right after it. */
    double t = r->last_end;
    if (s->t_reduce_s > 0) push(r, EV_DP_REDUCE, 0, 0, t, t + s->t_reduce_s);
    t += s->t_reduce_s;
    push(r, EV_OPTIMIZER, 0, 0, t, t + s->t_optim_s);
    r->step_has_events = 0;
    r->steps++;
}

void tpd_trace_run_pause(tpd_trace_run *r, int paused) {
    if (r) r->paused = paused;
}

/* Writes the gathered events (rank 0). all: (total, EV_FIELDS); counts per rank. */
static tpd_status write_file(const char *path, const double *all, const int *counts,
                             const int *info, int nranks) {
    tpd_status st = TPD_OK;
    tpd_trace *t = NULL;
    TPD_CHECK(tpd_trace_open(path, &t));
    char name[96], args[96];
    for (int q = 0; q < nranks; q++) {
        const int *in = info + 4 * q;
        snprintf(name, sizeof name, "rank %d (stage %d, tp %d, dp %d)", in[0], in[1], in[2],
                 in[3]);
        TPD_CHECK_GOTO(tpd_trace_process_name(t, in[0], name), st, close_trace);
    }
    size_t off = 0;
    for (int q = 0; q < nranks; q++) {
        int pid = info[4 * q];
        for (int i = 0; i < counts[q]; i++, off++) {
            const double *e = all + off * EV_FIELDS;
            int kind = (int)e[0], mb = (int)e[1], chunk = (int)e[2];
            double ts = 1e6 * e[3], dur = 1e6 * (e[4] - e[3]);
            if (kind == EV_DP_REDUCE) {
                TPD_CHECK_GOTO(tpd_trace_complete(t, pid, 1, "DP_REDUCE", "dp", ts, dur, NULL),
                               st, close_trace);
                continue;
            }
            if (kind == EV_OPTIMIZER) {
                TPD_CHECK_GOTO(tpd_trace_complete(t, pid, 0, "OPTIMIZER", "compute", ts, dur,
                                                  NULL),
                               st, close_trace);
                continue;
            }
            int compute = kind == TPD_PP_FWD || kind == TPD_PP_BWD;
            const char *an = tpd_pp_action_name((tpd_pp_action_kind)kind);
            if (compute)
                snprintf(name, sizeof name, "%s mb=%d chunk=%d", an, mb, chunk);
            else
                snprintf(name, sizeof name, "%s", an);
            snprintf(args, sizeof args, "{\"mb\":%d,\"chunk\":%d}", mb, chunk);
            TPD_CHECK_GOTO(tpd_trace_complete(t, pid, compute ? 0 : 1, name,
                                              compute ? "compute" : "p2p", ts, dur, args),
                           st, close_trace);
        }
    }
close_trace:
    TPD_CHECK_KEEP(tpd_trace_close(t), st);
    return st;
}

tpd_status tpd_trace_run_write(tpd_trace_run *r, const char *path) {
    tpd_status st = TPD_OK;
    MPI_Comm comm = *(MPI_Comm *)tpd_comm_mpi_handle(r->world);
    int nranks = r->world->size, me = r->world->rank;
    int n = (int)r->n * EV_FIELDS;
    int *counts = NULL, *displs = NULL, *info = NULL;
    double *all = NULL;
    if (me == 0) {
        counts = calloc((size_t)nranks, sizeof *counts);
        displs = calloc((size_t)nranks, sizeof *displs);
        info = calloc((size_t)nranks * 4, sizeof *info);
    }
    int ok = me != 0 || (counts && displs && info);
    /* Every rank learns whether rank 0 can receive before anyone sends. */
    MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
    if (!ok) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_bufs, "trace %s: out of memory", path);
    if (MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, comm) != MPI_SUCCESS ||
        MPI_Gather(r->info, 4, MPI_INT, info, 4, MPI_INT, 0, comm) != MPI_SUCCESS)
        TPD_FAIL_GOTO(TPD_ERR_COMM, st, free_bufs, "trace %s: gather failed", path);
    long total = 0;
    if (me == 0) {
        for (int q = 0; q < nranks; q++) {
            displs[q] = (int)total;
            total += counts[q];
        }
        all = malloc((size_t)(total > 0 ? total : 1) * sizeof *all);
        ok = all != NULL;
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
    if (!ok) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_bufs, "trace %s: out of memory", path);
    if (MPI_Gatherv(r->ev, n, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, comm) !=
        MPI_SUCCESS)
        TPD_FAIL_GOTO(TPD_ERR_COMM, st, free_bufs, "trace %s: gather failed", path);
    if (me == 0) {
        for (int q = 0; q < nranks; q++) counts[q] /= EV_FIELDS;
        st = write_file(path, all, counts, info, nranks);
    }
    /* Everyone returns rank 0's status, so a write error is seen by the whole job. */
    int code = (int)st;
    MPI_Bcast(&code, 1, MPI_INT, 0, comm);
    st = (tpd_status)code;
free_bufs:
    free(all);
    free(info);
    free(displs);
    free(counts);
    return st;
}

void tpd_trace_run_destroy(tpd_trace_run *r, tpd_trainer *tr) {
    if (!r) return;
    if (tr && tr->on_action_user == r) {
        tr->on_action = NULL;
        tr->on_action_user = NULL;
    }
    free(r->ev);
    free(r);
}
