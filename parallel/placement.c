#include "parallel/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A non-negative decimal number, or -1 (unset, empty, trailing characters, negative). */
static int env_count(const char *text) {
    if (text == NULL || text[0] < '0' || text[0] > '9') return -1;
    char *end;
    long v = strtol(text, &end, 10);
    return *end == '\0' && v <= INT32_MAX ? (int)v : -1;
}

/* Tasks on node `node` in Slurm's compressed per-node list ("2(x3),1": 2 on each of nodes
 * 0-2, 1 on node 3); -1 when the list is malformed or has no such node. */
static int slurm_tasks_on_node(const char *list, int node) {
    if (list == NULL || node < 0) return -1;
    long left = node, found = -1;
    for (const char *p = list; *p;) {
        char *end;
        if (*p < '0' || *p > '9') return -1;
        long tasks = strtol(p, &end, 10), times = 1;
        p = end;
        if (p[0] == '(') {
            if (p[1] != 'x' || p[2] < '0' || p[2] > '9') return -1;
            times = strtol(p + 2, &end, 10);
            if (*end != ')' || times < 1) return -1;
            p = end + 1;
        }
        if (left >= 0 && left < times) found = tasks;
        if (left >= 0) left -= times;
        if (*p == ',' && p[1] != '\0') {
            p++;
        } else if (*p) {
            return -1;
        }
    }
    return found <= INT32_MAX ? (int)found : -1;
}

void tpd_placement_from_launcher(tpd_rank_place *place) {
    static const struct {
        const char *rank, *size;
        int per_node_list; /* size is Slurm's list over the nodes, at SLURM_NODEID */
    } launchers[] = {
        {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", 0},
        {"SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", 1},
        {"LOCAL_RANK", "LOCAL_WORLD_SIZE", 0}, /* torchrun */
    };
    place->local_rank = place->local_size = -1;
    memset(place->rank_var, 0, sizeof place->rank_var);
    memset(place->size_var, 0, sizeof place->size_var);
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        const char *rank = getenv(launchers[i].rank), *size = getenv(launchers[i].size);
        if (rank == NULL) continue;
        place->local_rank = env_count(rank);
        place->local_size = launchers[i].per_node_list
                                ? slurm_tasks_on_node(size, env_count(getenv("SLURM_NODEID")))
                                : env_count(size);
        snprintf(place->rank_var, sizeof place->rank_var, "%s", launchers[i].rank);
        snprintf(place->size_var, sizeof place->size_var, "%s", launchers[i].size);
        return;
    }
}

