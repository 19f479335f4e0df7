/* Status codes, logging, the calling thread's last error, the exit-code map and the CHECK
 * macros shared by every layer.
 *
 * Library code returns a tpd_status and never calls exit(). The first function that
 * detects an error logs it once with context (tpd_log_error, or tpd_fail, which also
 * returns the code); callers above only propagate the code. A caller that needs the text
 * (a test, a fallback that quotes the first failure) reads it back with tpd_last_error
 * instead of logging it again. The CLI turns the final status into the process's exit
 * code with tpd_status_exit_code, the one map from status to exit code. */
#ifndef TPD_BASE_STATUS_H
#define TPD_BASE_STATUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpd_status {
    TPD_OK = 0,
    TPD_ERR_INVALID = 1,     /* bad argument or configuration */
    TPD_ERR_IO = 2,          /* file missing, short read, write failure */
    TPD_ERR_FORMAT = 3,      /* a file's content breaks its format */
    TPD_ERR_NOMEM = 4,       /* allocation failed */
    TPD_ERR_COMM = 5,        /* a collective failed or timed out */
    TPD_ERR_UNSUPPORTED = 6, /* valid request this build or backend cannot do */
    TPD_ERR_BACKEND = 7,     /* CUDA, cuBLASLt, cuDNN or BLAS failure */
    TPD_ERR_INTERNAL = 8,    /* an invariant broke: a bug */
    TPD_ERR_INTERRUPTED = 9, /* a signal asked the run to stop */
    TPD_ERR_DIVERGED = 10,   /* training.max_skipped_iterations non-finite steps in a row */
} tpd_status;

const char *tpd_status_str(tpd_status st);

/* Process exit codes of the CLI, distinct per failure class so that a launcher or a
 * script can tell a config error from a dead rank. */
enum {
    TPD_EXIT_OK = 0,
    TPD_EXIT_FAILURE = 1,
    TPD_EXIT_CONFIG = 2,
    TPD_EXIT_COMM = 3,     /* collective failure or timeout: every communicator was aborted */
    TPD_EXIT_SIGNAL = 4,   /* a second SIGTERM/SIGINT: left at once, checkpoints untouched */
    TPD_EXIT_DIVERGED = 5, /* the loss or gradients stayed non-finite: stopped, not saved */
    TPD_EXIT_NO_GPU = 6,   /* a command that needs a CUDA device found none usable: nothing
                              ran (`tripod verify --device cuda`); not a failure of tripod */
};

/* The exit code of a final status: TPD_EXIT_CONFIG for TPD_ERR_INVALID (a configuration or
 * command-line error), TPD_EXIT_COMM for a failed collective, TPD_EXIT_DIVERGED for a
 * diverged run, TPD_EXIT_FAILURE for any other error. */
int tpd_status_exit_code(tpd_status st);

/* Logging. Messages go to stderr prefixed with "tripod: " and, when the rank is known
 * (tpd_log_set_rank), "[rank R] ". tpd_log_info prints only where enabled (the logging
 * rank); errors always print, outside a quiet scope (below). */
void tpd_log_set_rank(int rank, int print_info);
/* The values last given to tpd_log_set_rank (-1 and 1 before any): the cuda module, which
 * links its own copy of this library, is handed them so that its messages carry the rank. */
void tpd_log_get_rank(int *rank_p, int *print_info_p);
void tpd_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tpd_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tpd_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The text of the calling thread's latest tpd_log_error (without the "tripod: error: "
 * prefix), "" before any or after tpd_last_error_clear. It stays valid until that thread's
 * next error. Per thread, so a save thread's failure never overwrites the main thread's.
 * The cuda module links its own copy of this library: its errors print, but are kept in
 * that copy. */
const char *tpd_last_error(void);
void tpd_last_error_clear(void);

/* Inside a quiet scope errors are kept (tpd_last_error) but not printed: for a caller that
 * asks a question whose "no" is no error of the run (does the config load at this layout?)
 * and reports the reason its own way, or not at all. Scopes nest and are per thread. */
void tpd_log_quiet_begin(void);
void tpd_log_quiet_end(void);

/* tpd_log_error, then returns code: `return tpd_fail(TPD_ERR_IO, "%s: cannot read", path);` */
tpd_status tpd_fail(tpd_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A failed allocation: logs "out of memory for WHAT (BYTES bytes)" and returns
 * TPD_ERR_NOMEM. `what` names the buffer ("the trainer", "3 bucket tables"). */
tpd_status tpd_fail_nomem(const char *what, size_t bytes);

/* Return on error: the callee has already logged. */
#define TPD_CHECK(call)                                                                            \
    do {                                                                                           \
        tpd_status tpd_check_st_ = (call);                                                         \
        if (tpd_check_st_ != TPD_OK) return tpd_check_st_;                                         \
    } while (0)

/* Jump to a cleanup label, keeping the status in `st`. */
#define TPD_CHECK_GOTO(call, st, label)                                                            \
    do {                                                                                           \
        (st) = (call);                                                                             \
        if ((st) != TPD_OK) goto label;                                                            \
    } while (0)

/* Inside cleanup: run a call but keep the first error already in `st`. */
#define TPD_CHECK_KEEP(call, st)                                                                   \
    do {                                                                                           \
        tpd_status tpd_keep_st_ = (call);                                                          \
        if ((st) == TPD_OK) (st) = tpd_keep_st_;                                                   \
    } while (0)

/* Fail with a logged message (tpd_fail) and jump. */
#define TPD_FAIL_GOTO(code, st, label, ...)                                                        \
    do {                                                                                           \
        (st) = tpd_fail((code), __VA_ARGS__);                                                      \
        goto label;                                                                                \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
