/* Chrome trace of real training steps (logging.trace_file), one lane per rank.
 *
 * Lanes: pid = world rank, named "rank R (stage S, tp T, dp D)"; tid 0 holds compute
 * (FWD/BWD, OPTIMIZER), tid 1 communication (SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD,
 * DP_REDUCE). Event names and categories are the planner's `--trace` ones
 * (engine/plan/timeline.c), so a predicted and a measured trace open side by side in
 * Perfetto; the planner's lanes are stages, ours are ranks, and the ranks of stage s are
 * the ones named "stage s".
 *
 * The recorder observes the pipeline executor (tpd_trace_run_on_action, called after every
 * action with its wall-clock interval; the trainer installs it) and keeps the intervals in
 * memory; after each step tpd_trace_run_step_end adds the DP reduction and the optimizer
 * from the step's timings. It knows nothing of the trainer.
 * tpd_trace_run_write gathers every rank's events to world rank 0 (MPI), which writes the
 * file. Timestamps are microseconds since a barrier at creation, so ranks line up. */
#ifndef TPD_ENGINE_TRACE_RUN_H
#define TPD_ENGINE_TRACE_RUN_H

#include "base/status.h"
#include "parallel/comm.h"
#include "parallel/pipeline/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_trace_run tpd_trace_run;

/* A recorder for this rank, whose lane is named by its mesh coordinates (stage, tp, dp).
 * Records steps from the next one on, at most max_steps of them (<= 0: all). Collective
 * over `world` (a barrier that fixes the common time origin); world is the host
 * communicator. */
tpd_status tpd_trace_run_create(tpd_comm *world, int stage, int tp, int dp, int max_steps,
                                tpd_trace_run **rec_p);
/* The executor's observer (user = the recorder): one pipeline action and its wall-clock
 * interval, seconds of tpd_clock_s(). */
void tpd_trace_run_on_action(void *rec, const tpd_pp_action *a, double t0, double t1);
/* Closes a step: the gradient reduction and then the optimizer followed the pipeline's
 * last action and took reduce_s and optim_s seconds. */
void tpd_trace_run_step_end(tpd_trace_run *rec, double reduce_s, double optim_s);
/* Stops recording; later steps are not recorded (e.g. after warm-up when the rest is
 * not wanted). */
void tpd_trace_run_pause(tpd_trace_run *rec, int paused);
/* Gathers every rank's events to world rank 0, which writes `path`. Collective. */
tpd_status tpd_trace_run_write(tpd_trace_run *rec, const char *path);
void tpd_trace_run_destroy(tpd_trace_run *rec);

#ifdef __cplusplus
}
#endif
#endif
