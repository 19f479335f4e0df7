/* The device mesh: rank <-> (tp, dp, pp) coordinates in Megatron's order (TP fastest,
 * then DP, then PP): rank = tp + TP*(dp + DP*pp).
 *
 * Groups (8 ranks, TP=PP=DP=2): TP {0,1}{2,3}{4,5}{6,7}; DP {0,2}{1,3}{4,6}{5,7};
 * PP {0,4}{1,5}{2,6}{3,7}; embedding = first and last stage of each PP group;
 * model-parallel = the TP*PP ranks sharing a dp index. Pure arithmetic: no MPI here.
 *
 * DiLoCo replicas: DP splits into R replicas of S = DP/R consecutive dp indices (replica =
 * dp / S, inner index = dp % S), and the replica becomes the outermost coordinate:
 * rank = tp + TP*(inner + S*(pp + PP*replica)), so each replica is one run of world/R
 * consecutive ranks (one island of nodes, where the launcher fills nodes in rank order) and
 * only the outer step's all-reduce crosses between them. Group DP is then the inner group
 * (same tp, pp, replica), the one a step's gradients are summed over; DP_OUTER joins the
 * ranks of equal tp, pp and inner index across the replicas. R = 1 (the default): DP is
 * the whole DP dimension, the order above is Megatron's, DP_OUTER is each rank alone and
 * tpd_mesh_comms.dp_outer is NULL.
 *
 * Context parallelism (CP): the DP coordinate of this mesh is Megatron's DP x CP, dp = cp +
 * CP * data_dp, so that rank = tp + TP*(cp + CP*(data_dp + DP*pp)): TP fastest, then CP,
 * then DP, then PP. Group DP is then DP x CP (the ranks that sum each step's gradients: the
 * same weights see the sequence's other chunks); group CP joins the CP consecutive dp
 * indices of one data_dp (the ranks of one sequence). tpd_mesh_init takes dp_size = DP x
 * CP and tpd_mesh_set_cp the CP size; without it CP is 1 and data_dp is dp.
 *
 * Hybrid sharding (HSDP, parallel.data_parallel_shard_size H < the DP group): the DP group
 * splits into DP / H shard groups of H consecutive dp indices (DP_SHARD: shard = inner / H,
 * so the ranks of one are TP apart, typically one node), replicated across them
 * (DP_REPLICATE: same inner % H). No rank moves. H = the DP group (the default): both
 * groups are NULL in tpd_mesh_comms.
 *
 * Expert parallelism (EP, a MoE model's parallel.expert_model_parallel_size): the DP group
 * splits into DP / EP runs of EP consecutive dp indices (group EP: ep = dp % EP, the ranks
 * that split a layer's experts and exchange tokens with all-to-alls), and the ranks of
 * equal ep across the runs hold the same experts (group EDP, expert data parallel: edp =
 * dp / EP; the experts' gradients are summed over it, the dense ones over all of DP), as
 * Megatron-Core takes EP from DP. No rank moves. EP 1: both groups are NULL in
 * tpd_mesh_comms. Under HSDP EP divides the shard groups' H (each holds whole EP runs), and
 * an expert's copies inside one shard group, H / EP of them, are group EDP_SHARD: the
 * experts shard over it as the rest over DP_SHARD, and DP_REPLICATE (same dp % H, so the
 * same ep) sums both shards across the groups. */
#ifndef TPD_PARALLEL_MESH_H
#define TPD_PARALLEL_MESH_H

#include "base/status.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_mesh {
    int tp_size, pp_size, dp_size, world_size;
    int rank, tp, pp, dp;        /* this rank's coordinates; dp is the full DP coordinate */
    int replicas, dp_inner_size; /* R and S = dp_size / R (1 and dp_size by default) */
    int replica, dp_inner;       /* dp / S and dp % S */
    int cp_size, cp;             /* CP and this rank's place in its sequence's group: dp % CP */
    int data_dp, data_dp_size;   /* dp / CP and dp_size / CP: the batch's split */
    int shard_size;              /* HSDP's H (dp_inner_size by default) */
    int dp_shard, dp_rep;        /* dp_inner % H (index in the shard group), dp_inner / H */
    int ep_size, ep, edp;        /* EP, dp % EP, dp / EP (1, 0, dp without experts split) */
} tpd_mesh;

/* Fails (logged, TPD_ERR_INVALID) when world != tp*pp*dp or any size < 1. */
tpd_status tpd_mesh_init(int world_size, int rank, int tp, int pp, int dp, tpd_mesh *mesh_p);
int tpd_mesh_rank_of(const tpd_mesh *m, int tp, int dp, int pp);
void tpd_mesh_coords_of(const tpd_mesh *m, int rank, int *tp_p, int *dp_p, int *pp_p);
/* Splits DP into `replicas` replicas (after tpd_mesh_init). Fails (TPD_ERR_INVALID) unless
 * replicas >= 1 divides dp_size. */
tpd_status tpd_mesh_set_replicas(tpd_mesh *m, int replicas);
/* CP: the DP coordinate is DP x CP with CP consecutive indices per sequence (right after
 * tpd_mesh_init). Fails (TPD_ERR_INVALID) unless cp >= 1 divides dp_size. */
