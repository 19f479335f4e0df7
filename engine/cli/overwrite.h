/* Results are never written over without asking: a command whose outputs already exist
 * stops, naming the first one, unless it was given --force. */
#ifndef TPD_ENGINE_CLI_OVERWRITE_H
#define TPD_ENGINE_CLI_OVERWRITE_H

#include "base/status.h"
#include "parallel/comm.h"

/* Collective over world: rank 0 (the rank that writes the outputs) looks for each of the
 * n paths and every rank returns its verdict. TPD_ERR_INVALID, logged once with the file
 * and how to proceed (--force, or another `where`), when one exists and !force. */
tpd_status tpd_cli_refuse_overwrite(tpd_comm *world, const char *cmd, const char *const *paths,
                                    int n, int force, const char *where);

#endif
