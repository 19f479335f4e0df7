/* The model (GPT-2, or the Llama block: engine/model/model_layout.h) on one rank of a
 * TP x PP x DP mesh: this stage's layers (those of its v model chunks under the interleaved
 * schedule), this TP rank's slices.
 *
 * Buffers are allocated once at creation, one block per category, in exactly the sizes
 * of the buffer plan that `tripod plan` also reports (tpd_model_memory): parameters,
 * gradients (mirroring them), optimizer state and master weights (this rank's ZeRO-1
 * shard), activations for the schedule's peak number of in-flight (micro-batch, chunk)
 * pairs ("slots", shared by the chunks) plus the last stage's head blocks, and one
 * workspace of activation gradients.
 *
 * Forward and backward of one (micro-batch, chunk) run on one slot. The pipeline executor
 * moves chunk inputs and outputs between virtual stages; this file never talks to other
 * stages, only to its TP group (through parallel/tensor). */
#ifndef TPD_ENGINE_MODEL_H
#define TPD_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/config/config.h"
#include "engine/model/model_layout.h"
#include "engine/model/model_memory.h"
#include "kernels/kernels.h"
#include "parallel/data/dp.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/tensor/tp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Byte offsets inside one layer's block of a slot. Nl = N, or N/tp under sequence
 * parallel (dims.Nl): the rows this rank keeps of the LayerNorm and residual regions. */
typedef struct tpd_act_layer {
    size_t ln1, ln1_mean, ln1_rstd; /* (Nl,C) act, (Nl) f32 (LayerNorm only), (Nl) f32 */
    size_t qkv;                     /* (N,QKVl): the local Q, K, V heads (after RoPE) */
    size_t qkn_raw, qkn_rstd;       /* QK norm: (N,NHl+KVl,HS) act, the Q and K heads before
                                       it; (N,NHl+KVl) f32 (0 bytes without it) */
    size_t atty;                    /* (N,C/tp) */
    size_t att;                     /* backend's saved attention state (not under
                                       selective recompute: w_att) */
    size_t x1;                      /* (Nl,C) residual after attention */
    size_t ln2, ln2_mean, ln2_rstd; /* (Nl,C), (Nl), (Nl) */
    size_t fch, fch_gelu;           /* (N,F/tp) before and after GELU; under SwiGLU fch is
                                       (N,2F/tp) [gate | up] and fch_gelu their product (F the
                                       larger of the dense MLP's and the shared experts' width:
                                       dims Fml, FCml) */
    size_t out;                     /* (Nl,C) layer output */
    size_t bytes_dense;             /* a dense layer's block: up to here (the MoE regions
                                       follow, for a MoE layer's) */
    /* mixture of experts (engine/model/model_moe.c), Nk = N*k token-expert assignments:
     * the router's softmax (N,E) and log-sum-exp (N) fp32; each assignment's expert (N,k)
     * int32, weight (N,k) fp32 and row in the expert order (N,k) int32, -1 when dropped;
     * per expert-order row its token (Nk) int32 and weight (Nk) fp32; the experts' row
     * counts (E) and the kept rows (1) int32; the rows in expert order (Nk,C), the experts'
     * fc output (Nk,FCel) and activation (Nk,Fel), their (partial over TP) output (Nk,C);
     * the shared experts' output (N,C) and gate (N) fp32.
     * Under expert parallelism (EP > 1) the experts' side holds the rows it received from
     * its EP group, at most R = EP N min(k, El) (every token of every EP rank choosing
     * experts here, dropless): moe_x (R,C), moe_h (R,FCel) and moe_hact (R,Fel); moe_y
     * stays this rank's assignments' outputs, back from the experts (Nk,C); moe_ecounts
     * (EP, El) int32: the rows received from each EP rank for each local expert. */
    size_t moe_probs, moe_lse, moe_topi, moe_topw, moe_pos, moe_order, moe_wperm, moe_counts;
    size_t moe_x, moe_h, moe_hact, moe_y, moe_shout, moe_gate, moe_ecounts;
    size_t bytes; /* a MoE layer's block (a dense model's: bytes_dense) */
} tpd_act_layer;

