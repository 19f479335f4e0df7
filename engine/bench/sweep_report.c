/* The sweep's outputs: summary.csv (columns in the spirit of NeMo's AutoConfigurator),
 * failed.csv, summary.json, the best-layout line and the plot (tools/plot_sweep.sh). */
#include "engine/bench/sweep.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/spawn.h"
#include "engine/plan/plan.h"

/* The CSV's columns, in order; tools/plot_sweep.sh and the tests read them by name. */
static const char *const k_columns =
    "model,tp,pp,dp,mbs,gbs,zero,sp,recompute,world,micro_batches,time_per_step_s,time_min_s,time_"
    "max_s,"
    "time_q1_s,time_q3_s,samples_per_s,tokens_per_s,tflops_per_rank,mfu,predicted_time_s,"
    "error_pct,peak_memory_bytes,predicted_memory_bytes,compute_s,tp_comm_s,pp_wait_s,"
    "dp_comm_s,optimizer_s,pred_compute_s,pred_tp_comm_s,pred_pp_wait_s,pred_dp_comm_s,"
    "pred_optimizer_s,final_loss,vp,schedule,overlap,idle_fraction,pred_idle_fraction,"
    "dp_exposed_s,pred_dp_exposed_s,param_wait_s,pred_param_wait_s";

void tpd_sweep_best_line(const tpd_sweep_result *r, char *buf, size_t len) {
    if (r->best < 0) {
        snprintf(buf, len, "Best layout: none (no trial succeeded)");
        return;
    }
    const tpd_sweep_trial *t = &r->trials[r->best];
    char lay[128];
    tpd_sweep_layout_str(t, lay, sizeof lay);
    snprintf(buf, len,
             "Best layout: %s: %.2f ms/step, %.1f samples/s, %.0f tokens/s, %.4f TFLOP/s per "
             "rank (predicted %.2f ms, %+.1f%%)",
             lay, 1e3 * t->t_median, t->samples_per_s, t->tokens_per_s, t->tflops_per_rank,
             1e3 * t->pred_time, t->err_pct);
}

/* Empty cell for unknown values, so spreadsheets and gnuplot see a missing value. */
static void put_num(FILE *f, double v, int known) {
    if (known && isfinite(v))
        fprintf(f, ",%.6g", v);
    else
        fputs(",", f);
}

static FILE *open_out(const char *dir, const char *name, char *path, size_t len) {
    snprintf(path, len, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) tpd_log_error("sweep: cannot create '%s': %s", path, strerror(errno));
    return f;
}

static tpd_status close_out(FILE *f, const char *path) {
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        tpd_log_error("sweep: writing '%s' failed", path);
        return TPD_ERR_IO;
    }
    return TPD_OK;
}

static tpd_status write_csv(const tpd_sweep_result *r, const char *dir) {
    char path[TPD_CONFIG_STR + 64];
    FILE *f = open_out(dir, "summary.csv", path, sizeof path);
    if (!f) return TPD_ERR_IO;
    fprintf(f, "%s\n", k_columns);
    for (int i = 0; i < r->n; i++) {
        const tpd_sweep_trial *t = &r->trials[i];
        if (t->state != TPD_SWEEP_OK) continue;
        int p = t->have_pred;
        fprintf(f, "%s,%d,%d,%d,%d,%d,%d,%d,%s,%d,%d", r->model, t->tp, t->pp, t->dp, t->mbs,
                t->gbs, t->zero, t->sp, tpd_config_choice("training.recompute", t->recompute),
                t->world, t->micro_batches);
        put_num(f, t->t_median, 1);
        put_num(f, t->t_min, 1);
        put_num(f, t->t_max, 1);
        put_num(f, t->t_q1, 1);
        put_num(f, t->t_q3, 1);
        put_num(f, t->samples_per_s, 1);
        put_num(f, t->tokens_per_s, 1);
        put_num(f, t->tflops_per_rank, 1);
        put_num(f, t->mfu, t->mfu >= 0);
        put_num(f, t->pred_time, p);
        put_num(f, t->err_pct, p);
        fprintf(f, ",%.0f", t->peak_mem);
        put_num(f, t->pred_mem, p);
        const tpd_sweep_split *m = &t->meas, *q = &t->pred;
        double mv[5] = {m->compute, m->tp_comm, m->pp_wait, m->dp_comm, m->optimizer};
        double qv[5] = {q->compute, q->tp_comm, q->pp_wait, q->dp_comm, q->optimizer};
        for (int c = 0; c < 5; c++)
            put_num(f, mv[c], 1);
        for (int c = 0; c < 5; c++)
            put_num(f, qv[c], p);
        put_num(f, t->n_loss ? t->loss[t->n_loss - 1] : NAN, t->n_loss > 0);
        fprintf(f, ",%d,%s,%d", t->vp, tpd_config_choice("parallel.pipeline_schedule", t->schedule),
                t->overlap);
        const tpd_sweep_overlap *mo = &t->meas_ovl, *po = &t->pred_ovl;
        put_num(f, mo->idle_fraction, 1);
        put_num(f, po->idle_fraction, p);
        put_num(f, mo->dp_exposed, 1);
        put_num(f, po->dp_exposed, p);
        put_num(f, mo->param_wait, 1);
        put_num(f, po->param_wait, p);
        fputc('\n', f);
    }
    return close_out(f, path);
}

