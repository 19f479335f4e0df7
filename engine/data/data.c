/* Token data sets: open and validate (Megatron indexed, llm.c shard), the split
 * sampler. The writers are in data_write.c.
 *
 * Both formats are little-endian; so are the hosts we build for (x86-64, aarch64), so
 * fields are loaded with memcpy, which also copes with the .idx arrays that start at
 * the unaligned offset 34.
 *
 * The token file stays memory-mapped, and a mapped file cut short underneath kills the
 * process with SIGBUS at the first page past its new end. So the file stays open, and
 * every read of tokens (a sample, a range) first compares the open file's size and
 * modification time (fstat) with those at open: a data set rewritten or truncated while
 * a run reads it is an error naming the file, not a signal. (A truncation in the
 * microseconds between that check and the copy is not caught.) */
#include "engine/data/data.h"
#include "engine/data/data_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/rng.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "data files are little-endian");

/* ---- formats ---- */

const char k_idx_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

static const dtype_info k_dtypes[] = {
    {1, "uint8", 1, 0}, {2, "int8", 1, 0},    {3, "int16", 2, 0},   {4, "int32", 4, 0},
    {5, "int64", 8, 0}, {6, "float64", 8, 1}, {7, "float32", 4, 1}, {8, "uint16", 2, 0},
};

const dtype_info *tpd_data_dtype_find(int code) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].code == code) return &k_dtypes[i];
    return NULL;
}

enum { FORMAT_MEGATRON = 0, FORMAT_LLMC = 1 };

struct tpd_dataset {
    int format;
    const dtype_info *dtype;
    void *map; /* the mapped token file (.bin or the whole shard) */
    size_t map_len;
    int fd;                /* that file, open, for the check before each read */
    struct stat at_open;   /* its size and mtime when opened */
    const uint8_t *tokens; /* first token inside map */
    uint64_t num_tokens;
    uint64_t num_docs;
    int32_t max_token;
    char *path; /* as opened, for messages */
    char *file; /* the token file (the .bin, or the shard), for messages */
};

static uint64_t load_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static int64_t load_i64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}
static int32_t load_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int64_t load_token(const uint8_t *p, int code) {
    switch (code) {
    case 1:
        return *p;
    case 2:
        return (int8_t)*p;
    case 3: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case 4:
        return load_i32(p);
    case 5:
        return load_i64(p);
    case 8: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    }
    return -1; /* unreachable: float codes are rejected at open */
}

/* ---- files ---- */

char *tpd_data_path_join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

/* Any kind but a directory: a FIFO or a device is refused when opened, by name. */
static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && !S_ISDIR(st.st_mode);
}

/* Maps a whole file read-only; an empty file maps to (NULL, 0). fd_p: the file is kept
 * open there (with its fstat in *st_p); NULL: closed. */
static tpd_status map_file(const char *path, void **map_p, size_t *len_p, int *fd_p,
                           struct stat *st_p) {
    int err, fd = tpd_file_open_read(path, &err);
    if (fd < 0) {
        tpd_log_error("%s: cannot open: %s", path, tpd_file_strerror(err));
        return TPD_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        tpd_log_error("%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return TPD_ERR_IO;
    }
    void *map = NULL;
    size_t len = (size_t)st.st_size;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            tpd_log_error("%s: mmap of %zu bytes failed: %s", path, len, strerror(errno));
            close(fd);
            return TPD_ERR_IO;
        }
    }
    if (fd_p) {
        *fd_p = fd;
        *st_p = st;
    } else {
        close(fd); /* the mapping keeps the file alive */
    }
    *map_p = map;
    *len_p = len;
    return TPD_OK;
}

static void unmap(void *map, size_t len) {
    if (map) munmap(map, len);
}

/* Checks every token against [0, vocab_size) once at open, so training never meets a
 * bad id deep into a run; the message gives the byte offset in the file. */