/* Sizes and offsets of every buffer of a rank; pure arithmetic. */
typedef struct tpd_buffer_plan {
    tpd_model_layout lay;
    size_t act_size, param_size, grad_size; /* dtype bytes */
    int has_master;
    size_t numel_padded; /* parameter and gradient elements, padded for DP */
    size_t shard_numel;  /* optimizer-state elements on this rank */
    /* parallel.data_parallel_sharding_strategy as the buffers follow it: optim_grads and
     * optim_grads_params only with DP > 1 (tpd_model_dp_plan). Under optim_grads the
     * gradients are this rank's shard (shard_numel, unit-aligned), and each unit's
     * gradients of a micro-batch are written into a staging slot of the grad pool
     * (pool_grads slots of gslot_numel), reduce-scattered into the shard and the slot
     * zeroed; the embedding unit (wte, wpe: written by the head of a tied model and by the
     * embedding, and summed between the first and last stage) keeps its own slot of
     * eslot_numel for the whole step, reduced after the pipeline. Under optim_grads_params
     * the parameters too are this rank's shard, and a unit's full parameters live in one
     * of pool_params slots of pslot_numel (the fsdp_units_in_flight units gathered at
     * once, prefetch included; at least 2: a tied head reads wte and the final norm) from
     * just before a forward or backward reads them until it is done. */
    /* Under a split backward (ZB-H1) a layer's gradient slot stays open from B to W (its
     * micro-batches share it, and it is reduced when the last W is done), so the grad pool
     * holds the layers of the schedule's most pending W passes besides its two. */
    /* Under EP each layer's experts are a unit of their own, cut over expert DP: with its
     * layer's unit it takes an expert slot of xslot_numel beside the layer's slot, from
     * pools of pool_params (parameters) and pool_grads (gradients) such slots. */
    int sharding;
    size_t pslot_numel, gslot_numel, eslot_numel, xslot_numel;
    int pool_params, pool_grads;
    int nslots;       /* activation slots: the most (micro-batch, chunk) pairs the stage's
                         action list holds at once (tpd_pp_schedule_peak_in_flight:
                         min(PP - stage, M) under 1F1B, min(PP, M) under ZB-H1) */
    int nheads;       /* last stage: head blocks (final LayerNorm, logits, loss), the most
                         micro-batches of its last chunk between FWD and BWD; 0 elsewhere */
    int split;        /* ZB-H1: the backward is split into B (input gradients) and W
                         (the four linear layers' weight and bias gradients); between
                         them the slot keeps W's inputs and output gradients */
    size_t att_saved; /* bytes per layer per micro-batch */
    /* training.recompute: full, on the first recompute[c] layers of each model chunk c
     * (all, or training.recompute_num_layers). A slot keeps only those layers' outputs (the
     * next layer's input); the backward recomputes each of them into the one shared layer
     * block w_layer. The other layers keep their blocks at s_layers. */
    int recompute[TPD_CONFIG_MAX_STAGES];
    int recompute_max; /* over chunks: the slot has room for this many outputs */
    int selective;     /* training.recompute: selective (Korthikanti et al.). The saved
                          attention state (the cpu backend's (B,NH/tp,T,T) probabilities)
                          is not kept; the backward recomputes the attention forward into
                          the one shared block w_att. */
    /* slot (one (micro-batch, chunk) of any chunk: sized for the largest chunk): */
    size_t s_tokens, s_targets; /* (N) int32 each */
    size_t s_x0;                /* (Nl,C) chunk input */
    size_t s_outs;              /* recompute: recompute_max x (Nl,C) layer outputs */
    size_t s_layers;            /* block of the chunk's first layer not recomputed */
    tpd_act_layer layer;
    size_t slot_bytes;
    /* head block (last stage), after the nslots slots: */
    size_t h_lnf, h_lnf_mean, h_lnf_rstd; /* (Nl,C), (Nl), (Nl) */
    size_t h_logits;                      /* (N, Vp/tp) logits, then dlogits in place */
    size_t h_xstats;                      /* (3N) f32: max, sumexp, target logit */
    size_t h_loss;                        /* (N) f32 */
    size_t head_bytes;
    /* workspace (one, shared by all slots): */
    size_t w_dres, w_dtmp; /* (Nl,C) each: the residual stream's gradient */
    size_t w_dln;          /* (N,C) gradient of a LayerNorm output (under SP, the
                              partial sum before the reduce-scatter) */
    size_t w_dqkv;         /* (N,3C/tp) */
    size_t w_datty;        /* (N,C/tp) */
    size_t w_dfch;         /* (N,F/tp) */
    size_t w_dglu;         /* SwiGLU: (N,2F/tp) gradient of [gate | up] */
    size_t w_dsend;        /* (Nl,C) gradient sent to the previous virtual stage */
    size_t w_layer;        /* recompute: one layer block of activations */
    size_t w_att;          /* selective: one layer's attention state */
    size_t w_gath;         /* SP: (N,C) all-gathered rows, or a row-parallel
                              layer's partial output before its reduce-scatter */
    size_t w_dlnl;         /* SP: (Nl,C) this rank's rows of w_dln, reduced */
    size_t w_loss;         /* last stage: one f64, the step's loss accumulated on the backend */
    /* context parallelism, p2p (ring attention, engine/model/model_cp.c): two K/V blocks
     * (N,2*KVl*HS) in flight, their dK/dV partial sums (fp32), the running output or dq
     * (B,NHl,T,HS) fp32, the running maximum and sum (B,NHl,T) fp32, and the positions
     * (Tg + T int32: all of a sequence's, then this rank's). a2a (Ulysses): a send and a
     * receive buffer of (N,QKVl) for the all-to-alls. */
    size_t w_cpkv, w_cpdkv, w_cpo, w_cpm, w_cpl, w_cppos;
    size_t w_a2a_send, w_a2a_recv;
    size_t cp_att_probs; /* a2a: bytes of the attention's own saved state, before the
                            whole-sequence output (N,Cl) in a layer's attention block */
    /* mixture of experts: the MLP's (partial over TP) output or input gradient (N,C), the
     * rows in expert order (Nk,C), the experts' fc and activation gradients (Nk,FCel) and
     * (Nk,Fel), the assignments' weight gradients (Nk) fp32, the router's logit gradients
     * (N,E) fp32, and (N,C) for the router's and gate's input gradients (under SP also the
     * gathered MLP input). Under EP the fc and activation gradients are (R,FCel) and
     * (R,Fel), and the experts' side has two (R,C) blocks: its outputs before they travel
     * back, and the output and input gradients of the received rows. */
    size_t w_moe_y, w_moe_perm, w_moe_dh, w_moe_dhact, w_moe_dw, w_moe_dlogits, w_moe_dx, w_moe_x;
    size_t w_moe_ea, w_moe_eb;
    size_t ws_bytes;
    /* the backend's scratch for these shapes (tpd_kern_scratch_plan; 0 on cpu), reserved
     * once at creation, and the host staging of tokens: (2, B*T) int32 per slot */
    size_t scratch_bytes;
    /* mixture of experts on a backend with device memory (training.device cuda): the
     * routing runs on the host, in host mirrors after the tokens' staging (offsets into it,
     * valid when moe_host): one layer's routing regions (moe_probs up to the end of
     * moe_counts, at the block's relative offsets), the gate (N) fp32, the EP counts
     * (EP, El) int32, the assignments' weight (or the gate's) gradients (Nk) fp32 and the
     * router's logit gradients (N,E) fp32. On cpu the mirrors are the buffers themselves. */
    int moe_host;
    size_t h_moe_route, h_moe_gate, h_moe_ecounts, h_moe_dw, h_moe_dlogits;
    size_t host_bytes;
    tpd_mem_breakdown mem;
} tpd_buffer_plan;

