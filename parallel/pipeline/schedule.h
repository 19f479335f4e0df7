/* Pipeline schedules as data: a pure function returns each stage's action list, the
 * executor (executor.c) walks it, and the planner simulates the same list to predict the
 * bubble and draw the timeline.
 *
 * Semantics shared by the executor and the simulator:
 * - SEND_* never block (posted non-blocking, completed later); RECV_* block until the
 *   matching send of the neighbour stage has been issued.
 * - FWD/BWD of micro-batch j on model chunk `chunk` (0 unless interleaved).
 * - On stage s, SEND_ACT goes to s+1 and RECV_ACT comes from s-1; SEND_GRAD goes to s-1
 *   and RECV_GRAD comes from s+1. With interleaving, chunk c of the last stage sends to
 *   chunk c+1 of stage 0 (and gradients the reverse way). */
#ifndef TPD_PIPELINE_SCHEDULE_H
#define TPD_PIPELINE_SCHEDULE_H

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpd_pp_action_kind {
    TPD_PP_FWD = 0,
    TPD_PP_BWD = 1,
    TPD_PP_SEND_ACT = 2,
    TPD_PP_RECV_ACT = 3,
    TPD_PP_SEND_GRAD = 4,
    TPD_PP_RECV_GRAD = 5,
} tpd_pp_action_kind;

typedef struct tpd_pp_action {
    tpd_pp_action_kind kind;
    int micro_batch; /* 0 .. M-1 */
    int chunk;       /* virtual stage (model chunk) index on this rank, 0 .. v-1 */
} tpd_pp_action;

typedef struct tpd_pp_schedule {
    int stages, stage, micro_batches, virtual_stages;
    int count;
    tpd_pp_action *actions; /* owned */
} tpd_pp_schedule;

const char *tpd_pp_action_name(tpd_pp_action_kind k);

/* Non-interleaved 1F1B: warm-up min(stages-stage-1, M) forwards, steady
 * one-forward-one-backward, cool-down backwards. */
tpd_status tpd_pp_schedule_1f1b(int stages, int stage, int micro_batches, tpd_pp_schedule *sched_p);
/* Megatron's interleaved 1F1B with v model chunks per stage; needs M % stages == 0. */
tpd_status tpd_pp_schedule_interleaved(int stages, int stage, int micro_batches, int virtual_stages,
                                       tpd_pp_schedule *sched_p);
void tpd_pp_schedule_free(tpd_pp_schedule *s);

/* Largest number of micro-batches whose forward has run but whose backward has not,
 * over the list (per chunk summed). 1F1B gives min(stages - stage, M). */
int tpd_pp_schedule_peak_in_flight(const tpd_pp_schedule *s);

/* Event-driven simulation of all stages' lists together.
 * Inputs: per-chunk forward and backward durations (same on every stage) and a p2p
 * latency per send. Outputs per stage: start/end time of every action (arrays of
 * sched[s].count, caller-sized or NULL), the makespan and the busy time. Fails with
 * TPD_ERR_INTERNAL when the lists deadlock (a receive whose send never comes). */
typedef struct tpd_pp_sim_result {
    double makespan;      /* time from first action start to last action end */
    double busy_total;    /* sum over stages of FWD+BWD time */
    double idle_fraction; /* 1 - busy_total / (stages * makespan) */
} tpd_pp_sim_result;

tpd_status tpd_pp_simulate(const tpd_pp_schedule *scheds, int stages, double t_fwd, double t_bwd,
                           double t_p2p, double **start_p, double **end_p,
                           tpd_pp_sim_result *result_p);

#ifdef __cplusplus
}
#endif
#endif