static tpd_status scan_tokens(tpd_dataset *ds, const char *file, uint64_t file_offset,
                              int vocab_size) {
    int code = ds->dtype->code;
    int size = ds->dtype->size;
    int64_t max = -1;
    uint64_t eot = 0;
    for (uint64_t i = 0; i < ds->num_tokens; i++) {
        int64_t v;
        if (code == DTYPE_UINT16) { /* the common case, without the switch */
            uint16_t u;
            memcpy(&u, ds->tokens + 2 * i, 2);
            v = u;
        } else {
            v = load_token(ds->tokens + i * (uint64_t)size, code);
        }
        if (v < 0 || v >= vocab_size) {
            unsigned long long at = file_offset + i * (uint64_t)size;
            if (v < 0)
                tpd_log_error("%s: token %lld at byte offset %llu is negative", file, (long long)v,
                              at);
            else
                tpd_log_error("%s: token %lld at byte offset %llu is >= vocab_size %d", file,
                              (long long)v, at, vocab_size);
            return TPD_ERR_FORMAT;
        }
        if (v > max) max = v;
        eot += v == LLMC_EOT;
    }
    ds->max_token = (int32_t)max;
    if (ds->format == FORMAT_LLMC) ds->num_docs = eot ? eot : (ds->num_tokens > 0);
    return TPD_OK;
}

/* Walks PREFIX.idx: header, sequence lengths and offsets, document indices. Returns the
 * total token count and the document count (document_count - 1). */
static tpd_status parse_index(const char *idx_path, const uint8_t *p, size_t len,
                              const dtype_info **dtype_p, uint64_t *num_tokens_p,
                              uint64_t *num_docs_p) {
    if (len < IDX_HEADER_BYTES) {
        tpd_log_error("%s: truncated: %zu bytes, shorter than the %d-byte header", idx_path, len,
                      IDX_HEADER_BYTES);
        return TPD_ERR_FORMAT;
    }
    if (memcmp(p, k_idx_magic, sizeof k_idx_magic) != 0) {
        tpd_log_error("%s: bad magic at byte offset 0 (expected \"MMIDIDX\\0\\0\" of a "
                      "Megatron indexed data set)",
                      idx_path);
        return TPD_ERR_FORMAT;
    }
    uint64_t version = load_u64(p + 9);
    if (version != 1) {
        tpd_log_error("%s: version %llu at byte offset 9 is not supported (expected 1)", idx_path,
                      (unsigned long long)version);
        return TPD_ERR_FORMAT;
    }
    const dtype_info *dt = tpd_data_dtype_find(p[17]);
    if (!dt) {
        tpd_log_error("%s: unknown dtype code %u at byte offset 17", idx_path, p[17]);
        return TPD_ERR_FORMAT;
    }
    if (dt->is_float) {
        tpd_log_error("%s: dtype %s (code %d) at byte offset 17 cannot hold token ids; "
                      "token data sets need an integer dtype (uint16 or int32)",
                      idx_path, dt->name, dt->code);
        return TPD_ERR_FORMAT;
    }
    uint64_t nseq = load_u64(p + 18), ndoc = load_u64(p + 26);
    /* Bound the counts by the file length before multiplying, so garbage cannot wrap. */
    uint64_t expect = UINT64_MAX;
    if (nseq <= len / 12 && ndoc <= len / 8) expect = IDX_HEADER_BYTES + 12 * nseq + 8 * ndoc;
    if (len != expect) {
        if (expect == UINT64_MAX)
            tpd_log_error("%s: truncated: %zu bytes cannot hold %llu sequences and %llu "
                          "document indices",
                          idx_path, len, (unsigned long long)nseq, (unsigned long long)ndoc);
        else
            tpd_log_error("%s: %s: %zu bytes, expected %llu for %llu sequences and %llu "
                          "document indices",
                          idx_path, len < expect ? "truncated" : "trailing bytes", len,
                          (unsigned long long)expect, (unsigned long long)nseq,
                          (unsigned long long)ndoc);
        return TPD_ERR_FORMAT;
    }
    const uint64_t sizes_at = IDX_HEADER_BYTES, ptrs_at = sizes_at + 4 * nseq,
                   docs_at = ptrs_at + 8 * nseq;
    /* Sequences must lie back to back in .bin (Megatron's builder writes them so): the
     * stream is then the .bin itself and token i is one load, with no search. */
    uint64_t tokens = 0;
    for (uint64_t i = 0; i < nseq; i++) {
        int32_t n = load_i32(p + sizes_at + 4 * i);
        int64_t ptr = load_i64(p + ptrs_at + 8 * i);
        if (n < 0) {
            tpd_log_error("%s: sequence %llu has negative length %d at byte offset %llu", idx_path,
                          (unsigned long long)i, n, (unsigned long long)(sizes_at + 4 * i));
            return TPD_ERR_FORMAT;
        }
        if (ptr < 0 || (uint64_t)ptr != tokens * (uint64_t)dt->size) {
            /* pointers that fit another integer dtype: the header's code is the wrong one */
            for (size_t k = 0; tokens > 0 && k < sizeof k_dtypes / sizeof k_dtypes[0]; k++)
                if (!k_dtypes[k].is_float && k_dtypes[k].size != dt->size &&
                    (uint64_t)ptr == tokens * (uint64_t)k_dtypes[k].size) {
                    tpd_log_error("%s: the dtype code at byte offset 17 says %s (code %d, "
                                  "%d bytes a token), but the sequence pointers are those "
                                  "of %d-byte tokens: the dtype code does not match the "
                                  "data",
                                  idx_path, dt->name, dt->code, dt->size, k_dtypes[k].size);
                    return TPD_ERR_FORMAT;
                }
            tpd_log_error("%s: sequence %llu points at .bin byte %lld (byte offset %llu), "
                          "expected %llu: sequences must be stored back to back",
                          idx_path, (unsigned long long)i, (long long)ptr,
                          (unsigned long long)(ptrs_at + 8 * i),
                          (unsigned long long)(tokens * (uint64_t)dt->size));
            return TPD_ERR_FORMAT;
        }
        tokens += (uint64_t)n;
    }
    if (ndoc < 1) {
        tpd_log_error("%s: document_count is 0; Megatron's document indices start with "
                      "0 and hold count + 1 entries",
                      idx_path);
        return TPD_ERR_FORMAT;
    }
    int64_t prev = 0;
    for (uint64_t d = 0; d < ndoc; d++) {
        int64_t v = load_i64(p + docs_at + 8 * d);
        int bad = d == 0 ? v != 0 : (v < prev || (uint64_t)v > nseq);
        if (!bad && d == ndoc - 1 && (uint64_t)v != nseq) bad = 1;
        if (bad) {
            tpd_log_error("%s: document index %llu is %lld at byte offset %llu; the "
                          "indices must rise from 0 to sequence_count %llu",
                          idx_path, (unsigned long long)d, (long long)v,
                          (unsigned long long)(docs_at + 8 * d), (unsigned long long)nseq);
            return TPD_ERR_FORMAT;
        }
        prev = v;
    }
    *dtype_p = dt;
    *num_tokens_p = tokens;
    *num_docs_p = ndoc - 1;
    return TPD_OK;
}