/* Bytes of a chunk's layers [i0, i1) in a slot: each dense layer's block (layer.bytes_dense)
 * and each MoE layer's (layer.bytes), in layer order. */
size_t tpd_act_layers_bytes(const tpd_buffer_plan *b, int chunk, int i0, int i1);
tpd_status tpd_buffer_plan_init(const tpd_config *cfg, int tp, int tp_rank, int pp, int dp,
                                int stage, tpd_buffer_plan *plan_p);
/* The staging pools' elements (tpd_model's pool_p and pool_g). */
static inline size_t tpd_buffer_plan_pool_p_numel(const tpd_buffer_plan *b) {
    return (size_t)b->pool_params * (b->pslot_numel + b->xslot_numel);
}
static inline size_t tpd_buffer_plan_pool_g_numel(const tpd_buffer_plan *b) {
    return (size_t)b->pool_grads * (b->gslot_numel + b->xslot_numel) + b->eslot_numel;
}

/* Where one (micro-batch, chunk) of the action list lives: its model chunk (0 .. v-1),
 * its activation slot (0 .. nslots-1) and, for the last chunk of the last stage, its
 * head block (0 .. nheads-1; -1 elsewhere). The trainer assigns them by walking the list. */
typedef struct tpd_model_mb {
    int chunk, slot, head;
} tpd_model_mb;

