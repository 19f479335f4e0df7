/* Walks one stage's action list (schedule.h), calling back into the engine for compute
 * and exchanging activations and gradients (count elements each) with the neighbouring
 * stages over the PP communicator.
 *
 * Sends are posted non-blocking and completed lazily, exactly as schedule.h states and
 * the simulator checks for deadlocks: BWD of (j, c) first completes the SEND_ACT of
 * (j, c) (the chunk output lives in the slot that the backward frees) and the previous
 * SEND_GRAD (one gradient send buffer); the end of the list completes the rest. Receives
 * block. Messages are tagged by direction and by the receiving chunk, so that no two
 * messages between a pair of stages can be confused. */
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
    /* The whole backward, or B only in a split list. */
    tpd_status (*backward)(void *user, int micro_batch, int chunk);
    /* W of a split list (may be NULL for lists without WGRAD). */
    tpd_status (*weight_grad)(void *user, int micro_batch, int chunk);
    void *(*act_out)(void *user, int micro_batch, int chunk);  /* chunk output to send */
    void *(*act_in)(void *user, int micro_batch, int chunk);   /* chunk input to receive into */
    void *(*grad_out)(void *user, int micro_batch, int chunk); /* d(chunk input) to send */
    void *(*grad_in)(void *user, int micro_batch, int chunk);  /* d(chunk output) to receive */
    /* Optional: called after each action with its wall-clock interval (tpd_clock_s(),
     * base/clock.h), for traces. */
    void (*on_action)(void *user, const tpd_pp_action *a, double t0, double t1);
} tpd_pp_exec_ops;

typedef struct tpd_pp_exec_stats {
    double compute_s; /* FWD + BWD + WGRAD */
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
