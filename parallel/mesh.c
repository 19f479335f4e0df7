#include "parallel/mesh.h"

#include <stdlib.h>
#include <string.h>

tpd_status tpd_mesh_init(int world_size, int rank, int tp, int pp, int dp, tpd_mesh *mesh_p) {
    if (tp < 1 || pp < 1 || dp < 1 || world_size != tp * pp * dp || rank < 0 ||
        rank >= world_size) {
        tpd_log_error("mesh: world size %d does not equal TP %d * PP %d * DP %d (rank %d)",
                      world_size, tp, pp, dp, rank);
        return TPD_ERR_INVALID;
    }
    tpd_mesh m = {.tp_size = tp,
                  .pp_size = pp,
                  .dp_size = dp,
                  .world_size = world_size,
                  .rank = rank,
                  .replicas = 1,
                  .dp_inner_size = dp,
                  .shard_size = dp,
                  .cp_size = 1,
                  .data_dp_size = dp,
                  .ep_size = 1};
    tpd_mesh_coords_of(&m, rank, &m.tp, &m.dp, &m.pp);
    m.replica = 0;
    m.dp_inner = m.dp;
    m.dp_shard = m.dp;
    m.data_dp = m.dp;
    m.edp = m.dp;
    *mesh_p = m;
    return TPD_OK;
}

/* rank = tp + TP (inner + S (pp + PP replica)) with dp = replica S + inner: Megatron's
 * order inside a replica, the replicas outermost (one replica = one run of consecutive
 * ranks); with one replica, tp + TP (dp + DP pp) */
int tpd_mesh_rank_of(const tpd_mesh *m, int tp, int dp, int pp) {
    int S = m->dp_inner_size;
    return tp + m->tp_size * (dp % S + S * (pp + m->pp_size * (dp / S)));
}

void tpd_mesh_coords_of(const tpd_mesh *m, int rank, int *tp_p, int *dp_p, int *pp_p) {
    int S = m->dp_inner_size, q = rank / m->tp_size;
    *tp_p = rank % m->tp_size;
    *pp_p = (q / S) % m->pp_size;
    *dp_p = (q / S / m->pp_size) * S + q % S;
}

tpd_status tpd_mesh_set_replicas(tpd_mesh *m, int replicas) {
    if (replicas < 1 || m->dp_size % replicas != 0) {
        tpd_log_error("mesh: diloco.replicas %d must divide DP %d", replicas, m->dp_size);
        return TPD_ERR_INVALID;
    }
    m->replicas = replicas;
    m->dp_inner_size = m->dp_size / replicas;
    tpd_mesh_coords_of(m, m->rank, &m->tp, &m->dp, &m->pp); /* the replicas move outermost */
    m->replica = m->dp / m->dp_inner_size;
    m->dp_inner = m->dp % m->dp_inner_size;
    m->cp = m->dp % m->cp_size;
    m->data_dp = m->dp / m->cp_size;
    return tpd_mesh_set_shard_size(m, 0);
}

tpd_status tpd_mesh_set_cp(tpd_mesh *m, int cp) {
    if (cp < 1 || m->dp_size % cp != 0) {
        tpd_log_error("mesh: context_parallel_size %d must divide the DP x CP size %d", cp,
                      m->dp_size);
        return TPD_ERR_INVALID;
    }
    m->cp_size = cp;
    m->cp = m->dp % cp;
    m->data_dp = m->dp / cp;
    m->data_dp_size = m->dp_size / cp;
    return TPD_OK;
}

tpd_status tpd_mesh_set_shard_size(tpd_mesh *m, int shard_size) {
    int H = shard_size > 0 ? shard_size : m->dp_inner_size;
    if (m->dp_inner_size % H != 0) {
        tpd_log_error("mesh: parallel.data_parallel_shard_size %d must divide the DP group's %d",
                      shard_size, m->dp_inner_size);
        return TPD_ERR_INVALID;
    }
    if (H % m->ep_size != 0) { /* HSDP under EP: a shard group holds whole EP runs */
        tpd_log_error("mesh: parallel.data_parallel_shard_size %d must be a multiple of "
                      "expert_model_parallel_size %d",
                      H, m->ep_size);
        return TPD_ERR_INVALID;
    }
    m->shard_size = H;
    m->dp_shard = m->dp_inner % H;
    m->dp_rep = m->dp_inner / H;
    return TPD_OK;
}

