/* The trainer: construction, one step through the pipeline executor, evaluation, and the
 * gather of a parameter. The run loop is in train_run.c. */
#include "engine/train/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/cpu.h"
#include "engine/model/model_flops.h"
#include "engine/optim/lr.h"
#include "engine/optim/optimizer.h"
#include "engine/train/tensorboard.h"
#include "engine/train/train_internal.h"
#ifdef TPD_HAVE_NCCL
#include "parallel/comm_nccl.h"
#endif

/* ---- construction ---- */

/* This rank's place among the ranks of its node, by MPI_Comm_split_type over the host
 * world (so a launcher that sets no local-rank variable is fine), and on cuda its GPU
 * (tpd_mesh_choose_gpu, from every node rank's CUDA_VISIBLE_DEVICES). Collective over
 * world. */
static tpd_status locate_on_node(tpd_trainer *tr, tpd_comm *world) {
    enum { VIS = 128 }; /* bytes of one rank's CUDA_VISIBLE_DEVICES */
    tpd_status st = TPD_OK;
    tpd_comm *node = NULL;
    tr->local_rank = 0;
    tr->local_size = 1;
    tr->gpu.device = -1;
    tr->gpu.nccl = 0;
    if (strcmp(tpd_comm_backend(world), "mpi") == 0 && tpd_comm_size(world) > 1) {
        TPD_CHECK(tpd_comm_mpi_split_node(world, &node));
        tr->local_rank = tpd_comm_rank(node);
        tr->local_size = tpd_comm_size(node);
    }
    if (tr->cfg.training.device == TPD_DEVICE_CUDA) {
        char mine[VIS] = "";
        const char *env = getenv("CUDA_VISIBLE_DEVICES");
        if (env) snprintf(mine, sizeof mine, "%s", env);
        char *all = calloc((size_t)tr->local_size, VIS);
        const char **vis = calloc((size_t)tr->local_size, sizeof *vis);
        if (!all || !vis) {
            tpd_log_error("train: out of memory");
            st = TPD_ERR_NOMEM;
        } else if (node) {
            st = tpd_comm_allgather(node, mine, all, VIS, TPD_DTYPE_U8, NULL);
        } else {
            memcpy(all, mine, VIS);
        }
        if (st == TPD_OK) {
            for (int i = 0; i < tr->local_size; i++) {
                all[(size_t)i * VIS + VIS - 1] = 0;
                vis[i] = all + (size_t)i * VIS;
            }
            tr->gpu = tpd_mesh_choose_gpu(tr->local_rank, tr->local_size,
                                          tpd_kern_cuda_device_count(), vis);
        }
        free(vis);
        free(all);
    }
    if (node) tpd_comm_destroy(node);
    return st;
}

int tpd_trainer_cpu_threads(const tpd_config *cfg, int ranks_on_node) {
    /* more threads than the cores this process may run on only queue on them: a step
     * 1000 threads wide runs about 1000 times slower (log_startup warns) */
    int cores = tpd_cpu_usable_cores();
    if (cfg->training.num_threads > cores) return cores;
    if (cfg->training.num_threads > 0 || getenv("OMP_NUM_THREADS"))
        return cfg->training.num_threads;
    return ranks_on_node > 1 ? tpd_cpu_threads_per_rank(ranks_on_node) : 0;
}

/* GPU communicators for tensors in device memory: NCCL when every rank of the node has a
 * GPU of its own, else MPI staged through host memory (NCCL refuses two ranks of one
 * communicator on the same device). */
static tpd_status create_device_comms(tpd_trainer *tr, tpd_comm *world) {
#ifdef TPD_HAVE_NCCL
    tpd_comm *dworld = NULL;
    if (tr->gpu.nccl) {
        TPD_CHECK(tpd_comm_nccl_world(world, tr->gpu.device, tr->cfg.comm.timeout_s, &dworld));
    } else {
        tpd_comm *dup = NULL;
        TPD_CHECK(tpd_comm_split(world, 0, tpd_comm_rank(world), "world", &dup));
        tpd_status sst = tpd_comm_staged_create(dup, &dworld);
        if (sst != TPD_OK) {
            tpd_comm_destroy(dup); /* the staged communicator owns it only on success */
            return sst;
        }
        tpd_log_info("%d ranks of this node share %d GPU(s): communicating through host memory",
                     tr->local_size, tpd_kern_cuda_device_count());
    }
    tpd_status st = tpd_mesh_comms_create(&tr->mesh, dworld, &tr->comms);
    if (st != TPD_OK) {
        tpd_comm_destroy(dworld);
        tr->comms = tr->hcomms;
        return st;
    }
    tr->device_comms = 1;
    return TPD_OK;
#else
    (void)world;
    tpd_log_error("train: backend %s needs GPU communicators, but this build has no NCCL",
                  tpd_kern_name(tr->kb));
    return TPD_ERR_UNSUPPORTED;
#endif
}

static void destroy_device_comms(tpd_trainer *tr) {
    tpd_comm *dworld = tr->comms.world;
    tpd_mesh_comms_destroy(&tr->comms);
    if (dworld) tpd_comm_destroy(dworld);
    tr->comms = tr->hcomms;
    tr->device_comms = 0;
}

static tpd_status create_backend(const tpd_config *cfg, const tpd_trainer *tr,
                                 tpd_kern_backend **kb) {
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    kc.num_threads = tpd_trainer_cpu_threads(cfg, tr->local_size);
    kc.dtype = cfg->training.precision == TPD_PRECISION_BF16 ? TPD_DTYPE_BF16 : TPD_DTYPE_F32;
    kc.fused_attention = cfg->training.attention == TPD_ATTENTION_FUSED;
    kc.fp32_grads = tpd_config_grad_bytes(cfg) == 4; /* fp32 main gradients */
    if (cfg->training.device == TPD_DEVICE_CUDA) {
        kc.device = tr->gpu.device > 0 ? tr->gpu.device : 0;
        return tpd_kern_cuda_create(&kc, kb);
    }
    return tpd_kern_cpu_create(&kc, kb);
}

