/* The run loop of a trainer: logging, evaluation, metrics, the trace of real steps, and
 * the iteration boundary where ranks agree on signals and save checkpoints. */
#include "engine/train/train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "base/cpu.h"
#include "base/file.h"
#include "engine/optim/optimizer.h"
#include "engine/trace/trace_run.h"
#include "engine/train/metrics.h"
#include "engine/train/signals.h"
#include "engine/train/tensorboard.h"
#include "engine/train/train_internal.h"
#include "kernels/cpu/cpu.h"
#include "parallel/placement.h"

/* A run that starts at iteration 0 would truncate the file: when it holds records, they
 * are another run's (a resumed run appends to its own), kept unless logging.overwrite.
 * Every rank checks the same path, so all of them stop together. */
static tpd_status check_metrics_file(const tpd_trainer *tr) {
    const char *path = tr->cfg.logging.metrics_file;
    if (!path[0] || tr->counters.iteration > 0 || tr->cfg.logging.overwrite) return TPD_OK;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0) return TPD_OK;
    return tpd_fail(TPD_ERR_INVALID,
                    "logging.metrics_file: '%s' already holds %lld bytes of another run's "
                    "metrics and this run starts at iteration 0; resume that run "
                    "(checkpoint.load) to append to it, set logging.overwrite=true to replace "
                    "it, or choose another logging.metrics_file",
                    path, (long long)sb.st_size);
}

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
        tpd_log_error("logging.metrics_file: cannot open '%s' for writing: %s", path,
                      strerror(errno));
        return TPD_ERR_IO;
    }
    return TPD_OK;
}

static tpd_status open_tensorboard(tpd_trainer *tr) {
    const char *dir = tr->cfg.logging.tensorboard_dir;
    if (!tr->is_logger || !dir[0] || tr->tb) return TPD_OK;
    TPD_CHECK(tpd_tb_open(dir, &tr->tb));
    tpd_log_info("TensorBoard: %s (tensorboard --logdir %s)", tpd_tb_path(tr->tb), dir);
    return TPD_OK;
}

