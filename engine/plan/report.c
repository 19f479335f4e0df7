/* What people read: the ranked table, one layout's breakdown, the rejection summary, and
 * the JSON form (cJSON). */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include "base/file.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define GIB 1073741824.0

/* The schedule as the table shows it: 1f1b, int (interleaved), zb-h1. */
static const char *sched_short(const tpd_plan_layout *l) {
    switch (tpd_plan_layout_schedule(l)) {
    case TPD_SCHEDULE_INTERLEAVED:
        return "int";
    case TPD_SCHEDULE_ZB_H1:
        return "zb-h1";
    case TPD_SCHEDULE_1F1B:
        break;
    }
    return "1f1b";
}

/* The overlap flags: g (grad reduce), p (param gather, ZeRO only), - (none). */
static const char *overlap_short(const tpd_plan_layout *l) {
    int g = l->overlap_grad_reduce, pg = l->overlap_param_gather && l->distributed_optimizer;
    return g ? (pg ? "g+p" : "g") : (pg ? "p" : "-");
}

/* off, on (ZeRO-1), 2, 3; with an h after it under hybrid sharding */
static const char *zero_short(const tpd_plan_layout *l) {
    static const char *const z[] = {"off", "on", "2", "3"}, *const zh[] = {"off", "on-h", "2-h",
                                                                           "3-h"};
    int hybrid = l->shard_size > 0 && l->shard_size < l->dp * tpd_plan_cp(l);
    return (hybrid ? zh : z)[tpd_plan_sharding(l)];
}

/* Beyond what `tripod train` runs: hybrid sharding (a shard group short of DP). Every
 * strategy over all of DP trains. */
static int planned_only(const tpd_plan_layout *l) {
    return tpd_plan_sharding(l) == TPD_DP_SHARDING_OPTIM && l->shard_size > 0 &&
           l->shard_size < l->dp * tpd_plan_cp(l);
}

static void print_sharding(FILE *f, const tpd_plan_result *r) {
    const tpd_plan_layout *l = &r->layout;
    const tpd_plan_stage_mem *m = &r->mem[r->max_mem_stage];
    tpd_dp_sharding sh = tpd_plan_sharding(l);
    int inner = l->dp * tpd_plan_cp(l), S = r->shard_group > 0 ? r->shard_group : inner;
    fprintf(f, "  DP sharding: %s over %d rank(s)%s%s",
            tpd_config_choice("parallel.data_parallel_sharding_strategy", sh), S,
            tpd_plan_cp(l) > 1 ? " of DP x CP" : "",
            S < inner ? " (HSDP: replicated across DP / shard size groups)" : "");
    fprintf(f,
            "; per rank (stage %d) params %.2f -> %.2f GiB, grads %.2f -> %.2f GiB, optimizer "
            "%.2f -> %.2f GiB",
            r->max_mem_stage, m->params_full / GIB, m->params / GIB, m->grads_full / GIB,
            m->grads / GIB, m->optimizer_full / GIB, m->optimizer / GIB);
    if (sh >= TPD_DP_SHARDING_OPTIM_GRADS || m->gather > 0)
        fprintf(f, ", gathered working set %.2f GiB", m->gather / GIB);
    double saved = m->params_full + m->grads_full + m->optimizer_full - m->params - m->grads -
                   m->optimizer - m->gather;
    fprintf(f, ": %.2f GiB saved\n", saved / GIB);
    if (planned_only(l))
        fprintf(f, "  planned, not trained: tripod train runs hybrid sharding (a shard group "
                   "short of DP) under optim_grads and optim_grads_params only; the planned "
                   "bytes are the target\n");
}

