#include "parallel/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

tpd_status tpd_placement_gather(tpd_comm *world, int local_rank, int local_size,
                                tpd_rank_place **places_p) {
    tpd_rank_place me;
    memset(&me, 0, sizeof me); /* the bytes travel as they are: no stale padding */
    if (gethostname(me.host, sizeof me.host) != 0) snprintf(me.host, sizeof me.host, "?");
    me.host[sizeof me.host - 1] = '\0';
    me.local_rank = local_rank;
    me.local_size = local_size;
    int n = tpd_comm_size(world);
    tpd_rank_place *all = calloc((size_t)n, sizeof *all);
    if (!all) {
        tpd_log_error("placement: out of memory for %d rank records", n);
        return TPD_ERR_NOMEM;
    }
    tpd_status st = tpd_comm_allgather(world, &me, all, sizeof me, TPD_DTYPE_U8, NULL);
    if (st != TPD_OK) {
        free(all);
        return st;
    }
    *places_p = all;
    return TPD_OK;
}

/* Hosts listed one per line; a larger job's log gets a count of the rest (warnings
 * for them are summed into one line). */
enum { HOST_LINES = 32 };

/* Ascending integers as ranges ("0-3,8,10-11"), "..." when cap runs out. */
static void format_ranges(const int *v, int n, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < cap; i++) {
        int j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1)
            j++;
        int w = j > i ? snprintf(buf + at, cap - at, "%s%d-%d", i ? "," : "", v[i], v[j])
                      : snprintf(buf + at, cap - at, "%s%d", i ? "," : "", v[i]);
        if (w < 0 || (size_t)w >= cap - at) {
            snprintf(buf + (cap > 4 ? cap - 4 : 0), cap > 4 ? 4 : cap, "...");
            return;
        }
        at += (size_t)w;
        i = j;
    }
}

typedef struct rank_key {
    const char *host;
    int rank;
} rank_key;

