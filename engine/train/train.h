/* The training loop of one rank: data, the pipeline schedule (1F1B, interleaved or
 * ZB-H1), gradient reduction over the embedding and DP groups (overlapped with the last
 * backward or not), the global gradient norm, clipping, AdamW or SGD (ZeRO-1 aware),
 * DiLoCo's outer step across replicas (parallel.dp_sync diloco), evaluation, the log line, the
 * metrics file and checkpoints.
 *
 * Every rank of the job runs the same calls in the same order; only the logging rank (the
 * last stage's first TP and DP rank, as in Megatron) prints and writes files.
 *
 * tpd_trainer is an opaque handle: callers use the functions below. */
#ifndef TPD_ENGINE_TRAIN_TRAIN_H
#define TPD_ENGINE_TRAIN_TRAIN_H

#include <stdint.h>

#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/model/model.h"
#include "engine/train/metrics.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/pipeline/executor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_step_stats {
    int iteration;      /* 1-based: the iteration just completed */
    double lm_loss;     /* mean over the global batch (averaged over DP) */
    double grad_norm;   /* before clipping, over every parameter once */
    double params_norm; /* after the update (logging.log_params_norm), else NaN */
    double lr;
    double elapsed_s;
    int skipped;            /* 1 when the update was skipped (non-finite loss or gradients) */
    tpd_pp_exec_stats pipe; /* this rank's compute / wait split */
    double t_tp_comm_s;     /* inside compute: TP collectives */
    double t_reduce_s;      /* after the pipeline: embedding + DP gradient reduction not
                               hidden behind the backward (the exposed part) */
    double t_param_wait_s;  /* ZeRO-1 parameter all-gather waited for (exposed) */
    double t_optim_s;       /* norm, clipping, AdamW, starting the ZeRO all-gather */
    /* DP communication of the step (the job's wire bytes by the ring's count, all ranks) */
    double dp_bytes;         /* inner reductions plus the outer all-reduce started */
    double dp_outer_bytes;   /* of which DiLoCo's outer all-reduce */
    int outer_started;       /* DiLoCo: fragment whose outer all-reduce started; -1: none */
    int outer_applied;       /* fragment whose outer step was applied; -1: none */
    double outer_rank_bytes; /* this rank's bytes of that all-reduce */
    double t_outer_s;        /* blocked on the outer all-reduce */
    /* mixture of experts (model.num_moe_experts > 0): the step's load-balancing and z
     * losses as weighted into the objective (summed over layers, mean over micro-batches),
     * the load-balancing loss without its coefficient (1 at a perfect balance), the share of
     * assignments dropped by the capacity, and the most and least loaded expert's
     * assignments over the mean (all layers and micro-batches) */
    int moe;
    double moe_aux_loss, moe_aux_raw, moe_z_loss, moe_dropped, moe_load_max, moe_load_min;
} tpd_step_stats;

typedef struct tpd_trainer tpd_trainer;

/* cpu kernel threads per rank: training.num_threads when set (at most the cores this
 * process may run on), else 0 (OpenMP's default) when OMP_NUM_THREADS is set or the rank
 * is alone on its node, else the node's cores shared among its ranks. */
int tpd_trainer_cpu_threads(const tpd_config *cfg, int ranks_on_node);

/* Builds everything for this rank: validates the config against the world (the same
 * message on every rank, before any collective), splits the communicators, creates the
 * backend and the model, initializes parameters, opens the data, and applies
 * checkpoint.load. world: the host (MPI) world communicator. */
tpd_status tpd_trainer_create(const tpd_config *cfg, tpd_comm *world, tpd_trainer **tr_p);
void tpd_trainer_destroy(tpd_trainer *tr);

/* One training iteration over the global batch. */
tpd_status tpd_trainer_step(tpd_trainer *tr, tpd_step_stats *stats_p);
/* Mean validation loss over logging.eval_iters global batches of the valid split (the
 * same batches every time). Returns the value on every rank. */
tpd_status tpd_trainer_evaluate(tpd_trainer *tr, double *val_loss_p);
/* Mean loss over `iters` global batches of `split` (valid or test), forward only, on
 * every layout the same batches. Returns the value on every rank. */
tpd_status tpd_trainer_evaluate_split(tpd_trainer *tr, tpd_split split, int iters, double *loss_p);
/* The whole run: train_iters iterations with logging, evaluation, metrics and
 * checkpoints. On SIGTERM/SIGINT (handlers installed here) every rank stops at the next
 * iteration boundary, saves when checkpoint.save is set, and returns TPD_OK with
 * tpd_trainer_interrupted set: a run stopped by a signal has ended cleanly. After
 * training.max_skipped_iterations non-finite steps in a row every rank says so and
 * returns TPD_ERR_DIVERGED without saving. */