tpd_status tpd_mesh_set_ep(tpd_mesh *m, int ep) {
    if (ep < 1 || m->dp_size % ep != 0 || (ep > 1 && (m->cp_size > 1 || m->replicas > 1))) {
        tpd_log_error("mesh: expert_model_parallel_size %d must divide DP %d (and is built "
                      "without CP and DiLoCo replicas)",
                      ep, m->dp_size);
        return TPD_ERR_INVALID;
    }
    if (m->shard_size % ep != 0) {
        tpd_log_error("mesh: expert_model_parallel_size %d must divide the HSDP shard groups' %d "
                      "ranks",
                      ep, m->shard_size);
        return TPD_ERR_INVALID;
    }
    m->ep_size = ep;
    m->ep = m->dp % ep;
    m->edp = m->dp / ep;
    return TPD_OK;
}

int tpd_mesh_has_edp_shard(const tpd_mesh *m) {
    return m->ep_size > 1 && m->shard_size < m->dp_inner_size;
}

const char *tpd_mesh_group_name(tpd_mesh_group g) {
    static const char *names[] = {"tp",       "dp",           "pp", "emb", "mp",  "dp_outer",
                                  "dp_shard", "dp_replicate", "cp", "ep",  "edp", "edp_shard"};
    return (g >= 0 && g < TPD_MESH_GROUP_COUNT) ? names[g] : "?";
}

int tpd_mesh_group_members(const tpd_mesh *m, tpd_mesh_group g, int rank, int *out, int cap) {
    int tp, dp, pp, n = 0;
    tpd_mesh_coords_of(m, rank, &tp, &dp, &pp);
#define PUSH(r)                                                                                    \
    do {                                                                                           \
        if (n < cap) out[n] = (r);                                                                 \
        n++;                                                                                       \
    } while (0)
    switch (g) {
    case TPD_MESH_GROUP_TP:
        for (int i = 0; i < m->tp_size; i++)
            PUSH(tpd_mesh_rank_of(m, i, dp, pp));
        break;
    case TPD_MESH_GROUP_DP: {
        int base = (dp / m->dp_inner_size) * m->dp_inner_size;
        for (int i = 0; i < m->dp_inner_size; i++)
            PUSH(tpd_mesh_rank_of(m, tp, base + i, pp));
        break;
    }
    case TPD_MESH_GROUP_DP_OUTER:
        for (int r = 0; r < m->replicas; r++)
            PUSH(tpd_mesh_rank_of(m, tp, r * m->dp_inner_size + dp % m->dp_inner_size, pp));
        break;
    case TPD_MESH_GROUP_DP_SHARD: {
        int base = dp - (dp % m->dp_inner_size) % m->shard_size;
        for (int i = 0; i < m->shard_size; i++)
            PUSH(tpd_mesh_rank_of(m, tp, base + i, pp));
        break;
    }
    case TPD_MESH_GROUP_CP: {
        int base = dp - dp % m->cp_size;
        for (int i = 0; i < m->cp_size; i++)
            PUSH(tpd_mesh_rank_of(m, tp, base + i, pp));
        break;
    }
    case TPD_MESH_GROUP_EP: {
        int base = dp - dp % m->ep_size;
        for (int i = 0; i < m->ep_size; i++)
            PUSH(tpd_mesh_rank_of(m, tp, base + i, pp));
        break;
    }
    case TPD_MESH_GROUP_EDP:
        for (int i = dp % m->ep_size; i < m->dp_size; i += m->ep_size)
            PUSH(tpd_mesh_rank_of(m, tp, i, pp));
        break;
    case TPD_MESH_GROUP_EDP_SHARD: { /* within the shard group, same ep */
        int base = dp - dp % m->shard_size;
        for (int i = dp % m->ep_size; i < m->shard_size; i += m->ep_size)
            PUSH(tpd_mesh_rank_of(m, tp, base + i, pp));
        break;
    }
    case TPD_MESH_GROUP_DP_REPLICATE: {
        int base = dp - dp % m->dp_inner_size, idx = (dp % m->dp_inner_size) % m->shard_size;
        for (int g = 0; g < m->dp_inner_size / m->shard_size; g++)
            PUSH(tpd_mesh_rank_of(m, tp, base + g * m->shard_size + idx, pp));
        break;
    }
    case TPD_MESH_GROUP_PP:
        for (int i = 0; i < m->pp_size; i++)
            PUSH(tpd_mesh_rank_of(m, tp, dp, i));
        break;
    case TPD_MESH_GROUP_EMB:
        if (pp == 0 || pp == m->pp_size - 1) {
            PUSH(tpd_mesh_rank_of(m, tp, dp, 0));
            if (m->pp_size > 1) PUSH(tpd_mesh_rank_of(m, tp, dp, m->pp_size - 1));
        }
        break;
    case TPD_MESH_GROUP_MP:
        /* ascending world rank: pp outer, tp inner */
        for (int s = 0; s < m->pp_size; s++)
            for (int i = 0; i < m->tp_size; i++)
                PUSH(tpd_mesh_rank_of(m, i, dp, s));
        break;
    default:
        break;
    }
#undef PUSH
    return n;
}

