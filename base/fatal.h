/* The one way library code ends the process.
 *
 * Two situations cannot be answered with a status code: a watchdog that finds a
 * collective stuck past comm.timeout_s (the caller is blocked inside it), and a second
 * SIGTERM/SIGINT while the first one's save is pending. Both call tpd_fatal(code). What
 * leaving means is decided once, by the program: `main` installs a handler. Without one,
 * or when the handler returns, the process _exit()s with the code at once: the other
 * ranks may be blocked in a collective, and only the launcher (mpirun, srun), seeing a
 * rank gone, can tear the job down. atexit handlers are skipped on purpose, since they
 * could block on MPI, CUDA or NCCL teardown.
 *
 * tpd_fatal may be called from a signal handler or a watchdog thread: handlers must be
 * async-signal-safe (write(2), _exit(2), no stdio, no locks). */
#ifndef TPD_BASE_FATAL_H
#define TPD_BASE_FATAL_H

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*tpd_fatal_handler)(int exit_code, const char *why);

/* Installs the process's handler (NULL restores the default). */
void tpd_fatal_set_handler(tpd_fatal_handler handler);

/* Leaves the process with exit_code (TPD_EXIT_*). why: a short static text for the
 * handler ("watchdog", "second signal"). Never returns. */
_Noreturn void tpd_fatal(int exit_code, const char *why);

#ifdef __cplusplus
}
#endif
#endif
