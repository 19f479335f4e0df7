#include "engine/model/model_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- allocation ---- */

static tpd_status alloc_block(tpd_model *m, size_t bytes, void **ptr_p) {
    *ptr_p = NULL;
    if (bytes == 0) return TPD_OK;
    TPD_CHECK(tpd_kern_alloc(m->kb, bytes, ptr_p));
    m->bytes_allocated += bytes;
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
    size_t saved = tpd_kern_attention_saved_bytes(kb, m->d.B, m->d.T, m->d.NHl, m->d.HS);
    if (saved != b->att_saved) {
        TPD_FAIL_GOTO(TPD_ERR_INTERNAL, st, undo_model,
                      "model: backend %s keeps %zu bytes of attention state, the memory plan "
                      "%zu",
                      tpd_kern_name(kb), saved, b->att_saved);
    }
    void *p;
    TPD_CHECK_GOTO(alloc_block(m, b->mem.params, &m->params), st, undo_buffers);
    TPD_CHECK_GOTO(alloc_block(m, b->mem.grads, &m->grads), st, undo_buffers);
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
    void *blocks[] = {m->ws, m->acts, m->outer_sync, m->master, m->opt_m, m->grads, m->params};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        if (blocks[i]) tpd_kern_free(m->kb, blocks[i]);
    if (m->stage_events) {
        for (int i = 0; i < m->plan.nslots; i++)
            tpd_kern_event_destroy(m->kb, m->stage_events[i]);
        free(m->stage_events);
    }
    if (m->host_tokens) tpd_kern_host_free(m->kb, m->host_tokens);
    free(m);
}

void tpd_model_set_hook(tpd_model *m, tpd_model_hook hook, void *user) {
    m->hook = hook;
    m->hook_user = user;
}

void tpd_model_set_tp_timer(tpd_model *m, double *comm_s) {
    m->tp.comm_s = comm_s;
}

void *tpd_model_param(const tpd_model *m, tpd_param p) {
    if (!m->plan.lay.p[p].present) return NULL;
    return (char *)m->params + m->plan.lay.p[p].offset * m->plan.param_size;
}

void *tpd_model_grad(const tpd_model *m, tpd_param p) {
    if (!m->plan.lay.p[p].present) return NULL;
    return (char *)m->grads + m->plan.lay.p[p].offset * m->plan.grad_size;
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

tpd_status tpd_model_init_params(tpd_model *m, const tpd_dp_plan *dpp) {
    const tpd_model_layout *lay = &m->plan.lay;
    size_t n = m->plan.numel_padded;
    tpd_status st = TPD_OK;
    void *tmp = NULL;
    float *host = calloc(n ? n : 1, sizeof *host); /* (numel_padded) fp32 */
    if (!host) return tpd_fail_nomem("the host copy of the parameters", (n ? n : 1) * sizeof *host);
    for (int p = 0; p < TPD_P_COUNT; p++) {
        const tpd_param_slice *s = &lay->p[p];
        if (!s->present) continue;
        int64_t rows = (int64_t)s->layers * s->rows;
        for (int64_t r = 0; r < rows; r++) {
            int64_t g = tpd_model_layout_row_global(lay, (tpd_param)p, r);
            float *dst = host + tpd_model_layout_row_local(lay, (tpd_param)p, r);
            for (int c = 0; c < s->cols; c++)
                dst[c] = g < 0 ? 0.0f : tpd_model_init_value(&m->cfg, (tpd_param)p, g + c);
        }
    }
    if (tpd_kern_param_dtype(m->kb) == TPD_DTYPE_F32) {
        TPD_CHECK_GOTO(tpd_kern_copy_to_device(m->kb, m->params, host, n * 4), st, out);
    } else {
        TPD_CHECK_GOTO(tpd_kern_alloc(m->kb, n * 4, &tmp), st, out);
        TPD_CHECK_GOTO(tpd_kern_copy_to_device(m->kb, tmp, host, n * 4), st, out);
        TPD_CHECK_GOTO(
            tpd_kern_cast(m->kb, m->params, tpd_kern_param_dtype(m->kb), tmp, TPD_DTYPE_F32, n), st,
            out);
    }
    /* master weights hold this rank's owned ranges, in optimizer-state order */
    if (m->master) TPD_CHECK_GOTO(copy_owned(m, dpp, m->master, host), st, out);
    if (m->opt_m) TPD_CHECK_GOTO(tpd_kern_zero(m->kb, m->opt_m, m->plan.mem.optimizer), st, out);
    /* DiLoCo: the outer state starts at the initial weights, with no momentum */
    if (m->outer_sync) {
        TPD_CHECK_GOTO(tpd_kern_zero(m->kb, m->outer_sync, m->plan.mem.outer), st, out);
        TPD_CHECK_GOTO(copy_owned(m, dpp, m->outer_sync, host), st, out);
    }
    TPD_CHECK_GOTO(tpd_model_zero_grads(m), st, out);
    TPD_CHECK_GOTO(tpd_kern_synchronize(m->kb), st, out);
out:
    if (tmp) tpd_kern_free(m->kb, tmp);
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
    for (int pass = 0; pass < 2; pass++) { /* inputs [:, :T], then targets [:, 1:] */
        int32_t *stage = m->host_tokens + ((size_t)at->slot * 2 + (size_t)pass) * n;
        for (int b = 0; b < d->B; b++)
            memcpy(stage + (size_t)b * d->T, tokens + (size_t)b * (d->T + 1) + pass,
                   (size_t)d->T * 4);
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
