/* Pipeline schedules as action lists, and the event-driven simulator that the planner
 * uses to predict the bubble and the timeline of a step. */
#include "parallel/pipeline/schedule.h"

#include <stdlib.h>
#include <string.h>

const char *tpd_pp_action_name(tpd_pp_action_kind k) {
    switch (k) {
    case TPD_PP_FWD:
        return "FWD";
    case TPD_PP_BWD:
        return "BWD";
    case TPD_PP_SEND_ACT:
        return "SEND_ACT";
    case TPD_PP_RECV_ACT:
        return "RECV_ACT";
    case TPD_PP_SEND_GRAD:
        return "SEND_GRAD";
    case TPD_PP_RECV_GRAD:
        return "RECV_GRAD";
    case TPD_PP_WGRAD:
        return "WGRAD";
    }
    return "?";
}

/* Appends one action; `cap` was sized by the caller, so this never reallocates. */
static void push(tpd_pp_schedule *s, tpd_pp_action_kind k, int mb, int chunk) {
    s->actions[s->count].kind = k;
    s->actions[s->count].micro_batch = mb;
    s->actions[s->count].chunk = chunk;
    s->count++;
}

/* Forward of (mb, chunk) with its receive and send. The first virtual stage (stage 0,
 * chunk 0) reads the data loader instead of receiving; the last one (stage p-1, chunk
 * v-1) computes the loss instead of sending. */
static void push_forward(tpd_pp_schedule *s, int mb, int chunk) {
    int first = s->stage == 0 && chunk == 0;
    int last = s->stage == s->stages - 1 && chunk == s->virtual_stages - 1;
    if (!first) push(s, TPD_PP_RECV_ACT, mb, chunk);
    push(s, TPD_PP_FWD, mb, chunk);
    if (!last) push(s, TPD_PP_SEND_ACT, mb, chunk);
}

static void push_backward(tpd_pp_schedule *s, int mb, int chunk) {
    int first = s->stage == 0 && chunk == 0;
    int last = s->stage == s->stages - 1 && chunk == s->virtual_stages - 1;
    if (!last) push(s, TPD_PP_RECV_GRAD, mb, chunk);
    push(s, TPD_PP_BWD, mb, chunk);
    if (!first) push(s, TPD_PP_SEND_GRAD, mb, chunk);
}

static tpd_status sched_alloc(int stages, int stage, int mbs, int v, tpd_pp_schedule *s) {
    memset(s, 0, sizeof *s);
    s->stages = stages;
    s->stage = stage;
    s->micro_batches = mbs;
    s->virtual_stages = v;
    /* At most 3 actions per forward, 3 per backward and one W. */
    size_t cap = (size_t)7 * (size_t)mbs * (size_t)v;
    s->actions = malloc(cap * sizeof *s->actions);
    if (!s->actions) {
        tpd_log_error("pipeline schedule: cannot allocate %zu actions", cap);
        return TPD_ERR_NOMEM;
    }
    return TPD_OK;
}

tpd_status tpd_pp_schedule_1f1b(int stages, int stage, int micro_batches,
                                tpd_pp_schedule *sched_p) {
    if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1) {
        tpd_log_error("1f1b schedule: bad arguments stages=%d stage=%d micro_batches=%d", stages,
                      stage, micro_batches);
        return TPD_ERR_INVALID;
    }
    tpd_pp_schedule s;
    TPD_CHECK(sched_alloc(stages, stage, micro_batches, 1, &s));
    int warmup = stages - stage - 1;
    if (warmup > micro_batches) warmup = micro_batches;
    int steady = micro_batches - warmup;
    for (int j = 0; j < warmup; j++)
        push_forward(&s, j, 0);
    for (int i = 0; i < steady; i++) {
        push_forward(&s, warmup + i, 0);
        push_backward(&s, i, 0);
    }
    for (int i = steady; i < micro_batches; i++)
        push_backward(&s, i, 0);
    *sched_p = s;
    return TPD_OK;
}

/* Megatron's mapping from the k-th forward (or backward) of a stage to its model chunk
 * and micro-batch: groups of p*v iterations walk p micro-batches through chunk 0, then
 * the same p through chunk 1, ...; backwards walk the chunks in reverse. */
static int interleaved_chunk(int k, int p, int v, int forward) {
    int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
}

