#include "base/fault.h"

#include <stdlib.h>
#include <string.h>

int tpd_fault(const char *name, int dflt, int *arg_p) {
    const char *s = getenv(TPD_FAULT_ENV);
    size_t n = strlen(name);
    if (!s || strncmp(s, name, n) != 0 || (s[n] != 0 && s[n] != ':')) return 0;
    int arg = dflt;
    if (s[n] == ':') {
        char *end = NULL;
        long v = strtol(s + n + 1, &end, 10);
        if (end != s + n + 1 && *end == 0 && v >= 0 && v < 1000000) arg = (int)v;
    }
    if (arg_p) *arg_p = arg;
    return 1;
}
