#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int g_log_rank = -1;
static int g_log_info = 1;
/* The calling thread's latest error text, and its quiet-scope depth. */
static _Thread_local char g_last_error[4096];
static _Thread_local int g_quiet;

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

int tpd_status_exit_code(tpd_status st) {
    switch (st) {
    case TPD_OK:
        return TPD_EXIT_OK;
    case TPD_ERR_INVALID:
        return TPD_EXIT_CONFIG;
    case TPD_ERR_COMM:
        return TPD_EXIT_COMM;
    case TPD_ERR_DIVERGED:
        return TPD_EXIT_DIVERGED;
    default:
        return TPD_EXIT_FAILURE;
    }
}

void tpd_log_set_rank(int rank, int print_info) {
    g_log_rank = rank;
    g_log_info = print_info;
}

void tpd_log_get_rank(int *rank_p, int *print_info_p) {
    *rank_p = g_log_rank;
    *print_info_p = g_log_info;
}

static void emit(FILE *f, const char *kind, const char *text) {
    if (g_log_rank >= 0 && kind[0])
        fprintf(f, "tripod: [rank %d] %s%s\n", g_log_rank, kind, text);
    else
        fprintf(f, "tripod: %s%s\n", kind, text);
    fflush(f);
}

static void vlog(FILE *f, const char *kind, const char *fmt, va_list ap) {
    char buf[4096];
    vsnprintf(buf, sizeof buf, fmt, ap);
    emit(f, kind, buf);
}

/* Formatted apart first: an argument may be tpd_last_error() itself (a message that
 * quotes the error it wraps). */
static void verror(const char *fmt, va_list ap) {
    char buf[sizeof g_last_error];
    vsnprintf(buf, sizeof buf, fmt, ap);
    memcpy(g_last_error, buf, sizeof buf);
    if (!g_quiet) emit(stderr, "error: ", buf);
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
    verror(fmt, ap);
    va_end(ap);
}

tpd_status tpd_fail(tpd_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(fmt, ap);
    va_end(ap);
    return code;
}

tpd_status tpd_fail_nomem(const char *what, size_t bytes) {
    return tpd_fail(TPD_ERR_NOMEM, "out of memory for %s (%zu bytes)", what, bytes);
}

const char *tpd_last_error(void) {
    return g_last_error;
}

void tpd_last_error_clear(void) {
    g_last_error[0] = '\0';
}

void tpd_log_quiet_begin(void) {
    g_quiet++;
}

void tpd_log_quiet_end(void) {
    if (g_quiet > 0) g_quiet--;
}
