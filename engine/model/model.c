#include "engine/model/model_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/align.h"

/* ---- allocation ---- */

static tpd_status alloc_block(tpd_model *m, size_t bytes, void **ptr_p) {
    *ptr_p = NULL;
    if (bytes == 0) return TPD_OK;
    TPD_CHECK(tpd_kern_alloc(m->kb, bytes, ptr_p));
    m->bytes_allocated += bytes;
    return TPD_OK;
}

/* The unit tables: every unit in the flat buffers, except what a sharded strategy keeps
 * only a shard of (its units point nowhere until staged). */
static tpd_status init_units(tpd_model *m) {
    int n = m->d.Ls + 2, ne = m->plan.lay.expert_numel > 0 ? m->d.Ls : 0;
    m->nunits = n;
    m->neunits = ne;
    m->ubound = calloc((size_t)n + 1, sizeof *m->ubound);
    m->ubase_p = calloc((size_t)n, sizeof *m->ubase_p);
    m->ubase_g = calloc((size_t)n, sizeof *m->ubase_g);
    m->ebound = calloc((size_t)ne + 1, sizeof *m->ebound);
    m->ebase_p = calloc((size_t)ne + 1, sizeof *m->ebase_p);
    m->ebase_g = calloc((size_t)ne + 1, sizeof *m->ebase_g);
    if (!m->ubound || !m->ubase_p || !m->ubase_g || !m->ebound || !m->ebase_p || !m->ebase_g)
        return tpd_fail_nomem("the unit tables", (size_t)(n + ne) * 3 * sizeof(size_t));
    tpd_model_layout_unit_bounds(&m->plan.lay, m->ubound);
    if (ne) tpd_model_layout_expert_bounds(&m->plan.lay, m->ebound);
    int shard_p = m->plan.sharding == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS;
    int shard_g = m->plan.sharding >= TPD_DP_SHARDING_OPTIM_GRADS;
    for (int i = 0; i < n; i++) {
        m->ubase_p[i] = shard_p ? NULL : (char *)m->params + m->ubound[i] * m->plan.param_size;
        m->ubase_g[i] = shard_g ? NULL : (char *)m->grads + m->ubound[i] * m->plan.grad_size;
    }
    for (int l = 0; l < ne; l++) {
        m->ebase_p[l] = shard_p ? NULL : (char *)m->params + m->ebound[l] * m->plan.param_size;
        m->ebase_g[l] = shard_g ? NULL : (char *)m->grads + m->ebound[l] * m->plan.grad_size;
    }
    return TPD_OK;
}