static int interleaved_micro_batch(int k, int p, int v) {
    return (k / (p * v)) * p + k % p;
}

tpd_status tpd_pp_schedule_interleaved(int stages, int stage, int micro_batches, int virtual_stages,
                                       tpd_pp_schedule *sched_p) {
    int p = stages, v = virtual_stages, m = micro_batches;
    if (p < 1 || stage < 0 || stage >= p || m < 1 || v < 1) {
        tpd_log_error("interleaved schedule: bad arguments stages=%d stage=%d "
                      "micro_batches=%d virtual_stages=%d",
                      p, stage, m, v);
        return TPD_ERR_INVALID;
    }
    if (m % p != 0) {
        tpd_log_error("interleaved schedule: micro_batches (%d) must be a multiple of "
                      "pipeline stages (%d)",
                      m, p);
        return TPD_ERR_INVALID;
    }
    tpd_pp_schedule s;
    TPD_CHECK(sched_alloc(p, stage, m, v, &s));
    int total = m * v;
    int warmup = (p - stage - 1) * 2 + (v - 1) * p;
    if (warmup > total) warmup = total;
    int steady = total - warmup;
    for (int k = 0; k < warmup; k++)
        push_forward(&s, interleaved_micro_batch(k, p, v), interleaved_chunk(k, p, v, 1));
    for (int i = 0; i < steady; i++) {
        int kf = warmup + i;
        push_forward(&s, interleaved_micro_batch(kf, p, v), interleaved_chunk(kf, p, v, 1));
        push_backward(&s, interleaved_micro_batch(i, p, v), interleaved_chunk(i, p, v, 0));
    }
    for (int k = steady; k < total; k++)
        push_backward(&s, interleaved_micro_batch(k, p, v), interleaved_chunk(k, p, v, 0));
    *sched_p = s;
    return TPD_OK;
}

tpd_status tpd_pp_schedule_zb_h1(int stages, int stage, int micro_batches,
                                 tpd_pp_schedule *sched_p) {
    int p = stages, m = micro_batches;
    if (p < 1 || stage < 0 || stage >= p || m < 1) {
        tpd_log_error("zb-h1 schedule: bad arguments stages=%d stage=%d micro_batches=%d", p, stage,
                      m);
        return TPD_ERR_INVALID;
    }
    tpd_pp_schedule s;
    TPD_CHECK(sched_alloc(p, stage, m, 1, &s));
    s.split_backward = 1;
    int warmup = p - stage - 1 < m ? p - stage - 1 : m;
    int lag = stage; /* W of micro-batch k runs after B of k + lag */
    int w_done = 0;
    for (int j = 0; j < warmup; j++)
        push_forward(&s, j, 0);
    for (int k = 0; k < m; k++) {
        if (warmup + k < m) push_forward(&s, warmup + k, 0);
        push_backward(&s, k, 0);
        if (k - lag >= 0) push(&s, TPD_PP_WGRAD, w_done++, 0);
    }
    while (w_done < m)
        push(&s, TPD_PP_WGRAD, w_done++, 0);
    *sched_p = s;
    return TPD_OK;
}

tpd_status tpd_pp_schedule_make(tpd_pp_kind kind, int stages, int stage, int micro_batches,
                                int virtual_stages, tpd_pp_schedule *sched_p) {
    switch (kind) {
    case TPD_PP_KIND_1F1B:
        return tpd_pp_schedule_1f1b(stages, stage, micro_batches, sched_p);
    case TPD_PP_KIND_INTERLEAVED:
        return tpd_pp_schedule_interleaved(stages, stage, micro_batches, virtual_stages, sched_p);
    case TPD_PP_KIND_ZB_H1:
        return tpd_pp_schedule_zb_h1(stages, stage, micro_batches, sched_p);
    }
    tpd_log_error("pipeline schedule: unknown kind %d", (int)kind);
    return TPD_ERR_INVALID;
}

void tpd_pp_schedule_free(tpd_pp_schedule *s) {
    if (!s) return;
    free(s->actions);
    s->actions = NULL;
    s->count = 0;
}

/* Peak count of pairs between FWD and `release`, over chunk `chunk` (-1: all). */
static int peak_between(const tpd_pp_schedule *s, tpd_pp_action_kind release, int chunk) {
    int cur = 0, peak = 0;
    for (int i = 0; i < s->count; i++) {
        const tpd_pp_action *a = &s->actions[i];
        if (chunk >= 0 && a->chunk != chunk) continue;
        if (a->kind == TPD_PP_FWD) {
            if (++cur > peak) peak = cur;
        } else if (a->kind == release) {
            cur--;
        }
    }
    return peak;
}