void tpd_plan_print_table(FILE *f, const tpd_plan_result *r, int n) {
    /* an EP column where some row splits its experts */
    int eps = 0;
    for (int i = 0; i < n; i++)
        eps |= tpd_plan_ep(&r[i].layout) > 1;
    fprintf(f, "%4s %3s %-7s %3s %5s", "rank", "TP", "CP", "PP", "DP");
    if (eps) fprintf(f, " %3s", "EP");
    fprintf(f, " %4s %2s %-5s %-9s %-3s %-4s %-3s %8s %8s %5s %6s %11s %6s %10s\n", "mbs", "v",
            "sched", "recompute", "SP", "ZeRO", "ovl", "mem GiB", "step s", "idle", "DP exp",
            "TFLOP/s/GPU", "MFU", "tokens/s");
    for (int i = 0; i < n; i++) {
        const tpd_plan_layout *l = &r[i].layout;
        char rc[16];
        if (r[i].recompute_layers)
            snprintf(rc, sizeof rc, "full:%d", r[i].recompute_layers); /* the block method */
        else
            snprintf(rc, sizeof rc, "%s", tpd_config_choice("training.recompute", l->recompute));
        const tpd_plan_time *t = &r[i].time;
        double st = r[i].step_time_s > 0 ? r[i].step_time_s : 1.0;
        char cp[16]; /* "1", or the size and its communication: "16 p2p" */
        if (tpd_plan_cp(l) > 1)
            snprintf(cp, sizeof cp, "%d %s", l->cp,
                     tpd_config_choice("parallel.cp_comm_type", l->cp_comm));
        else
            snprintf(cp, sizeof cp, "1");
        fprintf(f, "%4d %3d %-7s %3d %5d", i + 1, l->tp, cp, l->pp, l->dp);
        if (eps) fprintf(f, " %3d", tpd_plan_ep(l));
        fprintf(f,
                " %4d %2d %-5s %-9s %-3s %-4s %-3s %8.1f %8.3f %4.1f%% %5.1f%% %11.1f %5.1f%% "
                "%10.0f\n",
                l->micro_batch_size, l->virtual_stages, sched_short(l), rc,
                l->sequence_parallel ? "on" : "off", zero_short(l), overlap_short(l),
                r[i].memory_bytes / GIB, r[i].step_time_s, 100.0 * t->pp_idle_fraction,
                100.0 * (t->dp_comm_exposed + t->dp_gather_exposed) / st, r[i].tflops_per_gpu,
                100.0 * r[i].mfu, r[i].tokens_per_s);
    }
}

/* Bytes in the unit that reads best: GiB, MiB or KiB. */
static void bytes_str(double b, char *buf, size_t len) {
    if (b >= GIB)
        snprintf(buf, len, "%.2f GiB", b / GIB);
    else if (b >= 1048576.0)
        snprintf(buf, len, "%.1f MiB", b / 1048576.0);
    else
        snprintf(buf, len, "%.1f KiB", b / 1024.0);
}

/* DiLoCo beside every-step sync, for the same layout: what the slow link costs each way. */
static void print_diloco(FILE *f, const tpd_plan_result *r) {
    const tpd_plan_time *t = &r->time;
    int timed = r->every_step_time_s > 0.0; /* 0 off the reports' pass and on the cpu model */
    char es[32], dl[32], frag[32];
    fprintf(f,
            "DP sync, the same layout both ways (DiLoCo: H=%d, %d fragment(s), overlap_steps "
            "%d, %d replicas x DP %d):\n",
            r->diloco_h, r->diloco_fragments, r->diloco_overlap_steps, r->dp_replicas, r->dp_inner);
    fprintf(f, "  %-26s %14s %14s\n", "", "every step", "DiLoCo");
    if (timed) {
        fprintf(f, "  %-26s %14.3f %14.3f\n", "step time (s)", r->every_step_time_s,
                r->step_time_s);
        fprintf(f, "  %-26s %14.0f %14.0f\n", "tokens/s", r->every_step_tokens_per_s,
                r->tokens_per_s);
        fprintf(f, "  %-26s %13.1f%% %13.1f%%\n", "MFU", 100 * r->every_step_mfu, 100 * r->mfu);
        bytes_str(r->every_step_dp_bytes, es, sizeof es);
    } else {
        fprintf(f, "  %-26s %14s %14.3f\n", "step time (s)", "not timed", r->step_time_s);
        fprintf(f, "  %-26s %14s %14.0f\n", "tokens/s", "-", r->tokens_per_s);
        fprintf(f, "  %-26s %14s %13.1f%%\n", "MFU", "-", 100 * r->mfu);
        snprintf(es, sizeof es, "-");
    }
    bytes_str(r->dp_bytes_step, dl, sizeof dl);
    fprintf(f, "  %-26s %14s %14s\n", "DP bytes per rank per step", es, dl);
    fprintf(f, "  %-26s %14s %14s\n", "gradient reduction link",
            timed ? tpd_plan_hop_name(r->every_step_hop_dp) : "-", tpd_plan_hop_name(r->hop_dp));
    bytes_str(r->outer_frag_bytes, frag, sizeof frag);
    fprintf(f,
            "  outer all-reduce over the %d replicas: link %s, %.3f s per sync (every fragment), "
            "%.3f s exposed per step; outer update %.3f s per step; peak %s per rank (one "
            "fragment)\n",
            r->dp_replicas, tpd_plan_hop_name(r->hop_outer), r->outer_comm_s, t->dp_outer,
            t->outer_update, frag);
    if (timed)
        fprintf(f, "  DiLoCo / every step: %.3f of the step time\n",
                r->step_time_s / r->every_step_time_s);
}

/* Context parallelism: how a sequence is split, what a layer sends, and what the attention
 * hides of it. */
