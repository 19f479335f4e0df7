/* The report of `tripod verify`: what was shrunk and how, the table of checks, and JSON. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/plan/plan.h"
#include "engine/verify/verify.h"

static const char *const k_verdict[] = {"PASS", "FAIL", "SKIP"};

static double gib(double b) {
    return b / (1024.0 * 1024.0 * 1024.0);
}

/* The widths and sizes that differ between the real config and the rehearsal's, as
 * key: real -> rehearsal. */
typedef struct width_row {
    const char *key;
    double real, small;
} width_row;

static int width_rows(const tpd_verify_report *r, width_row *rows) {
    const tpd_config_model *a = &r->real.model, *b = &r->small.model;
    int n = 0;
    rows[n++] = (width_row){"model.hidden_size", a->hidden_size, b->hidden_size};
    rows[n++] =
        (width_row){"head size", tpd_config_head_dim(&r->real), tpd_config_head_dim(&r->small)};
    rows[n++] = (width_row){"model.ffn_hidden_size", a->ffn_hidden_size, b->ffn_hidden_size};
    rows[n++] = (width_row){"model.vocab_size", a->vocab_size, b->vocab_size};
    rows[n++] = (width_row){"padded vocab", tpd_config_padded_vocab(&r->real, r->tp),
                            tpd_config_padded_vocab(&r->small, r->tp)};
    rows[n++] = (width_row){"model.seq_length", a->seq_length, b->seq_length};
    rows[n++] = (width_row){"training.global_batch_size", r->real.training.global_batch_size,
                            r->small.training.global_batch_size};
    rows[n++] = (width_row){"parallel.ddp_bucket_size", (double)r->real.parallel.ddp_bucket_size,
                            (double)r->small.parallel.ddp_bucket_size};
    rows[n++] =
        (width_row){"optimizer.adam_eps", r->real.optimizer.adam_eps, r->small.optimizer.adam_eps};
    rows[n++] = (width_row){"parameters", tpd_plan_params_count(&r->real),
                            tpd_plan_params_count(&r->small)};
    return n;
}