int tpd_pp_schedule_peak_in_flight(const tpd_pp_schedule *s) {
    return peak_between(s, s->split_backward ? TPD_PP_WGRAD : TPD_PP_BWD, -1);
}

int tpd_pp_schedule_peak_in_flight_chunk(const tpd_pp_schedule *s, int chunk) {
    return peak_between(s, TPD_PP_BWD, chunk);
}

/* ---- simulator ---- */

/* Per direction and (sender stage, sender chunk, micro-batch): when the send was issued
 * and when its receive was posted; -1 = not yet. */
typedef struct sim_sends {
    int p, v, m;
    double *act, *grad;           /* send times */
    double *act_post, *grad_post; /* receive post times */
} sim_sends;

static long send_index(const sim_sends *ss, int stage, int chunk, int mb) {
    return ((long)stage * ss->v + chunk) * ss->m + mb;
}

/* The send that a receive of `a` on `stage` waits for: activations come from the previous
 * virtual stage, gradients from the next one. Returns its index or -1 when the peer does
 * not exist (a malformed list). */
static long matching_send(const sim_sends *ss, int stage, const tpd_pp_action *a) {
    int peer = stage, chunk = a->chunk;
    if (a->kind == TPD_PP_RECV_ACT) {
        if (stage > 0) {
            peer = stage - 1;
        } else {
            peer = ss->p - 1;
            chunk = a->chunk - 1;
        }
    } else {
        if (stage < ss->p - 1) {
            peer = stage + 1;
        } else {
            peer = 0;
            chunk = a->chunk + 1;
        }
    }
    if (chunk < 0 || chunk >= ss->v || a->micro_batch < 0 || a->micro_batch >= ss->m) return -1;
    return send_index(ss, peer, chunk, a->micro_batch);
}

/* Completion of send `i` of `tab`: -1 while its receive is not posted, else when the data
 * has arrived. */
static double send_done(const double *sent, const double *post, long i, double t_p2p) {
    if (i < 0 || sent[i] < 0.0) return 0.0; /* nothing to wait for */
    if (post[i] < 0.0) return -1.0;
    return post[i] > sent[i] + t_p2p ? post[i] : sent[i] + t_p2p;
}

/* The schedules of one pipeline: scheds[s] is stage s's, and all share the stage count,
 * the micro-batches and the chunks. */
static tpd_status check_pipeline(const tpd_pp_schedule *scheds, int stages) {
    int v = scheds[0].virtual_stages, m = scheds[0].micro_batches;
    for (int s = 0; s < stages; s++) {
        if (scheds[s].stages != stages || scheds[s].stage != s || scheds[s].virtual_stages != v ||
            scheds[s].micro_batches != m) {
            tpd_log_error("pipeline simulation: schedule %d does not belong to a %d-stage "
                          "pipeline of %d micro-batches x %d chunks",
                          s, stages, m, v);
            return TPD_ERR_INVALID;
        }
    }
    return TPD_OK;
}

/* The caller's start and end times: arrays of `stages` pointers, a NULL entry allocated
 * here (sched[s].count doubles; the caller frees it with free()), a non-NULL one
 * caller-sized. owned[2s] and owned[2s+1] say which were allocated, so that a failure can
 * leave none (release_times). */
typedef struct sim_times_out {
    double **start, **end; /* either may be NULL: not wanted */
    char *owned;           /* [2 * stages] */
} sim_times_out;

static void release_times(sim_times_out *o, int stages) {
    for (int s = 0; o->owned && s < stages; s++) {
        if (o->owned[2 * s]) {
            free(o->start[s]);
            o->start[s] = NULL;
        }
        if (o->owned[2 * s + 1]) {
            free(o->end[s]);
            o->end[s] = NULL;
        }
    }
}

/* Allocates the NULL entries of o->start and o->end; on failure the caller releases what
 * was allocated (release_times) and frees o->owned. */