static tpd_status open_indexed(const char *prefix, int vocab_size, tpd_dataset *ds) {
    tpd_status st = TPD_OK;
    void *idx = NULL;
    size_t idx_len = 0;
    char *idx_path = tpd_data_path_join(prefix, ".idx"),
         *bin_path = tpd_data_path_join(prefix, ".bin");
    if (!idx_path || !bin_path)
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_paths, "out of memory for the file names of %s",
                      prefix);
    TPD_CHECK_GOTO(map_file(idx_path, &idx, &idx_len, NULL, NULL), st, free_paths);
    TPD_CHECK_GOTO(parse_index(idx_path, idx, idx_len, &ds->dtype, &ds->num_tokens, &ds->num_docs),
                   st, unmap_idx);
    TPD_CHECK_GOTO(map_file(bin_path, &ds->map, &ds->map_len, &ds->fd, &ds->at_open), st,
                   unmap_idx);
    uint64_t expect = ds->num_tokens * (uint64_t)ds->dtype->size;
    if (ds->map_len != expect)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, unmap_bin,
                      "%s: %s: %zu bytes, expected %llu (%llu %s tokens listed in %s)", bin_path,
                      ds->map_len < expect ? "truncated" : "trailing bytes", ds->map_len,
                      (unsigned long long)expect, (unsigned long long)ds->num_tokens,
                      ds->dtype->name, idx_path);
    ds->tokens = ds->map;
    TPD_CHECK_GOTO(scan_tokens(ds, bin_path, 0, vocab_size), st, unmap_bin);
    goto unmap_idx; /* success: the index is no longer needed */
