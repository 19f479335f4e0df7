/* Pipeline schedules as data: a pure function returns each stage's action list, the
 * executor (executor.c) walks it, and the planner simulates the same list to predict the
 * bubble and draw the timeline.
 *
 * Semantics shared by the executor and the simulator:
 * - SEND_* are posted non-blocking; RECV_* block until the matching send of the
 *   neighbour stage has been issued.
 * - A send is complete once the peer has posted the matching receive. BWD of (j, c)
 *   first waits for the completion of the stage's SEND_ACT of (j, c) (its buffer, the
 *   chunk's output, belongs to the slot the backward frees) and of the stage's previous
 *   SEND_GRAD (one gradient send buffer); the list's end waits for every send.
 * - FWD/BWD of micro-batch j on model chunk `chunk` (0 unless interleaved). In a list
 *   with split_backward (ZB-H1), BWD ("B") computes only the input gradients and WGRAD
 *   ("W") later computes the weight gradients of the same (j, chunk).
 * - On stage s, SEND_ACT goes to s+1 and RECV_ACT comes from s-1; SEND_GRAD goes to s-1
 *   and RECV_GRAD comes from s+1. With interleaving, chunk c of the last stage sends to
 *   chunk c+1 of stage 0 (and gradients the reverse way).
 * - Every list of this file sends, to each peer, messages in the order that the peer
 *   receives them (the matching rule of NCCL, which has no tags). */
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
    TPD_PP_WGRAD = 6, /* weight gradients of a split backward */
} tpd_pp_action_kind;

/* The schedules of this file. */
typedef enum tpd_pp_kind {
    TPD_PP_KIND_1F1B = 0,
    TPD_PP_KIND_INTERLEAVED = 1,
    TPD_PP_KIND_ZB_H1 = 2,
} tpd_pp_kind;

typedef struct tpd_pp_action {
    tpd_pp_action_kind kind;
    int micro_batch; /* 0 .. M-1 */
    int chunk;       /* virtual stage (model chunk) index on this rank, 0 .. v-1 */
} tpd_pp_action;

typedef struct tpd_pp_schedule {
    int stages, stage, micro_batches, virtual_stages;
    int split_backward; /* 1: BWD is B only, WGRAD actions carry W */
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
/* Qi et al.'s ZB-H1 (ICLR 2024): 1F1B's warm-up of min(stages-stage-1, M) forwards, then
 * F and B alternate as in 1F1B while each W runs `stage` backwards after its B, the rest
 * after the last B. Every stage then holds up to min(stages, M) micro-batches, stage 0's
 * 1F1B peak, and with t_W <= t_F the bubble is (p-1)(t_F + t_B - t_W) instead of 1F1B's
 * (p-1)(t_F + t_B + t_W) (t_B: input gradients only). */
tpd_status tpd_pp_schedule_zb_h1(int stages, int stage, int micro_batches,
                                 tpd_pp_schedule *sched_p);
/* One of the above by kind (virtual_stages is used by the interleaved one only). */
tpd_status tpd_pp_schedule_make(tpd_pp_kind kind, int stages, int stage, int micro_batches,
                                int virtual_stages, tpd_pp_schedule *sched_p);
void tpd_pp_schedule_free(tpd_pp_schedule *s);

/* Largest number of (micro-batch, chunk) pairs whose forward has run but whose
 * activations are still held (backward not finished: BWD, or WGRAD in a split list),
 * over the list. 1F1B gives min(stages - stage, M); ZB-H1 min(stages, M). */
int tpd_pp_schedule_peak_in_flight(const tpd_pp_schedule *s);
/* The same for the pairs of one chunk between its FWD and its BWD (what the last stage's
 * head keeps for its last chunk). */
int tpd_pp_schedule_peak_in_flight_chunk(const tpd_pp_schedule *s, int chunk);

/* Durations of one stage's actions, per (micro-batch, chunk): fwd; bwd the whole
 * backward, of which wgrad is W's share in a split list (B then takes bwd - wgrad); p2p
 * the time from a send to its arrival. */
typedef struct tpd_pp_sim_times {
    double fwd, bwd, wgrad, p2p;
} tpd_pp_sim_times;

/* Event-driven simulation of all stages' lists together, under the semantics above
 * (blocking receives, the send completions BWD waits for).
 * Inputs: times[s] for each stage s. Outputs per stage: start/end time of every action
 * (arrays of sched[s].count, caller-sized or NULL), the makespan and the busy time. Fails
 * with TPD_ERR_INTERNAL when the lists deadlock (a receive whose send never comes, or a
 * send completion whose receive is never posted). */
typedef struct tpd_pp_sim_result {
    double makespan;      /* time from first action start to last action end */
    double busy_total;    /* sum over stages of FWD+BWD+WGRAD time */
    double idle_fraction; /* 1 - busy_total / (stages * makespan) */
} tpd_pp_sim_result;

tpd_status tpd_pp_simulate(const tpd_pp_schedule *scheds, int stages, const tpd_pp_sim_times *times,
                           double **start_p, double **end_p, tpd_pp_sim_result *result_p);

#ifdef __cplusplus
}
#endif
#endif