tpd_status tpd_mesh_set_cp(tpd_mesh *m, int cp);
/* 1 when the mesh has the EDP_SHARD group (HSDP with EP > 1). */
int tpd_mesh_has_edp_shard(const tpd_mesh *m);
/* HSDP: shard groups of `shard_size` consecutive inner dp indices (after set_replicas; 0
 * or the DP group's size: none). Fails (TPD_ERR_INVALID) unless it divides dp_inner_size. */
tpd_status tpd_mesh_set_shard_size(tpd_mesh *m, int shard_size);
/* EP: runs of `ep` consecutive dp indices split the experts (after tpd_mesh_init). Fails
 * (TPD_ERR_INVALID) unless ep >= 1 divides dp_size and the mesh has neither CP nor DiLoCo
 * replicas. */
tpd_status tpd_mesh_set_ep(tpd_mesh *m, int ep);

typedef enum tpd_mesh_group {
    TPD_MESH_GROUP_TP = 0,
    TPD_MESH_GROUP_DP = 1,
    TPD_MESH_GROUP_PP = 2,
    TPD_MESH_GROUP_EMB = 3,          /* first and last stage of this rank's PP group */
    TPD_MESH_GROUP_MP = 4,           /* model parallel: TP x PP at fixed dp */
    TPD_MESH_GROUP_DP_OUTER = 5,     /* DiLoCo: same tp, pp, inner dp index across replicas */
    TPD_MESH_GROUP_DP_SHARD = 6,     /* HSDP: one shard group of the DP group */
    TPD_MESH_GROUP_DP_REPLICATE = 7, /* HSDP: same index in the shard group across groups */
    TPD_MESH_GROUP_CP = 8,           /* the CP ranks of one sequence */
    TPD_MESH_GROUP_EP = 9,           /* the EP consecutive dp indices that split the experts */
    TPD_MESH_GROUP_EDP = 10,         /* same ep index across the EP runs: one expert's copies */
    TPD_MESH_GROUP_EDP_SHARD = 11,   /* HSDP under EP: EDP within one shard group */
    TPD_MESH_GROUP_COUNT = 12,
} tpd_mesh_group;

const char *tpd_mesh_group_name(tpd_mesh_group g);

/* Members (world ranks, ascending) of `rank`'s group g; returns the count, writes up to
 * cap. The embedding group of a rank that is neither first nor last stage is empty
 * (returns 0); with PP=1 it is the rank itself. */
int tpd_mesh_group_members(const tpd_mesh *m, tpd_mesh_group g, int rank, int *out, int cap);

/* Color/key for MPI_Comm_split / ncclCommSplit of group g (color -1 = not a member). */
void tpd_mesh_group_color(const tpd_mesh *m, tpd_mesh_group g, int rank, int *color_p, int *key_p);

/* One communicator per dimension, split from the world. */
typedef struct tpd_mesh_comms {
    tpd_comm *world, *tp, *dp, *pp, *emb, *mp; /* emb NULL when not first/last stage */
    tpd_comm *dp_outer;                        /* across DiLoCo replicas; NULL when replicas = 1 */
    tpd_comm *dp_shard, *dp_rep; /* HSDP's shard group and its replicas; NULL without HSDP */
    tpd_comm *cp;                /* the CP ring; NULL at CP 1 */
    tpd_comm *ep, *edp;          /* the expert groups; NULL at EP 1 */
    tpd_comm *edp_shard;         /* HSDP under EP: the experts' shard group; NULL otherwise */
} tpd_mesh_comms;

tpd_status tpd_mesh_comms_create(const tpd_mesh *m, tpd_comm *world, tpd_mesh_comms *comms_p);
/* Destroys the sub-communicators (not world). */
void tpd_mesh_comms_destroy(tpd_mesh_comms *comms);

/* The GPU of one rank, and whether NCCL can serve its node (NCCL refuses two ranks of one
 * communicator on the same GPU; the engine then stages through host memory). */
typedef struct tpd_mesh_gpu {
    int device; /* index among this rank's visible devices; -1: none visible */
    int nccl;   /* 1: every rank of the node has a GPU of its own */
} tpd_mesh_gpu;

/* Chooses this rank's GPU. local_rank, local_size: its place among the ranks of its node
 * (MPI_Comm_split_type SHARED, so no launcher variable is needed); devices: the CUDA
 * devices it sees; visible: local_size entries, each node rank's CUDA_VISIBLE_DEVICES (""
 * when unset), or NULL.
 * - Each rank given devices of its own (CUDA_VISIBLE_DEVICES set per task, pairwise
 *   disjoint, as Slurm's --gpus-per-task does): device 0, NCCL.
 * - Otherwise the ranks see the same devices: device local_rank when there are enough
 *   (NCCL), else local_rank % devices and the ranks share GPUs (no NCCL). */
tpd_mesh_gpu tpd_mesh_choose_gpu(int local_rank, int local_size, int devices,
                                 const char *const *visible);

#ifdef __cplusplus
}
#endif
#endif