unmap_bin:
    unmap(ds->map, ds->map_len);
    ds->map = NULL;
    close(ds->fd);
    ds->fd = -1;
unmap_idx:
    unmap(idx, idx_len);
free_paths:
    free(idx_path);
    free(bin_path);
    return st;
}

static tpd_status open_llmc(const char *path, int vocab_size, tpd_dataset *ds) {
    tpd_status st = TPD_OK;
    TPD_CHECK(map_file(path, &ds->map, &ds->map_len, &ds->fd, &ds->at_open));
    const uint8_t *p = ds->map;
    if (ds->map_len < LLMC_HEADER_BYTES)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, unmap_shard,
                      "%s: truncated: %zu bytes, shorter than the %d-byte llm.c header", path,
                      ds->map_len, LLMC_HEADER_BYTES);
    int32_t magic = load_i32(p), version = load_i32(p + 4), ntok = load_i32(p + 8);
    if (magic != LLMC_MAGIC)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, unmap_shard,
                      "%s: bad magic %d at byte offset 0 (expected %d of an llm.c token "
                      "shard, or a Megatron prefix with PREFIX.idx)",
                      path, magic, LLMC_MAGIC);
    if (version != 1)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, unmap_shard,
                      "%s: version %d at byte offset 4 is not supported (expected 1)", path,
                      version);
    if (ntok < 0)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, unmap_shard,
                      "%s: negative token count %d at byte offset 8", path, ntok);
    uint64_t expect = LLMC_HEADER_BYTES + 2 * (uint64_t)ntok;
    if (ds->map_len != expect)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, unmap_shard,
                      "%s: %s: %zu bytes, expected %llu (%d-byte header + %d uint16 tokens)", path,
                      ds->map_len < expect ? "truncated" : "trailing bytes", ds->map_len,
                      (unsigned long long)expect, LLMC_HEADER_BYTES, ntok);
    ds->dtype = tpd_data_dtype_find(DTYPE_UINT16);
    ds->tokens = p + LLMC_HEADER_BYTES;
    ds->num_tokens = (uint64_t)ntok;
    TPD_CHECK_GOTO(scan_tokens(ds, path, LLMC_HEADER_BYTES, vocab_size), st, unmap_shard);
    return TPD_OK;
unmap_shard:
    unmap(ds->map, ds->map_len);
    ds->map = NULL;
    close(ds->fd);
    ds->fd = -1;
    return st;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

tpd_status tpd_dataset_open(const char *path, int vocab_size, tpd_dataset **ds_p) {
    tpd_status st = TPD_OK;
    if (!path || !path[0] || !ds_p || vocab_size <= 0) {
        tpd_log_error("tpd_dataset_open: need a path and vocab_size > 0 (got %d)", vocab_size);
        return TPD_ERR_INVALID;
    }
    tpd_dataset *ds = calloc(1, sizeof *ds);
    char *idx = tpd_data_path_join(path, ".idx");
    char *stripped = NULL, *stripped_idx = NULL;
    if (!ds || !idx) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_ds, "out of memory opening %s", path);
    ds->fd = -1;
    /* Which Megatron prefix, if any: PATH itself, or PATH less a ".idx"/".bin" that a
     * user typed out of habit. */
    const char *prefix = NULL;
    if (file_exists(idx)) {
        prefix = path;
    } else if (ends_with(path, ".idx") || ends_with(path, ".bin")) {
        stripped = strndup(path, strlen(path) - 4);
        stripped_idx = stripped ? tpd_data_path_join(stripped, ".idx") : NULL;
        if (!stripped_idx)
            TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_ds, "out of memory opening %s", path);
        if (file_exists(stripped_idx)) prefix = stripped;
    }
    if (prefix) {
        ds->format = FORMAT_MEGATRON;
        TPD_CHECK_GOTO(open_indexed(prefix, vocab_size, ds), st, free_ds);
    } else if (file_exists(path)) {
        ds->format = FORMAT_LLMC;
        TPD_CHECK_GOTO(open_llmc(path, vocab_size, ds), st, free_ds);
    } else {
        TPD_FAIL_GOTO(TPD_ERR_IO, st, free_ds,
                      "%s: no such data set (neither %s.idx of a Megatron prefix nor an "
                      "llm.c shard file %s exists)",
                      path, path, path);
    }
    ds->path = strdup(path);
    ds->file = prefix ? tpd_data_path_join(prefix, ".bin") : strdup(path);
    free(idx);
    free(stripped);
    free(stripped_idx);
    if (!ds->path || !ds->file) {
        tpd_dataset_close(ds);
        return tpd_fail_nomem("a data set's path", strlen(path) + 1);
    }
    *ds_p = ds;
    return TPD_OK;
