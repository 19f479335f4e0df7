/* Where every parameter of the model (GPT-2's block or Llama's) lives on a rank.
 *
 * Global tensors follow llm.c's order and shapes (train_gpt2.c), stacked over all L
 * layers: wte (V,C), wpe (maxT,C), ln1w (L,C), ln1b (L,C), qkvw (L,3C,C), qkvb (L,3C),
 * attprojw (L,C,C), attprojb (L,C), ln2w (L,C), ln2b (L,C), fcw (L,F,C), fcb (L,F),
 * fcprojw (L,C,F), fcprojb (L,C), lnfw (C), lnfb (C), and for an untied model the output
 * layer lmhead (V,C). Weights are (out, in).
 *
 * The Llama block changes shapes and drops tensors: with grouped-query attention qkvw is
 * ((NH + 2*NKV)*HS, C), [Q; K; V] with NKV K and V heads; with SwiGLU fcw is (2F, C),
 * [gate; up]; RMSNorm has no ln*b/lnfb; add_bias_linear: false drops qkvb, attprojb, fcb
 * and fcprojb; RoPE drops wpe; untied embeddings add lmhead and keep wte on the first
 * stage only. A tensor the model does not have is absent everywhere (g_layers = 0).
 *
 * A mixture of experts stacks each per-layer tensor over the layers of its kind
 * (tpd_layer_kind): attention and norms over all L, the dense MLP (fcw .. fcprojb) over the
 * dense layers, the router, experts and shared experts over the MoE layers (every
 * model.moe_layer_freq-th from layer 0: all of them at 1), so fcw is (L_dense, F, C) and
 * routerw (L_moe, E, C); tpd_model_layout_stack_index maps a global layer to its place.
 *
 * A rank holds, in one contiguous buffer, the tensors of its pipeline stage (wte and wpe
 * on the first stage, wte again plus lnf on the last: the head is tied), sliced for
 * tensor parallelism. With virtual stages (the interleaved schedule) the stage's layers
 * are those of its v model chunks, chunk c being virtual stage c*PP + stage:
 *   - column-parallel weights (qkvw, fcw) and their biases split their rows; qkv is split
 *     by whole heads, so the local rows are [Q_local; K_local; V_local];
 *   - row-parallel weights (attprojw, fcprojw) split their columns; their biases, the
 *     LayerNorms and wpe are replicated;
 *   - wte is split by vocab rows over the padded vocab Vp (rows >= V are zero padding).
 * The buffer is layer-major: wte, wpe, then each local layer's block (the tensors of its
 * kind, in table order: a dense layer's and a MoE layer's blocks differ in size), chunk 0's
 * layers first, then lnfw, lnfb. So the backward finishes the buffer
 * from its end towards its start, and a DP bucket (a plain range, like a ZeRO-1 shard)
 * is final as soon as the backward has passed its lowest layer. Gradients mirror it. */
#ifndef TPD_ENGINE_MODEL_LAYOUT_H
#define TPD_ENGINE_MODEL_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/config/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpd_param {
    TPD_P_WTE = 0,
    TPD_P_WPE,
    TPD_P_LN1W,
    TPD_P_LN1B,
    TPD_P_QKVW,
    TPD_P_QKVB,
    TPD_P_ATTPROJW,
    TPD_P_ATTPROJB,
    TPD_P_LN2W,
    TPD_P_LN2B,
    TPD_P_FCW,
    TPD_P_FCB,
    TPD_P_FCPROJW,
    TPD_P_FCPROJB,
    TPD_P_LNFW,
    TPD_P_LNFB,
    TPD_P_LMHEAD, /* untied output layer */
    /* the mixture-of-experts block, per MoE layer (model.num_moe_experts > 0; every
     * model.moe_layer_freq-th layer, the others keep the dense fcw .. fcprojb), after the
     * layer's other tensors: the router (E, C); the E experts' first MLP matrices stacked
     * (E, FCe, C) with FCe = 2 Fe under SwiGLU ([gate; up] per expert) and their biases
     * (E, FCe); their second matrices (E, C, Fe) and biases (E, C); Qwen2-MoE's
     * shared-expert gate (1, C). The shared experts are shfcw .. shprojb below. */
    TPD_P_ROUTERW,
    TPD_P_EXPFCW,
    TPD_P_EXPFCB,
    TPD_P_EXPPROJW,
    TPD_P_EXPPROJB,
    TPD_P_SHGATEW,
    /* Qwen3's QK norm (model.qk_layernorm), per layer: the RMSNorm weights (HS) of every Q
     * head and of every K head, replicated over TP (each TP rank's heads add to their
     * gradients, summed over TP: tpd_model_tp_reduce_grads) */
    TPD_P_QNORMW,
    TPD_P_KNORMW,
    /* the shared experts of a MoE layer (model.moe_shared_expert_intermediate_size Fs > 0),
     * an MLP like fcw .. fcprojb at width Fs: shfcw (FCs, C) with FCs = 2 Fs under SwiGLU,
     * shfcb (FCs), shprojw (C, Fs), shprojb (C) */
    TPD_P_SHFCW,
    TPD_P_SHFCB,
    TPD_P_SHPROJW,
    TPD_P_SHPROJB,
    TPD_P_COUNT
} tpd_param;

