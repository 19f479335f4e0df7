/* The predicted timeline of one step as a Chrome trace: the simulator's start and end of
 * every action of every stage (each stage with its own times, under the layout's schedule),
 * then each stage's exposed DP reduction, the optimizer step and the exposed ZeRO gathers,
 * and the straggler wait, global syncs and per-step host work. */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"
#include "engine/trace/trace.h"

#include <stdio.h>
#include <stdlib.h>

/* tid 0: compute (FWD/BWD); tid 1: communication (sends, receives, DP). */
static tpd_status write_stage(tpd_trace *tr, const tpd_pp_schedule *sc, const double *t0,
                              const double *t1, double p2p) {
    char name[64], args[96];
    for (int i = 0; i < sc->count; i++) {
        const tpd_pp_action *a = &sc->actions[i];
        int compute = a->kind == TPD_PP_FWD || a->kind == TPD_PP_BWD || a->kind == TPD_PP_WGRAD;
        double dur = t1[i] - t0[i];
        if (a->kind == TPD_PP_SEND_ACT || a->kind == TPD_PP_SEND_GRAD) dur = p2p;
        if (compute)
            snprintf(name, sizeof name, "%s mb=%d chunk=%d", tpd_pp_action_name(a->kind),
                     a->micro_batch, a->chunk);
        else
            snprintf(name, sizeof name, "%s", tpd_pp_action_name(a->kind));
        snprintf(args, sizeof args, "{\"mb\":%d,\"chunk\":%d}", a->micro_batch, a->chunk);
        TPD_CHECK(tpd_trace_complete(tr, sc->stage, compute ? 0 : 1, name,
                                     compute ? "compute" : "p2p", 1e6 * t0[i], 1e6 * dur, args));
    }
    return TPD_OK;
}

tpd_status tpd_plan_write_trace(const tpd_plan_result *r, const char *path) {
    tpd_status st = TPD_OK;
    const tpd_plan_layout *l = &r->layout;
    int p = l->pp;
    tpd_trace *tr = NULL;
    tpd_plan_pipe pipe;
    TPD_CHECK(tpd_plan_pipe_simulate(l, r->num_micro_batches, r->stage_times, &pipe));
    TPD_CHECK_GOTO(tpd_trace_open(path, &tr), st, free_pipe);
    char name[64];
    /* every stage waits for the slowest one's reduction before the optimizer */
    double opt0 = pipe.makespan + r->time.dp_comm_exposed;
    for (int s = 0; s < p; s++) {
        snprintf(name, sizeof name, "stage %d", s);
        TPD_CHECK_GOTO(tpd_trace_process_name(tr, s, name), st, close_trace);
        TPD_CHECK_GOTO(write_stage(tr, &pipe.sched[s], pipe.t0[s], pipe.t1[s], r->t_p2p), st,
                       close_trace);
        if (r->dp_exposed[s] > 0.0)
            TPD_CHECK_GOTO(tpd_trace_complete(tr, s, 1, "DP_REDUCE", "dp", 1e6 * pipe.end[s],
                                              1e6 * r->dp_exposed[s], NULL),
                           st, close_trace);
        TPD_CHECK_GOTO(tpd_trace_complete(tr, s, 0, "OPTIMIZER", "compute", 1e6 * opt0,
                                          1e6 * r->time.optimizer, NULL),
                       st, close_trace);
        if (r->time.dp_gather_exposed > 0.0)
            TPD_CHECK_GOTO(tpd_trace_complete(tr, s, 1, "PARAM_GATHER", "dp",
                                              1e6 * (opt0 + r->time.optimizer),
                                              1e6 * r->time.dp_gather_exposed, NULL),
                           st, close_trace);
        /* the terms of scale and of the host, after the rest of the step: the trace shows
         * how long each is, not where in the step it falls */
        const struct {
            const char *name;
            double dur;
        } tail[] = {{"STRAGGLER_WAIT", r->time.straggler},
                    {"GLOBAL_SYNC", r->time.global_sync},
                    {"STEP_HOST", r->time.step_host}};
        double at = opt0 + r->time.optimizer + r->time.dp_gather_exposed;
        for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) {
            if (tail[i].dur <= 0.0) continue;
            TPD_CHECK_GOTO(tpd_trace_complete(tr, s, 1, tail[i].name, "step", 1e6 * at,
                                              1e6 * tail[i].dur, NULL),
                           st, close_trace);
            at += tail[i].dur;
        }
    }
close_trace:
    TPD_CHECK_KEEP(tpd_trace_close(tr), st);
free_pipe:
    tpd_plan_pipe_free(&pipe);
    return st;
}