void tpd_verify_print(FILE *f, const tpd_verify_report *r) {
    char lay[256];
    tpd_plan_layout pl;
    tpd_plan_layout_from_config(&r->small, r->ranks, &pl);
    tpd_plan_layout_str(&pl, lay, sizeof lay);
    fprintf(f, "verify: %s\n", r->real.source_path[0] ? r->real.source_path : "(defaults)");
    fprintf(f, "  layout:    %s on %d ranks", lay, r->ranks);
    if (r->real_dp > 0 && r->real_dp != r->dp)
        fprintf(f, " (DP %d of the config shrunk to %d)", r->real_dp, r->dp);
    else if (r->real_dp == 0)
        fprintf(f, " (the config derives DP from the GPU count: DP %d here)", r->dp);
    fprintf(
        f, "\n  kept:      %d layers, %d heads (%d K/V), %s, %s, %s, %s, %s output layer\n",
        r->small.model.num_layers, r->small.model.num_attention_heads,
        tpd_config_kv_heads(&r->small),
        tpd_config_choice("model.normalization", r->small.model.normalization),
        tpd_config_choice("model.position_embedding_type", r->small.model.position_embedding_type),
        r->small.model.swiglu ? "SwiGLU" : "GeLU",
        r->small.model.add_bias_linear ? "biases" : "no biases",
        r->small.model.untie_embeddings_and_output_weights ? "untied" : "tied");
    fprintf(f, "  stages:   ");
    for (int s = 0; s < r->pp; s++)
        fprintf(f, " %d", tpd_plan_stage_layers(&r->small, &pl, s));
    const char *how = r->device != TPD_DEVICE_CUDA ? "fp32 on cpu"
                      : r->device_stand_in
                          ? "the cpu in fp32 standing in for cuda (" TPD_VERIFY_DEVICE_ENV
                            "=cpu), against fp32 on cpu"
                          : "bf16 on cuda against fp32 on cpu";
    fprintf(f, " layers (as train splits them)\n  shrunk:    %s, %d steps;", how, r->steps);
    width_row rows[16];
    int n = width_rows(r, rows);
    for (int i = 0; i < n; i++)
        if (rows[i].real != rows[i].small)
            fprintf(f, "%s %s %.15g -> %.15g", i ? "," : "", rows[i].key, rows[i].real,
                    rows[i].small);
    fprintf(f, "\n");
    char cp_s[24] = "";
    if (r->cp > 1) snprintf(cp_s, sizeof cp_s, " CP %d", r->cp);
    char small_mem[96] = ""; /* measured by the memory check, which --device cuda leaves out */
    if (r->device != TPD_DEVICE_CUDA)
        snprintf(small_mem, sizeof small_mem, "; the rehearsal's largest rank %.2f MiB",
                 r->small_mem_max / 1048576.0);
    if (r->real_mem_max > 0)
        fprintf(f,
                "  memory:    the real model at TP %d PP %d DP %d%s needs %.2f GiB on its largest "
                "rank (stage %d) by the planner (%s, %.1f GiB usable)%s%s\n",
                r->tp, r->pp, r->real_dp > 0 ? r->real_dp : r->dp, cp_s, gib(r->real_mem_max),
                r->real_mem_stage, r->real_cluster, gib(r->real_hbm_bytes),
                r->real_mem_max > r->real_hbm_bytes ? ": it does NOT fit" : "", small_mem);
    if (r->device == TPD_DEVICE_CUDA) {
        const tpd_verify_budget *b = &r->budget;
        const tpd_verify_budget_in *in = &b->in;
        fprintf(f,
                "  budget:    bf16 u = 2^-8, %d layers x %d rounding points + %d, deepest GEMM %d, "
                "weight gradients over %.0f tokens%s: e_fwd = u sqrt(%d) + %d x 2^-24 = %.2e, "
                "e_bwd = u sqrt(%d) + %.0f x 2^-24 = %.2e; loss <= e_fwd s / sqrt(%.0f), grad "
                "norm <= e_bwd s at step s, params <= 2 sqrt(%.3f e_bwd %d) = %.3f\n",
                in->layers, in->rounds_per_layer, TPD_VERIFY_BUDGET_ROUNDS_OUTSIDE, in->depth_fwd,
                in->depth_wgrad, in->grad_rounds ? " (bf16 main gradients)" : "",
                in->rounds_per_layer * in->layers + TPD_VERIFY_BUDGET_ROUNDS_OUTSIDE, in->depth_fwd,
                b->eps_fwd,
                2 * (in->rounds_per_layer * in->layers + TPD_VERIFY_BUDGET_ROUNDS_OUTSIDE) +
                    in->grad_rounds,
                in->depth_wgrad, b->eps_bwd, in->tokens, TPD_VERIFY_BUDGET_KAPPA, in->steps,
                b->params);
    }
    fprintf(f, "\n  %-28s %-6s %-10s %-10s %s\n", "check", "result", "worst", "tolerance",
            "detail");
    for (int i = 0; i < r->n_checks; i++) {
        const tpd_verify_check *c = &r->checks[i];
        char worst[32], tol[32];
        if (c->verdict == TPD_VERIFY_SKIP)
            snprintf(worst, sizeof worst, "-");
        else if (!strcmp(c->name, "memory"))
            snprintf(worst, sizeof worst, "%.0f B", c->worst);
        else if (!strcmp(c->name, "structure"))
            snprintf(worst, sizeof worst, "%.0f ranks", c->worst);
        else
            snprintf(worst, sizeof worst, "%.2e", c->worst);
        if (c->tolerance > 0 && r->device == TPD_DEVICE_CUDA)
            snprintf(tol, sizeof tol, "%.2e", c->tolerance); /* a budget, not a round figure */
        else if (c->tolerance > 0)
            snprintf(tol, sizeof tol, "%.0e", c->tolerance);
        else
            snprintf(tol, sizeof tol, "exact");
        fprintf(f, "  %-28s %-6s %-10s %-10s %s\n", c->name, k_verdict[c->verdict], worst, tol,
                c->detail);
    }
    int pass = 0, skipped = 0;
    for (int i = 0; i < r->n_checks; i++) {
        pass += r->checks[i].verdict == TPD_VERIFY_PASS;
        skipped += r->checks[i].verdict == TPD_VERIFY_SKIP;
    }
    fprintf(f, "\nverify: %s (%d of %d checks passed", r->passed ? "PASS" : "FAIL", pass,
            r->n_checks);
    if (skipped) fprintf(f, ", %d not run", skipped);
    fprintf(f, ") in %.1f s\n", r->wall_s);
}