static void log_startup(const tpd_trainer *tr) {
    const tpd_model *m = tr->model;
    const tpd_mem_breakdown *mem = &m->plan.mem;
    const double MiB = 1024.0 * 1024.0;
    char threads[96] = "";
    if (!tpd_kern_device_memory(tr->kb)) {
        int ranks = tr->local_size;
        int n = tpd_trainer_cpu_threads(&tr->cfg, ranks), want = tr->cfg.training.num_threads;
        int share = tpd_cpu_threads_per_rank(ranks);
        if (want > n)
            tpd_log_warn("training.num_threads %d: this rank may run on %d cores; using %d "
                         "threads (more would only wait for a core)",
                         want, n, n);
        else if (want > share)
            tpd_log_warn("training.num_threads %d is more than this rank's share of the node's "
                         "cores (%d cores, %d ranks): the ranks' threads will compete for cores",
                         want, tpd_cpu_online_cores(), ranks);
        snprintf(threads, sizeof threads, ", OpenBLAS %s", tpd_kern_cpu_blas_corename());
        if (tpd_kern_act_dtype(tr->kb) == TPD_DTYPE_BF16) /* the bf16 matmuls' library */
            snprintf(threads + strlen(threads), sizeof threads - strlen(threads), ", %s",
                     tpd_kern_cpu_gemm_library());
        if (n > 0)
            snprintf(threads + strlen(threads), sizeof threads - strlen(threads),
                     ", %d thread%s per rank", n, n > 1 ? "s" : "");
    }
    char cp[192] = "";
    if (tr->mesh.cp_size > 1)
        snprintf(cp, sizeof cp, " x CP %d (%s, %d tokens per rank)", tr->mesh.cp_size,
                 tr->cfg.parallel.cp_comm_type == TPD_CP_COMM_A2A ? "a2a" : "p2p ring", m->d.T);
    if (tr->mesh.ep_size > 1) /* EP splits DP: E / EP experts a rank, expert DP the rest */
        snprintf(cp + strlen(cp), sizeof cp - strlen(cp),
                 " (EP %d: %d of %d experts a rank, "
                 "expert DP %d)",
                 tr->mesh.ep_size, m->d.El, m->d.E, tr->mesh.dp_size / tr->mesh.ep_size);
    tpd_log_info("layout: world %d = TP %d x PP %d x DP %d%s%s | micro-batches per step %d | "
                 "backend %s (%s%s)",
                 tr->mesh.world_size, tr->mesh.tp_size, tr->mesh.pp_size, tr->mesh.data_dp_size, cp,
                 tr->cfg.parallel.sequence_parallel && tr->mesh.tp_size > 1 ? " (SP)" : "", tr->M,
                 tpd_kern_name(tr->kb),
                 tpd_config_choice("training.precision", tr->cfg.training.precision), threads);
    tpd_log_info("this rank (last stage): %zu parameters | memory %.2f MiB = params %.2f + "
                 "grads %.2f + gathered %.2f + optimizer %.2f + master %.2f + activations %.2f "
                 "(%d in flight) + workspace %.2f",
                 m->plan.lay.numel, mem->total / MiB, mem->params / MiB, mem->grads / MiB,
                 mem->gather / MiB, mem->optimizer / MiB, mem->master / MiB, mem->activations / MiB,
                 m->plan.nslots, mem->workspace / MiB);
    if (m->plan.sharding != TPD_DP_SHARDING_NO_SHARD && tr->is_logger) {
        /* the same rank's model state unsharded, for the line's before -> after */
        tpd_config flat = tr->cfg;
        flat.parallel.data_parallel_sharding_strategy = TPD_DP_SHARDING_NO_SHARD;
        flat.parallel.use_distributed_optimizer = 0;
        tpd_mem_breakdown full;
        if (tpd_model_memory(&flat, tr->mesh.tp_size, tr->mesh.pp_size, tr->mesh.data_dp_size,
                             tr->mesh.pp, &full) != TPD_OK)
            full = *mem;
        double before = (double)(full.params + full.grads + full.optimizer + full.master);
        double after = (double)(mem->params + mem->grads + mem->optimizer + mem->master);
        char hsdp[80] = "";
        if (tr->mesh.shard_size < tr->mesh.dp_inner_size)
            snprintf(hsdp, sizeof hsdp, " (HSDP: %d shard groups, the shards all-reduced across)",
                     tr->mesh.dp_inner_size / tr->mesh.shard_size);
        char xs[96] = ""; /* EP: the expert units' slots beside them */
        if (m->plan.xslot_numel > 0)
            snprintf(xs, sizeof xs, ", and %d parameter and %d gradient expert slots",
                     m->plan.pool_params, m->plan.pool_grads);
        tpd_log_info(
            "DP sharding %s over %d ranks%s: params %.2f -> %.2f MiB, grads %.2f -> %.2f, "
            "optimizer and master %.2f -> %.2f; model state %.2f -> %.2f MiB (%.3f of "
            "no_shard) + gathered working set %.2f MiB (%d parameter and %d gradient "
            "unit slots%s)",
            tpd_config_choice("parallel.data_parallel_sharding_strategy", m->plan.sharding),
            tr->mesh.shard_size, hsdp, full.params / MiB, mem->params / MiB, full.grads / MiB,
            mem->grads / MiB, (full.optimizer + full.master) / MiB,
            (mem->optimizer + mem->master) / MiB, before / MiB, after / MiB,
            before > 0 ? after / before : 0.0, mem->gather / MiB, m->plan.pool_params,
            m->plan.pool_grads + (m->plan.eslot_numel > 0), xs);
    }
    if (tr->cfg.training.precision == TPD_PRECISION_FP32 &&
        !tr->cfg.training.accumulate_allreduce_grads_in_fp32)
        tpd_log_info("training.accumulate_allreduce_grads_in_fp32: false has no effect under "
                     "training.precision fp32 (its gradients are fp32 either way)");
    /* settings that this layout ignores: said once (the logging rank), not silently */
    const tpd_model_dims *d = &m->d;
    if (tr->is_logger && tr->cfg.parallel.sequence_parallel && tr->mesh.tp_size == 1)
        tpd_log_warn("parallel.sequence_parallel: true has no effect at "
                     "tensor_model_parallel_size 1 (it splits activations over TP ranks)");
    int rn = tr->cfg.training.recompute_num_layers;
    if (tr->is_logger && tr->cfg.training.recompute == TPD_RECOMPUTE_FULL &&
        rn > d->chunk_layers[0])
        tpd_log_warn("training.recompute_num_layers %d is more than the %d layer%s of a model "
                     "chunk (num_layers / (PP x virtual chunks)): every layer is recomputed, as "
                     "with 0",
                     rn, d->chunk_layers[0], d->chunk_layers[0] > 1 ? "s" : "");
    if (tr->data.n > 1) {
        char blend[512] = "";
        size_t at = 0;
        for (int d = 0; d < tr->data.n && at < sizeof blend; d++)
            at += (size_t)snprintf(blend + at, sizeof blend - at, "%s%.3f %s", d ? ", " : "",
                                   tr->data.weight[d], tr->data.prefix[d]);
        tpd_log_info("data: a blend of %d data sets: %s", tr->data.n, blend);
    }
    if (tr->diloco && tr->is_logger) {
        const tpd_config_diloco *dl = &tr->cfg.diloco;
        tpd_log_info("DiLoCo: %d replicas of DP %d | outer step every %d steps (%d fragment%s, "
                     "overlap %d steps) | outer Nesterov lr %g momentum %g | %s all-reduce of "
                     "%.2f MiB per rank per fragment | outer state %.2f MiB",
                     tr->mesh.replicas, tr->mesh.dp_inner_size, dl->sync_interval, dl->fragments,
                     dl->fragments > 1 ? "s" : "", dl->overlap_steps, dl->outer_lr,
                     dl->outer_momentum, dl->reduce_dtype == TPD_REDUCE_BF16 ? "bf16-wire" : "fp32",
                     tpd_diloco_fragment_bytes(tr->diloco, 0) / MiB, mem->outer / MiB);
    }
    if (tr->dpp.zero) {
        uint64_t full = (uint64_t)m->plan.numel_padded * 4 * (2 + m->plan.has_master);
        uint64_t now = mem->optimizer + mem->master;
        tpd_log_info("distributed optimizer (ZeRO-1) over DP %d: optimizer state %.2f MiB "
                     "instead of %.2f MiB, saving %.2f MiB per rank",
                     tr->dpp.dp_size, now / MiB, full / MiB, (full - now) / MiB);
    }
}

