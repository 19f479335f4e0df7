/* The training loop of one rank: data, the 1F1B schedule, gradient reduction over the
 * embedding and DP groups, the global gradient norm, clipping, AdamW (ZeRO-1 aware),
 * evaluation, the log line and the metrics file.
 *
 * Every rank of the job runs the same calls in the same order; only the logging rank (the
 * last stage's first TP and DP rank, as in Megatron) prints and writes files. */
#ifndef TPD_ENGINE_TRAIN_H
#define TPD_ENGINE_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "engine/config.h"
#include "engine/data.h"
#include "engine/model.h"
#include "kernels/kernels.h"
#include "parallel/data/dp.h"
#include "parallel/mesh.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_step_stats {
    int iteration;          /* 1-based: the iteration just completed */
    double lm_loss;         /* mean over the global batch (averaged over DP) */
    double grad_norm;       /* before clipping, over every parameter once */
    double params_norm;     /* after the update (logging.log_params_norm), else NaN */
    double lr;
    double elapsed_s;
    int skipped;            /* 1 when the update was skipped (non-finite gradients) */
    tpd_pp_exec_stats pipe; /* this rank's compute / wait split */
    double t_tp_comm_s;     /* inside compute: TP collectives */
    double t_reduce_s;      /* embedding + DP gradient reduction */
    double t_optim_s;       /* norm, clipping, AdamW, ZeRO all-gather */
} tpd_step_stats;

typedef struct tpd_trainer {
    tpd_config cfg;
    tpd_mesh mesh;
    tpd_mesh_comms comms;  /* for backend memory: MPI on cpu, NCCL (or MPI staged through
                              host memory when ranks share a GPU) on cuda */
    tpd_mesh_comms hcomms; /* MPI, for host scalars (losses, norms, flags) */
    int device_comms;      /* 1 when comms differ from hcomms and must be destroyed */
    tpd_kern_backend kb;
    tpd_model *model;
    tpd_dp_plan dpp;
    tpd_pp_schedule sched;
    tpd_data_source data; /* data.data_path: one data set or a weighted blend */
    tpd_blend_sampler train_sampler, valid_sampler;
    int has_valid;
    int M;            /* micro-batches per step per pipeline */
    int iteration;    /* completed iterations */
    uint64_t consumed_samples;
    int skipped_iterations;
    int saved_iteration; /* iteration of the last checkpoint saved or resumed; -1: none */
    struct tpd_ckpt_async *ckpt_async; /* a save being written in the background */
    int interrupted;  /* tpd_trainer_run stopped early on SIGTERM/SIGINT, or at
                         training.exit_interval / exit_duration_in_mins (after saving) */
    int run_start_iteration; /* iteration when tpd_trainer_run began */
    double run_start_s;      /* tpd_clock_s() then */
    int is_logger;    /* writes the log line and the metrics file */
    FILE *metrics;
    int32_t *batch;   /* (B, T+1) host samples of one micro-batch */
    /* during a step */
    tpd_blend_sampler *cur_sampler;
    uint64_t cur_base; /* first sample index of this DP rank's share */
    double loss_acc;
    tpd_step_stats last;
    double tp_comm_acc;
    /* Optional observer of every pipeline action (traces): wall-clock interval in
     * seconds of tpd_clock_s(). */
    void (*on_action)(void *user, const tpd_pp_action *a, double t0, double t1);
    void *on_action_user;
} tpd_trainer;

/* Builds everything for this rank: validates the config against the world (the same
 * message on every rank, before any collective), splits the communicators, creates the
 * backend and the model, initializes parameters, opens the data. world: the world
 * communicator (MPI). */
/* cpu kernel threads per rank: training.num_threads when set, else 0 (OpenMP's default)
 * when OMP_NUM_THREADS is set or the rank is alone on its node, else the node's cores
 * shared among its ranks. */
int tpd_trainer_cpu_threads(const tpd_config *cfg, int ranks_on_node);

tpd_status tpd_trainer_create(const tpd_config *cfg, tpd_comm *world, tpd_trainer **tr_p);
void tpd_trainer_destroy(tpd_trainer *tr);

/* One training iteration over the global batch. */
tpd_status tpd_trainer_step(tpd_trainer *tr, tpd_step_stats *stats_p);
/* Mean validation loss over logging.eval_iters global batches of the valid split (the
 * same batches every time). Returns the value on every rank. */
tpd_status tpd_trainer_evaluate(tpd_trainer *tr, double *val_loss_p);
/* Mean loss over `iters` global batches of `split` (valid or test), forward only, on
 * every layout the same batches. Returns the value on every rank. */
tpd_status tpd_trainer_evaluate_split(tpd_trainer *tr, tpd_split split, int iters,
                                      double *loss_p);
/* The whole run: train_iters iterations with logging, evaluation, metrics and
 * checkpoints. On SIGTERM/SIGINT (handlers installed here) every rank stops at the next
 * iteration boundary, saves when checkpoint.save is set, sets `interrupted` and returns
 * TPD_OK: a run stopped by a signal has ended cleanly. */
tpd_status tpd_trainer_run(tpd_trainer *tr);

/* Learning rate of iteration `it` (0-based), Megatron's warmup + decay. */
double tpd_lr_at(const tpd_config *cfg, int it);

/* Gathers the global (unpadded) tensor of parameter p onto world rank 0 (fp32, of
 * tpd_model_layout_global_numel elements); other ranks pass out = NULL. Collective over
 * the world. */
tpd_status tpd_trainer_gather_param(tpd_trainer *tr, tpd_param p, float *out);

/* Model FLOPs of one iteration (Megatron's formula) for throughput figures. */
double tpd_model_flops_per_iteration(const tpd_config *cfg, int padded_vocab);

#ifdef __cplusplus
}
#endif
#endif