/* Units of the parameter buffer that the hook reports, in buffer order: the embedding
 * (wte, wpe: elements before the first layer), local layer l (0 .. Ls-1), the final
 * LayerNorm (and an untied output layer, after the last layer). The head's wte gradient
 * counts as the embedding's. */
#define TPD_MODEL_UNIT_EMBED (-1)
/* The hook's events for a unit, in the order a call sees them:
 * - TPD_HOOK_FWD: a forward is about to read the unit's parameters;
 * - TPD_HOOK_FWD_DONE: that forward reads them no more;
 * - TPD_HOOK_BWD: a backward is about to read the unit's parameters (a recomputed layer's
 *   forward included) and write its gradients;
 * - TPD_HOOK_B_DONE: under a split backward (ZB-H1), B reads the layer's parameters no
 *   more; its weight gradients wait for W, which reads no parameters (it computes no
 *   input gradient) and ends with
 * - TPD_HOOK_GRAD_DONE: a backward (or W) call has written its last contribution of this
 *   call to the unit's gradients and reads its parameters no more (for a layer under a
 *   split backward: in W; for the embedding on the last stage of a tied model: after the
 *   head). */
enum {
    TPD_HOOK_FWD = 0,
    TPD_HOOK_GRAD_DONE = 1,
    TPD_HOOK_FWD_DONE = 2,
    TPD_HOOK_BWD = 3,
    TPD_HOOK_B_DONE = 4
};
/* Called with each event (above). A failure stops the step. The trainer's DP overlap waits
 * for parameter gathers and starts gradient reductions here, the sharded strategies
 * gather and free units, and both poll outstanding collectives. */
typedef tpd_status (*tpd_model_hook)(void *user, int unit, int event);

/* A mixture of experts' statistics, summed over this rank's layers and micro-batches (TP
 * rank 0 only): the two losses as weighted into the objective (aux also without its
 * coefficient), the assignments dropped by the capacity and made, and per expert its
 * assignments (load, E entries). */
typedef struct tpd_model_moe_stats {
    double aux, aux_raw, z, dropped, assigned;
    double *load;
} tpd_model_moe_stats;

