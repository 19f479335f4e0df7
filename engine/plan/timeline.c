/* The predicted timeline of one step as a Chrome trace: the simulator's start and end of
 * every action of every stage, then the exposed DP reduction and the optimizer step. */
#include "engine/plan/plan.h"
#include "engine/trace/trace.h"

#include <stdio.h>
#include <stdlib.h>

#include "parallel/pipeline/schedule.h"

/* tid 0: compute (FWD/BWD); tid 1: communication (sends, receives, DP). */
static tpd_status write_stage(tpd_trace *tr, const tpd_pp_schedule *sc, const double *t0,
                              const double *t1, double p2p) {
    char name[64], args[96];
    for (int i = 0; i < sc->count; i++) {
        const tpd_pp_action *a = &sc->actions[i];
        int compute = a->kind == TPD_PP_FWD || a->kind == TPD_PP_BWD;
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
    int p = l->pp, v = l->virtual_stages > 0 ? l->virtual_stages : 1, built = 0;
    tpd_trace *tr = NULL;
    tpd_pp_schedule *sch = calloc((size_t)p, sizeof *sch);
    tpd_pp_sim_times *times = calloc((size_t)p, sizeof *times);
    double **t0 = calloc((size_t)p, sizeof *t0), **t1 = calloc((size_t)p, sizeof *t1);
    if (!sch || !times || !t0 || !t1)
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_arrays, "trace: out of memory");
    for (; built < p; built++) {
        times[built] = (tpd_pp_sim_times){r->t_fwd_chunk, r->t_bwd_chunk, 0.0, r->t_p2p};
        TPD_CHECK_GOTO(tpd_pp_schedule_make(v > 1 ? TPD_PP_KIND_INTERLEAVED : TPD_PP_KIND_1F1B, p,
                                            built, r->num_micro_batches, v, &sch[built]),
                       st, free_arrays);
    }
    tpd_pp_sim_result sim;
    TPD_CHECK_GOTO(tpd_pp_simulate(sch, p, times, t0, t1, &sim), st, free_arrays);
    TPD_CHECK_GOTO(tpd_trace_open(path, &tr), st, free_arrays);
    char name[64];
    for (int s = 0; s < p; s++) {
        snprintf(name, sizeof name, "stage %d", s);
        TPD_CHECK_GOTO(tpd_trace_process_name(tr, s, name), st, close_trace);
        TPD_CHECK_GOTO(write_stage(tr, &sch[s], t0[s], t1[s], r->t_p2p), st, close_trace);
        double end = sim.makespan;
        if (r->time.dp_comm_exposed > 0.0) {
            TPD_CHECK_GOTO(tpd_trace_complete(tr, s, 1, "DP_REDUCE", "dp", 1e6 * end,
                                              1e6 * r->time.dp_comm_exposed, NULL),
                           st, close_trace);
            end += r->time.dp_comm_exposed;
        }
        TPD_CHECK_GOTO(tpd_trace_complete(tr, s, 0, "OPTIMIZER", "compute", 1e6 * end,
                                          1e6 * r->time.optimizer, NULL),
                       st, close_trace);
    }
close_trace:
    TPD_CHECK_KEEP(tpd_trace_close(tr), st);
free_arrays:
    for (int s = 0; s < built; s++)
        tpd_pp_schedule_free(&sch[s]);
    for (int s = 0; t0 && s < p; s++)
        free(t0[s]);
    for (int s = 0; t1 && s < p; s++)
        free(t1[s]);
    free(t1);
    free(t0);
    free(times);
    free(sch);
    return st;
}