tpd_status tpd_model_create(const tpd_config *cfg, const tpd_kern_backend *kb, tpd_comm *tp_comm,
                            int tp_size, int tp_rank, int pp, int dp, int stage,
                            tpd_model **model_p) {
    tpd_status st = TPD_OK;
    tpd_model *m = calloc(1, sizeof *m);
    if (!m) return tpd_fail_nomem("the model", sizeof *m);
    m->cfg = *cfg;
    m->kb = kb;
    m->tp = (tpd_tp_ctx){kb, tp_comm, NULL};
    TPD_CHECK_GOTO(tpd_buffer_plan_init(cfg, tp_size, tp_rank, pp, dp, stage, &m->plan), st,
                   undo_model);
    m->d = m->plan.lay.d;
    m->rope = tpd_model_rope(&cfg->model);
    const tpd_buffer_plan *b = &m->plan;
    if (tpd_dtype_size(tpd_kern_act_dtype(kb)) != b->act_size ||
        tpd_dtype_size(tpd_kern_param_dtype(kb)) != b->param_size ||
        tpd_dtype_size(tpd_kern_grad_dtype(kb)) != b->grad_size ||
        tpd_kern_has_master(kb) != b->has_master) {
        TPD_FAIL_GOTO(TPD_ERR_INTERNAL, st, undo_model,
                      "model: backend %s dtypes (gradients %s) disagree with training.precision "
                      "%s and training.accumulate_allreduce_grads_in_fp32 %s",
                      tpd_kern_name(kb), tpd_dtype_name(tpd_kern_grad_dtype(kb)),
                      tpd_config_choice("training.precision", cfg->training.precision),
                      cfg->training.accumulate_allreduce_grads_in_fp32 ? "true" : "false");
    }
    const tpd_model_dims *d = &m->d;
    size_t saved = b->att_saved; /* CP p2p: the ring's LSE, the model's own */
    if (d->cp_size == 1)
        saved = tpd_kern_attention_saved_bytes(kb, d->B, d->T, d->NHl, d->HS);
    else if (d->cp_a2a) /* whole sequences of NH/CP heads, then their output */
        saved = tpd_align_up(
                    tpd_kern_attention_saved_bytes(kb, d->B, d->Tg, d->NHl / d->cp_size, d->HS)) +
                (size_t)d->B * d->T * d->Cl * b->act_size;
    if (saved != b->att_saved) {
        TPD_FAIL_GOTO(TPD_ERR_INTERNAL, st, undo_model,
                      "model: backend %s keeps %zu bytes of attention state, the memory plan "
                      "%zu",
                      tpd_kern_name(kb), saved, b->att_saved);
    }
    void *p;
    TPD_CHECK_GOTO(alloc_block(m, b->mem.params, &m->params), st, undo_buffers);
    TPD_CHECK_GOTO(alloc_block(m, b->mem.grads, &m->grads), st, undo_buffers);
    TPD_CHECK_GOTO(alloc_block(m, tpd_buffer_plan_pool_p_numel(b) * b->param_size, &m->pool_p), st,
                   undo_buffers);
    TPD_CHECK_GOTO(alloc_block(m, tpd_buffer_plan_pool_g_numel(b) * b->grad_size, &m->pool_g), st,
                   undo_buffers);
    TPD_CHECK_GOTO(init_units(m), st, undo_buffers);
    TPD_CHECK_GOTO(alloc_block(m, b->mem.optimizer, &p), st, undo_buffers);
    m->opt_m = p;
    m->opt_v = p ? (float *)p + b->shard_numel : NULL;
    TPD_CHECK_GOTO(alloc_block(m, b->mem.master, &p), st, undo_buffers);
    m->master = p;
    TPD_CHECK_GOTO(alloc_block(m, b->mem.outer, &p), st, undo_buffers);
    if (p) {
        m->outer_sync = p;
        m->outer_mom = m->outer_sync + b->shard_numel;
        m->outer_delta = m->outer_mom + b->shard_numel;
    }
    TPD_CHECK_GOTO(alloc_block(m, b->mem.activations, &p), st, undo_buffers);
    m->acts = p;
    TPD_CHECK_GOTO(alloc_block(m, b->ws_bytes, &p), st, undo_buffers);
    m->ws = p;
    /* the backend's scratch, once, at the plan's size: no op allocates during a step */
    tpd_kern_shapes shapes;
    tpd_model_kern_shapes(cfg, &m->d, &shapes);
    size_t reserved = 0;
    TPD_CHECK_GOTO(tpd_kern_scratch_reserve(kb, &shapes, &reserved), st, undo_buffers);
    if (reserved < b->scratch_bytes) {
        TPD_FAIL_GOTO(TPD_ERR_INTERNAL, st, undo_buffers,
                      "model: backend %s reserved %zu bytes of scratch, the memory plan %zu",
                      tpd_kern_name(kb), reserved, b->scratch_bytes);
    }
    m->bytes_allocated += b->scratch_bytes;
    /* host staging (pinned where the backend copies from it asynchronously), and the
     * events that say when a slot's staging is free again */
    TPD_CHECK_GOTO(tpd_kern_host_alloc(kb, b->host_bytes, &p), st, undo_buffers);
    m->host_tokens = p;
    m->bytes_allocated += b->host_bytes;
    m->stage_events = calloc((size_t)b->nslots + 1, sizeof *m->stage_events);
    if (!m->stage_events) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, undo_buffers, "model: out of memory");
    for (int i = 0; i < b->nslots; i++)
        TPD_CHECK_GOTO(tpd_kern_event_create(kb, &m->stage_events[i]), st, undo_buffers);
    if (m->d.last)
        TPD_CHECK_GOTO(tpd_kern_zero(kb, m->ws + b->w_loss, sizeof(double)), st, undo_buffers);
    if (m->d.E) {
        m->moe_f = calloc((size_t)m->d.E, sizeof *m->moe_f);
        m->moe.load = calloc((size_t)m->d.E, sizeof *m->moe.load);
        if (!m->moe_f || !m->moe.load)
            TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, undo_buffers, "model: out of memory");
    }
    *model_p = m;
    return TPD_OK;