typedef enum tpd_split_kind {
    TPD_SPLIT_NONE = 0,   /* replicated over TP */
    TPD_SPLIT_ROWS = 1,   /* column-parallel: output rows split */
    TPD_SPLIT_QKV = 2,    /* rows in three blocks [Q;K;V], each split by heads (K and V by
                             K/V heads under grouped-query attention) */
    TPD_SPLIT_COLS = 3,   /* row-parallel: input columns split */
    TPD_SPLIT_VOCAB = 4,  /* rows split over the padded vocab */
    TPD_SPLIT_GLU = 5,    /* SwiGLU's fcw/fcb: rows in two blocks [gate; up], each split */
    TPD_SPLIT_EXPERT = 6, /* the experts' expfcw/expfcb: E blocks of rows, each split as
                             fcw is (by rows, or [gate; up] under SwiGLU) */
} tpd_split_kind;

/* Which layers a per-layer tensor is stacked over: all of them, or one kind. A dense model's
 * layers are all dense; a MoE model's are MoE where tpd_config_layer_moe says so. */
typedef enum tpd_layer_kind {
    TPD_LAYERS_ALL = 0,   /* attention, norms */
    TPD_LAYERS_DENSE = 1, /* the dense MLP: fcw .. fcprojb */
    TPD_LAYERS_MOE = 2,   /* router, experts, shared experts and their gate */
} tpd_layer_kind;

typedef struct tpd_param_info {
    const char *name; /* llm.c-style short name: "wte", "qkvw", ... */
    int per_layer;    /* stacked over the layers of its kind */
    tpd_layer_kind kind;
    int is_matrix; /* 2-D weight: gets weight decay */
    tpd_split_kind split;
    int init; /* 0 zero, 1 one, 2 normal(std), 3 normal(std/sqrt(2L)) */
} tpd_param_info;

const tpd_param_info *tpd_param_get_info(tpd_param p);
/* 1 when the configured model has tensor p at all (on some stage). */
int tpd_model_has_param(const tpd_config *cfg, tpd_param p);

