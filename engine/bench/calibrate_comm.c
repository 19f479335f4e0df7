/* Calibration of communication: all-reduce, reduce-scatter and all-gather over groups of
 * consecutive ranks (every group at once, as TP groups run), and ping-pong p2p between
 * rank pairs, fitted to the planner's cpu formulas (plan/timing_cpu.c):
 *   all-reduce  2(n-1)/n * bytes / bw + ceil(log2 n) * lat
 *   p2p         bytes / bw + lat (one way: half the round trip) */
#include "engine/bench/calibrate_internal.h"

#include "engine/bench/calib_timer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SIZES 6
#define MAX_GROUPS 8

typedef struct comm_arg {
    tpd_comm *c; /* the group (NULL: this rank sits out) */
    float *buf, *out;
    size_t count; /* floats per rank */
    int kind;     /* 0 all-reduce, 1 reduce-scatter, 2 all-gather, 3 ping-pong */
} comm_arg;

static tpd_status run_comm(void *p) {
    comm_arg *a = p;
    tpd_comm *c = a->c;
    if (!c) return TPD_OK;
    switch (a->kind) {
    case 0:
        return tpd_comm_allreduce(c, a->buf, a->buf, a->count, TPD_DTYPE_F32, TPD_COMM_OP_SUM,
                                  NULL);
    case 1:
        return tpd_comm_reduce_scatter(c, a->buf, a->out, a->count / (size_t)tpd_comm_size(c),
                                       TPD_DTYPE_F32, TPD_COMM_OP_SUM, NULL);
    case 2:
        return tpd_comm_allgather(c, a->buf, a->out, a->count / (size_t)tpd_comm_size(c),
                                  TPD_DTYPE_F32, NULL);
    default: {
        tpd_comm_req *r = NULL;
        int peer = tpd_comm_rank(c) ^ 1;
        if (tpd_comm_rank(c) % 2 == 0) {
            TPD_CHECK(tpd_comm_isend(c, a->buf, a->count, TPD_DTYPE_F32, peer, 7, NULL, &r));
            TPD_CHECK(tpd_comm_wait(c, r));
            TPD_CHECK(tpd_comm_irecv(c, a->out, a->count, TPD_DTYPE_F32, peer, 8, NULL, &r));
            return tpd_comm_wait(c, r);
        }
        TPD_CHECK(tpd_comm_irecv(c, a->out, a->count, TPD_DTYPE_F32, peer, 7, NULL, &r));
        TPD_CHECK(tpd_comm_wait(c, r));
        TPD_CHECK(tpd_comm_isend(c, a->buf, a->count, TPD_DTYPE_F32, peer, 8, NULL, &r));
        return tpd_comm_wait(c, r);
    }
    }
}

