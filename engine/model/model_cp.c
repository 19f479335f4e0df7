/* Context parallelism: attention over a sequence split across the CP ranks.
 *
 * A sequence of Tg positions is cut into 2 x CP chunks of c = Tg / (2 CP); CP rank r holds
 * chunks r and 2CP-1-r (its T = 2c rows per sequence, in that order), so under the causal
 * mask every rank has the same attention work (Megatron-Core's load balancing). Everything
 * but attention is row-wise and runs on the local rows as it is; positions (RoPE, learned
 * wpe) are global (tpd_model_cp_pos).
 *
 * p2p (ring attention, Liu et al.): each rank's K and V heads travel round the CP ring. At
 * step i a rank holds the block of rank r - i, sends it on to r + 1 while it folds the block
 * into flash attention's running state (kernels.h, attention_block_fwd), and skips a chunk
 * that lies wholly after its queries. The block kernel's running state is merged by the
 * log-sum-exp rule; the layer keeps the output and the LSE (B, NH, T) fp32 only. The
 * backward walks the ring again: a block travels with its dK/dV partial sum, which each
 * rank adds its queries' part to before passing both on; after CP steps every block's sum
 * is complete one rank short of home, and one more send delivers it. Sums run in ring
 * order from the block's owner, so the result does not depend on timing.
 *
 * a2a (DeepSpeed-Ulysses): an all-to-all turns the (local rows, all local heads) qkv into
 * (whole sequences, NH/CP heads): the plain causal attention runs on those, and a second
 * all-to-all returns the output to the local rows. The whole-sequence qkv replaces the
 * local one in the layer's qkv block (the backward reads only it), and the attention's own
 * saved state and its whole-sequence output are the layer's attention state.
 *
 * Both run in the activation dtype (bf16 or fp32: the ring's K/V blocks, the all-to-alls'
 * rows); the ring's running state, dq and the travelling dK/dV sums are fp32, and are
 * rounded into dqkv once at the end. The block kernels are the cpu backend's. */
#include "engine/model/model_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/fault.h"

enum { TAG_KV = 7100, TAG_DKV = 7101, TAG_A2A = 7102 };

static int chunk_of(const tpd_model_dims *d, int rank, int half) {
    return half ? 2 * d->cp_size - 1 - rank : rank;
}

int tpd_model_cp_pos(const tpd_model_dims *d, int cp_rank, int t) {
    if (d->cp_size <= 1) return t;
    int c = d->T / 2;
    return chunk_of(d, cp_rank, t / c) * c + t % c;
}

double tpd_model_cp_causal_pairs(int seq, int cp, int rank) {
    if (cp <= 1) return (double)seq * (seq + 1) / 2.0;
    double c = (double)seq / (2.0 * cp), pairs = 0.0;
    for (int h = 0; h < 2; h++) {
        int q = h ? 2 * cp - 1 - rank : rank; /* query chunk q sees chunks below it whole */
        pairs += q * c * c + c * (c + 1) / 2.0;
    }
    return pairs;
}

tpd_status tpd_model_set_cp(tpd_model *m, tpd_comm *cp_comm, int cp_rank) {
    const tpd_model_dims *d = &m->d;
    if (d->cp_size <= 1) return TPD_OK;
    if (!cp_comm || tpd_comm_size(cp_comm) != d->cp_size || cp_rank < 0 || cp_rank >= d->cp_size ||
        tpd_comm_rank(cp_comm) != cp_rank)
        return tpd_fail(TPD_ERR_INTERNAL,
                        "model: the CP communicator (size %d, rank %d) is not the layout's "
                        "(CP %d, rank %d)",
                        cp_comm ? tpd_comm_size(cp_comm) : 0, cp_comm ? tpd_comm_rank(cp_comm) : -1,
                        d->cp_size, cp_rank);
    m->cp_comm = cp_comm;
    m->cp_rank = cp_rank;
    if (d->cp_a2a) return TPD_OK;
    /* positions: 0 .. Tg-1 (any chunk's keys start at chunk * c), then this rank's T */
    size_t n = (size_t)d->Tg + d->T;
    int32_t *pos = malloc(n * sizeof *pos);
    if (!pos) return tpd_fail_nomem("the CP positions", n * sizeof *pos);
    for (int t = 0; t < d->Tg; t++)
        pos[t] = t;
    for (int t = 0; t < d->T; t++)
        pos[d->Tg + t] = tpd_model_cp_pos(d, cp_rank, t);
    tpd_status st = tpd_kern_copy_to_device(m->kb, m->ws + m->plan.w_cppos, pos, n * sizeof *pos);
    free(pos);
    return st;
}