/* Slots and head blocks of every (micro-batch, chunk), by walking the stage's action list
 * as the executor will: a pair takes the lowest free slot at its forward and frees it when
 * its backward (W under a split backward) is done; the last stage's last chunk holds a
 * head block from its forward to its backward. The peaks are the buffer plan's. */
static tpd_status assign_slots(tpd_trainer *tr) {
    const tpd_pp_schedule *s = &tr->sched;
    const tpd_buffer_plan *b = &tr->model->plan;
    int v = s->virtual_stages, last = tr->model->d.last;
    tpd_status st = TPD_OK;
    tr->where = calloc((size_t)tr->M * (size_t)v, sizeof *tr->where);
    char *slot_used = calloc((size_t)b->nslots + 1, 1),
         *head_used = calloc((size_t)b->nheads + 1, 1);
    if (!tr->where || !slot_used || !head_used)
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "train: out of memory for the slot table");
    for (int i = 0; i < s->count; i++) {
        const tpd_pp_action *a = &s->actions[i];
        tpd_model_mb *w = &tr->where[(size_t)a->micro_batch * v + a->chunk];
        int is_head = last && a->chunk == v - 1;
        if (a->kind == TPD_PP_FWD) {
            w->chunk = a->chunk;
            w->slot = w->head = -1;
            for (int k = 0; k < b->nslots && w->slot < 0; k++)
                if (!slot_used[k]) w->slot = k;
            for (int k = 0; is_head && k < b->nheads && w->head < 0; k++)
                if (!head_used[k]) w->head = k;
            if (w->slot < 0 || (is_head && w->head < 0))
                TPD_FAIL_GOTO(TPD_ERR_INTERNAL, st, out,
                              "train: the schedule holds more micro-batches than the memory plan "
                              "(%d slots, %d head blocks)",
                              b->nslots, b->nheads);
            slot_used[w->slot] = 1;
            if (is_head) head_used[w->head] = 1;
        } else if (a->kind == TPD_PP_BWD) {
            if (is_head) head_used[w->head] = 0;
            if (!s->split_backward) slot_used[w->slot] = 0;
        } else if (a->kind == TPD_PP_WGRAD) {
            slot_used[w->slot] = 0;
        }
    }
out:
    free(head_used);
    free(slot_used);
    return st;
}

/* The model's hook: parameter gathers before a forward reads them, gradient reductions
 * once the step's last backward of a chunk has written them, and progress in between. */
static tpd_status model_hook(void *user, int unit, int event) {
    tpd_trainer *tr = user;
    return tpd_grad_sync_event(tr->gsync, unit, event, tr->final_mb);
}

/* The job's DP wire bytes (all ranks, the ring's count): a step's inner reductions and
 * each DiLoCo fragment's outer all-reduce, summed over the world once (stages differ). */
static tpd_status count_dp_bytes(tpd_trainer *tr) {
    int F = tr->diloco ? tr->cfg.diloco.fragments : 0; /* >= 1 by the config's bounds */
    double *b = calloc((size_t)F + 1, sizeof *b);
    if (!b) return tpd_fail_nomem("the DP byte counts", ((size_t)F + 1) * sizeof *b);
    b[0] = tpd_dp_plan_step_bytes(&tr->dpp, tr->model->plan.grad_size, tr->model->plan.param_size);
    int R = tr->mesh.dp_inner_size / tr->mesh.shard_size; /* HSDP: the shard's all-reduce */
    if (R > 1)
        b[0] += 2.0 * (R - 1.0) / R * (double)tr->dpp.shard_numel * tr->model->plan.grad_size;
    for (int f = 0; f < F; f++)
        b[f + 1] = tpd_diloco_fragment_bytes(tr->diloco, f);
    tpd_comm *w = tr->hcomms.world;
    tpd_status st = TPD_OK;
    if (tpd_comm_size(w) > 1)
        st = tpd_comm_allreduce(w, b, b, (size_t)F + 1, TPD_DTYPE_F64, TPD_COMM_OP_SUM, NULL);
    if (st != TPD_OK) {
        free(b);
        return st;
    }
    tr->dp_bytes_step = b[0];
    tr->outer_bytes_job = b; /* fragment f at b[f + 1] */
    return TPD_OK;
}

