/* Private to engine/train/: the trainer's state, shared by train.c (construction, one
 * step, evaluation) and train_run.c (the run loop, its checkpoint boundary, logging). */
#ifndef TPD_ENGINE_TRAIN_TRAIN_INTERNAL_H
#define TPD_ENGINE_TRAIN_TRAIN_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "engine/checkpoint/checkpoint.h"
#include "engine/optim/diloco.h"
#include "engine/optim/grad_sync.h"
#include "engine/train/train.h"
#include "kernels/kernels.h"
#include "parallel/data/dp.h"
#include "parallel/pipeline/schedule.h"

struct tpd_trainer {
    tpd_config cfg;
    tpd_mesh mesh;
    tpd_mesh_comms comms;       /* for backend memory: MPI on cpu, NCCL (or MPI staged through
                                   host memory when ranks share a GPU) on cuda */
    tpd_mesh_comms hcomms;      /* MPI, for host scalars (losses, norms, flags) */
    int device_comms;           /* 1 when comms differ from hcomms and must be destroyed */
    int local_rank, local_size; /* this rank among the ranks of its node (MPI shared split) */
    tpd_mesh_gpu gpu;           /* on cuda: its device, and whether NCCL serves the node */
    tpd_kern_backend *kb;
    tpd_model *model;
    tpd_dp_plan dpp;
    tpd_pp_schedule sched;
    tpd_model_mb *where; /* (M, v): slot and head block of each (micro-batch, chunk) */
    tpd_grad_sync *gsync;
    tpd_diloco *diloco;      /* parallel.dp_sync diloco: the outer step; NULL otherwise */
    double dp_bytes_step;    /* the job's DP wire bytes of a step's inner reductions (all ranks) */
    double *outer_bytes_job; /* (diloco.fragments) the job's bytes of each fragment's all-reduce */
    uint64_t sample_stride; /* samples between two steps' first samples (tpd_trainer_set_samples) */
    uint64_t sample_offset; /* first sample of step 0 */
    /* since the last logged iteration: DP bytes of the job and the outer steps */
    double acc_dp_bytes, acc_outer_bytes, acc_outer_rank_bytes;
    int acc_outer_steps, last_outer_iteration, last_outer_fragment;
    int held_save, held_flag; /* a save (and a stop's flags) waiting for an outer step */
    tpd_data_source data;     /* data.data_path: one data set or a weighted blend */
    tpd_blend_sampler train_sampler, valid_sampler;
    int has_valid;
    int M;                      /* micro-batches per step per pipeline */
    tpd_ckpt_counters counters; /* iteration, consumed samples, skipped iterations */
    int saved_iteration;        /* iteration of the checkpoint this run resumed; -1: none */
    tpd_ckpt_saver *saver;
    char loaded_dir[TPD_CKPT_PATH]; /* the checkpoint this run loaded; "" when none */
    int continues;                  /* it continues that checkpoint's run (full state) */
    int save_lock_fd;        /* tpd_ckpt_lock_save_dir of checkpoint.save from tpd_trainer_run on
                                (world rank 0); -1: not held */
    int skipped_in_a_row;    /* non-finite steps since the last good one */
    int failed_together;     /* tpd_trainer_failed_together */
    int interrupted;         /* tpd_trainer_run stopped early on SIGTERM/SIGINT, or at
                                training.exit_interval / exit_duration_in_mins (after saving) */
    int run_start_iteration; /* iteration when tpd_trainer_run began */
    double run_start_s;      /* tpd_clock_s() then */
    int is_logger;           /* writes the log line and the metrics file */
    FILE *metrics;
    struct tpd_tb_writer *tb; /* logging.tensorboard_dir, logging rank */
    int32_t *batch;           /* (B, T+1) host samples of one micro-batch */
    /* during a step */
    tpd_blend_sampler *cur_sampler;
    uint64_t cur_base; /* first sample index of this DP rank's share */
    double loss_acc;
    double tp_comm_acc;
    int evaluating; /* forward only, one (micro-batch, chunk) at a time: slot 0, head 0 */
    int final_mb;   /* the backward (or W) running is its chunk's last of the step */
    tpd_trainer_observer observer;
    void *observer_user;
};

/* train_run.c: takes checkpoint.save's lock (collective); tpd_trainer_create calls it */
tpd_status tpd_trainer_lock_save_dir(tpd_trainer *tr);

#endif
