/* Running another program (gnuplot, a plotting script, the tripod binary in tests) with an
 * argument vector: no shell ever reads the arguments, so a path is only ever a path,
 * whatever quotes or semicolons its name holds. */
#ifndef TPD_BASE_SPAWN_H
#define TPD_BASE_SPAWN_H

#include <stddef.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which of the child's streams tpd_spawn_capture reads (the others are inherited). */
enum { TPD_SPAWN_STDOUT = 1, TPD_SPAWN_STDERR = 2 };

/* Runs argv[0] (looked up on PATH like the shell does) with argv (NULL-terminated) and
 * waits for it. *code_p gets its exit status, or 128 + the signal that ended it (as the
 * shell reports it). Returns TPD_ERR_IO, logged and naming the program, when it cannot
 * be started (not found, not executable); a non-zero exit is the caller's to word. */
tpd_status tpd_spawn_run(const char *const argv[], int *code_p);

/* tpd_spawn_run that also reads the streams in `streams` (TPD_SPAWN_STDOUT and/or
 * TPD_SPAWN_STDERR, into one buffer in the order written) into *out_p: malloc'd,
 * NUL-terminated after *len_p bytes (len_p may be NULL). */
tpd_status tpd_spawn_capture(const char *const argv[], int streams, char **out_p, size_t *len_p,
                             int *code_p);

#ifdef __cplusplus
}
#endif

#endif