typedef struct tpd_model {
    tpd_config cfg;
    tpd_buffer_plan plan;
    tpd_model_dims d;
    tpd_rope rope; /* tpd_model_rope(&cfg.model) */
    const tpd_kern_backend *kb;
    tpd_tp_ctx tp;
    void *params; /* (numel_padded) param dtype: the flat buffer; under optim_grads_params
                     this rank's shard (shard_numel) */
    void *grads;  /* (numel_padded) grad dtype, mirrors params; under optim_grads and
                     optim_grads_params this rank's shard (shard_numel) */
    void *pool_p; /* optim_grads_params: pool_params slots of pslot_numel params, then
                     (EP) pool_params expert slots of xslot_numel */
    void *pool_g; /* optim_grads(_params): pool_grads slots of gslot_numel grads,
                     then the embedding's slot of eslot_numel, then (EP) pool_grads
                     expert slots of xslot_numel */
    /* Where each hook unit's parameters and gradients are: unit u (index u + 1, nunits =
     * Ls + 2) has the flat elements [ubound[u+1], ubound[u+2]) and its element e lives at
     * ubase_p[u+1] + (e - ubound[u+1]) (params) and ubase_g likewise. In the flat buffers
     * by default; the sharded strategies point them at staging slots while a unit is in
     * use (engine/optim/grad_shard.c), NULL otherwise. */
    int nunits;
    size_t *ubound; /* (nunits + 1) */
    char **ubase_p, **ubase_g;
    /* EP: local layer l's experts are the expert unit [ebound[l], ebound[l+1]) of the
     * experts' region, at ebase_p[l] and ebase_g[l] likewise (neunits = Ls; 0 without) */
    int neunits;
    size_t *ebound; /* (neunits + 1) */
    char **ebase_p, **ebase_g;
    float *master;        /* (shard_numel) fp32 or NULL */
    float *opt_m, *opt_v; /* (shard_numel) fp32; NULL under plain SGD */
    float *outer_sync;    /* DiLoCo (shard_numel) fp32: the parameters at the last sync */
    float *outer_mom;     /* (shard_numel) fp32: the outer Nesterov momentum */
    float *outer_delta;   /* (tpd_diloco_fragment_numel) fp32: a fragment's pseudo-gradient */
    char *acts;           /* nslots * slot_bytes, then nheads * head_bytes */
    char *ws;             /* ws_bytes */
    int32_t *host_tokens; /* nslots x (2, B*T) host staging (pinned on cuda): inputs, then
                             targets, one pair per slot so that an upload still in flight
                             is never overwritten by the next micro-batch's */
    void **stage_events;  /* (nslots): recorded after each slot's upload; NULL on cpu */
    size_t bytes_allocated;
    tpd_model_hook hook; /* tpd_model_set_hook */
    void *hook_user;
    tpd_comm *cp_comm; /* context parallelism: the CP ring (tpd_model_set_cp); NULL at CP 1 */
    int cp_rank;
    tpd_comm *ep_comm;       /* expert parallelism: the EP group (tpd_model_set_ep); NULL at EP 1 */
    size_t *moe_a2a;         /* (4, EP): an all-to-all's send counts, displacements, receive ... */
    tpd_model_moe_stats moe; /* mixture of experts: sums since tpd_model_moe_take */
    double *moe_f;           /* (E) one layer's assignments per expert (the aux gradient) */
    int moe_quiet;           /* a recompute: its routing is not counted again */
} tpd_model;

/* Allocates every buffer (tp_comm: this rank's TP communicator; may be NULL for TP=1). */
tpd_status tpd_model_create(const tpd_config *cfg, const tpd_kern_backend *kb, tpd_comm *tp_comm,
                            int tp_size, int tp_rank, int pp, int dp, int stage,
                            tpd_model **model_p);
void tpd_model_destroy(tpd_model *m);
/* Context parallelism (CP > 1): the CP communicator of the ranks that share this rank's
 * sequences, and this rank's place in it (which chunks it holds). Needed before the first
 * forward; a no-op at CP 1. */
tpd_status tpd_model_set_cp(tpd_model *m, tpd_comm *cp_comm, int cp_rank);
/* Expert parallelism (EP > 1): the EP communicator of the ranks that split this rank's
 * experts and its place in it (which experts it holds: tpd_model_dims e0). Needed before
 * tpd_model_init_params and the first forward; a no-op at EP 1. */