tpd_status tpd_calib_comm(tpd_comm *world, const tpd_config *cfg, const tpd_calib_options *opt,
                          tpd_plan_cluster *c, char *notes, size_t nlen) {
    tpd_status st = TPD_OK;
    int W = tpd_comm_size(world);
    /* Defaults for a single rank, where nothing communicates. */
    c->intra_bw = c->inter_bw = 10e9;
    c->intra_latency = c->inter_latency = 1e-6;
    c->p2p_bw = 10e9;
    c->p2p_latency = 1e-6;
    if (W < 2) return TPD_OK;
    /* 4 bytes to 4 MB, with the TP all-reduce of one micro-batch's activation inside. */
    size_t act =
        (size_t)cfg->training.micro_batch_size * cfg->model.seq_length * cfg->model.hidden_size;
    size_t sizes[N_SIZES] = {8, 1024, 16384, act, 262144, 1048576};
    size_t maxn = 0;
    for (int i = 0; i < N_SIZES; i++) {
        sizes[i] = (sizes[i] + 63) / 64 * 64; /* divisible by any group size used */
        if (sizes[i] > maxn) maxn = sizes[i];
    }
    comm_arg a = {0};
    a.buf = calloc(maxn, sizeof(float));
    a.out = calloc(maxn * (size_t)W, sizeof(float));
    if (!a.buf || !a.out) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_bufs, "calibrate: out of memory");

    double xs[3 * MAX_GROUPS * N_SIZES], ys[3 * MAX_GROUPS * N_SIZES], ts[3 * MAX_GROUPS * N_SIZES];
    int n = 0;
    size_t off = strlen(notes);
    off += (size_t)snprintf(notes + off, nlen - off,
                            "collectives (us per call; bytes per rank: all-reduce | "
                            "reduce-scatter | all-gather):\n");
    int groups[MAX_GROUPS], ng = 0;
    for (int g = 2; g <= W && ng < MAX_GROUPS; g *= 2)
        if (W % g == 0) groups[ng++] = g;
    if ((ng == 0 || groups[ng - 1] != W) && ng < MAX_GROUPS) groups[ng++] = W;
    for (int gi = 0; gi < ng; gi++) {
        int g = groups[gi];
        tpd_comm *sub = NULL;
        TPD_CHECK_GOTO(
            tpd_comm_split(world, tpd_comm_rank(world) / g, tpd_comm_rank(world), "calib", &sub),
            st, free_bufs);
        a.c = sub;
        for (int si = 0; si < N_SIZES; si++) {
            double t[3];
            a.count = sizes[si];
            for (int k = 0; k < 3 && st == TPD_OK; k++) {
                a.kind = k;
                st = tpd_calib_time(world, opt, run_comm, &a, &t[k]);
            }
            if (st != TPD_OK) break;
            double bytes = 4.0 * (double)sizes[si], steps = ceil(log2((double)g));
            xs[n] = 2.0 * (g - 1) / g * bytes;
            ys[n] = steps;
            ts[n++] = t[0];
            if (off < nlen)
                off += (size_t)snprintf(notes + off, nlen - off,
                                        "  group %d, %.0f bytes: %.1f | %.1f | %.1f\n", g, bytes,
                                        1e6 * t[0], 1e6 * t[1], 1e6 * t[2]);
        }
        tpd_comm_destroy(sub);
        if (st != TPD_OK) goto free_bufs;
    }
    double inv_bw, lat;
    if (tpd_calib_fit(xs, ys, ts, n, &inv_bw, &lat)) {
        c->intra_bw = c->inter_bw = 1.0 / inv_bw;
        c->intra_latency = c->inter_latency = lat;
    }

    /* Ping-pong between ranks 2k and 2k+1 (an odd last rank sits out). */
    tpd_comm *pair = NULL;
    int in_pair = tpd_comm_rank(world) < W - W % 2;
    TPD_CHECK_GOTO(tpd_comm_split(world, in_pair ? tpd_comm_rank(world) / 2 : -1,
                                  tpd_comm_rank(world), "calib", &pair),
                   st, free_bufs);
    a.c = in_pair ? pair : NULL;
    a.kind = 3;
    n = 0;
    for (int si = 0; si < N_SIZES && st == TPD_OK; si++) {
        double t;
        a.count = sizes[si];
        st = tpd_calib_time(world, opt, run_comm, &a, &t);
        xs[n] = 4.0 * (double)sizes[si];
        ys[n] = 1.0;
        ts[n++] = 0.5 * t;
        if (st == TPD_OK && off < nlen)
            off += (size_t)snprintf(notes + off, nlen - off, "  p2p one way, %.0f bytes: %.1f us\n",
                                    xs[n - 1], 1e6 * 0.5 * t);
    }
    if (pair) tpd_comm_destroy(pair);
    if (st == TPD_OK && tpd_calib_fit(xs, ys, ts, n, &inv_bw, &lat)) {
        c->p2p_bw = 1.0 / inv_bw;
        c->p2p_latency = lat;
    }
free_bufs:
    free(a.out);
    free(a.buf);
    return st;
}
