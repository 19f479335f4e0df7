#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The negative code of a file of kind `mode` (its S_IFMT bits; errno values are positive). */
static int kind_code(unsigned mode) {
    return -(int)(mode & S_IFMT) - 1;
}

/* The rule, after what the file is instead. */
#define NOT_REGULAR(kind)                                                                          \
    "it is " kind ", and only regular files are read (a FIFO, socket or device could block "       \
    "forever)"

const char *tpd_file_strerror(int err) {
    if (err >= 0) return strerror(err);
    switch ((unsigned)(-err - 1)) {
    case S_IFIFO:
        return NOT_REGULAR("a FIFO");
    case S_IFSOCK:
        return NOT_REGULAR("a socket");
    case S_IFCHR:
        return NOT_REGULAR("a character device");
    case S_IFBLK:
        return NOT_REGULAR("a block device");
    case S_IFDIR:
        return NOT_REGULAR("a directory");
    default:
        return NOT_REGULAR("not a regular file");
    }
}

int tpd_file_open_read(const char *path, int *errno_p) {
    *errno_p = 0;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        *errno_p = errno;
        return -1;
    }
    struct stat sb;
    int flags;
    if (fstat(fd, &sb) != 0 || (flags = fcntl(fd, F_GETFL)) < 0) {
        *errno_p = errno;
        close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        *errno_p = kind_code(sb.st_mode);
        close(fd);
        return -1;
    }
    /* regular files never block, but clear it anyway: the fd is the caller's now */
    if (fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        *errno_p = errno;
        close(fd);
        return -1;
    }
    return fd;
}

FILE *tpd_file_fopen_read(const char *path, int *errno_p) {
    int fd = tpd_file_open_read(path, errno_p);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        *errno_p = errno;
        close(fd);
    }
    return f;
}

tpd_status tpd_file_check_text(const char *path, uint64_t max_bytes, char *why, size_t n) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(why, n, "cannot read: %s", strerror(errno));
        return TPD_ERR_IO;
    }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(why, n, "is a directory, not a YAML file");
        return TPD_ERR_INVALID;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(why, n, "%s", tpd_file_strerror(kind_code((unsigned)sb.st_mode)));
        return TPD_ERR_INVALID;
    }
    if ((uint64_t)sb.st_size > max_bytes) {
        /* parsing would only find out later, after gigabytes of YAML nodes */
        snprintf(why, n, "is %llu bytes, more than the %llu a YAML file here may hold",
                 (unsigned long long)sb.st_size, (unsigned long long)max_bytes);
        return TPD_ERR_INVALID;
    }
    return TPD_OK;
}

tpd_status tpd_file_read_all(const char *path, char **data_p, size_t *len_p, int *errno_p) {
    FILE *f = tpd_file_fopen_read(path, errno_p);
    if (!f) return TPD_ERR_IO;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65536) {
            cap = cap ? 2 * cap : 65536;
            char *b = realloc(buf, cap + 1);
            if (!b) {
                free(buf);
                fclose(f);
                *errno_p = ENOMEM;
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

tpd_status tpd_file_mkdirs(const char *dir, int *errno_p) {
    *errno_p = 0;
    char *buf = strdup(dir);
    if (!buf) {
        *errno_p = ENOMEM;
        return TPD_ERR_NOMEM;
    }
    tpd_status st = TPD_OK;
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char c = *p;
        *p = 0;
        if (buf[0] && mkdir(buf, 0755) != 0 && errno != EEXIST) {
            *errno_p = errno;
            st = TPD_ERR_IO;
            break;
        }
        *p = c;
        if (!c) break;
    }
    free(buf);
    struct stat sb;
    if (st == TPD_OK && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        *errno_p = ENOTDIR;
        st = TPD_ERR_IO;
    }
    return st;
}

tpd_status tpd_file_mkdirs_parent(const char *path, int *errno_p) {
    *errno_p = 0;
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return TPD_OK;
    char *dir = strndup(path, (size_t)(slash - path));
    if (!dir) {
        *errno_p = ENOMEM;
        return TPD_ERR_NOMEM;
    }
    tpd_status st = tpd_file_mkdirs(dir, errno_p);
    free(dir);
    return st;
}

const char *tpd_source_dir(void) {
#ifdef TPD_SOURCE_DIR
    return TPD_SOURCE_DIR;
#else
    return ".";
#endif
}

int tpd_file_on_path(const char *exe) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char buf[1024];
    for (const char *p = path; *p;) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, exe);
        if (n > 0 && access(buf, X_OK) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}
