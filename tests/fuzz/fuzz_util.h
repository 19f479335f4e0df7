/* Helpers shared by the libFuzzer harnesses: a scratch folder per process, writing input
 * bytes to a file there (the readers take paths), and cutting one input into the several
 * files a reader needs.
 *
 * An input holding several files separates them with TPD_FUZZ_SEP; a missing part is an
 * empty file. The seeds under corpus/NAME/ are written that way. */
#ifndef TPD_TESTS_FUZZ_UTIL_H
#define TPD_TESTS_FUZZ_UTIL_H

#include <ftw.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TPD_FUZZ_SEP "\n--8<--\n"
#define TPD_FUZZ_SEP_LEN 8

static char tpd_fuzz_dir_buf[512];

static inline int tpd_fuzz_rm_one(const char *path, const struct stat *st, int flag,
                                  struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static inline void tpd_fuzz_rm_dir(void) {
    nftw(tpd_fuzz_dir_buf, tpd_fuzz_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The process's scratch folder, created on first use and removed at exit: under $TMPDIR
 * when set, else in memory (/dev/shm) where there is one, else /tmp. A harness writes its
 * files for every input, and on a busy disk that write would be most of its time. */
static inline const char *tpd_fuzz_dir(void) {
    if (!tpd_fuzz_dir_buf[0]) {
        const char *tmp = getenv("TMPDIR");
        if (!tmp || !tmp[0]) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(tpd_fuzz_dir_buf, sizeof tpd_fuzz_dir_buf, "%s/tpd_fuzz_XXXXXX", tmp);
        if (!mkdtemp(tpd_fuzz_dir_buf)) abort(); /* the harness cannot run at all */
        atexit(tpd_fuzz_rm_dir);
    }
    return tpd_fuzz_dir_buf;
}

/* dir/name, in a static buffer per slot (slot < 4). */
static inline const char *tpd_fuzz_path(int slot, const char *name) {
    static char paths[4][640];
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", tpd_fuzz_dir(), name);
    return paths[slot];
}

/* Writes bytes to path (replacing it); aborts when the scratch folder is unusable. */
static inline void tpd_fuzz_write(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
}

/* Cuts data at its first n-1 separators into part[i] of len[i] bytes (i < n). */
static inline void tpd_fuzz_split(const uint8_t *data, size_t size, int n, const uint8_t **part,
                                  size_t *len) {
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        part[i] = data + at;
        len[i] = size - at;
        if (i == n - 1) break;
        const uint8_t *sep = memmem(data + at, size - at, TPD_FUZZ_SEP, TPD_FUZZ_SEP_LEN);
        if (!sep) {
            for (int j = i + 1; j < n; j++) {
                part[j] = data + size;
                len[j] = 0;
            }
            break;
        }
        len[i] = (size_t)(sep - (data + at));
        at += len[i] + TPD_FUZZ_SEP_LEN;
    }
}

/* A NUL-terminated copy of bytes (malloc'd). */
static inline char *tpd_fuzz_str(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

#endif
