/* File helpers of the checkpoint module: hashed sequential writers, fsync of files and
 * directories, whole-file reads, SHA-256 (libcrypto EVP) and directory removal. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/checkpoint/checkpoint_internal.h"

#include "base/file.h"

void (*tpd_ckpt_write_hook)(const char *path, uint64_t bytes) = NULL;

int tpd_ckpt_join(char *buf, size_t n, const char *a, const char *b) {
    int k = snprintf(buf, n, "%s/%s", a, b);
    return k >= 0 && (size_t)k < n;
}

static void to_hex(const unsigned char *d, unsigned n, char *hex) {
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < n; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[2 * n] = 0;
}

struct tpd_ckpt_writer {
    int fd;
    char path[TPD_CONFIG_STR + 64];
    EVP_MD_CTX *md;
    uint64_t bytes;
};

tpd_status tpd_ckpt_writer_open(const char *path, tpd_ckpt_writer **w_p) {
    tpd_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    snprintf(w->path, sizeof w->path, "%s", path);
    w->md = EVP_MD_CTX_new();
    if (!w->md || EVP_DigestInit_ex(w->md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(w->md);
        free(w);
        return tpd_fail(TPD_ERR_INTERNAL, "checkpoint %s: SHA-256 unavailable", path);
    }
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        EVP_MD_CTX_free(w->md);
        free(w);
        return tpd_fail(TPD_ERR_IO, "checkpoint %s: cannot create: %s", path, strerror(e));
    }
    *w_p = w;
    return TPD_OK;
}

tpd_status tpd_ckpt_writer_put(tpd_ckpt_writer *w, const void *data, size_t bytes) {
    const char *p = data;
    size_t left = bytes;
    while (left > 0) {
        /* 1 MiB chunks, so the test hook sees a file grow */
        ssize_t k = write(w->fd, p, left < (1u << 20) ? left : (1u << 20));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return tpd_fail(TPD_ERR_IO, "checkpoint %s: write failed at byte %llu: %s", w->path,
                            (unsigned long long)w->bytes, k < 0 ? strerror(errno) : "no progress");
        EVP_DigestUpdate(w->md, p, (size_t)k);
        p += k;
        left -= (size_t)k;
        w->bytes += (uint64_t)k;
        if (tpd_ckpt_write_hook) tpd_ckpt_write_hook(w->path, w->bytes);
    }
    return TPD_OK;
}

void tpd_ckpt_writer_abort(tpd_ckpt_writer *w) {
    if (!w) return;
    close(w->fd);
    EVP_MD_CTX_free(w->md);
    free(w);
}

tpd_status tpd_ckpt_writer_finish(tpd_ckpt_writer *w, char *sha_hex, uint64_t *bytes_p) {
    tpd_status st = TPD_OK;
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    if (fsync(w->fd) != 0)
        st = tpd_fail(TPD_ERR_IO, "checkpoint %s: fsync failed: %s", w->path, strerror(errno));
    if (close(w->fd) != 0 && st == TPD_OK)
        st = tpd_fail(TPD_ERR_IO, "checkpoint %s: close failed: %s", w->path, strerror(errno));
    EVP_DigestFinal_ex(w->md, d, &n);
    to_hex(d, n, sha_hex);
    if (bytes_p) *bytes_p = w->bytes;
    EVP_MD_CTX_free(w->md);
    free(w);
    return st;
}

tpd_status tpd_ckpt_write_file(const char *path, const void *data, size_t bytes) {
    tpd_ckpt_writer *w;
    char hex[65];
    TPD_CHECK(tpd_ckpt_writer_open(path, &w));
    tpd_status st = tpd_ckpt_writer_put(w, data, bytes);
    if (st != TPD_OK) {
        tpd_ckpt_writer_abort(w);
        return st;
    }
    return tpd_ckpt_writer_finish(w, hex, NULL);
}

tpd_status tpd_ckpt_read_file(const char *path, char **data_p, size_t *bytes_p) {
    int err;
    tpd_status st = tpd_file_read_all(path, data_p, bytes_p, &err);
    if (st == TPD_ERR_NOMEM) return tpd_fail(st, "checkpoint %s: out of memory", path);
    if (st != TPD_OK)
        return tpd_fail(st, "checkpoint %s: cannot read: %s", path, tpd_file_strerror(err));
    return TPD_OK;
}

void tpd_ckpt_sha256_hex(const void *data, size_t bytes, char *hex) {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    EVP_Digest(data, bytes, d, &n, EVP_sha256(), NULL);
    to_hex(d, n, hex);
}

tpd_status tpd_ckpt_sha256_file(const char *path, char *hex, uint64_t *bytes_p) {
    int err, fd = tpd_file_open_read(path, &err);
    if (fd < 0)
        return tpd_fail(TPD_ERR_IO, "checkpoint %s: cannot open: %s", path, tpd_file_strerror(err));
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    tpd_status st = TPD_OK;
    uint64_t total = 0;
    if (!md || !buf || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        st = tpd_fail(TPD_ERR_NOMEM, "checkpoint %s: cannot hash", path);
        goto out;
    }
    for (;;) {
        ssize_t k = read(fd, buf, cap);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            st = tpd_fail(TPD_ERR_IO, "checkpoint %s: read failed: %s", path, strerror(errno));
            goto out;
        }
        if (k == 0) break;
        EVP_DigestUpdate(md, buf, (size_t)k);
        total += (uint64_t)k;
    }
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    EVP_DigestFinal_ex(md, d, &n);
    to_hex(d, n, hex);
    if (bytes_p) *bytes_p = total;
out:
    free(buf);
    EVP_MD_CTX_free(md);
    close(fd);
    return st;
}

tpd_status tpd_ckpt_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return tpd_fail(TPD_ERR_IO, "checkpoint %s: cannot open directory: %s", dir,
                        strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0) return tpd_fail(TPD_ERR_IO, "checkpoint %s: fsync failed: %s", dir, strerror(e));
    return TPD_OK;
}

tpd_status tpd_ckpt_mkdirs(const char *dir) {
    int e = 0;
    tpd_status st = tpd_file_mkdirs(dir, &e);
    if (st == TPD_ERR_IO)
        return tpd_fail(st, "checkpoint %s: cannot create directory: %s", dir, strerror(e));
    if (st != TPD_OK) return tpd_fail(st, "checkpoint %s: out of memory", dir);
    return TPD_OK;
}

tpd_status tpd_ckpt_remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? TPD_OK
                               : tpd_fail(TPD_ERR_IO, "checkpoint %s: cannot open directory: %s",
                                          dir, strerror(errno));
    struct dirent *e;
    char path[TPD_CONFIG_STR + 320];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        tpd_ckpt_join(path, sizeof path, dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    if (rmdir(dir) != 0)
        return tpd_fail(TPD_ERR_IO, "checkpoint %s: cannot remove: %s", dir, strerror(errno));
    return TPD_OK;
}

int tpd_ckpt_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int tpd_ckpt_is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

tpd_status tpd_ckpt_pread(int fd, const char *path, void *buf, size_t bytes, uint64_t off) {
    char *p = buf;
    while (bytes > 0) {
        ssize_t k = pread(fd, p, bytes, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return tpd_fail(TPD_ERR_FORMAT, "checkpoint %s: %s at byte %llu", path,
                            k < 0 ? strerror(errno) : "file ends early (truncated)",
                            (unsigned long long)off);
        p += k;
        bytes -= (size_t)k;
        off += (uint64_t)k;
    }
    return TPD_OK;
}