/* ---- p2p: the ring ---- */

static int ring_next(const tpd_model *m) {
    return (m->cp_rank + 1) % m->d.cp_size;
}

static int ring_prev(const tpd_model *m) {
    return (m->cp_rank + m->d.cp_size - 1) % m->d.cp_size;
}

/* Elements of one K/V block: (2 chunks, B, c, 2*KVl*HS), chunk-major so that each chunk's
 * keys are one (B, c, ...) block for the kernel. */
static size_t kv_numel(const tpd_model_dims *d) {
    return (size_t)d->B * d->T * 2 * d->KVl * d->HS;
}

/* The activation dtype: its element size and its name for the communicators. */
static size_t act_es(const tpd_model *m) {
    return m->plan.act_size;
}

static tpd_dtype act_dt(const tpd_model *m) {
    return m->plan.act_size == 2 ? TPD_DTYPE_BF16 : TPD_DTYPE_F32;
}

/* This rank's K and V heads of qkv (B,T,QKVl) into a block (activation dtype), or back
 * (unpack: the block into the K/V columns of qkv). */
static tpd_status kv_move(tpd_model *m, char *qkv, char *blk, int unpack) {
    const tpd_model_dims *d = &m->d;
    const size_t es = act_es(m);
    size_t CKV = (size_t)2 * d->KVl * d->HS, row = (size_t)d->QKVl * es, w = CKV * es;
    int c = d->T / 2;
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < d->B; b++) {
            char *q =
                qkv + (((size_t)b * d->T + (size_t)h * c) * d->QKVl + (size_t)d->NHl * d->HS) * es;
            char *k = blk + ((size_t)h * d->B + b) * c * w;
            TPD_CHECK(unpack ? tpd_kern_copy_2d(m->kb, q, row, k, w, w, (size_t)c)
                             : tpd_kern_copy_2d(m->kb, k, w, q, row, w, (size_t)c));
        }
    return TPD_OK;
}

/* Posts the exchange of one ring step: `send` to the next rank, `recv` from the previous
 * (n elements of dt). */
static tpd_status ring_post(tpd_model *m, const void *send, void *recv, size_t n, tpd_dtype dt,
                            int tag, tpd_comm_req **rs, tpd_comm_req **rr) {
    void *stream = tpd_kern_stream(m->kb);
    TPD_CHECK(tpd_comm_group_start(m->cp_comm));
    TPD_CHECK(tpd_comm_irecv(m->cp_comm, recv, n, dt, ring_prev(m), tag, stream, rr));
    TPD_CHECK(tpd_comm_isend(m->cp_comm, send, n, dt, ring_next(m), tag, stream, rs));
    return tpd_comm_group_end(m->cp_comm);
}

static tpd_status ring_wait(tpd_model *m, tpd_comm_req **rs, tpd_comm_req **rr) {
    tpd_status a = tpd_comm_wait(m->cp_comm, *rs), b = tpd_comm_wait(m->cp_comm, *rr);
    *rs = *rr = NULL;
    return a != TPD_OK ? a : b;
}

/* The first position after this rank's queries (its later chunk's end). */
static int query_end(const tpd_model *m) {
    int c = m->d.T / 2;
    return (chunk_of(&m->d, m->cp_rank, 1) + 1) * c;
}