static int by_host_then_rank(const void *a, const void *b) {
    const rank_key *x = a, *y = b;
    int c = strcmp(x->host, y->host);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static int by_first_rank(const void *a, const void *b) {
    const int *x = a, *y = b; /* {first rank, start in the sorted order, count} */
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Groups of dimension g whose members sit on more than one host; example_p[0..1] get the
 * first such group's lowest rank and its first member on another host (-1 when none). */
static int groups_spanning(const tpd_mesh *m, tpd_mesh_group g, const int *host_of, int *groups_p,
                           int *example_p) {
    int span = 0, groups = 0,
        size = g == TPD_MESH_GROUP_TP   ? m->tp_size
               : g == TPD_MESH_GROUP_DP ? m->dp_size
                                        : m->pp_size;
    int *mem = malloc((size_t)size * sizeof *mem);
    example_p[0] = example_p[1] = -1;
    for (int r = 0; mem && r < m->world_size; r++) {
        int n = tpd_mesh_group_members(m, g, r, mem, size);
        if (n < 1 || mem[0] != r) continue; /* each group once, from its lowest rank */
        groups++;
        int other = -1;
        for (int i = 1; i < n && other < 0; i++)
            if (host_of[mem[i]] != host_of[r]) other = mem[i];
        if (other >= 0 && span++ == 0) {
            example_p[0] = r;
            example_p[1] = other;
        }
    }
    free(mem);
    *groups_p = groups;
    return span;
}

int tpd_placement_describe(const tpd_mesh *m, const tpd_rank_place *places,
                           void (*emit)(void *user, int warn, const char *line), void *user) {
    int n = m->world_size, warnings = 0, nhosts = 0;
    rank_key *order = malloc((size_t)n * sizeof *order);
    int *host_of = malloc((size_t)n * sizeof *host_of);
    int *hosts = malloc((size_t)n * 3 * sizeof *hosts); /* per host: first rank, start, count */
    int *ids = malloc((size_t)n * sizeof *ids);
    char line[1024], ranks[256], locals[256];
    if (!order || !host_of || !hosts || !ids) {
        emit(user, 1, "out of memory for the placement table");
        warnings = 1;
        goto out;
    }
    for (int r = 0; r < n; r++)
        order[r] = (rank_key){places[r].host, r};
    qsort(order, (size_t)n, sizeof *order, by_host_then_rank);
    for (int i = 0; i < n; i++) {
        if (i == 0 || strcmp(order[i].host, order[i - 1].host) != 0) {
            int *h = &hosts[3 * nhosts++];
            h[0] = order[i].rank;
            h[1] = i;
            h[2] = 0;
        }
        hosts[3 * (nhosts - 1) + 2]++;
    }
    qsort(hosts, (size_t)nhosts, 3 * sizeof *hosts, by_first_rank);
    for (int h = 0; h < nhosts; h++)
        for (int i = 0; i < hosts[3 * h + 2]; i++)
            host_of[order[hosts[3 * h + 1] + i].rank] = h;

    static const tpd_mesh_group dims[] = {TPD_MESH_GROUP_TP, TPD_MESH_GROUP_PP, TPD_MESH_GROUP_DP};
    static const char *dim_names[] = {"TP", "PP", "DP"};
    int at = snprintf(line, sizeof line, "%d rank%s on %d host%s;", n, n > 1 ? "s" : "", nhosts,
                      nhosts > 1 ? "s" : "");
    int tp_span = 0, tp_groups = 0, tp_example[2] = {-1, -1};
    for (int d = 0; d < 3; d++) {
        int groups, example[2], span = groups_spanning(m, dims[d], host_of, &groups, example);
        if (d == 0) {
            tp_span = span;
            tp_groups = groups;
            tp_example[0] = example[0];
            tp_example[1] = example[1];
        }
        if (at > 0 && (size_t)at < sizeof line)
            at += snprintf(line + at, sizeof line - (size_t)at, " %s groups %s%s", dim_names[d],
                           span == 0        ? "inside one host"
                           : span == groups ? "span hosts"
                                            : "some span hosts",
                           d < 2 ? "," : "");
    }
    emit(user, 0, line);

    int hidden_bad = 0; /* hosts past the listed ones whose local numbers disagree */
    for (int h = 0; h < nhosts; h++) {
        int start = hosts[3 * h + 1], count = hosts[3 * h + 2], shown = h < HOST_LINES;
        const tpd_rank_place *first = &places[order[start].rank];
        for (int i = 0; i < count; i++)
            ids[i] = order[start + i].rank; /* ascending world ranks */
        format_ranges(ids, count, ranks, sizeof ranks);
        int ok_local = 1, size_ok = 1, bad_size_rank = -1;
        for (int i = 0; i < count; i++) {
            const tpd_rank_place *p = &places[order[start + i].rank];
            ids[i] = p->local_rank;
            if (p->local_size != count && size_ok) {
                size_ok = 0;
                bad_size_rank = order[start + i].rank;
            }
        }
        format_ranges(ids, count, locals, sizeof locals);
        /* the local ranks must be 0..count-1, each once (else two ranks pick one GPU) */
        for (int i = 0; i < count && ok_local; i++) {
            int seen = 0;
            for (int j = 0; j < count; j++)
                seen += ids[j] == i;
            ok_local = seen == 1;
        }
        if (!shown) {
            hidden_bad += !size_ok || !ok_local;
            warnings += !size_ok + !ok_local;
            continue;
        }
        snprintf(line, sizeof line, "host %s: ranks %s (local ranks %s of %d)", first->host, ranks,
                 locals, (int)first->local_size);
        emit(user, 0, line);
        if (!size_ok) {
            snprintf(line, sizeof line,
                     "host %s runs %d ranks, but the launcher told rank %d that %d share its "
                     "node: each rank's GPU and CPU threads follow the launcher's number",
                     first->host, count, bad_size_rank, (int)places[bad_size_rank].local_size);
            emit(user, 1, line);
            warnings++;
        }
        if (!ok_local) {
            snprintf(line, sizeof line,
                     "host %s: the launcher's local ranks (%s) are not 0..%d, each once: ranks "
                     "of one host would pick the same GPU",
                     first->host, locals, count - 1);
            emit(user, 1, line);
            warnings++;
        }
    }
    if (nhosts > HOST_LINES) {
        snprintf(line, sizeof line, "%d more hosts not listed%s", nhosts - HOST_LINES,
                 hidden_bad ? "" : ", each with node-local ranks that match it");
        emit(user, 0, line);
        if (hidden_bad) {
            snprintf(line, sizeof line,
                     "%d of the hosts not listed have node-local numbers from the launcher that "
                     "disagree with the ranks they run",
                     hidden_bad);
            emit(user, 1, line);
        }
    }
    if (tp_span > 0) {
        const int *mem = tp_example;
        snprintf(line, sizeof line,
                 "%d of %d TP groups span hosts (ranks %d and %d are on %s and %s): their "
                 "all-reduces cross the network; give each host consecutive ranks, a multiple "
                 "of TP per host",
                 tp_span, tp_groups, mem[0], mem[1], places[mem[0]].host, places[mem[1]].host);
        emit(user, 1, line);
        warnings++;
    }
out:
    free(ids);
    free(hosts);
    free(host_of);
    free(order);
    return warnings;
}