tpd_status tpd_model_set_ep(tpd_model *m, tpd_comm *ep_comm, int ep_rank);
/* The global position of local row t (0 .. T-1) of a sequence on CP rank cp_rank: chunks
 * cp_rank and 2CP-1-cp_rank of T/2 positions each (t itself at CP 1). */
int tpd_model_cp_pos(const tpd_model_dims *d, int cp_rank, int t);
/* (query, key) pairs CP rank `rank` scores under the causal mask, a sequence of seq split
 * over cp ranks by the chunk rule (the attention work the split balances). */
double tpd_model_cp_causal_pairs(int seq, int cp, int rank);
/* Installs the hook (see tpd_model_hook; NULL: none) and the user pointer it is called
 * with. */
void tpd_model_set_hook(tpd_model *m, tpd_model_hook hook, void *user);
/* From now on the seconds this rank spends in TP collectives are added to *comm_s (NULL:
 * not timed). */
void tpd_model_set_tp_timer(tpd_model *m, double *comm_s);

/* Views into the flat buffers: the tensor (per-layer tensors: local layer 0's piece; the
 * others lie at tpd_model_layout_piece); NULL for a tensor this stage does not hold. */
void *tpd_model_param(const tpd_model *m, tpd_param p);
void *tpd_model_grad(const tpd_model *m, tpd_param p);

/* Counter-based initialization: each element gets the value of its global index, so every
 * layout starts from the same model. Also zeroes gradients and optimizer state and writes
 * the master weights of the ranges this rank owns under `dpp`. */
tpd_status tpd_model_init_params(tpd_model *m, const tpd_dp_plan *dpp);
tpd_status tpd_model_zero_grads(tpd_model *m);
/* The parameters from host (numel_padded fp32, the whole flat buffer): all of it, or the
 * ranges this rank owns under `dpp` where the strategy keeps only its shard. */
tpd_status tpd_model_load_params_f32(tpd_model *m, const tpd_dp_plan *dpp, const float *host);
/* The whole flat parameter buffer (numel_padded elements) as fp32 in host memory; an
 * internal error under optim_grads_params (tpd_grad_sync_params_f32 gathers them). */
tpd_status tpd_model_params_f32(const tpd_model *m, float *out);

/* n elements of dtype dt at backend memory src as fp32 in host memory dst: copied, or cast on
 * the backend into f32 (n floats of backend memory; NULL: allocated for the call) first. */
tpd_status tpd_model_to_host_f32(const tpd_kern_backend *kb, float *dst, const void *src,
                                 tpd_dtype dt, size_t n, float *f32);

/* tokens: (B, Tg+1) host int32 samples; inputs are [:, :Tg], targets [:, 1:] (under CP the
 * rows of this rank's two chunks, tpd_model_cp_pos), written to the slot of `at` (the first chunk
 * of the first stage reads the inputs, the last chunk of the last stage the targets). */
tpd_status tpd_model_set_batch(tpd_model *m, const tpd_model_mb *at, const int32_t *tokens);

/* Runs chunk at->chunk's part of the forward on its slot. The first chunk of the first
 * stage starts from the embedding of the slot's tokens, every other one from the slot's
 * chunk input (received). The last chunk of the last stage ends with the per-token loss
 * in its head block. */
tpd_status tpd_model_forward(tpd_model *m, const tpd_model_mb *at);
/* Backward of the chunk on its slot. The last chunk of the last stage starts from the loss
 * with weight dloss per token; every other one from tpd_model_grad_in (received).
 * Parameter gradients accumulate. Under a split backward (plan.split) this is B: the
 * linear layers' weight and bias gradients wait for tpd_model_weight_grad. */
tpd_status tpd_model_backward(tpd_model *m, const tpd_model_mb *at, float dloss);
/* W of a split backward: the weight and bias gradients of the chunk's linear layers from
 * what B kept in the slot. */