static void emit_placement(void *user, int warn, const char *line) {
    (void)user;
    if (warn)
        tpd_log_warn("placement: %s", line);
    else
        tpd_log_info("placement: %s", line);
}

/* Which host runs which ranks, and whether the launcher's node-local numbers match
 * (collective over the world; the logging rank prints). */
static tpd_status log_placement(const tpd_trainer *tr) {
    tpd_comm *world = tr->hcomms.world;
    if (tpd_comm_size(world) < 2) return TPD_OK;
    tpd_rank_place *places = NULL;
    /* the launcher's node-local numbers, checked against the hosts */
    TPD_CHECK(tpd_placement_gather(world, &places));
    if (tr->is_logger) tpd_placement_describe(&tr->mesh, places, emit_placement, NULL);
    free(places);
    return TPD_OK;
}

tpd_status tpd_trainer_save(tpd_trainer *tr, const char *save_dir) {
    TPD_CHECK(tpd_trainer_sync_params(tr));
    /* a checkpoint of non-finite weights would only ever generate garbage: never saved
     * (the norm is global, so every rank refuses together) */
    double norm = 0;
    TPD_CHECK(tpd_optim_params_norm(tr->model, &tr->dpp, &tr->hcomms, &norm));
    if (!isfinite(norm)) {
        tpd_log_error("checkpoint: not saving iteration %d to %s: the parameters are not "
                      "finite (norm %g)",
                      tr->counters.iteration, save_dir, norm);
        tr->failed_together = 1;
        return TPD_ERR_DIVERGED;
    }
    return tpd_ckpt_save(tr->saver, &tr->counters, save_dir);
}

