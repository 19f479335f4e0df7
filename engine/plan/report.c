/* What people read: the ranked table, one layout's breakdown, the rejection summary, and
 * the JSON form (cJSON). */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

#define GIB 1073741824.0

void tpd_plan_print_table(FILE *f, const tpd_plan_result *r, int n) {
    fprintf(f, "%4s %3s %3s %5s %4s %2s %-9s %-3s %-4s %8s %8s %11s %6s %10s\n", "rank", "TP", "PP",
            "DP", "mbs", "v", "recompute", "SP", "ZeRO", "mem GiB", "step s", "TFLOP/s/GPU", "MFU",
            "tokens/s");
    for (int i = 0; i < n; i++) {
        const tpd_plan_layout *l = &r[i].layout;
        char rc[16];
        if (r[i].recompute_layers)
            snprintf(rc, sizeof rc, "full:%d", r[i].recompute_layers); /* the block method */
        else
            snprintf(rc, sizeof rc, "%s", tpd_config_choice("training.recompute", l->recompute));
        fprintf(f, "%4d %3d %3d %5d %4d %2d %-9s %-3s %-4s %8.1f %8.3f %11.1f %5.1f%% %10.0f\n",
                i + 1, l->tp, l->pp, l->dp, l->micro_batch_size, l->virtual_stages, rc,
                l->sequence_parallel ? "on" : "off", l->distributed_optimizer ? "on" : "off",
                r[i].memory_bytes / GIB, r[i].step_time_s, r[i].tflops_per_gpu, 100.0 * r[i].mfu,
                r[i].tokens_per_s);
    }
}

void tpd_plan_print_breakdown(FILE *f, const tpd_plan_result *r) {
    char l[160];
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
    if (r->recompute_layers)
        fprintf(f,
                "  full recompute of the first %d layer(s) of each stage fits; to train it:\n"
                "    training.recompute_num_layers=%d\n",
                r->recompute_layers, r->recompute_layers);
    if (r->balanced) {
        fprintf(f, "  stages split by predicted time (the ends also embed, or run the head and "
                   "loss); to train it:\n    parallel.pipeline_layers=[");
        for (int s = 0; s < r->stages; s++)
            fprintf(f, "%s%d", s ? "," : "", r->stage_layers[s]);
        fprintf(f, "]\n");
    }
    if (r->step_time_s <= 0.0) return;
    const tpd_plan_time *t = &r->time;
    double st = r->step_time_s;
    fprintf(f, "time per step: %.3f s\n", st);
    fprintf(f, "  compute (slowest stage) %9.3f s  %5.1f%%  (of which TP comm %.3f s)\n",
            t->compute, 100 * t->compute / st, t->tp_comm);
    fprintf(f, "  pipeline bubble         %9.3f s  %5.1f%%\n", t->pp_bubble,
            100 * t->pp_bubble / st);
    fprintf(f, "  pipeline p2p            %9.3f s  %5.1f%%\n", t->pp_p2p, 100 * t->pp_p2p / st);
    fprintf(f, "  DP comm (exposed)       %9.3f s  %5.1f%%\n", t->dp_comm_exposed,
            100 * t->dp_comm_exposed / st);
    fprintf(f, "  optimizer step          %9.3f s  %5.1f%%\n", t->optimizer,
            100 * t->optimizer / st);
    fprintf(f, "  per chunk: fwd %.3f ms, bwd %.3f ms, p2p %.3f ms\n", 1e3 * r->t_fwd_chunk,
            1e3 * r->t_bwd_chunk, 1e3 * r->t_p2p);
    fprintf(f,
            "throughput: %.1f TFLOP/s/GPU model, %.1f with recomputation, MFU %.1f%%, "
            "%.0f tokens/s\n",
            r->tflops_per_gpu, r->hw_tflops_per_gpu, 100 * r->mfu, r->tokens_per_s);
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

static cJSON *result_json(const tpd_plan_result *r) {
    const tpd_plan_layout *l = &r->layout;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "tp", l->tp);
    cJSON_AddNumberToObject(o, "pp", l->pp);
    cJSON_AddNumberToObject(o, "dp", l->dp);
    cJSON_AddNumberToObject(o, "micro_batch_size", l->micro_batch_size);
    cJSON_AddNumberToObject(o, "num_micro_batches", r->num_micro_batches);
    cJSON_AddNumberToObject(o, "virtual_stages", l->virtual_stages);
    cJSON_AddStringToObject(o, "recompute", tpd_config_choice("training.recompute", l->recompute));
    cJSON_AddBoolToObject(o, "sequence_parallel", l->sequence_parallel);
    cJSON_AddBoolToObject(o, "distributed_optimizer", l->distributed_optimizer);
    cJSON_AddBoolToObject(o, "fits", r->fits);
    if (r->reject_reason[0])
        cJSON_AddStringToObject(o, "reject_reason", r->reject_reason);
    else
        cJSON_AddNullToObject(o, "reject_reason");
    cJSON *pl = cJSON_AddArrayToObject(o, "pipeline_layers");
    for (int s = 0; pl && s < r->stages; s++)
        cJSON_AddItemToArray(pl, cJSON_CreateNumber(r->stage_layers[s]));
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
        cJSON_AddNumberToObject(e, "total", r->mem[s].total);
        cJSON_AddItemToArray(mb, e);
    }
    cJSON_AddNumberToObject(o, "step_time_s", r->step_time_s);
    cJSON *tb = cJSON_AddObjectToObject(o, "time_breakdown");
    if (tb) {
        cJSON_AddNumberToObject(tb, "compute", r->time.compute);
        cJSON_AddNumberToObject(tb, "tp_comm", r->time.tp_comm);
        cJSON_AddNumberToObject(tb, "pp_bubble", r->time.pp_bubble);
        cJSON_AddNumberToObject(tb, "pp_p2p", r->time.pp_p2p);
        cJSON_AddNumberToObject(tb, "dp_comm_exposed", r->time.dp_comm_exposed);
        cJSON_AddNumberToObject(tb, "optimizer", r->time.optimizer);
    }
    cJSON_AddNumberToObject(o, "tflops_per_gpu", r->tflops_per_gpu);
    cJSON_AddNumberToObject(o, "hw_tflops_per_gpu", r->hw_tflops_per_gpu);
    cJSON_AddNumberToObject(o, "mfu", r->mfu);
    cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
    return o;
}

char *tpd_plan_json(const tpd_plan_result *r, int n) {
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return NULL;
    for (int i = 0; i < n; i++) {
        cJSON *o = result_json(&r[i]);
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