static void print_cp(FILE *f, const tpd_plan_result *r) {
    const tpd_plan_layout *l = &r->layout;
    int cp = tpd_plan_cp(l);
    if (cp < 2) return;
    char bytes[32];
    bytes_str(r->cp_bytes_layer, bytes, sizeof bytes);
    int ring = l->cp_comm == TPD_CP_COMM_P2P;
    fprintf(
        f,
        "    context parallel: CP=%d %s (%s), %d tokens of each sequence per rank, %s per layer "
        "per micro-batch to the CP peers",
        cp, tpd_config_choice("parallel.cp_comm_type", l->cp_comm),
        ring ? "ring attention" : "all-to-all around the attention", r->cp_tokens, bytes);
    if (r->cp_step_comm_s > 0.0 && ring)
        fprintf(f,
                "; a ring step sends K/V in %.3f ms beside %.3f ms of attention (%d step%s each "
                "way, K/V forward, K/V and dK/dV backward)",
                1e3 * r->cp_step_comm_s, 1e3 * r->cp_step_attn_s, cp - 1, cp > 2 ? "s" : "");
    else if (r->cp_step_comm_s > 0.0)
        fprintf(f, "; Q, K, V's all-to-all %.3f ms beside %.3f ms of attention (not hidden)",
                1e3 * r->cp_step_comm_s, 1e3 * r->cp_step_attn_s);
    fprintf(f, "; %.3f s exposed, %.3f s hidden per step\n", r->time.cp_comm,
            r->time.cp_comm_hidden);
}

/* Expert parallelism: the experts a rank holds, what an all-to-all moves and takes, and
 * where the expert gradients are summed. */
static void print_ep(FILE *f, const tpd_plan_result *r) {
    const tpd_plan_layout *l = &r->layout;
    int ep = tpd_plan_ep(l);
    if (ep < 2) return;
    char bytes[32];
    bytes_str(r->ep_a2a_bytes, bytes, sizeof bytes);
    double st = r->step_time_s > 0 ? r->step_time_s : 1.0;
    char over[48] = ""; /* the link, where the backend's model names one */
    if (r->hop_ep != TPD_PLAN_HOP_NONE)
        snprintf(over, sizeof over, " over %s", tpd_plan_hop_name(r->hop_ep));
    fprintf(f,
            "  all-to-all (EP)         %9.3f s  %5.1f%%  (inside compute, not overlapped: EP=%d%s, "
            "%d of %d experts a rank, moe_imbalance %.2f)\n",
            r->time.ep_comm, 100 * r->time.ep_comm / st, ep, over, r->ep_local_experts,
            r->ep_local_experts * ep, r->moe_imbalance);
    fprintf(f,
            "    expert parallel: per MoE layer and micro-batch 4 all-to-alls (dispatch and "
            "combine, forward and backward) of %s sent per rank",
            bytes);
    if (r->ep_a2a_s > 0.0)
        fprintf(f, ", %.3f ms each, and the expert counts' exchange %.3f ms", 1e3 * r->ep_a2a_s,
                1e3 * r->ep_counts_s);
    fprintf(f, "; expert gradients summed over %d rank(s) (expert-DP%s%s)\n", r->ep_expert_dp,
            r->hop_edp != TPD_PLAN_HOP_NONE ? ", " : "",
            r->hop_edp != TPD_PLAN_HOP_NONE ? tpd_plan_hop_name(r->hop_edp) : "");
}

