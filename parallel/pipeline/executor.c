#include "parallel/pipeline/executor.h"

#include <stdlib.h>

#include "base/clock.h"

/* Tags keep activations and gradients apart; FIFO order per (peer, tag) keeps
 * micro-batches in order. */
enum { TAG_ACT = 1, TAG_GRAD = 2 };

tpd_status tpd_pp_execute(const tpd_pp_schedule *s, tpd_comm *pp, const tpd_pp_exec_ops *ops,
                          size_t count, tpd_dtype dtype, void *stream, tpd_pp_exec_stats *stats_p) {
    tpd_status st = TPD_OK;
    int M = s->micro_batches;
    tpd_comm_req **act_send = calloc((size_t)M, sizeof *act_send);
    tpd_comm_req *grad_send = NULL;
    tpd_pp_exec_stats stats = {0};
    double t_begin = tpd_clock_s();
    if (!act_send) return TPD_ERR_NOMEM;

    for (int i = 0; i < s->count; i++) {
        const tpd_pp_action *a = &s->actions[i];
        int j = a->micro_batch;
        double t0 = tpd_clock_s();
        int is_compute = 0;
        tpd_comm_req *req = NULL;
        switch (a->kind) {
        case TPD_PP_FWD:
            is_compute = 1;
            TPD_CHECK_GOTO(ops->forward(ops->user, j, a->chunk), st, out);
            break;
        case TPD_PP_BWD:
            /* buffers of j's forward output and the one gradient send buffer are about to
             * be reused */
            TPD_CHECK_GOTO(tpd_comm_wait(pp, act_send[j]), st, out);
            act_send[j] = NULL;
            TPD_CHECK_GOTO(tpd_comm_wait(pp, grad_send), st, out);
            grad_send = NULL;
            t0 = tpd_clock_s();
            is_compute = 1;
            TPD_CHECK_GOTO(ops->backward(ops->user, j, a->chunk), st, out);
            break;
        case TPD_PP_SEND_ACT:
            TPD_CHECK_GOTO(tpd_comm_isend(pp, ops->act_out(ops->user, j), count, dtype,
                                          s->stage + 1, TAG_ACT, stream, &act_send[j]),
                           st, out);
            break;
        case TPD_PP_RECV_ACT:
            TPD_CHECK_GOTO(tpd_comm_irecv(pp, ops->act_in(ops->user, j), count, dtype, s->stage - 1,
                                          TAG_ACT, stream, &req),
                           st, out);
            TPD_CHECK_GOTO(tpd_comm_wait(pp, req), st, out);
            break;
        case TPD_PP_SEND_GRAD:
            TPD_CHECK_GOTO(tpd_comm_isend(pp, ops->grad_out(ops->user, j), count, dtype,
                                          s->stage - 1, TAG_GRAD, stream, &grad_send),
                           st, out);
            break;
        case TPD_PP_RECV_GRAD:
            TPD_CHECK_GOTO(tpd_comm_irecv(pp, ops->grad_in(ops->user, j), count, dtype,
                                          s->stage + 1, TAG_GRAD, stream, &req),
                           st, out);
            TPD_CHECK_GOTO(tpd_comm_wait(pp, req), st, out);
            break;
        }
        double t1 = tpd_clock_s();
        if (is_compute)
            stats.compute_s += t1 - t0;
        else
            stats.wait_s += t1 - t0;
        if (ops->on_action) ops->on_action(ops->user, a, t0, t1);
    }
out:
    /* Complete every outstanding send, also on error, so no buffer is left in flight. */
    for (int j = 0; j < M; j++)
        if (act_send[j]) TPD_CHECK_KEEP(tpd_comm_wait(pp, act_send[j]), st);
    if (grad_send) TPD_CHECK_KEEP(tpd_comm_wait(pp, grad_send), st);
    free(act_send);
    stats.total_s = tpd_clock_s() - t_begin;
    if (stats_p) *stats_p = stats;
    return st;
}
