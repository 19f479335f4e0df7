/* Walks one stage's action list (schedule.h), calling back into the engine for compute
 * and exchanging activations and gradients (micro_batch x seq_length x hidden elements)
 * with the neighbouring stages over the PP communicator.
 *
 * Sends are posted non-blocking and completed lazily: a SEND_ACT of micro-batch j is
 * completed before BWD j (its buffer, the stage output of j, is reused only after that),
 * and a SEND_GRAD is completed before the next BWD (one gradient send buffer). Receives
 * block. This is exactly the model the schedule simulator checks for deadlocks. */
#ifndef TPD_PIPELINE_EXECUTOR_H
#define TPD_PIPELINE_EXECUTOR_H

#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "parallel/pipeline/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_pp_exec_ops {
    void *user;
    tpd_status (*forward)(void *user, int micro_batch, int chunk);
    tpd_status (*backward)(void *user, int micro_batch, int chunk);
    void *(*act_out)(void *user, int micro_batch);  /* stage output to send */
    void *(*act_in)(void *user, int micro_batch);   /* stage input to receive into */
    void *(*grad_out)(void *user, int micro_batch); /* d(stage input) to send */
    void *(*grad_in)(void *user, int micro_batch);  /* d(stage output) to receive into */
    /* Optional: called after each action with its wall-clock interval (tpd_clock_s(),
     * base/clock.h), for traces. */
    void (*on_action)(void *user, const tpd_pp_action *a, double t0, double t1);
} tpd_pp_exec_ops;

typedef struct tpd_pp_exec_stats {
    double compute_s; /* FWD + BWD */
    double wait_s;    /* blocked in receives and send completions */
    double total_s;
} tpd_pp_exec_stats;

/* count elements of dtype per message. pp may be NULL or of size 1 (no p2p actions then
 * appear in a single-stage list). stream: the backend's compute stream. */
tpd_status tpd_pp_execute(const tpd_pp_schedule *s, tpd_comm *pp, const tpd_pp_exec_ops *ops,
                          size_t count, tpd_dtype dtype, void *stream, tpd_pp_exec_stats *stats_p);

#ifdef __cplusplus
}
#endif
#endif
