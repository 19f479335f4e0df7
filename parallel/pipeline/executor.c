#include "parallel/pipeline/executor.h"

#include <stdlib.h>

#include "base/clock.h"

/* Tag of a message: its direction and the chunk that receives it. MPI matches in order
 * per (peer, tag), which keeps micro-batches in order. */
static int tag_of(int is_grad, int recv_chunk) {
    return 1 + 2 * recv_chunk + is_grad;
}

tpd_status tpd_pp_execute(const tpd_pp_schedule *s, tpd_comm *pp, const tpd_pp_exec_ops *ops,
                          size_t count, tpd_dtype dtype, void *stream, tpd_pp_exec_stats *stats_p) {
    tpd_status st = TPD_OK;
    int M = s->micro_batches, v = s->virtual_stages, p = s->stages, me = s->stage;
    size_t nsend = (size_t)M * (size_t)v;
    tpd_comm_req **act_send = calloc(nsend, sizeof *act_send); /* by (j, chunk) */
    tpd_comm_req *grad_send = NULL;
    tpd_pp_exec_stats stats = {0};
    double t_begin = tpd_clock_s();
    if (!act_send) return tpd_fail_nomem("the activation sends", nsend * sizeof *act_send);
    /* neighbours on the ring of virtual stages: the last stage's chunk c feeds stage 0's
     * chunk c+1 */
    int next = (me + 1) % p, prev = (me + p - 1) % p;

    for (int i = 0; i < s->count; i++) {
        const tpd_pp_action *a = &s->actions[i];
        int j = a->micro_batch, c = a->chunk;
        size_t k = (size_t)j * (size_t)v + (size_t)c;
        double t0 = tpd_clock_s();
        int is_compute = 0;
        tpd_comm_req *req = NULL;
        if (j < 0 || j >= M || c < 0 || c >= v)
            TPD_FAIL_GOTO(TPD_ERR_INTERNAL, st, out,
                          "pipeline: action %d (%s) names micro-batch %d chunk %d of %d x %d", i,
                          tpd_pp_action_name(a->kind), j, c, M, v);
        switch (a->kind) {
        case TPD_PP_FWD:
            is_compute = 1;
            TPD_CHECK_GOTO(ops->forward(ops->user, j, c), st, out);
            break;
        case TPD_PP_BWD:
            TPD_CHECK_GOTO(tpd_comm_wait(pp, act_send[k]), st, out);
            act_send[k] = NULL;
            TPD_CHECK_GOTO(tpd_comm_wait(pp, grad_send), st, out);
            grad_send = NULL;
            {
                double tw = tpd_clock_s(); /* waited for send completions */
                stats.wait_s += tw - t0;
                t0 = tw;
            }
            is_compute = 1;
            TPD_CHECK_GOTO(ops->backward(ops->user, j, c), st, out);
            break;
        case TPD_PP_WGRAD:
            if (!ops->weight_grad)
                TPD_FAIL_GOTO(TPD_ERR_INTERNAL, st, out,
                              "pipeline: the list splits the backward but the engine has no W");
            is_compute = 1;
            TPD_CHECK_GOTO(ops->weight_grad(ops->user, j, c), st, out);
            break;
        case TPD_PP_SEND_ACT:
            TPD_CHECK_GOTO(tpd_comm_isend(pp, ops->act_out(ops->user, j, c), count, dtype, next,
                                          tag_of(0, me == p - 1 ? c + 1 : c), stream, &act_send[k]),
                           st, out);
            break;
        case TPD_PP_RECV_ACT:
            TPD_CHECK_GOTO(tpd_comm_irecv(pp, ops->act_in(ops->user, j, c), count, dtype, prev,
                                          tag_of(0, c), stream, &req),
                           st, out);
            TPD_CHECK_GOTO(tpd_comm_wait(pp, req), st, out);
            break;
        case TPD_PP_SEND_GRAD:
            TPD_CHECK_GOTO(tpd_comm_isend(pp, ops->grad_out(ops->user, j, c), count, dtype, prev,
                                          tag_of(1, me == 0 ? c - 1 : c), stream, &grad_send),
                           st, out);
            break;
        case TPD_PP_RECV_GRAD:
            TPD_CHECK_GOTO(tpd_comm_irecv(pp, ops->grad_in(ops->user, j, c), count, dtype, next,
                                          tag_of(1, c), stream, &req),
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
    for (size_t k = 0; k < nsend; k++)
        if (act_send[k]) TPD_CHECK_KEEP(tpd_comm_wait(pp, act_send[k]), st);
    if (grad_send) TPD_CHECK_KEEP(tpd_comm_wait(pp, grad_send), st);
    free(act_send);
    stats.total_s = tpd_clock_s() - t_begin;
    if (stats_p) *stats_p = stats;
    return st;
}