static tpd_status ring_fwd(tpd_model *m, const tpd_model_acts *a) {
    const tpd_model_dims *d = &m->d;
    const tpd_buffer_plan *p = &m->plan;
    size_t n = kv_numel(d), BH = (size_t)d->B * d->NHl, es = act_es(m);
    char *kv[2] = {m->ws + p->w_cpkv, m->ws + p->w_cpkv + n * es};
    float *o = (float *)(m->ws + p->w_cpo), *mx = (float *)(m->ws + p->w_cpm);
    float *l = (float *)(m->ws + p->w_cpl);
    const int32_t *all = (const int32_t *)(m->ws + p->w_cppos), *qpos = all + d->Tg;
    int c = d->T / 2, CP = d->cp_size;
    /* the running state starts empty (l = 0: the kernel ignores m then) */
    TPD_CHECK(tpd_kern_zero(m->kb, o, BH * d->T * d->HS * 4));
    TPD_CHECK(tpd_kern_zero(m->kb, mx, BH * d->T * 4));
    TPD_CHECK(tpd_kern_zero(m->kb, l, BH * d->T * 4));
    TPD_CHECK(kv_move(m, a->qkv, kv[0], 0));
    int skip = -1; /* a planted fault: ring step `skip` receives no block */
    if (!tpd_fault("cp-skip-ring-step", 1, &skip)) skip = -1;
    for (int i = 0; i < CP; i++) {
        int cur = i % 2, src = (m->cp_rank + CP - i) % CP;
        tpd_comm_req *rs = NULL, *rr = NULL;
        if (i < CP - 1 && skip != i + 1)
            TPD_CHECK(ring_post(m, kv[cur], kv[1 - cur], n, act_dt(m), TAG_KV, &rs, &rr));
        for (int h = 0; h < 2; h++) {
            int j = chunk_of(d, src, h);
            if (j * c >= query_end(m)) continue; /* wholly after every local query */
            const char *blk = kv[cur] + (size_t)h * d->B * c * 2 * d->KVl * d->HS * es;
            TPD_CHECK(tpd_kern_attention_block_fwd(m->kb, o, mx, l, a->qkv, blk, qpos,
                                                   all + (size_t)j * c, d->B, d->T, c, d->NHl,
                                                   d->KVl, d->HS));
        }
        if (i < CP - 1 && skip == i + 1) /* the next step reads this block again */
            TPD_CHECK(tpd_kern_copy(m->kb, kv[1 - cur], kv[cur], n * es));
        if (rs || rr) TPD_CHECK(ring_wait(m, &rs, &rr));
    }
    return tpd_kern_attention_block_finish(m->kb, a->atty, (float *)a->att, o, mx, l, d->B, d->T,
                                           d->NHl, d->HS);
}

static tpd_status ring_bwd(tpd_model *m, void *dqkv, const void *datty, const tpd_model_acts *a) {
    const tpd_model_dims *d = &m->d;
    const tpd_buffer_plan *p = &m->plan;
    size_t n = kv_numel(d), BH = (size_t)d->B * d->NHl, es = act_es(m);
    char *kv[2] = {m->ws + p->w_cpkv, m->ws + p->w_cpkv + n * es};
    char *dkv[2] = {m->ws + p->w_cpdkv, m->ws + p->w_cpdkv + n * 4}; /* fp32 sums */
    float *dq = (float *)(m->ws + p->w_cpo);
    const int32_t *all = (const int32_t *)(m->ws + p->w_cppos), *qpos = all + d->Tg;
    int c = d->T / 2, CP = d->cp_size;
    size_t half = (size_t)d->B * c * 2 * d->KVl * d->HS; /* elements of a chunk's block */
    TPD_CHECK(tpd_kern_zero(m->kb, dq, BH * d->T * d->HS * 4));
    TPD_CHECK(tpd_kern_zero(m->kb, dkv[0], n * 4));
    TPD_CHECK(kv_move(m, a->qkv, kv[0], 0));
    for (int i = 0; i < CP; i++) {
        int cur = i % 2, src = (m->cp_rank + CP - i) % CP;
        tpd_comm_req *rs = NULL, *rr = NULL, *ds = NULL, *dr = NULL;
        /* the next block's K/V travel while this one's gradients are computed */
        if (i < CP - 1)
            TPD_CHECK(ring_post(m, kv[cur], kv[1 - cur], n, act_dt(m), TAG_KV, &rs, &rr));
        for (int h = 0; h < 2; h++) {
            int j = chunk_of(d, src, h);
            if (j * c >= query_end(m)) continue;
            TPD_CHECK(tpd_kern_attention_block_bwd(
                m->kb, dq, (float *)dkv[cur] + h * half, datty, a->atty, (const float *)a->att,
                a->qkv, kv[cur] + h * half * es, qpos, all + (size_t)j * c, d->B, d->T, c, d->NHl,
                d->KVl, d->HS));
        }
        /* the block's dK/dV partial sum follows it; after the last step it goes home */
        TPD_CHECK(ring_post(m, dkv[cur], dkv[1 - cur], n, TPD_DTYPE_F32, TAG_DKV, &ds, &dr));
        TPD_CHECK(ring_wait(m, &ds, &dr));
        if (rs || rr) TPD_CHECK(ring_wait(m, &rs, &rr));
    }
    /* this rank's dK/dV into the K/V columns of dqkv, dq (B,NH,T,HS) into the Q columns;
     * under bf16 each is rounded once, through the free K/V blocks */
    const int narrow = es != 4;
    char *dkv_act = dkv[CP % 2];
    if (narrow) {
        TPD_CHECK(tpd_kern_cast(m->kb, kv[0], act_dt(m), dkv_act, TPD_DTYPE_F32, n));
        dkv_act = kv[0];
    }
    TPD_CHECK(kv_move(m, dqkv, dkv_act, 1));
    size_t row = (size_t)d->QKVl * es, hs = (size_t)d->HS * es, th = (size_t)d->T * d->HS;
    for (int b = 0; b < d->B; b++)
        for (int h = 0; h < d->NHl; h++) {
            const void *src = dq + ((size_t)b * d->NHl + h) * th;
            if (narrow) {
                TPD_CHECK(tpd_kern_cast(m->kb, kv[1], act_dt(m), src, TPD_DTYPE_F32, th));
                src = kv[1];
            }
            TPD_CHECK(tpd_kern_copy_2d(
                m->kb, (char *)dqkv + ((size_t)b * d->T * d->QKVl + (size_t)h * d->HS) * es, row,
                src, hs, hs, (size_t)d->T));
        }
    return TPD_OK;
}