tpd_status tpd_model_weight_grad(tpd_model *m, const tpd_model_mb *at);
/* Sum of the per-token losses of `at`'s head block (last stage, last chunk). */
tpd_status tpd_model_loss_sum(tpd_model *m, const tpd_model_mb *at, double *sum_p);
/* The same sum divided by div, added to the model's loss accumulator on the backend
 * without waiting (a no-op off the last chunk of the last stage). */
tpd_status tpd_model_loss_acc(tpd_model *m, const tpd_model_mb *at, double div);
/* Reads the accumulator (waits for the work queued so far) and zeroes it; 0 on a stage
 * other than the last. */
tpd_status tpd_model_loss_take(tpd_model *m, double *acc_p);
/* The shapes the model's ops run at on this rank, for the backend's scratch plan. */
void tpd_model_kern_shapes(const tpd_config *cfg, const tpd_model_dims *d, tpd_kern_shapes *s);
/* The rotary embedding of a model: its base, and Llama 3.1's scaling when configured. */
tpd_rope tpd_model_rope(const tpd_config_model *m);

/* (N, Vp/tp) logits of `at`'s head block after a forward (device memory). */
const void *tpd_model_logits(const tpd_model *m, const tpd_model_mb *at);
/* Row `row` (0 .. N-1) of them as Vp/tp fp32 values in host memory (waits for the forward). */
tpd_status tpd_model_logits_f32(const tpd_model *m, const tpd_model_mb *at, int row, float *out);

/* The buffers the pipeline moves between virtual stages, (Nl,C) each: under sequence
 * parallel every TP rank sends and receives only its rows. */
void *tpd_model_stage_input(const tpd_model *m, const tpd_model_mb *at);
void *tpd_model_stage_output(const tpd_model *m, const tpd_model_mb *at);
void *tpd_model_grad_in(const tpd_model *m);
void *tpd_model_grad_out(const tpd_model *m);
/* Element range [begin, end) of a hook unit in the flat buffer. */
void tpd_model_unit_range(const tpd_model *m, int unit, size_t *begin_p, size_t *end_p);
/* The hook unit holding flat element e (-1, the embedding's, for the experts' region). */
int tpd_model_unit_of(const tpd_model *m, size_t e);
/* EP: the local layer whose expert unit holds flat element e; -1 outside the region. */
int tpd_model_expert_unit_of(const tpd_model *m, size_t e);
/* Parameter (grads 0) or gradient (grads 1) element e of the flat buffer, where its unit
 * lives now (m->ubase_p / ubase_g, or an expert unit's m->ebase_p / ebase_g). */
void *tpd_model_elem(const tpd_model *m, int grads, size_t e);
/* Element `flat` of a range this rank owns under the DP plan, at shard offset `state`:
 * in the flat buffer, or in the shard where the strategy keeps only that. */
void *tpd_model_owned_param(const tpd_model *m, size_t flat, size_t state);
void *tpd_model_owned_grad(const tpd_model *m, size_t flat, size_t state);
/* The DP plan of a rank of this layout: uniform buckets (no_shard, optim), or aligned to
 * the units under optim_grads and optim_grads_params with DP > 1 (a replica's inner DP
 * under DiLoCo). The buffer plan, the trainer and checkpoints all take it from here. */
tpd_status tpd_model_dp_plan(const tpd_config *cfg, const tpd_model_layout *lay, int dp_size,
                             int dp_rank, tpd_dp_plan *plan_p);
/* The gradients of tensors replicated over TP that each TP rank computes from a part:
 * under sequence parallel the norms' (this rank's rows), with the QK norm its weights (this
 * rank's heads). All-reduces over TP those inside the element range [begin, end), so that
 * every rank holds the full gradient (no-op at TP 1, or without either). */
tpd_status tpd_model_tp_reduce_grads(tpd_model *m, size_t begin, size_t end);
/* The stage's action list under the config's schedule (tpd_config_schedule). */
tpd_status tpd_model_schedule(const tpd_config *cfg, int pp, int stage, int micro_batches,
                              tpd_pp_schedule *sched_p);

#ifdef __cplusplus
}
#endif
#endif
