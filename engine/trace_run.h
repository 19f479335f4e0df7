/* Chrome trace of real training steps (logging.trace_file), one lane per rank.
 *
 * Lanes: pid = world rank, named "rank R (stage S, tp T, dp D)"; tid 0 holds compute
 * (FWD/BWD, OPTIMIZER), tid 1 communication (SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD,
 * DP_REDUCE). Event names and categories are the planner's `--trace` ones
 * (engine/plan/timeline.c), so a predicted and a measured trace open side by side in
 * Perfetto; the planner's lanes are stages, ours are ranks, and the ranks of stage s are
 * the ones named "stage s".
 *
 * The recorder hooks tpd_trainer.on_action (the pipeline executor calls it after every
 * action with its wall-clock interval) and keeps the intervals in memory; after each step
 * tpd_trace_run_step_end adds the DP reduction and the optimizer from the step's stats.
 * tpd_trace_run_write gathers every rank's events to world rank 0 (MPI), which writes the
 * file. Timestamps are microseconds since a barrier at creation, so ranks line up. */
#ifndef TPD_ENGINE_TRACE_RUN_H
#define TPD_ENGINE_TRACE_RUN_H

#include "base/status.h"
#include "engine/train.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_trace_run tpd_trace_run;

/* Attaches to tr (sets tr->on_action and tr->on_action_user). Records steps from the
 * next one on, at most max_steps of them (<= 0: all). Collective over `world` (a
 * barrier that fixes the common time origin); world must be MPI-backed. */
tpd_status tpd_trace_run_create(tpd_trainer *tr, tpd_comm *world, int max_steps,
                                tpd_trace_run **rec_p);
/* Call after every tpd_trainer_step with its stats: closes the step. */
void tpd_trace_run_step_end(tpd_trace_run *rec, const tpd_step_stats *stats);
/* Stops recording; later steps are not recorded (e.g. after warm-up when the rest is
 * not wanted). */
void tpd_trace_run_pause(tpd_trace_run *rec, int paused);
/* Gathers every rank's events to world rank 0, which writes `path`. Collective. */
tpd_status tpd_trace_run_write(tpd_trace_run *rec, const char *path);
/* Detaches from the trainer (if it still lives: pass it, or NULL) and frees. */
void tpd_trace_run_destroy(tpd_trace_run *rec, tpd_trainer *tr);

#ifdef __cplusplus
}
#endif
#endif