char *tpd_verify_json(const tpd_verify_report *r) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "config", r->real.source_path);
    cJSON_AddBoolToObject(o, "passed", r->passed);
    cJSON *lay = cJSON_AddObjectToObject(o, "layout");
    cJSON_AddNumberToObject(lay, "tp", r->tp);
    cJSON_AddNumberToObject(lay, "pp", r->pp);
    cJSON_AddNumberToObject(lay, "dp", r->dp);
    cJSON_AddNumberToObject(lay, "cp", r->cp > 0 ? r->cp : 1);
    cJSON_AddNumberToObject(lay, "config_dp", r->real_dp);
    cJSON_AddNumberToObject(lay, "virtual_stages", r->v);
    cJSON_AddNumberToObject(lay, "ranks", r->ranks);
    cJSON_AddStringToObject(lay, "other_layout", r->other_layout);
    cJSON_AddNumberToObject(o, "steps", r->steps);
    cJSON_AddStringToObject(o, "device", r->device == TPD_DEVICE_CUDA ? "cuda" : "cpu");
    if (r->device == TPD_DEVICE_CUDA) {
        const tpd_verify_budget *b = &r->budget;
        cJSON_AddBoolToObject(o, "device_stand_in", r->device_stand_in);
        cJSON *bj = cJSON_AddObjectToObject(o, "budget");
        cJSON_AddNumberToObject(bj, "u", TPD_VERIFY_BF16_U);
        cJSON_AddNumberToObject(bj, "layers", b->in.layers);
        cJSON_AddNumberToObject(bj, "rounds_per_layer", b->in.rounds_per_layer);
        cJSON_AddNumberToObject(bj, "rounds_outside", TPD_VERIFY_BUDGET_ROUNDS_OUTSIDE);
        cJSON_AddNumberToObject(bj, "depth_fwd", b->in.depth_fwd);
        cJSON_AddNumberToObject(bj, "depth_wgrad", b->in.depth_wgrad);
        cJSON_AddNumberToObject(bj, "tokens", b->in.tokens);
        cJSON_AddNumberToObject(bj, "grad_rounds", b->in.grad_rounds);
        cJSON_AddNumberToObject(bj, "eps_fwd", b->eps_fwd);
        cJSON_AddNumberToObject(bj, "eps_bwd", b->eps_bwd);
        cJSON_AddNumberToObject(bj, "params", b->params);
        cJSON *lj = cJSON_AddArrayToObject(bj, "loss"),
              *nj = cJSON_AddArrayToObject(bj, "grad_norm");
        for (int s = 1; s <= r->steps; s++) {
            cJSON_AddItemToArray(lj, cJSON_CreateNumber(tpd_verify_budget_loss(b, s)));
            cJSON_AddItemToArray(nj, cJSON_CreateNumber(tpd_verify_budget_norm(b, s)));
        }
    }
    cJSON *sh = cJSON_AddObjectToObject(o, "shrunk");
    width_row rows[16];
    int n = width_rows(r, rows);
    for (int i = 0; i < n; i++) {
        cJSON *w = cJSON_AddObjectToObject(sh, rows[i].key);
        cJSON_AddNumberToObject(w, "real", rows[i].real);
        cJSON_AddNumberToObject(w, "verify", rows[i].small);
    }
    cJSON *mem = cJSON_AddObjectToObject(o, "memory");
    cJSON_AddNumberToObject(mem, "verify_max_rank_bytes", r->small_mem_max);
    cJSON_AddNumberToObject(mem, "real_max_rank_bytes", r->real_mem_max);
    cJSON_AddNumberToObject(mem, "real_max_stage", r->real_mem_stage);
    cJSON_AddStringToObject(mem, "real_cluster", r->real_cluster);
    cJSON_AddNumberToObject(mem, "real_usable_bytes", r->real_hbm_bytes);
    cJSON *checks = cJSON_AddArrayToObject(o, "checks");
    for (int i = 0; i < r->n_checks; i++) {
        const tpd_verify_check *c = &r->checks[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", c->name);
        cJSON_AddStringToObject(x, "result", k_verdict[c->verdict]);
        cJSON_AddNumberToObject(x, "worst", isfinite(c->worst) ? c->worst : 1e308);
        cJSON_AddNumberToObject(x, "tolerance", c->tolerance);
        cJSON_AddStringToObject(x, "detail", c->detail);
        cJSON_AddItemToArray(checks, x);
    }
    cJSON_AddNumberToObject(o, "wall_s", r->wall_s);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}