void tpd_mesh_group_color(const tpd_mesh *m, tpd_mesh_group g, int rank, int *color_p, int *key_p) {
    int tp, dp, pp;
    tpd_mesh_coords_of(m, rank, &tp, &dp, &pp);
    int color = -1, key = rank;
    switch (g) {
    case TPD_MESH_GROUP_TP:
        color = dp + m->dp_size * pp;
        key = tp;
        break;
    case TPD_MESH_GROUP_DP: /* replicas = 1: color tp + TP*pp, as before the split */
        color = tp + m->tp_size * (pp + m->pp_size * (dp / m->dp_inner_size));
        key = dp % m->dp_inner_size;
        break;
    case TPD_MESH_GROUP_DP_OUTER:
        color = tp + m->tp_size * (pp + m->pp_size * (dp % m->dp_inner_size));
        key = dp / m->dp_inner_size;
        break;
    case TPD_MESH_GROUP_CP: /* the runs of CP dp indices */
        color = tp + m->tp_size * (pp + m->pp_size * (dp / m->cp_size));
        key = dp % m->cp_size;
        break;
    case TPD_MESH_GROUP_EP: /* the runs of EP dp indices */
        color = tp + m->tp_size * (pp + m->pp_size * (dp / m->ep_size));
        key = dp % m->ep_size;
        break;
    case TPD_MESH_GROUP_EDP:
        color = tp + m->tp_size * (pp + m->pp_size * (dp % m->ep_size));
        key = dp / m->ep_size;
        break;
    case TPD_MESH_GROUP_EDP_SHARD:
        color = tp + m->tp_size *
                         (pp + m->pp_size * (dp % m->ep_size + m->ep_size * (dp / m->shard_size)));
        key = (dp % m->shard_size) / m->ep_size;
        break;
    case TPD_MESH_GROUP_DP_SHARD: /* within a DP group: the runs of H dp indices */
        color = tp + m->tp_size * (pp + m->pp_size * (dp / m->shard_size));
        key = dp % m->shard_size;
        break;
    case TPD_MESH_GROUP_DP_REPLICATE: {
        int H = m->shard_size, group = dp / m->dp_inner_size; /* the DiLoCo replica */
        color = tp + m->tp_size * (pp + m->pp_size * (dp % H + H * group));
        key = (dp % m->dp_inner_size) / H;
        break;
    }
    case TPD_MESH_GROUP_PP:
        color = tp + m->tp_size * dp;
        key = pp;
        break;
    case TPD_MESH_GROUP_EMB:
        if (pp == 0 || pp == m->pp_size - 1) color = tp + m->tp_size * dp;
        key = pp;
        break;
    case TPD_MESH_GROUP_MP:
        color = dp;
        key = tp + m->tp_size * pp;
        break;
    default:
        break;
    }
    *color_p = color;
    *key_p = key;
}

