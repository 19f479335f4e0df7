/* Files and directories: whole-file reads (configs, manifests, tokenizer files, text
 * inputs) and mkdir -p. The caller words the error, out of memory included (*errno_p is
 * ENOMEM then): the file's role is its to name, so these log nothing. */
#ifndef TPD_BASE_FILE_H
#define TPD_BASE_FILE_H

#include <stddef.h>
#include <stdio.h>

#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every input is opened through tpd_file_open_read, and only a regular file is read: a
 * FIFO blocks open() until a writer comes and read() until it closes, a device or a socket
 * may never end, so such a path would hang a run (every rank of it) instead of failing.
 * The open itself is O_NONBLOCK, so the refusal cannot block either; what is checked is
 * the open file (fstat), not the path, so it cannot change in between.
 *
 * *errno_p gets errno when the open fails, or a negative code when the file is of another
 * kind (a FIFO, a socket, a device, a directory); tpd_file_strerror words both. */
const char *tpd_file_strerror(int err);

/* A read-only fd (O_CLOEXEC, blocking reads) of the regular file at path, or -1 with
 * *errno_p set as above; logs nothing. */
int tpd_file_open_read(const char *path, int *errno_p);
/* The same as a FILE * (mode "rb"), or NULL with *errno_p set. */
FILE *tpd_file_fopen_read(const char *path, int *errno_p);

/* *data_p (malloc'd, NUL-terminated after *len_p bytes) gets the regular file at path.
 * Returns TPD_ERR_IO with *errno_p set (cannot open or read, not a regular file: see
 * tpd_file_strerror) or TPD_ERR_NOMEM (*errno_p ENOMEM); logs nothing. len_p may be NULL. */
tpd_status tpd_file_read_all(const char *path, char **data_p, size_t *len_p, int *errno_p);

/* Checks a small text file (a config, a profile) before it is parsed: TPD_OK for a
 * regular file of at most max_bytes; else a message in why (n bytes) saying what it is:
 * a directory, a FIFO or another kind of file, too large, missing. */
tpd_status tpd_file_check_text(const char *path, uint64_t max_bytes, char *why, size_t n);

/* mkdir -p: creates dir and every missing parent (mode 0755); succeeds when dir already
 * is a directory. Returns TPD_ERR_IO with *errno_p set (ENOTDIR when a component exists
 * but is no directory) or TPD_ERR_NOMEM (*errno_p ENOMEM); logs nothing. */
tpd_status tpd_file_mkdirs(const char *dir, int *errno_p);
/* tpd_file_mkdirs of the directory that holds `path` (nothing when path has no '/'). */
tpd_status tpd_file_mkdirs_parent(const char *path, int *errno_p);

/* 1 when an executable named `exe` is in one of PATH's folders (what the shell would run). */
int tpd_file_on_path(const char *exe);

/* The source tree (configs/, tools/), as configured at build time. */
const char *tpd_source_dir(void);

#ifdef __cplusplus
}
#endif
#endif