tpd_status tpd_placement_gather(tpd_comm *world, tpd_rank_place **places_p) {
    tpd_rank_place me;
    memset(&me, 0, sizeof me); /* the bytes travel as they are: no stale padding */
    if (gethostname(me.host, sizeof me.host) != 0) snprintf(me.host, sizeof me.host, "?");
    me.host[sizeof me.host - 1] = '\0';
    tpd_placement_from_launcher(&me);
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

/* One host of the job: its ranks are order[start .. start + count - 1] of its table. */
typedef struct place_host {
    int first_rank; /* its lowest world rank */
    int start, count;
} place_host;

static int by_first_rank(const void *a, const void *b) {
    const place_host *x = a, *y = b;
    return (x->first_rank > y->first_rank) - (x->first_rank < y->first_rank);
}

/* The ranks grouped by host. */
typedef struct place_table {
    int nhosts;
    rank_key *order;   /* [world] by host name, then world rank */
    place_host *hosts; /* [nhosts] in order of their lowest rank */
    int *host_of;      /* [world] each rank's index into hosts */
    int *ids;          /* [world] scratch for one host's numbers */
} place_table;

static void table_free(place_table *t) {
    free(t->ids);
    free(t->hosts);
    free(t->host_of);
    free(t->order);
}

/* Groups the n ranks of places by host name; -1 when out of memory (t freed). */
static int table_init(const tpd_rank_place *places, int n, place_table *t) {
    memset(t, 0, sizeof *t);
    t->order = malloc((size_t)n * sizeof *t->order);
    t->host_of = malloc((size_t)n * sizeof *t->host_of);
    t->hosts = malloc((size_t)n * sizeof *t->hosts);
    t->ids = malloc((size_t)n * sizeof *t->ids);
    if (!t->order || !t->host_of || !t->hosts || !t->ids) {
        table_free(t);
        return -1;
    }
    for (int r = 0; r < n; r++)
        t->order[r] = (rank_key){places[r].host, r};
    qsort(t->order, (size_t)n, sizeof *t->order, by_host_then_rank);
    for (int i = 0; i < n; i++) {
        if (i == 0 || strcmp(t->order[i].host, t->order[i - 1].host) != 0)
            t->hosts[t->nhosts++] = (place_host){.first_rank = t->order[i].rank, .start = i};
        t->hosts[t->nhosts - 1].count++;
    }
    qsort(t->hosts, (size_t)t->nhosts, sizeof *t->hosts, by_first_rank);
    for (int h = 0; h < t->nhosts; h++)
        for (int i = 0; i < t->hosts[h].count; i++)
            t->host_of[t->order[t->hosts[h].start + i].rank] = h;
    return 0;
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

/* The TP groups that span hosts: how many of how many, and one pair of ranks of one. */
typedef struct tp_span {
    int span, groups, example[2];
} tp_span;

/* "N ranks on H hosts; TP groups ..., PP groups ..., DP groups ..." into line; fills *tp. */
static void format_summary(const tpd_mesh *m, const place_table *t, char *line, size_t cap,
                           tp_span *tp) {
    static const tpd_mesh_group dims[] = {TPD_MESH_GROUP_TP, TPD_MESH_GROUP_PP, TPD_MESH_GROUP_DP};
    static const char *dim_names[] = {"TP", "PP", "DP"};
    int n = m->world_size;
    int at = snprintf(line, cap, "%d rank%s on %d host%s;", n, n > 1 ? "s" : "", t->nhosts,
                      t->nhosts > 1 ? "s" : "");
    for (int d = 0; d < 3; d++) {
        int groups, example[2], span = groups_spanning(m, dims[d], t->host_of, &groups, example);
        if (d == 0) *tp = (tp_span){span, groups, {example[0], example[1]}};
        if (at > 0 && (size_t)at < cap)
            at += snprintf(line + at, cap - (size_t)at, " %s groups %s%s", dim_names[d],
                           span == 0        ? "inside one host"
                           : span == groups ? "span hosts"
                                            : "some span hosts",
                           d < 2 ? "," : "");
    }
}

/* What the launcher told one host's ranks, against the ranks the host runs. */
typedef struct host_check {
    char ranks[256];   /* the world ranks on it, as ranges */
    char locals[256];  /* their local ranks in world-rank order, as ranges */
    int locals_known;  /* the launcher set every one of them */
    int ok_local;      /* they are 0..count-1, each once (else two ranks of it bind one GPU);
                          1 when not all are known */
    int bad_size_rank; /* the first rank told a local count other than count; -1: none */
} host_check;

static void check_host(const tpd_rank_place *places, place_table *t, int h, host_check *c) {
    const place_host *host = &t->hosts[h];
    const rank_key *mine = &t->order[host->start];
    int count = host->count, *ids = t->ids;
    for (int i = 0; i < count; i++)
        ids[i] = mine[i].rank; /* ascending world ranks */
    format_ranges(ids, count, c->ranks, sizeof c->ranks);
    c->locals_known = 1;
    c->bad_size_rank = -1;
    for (int i = 0; i < count; i++) {
        const tpd_rank_place *p = &places[mine[i].rank];
        ids[i] = p->local_rank;
        if (p->local_rank < 0) c->locals_known = 0;
        if (p->local_size >= 0 && p->local_size != count && c->bad_size_rank < 0)
            c->bad_size_rank = mine[i].rank;
    }
    format_ranges(ids, count, c->locals, sizeof c->locals);
    c->ok_local = 1;
    for (int i = 0; i < count && c->ok_local && c->locals_known; i++) {
        int seen = 0;
        for (int j = 0; j < count; j++)
            seen += ids[j] == i;
        c->ok_local = seen == 1;
    }
}

/* " (NAME)" for a variable's name, "" when it has none. */
static void format_var(const char *name, char *buf, size_t cap) {
    if (name[0])
        snprintf(buf, cap, " (%.*s)", TPD_PLACEMENT_VAR_MAX - 1, name);
    else
        buf[0] = '\0';
}

/* The host's line and its warnings; returns the number of warnings. */
static int emit_host(const tpd_rank_place *places, const place_table *t, int h, const host_check *c,
                     void (*emit)(void *user, int warn, const char *line), void *user) {
    const place_host *host = &t->hosts[h];
    const tpd_rank_place *first = &places[t->order[host->start].rank];
    char line[1024], var[TPD_PLACEMENT_VAR_MAX + 4];
    int warnings = 0;
    if (!c->locals_known)
        snprintf(line, sizeof line, "host %s: ranks %s (no node-local ranks from the launcher)",
                 first->host, c->ranks);
    else if (first->local_size < 0)
        snprintf(line, sizeof line, "host %s: ranks %s (local ranks %s)", first->host, c->ranks,
                 c->locals);
    else
        snprintf(line, sizeof line, "host %s: ranks %s (local ranks %s of %d)", first->host,
                 c->ranks, c->locals, (int)first->local_size);
    emit(user, 0, line);
    if (c->bad_size_rank >= 0) {
        const tpd_rank_place *bad = &places[c->bad_size_rank];
        format_var(bad->size_var, var, sizeof var);
        snprintf(line, sizeof line,
                 "host %s runs %d ranks, but the launcher told rank %d that %d share its "
                 "node%s: the launcher's own GPU and core binding follows its number",
                 first->host, host->count, c->bad_size_rank, (int)bad->local_size, var);
        emit(user, 1, line);
        warnings++;
    }
    if (!c->ok_local) {
        format_var(first->rank_var, var, sizeof var);
        snprintf(line, sizeof line,
                 "host %s: the launcher's local ranks (%s) are not 0..%d, each once%s: a "
                 "binding by them gives ranks of one host the same GPU",
                 first->host, c->locals, host->count - 1, var);
        emit(user, 1, line);
        warnings++;
    }
    return warnings;
}

int tpd_placement_describe(const tpd_mesh *m, const tpd_rank_place *places,
                           void (*emit)(void *user, int warn, const char *line), void *user) {
    place_table t;
    if (table_init(places, m->world_size, &t) != 0) {
        emit(user, 1, "out of memory for the placement table");
        return 1;
    }
    char line[1024];
    tp_span tp;
    format_summary(m, &t, line, sizeof line, &tp);
    emit(user, 0, line);

    int warnings = 0, hidden_bad = 0; /* hosts past the listed ones whose numbers disagree */
    for (int h = 0; h < t.nhosts; h++) {
        host_check c;
        check_host(places, &t, h, &c);
        if (h < HOST_LINES) {
            warnings += emit_host(places, &t, h, &c, emit, user);
        } else {
            int bad = (c.bad_size_rank >= 0) + !c.ok_local;
            hidden_bad += bad > 0;
            warnings += bad;
        }
    }
    if (t.nhosts > HOST_LINES) {
        snprintf(line, sizeof line, "%d more hosts not listed%s", t.nhosts - HOST_LINES,
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
    if (tp.span > 0) {
        const int *mem = tp.example;
        snprintf(line, sizeof line,
                 "%d of %d TP groups span hosts (ranks %d and %d are on %s and %s): their "
                 "all-reduces cross the network; give each host consecutive ranks, a multiple "
                 "of TP per host",
                 tp.span, tp.groups, mem[0], mem[1], places[mem[0]].host, places[mem[1]].host);
        emit(user, 1, line);
        warnings++;
    }
    table_free(&t);
    return warnings;
}
