/* Real-run trace recorder: pipeline actions from the executor's hook, the DP reduction
 * and the optimizer from the step stats, gathered to rank 0 and written with the
 * Chrome-trace writer the planner uses too (engine/trace/trace.h). */
#include "engine/trace/trace_run.h"
#include "base/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/trace/trace.h"

/* Kinds beyond the pipeline's actions. */
enum { EV_DP_REDUCE = 100, EV_OPTIMIZER = 101 };

/* One event as it crosses the wire: kind, micro-batch, chunk, start, end (s since the
 * origin). Doubles only, so one gatherv moves them. */
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
    int32_t info[4]; /* world rank, stage, tp rank, dp rank */
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

void tpd_trace_run_on_action(void *user, const tpd_pp_action *a, double t0, double t1) {
    tpd_trace_run *r = user;
    if (!recording(r)) return;
    push(r, (int)a->kind, a->micro_batch, a->chunk, t0 - r->origin, t1 - r->origin);
    r->step_has_events = 1;
    r->last_end = t1 - r->origin;
}

tpd_status tpd_trace_run_create(tpd_comm *world, int stage, int tp, int dp, int max_steps,
                                tpd_trace_run **rec_p) {
    if (!tpd_comm_is_host(world)) {
        tpd_log_error("trace: the real-run trace needs a host (MPI) world communicator");
        return TPD_ERR_UNSUPPORTED;
    }
    tpd_trace_run *r = calloc(1, sizeof *r);
    if (!r) {
        tpd_log_error("trace: out of memory");
        return TPD_ERR_NOMEM;
    }
    r->world = world;
    r->max_steps = max_steps;
    r->info[0] = tpd_comm_rank(world);
    r->info[1] = stage;
    r->info[2] = tp;
    r->info[3] = dp;
    tpd_status st = tpd_comm_barrier(world);
    if (st != TPD_OK) {
        free(r);
        return st;
    }
    r->origin = tpd_clock_s();
    *rec_p = r;
    return TPD_OK;
}

void tpd_trace_run_step_end(tpd_trace_run *r, double reduce_s, double optim_s) {
    if (!r || !r->step_has_events) return;
    /* The reduction starts when the pipeline's last action ends (the executor returns,
     * then the gradients are reduced), and the optimizer right after it. */
    double t = r->last_end;
    if (reduce_s > 0) push(r, EV_DP_REDUCE, 0, 0, t, t + reduce_s);
    t += reduce_s;
    push(r, EV_OPTIMIZER, 0, 0, t, t + optim_s);
    r->step_has_events = 0;
    r->steps++;
}

void tpd_trace_run_pause(tpd_trace_run *r, int paused) {
    if (r) r->paused = paused;
}

/* Writes the gathered events (rank 0). all: (total, EV_FIELDS); counts per rank. */
static tpd_status write_file(const char *path, const double *all, const int32_t *counts,
                             const int32_t *info, int nranks) {
    tpd_status st = TPD_OK;
    tpd_trace *t = NULL;
    TPD_CHECK(tpd_trace_open(path, &t));
    char name[96], args[96];
    for (int q = 0; q < nranks; q++) {
        const int32_t *in = info + 4 * q;
        snprintf(name, sizeof name, "rank %d (stage %d, tp %d, dp %d)", in[0], in[1], in[2], in[3]);
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
                TPD_CHECK_GOTO(tpd_trace_complete(t, pid, 1, "DP_REDUCE", "dp", ts, dur, NULL), st,
                               close_trace);
                continue;
            }
            if (kind == EV_OPTIMIZER) {
                TPD_CHECK_GOTO(tpd_trace_complete(t, pid, 0, "OPTIMIZER", "compute", ts, dur, NULL),
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
    int nranks = tpd_comm_size(r->world), me = tpd_comm_rank(r->world);
    int32_t n = (int32_t)(r->n * EV_FIELDS);
    int32_t *counts = NULL, *info = NULL, ok = 1;
    size_t *cz = NULL, *displs = NULL;
    double *all = NULL;
    if (me == 0) {
        counts = calloc((size_t)nranks, sizeof *counts);
        info = calloc((size_t)nranks * 4, sizeof *info);
        cz = calloc((size_t)nranks, sizeof *cz);
        displs = calloc((size_t)nranks, sizeof *displs);
        ok = counts && info && cz && displs;
    }
    /* Every rank learns whether rank 0 can receive before anyone sends. */
    TPD_CHECK_GOTO(tpd_comm_broadcast(r->world, &ok, 1, TPD_DTYPE_I32, 0, NULL), st, free_bufs);
    if (!ok) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_bufs, "trace %s: out of memory", path);
    TPD_CHECK_GOTO(tpd_comm_gather(r->world, &n, counts, 1, TPD_DTYPE_I32, 0), st, free_bufs);
    TPD_CHECK_GOTO(tpd_comm_gather(r->world, r->info, info, 4, TPD_DTYPE_I32, 0), st, free_bufs);
    if (me == 0) {
        size_t total = 0;
        for (int q = 0; q < nranks; q++) {
            cz[q] = (size_t)counts[q];
            displs[q] = total;
            total += cz[q];
        }
        all = malloc((total > 0 ? total : 1) * sizeof *all);
        ok = all != NULL;
    }
    TPD_CHECK_GOTO(tpd_comm_broadcast(r->world, &ok, 1, TPD_DTYPE_I32, 0, NULL), st, free_bufs);
    if (!ok) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_bufs, "trace %s: out of memory", path);
    TPD_CHECK_GOTO(tpd_comm_gatherv(r->world, r->ev, (size_t)n, all, cz, displs, TPD_DTYPE_F64, 0),
                   st, free_bufs);
    int32_t code = TPD_OK;
    if (me == 0) {
        for (int q = 0; q < nranks; q++)
            counts[q] /= EV_FIELDS;
        code = (int32_t)write_file(path, all, counts, info, nranks);
    }
    /* Everyone returns rank 0's status, so a write error is seen by the whole job. */
    TPD_CHECK_GOTO(tpd_comm_broadcast(r->world, &code, 1, TPD_DTYPE_I32, 0, NULL), st, free_bufs);
    st = (tpd_status)code;
free_bufs:
    free(all);
    free(displs);
    free(cz);
    free(info);
    free(counts);
    return st;
}

void tpd_trace_run_destroy(tpd_trace_run *r) {
    if (!r) return;
    free(r->ev);
    free(r);
}
