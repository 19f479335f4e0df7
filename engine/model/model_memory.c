/* The buffer plan: every byte a rank allocates, computed without allocating. */
#include "engine/model/model.h"

#include <stdlib.h>
#include <string.h>

#include "base/align.h"

static size_t take(size_t *cursor, size_t bytes) {
    size_t at = *cursor;
    *cursor += tpd_align_up(bytes);
    return at;
}

/* Saved attention state per layer and micro-batch, as each backend keeps it: cuDNN flash
 * attention (cuda, bf16, attention: fused) keeps the softmax statistics (B,NH,T) fp32;
 * the unfused cuda path keeps the probabilities (B,NH,T,T) in the activation dtype; the
 * cpu backend keeps them (B,NH,T,T) in fp32. */
static size_t att_saved_bytes(const tpd_config *cfg, const tpd_model_dims *d, size_t act) {
    size_t rows = (size_t)d->B * d->NHl * d->T;
    /* context parallelism, p2p: the ring keeps the log-sum-exp (B,NH,T) fp32 only */
    if (d->cp_size > 1 && !d->cp_a2a) return rows * 4;
    if (cfg->training.device != TPD_DEVICE_CUDA) return rows * d->T * 4;
    if (cfg->training.attention == TPD_ATTENTION_FUSED && act == 2) return rows * 4;
    return rows * d->T * act;
}

void tpd_model_kern_shapes(const tpd_config *cfg, const tpd_model_dims *d, tpd_kern_shapes *s) {
    memset(s, 0, sizeof *s);
    s->B = d->B;
    s->T = d->T;
    s->Nl = d->Nl;
    s->C = d->C;
    if (d->Ls > 0) { /* attention and the linear layers run only where layers are */
        s->NH = d->NHl;
        s->NKV = d->KVl;
        s->HS = d->HS;
        int oc = 0;
        if (d->bias) oc = d->C > d->FCml ? d->C : d->FCml;
        if ((d->bias || tpd_config_qkv_bias(cfg)) && d->QKVl > oc) oc = d->QKVl;
        if (d->bias && d->E && d->FCel > oc) oc = d->FCel; /* the experts' fc */
        s->bias_oc = oc;
        /* the experts' rows back to their tokens: at most N*topk kept assignments */
        s->moe_rows = d->E ? d->B * d->T * d->topk : 0;
    }
    s->Vl = d->first ? d->Vl : 0; /* the embedding backward; the tied head is a matmul */
    s->rmsnorm = d->rms;
    s->dtype = cfg->training.precision == TPD_PRECISION_BF16 ? TPD_DTYPE_BF16 : TPD_DTYPE_F32;
    s->fused_attention = cfg->training.attention == TPD_ATTENTION_FUSED;
}

tpd_status tpd_model_schedule(const tpd_config *cfg, int pp, int stage, int micro_batches,
                              tpd_pp_schedule *sched_p) {
    tpd_pp_kind kind = TPD_PP_KIND_1F1B;
    switch (tpd_config_schedule(cfg)) {
    case TPD_SCHEDULE_1F1B:
        kind = TPD_PP_KIND_1F1B;
        break;
    case TPD_SCHEDULE_INTERLEAVED:
        kind = TPD_PP_KIND_INTERLEAVED;
        break;
    case TPD_SCHEDULE_ZB_H1:
        kind = TPD_PP_KIND_ZB_H1;
        break;
    }
    int v = cfg->parallel.virtual_pipeline_model_parallel_size;
    return tpd_pp_schedule_make(kind, pp, stage, micro_batches, v > 1 ? v : 1, sched_p);
}

size_t tpd_act_layers_bytes(const tpd_buffer_plan *b, int chunk, int i0, int i1) {
    const tpd_model_dims *d = &b->lay.d;
    int l0 = d->chunk_l0[chunk];
    size_t nm =
        (size_t)(tpd_model_dims_moe_before(d, l0 + i1) - tpd_model_dims_moe_before(d, l0 + i0));
    return nm * b->layer.bytes + ((size_t)(i1 - i0) - nm) * b->layer.bytes_dense;
}