/* Layout and reason; the reason is quoted (it may hold commas). */
static tpd_status write_failed(const tpd_sweep_result *r, const char *dir) {
    char path[TPD_CONFIG_STR + 64];
    FILE *f = open_out(dir, "failed.csv", path, sizeof path);
    if (!f) return TPD_ERR_IO;
    fputs("tp,pp,dp,mbs,zero,sp,recompute,state,vp,schedule,overlap,reason\n", f);
    for (int i = 0; i < r->n; i++) {
        const tpd_sweep_trial *t = &r->trials[i];
        if (t->state == TPD_SWEEP_OK) continue;
        fprintf(f, "%d,%d,%d,%d,%d,%d,%s,%s,%d,%s,%d,\"", t->tp, t->pp, t->dp, t->mbs, t->zero,
                t->sp, tpd_config_choice("training.recompute", t->recompute),
                t->state == TPD_SWEEP_SKIPPED ? "skipped" : "failed", t->vp,
                tpd_config_choice("parallel.pipeline_schedule", t->schedule), t->overlap);
        for (const char *c = t->reason; *c; c++) {
            if (*c == '"') fputc('"', f);
            fputc(*c, f);
        }
        fputs("\"\n", f);
    }
    return close_out(f, path);
}

static cJSON *overlap_json(const tpd_sweep_overlap *o) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "idle_fraction", o->idle_fraction);
    cJSON_AddNumberToObject(j, "dp_exposed_s", o->dp_exposed);
    cJSON_AddNumberToObject(j, "param_wait_s", o->param_wait);
    return j;
}

static cJSON *split_json(const tpd_sweep_split *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "compute_s", s->compute);
    cJSON_AddNumberToObject(o, "tp_comm_s", s->tp_comm);
    cJSON_AddNumberToObject(o, "pp_wait_s", s->pp_wait);
    cJSON_AddNumberToObject(o, "dp_comm_s", s->dp_comm);
    cJSON_AddNumberToObject(o, "optimizer_s", s->optimizer);
    return o;
}

static double err_of(double pred, double meas) {
    return meas > 0 ? 100.0 * (pred - meas) / meas : 0.0;
}