tpd_status tpd_trainer_create(const tpd_config *cfg, tpd_comm *world, tpd_trainer **tr_p) {
    tpd_status st = TPD_OK;
    /* Checks that need no communication come first, identically on every rank. */
    TPD_CHECK(tpd_config_check_world(cfg, tpd_comm_size(world)));
    TPD_CHECK(tpd_config_check_trainable(cfg));
    tpd_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) return tpd_fail_nomem("the trainer", sizeof *tr);
    tr->cfg = *cfg;
    tr->save_lock_fd = -1;
    int tp = cfg->parallel.tensor_model_parallel_size;
    int pp = cfg->parallel.pipeline_model_parallel_size;
    int dp = tpd_config_dp(cfg, tpd_comm_size(world));
    tr->M = tpd_config_num_micro_batches(cfg, dp);
    /* context parallelism: the mesh's DP coordinate is DP x CP, CP fastest (Megatron's
     * order); a step's gradients are summed over all of it */
    int cp = tpd_config_cp(cfg);
    TPD_CHECK_GOTO(
        tpd_mesh_init(tpd_comm_size(world), tpd_comm_rank(world), tp, pp, dp * cp, &tr->mesh), st,
        undo_tr);
    TPD_CHECK_GOTO(tpd_mesh_set_cp(&tr->mesh, cp), st, undo_tr);
    /* EP: runs of EP consecutive DP ranks split the experts */
    TPD_CHECK_GOTO(tpd_mesh_set_ep(&tr->mesh, tpd_config_ep(cfg)), st, undo_tr);
    /* DiLoCo: DP is a replica's inner group; the replicas meet in the outer step only */
    TPD_CHECK_GOTO(tpd_mesh_set_replicas(&tr->mesh, tpd_config_dp_replicas(cfg, dp)), st, undo_tr);
    /* HSDP: the shards are spread over shard groups of the DP group, replicated across */
    TPD_CHECK_GOTO(tpd_mesh_set_shard_size(&tr->mesh, tpd_config_dp_shard_engine(cfg, dp)), st,
                   undo_tr);
    tr->sample_stride = (uint64_t)cfg->training.global_batch_size;
    TPD_CHECK_GOTO(tpd_mesh_comms_create(&tr->mesh, world, &tr->hcomms), st, undo_tr);
    tr->comms = tr->hcomms;
    TPD_CHECK_GOTO(locate_on_node(tr, world), st, undo_comms);
    TPD_CHECK_GOTO(create_backend(cfg, tr, &tr->kb), st, undo_comms);
    if (tpd_kern_device_memory(tr->kb))
        TPD_CHECK_GOTO(create_device_comms(tr, world), st, undo_backend);
    const tpd_mesh *ms = &tr->mesh;
    TPD_CHECK_GOTO(
        tpd_model_create(cfg, tr->kb, tr->comms.tp, tp, ms->tp, pp, dp, ms->pp, &tr->model), st,
        undo_backend);
    TPD_CHECK_GOTO(tpd_model_set_cp(tr->model, tr->comms.cp, ms->cp), st, undo_model);
    TPD_CHECK_GOTO(tpd_model_set_ep(tr->model, tr->comms.ep, ms->ep), st, undo_model);
    TPD_CHECK_GOTO(
        tpd_model_dp_plan(cfg, &tr->model->plan.lay, ms->shard_size, ms->dp_shard, &tr->dpp), st,
        undo_model);
    tr->dpp.micro_batches = tr->M;
    /* parallel.grad_reduce_dtype: bf16 on the wire, fp32 sums (fp32 gradients only) */
    TPD_CHECK_GOTO(tpd_dp_plan_set_reduce_dtype(&tr->dpp,
                                                cfg->parallel.grad_reduce_dtype == TPD_REDUCE_BF16
                                                    ? TPD_DTYPE_BF16
                                                    : TPD_DTYPE_F32,
                                                tpd_kern_grad_dtype(tr->kb)),
                   st, undo_dpp);
    if (tr->dpp.shard_numel != tr->model->plan.shard_numel ||
        tr->dpp.numel_padded != tr->model->plan.numel_padded)
        TPD_FAIL_GOTO(TPD_ERR_INTERNAL, st, undo_dpp,
                      "train: DP plan and buffer plan disagree on the shard size");
    TPD_CHECK_GOTO(tpd_model_init_params(tr->model, &tr->dpp), st, undo_dpp);
    TPD_CHECK_GOTO(tpd_model_schedule(cfg, pp, ms->pp, tr->M, &tr->sched), st, undo_dpp);
    TPD_CHECK_GOTO(assign_slots(tr), st, undo_sched);
    TPD_CHECK_GOTO(tpd_grad_sync_create(tr->model, &tr->dpp, &tr->comms,
                                        cfg->parallel.overlap_grad_reduce,
                                        cfg->parallel.overlap_param_gather, &tr->gsync),
                   st, undo_sched);
    tpd_model_set_hook(tr->model, model_hook, tr);
    if (cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO)
        TPD_CHECK_GOTO(tpd_diloco_create(tr->model, &tr->dpp, cfg, tr->comms.dp_outer, &tr->diloco),
                       st, undo_sched);
    TPD_CHECK_GOTO(count_dp_bytes(tr), st, undo_sched);

    TPD_CHECK_GOTO(tpd_data_source_open(cfg->data.data_path, cfg->model.vocab_size, &tr->data), st,
                   undo_sched);
    TPD_CHECK_GOTO(tpd_blend_sampler_init(&tr->data, cfg->data.split, TPD_SPLIT_TRAIN,
                                          cfg->model.seq_length, cfg->data.shuffle,
                                          cfg->training.seed, &tr->train_sampler),
                   st, undo_data);
    /* logging.eval_interval asks for validation: a valid split that cannot give one
     * sample is an error here, before any step, not a run without validation */
    if (cfg->logging.eval_interval > 0) {
        TPD_CHECK_GOTO(tpd_blend_sampler_init(&tr->data, cfg->data.split, TPD_SPLIT_VALID,
                                              cfg->model.seq_length, 0, cfg->training.seed,
                                              &tr->valid_sampler),
                       st, undo_train_sampler);
        tr->has_valid = 1;
    }
    tr->batch = malloc((size_t)cfg->training.micro_batch_size * (cfg->model.seq_length + 1) * 4);
    if (!tr->batch) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, undo_samplers, "train: out of memory");
    tr->is_logger = ms->pp == pp - 1 && ms->tp == 0 && ms->dp == 0;
    tr->saved_iteration = -1;
    tpd_ckpt_view view = {&tr->cfg,         tr->model,     &tr->dpp, &tr->mesh,
                          tr->hcomms.world, tr->is_logger, tr->gsync};
    TPD_CHECK_GOTO(tpd_ckpt_saver_create(&view, &tr->saver), st, undo_batch);
    if (cfg->checkpoint.save[0]) TPD_CHECK_GOTO(tpd_trainer_lock_save_dir(tr), st, undo_saver);
    /* checkpoint.load: parameters, optimizer state and counters replace the fresh ones */
    int continues = 0;
    TPD_CHECK_GOTO(tpd_ckpt_resume(&view, &tr->counters, &continues, tr->loaded_dir), st,
                   undo_saver);
    tr->continues = continues;
    if (continues) tr->saved_iteration = tr->counters.iteration;
    *tr_p = tr;
    return TPD_OK;
