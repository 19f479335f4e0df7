/* The run loop of a trainer: logging, evaluation, metrics, the trace of real steps, and
 * the iteration boundary where ranks agree on signals and save checkpoints. */
#include "engine/train/train.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "base/file.h"
#include "engine/trace/trace_run.h"
#include "engine/train/metrics.h"
#include "engine/train/signals.h"
#include "engine/train/train_internal.h"
#include "kernels/cpu/cpu.h"

static tpd_status open_metrics(tpd_trainer *tr) {
    const char *path = tr->cfg.logging.metrics_file;
    if (!tr->is_logger || !path[0]) return TPD_OK;
    int e = 0;
    if (tpd_file_mkdirs_parent(path, &e) != TPD_OK) {
        tpd_log_error("logging.metrics_file: cannot create the directory of '%s': %s", path,
                      strerror(e));
        return TPD_ERR_IO;
    }
    tr->metrics = fopen(path, tr->counters.iteration > 0 ? "a" : "w");
    if (!tr->metrics) {
        tpd_log_error("logging.metrics_file: cannot open '%s' for writing", path);
        return TPD_ERR_IO;
    }
    return TPD_OK;
}

static void log_startup(const tpd_trainer *tr) {
    const tpd_model *m = tr->model;
    const tpd_mem_breakdown *mem = &m->plan.mem;
    const double MiB = 1024.0 * 1024.0;
    char threads[96] = "";
    if (!tpd_kern_device_memory(tr->kb)) {
        int n = tpd_trainer_cpu_threads(&tr->cfg, tr->local_size);
        snprintf(threads, sizeof threads, ", OpenBLAS %s", tpd_kern_cpu_blas_corename());
        if (n > 0)
            snprintf(threads + strlen(threads), sizeof threads - strlen(threads),
                     ", %d thread%s per rank", n, n > 1 ? "s" : "");
    }
    tpd_log_info("layout: world %d = TP %d x PP %d x DP %d%s | micro-batches per step %d | "
                 "backend %s (%s%s)",
                 tr->mesh.world_size, tr->mesh.tp_size, tr->mesh.pp_size, tr->mesh.dp_size,
                 tr->cfg.parallel.sequence_parallel && tr->mesh.tp_size > 1 ? " (SP)" : "", tr->M,
                 tpd_kern_name(tr->kb),
                 tpd_config_choice("training.precision", tr->cfg.training.precision), threads);
    tpd_log_info("this rank (last stage): %zu parameters | memory %.2f MiB = params %.2f + "
                 "grads %.2f + optimizer %.2f + master %.2f + activations %.2f (%d in flight) "
                 "+ workspace %.2f",
                 m->plan.lay.numel, mem->total / MiB, mem->params / MiB, mem->grads / MiB,
                 mem->optimizer / MiB, mem->master / MiB, mem->activations / MiB, m->plan.nslots,
                 mem->workspace / MiB);
    if (tr->data.n > 1) {
        char blend[512] = "";
        size_t at = 0;
        for (int d = 0; d < tr->data.n && at < sizeof blend; d++)
            at += (size_t)snprintf(blend + at, sizeof blend - at, "%s%.3f %s", d ? ", " : "",
                                   tr->data.weight[d], tr->data.prefix[d]);
        tpd_log_info("data: a blend of %d data sets: %s", tr->data.n, blend);
    }
    if (tr->dpp.zero) {
        uint64_t full = (uint64_t)m->plan.numel_padded * 4 * (2 + m->plan.has_master);
        uint64_t now = mem->optimizer + mem->master;
        tpd_log_info("distributed optimizer (ZeRO-1) over DP %d: optimizer state %.2f MiB "
                     "instead of %.2f MiB, saving %.2f MiB per rank",
                     tr->mesh.dp_size, now / MiB, full / MiB, (full - now) / MiB);
    }
}

tpd_status tpd_trainer_save(tpd_trainer *tr, const char *save_dir) {
    TPD_CHECK(tpd_trainer_sync_params(tr));
    return tpd_ckpt_save(tr->saver, &tr->counters, save_dir);
}

/* The run loop's iteration boundary (collective): agrees over the world on a pending
 * signal or a training.exit_* condition (*stop_p), and saves to checkpoint.save every
 * save_interval iterations, on a stop, and with final = 1 at the end of the run (never
 * twice for one iteration). */
