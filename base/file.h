/* Whole-file reads, for configs, manifests, tokenizer files and text inputs. The caller
 * words the error: the file's role is its to name. */
#ifndef TPD_BASE_FILE_H
#define TPD_BASE_FILE_H

#include <stddef.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* *data_p (malloc'd, NUL-terminated after *len_p bytes) gets the file; grows by doubling,
 * so pipes work. Returns TPD_ERR_IO with *errno_p set (cannot open or read) or
 * TPD_ERR_NOMEM; logs nothing. len_p may be NULL. */
tpd_status tpd_file_read_all(const char *path, char **data_p, size_t *len_p, int *errno_p);

#ifdef __cplusplus
}
#endif
#endif
