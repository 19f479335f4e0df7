#include "engine/train/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/progress.h"

void tpd_metrics_format_line(const tpd_iter_record *r, char *buf, size_t cap) {
    char el[32], eta[32];
    tpd_progress_hms(el, sizeof el, r->run_elapsed_s);
    tpd_progress_hms(eta, sizeof eta, r->eta_s);
    int n = snprintf(buf, cap,
                     " iteration %8d/%8d | elapsed: %s | ETA: %s | consumed samples: %12llu | "
                     "elapsed time per iteration (ms): %.1f | throughput per GPU (TFLOP/s/GPU): "
                     "%.4f | tokens/s: %.0f | ",
                     r->iteration, r->train_iters, el, eta, (unsigned long long)r->consumed_samples,
                     r->elapsed_ms, r->tflops_per_gpu, r->tokens_per_s);
    if (r->mfu >= 0 && n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "MFU: %.1f%% | ", 100.0 * r->mfu);
    if (n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n,
                      "learning rate: %.6E | global batch size: %5d | lm loss: %.6E | "
                      "grad norm: %.3f | ",
                      r->lr, r->global_batch_size, r->lm_loss, r->grad_norm);
    if (r->has_params_norm && n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "params norm: %.3f | ", r->params_norm);
    if (r->moe && n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n,
                      "load balancing loss: %.6E (balance %.3f) | z loss: %.6E | expert load "
                      "max/min of mean: %.2f/%.2f | dropped: %.2f%% | ",
                      r->moe_aux_loss, r->moe_aux_raw, r->moe_z_loss, r->moe_load_max,
                      r->moe_load_min, 100.0 * r->moe_dropped);
    if (n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "number of skipped iterations: %3d |",
                      r->skipped_iterations);
    /* DiLoCo: when the outer step ran and what it moved */
    if (r->diloco && r->outer_steps > 0 && n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n,
                      " outer steps: %d (last: fragment %d/%d after iteration %d) | outer "
                      "all-reduce: %.3f MiB per rank |",
                      r->outer_steps, r->outer_last_fragment + 1, r->fragments,
                      r->outer_last_iteration, r->outer_rank_bytes / (1024.0 * 1024.0));
    else if (r->diloco && n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, " outer steps: 0 |");
    if (!isnan(r->val_loss) && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, " validation lm loss: %.6E |", r->val_loss);
}

void tpd_metrics_format_timers(const tpd_step_timers *t, char *buf, size_t cap) {
    snprintf(buf, cap,
             " time (ms) | forward-backward compute: %.1f (TP comm %.1f) | pipeline wait: %.1f "
             "(idle %.1f%%) | grads reduce exposed: %.1f | params gather wait: %.1f | "
             "optimizer: %.1f |",
             t->compute_ms, t->tp_comm_ms, t->pp_wait_ms, 100.0 * t->idle_fraction, t->reduce_ms,
             t->param_wait_ms, t->optimizer_ms);
}

tpd_status tpd_metrics_write_jsonl(FILE *f, const char *path, const tpd_iter_record *r) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return tpd_fail_nomem("a metrics record", sizeof(cJSON));
    cJSON_AddNumberToObject(o, "iteration", r->iteration);
    cJSON_AddNumberToObject(o, "consumed_samples", (double)r->consumed_samples);
    cJSON_AddNumberToObject(o, "lm_loss", r->lm_loss);
    cJSON_AddNumberToObject(o, "lr", r->lr);
    cJSON_AddNumberToObject(o, "grad_norm", r->grad_norm);
    if (r->has_params_norm) cJSON_AddNumberToObject(o, "params_norm", r->params_norm);
    if (r->moe) {
        cJSON_AddNumberToObject(o, "moe_aux_loss", r->moe_aux_loss);
        cJSON_AddNumberToObject(o, "moe_balance", r->moe_aux_raw);
        cJSON_AddNumberToObject(o, "moe_z_loss", r->moe_z_loss);
        cJSON_AddNumberToObject(o, "moe_load_max", r->moe_load_max);
        cJSON_AddNumberToObject(o, "moe_load_min", r->moe_load_min);
        cJSON_AddNumberToObject(o, "moe_dropped", r->moe_dropped);
    }
    cJSON_AddNumberToObject(o, "elapsed_ms", r->elapsed_ms);
    cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
    cJSON_AddNumberToObject(o, "tflops_per_gpu", r->tflops_per_gpu);
    if (r->mfu >= 0) cJSON_AddNumberToObject(o, "mfu", r->mfu);
    cJSON_AddNumberToObject(o, "skipped_iterations", r->skipped_iterations);
    cJSON_AddNumberToObject(o, "dp_bytes", r->dp_bytes);
    if (r->diloco) {
        cJSON_AddNumberToObject(o, "dp_outer_bytes", r->dp_outer_bytes);
        cJSON_AddNumberToObject(o, "outer_steps", r->outer_steps);
    }
    if (!isnan(r->val_loss)) cJSON_AddNumberToObject(o, "val_loss", r->val_loss);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text)
        return tpd_fail(TPD_ERR_NOMEM, "out of memory for the metrics line of iteration %d",
                        r->iteration);
    errno = 0;
    int ok = fprintf(f, "%s\n", text) > 0 && fflush(f) == 0;
    int e = errno;
    free(text);
    if (!ok)
        return tpd_fail(TPD_ERR_IO, "logging.metrics_file: writing iteration %d to '%s' failed: %s",
                        r->iteration, path, e ? strerror(e) : "short write");
    return TPD_OK;
}