undo_buffers:
    tpd_model_destroy(m);
    return st;
undo_model:
    free(m);
    return st;
}

void tpd_model_destroy(tpd_model *m) {
    if (!m) return;
    void *blocks[] = {m->ws,     m->acts,   m->outer_sync, m->master, m->opt_m,
                      m->pool_g, m->pool_p, m->grads,      m->params};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        if (blocks[i]) tpd_kern_free(m->kb, blocks[i]);
    if (m->stage_events) {
        for (int i = 0; i < m->plan.nslots; i++)
            tpd_kern_event_destroy(m->kb, m->stage_events[i]);
        free(m->stage_events);
    }
    if (m->host_tokens) tpd_kern_host_free(m->kb, m->host_tokens);
    free(m->moe_f);
    free(m->moe_a2a);
    free(m->moe.load);
    free(m->ubase_g);
    free(m->ubase_p);
    free(m->ubound);
    free(m->ebase_g);
    free(m->ebase_p);
    free(m->ebound);
    free(m);
}

void tpd_model_set_hook(tpd_model *m, tpd_model_hook hook, void *user) {
    m->hook = hook;
    m->hook_user = user;
}

void tpd_model_set_tp_timer(tpd_model *m, double *comm_s) {
    m->tp.comm_s = comm_s;
}

int tpd_model_unit_of(const tpd_model *m, size_t e) {
    int lo = 0, hi = m->nunits - 1; /* the last unit whose first element is <= e */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (m->ubound[mid] <= e)
            lo = mid;
        else
            hi = mid - 1;
    }
    /* empty units share their bound with the next one: take the one that holds e */
    while (lo + 1 < m->nunits && m->ubound[lo + 1] <= e)
        lo++;
    return lo - 1;
}

int tpd_model_expert_unit_of(const tpd_model *m, size_t e) {
    if (m->neunits == 0 || e >= m->ebound[m->neunits]) return -1;
    /* the last unit starting at or before e (a dense layer's expert unit is empty) */
    int lo = 0, hi = m->neunits; /* ebound[lo] <= e < ebound[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (m->ebound[mid] <= e)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

void *tpd_model_elem(const tpd_model *m, int grads, size_t e) {
    size_t es = grads ? m->plan.grad_size : m->plan.param_size;
    int x = tpd_model_expert_unit_of(m, e);
    if (x >= 0) { /* EP: in an expert unit */
        char *base = grads ? m->ebase_g[x] : m->ebase_p[x];
        return base ? base + (e - m->ebound[x]) * es : NULL;
    }
    int i = tpd_model_unit_of(m, e) + 1;
    char *base = grads ? m->ubase_g[i] : m->ubase_p[i];
    if (!base) return NULL;
    return base + (e - m->ubound[i]) * es;
}

void *tpd_model_param(const tpd_model *m, tpd_param p) {
    if (!m->plan.lay.p[p].present) return NULL;
    return tpd_model_elem(m, 0, m->plan.lay.p[p].offset);
}

void *tpd_model_grad(const tpd_model *m, tpd_param p) {
    if (!m->plan.lay.p[p].present) return NULL;
    return tpd_model_elem(m, 1, m->plan.lay.p[p].offset);
}

void *tpd_model_owned_param(const tpd_model *m, size_t flat, size_t state) {
    size_t at = m->plan.sharding == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS ? state : flat;
    return (char *)m->params + at * m->plan.param_size;
}

void *tpd_model_owned_grad(const tpd_model *m, size_t flat, size_t state) {
    size_t at = m->plan.sharding >= TPD_DP_SHARDING_OPTIM_GRADS ? state : flat;
    return (char *)m->grads + at * m->plan.grad_size;
}

/* ---- initialization ---- */

/* dst (shard_numel fp32, device) = the owned ranges of host (numel_padded fp32) */
static tpd_status copy_owned(tpd_model *m, const tpd_dp_plan *dpp, float *dst, const float *host) {
    for (int r = 0; r < dpp->nranges; r++) {
        const tpd_dp_range *rg = &dpp->ranges[r];
        TPD_CHECK(tpd_kern_copy_to_device(m->kb, dst + rg->state, host + rg->begin,
                                          (rg->end - rg->begin) * 4));
    }
    return TPD_OK;
}