free_ds:
    free(idx);
    free(stripped);
    free(stripped_idx);
    free(ds);
    return st;
}

void tpd_dataset_close(tpd_dataset *ds) {
    if (!ds) return;
    unmap(ds->map, ds->map_len);
    if (ds->fd >= 0) close(ds->fd);
    free(ds->path);
    free(ds->file);
    free(ds);
}

uint64_t tpd_dataset_num_tokens(const tpd_dataset *ds) {
    return ds->num_tokens;
}
uint64_t tpd_dataset_num_documents(const tpd_dataset *ds) {
    return ds->num_docs;
}
const char *tpd_dataset_format(const tpd_dataset *ds) {
    return ds->format == FORMAT_MEGATRON ? "megatron" : "llm.c";
}
const char *tpd_dataset_dtype(const tpd_dataset *ds) {
    return ds->dtype->name;
}
int32_t tpd_dataset_max_token(const tpd_dataset *ds) {
    return ds->max_token;
}

int32_t tpd_dataset_token(const tpd_dataset *ds, uint64_t i) {
    /* Open checked every token against vocab_size (an int), so the value fits. */
    return (int32_t)load_token(ds->tokens + i * (uint64_t)ds->dtype->size, ds->dtype->code);
}

/* The token file as it was at open (see the header comment), or an error naming it. */
static tpd_status check_unchanged(const tpd_dataset *ds) {
    struct stat now;
    if (fstat(ds->fd, &now) != 0)
        return tpd_fail(TPD_ERR_IO, "%s: cannot stat: %s", ds->file, strerror(errno));
    if (now.st_size != ds->at_open.st_size || now.st_mtim.tv_sec != ds->at_open.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != ds->at_open.st_mtim.tv_nsec)
        return tpd_fail(TPD_ERR_IO,
                        "%s: changed while in use (%lld bytes at open, %lld now, %s): a data "
                        "set must stay as it is while a run reads it",
                        ds->file, (long long)ds->at_open.st_size, (long long)now.st_size,
                        now.st_size < ds->at_open.st_size ? "truncated" : "rewritten");
    return TPD_OK;
}

tpd_status tpd_dataset_read(const tpd_dataset *ds, uint64_t begin, uint64_t n, int32_t *out) {
    if (begin > ds->num_tokens || n > ds->num_tokens - begin) {
        tpd_log_error("token range [%llu, %llu) runs past the %llu tokens of the data set",
                      (unsigned long long)begin, (unsigned long long)(begin + n),
                      (unsigned long long)ds->num_tokens);
        return TPD_ERR_INVALID;
    }
    if (n == 0) return TPD_OK; /* an empty data set maps no tokens (NULL) */
    TPD_CHECK(check_unchanged(ds));
    if (ds->dtype->code == DTYPE_UINT16) { /* the common case, without the switch */
        const uint8_t *p = ds->tokens + 2 * begin;
        for (uint64_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            out[i] = v;
        }
        return TPD_OK;
    }
    for (uint64_t i = 0; i < n; i++)
        out[i] = tpd_dataset_token(ds, begin + i);
    return TPD_OK;
}

/* ---- sampler ---- */

static const char *const k_split_names[3] = {"train", "valid", "test"};

/* "949,50,1" (or Megatron's "949/50/1"): up to three non-negative weights, missing ones
 * are 0. */