undo_saver:
    tpd_ckpt_unlock_save_dir(tr->save_lock_fd);
    tpd_ckpt_saver_destroy(tr->saver);
undo_batch:
    free(tr->batch);
undo_samplers:
    if (tr->has_valid) tpd_blend_sampler_free(&tr->valid_sampler);
undo_train_sampler:
    tpd_blend_sampler_free(&tr->train_sampler);
undo_data:
    tpd_data_source_close(&tr->data);
undo_sched:
    free(tr->outer_bytes_job);
    (void)tpd_diloco_destroy(tr->diloco);
    (void)tpd_grad_sync_destroy(tr->gsync);
    free(tr->where);
    tpd_pp_schedule_free(&tr->sched);
undo_dpp:
    tpd_dp_plan_free(&tr->dpp);
undo_model:
    tpd_model_destroy(tr->model);
undo_backend:
    if (tr->device_comms) destroy_device_comms(tr);
    tpd_kern_backend_destroy(tr->kb);
undo_comms:
    tpd_mesh_comms_destroy(&tr->hcomms);
undo_tr:
    free(tr);
    return st;
}

void tpd_trainer_destroy(tpd_trainer *tr) {
    if (!tr) return;
    tpd_status st = TPD_OK;
    tpd_ckpt_saver_destroy(tr->saver); /* a save in flight after an error: never committed */
    tpd_ckpt_unlock_save_dir(tr->save_lock_fd); /* after the last save */
    if (tr->metrics) fclose(tr->metrics);
    tpd_tb_close(tr->tb);
    free(tr->batch);
    if (tr->has_valid) tpd_blend_sampler_free(&tr->valid_sampler);
    tpd_blend_sampler_free(&tr->train_sampler);
    tpd_data_source_close(&tr->data);
    free(tr->outer_bytes_job);
    TPD_CHECK_KEEP(tpd_diloco_destroy(tr->diloco), st);
    TPD_CHECK_KEEP(tpd_grad_sync_destroy(tr->gsync), st);
    free(tr->where);
    tpd_pp_schedule_free(&tr->sched);
    tpd_dp_plan_free(&tr->dpp);
    tpd_model_destroy(tr->model);
    if (tr->device_comms) destroy_device_comms(tr);
    tpd_kern_backend_destroy(tr->kb);
    tpd_mesh_comms_destroy(&tr->hcomms);
    free(tr);
    if (st != TPD_OK) tpd_log_error("train: communication still in flight failed at shutdown");
}

/* ---- executor callbacks ---- */

/* Where (j, chunk) lives. Evaluation runs one (micro-batch, chunk) per executor call, on
 * slot 0 and head 0. */
static tpd_model_mb at_of(const tpd_trainer *tr, int j, int chunk) {
    if (tr->evaluating) return (tpd_model_mb){chunk, 0, tr->model->d.last ? 0 : -1};
    return tr->where[(size_t)j * (size_t)tr->sched.virtual_stages + (size_t)chunk];
}

static tpd_status cb_forward(void *user, int j, int chunk) {
    tpd_trainer *tr = user;
    tpd_model *m = tr->model;
    tpd_model_mb at = at_of(tr, j, chunk);
    int B = m->d.B, T = m->d.T, v = m->d.v;
    int reads_data = (m->d.first && chunk == 0) || (m->d.last && chunk == v - 1);
    if (reads_data) {
        /* micro-batch j of this DP rank's contiguous share of the global batch (whole
         * samples: under CP the model keeps its chunks of them) */
        for (int b = 0; b < B; b++)
            TPD_CHECK(tpd_blend_sampler_get(tr->cur_sampler, tr->cur_base + (uint64_t)j * B + b,
                                            tr->batch + (size_t)b * (m->d.Tg + 1)));
        TPD_CHECK(tpd_model_set_batch(m, &at, tr->batch));
    }
    TPD_CHECK(tpd_model_forward(m, &at));
    /* the micro-batch's mean loss is added up on the backend: read once, in finish_loss */
    if (m->d.last && chunk == v - 1) TPD_CHECK(tpd_model_loss_acc(m, &at, (double)B * T));
    return TPD_OK;
}

static tpd_status cb_backward(void *user, int j, int chunk) {
    tpd_trainer *tr = user;
    tpd_model_mb at = at_of(tr, j, chunk);
    /* mean over the micro-batch's tokens, scaled by 1/(M*DP): the DP reduction is a sum
     * (over a replica's inner group under DiLoCo) */
    double N = (double)tr->model->d.B * tr->model->d.T;
    float dloss = (float)(1.0 / (N * tr->M * tr->mesh.dp_inner_size));
    /* every list runs a chunk's micro-batches in order: M-1 is its last */
    tr->final_mb = j == tr->M - 1;
    tpd_status st = tpd_model_backward(tr->model, &at, dloss);
    tr->final_mb = 0;
    return st;
}

static tpd_status cb_weight_grad(void *user, int j, int chunk) {
    tpd_trainer *tr = user;
    tpd_model_mb at = at_of(tr, j, chunk);
    tr->final_mb = j == tr->M - 1;
    tpd_status st = tpd_model_weight_grad(tr->model, &at);
    tr->final_mb = 0;
    return st;
}