typedef struct tpd_model_dims {
    int L, C, NH, HS, F, V, Vp, maxT, T, B; /* global; B = micro-batch; T = this rank's
                                               positions of a sequence (seq_length / CP);
                                               F the dense layers' MLP width */
    int Tg;                                 /* seq_length: a whole sequence */
    int cp_size;                            /* context parallelism: CP ranks split each
                                               sequence into 2 x CP chunks of T/2 */
    int cp_a2a;                             /* parallel.cp_comm_type a2a (Ulysses) */
    int tp_size, tp_rank, pp_size, stage;
    int first, last;                         /* stage flags */
    int Ls;                                  /* layers on this stage (all its chunks) */
    int v;                                   /* model chunks on this stage (virtual stages) */
    int chunk_layers[TPD_CONFIG_MAX_STAGES]; /* layers of chunk c */
    int chunk_l0[TPD_CONFIG_MAX_STAGES];     /* its first local layer */
    int chunk_g0[TPD_CONFIG_MAX_STAGES];     /* its first global layer */
    int NHl, Cl, Fl;                         /* local heads, C/tp, F/tp */
    int NKV, KVl;       /* K/V heads (NH without grouped-query attention), local K/V heads */
    int QKVl;           /* local rows of qkv: (NHl + 2*KVl)*HS */
    int FCl;            /* local rows of fc: 2*Fl under SwiGLU, else Fl */
    int glu, rope, rms; /* SwiGLU, rotary positions, RMSNorm */
    int qkn;            /* Qwen3's RMSNorm of each Q and K head (model.qk_layernorm) */
    int bias;           /* the linear layers have biases */
    int tied;           /* the output layer is wte */
    int Vl, v0, Vvalid; /* local vocab rows, first global vocab row, rows < V */
    int sp;             /* sequence parallel: LayerNorm, residual and p2p regions hold
                           only this TP rank's share of the B*T rows */
    int Nl;             /* rows of those regions: B*T/tp under SP, B*T otherwise */
    /* mixture of experts (E = 0: dense) */
    int E, topk;          /* experts per MoE layer, experts per token */
    int moe_freq;         /* layer g is MoE when g % moe_freq == 0 (0: a dense model) */
    int Fs, Fsl, FCsl;    /* the shared experts' width (0: none), its local share, local fc
                             rows */
    int Fml, FCml;        /* the MLP activations' local widths: the larger of the dense
                             layers' (Fl, FCl) and the shared experts' (Fsl, FCsl), over the
                             kinds the model has (0 for a MoE model of neither) */
    int Fe, Fel, FCel;    /* an expert's width, its local share, its local fc rows */
    int shgate;           /* the shared experts' sigmoid gate */
    int ep_size, ep_rank; /* expert parallelism: this rank holds experts [e0, e0 + El) */
    int El, e0;           /* E / EP local experts (E at EP 1), the first one */
    int moe_cap;          /* moe_expert_capacity_factor > 0: the rows an expert takes of a
                             micro-batch's N k, ceil(f N k / E); 0: dropless */
} tpd_model_dims;

tpd_status tpd_model_dims_init(const tpd_config *cfg, int tp_size, int tp_rank, int pp_size,
                               int stage, tpd_model_dims *dims_p);

/* One parameter tensor on this rank. */
typedef struct tpd_param_slice {
    int present;          /* held by this stage */
    tpd_split_kind split; /* the table's, or TPD_SPLIT_GLU for SwiGLU's fcw and fcb */
    tpd_layer_kind kind;  /* the layers it is stacked over */
    size_t offset;        /* elements into the flat buffer of its first local piece */
    size_t koff[3];       /* per layer: elements into a dense ([TPD_LAYERS_DENSE]) or a MoE
                             ([TPD_LAYERS_MOE]) layer's block (the experts' block under EP) */
    size_t numel;         /* local elements (layers pieces of rows*cols) */
    int layers;           /* local layers of its kind (1 when not per-layer) */
    int rows, cols;       /* local rows and cols per layer (cols = 1 for vectors) */
    int g_rows, g_cols;   /* global rows and cols per layer (unpadded: wte has V rows) */
    int g_layers;         /* global layers of its kind (1 when not per-layer) */
    int tp_counted;       /* 1 when this rank's copy counts in the global norm */
} tpd_param_slice;

typedef struct tpd_model_layout {
    tpd_model_dims d;
    tpd_param_slice p[TPD_P_COUNT];
    size_t numel;        /* total local parameter elements */
    size_t expert_numel; /* EP > 1: the experts' region [0, expert_numel); 0 otherwise */
    size_t layers0;      /* local layer 0's block */
    size_t block[3];     /* a block's elements per layer kind (TPD_LAYERS_DENSE, _MOE) */
    size_t eblock;       /* EP: a MoE layer's experts' block in the experts' region */
} tpd_model_layout;

/* The layout at EP 1: every rank holds all E experts (the whole-model view of checkpoints
 * and interchange, and every layout without expert parallelism). */
tpd_status tpd_model_layout_init(const tpd_config *cfg, int tp_size, int tp_rank, int pp_size,
                                 int stage, tpd_model_layout *lay_p);
/* EP rank ep_rank of ep_size (1 for none): the experts' tensors hold El = E / EP experts
 * ([e0, e0 + El) of the global E) and, at EP > 1, sit in a region of their own at the
 * buffer's start (expert_numel elements): expert blocks per local layer, then the rest as
 * above; its end padded to a multiple of `align` (tpd_model_expert_align). Offsets and
 * sizes do not depend on ep_rank. */
tpd_status tpd_model_layout_init_ep(const tpd_config *cfg, int tp_size, int tp_rank, int pp_size,
                                    int stage, int ep_size, int ep_rank, int align,
                                    tpd_model_layout *lay_p);
