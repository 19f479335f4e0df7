#include "base/fatal.h"

#include <stdatomic.h>
#include <unistd.h>

static _Atomic(tpd_fatal_handler) g_handler;

void tpd_fatal_set_handler(tpd_fatal_handler handler) {
    atomic_store(&g_handler, handler);
}

_Noreturn void tpd_fatal(int exit_code, const char *why) {
    tpd_fatal_handler h = atomic_load(&g_handler);
    if (h) h(exit_code, why);
    _exit(exit_code); /* the default, and the end of a handler that returned */
}