static void *cb_act_out(void *user, int j, int chunk) {
    tpd_trainer *tr = user;
    tpd_model_mb at = at_of(tr, j, chunk);
    return tpd_model_stage_output(tr->model, &at);
}
static void *cb_act_in(void *user, int j, int chunk) {
    tpd_trainer *tr = user;
    tpd_model_mb at = at_of(tr, j, chunk);
    return tpd_model_stage_input(tr->model, &at);
}
static void *cb_grad_out(void *user, int j, int chunk) {
    (void)j;
    (void)chunk;
    return tpd_model_grad_out(((tpd_trainer *)user)->model);
}
static void *cb_grad_in(void *user, int j, int chunk) {
    (void)j;
    (void)chunk;
    return tpd_model_grad_in(((tpd_trainer *)user)->model);
}

static void cb_on_action(void *user, const tpd_pp_action *a, double t0, double t1) {
    tpd_trainer *tr = user;
    if (tr->observer) tr->observer(tr->observer_user, a, t0, t1);
}

static tpd_pp_exec_ops exec_ops(tpd_trainer *tr) {
    tpd_pp_exec_ops ops = {.user = tr,
                           .forward = cb_forward,
                           .backward = cb_backward,
                           .weight_grad = cb_weight_grad,
                           .act_out = cb_act_out,
                           .act_in = cb_act_in,
                           .grad_out = cb_grad_out,
                           .grad_in = cb_grad_in,
                           .on_action = tr->observer ? cb_on_action : NULL};
    return ops;
}

static size_t p2p_count(const tpd_trainer *tr) {
    return (size_t)tr->model->d.Nl * tr->model->d.C; /* this TP rank's rows under SP */
}

/* Mean loss over DP of the per-micro-batch means accumulated on the last stage, made
 * known to every rank (broadcast from the last stage over PP). */
static tpd_status finish_loss(tpd_trainer *tr, int micro_batches, double *loss_p) {
    TPD_CHECK(tpd_model_loss_take(tr->model, &tr->loss_acc));
    float v = (float)(tr->loss_acc / micro_batches);
    tpd_comm *dp = tr->hcomms.dp, *pp = tr->hcomms.pp, *outer = tr->hcomms.dp_outer;
    if (tpd_comm_size(dp) > 1) {
        TPD_CHECK(tpd_comm_allreduce(dp, &v, &v, 1, TPD_DTYPE_F32, TPD_COMM_OP_SUM, NULL));
        v /= (float)tpd_comm_size(dp);
    }
    /* DiLoCo: the replicas' means (inner, then across them) */
    if (outer && tpd_comm_size(outer) > 1) {
        TPD_CHECK(tpd_comm_allreduce(outer, &v, &v, 1, TPD_DTYPE_F32, TPD_COMM_OP_SUM, NULL));
        v /= (float)tpd_comm_size(outer);
    }
    if (tpd_comm_size(pp) > 1)
        TPD_CHECK(tpd_comm_broadcast(pp, &v, 1, TPD_DTYPE_F32, tpd_comm_size(pp) - 1, NULL));
    *loss_p = v;
    return TPD_OK;
}

/* The mixture of experts' statistics of the step, from every rank's sums (collective over
 * the world when the model has experts). */
static tpd_status finish_moe(tpd_trainer *tr, tpd_step_stats *s) {
    tpd_model *m = tr->model;
    int E = m->d.E;
    if (!E) return TPD_OK;
    size_t n = 5 + (size_t)E;
    double *v = calloc(n, sizeof *v);
    if (!v) return tpd_fail_nomem("the MoE statistics", n * sizeof *v);
    tpd_model_moe_stats *ms = &m->moe;
    v[0] = ms->aux;
    v[1] = ms->aux_raw;
    v[2] = ms->z;
    v[3] = ms->dropped;
    v[4] = ms->assigned;
    memcpy(v + 5, ms->load, (size_t)E * sizeof *v);
    tpd_status st = TPD_OK;
    if (tpd_comm_size(tr->hcomms.world) > 1)
        st = tpd_comm_allreduce(tr->hcomms.world, v, v, n, TPD_DTYPE_F64, TPD_COMM_OP_SUM, NULL);
    if (st == TPD_OK) {
        /* per micro-batch of the global batch: M on each of the data-parallel ranks */
        double mb = (double)tr->M * tr->mesh.data_dp_size * tr->mesh.replicas;
        double mean = 0, hi = 0, lo = INFINITY;
        for (int e = 0; e < E; e++)
            mean += v[5 + e] / E;
        for (int e = 0; e < E; e++) {
            if (v[5 + e] > hi) hi = v[5 + e];
            if (v[5 + e] < lo) lo = v[5 + e];
        }
        s->moe = 1;
        s->moe_aux_loss = v[0] / mb;
        /* per MoE layer: every model.moe_layer_freq-th */
        s->moe_aux_raw =
            v[1] / (mb * tpd_config_moe_layers_before(&m->cfg, m->cfg.model.num_layers));
        s->moe_z_loss = v[2] / mb;
        s->moe_dropped = v[4] > 0 ? v[3] / v[4] : 0;
        s->moe_load_max = mean > 0 ? hi / mean : 0;
        s->moe_load_min = mean > 0 ? lo / mean : 0;
    }
    free(v);
    return st;
}