tpd_status tpd_model_load_params_f32(tpd_model *m, const tpd_dp_plan *dpp, const float *host) {
    tpd_dtype pdt = tpd_kern_param_dtype(m->kb);
    int shard = m->plan.sharding == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS;
    size_t n = shard ? m->plan.shard_numel : m->plan.numel_padded;
    tpd_status st = TPD_OK;
    float *tmp = NULL, *src = (float *)host;
    if (shard) { /* the owned ranges, in shard order, the tails of short parts zero */
        tmp = calloc(n ? n : 1, sizeof *tmp);
        if (!tmp) return tpd_fail_nomem("the parameter shard", (n ? n : 1) * sizeof *tmp);
        for (int r = 0; r < dpp->nranges; r++) {
            const tpd_dp_range *rg = &dpp->ranges[r];
            memcpy(tmp + rg->state, host + rg->begin, (rg->end - rg->begin) * 4);
        }
        src = tmp;
    }
    void *dev = NULL;
    if (pdt == TPD_DTYPE_F32) {
        st = tpd_kern_copy_to_device(m->kb, m->params, src, n * 4);
    } else {
        st = tpd_kern_alloc(m->kb, n * 4, &dev);
        if (st == TPD_OK) st = tpd_kern_copy_to_device(m->kb, dev, src, n * 4);
        if (st == TPD_OK) st = tpd_kern_cast(m->kb, m->params, pdt, dev, TPD_DTYPE_F32, n);
        if (dev) {
            tpd_status sync = tpd_kern_synchronize(m->kb);
            if (st == TPD_OK) st = sync;
            tpd_kern_free(m->kb, dev);
        }
    }
    free(tmp);
    return st;
}

tpd_status tpd_model_init_params(tpd_model *m, const tpd_dp_plan *dpp) {
    const tpd_model_layout *lay = &m->plan.lay;
    size_t n = m->plan.numel_padded;
    tpd_status st = TPD_OK;
    float *host = calloc(n ? n : 1, sizeof *host); /* (numel_padded) fp32 */
    if (!host) return tpd_fail_nomem("the host copy of the parameters", (n ? n : 1) * sizeof *host);
    /* Every value is a function of its global index alone (the counter-based RNG), so the
     * rows fill in parallel and the result is bit-identical to one thread's: GPT-2 1.5B's
     * 1.6e9 values take about a minute on one host thread. */
    for (int p = 0; p < TPD_P_COUNT; p++) {
        const tpd_param_slice *s = &lay->p[p];
        if (!s->present) continue;
        int64_t rows = (int64_t)s->layers * s->rows;
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int64_t g = tpd_model_layout_row_global(lay, (tpd_param)p, r);
            float *dst = host + tpd_model_layout_row_local(lay, (tpd_param)p, r);
            for (int c = 0; c < s->cols; c++)
                dst[c] = g < 0 ? 0.0f : tpd_model_init_value(&m->cfg, (tpd_param)p, g + c);
        }
    }
    TPD_CHECK_GOTO(tpd_model_load_params_f32(m, dpp, host), st, out);
    /* master weights hold this rank's owned ranges, in optimizer-state order */
    if (m->master) TPD_CHECK_GOTO(copy_owned(m, dpp, m->master, host), st, out);
    if (m->opt_m) TPD_CHECK_GOTO(tpd_kern_zero(m->kb, m->opt_m, m->plan.mem.optimizer), st, out);
    /* DiLoCo: the outer state starts at the initial weights, with no momentum */
    if (m->outer_sync) {
        TPD_CHECK_GOTO(tpd_kern_zero(m->kb, m->outer_sync, m->plan.mem.outer), st, out);
        TPD_CHECK_GOTO(copy_owned(m, dpp, m->outer_sync, host), st, out);
    }
    TPD_CHECK_GOTO(tpd_model_zero_grads(m), st, out);
    /* the gradient staging slots start at zero once; each is zeroed again as its reduction
     * lands (engine/optim/grad_shard.c), so a step never clears them */
    const tpd_buffer_plan *b = &m->plan;
    size_t pool = tpd_buffer_plan_pool_g_numel(b) * b->grad_size;
    if (pool) TPD_CHECK_GOTO(tpd_kern_zero(m->kb, m->pool_g, pool), st, out);
    TPD_CHECK_GOTO(tpd_kern_synchronize(m->kb), st, out);