void tpd_plan_print_breakdown(FILE *f, const tpd_plan_result *r) {
    char l[224];
    tpd_plan_layout_str(&r->layout, l, sizeof l);
    fprintf(f, "layout: %s, %d micro-batches\n", l, r->num_micro_batches);
    if (r->stages == 0) {
        fprintf(f, "  invalid: %s\n", r->reject_reason);
        return;
    }
    fprintf(f, "memory per rank (GiB):\n  %5s %6s %8s %8s %9s %11s %9s %8s\n", "stage", "layers",
            "params", "grads", "optimizer", "activations", "workspace", "total");
    for (int s = 0; s < r->stages; s++) {
        /* Long pipelines: the first two, the last two, and the largest stage. */
        if (r->stages > 6 && s > 1 && s < r->stages - 2 && s != r->max_mem_stage) {
            if (s == 2) fprintf(f, "  %5s\n", "...");
            continue;
        }
        const tpd_plan_stage_mem *m = &r->mem[s];
        fprintf(f, "  %5d %6d %8.2f %8.2f %9.2f %11.2f %9.2f %8.2f%s\n", s, r->stage_layers[s],
                m->params / GIB, m->grads / GIB, m->optimizer / GIB, m->activations / GIB,
                m->workspace / GIB, m->total / GIB, s == r->max_mem_stage ? "  <- max" : "");
    }
    fprintf(f, "  fits: %s%s%s\n", r->fits ? "yes" : "no", r->fits ? "" : ", ", r->reject_reason);
    print_sharding(f, r);
    if (r->recompute_layers)
        fprintf(f, "  full recompute of the first %d layer(s) of each model chunk fits\n",
                r->recompute_layers);
    if (r->balanced)
        fprintf(f, "  stages split by predicted time (the ends also embed, or run the head and "
                   "loss): parallel.pipeline_layers below\n");
    if (r->step_time_s <= 0.0) return;
    const tpd_plan_time *t = &r->time;
    double st = r->step_time_s;
    if (r->heldout.cls)
        fprintf(f,
                "time per step: %.3f s, held-out error of this class %+.0f%%..%+.0f%% (%s, %d "
                "published runs, each predicted without its source; positive: optimistic)\n",
                st, 100 * r->heldout.lo, 100 * r->heldout.hi, r->heldout.cls, r->heldout.runs);
    else
        fprintf(f, "time per step: %.3f s\n", st);
    if (tpd_plan_ep(&r->layout) > 1)
        fprintf(f,
                "  compute (slowest stage) %9.3f s  %5.1f%%  (of which TP comm %.3f s, CP comm "
                "%.3f s, EP all-to-all %.3f s, host %.3f s)\n",
                t->compute, 100 * t->compute / st, t->tp_comm, t->cp_comm, t->ep_comm,
                t->host_overhead);
    else if (tpd_plan_cp(&r->layout) > 1)
        fprintf(f,
                "  compute (slowest stage) %9.3f s  %5.1f%%  (of which TP comm %.3f s, CP comm "
                "%.3f s, host %.3f s)\n",
                t->compute, 100 * t->compute / st, t->tp_comm, t->cp_comm, t->host_overhead);
    else
        fprintf(f,
                "  compute (slowest stage) %9.3f s  %5.1f%%  (of which TP comm %.3f s, host %.3f "
                "s)\n",
                t->compute, 100 * t->compute / st, t->tp_comm, t->host_overhead);
    print_cp(f, r);
    print_ep(f, r);
    if (r->layout.tp_comm_overlap)
        fprintf(f, "    TP comm hidden behind the GEMMs (tp_comm_overlap) %.3f s\n",
                t->tp_comm_hidden);
    fprintf(f, "  pipeline bubble         %9.3f s  %5.1f%%\n", t->pp_bubble,
            100 * t->pp_bubble / st);
    fprintf(f, "  pipeline p2p (unhidden) %9.3f s  %5.1f%%\n", t->pp_p2p, 100 * t->pp_p2p / st);
    fprintf(f, "  DP comm (exposed)       %9.3f s  %5.1f%%\n", t->dp_comm_exposed,
            100 * t->dp_comm_exposed / st);
    fprintf(f, "  optimizer step          %9.3f s  %5.1f%%\n", t->optimizer,
            100 * t->optimizer / st);
    fprintf(f, "  param gather (exposed)  %9.3f s  %5.1f%%\n", t->dp_gather_exposed,
            100 * t->dp_gather_exposed / st);
    fprintf(f, "  sharded DP (exposed)    %9.3f s  %5.1f%%\n", t->dp_shard_exposed,
            100 * t->dp_shard_exposed / st);
    if (t->dp_replica_allreduce > 0)
        fprintf(f, "  HSDP replica all-reduce %9.3f s  %5.1f%%  (%s)\n", t->dp_replica_allreduce,
                100 * t->dp_replica_allreduce / st, tpd_plan_hop_name(r->hop_replica));
    fprintf(f, "  stragglers              %9.3f s  %5.1f%%\n", t->straggler,
            100 * t->straggler / st);
    fprintf(f, "  global syncs            %9.3f s  %5.1f%%\n", t->global_sync,
            100 * t->global_sync / st);
    fprintf(f, "  host per step           %9.3f s  %5.1f%%\n", t->step_host,
            100 * t->step_host / st);
    double hidden = t->dp_comm_total - t->dp_comm_exposed - t->dp_gather_exposed;
    fprintf(f,
            "  pipeline: %s schedule, idle %.1f%% of the stages' time (1 - busy/time, as the "
            "trainer measures)\n",
            tpd_config_choice("parallel.pipeline_schedule", tpd_plan_layout_schedule(&r->layout)),
            100 * t->pp_idle_fraction);
    fprintf(f,
            "  DP: %.3f s of communication on the busiest stage, %.3f s of it hidden "
            "(overlap_grad_reduce %s, overlap_param_gather %s); a stage's reduction ends up to "
            "%.3f s past its own pipeline (with a tied embedding over several stages, the "
            "wait for its other end included)\n",
            t->dp_comm_total, hidden > 0 ? hidden : 0.0,
            r->layout.overlap_grad_reduce ? "on" : "off",
            r->layout.overlap_param_gather ? "on" : "off", t->dp_exposed_max);
    if ((r->hop_tp || r->hop_dp || r->hop_pp) && r->diloco && r->dp_replicas > 1)
        fprintf(f,
                "  links (rank order TP fastest, then a replica's DP, then PP, then the %d "
                "replicas): TP %s, DP %s, PP %s, outer %s\n",
                r->dp_replicas, tpd_plan_hop_name(r->hop_tp), tpd_plan_hop_name(r->hop_dp),
                tpd_plan_hop_name(r->hop_pp), tpd_plan_hop_name(r->hop_outer));
    else if (tpd_plan_ep(&r->layout) > 1)
        fprintf(f,
                "  links (rank order TP fastest, then CP, EP, expert-DP, then PP): TP %s, CP %s, "
                "EP %s, %s %s, expert-DP %s, PP %s\n",
                tpd_plan_hop_name(r->hop_tp), tpd_plan_hop_name(r->hop_cp),
                tpd_plan_hop_name(r->hop_ep), tpd_plan_cp(&r->layout) > 1 ? "DP x CP" : "DP",
                tpd_plan_hop_name(r->hop_dp), tpd_plan_hop_name(r->hop_edp),
                tpd_plan_hop_name(r->hop_pp));
    else if (tpd_plan_cp(&r->layout) > 1 && (r->hop_tp || r->hop_cp || r->hop_dp || r->hop_pp))
        fprintf(f,
                "  links (rank order TP fastest, then CP, then DP, then PP): TP %s, CP %s, DP x "
                "CP %s, PP %s\n",
                tpd_plan_hop_name(r->hop_tp), tpd_plan_hop_name(r->hop_cp),
                tpd_plan_hop_name(r->hop_dp), tpd_plan_hop_name(r->hop_pp));
    else if (r->hop_tp || r->hop_dp || r->hop_pp)
        fprintf(f, "  links (rank order TP fastest, then DP, then PP): TP %s, DP %s, PP %s\n",
                tpd_plan_hop_name(r->hop_tp), tpd_plan_hop_name(r->hop_dp),
                tpd_plan_hop_name(r->hop_pp));
    fprintf(f, "  per chunk (slowest stage): fwd %.3f ms, bwd %.3f ms", 1e3 * r->t_fwd_chunk,
            1e3 * r->t_bwd_chunk);
    if (r->t_wgrad_chunk > 0) fprintf(f, " (of which W %.3f ms)", 1e3 * r->t_wgrad_chunk);
    fprintf(f, ", p2p %.3f ms\n", 1e3 * r->t_p2p);
    fprintf(f,
            "throughput: %.1f TFLOP/s/GPU model, %.1f with recomputation, MFU %.1f%%, "
            "%.0f tokens/s\n",
            r->tflops_per_gpu, r->hw_tflops_per_gpu, 100 * r->mfu, r->tokens_per_s);
    if (r->diloco) print_diloco(f, r);
}

