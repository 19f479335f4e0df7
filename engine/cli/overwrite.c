/* --force: the outputs of an earlier run of a command are kept unless asked. */
#include "engine/cli/overwrite.h"

#include <stdint.h>
#include <unistd.h>

tpd_status tpd_cli_refuse_overwrite(tpd_comm *world, const char *cmd, const char *const *paths,
                                    int n, int force, const char *where) {
    int32_t code = TPD_OK;
    if (tpd_comm_rank(world) == 0 && !force) {
        for (int i = 0; i < n; i++) {
            if (access(paths[i], F_OK) != 0) continue;
            code = tpd_fail(TPD_ERR_INVALID,
                            "%s: '%s' exists (an earlier result); pass --force to overwrite it, "
                            "or choose another %s",
                            cmd, paths[i], where);
            break;
        }
    }
    /* The other ranks may not see rank 0's files: they take its verdict. */
    if (tpd_comm_broadcast(world, &code, 1, TPD_DTYPE_I32, 0, NULL) != TPD_OK) return TPD_ERR_COMM;
    return (tpd_status)code;
}
