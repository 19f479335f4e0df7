#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>

static int g_log_rank = -1;
static int g_log_info = 1;

const char *tpd_status_str(tpd_status st) {
    switch (st) {
    case TPD_OK:
        return "ok";
    case TPD_ERR_INVALID:
        return "invalid argument";
    case TPD_ERR_IO:
        return "i/o error";
    case TPD_ERR_FORMAT:
        return "bad file format";
    case TPD_ERR_NOMEM:
        return "out of memory";
    case TPD_ERR_COMM:
        return "communication failure";
    case TPD_ERR_UNSUPPORTED:
        return "unsupported";
    case TPD_ERR_BACKEND:
        return "backend failure";
    case TPD_ERR_INTERNAL:
        return "internal error";
    case TPD_ERR_INTERRUPTED:
        return "interrupted";
    case TPD_ERR_DIVERGED:
        return "diverged";
    }
    return "unknown status";
}

void tpd_log_set_rank(int rank, int print_info) {
    g_log_rank = rank;
    g_log_info = print_info;
}

void tpd_log_get_rank(int *rank_p, int *print_info_p) {
    *rank_p = g_log_rank;
    *print_info_p = g_log_info;
}

static void vlog(FILE *f, const char *kind, const char *fmt, va_list ap) {
    char buf[4096];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (g_log_rank >= 0 && kind[0])
        fprintf(f, "tripod: [rank %d] %s%s\n", g_log_rank, kind, buf);
    else
        fprintf(f, "tripod: %s%s\n", kind, buf);
    fflush(f);
}

void tpd_log_info(const char *fmt, ...) {
    if (!g_log_info) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(stdout, "", fmt, ap);
    va_end(ap);
}

void tpd_log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(stderr, "warning: ", fmt, ap);
    va_end(ap);
}

void tpd_log_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(stderr, "error: ", fmt, ap);
    va_end(ap);
}