/* The overrides that train r, on one line after "to train it:"; then what the preset says
 * was published, to read beside the prediction. */
void tpd_plan_print_overrides(FILE *f, const tpd_config *cfg, const tpd_plan_result *r) {
    char buf[4096];
    if (r->stages == 0 || tpd_plan_overrides(cfg, r, buf, sizeof buf) < 0) return;
    fprintf(f, "to train it: tripod train %s %s\n",
            cfg->source_path[0] ? cfg->source_path : "CONFIG.yaml", buf);
    if (planned_only(&r->layout))
        fprintf(f,
                "  (planned, not trained: tripod train refuses %s with a shard size below DP; "
                "the planned bytes are the target)\n",
                tpd_config_choice("parallel.data_parallel_sharding_strategy",
                                  tpd_plan_sharding(&r->layout)));
    if (tpd_plan_cp(&r->layout) > 1 && cfg->training.device == TPD_DEVICE_CUDA)
        fprintf(f, "  (planned, not trained on GPUs: tripod train runs context parallelism on the "
                   "cpu backend; the cuda bytes and times are the target)\n");
    tpd_plan_print_published(f, cfg);
}

/* A preset keeps its published figures in its own comments, beside the keys they explain;
 * the planner reads them from there rather than from a key no run would use. */
void tpd_plan_print_published(FILE *f, const tpd_config *cfg) {
    static const char mark[] = "# published:";
    if (!cfg->source_path[0]) return;
    int err;
    FILE *in = tpd_file_fopen_read(cfg->source_path, &err);
    if (!in) return;
    char line[1024];
    while (fgets(line, sizeof line, in)) {
        size_t n = strlen(line);
        int whole = n > 0 && line[n - 1] == '\n';
        if (strncmp(line, mark, sizeof mark - 1) == 0)
            fprintf(f, "%s%s", line + 2, whole ? "" : "\n");
        /* a line longer than the buffer: skip the rest of it */
        while (!whole && fgets(line, sizeof line, in)) {
            n = strlen(line);
            whole = n > 0 && line[n - 1] == '\n';
        }
    }
    fclose(in);
}