tpd_status tpd_buffer_plan_init(const tpd_config *cfg, int tp, int tp_rank, int pp, int dp,
                                int stage, tpd_buffer_plan *plan_p) {
    tpd_buffer_plan b;
    memset(&b, 0, sizeof b);
    TPD_CHECK(tpd_model_layout_init_ep(cfg, tp, tp_rank, pp, stage, tpd_config_ep(cfg), 0,
                                       tpd_model_expert_align(cfg, tpd_config_dp_inner(cfg, dp)),
                                       &b.lay));
    const tpd_model_dims *d = &b.lay.d;
    int bf16 = cfg->training.precision == TPD_PRECISION_BF16;
    b.act_size = b.param_size = bf16 ? 2 : 4;
    /* fp32 main gradients unless training.accumulate_allreduce_grads_in_fp32 is false */
    b.grad_size = (size_t)tpd_config_grad_bytes(cfg);
    b.has_master = bf16;
    /* DP padding and the ZeRO-1 shard are over the ranks whose gradients are summed each
     * step: all of DP, or one DiLoCo replica's */
    /* hybrid sharding: over the shard group only (replicated across the groups) */
    int dp_inner = tpd_config_dp_shard_engine(cfg, dp);
    tpd_dp_plan dpp;
    TPD_CHECK(tpd_model_dp_plan(cfg, &b.lay, dp_inner, 0, &dpp));
    b.numel_padded = dpp.numel_padded;
    b.shard_numel = dpp.shard_numel;
    b.sharding = dpp.bounds ? cfg->parallel.data_parallel_sharding_strategy
                            : (dpp.zero ? TPD_DP_SHARDING_OPTIM : TPD_DP_SHARDING_NO_SHARD);
    if (dpp.bounds) {
        /* the embedding's slot (the first unit after EP's expert units) is the gradients'
         * own for the step; the expert units have slots of their own */
        for (int u = 0; u < dpp.nbuckets; u++) {
            size_t n = tpd_dp_unit_slot_numel(&dpp, u);
            if (u < dpp.ebuckets) {
                if (n > b.xslot_numel) b.xslot_numel = n;
                continue;
            }
            if (n > b.pslot_numel) b.pslot_numel = n;
            if (u == dpp.ebuckets)
                b.eslot_numel = n;
            else if (n > b.gslot_numel)
                b.gslot_numel = n;
        }
        b.pool_grads = 2; /* one filling while the other is reduce-scattered */
        if (b.sharding == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS) {
            int k = cfg->parallel.fsdp_units_in_flight;
            b.pool_params = k > 2 ? k : 2;
        } else {
            b.pslot_numel = 0;
        }
    }
    tpd_dp_plan_free(&dpp);
    /* slots and head blocks: the peaks of the action list this stage runs */
    tpd_pp_schedule sched;
    TPD_CHECK(tpd_model_schedule(cfg, pp, stage, tpd_config_num_micro_batches(cfg, dp), &sched));
    b.nslots = tpd_pp_schedule_peak_in_flight(&sched);
    b.nheads = d->last ? tpd_pp_schedule_peak_in_flight_chunk(&sched, d->v - 1) : 0;
    b.split = sched.split_backward;
    int pending = 0, peak_w = 0; /* ZB-H1: (micro-batch, chunk) pairs between B and W */
    for (int i = 0; b.split && i < sched.count; i++) {
        pending += sched.actions[i].kind == TPD_PP_BWD;
        pending -= sched.actions[i].kind == TPD_PP_WGRAD;
        if (pending > peak_w) peak_w = pending;
    }
    tpd_pp_schedule_free(&sched);
    if (b.pool_grads && b.split) { /* the layers whose W is pending, micro-batches sharing a
                                      slot, besides the two */
        int lc = 0;
        for (int c = 0; c < d->v; c++)
            if (d->chunk_layers[c] > lc) lc = d->chunk_layers[c];
        b.pool_grads += peak_w * lc < d->Ls ? peak_w * lc : d->Ls;
    }
    b.att_saved = att_saved_bytes(cfg, d, b.act_size);
    if (d->cp_a2a) {
        /* Ulysses: the attention of whole sequences of NH/CP heads keeps its own state, then
         * its whole-sequence output */
        tpd_model_dims h = *d;
        h.NHl = d->NHl / d->cp_size;
        h.T = d->Tg;
        b.cp_att_probs = tpd_align_up(att_saved_bytes(cfg, &h, b.act_size));
        b.att_saved = b.cp_att_probs + (size_t)d->B * d->T * d->Cl * b.act_size;
    }

    /* NL: rows of the LayerNorm/residual regions, N/tp under sequence parallel */
    size_t N = (size_t)d->B * d->T, NL = (size_t)d->Nl, C = (size_t)d->C, a = b.act_size;
    size_t cur = 0;
    b.s_tokens = take(&cur, N * 4);
    b.s_targets = take(&cur, N * 4);
    b.s_x0 = take(&cur, NL * C * a);
    size_t lc = 0, nmean = d->rms ? 0 : NL * 4; /* RMSNorm keeps no mean */
    tpd_act_layer *l = &b.layer;
    l->ln1 = take(&lc, NL * C * a);
    l->ln1_mean = take(&lc, nmean);
    l->ln1_rstd = take(&lc, NL * 4);
    l->qkv = take(&lc, N * (size_t)d->QKVl * a);
    size_t qk_heads = d->qkn ? N * (size_t)(d->NHl + d->KVl) : 0; /* Qwen3's QK norm */
    l->qkn_raw = take(&lc, qk_heads * (size_t)d->HS * a);
    l->qkn_rstd = take(&lc, qk_heads * 4);
    l->atty = take(&lc, N * (size_t)d->Cl * a);
    /* selective recompute: the attention state is rebuilt in the backward, in one shared
     * workspace block, instead of kept per layer and micro-batch */
    b.selective = cfg->training.recompute == TPD_RECOMPUTE_SELECTIVE;
    /* the ring's saved state is its LSE alone: there are no probabilities to drop, so
     * selective recompute keeps it per layer */
    if (d->cp_size > 1 && !d->cp_a2a) b.selective = 0;
    l->att = b.selective ? 0 : take(&lc, b.att_saved);
    l->x1 = take(&lc, NL * C * a);
    l->ln2 = take(&lc, NL * C * a);
    l->ln2_mean = take(&lc, nmean);
    l->ln2_rstd = take(&lc, NL * 4);
    l->fch = take(&lc, N * (size_t)d->FCml * a); /* SwiGLU: [gate | up] */
    l->fch_gelu = take(&lc, N * (size_t)d->Fml * a);
    l->out = take(&lc, NL * C * a);
    l->bytes_dense = lc;
    if (d->E) {
        size_t E = (size_t)d->E, nk = N * (size_t)d->topk;
        l->moe_probs = take(&lc, N * E * 4);
        l->moe_lse = take(&lc, N * 4);
        l->moe_topi = take(&lc, nk * 4);
        l->moe_topw = take(&lc, nk * 4);
        l->moe_pos = take(&lc, nk * 4);
        l->moe_order = take(&lc, nk * 4);
        l->moe_wperm = take(&lc, nk * 4);
        l->moe_counts = take(&lc, (E + 1) * 4);
        size_t nr = tpd_model_moe_recv_rows(d);
        l->moe_x = take(&lc, nr * C * a);
        l->moe_h = take(&lc, nr * (size_t)d->FCel * a);
        l->moe_hact = take(&lc, nr * (size_t)d->Fel * a);
        l->moe_y = take(&lc, nk * C * a);
        l->moe_shout = d->Fs ? take(&lc, N * C * a) : 0;
        l->moe_gate = d->shgate ? take(&lc, N * 4) : 0;
        l->moe_ecounts = d->ep_size > 1 ? take(&lc, (size_t)d->ep_size * d->El * 4) : 0;
    }
    l->bytes = lc;
    /* full recompute of each chunk's first R layers (all of them unless
     * training.recompute_num_layers is smaller, Megatron's block method per model chunk):
     * those keep only their output per slot, and the backward rebuilds their blocks in the
     * workspace; the other layers keep theirs. A slot fits the largest chunk. */
    size_t kept_max = 0; /* the most bytes one chunk's kept layers take */
    for (int c = 0; c < d->v; c++) {
        int Lc = d->chunk_layers[c], R = 0;
        if (cfg->training.recompute == TPD_RECOMPUTE_FULL) {
            int n = cfg->training.recompute_num_layers;
            R = n > 0 && n < Lc ? n : Lc;
        }
        b.recompute[c] = R;
        if (R > b.recompute_max) b.recompute_max = R;
        size_t kept = tpd_act_layers_bytes(&b, c, R, Lc);
        if (kept > kept_max) kept_max = kept;
    }
    b.s_outs = cur;
    for (int i = 0; i < b.recompute_max; i++)
        take(&cur, NL * C * a);
    b.s_layers = cur;
    cur += kept_max;
    b.slot_bytes = cur;
    if (d->last) {
        size_t h = 0;
        b.h_lnf = take(&h, NL * C * a);
        b.h_lnf_mean = take(&h, nmean);
        b.h_lnf_rstd = take(&h, NL * 4);
        b.h_logits = take(&h, N * (size_t)d->Vl * a);
        b.h_xstats = take(&h, 3 * N * 4);
        b.h_loss = take(&h, N * 4);
        b.head_bytes = h;
    }

    size_t w = 0;
    b.w_dres = take(&w, NL * C * a);
    b.w_dtmp = take(&w, NL * C * a);
    b.w_dln = take(&w, N * C * a);
    b.w_dqkv = take(&w, N * (size_t)d->QKVl * a);
    b.w_datty = take(&w, N * (size_t)d->Cl * a);
    b.w_dfch = take(&w, N * (size_t)d->Fml * a);
    b.w_dglu = d->glu ? take(&w, N * (size_t)d->FCml * a) : 0;
    /* every virtual stage but the very first sends its input's gradient */
    b.w_dsend = d->first && d->v == 1 ? 0 : take(&w, NL * C * a);
    b.w_layer = b.recompute_max ? take(&w, lc) : 0;
    b.w_att = b.selective ? take(&w, b.att_saved) : 0;
    if (d->sp) {
        b.w_gath = take(&w, N * C * a);
        b.w_dlnl = take(&w, NL * C * a);
    }
    b.w_loss = d->last ? take(&w, sizeof(double)) : 0;
    if (d->E) {
        size_t nk = N * (size_t)d->topk;
        b.w_moe_y = take(&w, N * C * a);
        b.w_moe_perm = take(&w, nk * C * a);
        size_t nr = tpd_model_moe_recv_rows(d);
        b.w_moe_dh = take(&w, nr * (size_t)d->FCel * a);
        b.w_moe_dhact = take(&w, nr * (size_t)d->Fel * a);
        b.w_moe_dw = take(&w, nk * 4);
        b.w_moe_dlogits = take(&w, N * (size_t)d->E * 4);
        b.w_moe_dx = take(&w, N * C * a);
        b.w_moe_x = d->sp ? take(&w, N * C * a) : 0;
        if (d->ep_size > 1) {
            b.w_moe_ea = take(&w, nr * C * a);
            b.w_moe_eb = take(&w, nr * C * a);
        }
    }
    if (d->cp_size > 1 && !d->cp_a2a) {
        size_t kv = N * 2 * (size_t)d->KVl * d->HS, bh = (size_t)d->B * d->NHl * d->T;
        b.w_cpkv = take(&w, 2 * kv * a);
        b.w_cpdkv = take(&w, 2 * kv * 4);
        b.w_cpo = take(&w, bh * d->HS * 4);
        b.w_cpm = take(&w, bh * 4);
        b.w_cpl = take(&w, bh * 4);
        b.w_cppos = take(&w, ((size_t)d->Tg + d->T) * 4);
    } else if (d->cp_a2a) {
        b.w_a2a_send = take(&w, N * (size_t)d->QKVl * a);
        b.w_a2a_recv = take(&w, N * (size_t)d->QKVl * a);
    }
    b.ws_bytes = w;
    tpd_kern_shapes shapes;
    tpd_model_kern_shapes(cfg, d, &shapes);
    tpd_kern_scratch scratch;
    TPD_CHECK(tpd_kern_scratch_plan(cfg->training.device == TPD_DEVICE_CUDA ? "cuda" : "cpu",
                                    &shapes, &scratch));
    b.scratch_bytes = scratch.total;
    b.host_bytes = (size_t)b.nslots * 2 * N * 4;
    if (d->E && cfg->training.device == TPD_DEVICE_CUDA) {
        size_t h = tpd_align_up(b.host_bytes), E = (size_t)d->E, nk = N * (size_t)d->topk;
        b.moe_host = 1;
        b.h_moe_route = take(&h, l->moe_counts + (E + 1) * 4 - l->moe_probs);
        b.h_moe_gate = d->shgate ? take(&h, N * 4) : 0;
        b.h_moe_ecounts = d->ep_size > 1 ? take(&h, (size_t)d->ep_size * d->El * 4) : 0;
        b.h_moe_dw = take(&h, nk * 4);
        b.h_moe_dlogits = take(&h, N * E * 4);
        b.host_bytes = h;
    }

    tpd_mem_breakdown *mem = &b.mem;
    int shard_p = b.sharding == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS;
    int shard_g = b.sharding >= TPD_DP_SHARDING_OPTIM_GRADS;
    mem->params = (shard_p ? b.shard_numel : b.numel_padded) * b.param_size;
    mem->grads = (shard_g ? b.shard_numel : b.numel_padded) * b.grad_size;
    mem->gather = (uint64_t)tpd_buffer_plan_pool_p_numel(&b) * b.param_size +
                  (uint64_t)tpd_buffer_plan_pool_g_numel(&b) * b.grad_size;
    /* AdamW's m and v; plain SGD keeps no state */
    mem->optimizer = cfg->optimizer.type == TPD_OPTIM_SGD ? 0 : 2 * b.shard_numel * 4;
    mem->master = b.has_master ? b.shard_numel * 4 : 0;
    mem->outer = cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO
                     ? (2 * (uint64_t)b.shard_numel +
                        tpd_diloco_fragment_numel(b.shard_numel, cfg->diloco.fragments)) *
                           4
                     : 0;
    mem->activations = (uint64_t)b.nslots * b.slot_bytes + (uint64_t)b.nheads * b.head_bytes;
    /* workspace includes the backend's scratch and the host-side staging of each slot's
     * inputs and targets */
    mem->workspace = b.ws_bytes + b.scratch_bytes + b.host_bytes;
    mem->total = mem->params + mem->grads + mem->gather + mem->optimizer + mem->master +
                 mem->outer + mem->activations + mem->workspace;
    *plan_p = b;
    return TPD_OK;
}