tpd_status tpd_trainer_step(tpd_trainer *tr, tpd_step_stats *stats_p) {
    tpd_model *m = tr->model;
    tpd_step_stats s = {0};
    double t0 = tpd_clock_s();
    int it = tr->counters.iteration;
    int GB = tr->cfg.training.global_batch_size, dp = tr->mesh.data_dp_size;
    tr->cur_sampler = &tr->train_sampler;
    /* the CP ranks of a sequence read the same samples */
    tr->cur_base = (uint64_t)it * tr->sample_stride + tr->sample_offset +
                   (uint64_t)tr->mesh.data_dp * (GB / dp);
    tr->loss_acc = 0;

    TPD_CHECK(tpd_diloco_poll(tr->diloco));
    TPD_CHECK(tpd_model_zero_grads(m));
    if (m->d.E) { /* the step's MoE statistics (an evaluation's forwards do not count) */
        tpd_model_moe_stats *ms = &m->moe;
        ms->aux = ms->aux_raw = ms->z = ms->dropped = ms->assigned = 0;
        memset(ms->load, 0, (size_t)m->d.E * sizeof *ms->load);
    }
    tr->tp_comm_acc = 0;
    tpd_model_set_tp_timer(m, &tr->tp_comm_acc);
    tpd_grad_sync_begin(tr->gsync);
    tpd_pp_exec_ops ops = exec_ops(tr);
    TPD_CHECK(tpd_pp_execute(&tr->sched, tr->comms.pp, &ops, p2p_count(tr),
                             tpd_kern_act_dtype(tr->kb), tpd_kern_stream(tr->kb), &s.pipe));
    /* the parameter gathers that the forward waited for (inside the compute time) */
    s.t_param_wait_s = tpd_grad_sync_take_exposed(tr->gsync);
    double t1 = tpd_clock_s();
    tpd_model_set_tp_timer(m, NULL);
    s.t_tp_comm_s = tr->tp_comm_acc;
    TPD_CHECK(tpd_grad_sync_finish(tr->gsync));
    double t2 = tpd_clock_s();
    (void)tpd_grad_sync_take_exposed(tr->gsync); /* = t2 - t1 */
    TPD_CHECK(tpd_optim_grad_norm(m, &tr->dpp, &tr->hcomms, &s.grad_norm));
    /* the loss is known on every rank before the update, so that both checks agree */
    TPD_CHECK(finish_loss(tr, tr->M, &s.lm_loss));
    TPD_CHECK(finish_moe(tr, &s));
    s.lr = tpd_lr_at(&tr->cfg, it);
    /* Megatron's check: a non-finite loss or gradient norm skips the update (the same
     * verdict on every rank: both values are global) */
    /* DiLoCo: each replica has its own norm; the replicas skip together */
    int32_t bad = !isfinite(s.grad_norm) || !isfinite(s.lm_loss);
    tpd_comm *outer = tr->hcomms.dp_outer;
    if (outer && tpd_comm_size(outer) > 1)
        TPD_CHECK(tpd_comm_allreduce(outer, &bad, &bad, 1, TPD_DTYPE_I32, TPD_COMM_OP_MAX, NULL));
    if (bad) {
        s.skipped = 1;
        tr->counters.skipped_iterations++;
        tr->skipped_in_a_row++;
    } else {
        tr->skipped_in_a_row = 0;
        double clip = tr->cfg.optimizer.clip_grad, scale = 1.0;
        if (clip > 0 && s.grad_norm > clip) scale = clip / (s.grad_norm + 1e-6);
        TPD_CHECK(
            tpd_optim_update(m, &tr->dpp, s.lr, scale, it + 1 - tr->counters.skipped_iterations));
    }
    /* DiLoCo: the outer step of the fragment due now, before the parameters go out */
    s.outer_started = s.outer_applied = -1;
    if (tr->diloco) {
        tpd_diloco_stats ds;
        TPD_CHECK(tpd_diloco_after_step(tr->diloco, it + 1, &ds));
        s.outer_started = ds.started;
        s.outer_applied = ds.applied;
        s.outer_rank_bytes = ds.bytes_sent;
        s.t_outer_s = ds.wait_s;
        if (ds.started >= 0) s.dp_outer_bytes = tr->outer_bytes_job[ds.started + 1];
    }
    s.dp_bytes = tr->dp_bytes_step + s.dp_outer_bytes;
    /* ZeRO-1: the updated parts go out to the other DP ranks (waited for here, or by the
     * next step's forward under overlap_param_gather) */
    TPD_CHECK(tpd_grad_sync_gather_params(tr->gsync));
    double gather_wait = tpd_grad_sync_take_exposed(tr->gsync);
    s.t_param_wait_s += gather_wait;
    s.params_norm = NAN;
    if (tr->cfg.logging.log_params_norm)
        TPD_CHECK(tpd_optim_params_norm(m, &tr->dpp, &tr->hcomms, &s.params_norm));
    TPD_CHECK(tpd_kern_synchronize(tr->kb));
    double t3 = tpd_clock_s();
    tr->counters.iteration++;
    tr->counters.consumed_samples += (uint64_t)GB;
    s.iteration = tr->counters.iteration;
    s.t_reduce_s = t2 - t1;
    s.t_optim_s = t3 - t2 - gather_wait;
    s.elapsed_s = tpd_clock_s() - t0;
    if (stats_p) *stats_p = s;
    return TPD_OK;
}

/* Mean loss of `iters` global batches of sampler s, forward only. */
static tpd_status evaluate_on(tpd_trainer *tr, tpd_blend_sampler *s, int iters, double *loss_p) {
    int GB = tr->cfg.training.global_batch_size, dp = tr->mesh.data_dp_size;
    int stages = tr->mesh.pp_size, stage = tr->mesh.pp, v = tr->sched.virtual_stages;
    TPD_CHECK(tpd_grad_sync_params_all(tr->gsync));
    tpd_pp_exec_ops ops = exec_ops(tr);
    tr->cur_sampler = s;
    tr->loss_acc = 0;
    tr->evaluating = 1;
    tpd_status st = TPD_OK;
    /* Forward only, one (micro-batch, chunk) at a time: each executor call completes its
     * sends, so every call can use slot 0. */
    tpd_pp_action acts[3];
    for (int e = 0; e < iters && st == TPD_OK; e++) {
        tr->cur_base = (uint64_t)e * GB + (uint64_t)tr->mesh.data_dp * (GB / dp);
        for (int j = 0; j < tr->M && st == TPD_OK; j++) {
            for (int c = 0; c < v && st == TPD_OK; c++) {
                int n = 0;
                if (stage > 0 || c > 0)
                    acts[n++] =
                        (tpd_pp_action){.kind = TPD_PP_RECV_ACT, .micro_batch = j, .chunk = c};
                acts[n++] = (tpd_pp_action){.kind = TPD_PP_FWD, .micro_batch = j, .chunk = c};
                if (stage < stages - 1 || c < v - 1)
                    acts[n++] =
                        (tpd_pp_action){.kind = TPD_PP_SEND_ACT, .micro_batch = j, .chunk = c};
                tpd_pp_schedule one = {.stages = stages,
                                       .stage = stage,
                                       .micro_batches = tr->M,
                                       .virtual_stages = v,
                                       .split_backward = 0,
                                       .count = n,
                                       .actions = acts};
                st = tpd_pp_execute(&one, tr->comms.pp, &ops, p2p_count(tr),
                                    tpd_kern_act_dtype(tr->kb), tpd_kern_stream(tr->kb), NULL);
            }
        }
    }
    tr->evaluating = 0;
    TPD_CHECK(st);
    return finish_loss(tr, tr->M * iters, loss_p);
}