static tpd_status on_boundary(tpd_trainer *tr, int final, int *stop_p) {
    const tpd_config_checkpoint *c = &tr->cfg.checkpoint;
    int it = tr->counters.iteration, save = 0;
    *stop_p = 0;
    int32_t flag = 0; /* 1: a signal, 2: exit_interval, 4: exit_duration_in_mins */
    /* an asynchronous save commits at the first boundary where every rank has written */
    TPD_CHECK(tpd_ckpt_saver_finish(tr->saver, 0));
    if (!final) {
        const tpd_config_training *t = &tr->cfg.training;
        int ran = it > tr->run_start_iteration; /* at least one step of this run */
        flag = tpd_signal_pending() ? 1 : 0;
        if (ran && t->exit_interval > 0 && it % t->exit_interval == 0) flag |= 2;
        if (ran && t->exit_duration_in_mins > 0 &&
            tpd_clock_s() - tr->run_start_s >= 60.0 * t->exit_duration_in_mins)
            flag |= 4;
        /* all ranks agree on what reached any of them (their clocks differ) */
        tpd_comm *w = tr->hcomms.world;
        if (tpd_comm_size(w) > 1)
            TPD_CHECK(tpd_comm_allreduce(w, &flag, &flag, 1, TPD_DTYPE_I32, TPD_COMM_OP_MAX, NULL));
        *stop_p = flag != 0;
        save = *stop_p || (c->save_interval > 0 && it > 0 && it % c->save_interval == 0);
    } else {
        save = 1;
    }
    int saved = it == tr->saved_iteration || it == tpd_ckpt_saver_committed(tr->saver);
    if (save && c->save[0] && !saved) TPD_CHECK(tpd_trainer_save(tr, c->save));
    /* the last save of a run, or one before stopping, is complete when the run ends */
    if (final || *stop_p) TPD_CHECK(tpd_ckpt_saver_finish(tr->saver, 1));
    if (*stop_p && tr->is_logger)
        tpd_log_info("stopping at iteration %d %s%s", it,
                     flag & 1   ? "on a signal"
                     : flag & 2 ? "at training.exit_interval"
                                : "after training.exit_duration_in_mins",
                     c->save[0] ? " after saving" : " (no checkpoint.save: nothing saved)");
    return TPD_OK;
}

tpd_status tpd_trainer_run(tpd_trainer *tr) {
    const tpd_config *cfg = &tr->cfg;
    TPD_CHECK(open_metrics(tr));
    log_startup(tr);
    double flops = tpd_trainer_flops_per_iteration(tr);
    double tokens = (double)cfg->training.global_batch_size * cfg->model.seq_length;
    tpd_signals_install();
    tr->run_start_iteration = tr->counters.iteration;
    tr->run_start_s = tpd_clock_s();
    /* logging.trace_file: a Chrome trace of the real steps, one lane per rank (host
     * communicators: the recorder gathers them) */
    tpd_trace_run *rec = NULL;
    if (cfg->logging.trace_file[0]) {
        TPD_CHECK(
            tpd_trace_run_create(tr->hcomms.world, tr->mesh.pp, tr->mesh.tp, tr->mesh.dp, 0, &rec));
        tpd_trainer_set_observer(tr, tpd_trace_run_on_action, rec);
    }
    tpd_status st = TPD_OK;
    int stop = 0;
    while (tr->counters.iteration < cfg->training.train_iters) {
        TPD_CHECK_GOTO(on_boundary(tr, 0, &stop), st, out);
        if (stop) {
            tr->interrupted = 1;
            goto out;
        }
        tpd_step_stats s;
        TPD_CHECK_GOTO(tpd_trainer_step(tr, &s), st, out);
        if (rec) tpd_trace_run_step_end(rec, s.t_reduce_s, s.t_optim_s);
        double val = NAN;
        int it = tr->counters.iteration;
        if (cfg->logging.eval_interval > 0 &&
            (it % cfg->logging.eval_interval == 0 || it == cfg->training.train_iters))
            TPD_CHECK_GOTO(tpd_trainer_evaluate(tr, &val), st, out);
        int log_now = it % cfg->logging.log_interval == 0 || it == 1 ||
                      it == cfg->training.train_iters || !isnan(val);
        tpd_step_timers timers;
        if (log_now && cfg->logging.log_timers)
            TPD_CHECK_GOTO(tpd_trainer_job_timers(tr, &s, &timers), st, out);
        if (!tr->is_logger || !log_now) continue;
        tpd_iter_record r = {
            .iteration = it,
            .train_iters = cfg->training.train_iters,
            .consumed_samples = tr->counters.consumed_samples,
            .elapsed_ms = 1e3 * s.elapsed_s,
            .tflops_per_gpu = flops / s.elapsed_s / tr->mesh.world_size / 1e12,
            .tokens_per_s = tokens / s.elapsed_s,
            .mfu = -1,
            .lr = s.lr,
            .global_batch_size = cfg->training.global_batch_size,
            .lm_loss = s.lm_loss,
            .grad_norm = s.grad_norm,
            .has_params_norm = !isnan(s.params_norm),
            .params_norm = s.params_norm,
            .skipped_iterations = tr->counters.skipped_iterations,
            .val_loss = val,
        };
        char line[1024];
        tpd_metrics_format_line(&r, line, sizeof line);
        printf("%s\n", line);
        if (cfg->logging.log_timers) {
            tpd_metrics_format_timers(&timers, line, sizeof line);
            printf("%s\n", line);
        }
        fflush(stdout);
        if (tr->metrics) TPD_CHECK_GOTO(tpd_metrics_write_jsonl(tr->metrics, &r), st, out);
    }
    TPD_CHECK_GOTO(on_boundary(tr, 1, &stop), st, out);
out:
    if (rec) {
        /* the trace is written also after an error or a signal: it shows where it stopped */
        if (st == TPD_OK || st == TPD_ERR_INTERRUPTED)
            TPD_CHECK_KEEP(tpd_trace_run_write(rec, cfg->logging.trace_file), st);
        tpd_trainer_set_observer(tr, NULL, NULL);
        tpd_trace_run_destroy(rec);
    }
    return st;
}