/* ---- a2a: heads for whole sequences ---- */

/* Runs the all-to-all: block p of `send` (n elements) goes to CP rank p, and rank p's block
 * for this rank lands in block p of `recv`. */
static tpd_status a2a(tpd_model *m, const char *send, char *recv, size_t n) {
    size_t cnt[TPD_CONFIG_MAX_STAGES], dsp[TPD_CONFIG_MAX_STAGES];
    for (int p = 0; p < m->d.cp_size; p++) {
        cnt[p] = n;
        dsp[p] = (size_t)p * n;
    }
    return tpd_comm_alltoallv(m->cp_comm, send, cnt, dsp, recv, cnt, dsp, act_dt(m), TAG_A2A,
                              tpd_kern_stream(m->kb));
}

/* Rows: the local (B,T,w) tensor `loc` and the whole-sequence (B,Tg,w) tensor `full` of
 * the rows of CP rank q (its two chunks). to_full: blk (B,T,w) of rank q -> full; else
 * full -> blk. */
static tpd_status seq_move(tpd_model *m, char *full, char *blk, int q, size_t w, int to_full) {
    const tpd_model_dims *d = &m->d;
    int c = d->T / 2;
    const size_t es = act_es(m), bytes = (size_t)c * w * es;
    for (int b = 0; b < d->B; b++)
        for (int h = 0; h < 2; h++) {
            char *f = full + ((size_t)b * d->Tg + (size_t)chunk_of(d, q, h) * c) * w * es;
            char *l = blk + ((size_t)b * d->T + (size_t)h * c) * w * es;
            TPD_CHECK(to_full ? tpd_kern_copy(m->kb, f, l, bytes)
                              : tpd_kern_copy(m->kb, l, f, bytes));
        }
    return TPD_OK;
}

/* Heads: the columns of rank p's head group in a local row of qkv (Q, K, V groups) or of
 * the attention output (Q heads only), to (pack) or from a block of p's width. */
static tpd_status head_move(tpd_model *m, char *loc, char *blk, int p, int qkv, int pack) {
    const tpd_model_dims *d = &m->d;
    int CP = d->cp_size, hq = d->NHl / CP, hk = d->KVl / CP;
    const size_t es = act_es(m);
    size_t rows = (size_t)d->B * d->T, lrow = (size_t)(qkv ? d->QKVl : d->NHl * d->HS) * es;
    size_t brow = (size_t)(qkv ? hq + 2 * hk : hq) * d->HS * es, col = 0;
    int parts = qkv ? 3 : 1;
    for (int k = 0; k < parts; k++) {
        int heads = k == 0 ? hq : hk, base = k == 0 ? 0 : k == 1 ? d->NHl : d->NHl + d->KVl;
        char *l = loc + ((size_t)base + (size_t)p * heads) * d->HS * es, *b = blk + col;
        size_t w = (size_t)heads * d->HS * es;
        TPD_CHECK(pack ? tpd_kern_copy_2d(m->kb, b, brow, l, lrow, w, rows)
                       : tpd_kern_copy_2d(m->kb, l, lrow, b, brow, w, rows));
        col += w;
    }
    return TPD_OK;
}

/* The whole-sequence output of the a2a attention: after its saved state in the layer's
 * attention block. */
static char *a2a_out(const tpd_model *m, const tpd_model_acts *a) {
    return (char *)a->att + m->plan.cp_att_probs;
}