tpd_status tpd_trainer_evaluate(tpd_trainer *tr, double *val_loss_p) {
    if (!tr->has_valid) {
        *val_loss_p = NAN;
        return TPD_OK;
    }
    return evaluate_on(tr, &tr->valid_sampler, tr->cfg.logging.eval_iters, val_loss_p);
}

tpd_status tpd_trainer_evaluate_split(tpd_trainer *tr, tpd_split split, int iters, double *loss_p) {
    const tpd_config *cfg = &tr->cfg;
    tpd_blend_sampler s;
    /* the validation sampler of training, or its twin on another split */
    TPD_CHECK(tpd_blend_sampler_init(&tr->data, cfg->data.split, split, cfg->model.seq_length, 0,
                                     cfg->training.seed, &s));
    tpd_status st = evaluate_on(tr, &s, iters, loss_p);
    tpd_blend_sampler_free(&s);
    return st;
}

tpd_status tpd_trainer_job_timers(tpd_trainer *tr, const tpd_step_stats *s, tpd_step_timers *t) {
    /* the largest of each over the job, s */
    enum { MX_COMPUTE, MX_TP_COMM, MX_PP_WAIT, MX_REDUCE, MX_PARAM_WAIT, MX_OPTIM, MX_COUNT };
    double mx[MX_COUNT] = {
        [MX_COMPUTE] = s->pipe.compute_s,    [MX_TP_COMM] = s->t_tp_comm_s,
        [MX_PP_WAIT] = s->pipe.wait_s,       [MX_REDUCE] = s->t_reduce_s,
        [MX_PARAM_WAIT] = s->t_param_wait_s, [MX_OPTIM] = s->t_optim_s,
    };
    /* sums over the job of the pipeline's compute and of its whole time, s */
    double sum[2] = {s->pipe.compute_s, s->pipe.total_s};
    tpd_comm *w = tr->hcomms.world;
    if (tpd_comm_size(w) > 1) {
        TPD_CHECK(tpd_comm_allreduce(w, mx, mx, MX_COUNT, TPD_DTYPE_F64, TPD_COMM_OP_MAX, NULL));
        TPD_CHECK(tpd_comm_allreduce(w, sum, sum, 2, TPD_DTYPE_F64, TPD_COMM_OP_SUM, NULL));
    }
    *t = (tpd_step_timers){
        .compute_ms = 1e3 * mx[MX_COMPUTE],
        .tp_comm_ms = 1e3 * mx[MX_TP_COMM],
        .pp_wait_ms = 1e3 * mx[MX_PP_WAIT],
        .idle_fraction = sum[1] > 0 ? 1.0 - sum[0] / sum[1] : 0.0,
        .reduce_ms = 1e3 * mx[MX_REDUCE],
        .param_wait_ms = 1e3 * mx[MX_PARAM_WAIT],
        .optimizer_ms = 1e3 * mx[MX_OPTIM],
    };
    return TPD_OK;
}

tpd_status tpd_trainer_sync_params(tpd_trainer *tr) {
    return tpd_grad_sync_params_all(tr->gsync);
}

tpd_status tpd_trainer_params_f32(tpd_trainer *tr, float *out) {
    return tpd_grad_sync_params_f32(tr->gsync, out);
}

/* The first DP copy of tensor p's elements: DP rank 0, or under EP for the experts the first
 * rank of their expert-DP group. */
static int dp_first(const tpd_trainer *tr, tpd_param p) {
    return (tpd_param_is_expert(p) ? tr->mesh.edp : tr->mesh.dp) == 0;
}

/* One copy over TP and the stages: TP rank 0 of a replicated tensor, the first stage's
 * tied wte. */
static int one_copy(const tpd_trainer *tr, tpd_param p) {
    return (tpd_param_get_info(p)->split != TPD_SPLIT_NONE || tr->mesh.tp == 0) &&
           (p != TPD_P_WTE || tr->model->d.first);
}

/* Tensor p's local rows of the flat buffer `local` at their global places in `global`. */
static void place_rows(const tpd_model_layout *lay, tpd_param p, const float *local,
                       float *global) {
    const tpd_param_slice *s = &lay->p[p];
    int64_t rows = (int64_t)s->layers * s->rows;
    for (int64_t r = 0; r < rows; r++) {
        int64_t g = tpd_model_layout_row_global(lay, p, r);
        if (g >= 0)
            memcpy(global + g, local + tpd_model_layout_row_local(lay, p, r), (size_t)s->cols * 4);
    }
}

/* Sums every rank's contributions (each element from one rank) over the world; world rank
 * 0 copies the tensor to out. */