/* The experts' region's alignment under EP: ZeRO-1 shards it over expert DP and the rest
 * over DP, so it ends on a multiple of the DP group's `dp` ranks (zero padding); 1
 * otherwise (the unit-aligned strategies cut it along its expert units). */
int tpd_model_expert_align(const tpd_config *cfg, int dp);
/* 1 for the experts' tensors (expfcw, expfcb, expprojw, expprojb): split over EP. */
int tpd_param_is_expert(tpd_param p);

/* The hook units' bounds in the flat buffer (engine/model/model.h): bounds[0 .. Ls + 2],
 * the embedding [bounds[0], bounds[1]), local layer l [bounds[l+1], bounds[l+2]), the
 * final unit up to bounds[Ls + 2] = numel. Under EP bounds[0] is expert_numel: the
 * experts' region before it is cut in expert units of its own. */
void tpd_model_layout_unit_bounds(const tpd_model_layout *lay, size_t *bounds);
/* EP (expert_numel > 0): the expert units' bounds, bounds[0 .. Ls]: local layer l's experts
 * [bounds[l], bounds[l+1]), the last one with the region's padding. */
void tpd_model_layout_expert_bounds(const tpd_model_layout *lay, size_t *bounds);
/* 1 when local layer l is a MoE layer. */
int tpd_model_dims_layer_moe(const tpd_model_dims *d, int l);
/* MoE layers among local layers [0, l). */
int tpd_model_dims_moe_before(const tpd_model_dims *d, int l);
/* Element offset in the flat buffer of p's j-th local piece (rows*cols contiguous elements;
 * j < layers: the j-th local layer of p's kind; 0 for a tensor that is not per layer). */
size_t tpd_model_layout_piece(const tpd_model_layout *lay, tpd_param p, int j);
/* The same for local layer l, which must be of p's kind (tpd_model_layout_layer_has). */
size_t tpd_model_layout_layer_piece(const tpd_model_layout *lay, tpd_param p, int l);
int tpd_model_layout_layer_has(const tpd_model_layout *lay, tpd_param p, int l);
/* Element offset in the flat buffer of local row r (0 .. layers*rows - 1) of p. */
static inline size_t tpd_model_layout_row_local(const tpd_model_layout *lay, tpd_param p,
                                                int64_t r) {
    const tpd_param_slice *s = &lay->p[p];
    return tpd_model_layout_piece(lay, p, (int)(r / s->rows)) + (size_t)(r % s->rows) * s->cols;
}
/* Rows the experts of a MoE layer take per micro-batch on this rank: the N k assignments
 * of its own N = B T tokens at EP 1; under EP the most its EP group can send it, EP N
 * min(k, El) (every token of every EP rank choosing its experts; dropless), or under a
 * capacity EP El moe_cap when that is fewer. */
static inline size_t tpd_model_moe_recv_rows(const tpd_model_dims *d) {
    size_t N = (size_t)d->B * d->T;
    if (d->ep_size <= 1) return N * (size_t)d->topk;
    size_t r = (size_t)d->ep_size * N * (size_t)(d->topk < d->El ? d->topk : d->El);
    /* with a capacity, each source sends at most moe_cap rows to each local expert */
    size_t cap = (size_t)d->ep_size * d->El * (size_t)d->moe_cap;
    return d->moe_cap > 0 && cap < r ? cap : r;
}
/* Global layer g's place in the stack of per-layer tensor p: g itself for a tensor of every
 * layer, its index among the layers of p's kind otherwise (g must be of p's kind). */
int tpd_model_layout_stack_index(const tpd_model_layout *lay, tpd_param p, int g);
/* The global layer of local layer l. */
int tpd_model_dims_global_layer(const tpd_model_dims *d, int l);

/* Global flat element offset (into the unpadded global tensor (g_layers, g_rows, g_cols))
 * of the first element of local row r (0 .. layers*rows - 1) of parameter p; the row's
 * `cols` elements are contiguous in both. Returns -1 for padding rows (vocab >= V). */
int64_t tpd_model_layout_row_global(const tpd_model_layout *lay, tpd_param p, int64_t r);

/* Global element count of parameter p: g_layers * g_rows * g_cols. */
size_t tpd_model_layout_global_numel(const tpd_model_layout *lay, tpd_param p);

/* Initial value of global element `gi` of parameter p (counter-based: identical on every
 * layout). */
float tpd_model_init_value(const tpd_config *cfg, tpd_param p, int64_t gi);

#ifdef __cplusplus
}
#endif
#endif