static int a2a_heads(const tpd_model *m, int *hq, int *hk) {
    *hq = m->d.NHl / m->d.cp_size;
    *hk = m->d.KVl / m->d.cp_size;
    return (*hq + 2 * *hk) * m->d.HS;
}

static tpd_status a2a_fwd(tpd_model *m, const tpd_model_acts *a) {
    const tpd_model_dims *d = &m->d;
    int hq, hk, W = a2a_heads(m, &hq, &hk), CP = d->cp_size;
    char *send = m->ws + m->plan.w_a2a_send, *recv = m->ws + m->plan.w_a2a_recv;
    size_t rows = (size_t)d->B * d->T, nq = rows * W, no = rows * hq * d->HS, es = act_es(m);
    /* (local rows, all heads) -> (whole sequences, this rank's heads), into qkv's block */
    for (int p = 0; p < CP; p++)
        TPD_CHECK(head_move(m, a->qkv, send + (size_t)p * nq * es, p, 1, 1));
    TPD_CHECK(a2a(m, send, recv, nq));
    for (int q = 0; q < CP; q++)
        TPD_CHECK(seq_move(m, a->qkv, recv + (size_t)q * nq * es, q, (size_t)W, 1));
    char *out = a2a_out(m, a);
    TPD_CHECK(tpd_kern_attention_fwd(m->kb, out, a->att, a->qkv, d->B, d->Tg, hq, hk, d->HS));
    /* the output back to the local rows */
    for (int q = 0; q < CP; q++)
        TPD_CHECK(seq_move(m, out, send + (size_t)q * no * es, q, (size_t)hq * d->HS, 0));
    TPD_CHECK(a2a(m, send, recv, no));
    for (int p = 0; p < CP; p++)
        TPD_CHECK(head_move(m, a->atty, recv + (size_t)p * no * es, p, 0, 0));
    return TPD_OK;
}

static tpd_status a2a_bwd(tpd_model *m, void *dqkv, void *datty, const tpd_model_acts *a) {
    const tpd_model_dims *d = &m->d;
    int hq, hk, W = a2a_heads(m, &hq, &hk), CP = d->cp_size;
    char *send = m->ws + m->plan.w_a2a_send, *recv = m->ws + m->plan.w_a2a_recv;
    size_t rows = (size_t)d->B * d->T, nq = rows * W, no = rows * hq * d->HS, es = act_es(m);
    /* d(output) to whole sequences of this rank's heads, over datty (read no more) */
    for (int p = 0; p < CP; p++)
        TPD_CHECK(head_move(m, datty, send + (size_t)p * no * es, p, 0, 1));
    TPD_CHECK(a2a(m, send, recv, no));
    for (int q = 0; q < CP; q++)
        TPD_CHECK(seq_move(m, datty, recv + (size_t)q * no * es, q, (size_t)hq * d->HS, 1));
    /* the whole-sequence dqkv in dqkv's block, then back to the local rows */
    TPD_CHECK(tpd_kern_attention_bwd(m->kb, dqkv, datty, a->qkv, a2a_out(m, a), a->att, d->B, d->Tg,
                                     hq, hk, d->HS));
    for (int q = 0; q < CP; q++)
        TPD_CHECK(seq_move(m, dqkv, send + (size_t)q * nq * es, q, (size_t)W, 0));
    TPD_CHECK(a2a(m, send, recv, nq));
    for (int p = 0; p < CP; p++)
        TPD_CHECK(head_move(m, dqkv, recv + (size_t)p * nq * es, p, 1, 0));
    return TPD_OK;
}

tpd_status tpd_model_cp_attention_fwd(tpd_model *m, const tpd_model_acts *a) {
    return m->d.cp_a2a ? a2a_fwd(m, a) : ring_fwd(m, a);
}

tpd_status tpd_model_cp_attention_recompute(tpd_model *m, const tpd_model_acts *a) {
    const tpd_model_dims *d = &m->d;
    if (!d->cp_a2a) return TPD_OK; /* the ring keeps its LSE: nothing to rebuild */
    int hq, hk;
    (void)a2a_heads(m, &hq, &hk);
    /* qkv holds the whole sequences of this rank's heads since the forward */
    return tpd_kern_attention_fwd(m->kb, a2a_out(m, a), a->att, a->qkv, d->B, d->Tg, hq, hk, d->HS);
}

tpd_status tpd_model_cp_attention_bwd(tpd_model *m, void *dqkv, void *datty,
                                      const tpd_model_acts *a) {
    return m->d.cp_a2a ? a2a_bwd(m, dqkv, datty, a) : ring_bwd(m, dqkv, datty, a);
}
