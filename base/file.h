/* Files and directories: whole-file reads (configs, manifests, tokenizer files, text
 * inputs) and mkdir -p. The caller words the error, out of memory included (*errno_p is
 * ENOMEM then): the file's role is its to name, so these log nothing. */
#ifndef TPD_BASE_FILE_H
#define TPD_BASE_FILE_H

#include <stddef.h>

#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* *data_p (malloc'd, NUL-terminated after *len_p bytes) gets the file; grows by doubling,
 * so pipes work. Returns TPD_ERR_IO with *errno_p set (cannot open or read) or
 * TPD_ERR_NOMEM (*errno_p ENOMEM); logs nothing. len_p may be NULL. */
tpd_status tpd_file_read_all(const char *path, char **data_p, size_t *len_p, int *errno_p);

/* Checks a small text file (a config, a profile) before it is parsed: TPD_OK for a
 * regular file of at most max_bytes, or for a pipe (size unknown); else a message in why
 * (n bytes) saying what it is: a directory, too large, missing. */
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