static tpd_status alloc_times(const tpd_pp_schedule *scheds, int stages, sim_times_out *o) {
    o->owned = calloc((size_t)stages * 2, sizeof *o->owned);
    if (!o->owned) {
        tpd_log_error("pipeline simulation: out of memory");
        return TPD_ERR_NOMEM;
    }
    for (int s = 0; s < stages; s++) {
        size_t n = scheds[s].count > 0 ? (size_t)scheds[s].count : 1;
        double **lists[2] = {o->start, o->end};
        for (int k = 0; k < 2; k++) {
            if (!lists[k] || lists[k][s] != NULL) continue;
            if (!(lists[k][s] = malloc(n * sizeof(double)))) {
                tpd_log_error("pipeline simulation: out of memory");
                return TPD_ERR_NOMEM;
            }
            o->owned[2 * s + k] = 1;
        }
    }
    return TPD_OK;
}

/* The simulation's state: each stage's next action and clock, and the send tables. */
typedef struct sim_state {
    const tpd_pp_schedule *scheds;
    const tpd_pp_sim_times *times;
    int stages;
    int *pc;         /* [stages] next action of each stage */
    double *clock;   /* [stages] s */
    long *last_grad; /* [stages] send index of the stage's latest SEND_GRAD; -1: none */
    double *tables;  /* the four tables of ss, -1 each */
    sim_sends ss;
    double busy, makespan; /* s */
} sim_state;

static void sim_state_free(sim_state *st) {
    free(st->tables);
    free(st->last_grad);
    free(st->clock);
    free(st->pc);
}

static tpd_status sim_state_init(const tpd_pp_schedule *scheds, int stages,
                                 const tpd_pp_sim_times *times, sim_state *st) {
    int v = scheds[0].virtual_stages, m = scheds[0].micro_batches;
    size_t slots = (size_t)stages * (size_t)v * (size_t)m;
    *st = (sim_state){
        .scheds = scheds, .times = times, .stages = stages, .ss = {.p = stages, .v = v, .m = m}};
    st->pc = calloc((size_t)stages, sizeof *st->pc);
    st->clock = calloc((size_t)stages, sizeof *st->clock);
    st->last_grad = malloc((size_t)stages * sizeof *st->last_grad);
    st->tables = malloc(4 * slots * sizeof *st->tables);
    if (!st->pc || !st->clock || !st->last_grad || !st->tables) {
        sim_state_free(st);
        tpd_log_error("pipeline simulation: out of memory");
        return TPD_ERR_NOMEM;
    }
    for (size_t i = 0; i < 4 * slots; i++)
        st->tables[i] = -1.0;
    st->ss.act = st->tables;
    st->ss.grad = st->tables + slots;
    st->ss.act_post = st->tables + 2 * slots;
    st->ss.grad_post = st->tables + 3 * slots;
    for (int s = 0; s < stages; s++)
        st->last_grad[s] = -1;
    return TPD_OK;
}

/* Runs stage s's next action from its clock: its start and end into *t0_p and *t1_p, or
 * *blocked_p = 1 when it must wait (a receive whose send has not been issued, a backward
 * whose send completions wait for a receive not yet posted). */