out:
    free(host);
    return st;
}

tpd_status tpd_model_to_host_f32(const tpd_kern_backend *kb, float *dst, const void *src,
                                 tpd_dtype dt, size_t n, float *f32) {
    if (dt == TPD_DTYPE_F32) return tpd_kern_copy_to_host(kb, dst, src, n * 4);
    void *tmp = f32;
    if (!f32) TPD_CHECK(tpd_kern_alloc(kb, n * 4, &tmp));
    tpd_status st = tpd_kern_cast(kb, tmp, TPD_DTYPE_F32, src, dt, n);
    if (st == TPD_OK) st = tpd_kern_copy_to_host(kb, dst, tmp, n * 4);
    if (!f32) tpd_kern_free(kb, tmp);
    return st;
}

tpd_status tpd_model_params_f32(const tpd_model *m, float *out) {
    if (m->plan.sharding == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS)
        return tpd_fail(TPD_ERR_INTERNAL, "model: the parameters are sharded over DP "
                                          "(tpd_grad_sync_params_f32 gathers them)");
    return tpd_model_to_host_f32(m->kb, out, m->params, tpd_kern_param_dtype(m->kb),
                                 m->plan.numel_padded, NULL);
}

tpd_status tpd_model_logits_f32(const tpd_model *m, const tpd_model_mb *at, int row, float *out) {
    size_t Vl = (size_t)m->d.Vl;
    const char *logits =
        (const char *)tpd_model_logits(m, at) + (size_t)row * Vl * m->plan.act_size;
    return tpd_model_to_host_f32(m->kb, out, logits, tpd_kern_act_dtype(m->kb), Vl, NULL);
}

tpd_status tpd_model_zero_grads(tpd_model *m) {
    return tpd_kern_zero(m->kb, m->grads, m->plan.mem.grads);
}

/* ---- batches ---- */

tpd_status tpd_model_set_batch(tpd_model *m, const tpd_model_mb *at, const int32_t *tokens) {
    const tpd_model_dims *d = &m->d;
    char *s = m->acts + (size_t)at->slot * m->plan.slot_bytes;
    size_t n = (size_t)d->B * d->T, bytes = n * 4;
    /* the slot's staging may still feed its previous upload (the host runs ahead of the
     * device); its event says when that copy has landed, which is almost always long ago */
    void *ev = m->stage_events[at->slot];
    TPD_CHECK(tpd_kern_event_wait(m->kb, ev));
    for (int pass = 0; pass < 2; pass++) { /* inputs [:, :Tg], then targets [:, 1:] */
        int32_t *stage = m->host_tokens + ((size_t)at->slot * 2 + (size_t)pass) * n;
        /* runs of consecutive positions: the whole sequence, or this CP rank's chunks */
        int runs = d->cp_size > 1 ? 2 : 1, len = d->T / runs;
        for (int b = 0; b < d->B; b++)
            for (int h = 0; h < runs; h++) {
                int t0 = h * len, p0 = tpd_model_cp_pos(d, m->cp_rank, t0);
                memcpy(stage + (size_t)b * d->T + t0, tokens + (size_t)b * (d->Tg + 1) + p0 + pass,
                       (size_t)len * 4);
            }
        TPD_CHECK(tpd_kern_copy_to_device_async(
            m->kb, s + (pass ? m->plan.s_targets : m->plan.s_tokens), stage, bytes));
    }
    return tpd_kern_event_record(m->kb, ev);
}

tpd_rope tpd_model_rope(const tpd_config_model *m) {
    tpd_rope r = {m->rotary_base, 0, 0, 0, 0};
    if (m->rope_scaling) {
        r.factor = m->rope_scaling_factor;
        r.low_freq_factor = m->rope_scaling_low_freq_factor;
        r.high_freq_factor = m->rope_scaling_high_freq_factor;
        r.original_max_positions = m->rope_scaling_original_max_position_embeddings;
    }
    return r;
}