/* After a step: a skipped one is said (logging rank), and max_skipped_iterations of them
 * in a row end the run on every rank with TPD_ERR_DIVERGED, before any save. */
static tpd_status check_skipped(tpd_trainer *tr, const tpd_step_stats *s) {
    if (!s->skipped) return TPD_OK;
    int max = tr->cfg.training.max_skipped_iterations, n = tr->skipped_in_a_row;
    if (max > 0 && n >= max) {
        tpd_log_error("iteration %d: the loss (%g) or the gradient norm (%g) has not been "
                      "finite for %d iterations in a row (training.max_skipped_iterations "
                      "%d): the run diverged; stopping without saving (lower optimizer.lr, "
                      "or resume from an earlier checkpoint)",
                      s->iteration, s->lm_loss, s->grad_norm, n, max);
        tr->failed_together = 1;
        return TPD_ERR_DIVERGED;
    }
    if (tr->is_logger)
        tpd_log_warn("iteration %d: loss %g, gradient norm %g: not finite, update skipped (%d in "
                     "a row%s)",
                     s->iteration, s->lm_loss, s->grad_norm, n,
                     max > 0 ? "; the run stops at training.max_skipped_iterations" : "");
    return TPD_OK;
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
        save = flag != 0 || (c->save_interval > 0 && it > 0 && it % c->save_interval == 0);
        /* DiLoCo with overlap: while a fragment's outer all-reduce is in flight the state
         * is not checkpointable (tpd_ckpt_save); the save, and a stop, wait for it to land
         * (at most diloco.overlap_steps iterations; the same on every rank) */
        int pending = tpd_diloco_in_flight(tr->diloco);
        if (pending >= 0 && (save || tr->held_save)) {
            if (save && !tr->held_save && tr->is_logger)
                tpd_log_info("iteration %d: fragment %d's outer all-reduce is in flight; the "
                             "checkpoint%s waits until it is applied",
                             it, pending, flag ? " and the stop" : "");
            tr->held_save |= save;
            tr->held_flag |= flag;
            save = flag = 0;
        } else if (pending < 0 && tr->held_save) {
            save = 1;
            flag |= tr->held_flag;
            tr->held_save = tr->held_flag = 0;
        }
        *stop_p = flag != 0;
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

/* Holds checkpoint.save against a second run (collective): world rank 0, which writes
 * the directory's top level, takes the lock and every rank learns whether it got it. Taken
 * by tpd_trainer_create before checkpoint.load=auto reads the directory (the other run may
 * be committing a checkpoint there), so before the guard and the .tmp pruning too. */
tpd_status tpd_trainer_lock_save_dir(tpd_trainer *tr) {
    tpd_status st = TPD_OK;
    if (tr->mesh.rank == 0 && tr->save_lock_fd < 0)
        st = tpd_ckpt_lock_save_dir(tr->cfg.checkpoint.save, &tr->save_lock_fd);
    int32_t failed = st != TPD_OK;
    tpd_comm *w = tr->hcomms.world;
    if (tpd_comm_size(w) > 1)
        TPD_CHECK(tpd_comm_allreduce(w, &failed, &failed, 1, TPD_DTYPE_I32, TPD_COMM_OP_MAX, NULL));
    if (!failed) return TPD_OK;
    tr->failed_together = 1;
    if (st != TPD_OK) return st; /* it said why */
    return tpd_fail(TPD_ERR_INVALID, "checkpoint.save: %s could not be held (rank 0 says why)",
                    tr->cfg.checkpoint.save);
}

tpd_status tpd_trainer_run(tpd_trainer *tr) {
    const tpd_config *cfg = &tr->cfg;
    log_startup(tr);
    TPD_CHECK(log_placement(tr)); /* collective: before anything that fails on one rank */
    if (cfg->checkpoint.save[0]) {
        /* held since tpd_trainer_create; before any step: refused here, every rank says so (the
         * same files for all) */
        tpd_status guard = tpd_ckpt_check_save_dir(cfg, tr->loaded_dir, tr->continues);
        tr->failed_together = guard != TPD_OK;
        TPD_CHECK(guard);
        if (tr->mesh.rank == 0) tpd_ckpt_prune_tmp(cfg->checkpoint.save);
    }
    tpd_status kept = check_metrics_file(tr);
    tr->failed_together = kept != TPD_OK;
    TPD_CHECK(kept);
    TPD_CHECK(open_metrics(tr));
    TPD_CHECK(open_tensorboard(tr));
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
        TPD_CHECK_GOTO(check_skipped(tr, &s), st, out);
        tr->acc_dp_bytes += s.dp_bytes;
        tr->acc_outer_bytes += s.dp_outer_bytes;
        if (s.outer_started >= 0) {
            tr->acc_outer_steps++;
            tr->acc_outer_rank_bytes += s.outer_rank_bytes;
            tr->last_outer_iteration = s.iteration;
            tr->last_outer_fragment = s.outer_started;
        }
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
        double run_s = tpd_clock_s() - tr->run_start_s;
        int done = it - tr->run_start_iteration;
        tpd_iter_record r = {
            .iteration = it,
            .run_elapsed_s = run_s,
            .eta_s = done > 0 ? run_s / done * (cfg->training.train_iters - it) : -1,
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
            .dp_bytes = tr->acc_dp_bytes,
            .dp_outer_bytes = tr->acc_outer_bytes,
            .diloco = tr->diloco != NULL,
            .outer_steps = tr->acc_outer_steps,
            .outer_last_iteration = tr->last_outer_iteration,
            .outer_last_fragment = tr->last_outer_fragment,
            .fragments = cfg->diloco.fragments,
            .outer_rank_bytes = tr->acc_outer_rank_bytes,
            .moe = s.moe,
            .moe_aux_loss = s.moe_aux_loss,
            .moe_aux_raw = s.moe_aux_raw,
            .moe_z_loss = s.moe_z_loss,
            .moe_dropped = s.moe_dropped,
            .moe_load_max = s.moe_load_max,
            .moe_load_min = s.moe_load_min,
        };
        tr->acc_dp_bytes = tr->acc_outer_bytes = tr->acc_outer_rank_bytes = 0;
        tr->acc_outer_steps = 0;
        char line[1024];
        tpd_metrics_format_line(&r, line, sizeof line);
        printf("%s\n", line);
        if (cfg->logging.log_timers) {
            tpd_metrics_format_timers(&timers, line, sizeof line);
            printf("%s\n", line);
        }
        fflush(stdout);
        if (tr->metrics)
            TPD_CHECK_GOTO(tpd_metrics_write_jsonl(tr->metrics, cfg->logging.metrics_file, &r), st,
                           out);
        if (tr->tb)
            TPD_CHECK_GOTO(tpd_tb_record(tr->tb, &r, cfg->logging.log_timers ? &timers : NULL), st,
                           out);
    }
    TPD_CHECK_GOTO(on_boundary(tr, 1, &stop), st, out);
    if (tr->is_logger && cfg->logging.metrics_file[0])
        tpd_log_info("pictures of this run: tripod report %s", cfg->logging.metrics_file);
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