static tpd_status sim_action(sim_state *st, int s, double *t0_p, double *t1_p, int *blocked_p) {
    const tpd_pp_schedule *sc = &st->scheds[s];
    const tpd_pp_sim_times *tm = &st->times[s];
    const tpd_pp_action *a = &sc->actions[st->pc[s]];
    sim_sends *ss = &st->ss;
    double t0 = st->clock[s], t1 = t0;
    *blocked_p = 0;
    if (a->chunk < 0 || a->chunk >= ss->v || a->micro_batch < 0 || a->micro_batch >= ss->m) {
        tpd_log_error("pipeline simulation: stage %d action %d out of range (mb %d chunk %d)", s,
                      st->pc[s], a->micro_batch, a->chunk);
        return TPD_ERR_INTERNAL;
    }
    long own = send_index(ss, s, a->chunk, a->micro_batch);
    switch (a->kind) {
    case TPD_PP_FWD:
        t1 = t0 + tm->fwd;
        st->busy += tm->fwd;
        break;
    case TPD_PP_BWD: {
        double w1 = send_done(ss->act, ss->act_post, own, tm->p2p);
        double w2 = send_done(ss->grad, ss->grad_post, st->last_grad[s], tm->p2p);
        if (w1 < 0.0 || w2 < 0.0) { /* a send not yet received */
            *blocked_p = 1;
            return TPD_OK;
        }
        if (w1 > t0) t0 = w1;
        if (w2 > t0) t0 = w2;
        double d = sc->split_backward ? tm->bwd - tm->wgrad : tm->bwd;
        t1 = t0 + d;
        st->busy += d;
        break;
    }
    case TPD_PP_WGRAD:
        t1 = t0 + tm->wgrad;
        st->busy += tm->wgrad;
        break;
    case TPD_PP_SEND_ACT:
        ss->act[own] = t0;
        break;
    case TPD_PP_SEND_GRAD:
        ss->grad[own] = t0;
        st->last_grad[s] = own;
        break;
    case TPD_PP_RECV_ACT:
    case TPD_PP_RECV_GRAD: {
        long i = matching_send(ss, s, a);
        if (i < 0) {
            tpd_log_error("pipeline simulation: stage %d %s mb %d chunk %d has no peer", s,
                          tpd_pp_action_name(a->kind), a->micro_batch, a->chunk);
            return TPD_ERR_INTERNAL;
        }
        int is_act = a->kind == TPD_PP_RECV_ACT;
        double *post = is_act ? ss->act_post : ss->grad_post;
        const double *sent = is_act ? ss->act : ss->grad;
        if (post[i] < 0.0) post[i] = t0;
        if (sent[i] < 0.0) { /* blocked on the peer */
            *blocked_p = 1;
            return TPD_OK;
        }
        double arrive = sent[i] + tm->p2p;
        if (arrive > t1) t1 = arrive;
        break;
    }
    }
    *t0_p = t0;
    *t1_p = t1;
    return TPD_OK;
}

/* Each stage runs its list in order until it blocks (sim_action); sweeping the stages until
 * none moves is enough because every time recorded is a stage's current clock, which never
 * goes back. Fails when a sweep moves no stage with actions left (a deadlock). */
static tpd_status sim_run(sim_state *st, const sim_times_out *o) {
    int remaining = 0;
    for (int s = 0; s < st->stages; s++)
        remaining += st->scheds[s].count;
    while (remaining > 0) {
        int progressed = 0;
        for (int s = 0; s < st->stages; s++) {
            while (st->pc[s] < st->scheds[s].count) {
                double t0, t1;
                int blocked;
                TPD_CHECK(sim_action(st, s, &t0, &t1, &blocked));
                if (blocked) break;
                if (o->start) o->start[s][st->pc[s]] = t0;
                if (o->end) o->end[s][st->pc[s]] = t1;
                st->clock[s] = t1;
                if (t1 > st->makespan) st->makespan = t1;
                st->pc[s]++;
                remaining--;
                progressed = 1;
            }
        }
        if (progressed) continue;
        for (int s = 0; s < st->stages; s++) {
            if (st->pc[s] < st->scheds[s].count) {
                const tpd_pp_action *a = &st->scheds[s].actions[st->pc[s]];
                tpd_log_error("pipeline simulation: deadlock, stage %d waits at action %d (%s mb "
                              "%d chunk %d) and no stage can progress",
                              s, st->pc[s], tpd_pp_action_name(a->kind), a->micro_batch, a->chunk);
                return TPD_ERR_INTERNAL;
            }
        }
    }
    return TPD_OK;
}

tpd_status tpd_pp_simulate(const tpd_pp_schedule *scheds, int stages, const tpd_pp_sim_times *times,
                           double **start_p, double **end_p, tpd_pp_sim_result *result_p) {
    if (!scheds || !times || stages < 1) {
        tpd_log_error("pipeline simulation: no schedules");
        return TPD_ERR_INVALID;
    }
    TPD_CHECK(check_pipeline(scheds, stages));
    sim_state st;
    TPD_CHECK(sim_state_init(scheds, stages, times, &st));
    sim_times_out out = {.start = start_p, .end = end_p};
    tpd_status status = alloc_times(scheds, stages, &out);
    if (status == TPD_OK) status = sim_run(&st, &out);
    if (status == TPD_OK && result_p) {
        result_p->makespan = st.makespan;
        result_p->busy_total = st.busy;
        result_p->idle_fraction =
            st.makespan > 0.0 ? 1.0 - st.busy / ((double)stages * st.makespan) : 0.0;
    }
    if (status != TPD_OK) release_times(&out, stages);
    free(out.owned);
    sim_state_free(&st);
    return status;
}