tpd_status tpd_trainer_run(tpd_trainer *tr);
/* Saves a checkpoint of the current iteration into save_dir (collective). */
tpd_status tpd_trainer_save(tpd_trainer *tr, const char *save_dir);

/* The job's view of one step's timers (engine/train/metrics.h): maxima over the world's
 * ranks, and the pipeline's idle fraction over all of them. Collective over the world. */
tpd_status tpd_trainer_job_timers(tpd_trainer *tr, const tpd_step_stats *s, tpd_step_timers *t);

/* Waits for the ZeRO-1 parameter gathers that a step leaves in flight under
 * parallel.overlap_param_gather (the next step's forward waits for them otherwise): call
 * it before reading parameters through tpd_trainer_model. Saving, evaluation and
 * tpd_trainer_gather_param do. */
tpd_status tpd_trainer_sync_params(tpd_trainer *tr);
/* This rank's whole flat parameter buffer as fp32 in host memory (numel_padded floats):
 * gathered from the DP shards under optim_grads_params, so collective over DP; read
 * otherwise (after tpd_trainer_sync_params). */
tpd_status tpd_trainer_params_f32(tpd_trainer *tr, float *out);

/* Gathers the global (unpadded) tensor of parameter p onto world rank 0 (fp32, of
 * tpd_model_layout_global_numel elements); other ranks pass out = NULL. Collective over
 * the world. */
tpd_status tpd_trainer_gather_param(tpd_trainer *tr, tpd_param p, float *out);
/* The same tensor as the optimizer holds it: the fp32 master weights under bf16 training
 * (the bf16 parameters are their rounding), else the fp32 parameters. Each element comes
 * from the one rank that owns it in the DP plan (its ZeRO shard; DP rank 0 without ZeRO;
 * the first DiLoCo replica and HSDP shard group), so on fp32 it equals
 * tpd_trainer_gather_param bit for bit. TPD_ERR_UNSUPPORTED for bf16 parameters without
 * masters. Collective over the world. */
tpd_status tpd_trainer_gather_master(tpd_trainer *tr, tpd_param p, float *out);

/* The samples a step reads: step i's global batch starts at sample i * stride + offset
 * of the train split (by default stride = training.global_batch_size, offset = 0). A
 * one-rank reference of one DiLoCo replica reads that replica's share of a larger global
 * batch this way (verify, tests). */
void tpd_trainer_set_samples(tpd_trainer *tr, uint64_t stride, uint64_t offset);

/* Observer of every pipeline action (traces, tests): called with its wall-clock
 * interval in seconds of tpd_clock_s(). NULL removes it. */
typedef void (*tpd_trainer_observer)(void *user, const tpd_pp_action *a, double t0, double t1);
void tpd_trainer_set_observer(tpd_trainer *tr, tpd_trainer_observer fn, void *user);

/* ---- what a trainer is and where it stands ---- */
const tpd_config *tpd_trainer_config(const tpd_trainer *tr);
const tpd_mesh *tpd_trainer_mesh(const tpd_trainer *tr);
/* The host (MPI) communicators of each dimension: losses, norms, flags. */
const tpd_mesh_comms *tpd_trainer_host_comms(const tpd_trainer *tr);
tpd_model *tpd_trainer_model(const tpd_trainer *tr);
const tpd_data_source *tpd_trainer_data(const tpd_trainer *tr);
int tpd_trainer_micro_batches(const tpd_trainer *tr); /* per step per pipeline */
int tpd_trainer_iteration(const tpd_trainer *tr);     /* completed iterations */
uint64_t tpd_trainer_consumed_samples(const tpd_trainer *tr);
int tpd_trainer_is_logger(const tpd_trainer *tr);
/* 1 when tpd_trainer_run stopped early on a signal or at training.exit_interval /
 * exit_duration_in_mins (after saving). */
int tpd_trainer_interrupted(const tpd_trainer *tr);
/* 1 when tpd_trainer_run failed on a verdict every rank reached together (a diverged
 * run, a save directory it may not write): no rank is left inside a collective. */
int tpd_trainer_failed_together(const tpd_trainer *tr);
/* 1 while a checkpoint.async_save is written in the background, not yet committed. */
int tpd_trainer_save_in_flight(const tpd_trainer *tr);
/* Model FLOPs of one iteration (tpd_model_flops of the global batch), for throughput. */
double tpd_trainer_flops_per_iteration(const tpd_trainer *tr);

#ifdef __cplusplus
}
#endif
#endif