tpd_status tpd_model_dp_plan(const tpd_config *cfg, const tpd_model_layout *lay, int dp_size,
                             int dp_rank, tpd_dp_plan *plan_p) {
    const tpd_config_parallel *p = &cfg->parallel;
    if (p->data_parallel_sharding_strategy < TPD_DP_SHARDING_OPTIM_GRADS || dp_size < 2) {
        tpd_dp_plan dpp;
        int ep = lay->d.ep_size > 0 ? lay->d.ep_size : 1;
        if (lay->expert_numel > 0 && p->use_distributed_optimizer && dp_size > 1)
            /* ZeRO-1 under EP: the experts' state sharded over expert DP */
            return tpd_dp_plan_init_ep(lay->numel, lay->expert_numel, (size_t)p->ddp_bucket_size,
                                       dp_size, dp_rank, ep, plan_p);
        TPD_CHECK(tpd_dp_plan_init(lay->numel, (size_t)p->ddp_bucket_size, dp_size, dp_rank,
                                   p->use_distributed_optimizer, &dpp));
        /* EP: the experts' region is summed over the expert-DP group, DP / EP ranks */
        tpd_status st = tpd_dp_plan_set_experts(&dpp, lay->expert_numel, dp_size / ep);
        if (st != TPD_OK) {
            tpd_dp_plan_free(&dpp);
            return st;
        }
        *plan_p = dpp;
        return TPD_OK;
    }
    /* EP: the experts' region first, one expert unit per local layer over expert DP */
    int Ls = lay->d.Ls, ne = lay->expert_numel > 0 ? Ls : 0, n = ne + Ls + 2;
    size_t *bounds = calloc((size_t)n + 1, sizeof *bounds);
    if (!bounds) return tpd_fail_nomem("the unit bounds", ((size_t)n + 1) * sizeof *bounds);
    if (ne) tpd_model_layout_expert_bounds(lay, bounds);
    tpd_model_layout_unit_bounds(lay, bounds + ne);
    tpd_status st = tpd_dp_plan_init_units_ep(
        bounds, n, ne, dp_size, dp_rank, lay->d.ep_size > 0 ? lay->d.ep_size : 1,
        p->data_parallel_sharding_strategy == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, plan_p);
    free(bounds);
    return st;
}

size_t tpd_diloco_fragment_numel(size_t shard_numel, int fragments) {
    size_t f = fragments > 0 ? (size_t)fragments : 1;
    return (shard_numel + f - 1) / f;
}

tpd_status tpd_model_memory(const tpd_config *cfg, int tp, int pp, int dp, int stage,
                            tpd_mem_breakdown *mem_p) {
    tpd_buffer_plan b;
    TPD_CHECK(tpd_buffer_plan_init(cfg, tp, 0, pp, dp, stage, &b));
    *mem_p = b.mem;
    return TPD_OK;
}
