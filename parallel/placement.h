/* Where the ranks run: each rank's host name and the node-local rank and count its
 * launcher reported (OMPI_COMM_WORLD_LOCAL_*, SLURM_LOCALID / SLURM_NTASKS_PER_NODE, ...),
 * gathered over the world at start-up. The log then shows which host runs which ranks,
 * and warns where the launcher's node-local numbers (they pick each rank's GPU and its
 * share of the CPU cores) disagree with the hosts the ranks are on, or where a TP group
 * spans hosts (its all-reduces, two per layer and direction, would cross the network). */
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

enum { TPD_PLACEMENT_HOST_MAX = 64 }; /* bytes of a host name, NUL included (truncated) */

typedef struct tpd_rank_place {
    char host[TPD_PLACEMENT_HOST_MAX]; /* gethostname() */
    int32_t local_rank, local_size;    /* as the launcher reported them */
} tpd_rank_place;

/* Every rank's record in world-rank order (allgather over world; collective). *places_p
 * (world size records) is the caller's to free. */
tpd_status tpd_placement_gather(tpd_comm *world, int local_rank, int local_size,
                                tpd_rank_place **places_p);

/* Calls emit once per line: a summary, one line per host in order of its lowest rank
 * ("host H: ranks 0-7 (local ranks 0-7 of 8)", each followed by its warnings, warn = 1;
 * the first 32 hosts, then a count of the rest), then a warning for TP groups that span
 * hosts. Returns the number of problems found. Pure: places holds m->world_size records. */
int tpd_placement_describe(const tpd_mesh *m, const tpd_rank_place *places,
                           void (*emit)(void *user, int warn, const char *line), void *user);

#ifdef __cplusplus
}
#endif
#endif