tpd_status tpd_mesh_comms_create(const tpd_mesh *m, tpd_comm *world, tpd_mesh_comms *comms_p) {
    tpd_status st = TPD_OK;
    tpd_mesh_comms c = {.world = world};
    tpd_comm **slots[TPD_MESH_GROUP_COUNT] = {&c.tp, &c.dp,       &c.pp,       &c.emb,
                                              &c.mp, &c.dp_outer, &c.dp_shard, &c.dp_rep,
                                              &c.cp, &c.ep,       &c.edp,      &c.edp_shard};
    for (int g = 0; g < TPD_MESH_GROUP_COUNT; g++) {
        int color, key;
        if (g == TPD_MESH_GROUP_DP_OUTER && m->replicas == 1) continue; /* same on all ranks */
        if ((g == TPD_MESH_GROUP_DP_SHARD || g == TPD_MESH_GROUP_DP_REPLICATE) &&
            m->shard_size == m->dp_inner_size)
            continue; /* no HSDP: the DP group itself */
        if (g == TPD_MESH_GROUP_CP && m->cp_size == 1) continue;
        if ((g == TPD_MESH_GROUP_EP || g == TPD_MESH_GROUP_EDP) && m->ep_size == 1) continue;
        if (g == TPD_MESH_GROUP_EDP_SHARD && !tpd_mesh_has_edp_shard(m)) continue;
        tpd_mesh_group_color(m, (tpd_mesh_group)g, m->rank, &color, &key);
        /* every rank takes part in every split (collective), non-members pass color -1 */
        TPD_CHECK_GOTO(
            tpd_comm_split(world, color, key, tpd_mesh_group_name((tpd_mesh_group)g), slots[g]), st,
            undo_splits);
    }
    *comms_p = c;
    return TPD_OK;
undo_splits:
    tpd_mesh_comms_destroy(&c);
    return st;
}

void tpd_mesh_comms_destroy(tpd_mesh_comms *c) {
    tpd_comm **slots[] = {&c->edp_shard, &c->edp, &c->ep,  &c->cp, &c->dp_rep, &c->dp_shard,
                          &c->dp_outer,  &c->mp,  &c->emb, &c->pp, &c->dp,     &c->tp};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        if (*slots[i]) tpd_comm_destroy(*slots[i]);
        *slots[i] = NULL;
    }
}

/* 1 when the comma-separated device lists a and b name a device in common. */
static int lists_overlap(const char *a, const char *b) {
    for (const char *p = a; *p;) {
        size_t n = strcspn(p, ",");
        for (const char *q = b; *q;) {
            size_t m = strcspn(q, ",");
            if (n > 0 && n == m && strncmp(p, q, n) == 0) return 1;
            q += m + (q[m] == ',');
        }
        p += n + (p[n] == ',');
    }
    return 0;
}

tpd_mesh_gpu tpd_mesh_choose_gpu(int local_rank, int local_size, int devices,
                                 const char *const *visible) {
    tpd_mesh_gpu g = {-1, 0};
    if (devices <= 0) return g;
    int own = visible != NULL && local_size > 1;
    for (int i = 0; own && i < local_size; i++) {
        if (visible[i] == NULL || visible[i][0] == 0) own = 0;
        for (int j = 0; own && j < i; j++)
            if (lists_overlap(visible[i], visible[j])) own = 0;
    }
    if (own) {
        g.device = 0;
        g.nccl = 1;
    } else if (devices >= local_size) {
        g.device = local_rank;
        g.nccl = 1;
    } else {
        g.device = local_rank % devices;
    }
    return g;
}
