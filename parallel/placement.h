/* Where the ranks run: each rank's host name and the node-local rank and count its
 * launcher set in the environment (tpd_placement_from_launcher), gathered over the world at
 * start-up. The log then shows which host runs which ranks, and warns where the launcher's
 * node-local numbers disagree with the hosts the ranks are on, or where a TP group spans
 * hosts (its all-reduces, two per layer and direction, would cross the network).
 *
 * The trainer picks each rank's GPU and its share of the cores from the ranks MPI finds on
 * its node (tpd_mesh_choose_gpu), not from these numbers; but the launcher's own binding
 * (mpirun --bind-to, srun --gpu-bind, a wrapper that reads LOCAL_RANK) follows them, so a
 * count that disagrees with the hosts means a launch that is not the one intended. */
#ifndef TPD_PARALLEL_PLACEMENT_H
#define TPD_PARALLEL_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TPD_PLACEMENT_HOST_MAX = 64, /* bytes of a host name, NUL included (truncated) */
    TPD_PLACEMENT_VAR_MAX = 32,  /* bytes of an environment variable's name, NUL included */
};

typedef struct tpd_rank_place {
    char host[TPD_PLACEMENT_HOST_MAX];    /* gethostname() */
    int32_t local_rank, local_size;       /* as the launcher set them; -1: not set */
    char rank_var[TPD_PLACEMENT_VAR_MAX]; /* the variable local_rank came from ("": unnamed) */
    char size_var[TPD_PLACEMENT_VAR_MAX]; /* the variable local_size came from ("": unnamed) */
} tpd_rank_place;

/* This process's node-local rank and count as its launcher set them, from the first of
 * these whose local-rank variable is set: Open MPI (OMPI_COMM_WORLD_LOCAL_RANK,
 * OMPI_COMM_WORLD_LOCAL_SIZE), Slurm (SLURM_LOCALID, and the count of node SLURM_NODEID in
 * SLURM_STEP_TASKS_PER_NODE, "2(x3),1" for 2 tasks on each of nodes 0-2 and 1 on node 3)
 * or torchrun (LOCAL_RANK, LOCAL_WORLD_SIZE). Writes local_rank and local_size (-1 where a
 * variable is unset or malformed) and the variables' names; leaves host alone. */
void tpd_placement_from_launcher(tpd_rank_place *place);

/* Every rank's record (its host name and tpd_placement_from_launcher) in world-rank order
 * (allgather over world; collective). *places_p (world size records) is the caller's to
 * free. */
tpd_status tpd_placement_gather(tpd_comm *world, tpd_rank_place **places_p);

/* Calls emit once per line: a summary, one line per host in order of its lowest rank
 * ("host H: ranks 0-7 (local ranks 0-7 of 8)", each followed by its warnings, warn = 1,
 * which name the launcher's variable; the first 32 hosts, then a count of the rest), then a
 * warning for TP groups that span hosts. A number the launcher did not set is not checked.
 * Returns the number of problems found. Pure: places holds m->world_size records. */
int tpd_placement_describe(const tpd_mesh *m, const tpd_rank_place *places,
                           void (*emit)(void *user, int warn, const char *line), void *user);

#ifdef __cplusplus
}
#endif
#endif