static cJSON *trial_json(const tpd_sweep_trial *t) {
    static const char *const states[] = {"ok", "skipped", "failed"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tp", t->tp);
    cJSON_AddNumberToObject(o, "pp", t->pp);
    cJSON_AddNumberToObject(o, "dp", t->dp);
    cJSON_AddNumberToObject(o, "mbs", t->mbs);
    cJSON_AddNumberToObject(o, "gbs", t->gbs);
    cJSON_AddNumberToObject(o, "zero", t->zero);
    cJSON_AddBoolToObject(o, "sequence_parallel", t->sp);
    cJSON_AddStringToObject(o, "recompute", tpd_config_choice("training.recompute", t->recompute));
    cJSON_AddNumberToObject(o, "world", t->world);
    cJSON_AddNumberToObject(o, "virtual_stages", t->vp);
    cJSON_AddStringToObject(o, "pipeline_schedule",
                            tpd_config_choice("parallel.pipeline_schedule", t->schedule));
    cJSON_AddBoolToObject(o, "overlap", t->overlap);
    cJSON_AddStringToObject(o, "state", states[t->state]);
    if (t->state != TPD_SWEEP_OK) {
        cJSON_AddStringToObject(o, "reason", t->reason);
        return o;
    }
    cJSON_AddNumberToObject(o, "micro_batches", t->micro_batches);
    cJSON_AddNumberToObject(o, "steps", t->steps);
    cJSON *st = cJSON_AddObjectToObject(o, "step_time_s");
    cJSON_AddNumberToObject(st, "median", t->t_median);
    cJSON_AddNumberToObject(st, "min", t->t_min);
    cJSON_AddNumberToObject(st, "max", t->t_max);
    cJSON_AddNumberToObject(st, "q1", t->t_q1);
    cJSON_AddNumberToObject(st, "q3", t->t_q3);
    cJSON_AddNumberToObject(o, "samples_per_s", t->samples_per_s);
    cJSON_AddNumberToObject(o, "tokens_per_s", t->tokens_per_s);
    cJSON_AddNumberToObject(o, "tflops_per_rank", t->tflops_per_rank);
    if (t->mfu >= 0)
        cJSON_AddNumberToObject(o, "mfu", t->mfu);
    else
        cJSON_AddNullToObject(o, "mfu");
    cJSON_AddNumberToObject(o, "peak_memory_bytes", t->peak_mem);
    cJSON *meas = split_json(&t->meas);
    cJSON_AddItemToObject(meas, "overlap", overlap_json(&t->meas_ovl));
    cJSON_AddItemToObject(o, "measured", meas);
    if (t->have_pred) {
        cJSON *p = split_json(&t->pred);
        cJSON_AddItemToObject(p, "overlap", overlap_json(&t->pred_ovl));
        cJSON_AddNumberToObject(p, "step_time_s", t->pred_time);
        cJSON_AddNumberToObject(p, "memory_bytes", t->pred_mem);
        cJSON_AddItemToObject(o, "predicted", p);
        cJSON *e = cJSON_AddObjectToObject(o, "error_pct");
        cJSON_AddNumberToObject(e, "step_time", t->err_pct);
        cJSON_AddNumberToObject(e, "compute", err_of(t->pred.compute, t->meas.compute));
        cJSON_AddNumberToObject(e, "tp_comm", err_of(t->pred.tp_comm, t->meas.tp_comm));
        cJSON_AddNumberToObject(e, "pp_wait", err_of(t->pred.pp_wait, t->meas.pp_wait));
        cJSON_AddNumberToObject(e, "dp_comm", err_of(t->pred.dp_comm, t->meas.dp_comm));
        cJSON_AddNumberToObject(e, "optimizer", err_of(t->pred.optimizer, t->meas.optimizer));
        cJSON_AddNumberToObject(e, "memory", err_of(t->pred_mem, t->peak_mem));
    }
    cJSON_AddItemToObject(o, "loss", cJSON_CreateDoubleArray(t->loss, t->n_loss));
    return o;
}

static tpd_status write_json(const tpd_sweep_result *r, const tpd_sweep_options *opt) {
    char path[TPD_CONFIG_STR + 64];
    cJSON *root = cJSON_CreateObject();
    if (!root) return tpd_fail_nomem("summary.json", sizeof(cJSON));
    cJSON_AddStringToObject(root, "model", r->model);
    cJSON_AddStringToObject(root, "cluster", r->cluster);
    cJSON_AddNumberToObject(root, "world", r->n > 0 ? r->trials[0].world : 0);
    cJSON_AddNumberToObject(root, "steps", opt->steps);
    cJSON_AddNumberToObject(root, "warmup", opt->warmup);
    cJSON_AddNumberToObject(root, "wall_s", r->wall_s);
    char best[512];
    tpd_sweep_best_line(r, best, sizeof best);
    cJSON_AddStringToObject(root, "best", best);
    cJSON *arr = cJSON_AddArrayToObject(root, "trials");
    for (int i = 0; i < r->n; i++)
        cJSON_AddItemToArray(arr, trial_json(&r->trials[i]));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) {
        tpd_log_error("sweep: out of memory for summary.json");
        return TPD_ERR_NOMEM;
    }
    tpd_status st = TPD_OK;
    FILE *f = open_out(opt->out_dir, "summary.json", path, sizeof path);
    if (!f) {
        st = TPD_ERR_IO;
    } else {
        fputs(text, f);
        fputc('\n', f);
        st = close_out(f, path);
    }
    free(text);
    return st;
}

/* tools/plot_sweep.sh: under the current directory, else the source tree. */
static void plot_script(char *buf, size_t len) {
    snprintf(buf, len, "tools/plot_sweep.sh");
    if (access(buf, R_OK) == 0) return;
    snprintf(buf, len, "%s/tools/plot_sweep.sh", tpd_source_dir());
}

tpd_status tpd_sweep_write(const tpd_sweep_result *r, const tpd_sweep_options *opt) {
    TPD_CHECK(write_csv(r, opt->out_dir));
    TPD_CHECK(write_failed(r, opt->out_dir));
    TPD_CHECK(write_json(r, opt));
    if (!opt->plot) return TPD_OK;
    char script[TPD_CONFIG_STR + 64];
    plot_script(script, sizeof script);
    if (!tpd_file_on_path("gnuplot")) {
        printf("sweep: gnuplot is not on PATH; draw the plot later with: bash %s %s\n", script,
               opt->out_dir);
        return TPD_OK;
    }
    /* bash runs the script with the folder as its argument: no shell reads the folder's
     * name, so quotes or ';' in it stay part of the path. */
    const char *argv[] = {"bash", script, opt->out_dir, NULL};
    int code = 0;
    /* The data files are written; a missing plot is not worth failing the sweep. */
    if (tpd_spawn_run(argv, &code) != TPD_OK) return TPD_OK; /* logged, naming bash */
    if (code != 0) {
        tpd_log_warn("sweep: bash %s '%s' exited with %d; the data files are complete", script,
                     opt->out_dir, code);
        return TPD_OK;
    }
    char png[TPD_CONFIG_STR + 16];
    snprintf(png, sizeof png, "%s/sweep.png", opt->out_dir);
    if (access(png, R_OK) != 0) {
        tpd_log_warn("sweep: bash %s exited 0 but wrote no '%s'; the data files are complete",
                     script, png);
        return TPD_OK;
    }
    printf("sweep: plot written to %s/sweep.png\n", opt->out_dir);
    return TPD_OK;
}