static tpd_status parse_split(const char *split, double w[3]) {
    w[0] = w[1] = w[2] = 0.0;
    const char *s = split;
    int n = 0;
    while (*s) {
        char *end;
        errno = 0;
        double v = strtod(s, &end);
        if (end == s || errno || !isfinite(v) || v < 0 || n == 3) {
            tpd_log_error("split \"%s\": expected up to three non-negative weights "
                          "separated by ',' (e.g. \"949,50,1\")",
                          split);
            return TPD_ERR_INVALID;
        }
        w[n++] = v;
        s = end;
        while (*s == ' ')
            s++;
        if (*s == ',' || *s == '/')
            s++;
        else if (*s) {
            tpd_log_error("split \"%s\": unexpected '%c'; weights are separated by ','", split, *s);
            return TPD_ERR_INVALID;
        }
    }
    if (!(w[0] + w[1] + w[2] > 0)) {
        tpd_log_error("split \"%s\": the weights must not all be 0", split);
        return TPD_ERR_INVALID;
    }
    return TPD_OK;
}

tpd_status tpd_sampler_init(const tpd_dataset *ds, const char *split, tpd_split which,
                            int seq_length, int shuffle, uint64_t seed, tpd_sampler *s_p) {
    double w[3];
    if (!ds || !s_p || seq_length <= 0 || (int)which < 0 || (int)which > 2) {
        tpd_log_error("tpd_sampler_init: need a data set, a split 0..2 and seq_length > 0 "
                      "(got %d)",
                      seq_length);
        return TPD_ERR_INVALID;
    }
    TPD_CHECK(parse_split(split ? split : "", w));
    /* Boundaries at the rounded cumulative fractions, so the three ranges tile the stream
     * exactly whatever the rounding. */
    uint64_t total = ds->num_tokens, bound[4];
    double sum = w[0] + w[1] + w[2], cum = 0;
    bound[0] = 0;
    for (int k = 0; k < 3; k++) {
        cum += w[k];
        double b = floor((double)total * (cum / sum) + 0.5);
        bound[k + 1] = b >= (double)total ? total : (uint64_t)b;
    }
    bound[3] = total;
    uint64_t begin = bound[which], end = bound[which + 1];
    if (end - begin < (uint64_t)seq_length + 1) {
        tpd_log_error("%s: split \"%s\": the %s split holds %llu tokens (of %llu in the "
                      "data set), fewer than seq_length+1 = %d needed for one sample",
                      ds->path ? ds->path : "data set", split, k_split_names[which],
                      (unsigned long long)(end - begin), (unsigned long long)total, seq_length + 1);
        return TPD_ERR_INVALID;
    }
    tpd_sampler s = {0};
    s.ds = ds;
    s.begin = begin;
    s.end = end;
    s.num_windows = (end - begin - 1) / (uint64_t)seq_length;
    s.seq_length = seq_length;
    s.shuffle = shuffle != 0;
    s.seed = seed;
    s.perm_epoch = -1;
    if (s.shuffle) {
        s.perm = malloc(s.num_windows * sizeof *s.perm);
        if (!s.perm) {
            tpd_log_error("sampler: cannot allocate the permutation of %llu windows",
                          (unsigned long long)s.num_windows);
            return TPD_ERR_NOMEM;
        }
    }
    *s_p = s;
    return TPD_OK;
}

void tpd_sampler_free(tpd_sampler *s) {
    if (!s) return;
    free(s->perm);
    s->perm = NULL;
    s->perm_epoch = -1;
}

/* Fisher-Yates driven by the counter-based generator: swap i draws (seed, epoch, i), so
 * the permutation is a pure function of (seed, epoch), whoever builds it and when. */
static void build_perm(tpd_sampler *s, uint64_t epoch) {
    uint64_t n = s->num_windows;
    for (uint64_t i = 0; i < n; i++)
        s->perm[i] = i;
    for (uint64_t i = n; i-- > 1;) {
        uint64_t j = tpd_rng_below(s->seed, epoch, i, i + 1);
        uint64_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->perm_epoch = (int64_t)epoch;
}

tpd_status tpd_sampler_get(tpd_sampler *s, uint64_t g, int32_t *out) {
    uint64_t epoch = g / s->num_windows, window = g % s->num_windows;
    if (s->shuffle) {
        if (s->perm_epoch != (int64_t)epoch) build_perm(s, epoch);
        window = s->perm[window];
    }
    return tpd_dataset_read(s->ds, s->begin + window * (uint64_t)s->seq_length,
                            (uint64_t)s->seq_length + 1, out);
}
