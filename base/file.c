#include "base/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

tpd_status tpd_file_read_all(const char *path, char **data_p, size_t *len_p, int *errno_p) {
    *errno_p = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *errno_p = errno;
        return TPD_ERR_IO;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65536) {
            cap = cap ? 2 * cap : 65536;
            char *b = realloc(buf, cap + 1);
            if (!b) {
                free(buf);
                fclose(f);
                return TPD_ERR_NOMEM;
            }
            buf = b;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    if (ferror(f)) {
        *errno_p = errno ? errno : EIO;
        free(buf);
        fclose(f);
        return TPD_ERR_IO;
    }
    fclose(f);
    buf[n] = 0;
    *data_p = buf;
    if (len_p) *len_p = n;
    return TPD_OK;
}