void tpd_plan_print_rejections(FILE *f, const tpd_plan_search *s) {
    if (s->n_reasons == 0) return;
    fprintf(f, "rejected %ld layouts:\n", s->rejected);
    for (int i = 0; i < s->n_reasons; i++) {
        const tpd_plan_reject_class *rc = &s->reasons[i];
        fprintf(f, "  %6ld  %s\n", rc->count, rc->key);
        for (int e = 0; e < rc->n_examples; e++)
            fprintf(f, "            e.g. %s\n", rc->examples[e]);
    }
}

/* "diloco": the DiLoCo timing of the layout and, under "every_step", the same layout with
 * every step's gradients summed over all of DP (null where it was not timed). */
static void diloco_json(cJSON *o, const tpd_plan_result *r) {
    cJSON *d = cJSON_AddObjectToObject(o, "diloco");
    if (!d) return;
    cJSON_AddNumberToObject(d, "sync_interval", r->diloco_h);
    cJSON_AddNumberToObject(d, "fragments", r->diloco_fragments);
    cJSON_AddNumberToObject(d, "overlap_steps", r->diloco_overlap_steps);
    cJSON_AddNumberToObject(d, "replicas", r->dp_replicas);
    cJSON_AddNumberToObject(d, "inner_dp", r->dp_inner);
    cJSON_AddNumberToObject(d, "step_time_s", r->step_time_s);
    cJSON_AddNumberToObject(d, "tokens_per_s", r->tokens_per_s);
    cJSON_AddNumberToObject(d, "mfu", r->mfu);
    cJSON_AddNumberToObject(d, "dp_bytes_per_rank_step", r->dp_bytes_step);
    cJSON_AddStringToObject(d, "dp_link", tpd_plan_hop_name(r->hop_dp));
    cJSON_AddStringToObject(d, "outer_link", tpd_plan_hop_name(r->hop_outer));
    cJSON_AddNumberToObject(d, "outer_comm_s", r->outer_comm_s);
    cJSON_AddNumberToObject(d, "outer_exposed_s", r->time.dp_outer);
    cJSON_AddNumberToObject(d, "outer_update_s", r->time.outer_update);
    cJSON_AddNumberToObject(d, "outer_fragment_bytes", r->outer_frag_bytes);
    if (r->every_step_time_s <= 0.0) {
        cJSON_AddNullToObject(d, "every_step");
        cJSON_AddNullToObject(d, "step_time_ratio");
        return;
    }
    cJSON *e = cJSON_AddObjectToObject(d, "every_step");
    if (e) {
        cJSON_AddNumberToObject(e, "step_time_s", r->every_step_time_s);
        cJSON_AddNumberToObject(e, "tokens_per_s", r->every_step_tokens_per_s);
        cJSON_AddNumberToObject(e, "mfu", r->every_step_mfu);
        cJSON_AddNumberToObject(e, "dp_bytes_per_rank_step", r->every_step_dp_bytes);
        cJSON_AddStringToObject(e, "dp_link", tpd_plan_hop_name(r->every_step_hop_dp));
    }
    /* DiLoCo's step over every-step's: below 1 when DiLoCo is faster */
    cJSON_AddNumberToObject(d, "step_time_ratio", r->step_time_s / r->every_step_time_s);
}

