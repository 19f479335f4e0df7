#include "parallel/comm.h"

#include <stdio.h>

tpd_status tpd_comm_split(tpd_comm *parent, int color, int key, const char *name,
                          tpd_comm **out_p) {
    tpd_comm *c = NULL;
    TPD_CHECK(parent->ops->split(parent, color, key, &c));
    if (c) snprintf(c->name, sizeof c->name, "%s", name);
    *out_p = c;
    return TPD_OK;
}