static tpd_status sum_to_rank0(tpd_trainer *tr, float *global, size_t gn, float *out) {
    TPD_CHECK(tpd_comm_allreduce(tr->hcomms.world, global, global, gn, TPD_DTYPE_F32,
                                 TPD_COMM_OP_SUM, NULL));
    if (out && tr->mesh.rank == 0) memcpy(out, global, gn * 4);
    return TPD_OK;
}

tpd_status tpd_trainer_gather_param(tpd_trainer *tr, tpd_param p, float *out) {
    TPD_CHECK(tpd_trainer_sync_params(tr));
    const tpd_model *m = tr->model;
    const tpd_model_layout *lay = &m->plan.lay;
    const tpd_param_slice *s = &lay->p[p];
    size_t gn = tpd_model_layout_global_numel(lay, p);
    tpd_status st = TPD_OK;
    float *global = calloc(gn, sizeof *global);                     /* (g_layers, g_rows, g_cols) */
    float *local = calloc(m->plan.numel_padded + 1, sizeof *local); /* the flat buffer */
    if (!global || !local) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "gather: out of memory");
    /* One contributor per element: dp 0 (for the experts under EP, the first rank of each
     * expert-DP group), and tp 0 for replicated tensors, and the first stage for the tied
     * wte. */
    int contributes = s->present && dp_first(tr, p) && one_copy(tr, p);
    /* every DP rank takes part where the parameters are sharded */
    TPD_CHECK_GOTO(tpd_grad_sync_params_f32(tr->gsync, local), st, out);
    if (contributes) {
        place_rows(lay, p, local, global);
    }
    TPD_CHECK_GOTO(sum_to_rank0(tr, global, gn, out), st, out);
out:
    free(local);
    free(global);
    return st;
}

tpd_status tpd_trainer_gather_master(tpd_trainer *tr, tpd_param p, float *out) {
    const tpd_model *m = tr->model;
    const tpd_mesh *ms = &tr->mesh;
    if (!m->master && tpd_kern_param_dtype(m->kb) != TPD_DTYPE_F32)
        return tpd_fail(TPD_ERR_UNSUPPORTED, "gather: %s parameters without fp32 master weights",
                        tpd_dtype_name(tpd_kern_param_dtype(m->kb)));
    TPD_CHECK(tpd_trainer_sync_params(tr));
    const tpd_model_layout *lay = &m->plan.lay;
    const tpd_param_slice *s = &lay->p[p];
    size_t gn = tpd_model_layout_global_numel(lay, p);
    tpd_status st = TPD_OK;
    float *global = calloc(gn ? gn : 1, sizeof *global);            /* (g_layers, g_rows, g_cols) */
    float *local = calloc(m->plan.numel_padded + 1, sizeof *local); /* the flat buffer */
    if (!global || !local) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "gather: out of memory");
    /* The owner of an element: with ZeRO the rank of the first shard group (and replica)
     * whose shard holds it, without ZeRO DP rank 0; then, as for the parameters, TP rank 0
     * of a replicated tensor and the first stage for the tied wte. Elements outside this
     * rank's owned ranges stay 0 and add nothing to the sum. */
    int owner = tr->dpp.zero ? ms->replica == 0 && ms->dp_rep == 0 : dp_first(tr, p);
    int contributes = owner && s->present && one_copy(tr, p);
    if (contributes) {
        for (int i = 0; i < tr->dpp.nranges; i++) {
            const tpd_dp_range *rg = &tr->dpp.ranges[i];
            const void *src = m->master ? (const void *)(m->master + rg->state)
                                        : tpd_model_owned_param(m, rg->begin, rg->state);
            TPD_CHECK_GOTO(tpd_kern_copy_to_host(m->kb, local + rg->begin, src,
                                                 (rg->end - rg->begin) * sizeof(float)),
                           st, out);
        }
        place_rows(lay, p, local, global);
    }
    TPD_CHECK_GOTO(sum_to_rank0(tr, global, gn, out), st, out);
out:
    free(local);
    free(global);
    return st;
}

/* ---- accessors ---- */

void tpd_trainer_set_samples(tpd_trainer *tr, uint64_t stride, uint64_t offset) {
    tr->sample_stride = stride;
    tr->sample_offset = offset;
}

void tpd_trainer_set_observer(tpd_trainer *tr, tpd_trainer_observer fn, void *user) {
    tr->observer = fn;
    tr->observer_user = fn ? user : NULL;
}

const tpd_config *tpd_trainer_config(const tpd_trainer *tr) {
    return &tr->cfg;
}

const tpd_mesh *tpd_trainer_mesh(const tpd_trainer *tr) {
    return &tr->mesh;
}

const tpd_mesh_comms *tpd_trainer_host_comms(const tpd_trainer *tr) {
    return &tr->hcomms;
}

tpd_model *tpd_trainer_model(const tpd_trainer *tr) {
    return tr->model;
}

const tpd_data_source *tpd_trainer_data(const tpd_trainer *tr) {
    return &tr->data;
}

int tpd_trainer_micro_batches(const tpd_trainer *tr) {
    return tr->M;
}

int tpd_trainer_iteration(const tpd_trainer *tr) {
    return tr->counters.iteration;
}

uint64_t tpd_trainer_consumed_samples(const tpd_trainer *tr) {
    return tr->counters.consumed_samples;
}

int tpd_trainer_is_logger(const tpd_trainer *tr) {
    return tr->is_logger;
}

int tpd_trainer_interrupted(const tpd_trainer *tr) {
    return tr->interrupted;
}

int tpd_trainer_failed_together(const tpd_trainer *tr) {
    return tr->failed_together;
}

int tpd_trainer_save_in_flight(const tpd_trainer *tr) {
    return tpd_ckpt_saver_in_flight(tr->saver);
}

double tpd_trainer_flops_per_iteration(const tpd_trainer *tr) {
    return tpd_model_flops(&tr->cfg, tr->cfg.training.global_batch_size, tr->model->d.Vp);
}