static cJSON *result_json(const tpd_config *cfg, const tpd_plan_result *r) {
    const tpd_plan_layout *l = &r->layout;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "tp", l->tp);
    cJSON_AddNumberToObject(o, "pp", l->pp);
    cJSON_AddNumberToObject(o, "dp", l->dp);
    cJSON_AddNumberToObject(o, "cp", tpd_plan_cp(l));
    cJSON_AddStringToObject(o, "cp_comm_type",
                            tpd_config_choice("parallel.cp_comm_type", l->cp_comm));
    cJSON_AddNumberToObject(o, "ep", tpd_plan_ep(l));
    cJSON_AddNumberToObject(o, "world", (double)tpd_plan_world(l));
    cJSON_AddNumberToObject(o, "micro_batch_size", l->micro_batch_size);
    cJSON_AddNumberToObject(o, "num_micro_batches", r->num_micro_batches);
    cJSON_AddNumberToObject(o, "virtual_stages", l->virtual_stages);
    cJSON_AddStringToObject(
        o, "pipeline_schedule",
        tpd_config_choice("parallel.pipeline_schedule", tpd_plan_layout_schedule(l)));
    cJSON_AddBoolToObject(o, "overlap_grad_reduce", l->overlap_grad_reduce);
    cJSON_AddBoolToObject(o, "overlap_param_gather", l->overlap_param_gather);
    cJSON_AddStringToObject(o, "recompute", tpd_config_choice("training.recompute", l->recompute));
    cJSON_AddBoolToObject(o, "sequence_parallel", l->sequence_parallel);
    cJSON_AddBoolToObject(o, "distributed_optimizer", l->distributed_optimizer);
    cJSON_AddStringToObject(
        o, "sharding",
        tpd_config_choice("parallel.data_parallel_sharding_strategy", tpd_plan_sharding(l)));
    cJSON_AddNumberToObject(o, "shard_size", r->shard_group);
    cJSON_AddBoolToObject(o, "tp_comm_overlap", l->tp_comm_overlap);
    /* what `tripod train` does not run: ZeRO-1 in shard groups, CP on the cuda backend, EP */
    cJSON_AddBoolToObject(
        o, "planned_only",
        planned_only(l) || tpd_plan_ep(l) > 1 ||
            (tpd_plan_cp(l) > 1 && cfg && cfg->training.device == TPD_DEVICE_CUDA));
    cJSON_AddBoolToObject(o, "fits", r->fits);
    if (r->reject_reason[0])
        cJSON_AddStringToObject(o, "reject_reason", r->reject_reason);
    else
        cJSON_AddNullToObject(o, "reject_reason");
    cJSON *pl = cJSON_AddArrayToObject(o, "pipeline_layers");
    for (int s = 0; pl && s < r->stages; s++)
        cJSON_AddItemToArray(pl, cJSON_CreateNumber(r->stage_layers[s]));
    /* per virtual stage (chunk c of stage s at c*PP + s): parallel.pipeline_layers when v > 1 */
    cJSON *cl = cJSON_AddArrayToObject(o, "virtual_stage_layers");
    for (int i = 0; cl && r->stages > 0 && i < r->stages * l->virtual_stages; i++)
        cJSON_AddItemToArray(cl, cJSON_CreateNumber(r->chunk_layers[i]));
    cJSON_AddBoolToObject(o, "pipeline_layers_balanced", r->balanced);
    cJSON_AddNumberToObject(o, "recompute_num_layers", r->recompute_layers);
    cJSON_AddNumberToObject(o, "memory_bytes_per_rank", r->memory_bytes);
    cJSON_AddNumberToObject(o, "memory_max_stage", r->max_mem_stage);
    cJSON *mb = cJSON_AddArrayToObject(o, "memory_breakdown");
    for (int s = 0; mb && s < r->stages; s++) {
        cJSON *e = cJSON_CreateObject();
        if (!e) break;
        cJSON_AddNumberToObject(e, "stage", s);
        cJSON_AddNumberToObject(e, "layers", r->stage_layers[s]);
        cJSON_AddNumberToObject(e, "params", r->mem[s].params);
        cJSON_AddNumberToObject(e, "grads", r->mem[s].grads);
        cJSON_AddNumberToObject(e, "optimizer", r->mem[s].optimizer);
        cJSON_AddNumberToObject(e, "activations", r->mem[s].activations);
        cJSON_AddNumberToObject(e, "workspace", r->mem[s].workspace);
        cJSON_AddNumberToObject(e, "gather", r->mem[s].gather);
        cJSON_AddNumberToObject(e, "total", r->mem[s].total);
        cJSON_AddItemToArray(mb, e);
    }
    cJSON_AddNumberToObject(o, "step_time_s", r->step_time_s);
    /* the framework profile the times assume ("" when none was applied) */
    cJSON_AddStringToObject(o, "framework", r->framework);
    if (r->heldout.cls) {
        /* predicted speed / published speed - 1 on the class's held-out published runs */
        cJSON *h = cJSON_AddObjectToObject(o, "heldout_error");
        if (h) {
            cJSON_AddStringToObject(h, "class", r->heldout.cls);
            cJSON_AddNumberToObject(h, "runs", r->heldout.runs);
            cJSON_AddNumberToObject(h, "lo", r->heldout.lo);
            cJSON_AddNumberToObject(h, "hi", r->heldout.hi);
        }
    }
    cJSON *tb = cJSON_AddObjectToObject(o, "time_breakdown");
    if (tb) {
        cJSON_AddNumberToObject(tb, "compute", r->time.compute);
        cJSON_AddNumberToObject(tb, "tp_comm", r->time.tp_comm);
        cJSON_AddNumberToObject(tb, "tp_comm_hidden", r->time.tp_comm_hidden);
        cJSON_AddNumberToObject(tb, "cp_comm", r->time.cp_comm);
        cJSON_AddNumberToObject(tb, "cp_comm_hidden", r->time.cp_comm_hidden);
        cJSON_AddNumberToObject(tb, "ep_comm", r->time.ep_comm);
        cJSON_AddNumberToObject(tb, "host_overhead", r->time.host_overhead);
        cJSON_AddNumberToObject(tb, "pp_bubble", r->time.pp_bubble);
        cJSON_AddNumberToObject(tb, "pp_p2p", r->time.pp_p2p);
        cJSON_AddNumberToObject(tb, "dp_comm_exposed", r->time.dp_comm_exposed);
        cJSON_AddNumberToObject(tb, "optimizer", r->time.optimizer);
        cJSON_AddNumberToObject(tb, "dp_gather_exposed", r->time.dp_gather_exposed);
        cJSON_AddNumberToObject(tb, "dp_shard_exposed", r->time.dp_shard_exposed);
        cJSON_AddNumberToObject(tb, "dp_replica_allreduce", r->time.dp_replica_allreduce);
        cJSON_AddNumberToObject(tb, "straggler", r->time.straggler);
        cJSON_AddNumberToObject(tb, "global_sync", r->time.global_sync);
        cJSON_AddNumberToObject(tb, "step_host", r->time.step_host);
        cJSON_AddNumberToObject(tb, "dp_comm_total", r->time.dp_comm_total);
        cJSON_AddNumberToObject(tb, "dp_exposed_max", r->time.dp_exposed_max);
        cJSON_AddNumberToObject(tb, "pp_idle_fraction", r->time.pp_idle_fraction);
    }
    cJSON *ln = cJSON_AddObjectToObject(o, "links");
    if (ln) {
        cJSON_AddStringToObject(ln, "tp", tpd_plan_hop_name(r->hop_tp));
        cJSON_AddStringToObject(ln, "cp", tpd_plan_hop_name(r->hop_cp));
        cJSON_AddStringToObject(ln, "ep", tpd_plan_hop_name(r->hop_ep));
        cJSON_AddStringToObject(ln, "expert_dp", tpd_plan_hop_name(r->hop_edp));
        cJSON_AddStringToObject(ln, "dp", tpd_plan_hop_name(r->hop_dp));
        cJSON_AddStringToObject(ln, "pp", tpd_plan_hop_name(r->hop_pp));
    }
    if (tpd_plan_cp(l) > 1) {
        /* one layer of one micro-batch on one rank (plan.h: cp_bytes_layer) */
        cJSON *cpo = cJSON_AddObjectToObject(o, "context_parallel");
        if (cpo) {
            cJSON_AddNumberToObject(cpo, "tokens_per_rank", r->cp_tokens);
            cJSON_AddNumberToObject(cpo, "bytes_per_layer", r->cp_bytes_layer);
            cJSON_AddNumberToObject(cpo, "step_comm_s", r->cp_step_comm_s);
            cJSON_AddNumberToObject(cpo, "step_attention_s", r->cp_step_attn_s);
        }
    }
    if (tpd_plan_ep(l) > 1) {
        /* one MoE layer of one micro-batch on one rank (plan.h: ep_a2a_bytes) */
        cJSON *epo = cJSON_AddObjectToObject(o, "expert_parallel");
        if (epo) {
            cJSON_AddNumberToObject(epo, "local_experts", r->ep_local_experts);
            cJSON_AddNumberToObject(epo, "expert_dp", r->ep_expert_dp);
            cJSON_AddNumberToObject(epo, "moe_imbalance", r->moe_imbalance);
            cJSON_AddNumberToObject(epo, "a2a_bytes_per_rank", r->ep_a2a_bytes);
            cJSON_AddNumberToObject(epo, "a2a_s", r->ep_a2a_s);
            cJSON_AddNumberToObject(epo, "counts_s", r->ep_counts_s);
            cJSON_AddNumberToObject(epo, "a2a_per_layer_micro_batch", 4);
        }
    }
    char buf[4096];
    if (cfg && r->stages > 0 && tpd_plan_overrides(cfg, r, buf, sizeof buf) >= 0) {
        cJSON *ov = cJSON_AddArrayToObject(o, "overrides");
        for (char *save = NULL, *tok = strtok_r(buf, " ", &save); ov && tok;
             tok = strtok_r(NULL, " ", &save))
            cJSON_AddItemToArray(ov, cJSON_CreateString(tok));
    }
    cJSON_AddNumberToObject(o, "tflops_per_gpu", r->tflops_per_gpu);
    cJSON_AddNumberToObject(o, "hw_tflops_per_gpu", r->hw_tflops_per_gpu);
    cJSON_AddNumberToObject(o, "mfu", r->mfu);
    cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
    if (r->diloco) diloco_json(o, r);
    return o;
}

char *tpd_plan_json(const tpd_config *cfg, const tpd_plan_result *r, int n) {
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return NULL;
    for (int i = 0; i < n; i++) {
        cJSON *o = result_json(cfg, &r[i]);
        if (!o) {
            cJSON_Delete(arr);
            return NULL;
        }
        cJSON_AddItemToArray(arr, o);
    }
    char *s = cJSON_Print(arr);
    cJSON_Delete(arr);
    return s;
}
