/* What people read: the per-iteration log line (Megatron's fields plus tokens/s and
 * achieved FLOP/s) and the JSONL metrics file, one object per logged iteration. */
#ifndef TPD_ENGINE_METRICS_H
#define TPD_ENGINE_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_iter_record {
    int iteration, train_iters;
    uint64_t consumed_samples;
    double elapsed_ms;     /* per iteration */
    double tflops_per_gpu; /* model FLOPs / time / world */
    double tokens_per_s;   /* whole job */
    double mfu;            /* < 0 when the device peak is unknown */
    double lr;
    int global_batch_size;
    double lm_loss;
    double grad_norm;
    int has_params_norm; /* logging.log_params_norm */
    double params_norm;
    int skipped_iterations;
    double val_loss;      /* NaN when not evaluated this iteration */
    double run_elapsed_s; /* since this run started (a resumed run counts from its start) */
    double eta_s;         /* to train_iters at this run's mean iteration time; < 0: unknown */
    /* DP communication since the previous record: the job's wire bytes (all ranks, the
     * ring's count), inner reductions and DiLoCo's outer all-reduces */
    double dp_bytes, dp_outer_bytes;
    int diloco;               /* parallel.dp_sync diloco: the outer-step fields below are set */
    int outer_steps;          /* outer all-reduces started since the previous record */
    int outer_last_iteration; /* and the last one's iteration and fragment */
    int outer_last_fragment, fragments;
    double outer_rank_bytes; /* the logging rank's bytes of those all-reduces */
    /* mixture of experts (tpd_step_stats' moe fields, of the logged iteration) */
    int moe;
    double moe_aux_loss, moe_aux_raw, moe_z_loss, moe_dropped, moe_load_max, moe_load_min;
} tpd_iter_record;

/* Where one step's time went, ms (Megatron's timers line): the largest over the ranks of
 * the job, except idle_fraction. */
typedef struct tpd_step_timers {
    double compute_ms;    /* forward and backward compute, TP collectives included */
    double tp_comm_ms;    /* of which TP collectives */
    double pp_wait_ms;    /* blocked on pipeline receives and sends (bubble + p2p) */
    double idle_fraction; /* of the pipeline: 1 - (sum of compute) / (sum of pipeline time)
                             over all ranks, the simulator's idle fraction */
    double reduce_ms;     /* embedding and DP gradient reduction after the pipeline: the part
                             the backward did not hide */
    double param_wait_ms; /* ZeRO-1 parameter all-gather waited for */
    double optimizer_ms;  /* norm, clipping, AdamW */
} tpd_step_timers;

/* " time (ms) | forward-backward compute: ... | optimizer: ... |". */
void tpd_metrics_format_timers(const tpd_step_timers *t, char *buf, size_t cap);

/* Megatron's layout: "iteration 50/45776 | elapsed: 1:02 | ETA: 2:03:04 | consumed samples:
 * 25600 | ...". */
void tpd_metrics_format_line(const tpd_iter_record *r, char *buf, size_t cap);

/* One JSON object (cJSON) and a newline, flushed. Keys: iteration, consumed_samples,
 * lm_loss, lr, grad_norm, elapsed_ms, tokens_per_s, tflops_per_gpu, skipped_iterations,
 * dp_bytes, dp_outer_bytes, outer_steps under DiLoCo, params_norm when logged, and
 * val_loss when evaluated. A failed write is TPD_ERR_IO,
 * logged with path (the file) and the reason. */
tpd_status tpd_metrics_write_jsonl(FILE *f, const char *path, const tpd_iter_record *r);

#ifdef __cplusplus
}
#endif
#endif
