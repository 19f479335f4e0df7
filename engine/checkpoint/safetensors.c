/* safetensors: header parsing, sharded sets through the index file, dtype conversion, and
 * sharded writing. */
#include "engine/checkpoint/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/file.h"
#include "base/progress.h"
#include "engine/checkpoint/checkpoint_internal.h"

#define ST_MAX_HEADER (100u << 20) /* the format's own limit on the JSON header: 100 MB */
#define ST_MAX_FILES 4096
#define ST_READ_CHUNK (1u << 20) /* bytes converted per pread */

typedef struct st_file {
    char *path;
    int fd;
    uint64_t data_start; /* 8 + header length */
} st_file;

struct tpd_st_set {
    char source[TPD_CONFIG_STR + 64];
    st_file *files;
    int nfiles;
    tpd_st_tensor *t;
    int n, cap;
};

static const struct {
    const char *name;
    tpd_st_dtype dt;
    unsigned size;
} g_dtypes[] = {
    {"F32", TPD_ST_F32, 4},
    {"BF16", TPD_ST_BF16, 2},
    {"F16", TPD_ST_F16, 2},
    {"F64", TPD_ST_F64, 8},
};

const char *tpd_st_dtype_name(tpd_st_dtype dt) {
    return g_dtypes[dt].name;
}

tpd_status tpd_st_create(tpd_st_set **set_p) {
    tpd_st_set *s = calloc(1, sizeof *s);
    if (!s) return tpd_fail(TPD_ERR_NOMEM, "safetensors: out of memory");
    *set_p = s;
    return TPD_OK;
}

void tpd_st_close(tpd_st_set *set) {
    if (!set) return;
    for (int i = 0; i < set->nfiles; i++) {
        if (set->files[i].fd >= 0) close(set->files[i].fd);
        free(set->files[i].path);
    }
    for (int i = 0; i < set->n; i++)
        free(set->t[i].name);
    free(set->files);
    free(set->t);
    free(set);
}

int tpd_st_count(const tpd_st_set *set) {
    return set->n;
}

const tpd_st_tensor *tpd_st_get(const tpd_st_set *set, int i) {
    return i >= 0 && i < set->n ? &set->t[i] : NULL;
}

const tpd_st_tensor *tpd_st_find(const tpd_st_set *set, const char *name) {
    for (int i = 0; i < set->n; i++)
        if (!strcmp(set->t[i].name, name)) return &set->t[i];
    return NULL;
}

const char *tpd_st_source(const tpd_st_set *set) {
    return set->source;
}

const char *tpd_st_file_path(const tpd_st_set *set, int file) {
    return file >= 0 && file < set->nfiles ? set->files[file].path : "?";
}

/* A JSON number that is a whole, non-negative integer within 2^53 (exact in a double). */
static int json_u64(const cJSON *j, uint64_t *v) {
    int64_t w;
    if (!tpd_ckpt_json_whole(j, &w) || w < 0) return 0;
    *v = (uint64_t)w;
    return 1;
}

static tpd_status parse_entry(const cJSON *e, const char *path, tpd_st_tensor *t,
                              uint64_t data_bytes) {
    const char *name = e->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) ||
        cJSON_GetArraySize(of) != 2)
        return tpd_fail(TPD_ERR_FORMAT,
                        "safetensors %s: tensor '%s' needs dtype, shape and data_offsets [b, e]",
                        path, name);
    unsigned esize = 0;
    for (size_t i = 0; i < sizeof g_dtypes / sizeof g_dtypes[0]; i++)
        if (!strcmp(dt->valuestring, g_dtypes[i].name)) {
            t->dtype = g_dtypes[i].dt;
            esize = g_dtypes[i].size;
        }
    if (!esize)
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "safetensors %s: tensor '%s' has dtype %s; F32, BF16, F16 and F64 "
                        "are read",
                        path, name, dt->valuestring);
    t->ndim = cJSON_GetArraySize(sh);
    if (t->ndim > TPD_ST_MAX_DIMS)
        return tpd_fail(TPD_ERR_FORMAT, "safetensors %s: tensor '%s' has %d dimensions", path, name,
                        t->ndim);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t v;
        if (!json_u64(cJSON_GetArrayItem(sh, d), &v) || (v && numel > UINT64_MAX / 8 / v))
            return tpd_fail(TPD_ERR_FORMAT, "safetensors %s: tensor '%s': shape[%d] is not a size",
                            path, name, d);
        t->shape[d] = (int64_t)v;
        numel *= v;
    }
    if (!json_u64(cJSON_GetArrayItem(of, 0), &t->begin) ||
        !json_u64(cJSON_GetArrayItem(of, 1), &t->end) || t->end < t->begin || t->end > data_bytes ||
        t->end - t->begin != numel * esize)
        return tpd_fail(TPD_ERR_FORMAT,
                        "safetensors %s: tensor '%s': data_offsets do not hold %llu %s "
                        "values inside the %llu data bytes",
                        path, name, (unsigned long long)numel, dt->valuestring,
                        (unsigned long long)data_bytes);
    return TPD_OK;
}

static int by_begin(const void *a, const void *b) {
    const tpd_st_tensor *x = *(const tpd_st_tensor *const *)a,
                        *y = *(const tpd_st_tensor *const *)b;
    return x->begin != y->begin ? (x->begin < y->begin ? -1 : 1)
                                : (x->end != y->end ? (x->end < y->end ? -1 : 1) : 0);
}

/* The format's layout rule: the tensors of one file tile its data bytes exactly, from 0,
 * in some order, with no overlap and no hole (a shared or stray byte range would be read
 * as two tensors, or hide bytes nothing reads). */
static tpd_status check_tiling(const tpd_st_set *set, int first, const char *path,
                               uint64_t data_bytes) {
    int n = set->n - first;
    const tpd_st_tensor **order = malloc((size_t)(n ? n : 1) * sizeof *order);
    if (!order) return tpd_fail(TPD_ERR_NOMEM, "safetensors: out of memory");
    for (int i = 0; i < n; i++)
        order[i] = &set->t[first + i];
    qsort(order, (size_t)n, sizeof *order, by_begin);
    tpd_status st = TPD_OK;
    uint64_t at = 0;
    for (int i = 0; i < n && st == TPD_OK; i++) {
        const tpd_st_tensor *t = order[i];
        if (t->begin < at)
            st = tpd_fail(TPD_ERR_FORMAT,
                          "safetensors %s: tensor '%s': data_offsets [%llu, %llu] overlap "
                          "tensor '%s' (which ends at %llu); tensors may not share bytes",
                          path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                          order[i - 1]->name, (unsigned long long)at);
        else if (t->begin > at)
            st = tpd_fail(TPD_ERR_FORMAT,
                          "safetensors %s: tensor '%s': data_offsets start at %llu, leaving "
                          "bytes [%llu, %llu) that no tensor holds; the data must be contiguous "
                          "from 0",
                          path, t->name, (unsigned long long)t->begin, (unsigned long long)at,
                          (unsigned long long)t->begin);
        at = t->end;
    }
    if (st == TPD_OK && at != data_bytes)
        st = tpd_fail(TPD_ERR_FORMAT,
                      "safetensors %s: %llu bytes after the last tensor (which ends at %llu of "
                      "%llu data bytes); the data must end with the last tensor",
                      path, (unsigned long long)(data_bytes - at), (unsigned long long)at,
                      (unsigned long long)data_bytes);
    free(order);
    return st;
}

tpd_status tpd_st_parse_header(tpd_st_set *set, int file, const char *path, const char *json,
                               size_t len, uint64_t data_bytes) {
    cJSON *hdr = cJSON_ParseWithLength(json, len);
    tpd_status st = TPD_OK;
    int first = set->n;
    if (!cJSON_IsObject(hdr))
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "safetensors %s: the header is not a JSON object",
                      path);
    for (const cJSON *e = hdr->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        if (tpd_st_find(set, e->string))
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "safetensors %s: tensor '%s' appears twice",
                          path, e->string);
        if (set->n == set->cap) {
            int cap = set->cap ? 2 * set->cap : 64;
            tpd_st_tensor *t = realloc(set->t, (size_t)cap * sizeof *t);
            if (!t) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "safetensors: out of memory");
            set->t = t;
            set->cap = cap;
        }
        tpd_st_tensor t;
        memset(&t, 0, sizeof t);
        TPD_CHECK_GOTO(parse_entry(e, path, &t, data_bytes), st, out);
        t.file = file;
        t.name = strdup(e->string);
        if (!t.name) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "safetensors: out of memory");
        set->t[set->n++] = t;
    }
    st = check_tiling(set, first, path, data_bytes);
out:
    cJSON_Delete(hdr);
    return st;
}

/* Opens one .safetensors file and parses its header. */
static tpd_status add_file(tpd_st_set *set, const char *path) {
    if (set->nfiles >= ST_MAX_FILES)
        return tpd_fail(TPD_ERR_FORMAT, "safetensors %s: more than %d shards", path, ST_MAX_FILES);
    st_file *fs = realloc(set->files, (size_t)(set->nfiles + 1) * sizeof *fs);
    if (!fs) return tpd_fail(TPD_ERR_NOMEM, "safetensors: out of memory");
    set->files = fs;
    st_file *f = &fs[set->nfiles];
    f->path = strdup(path);
    int e = ENOMEM;
    f->fd = f->path ? tpd_file_open_read(path, &e) : -1;
    if (!f->path || f->fd < 0) {
        if (f->fd >= 0) close(f->fd);
        free(f->path);
        return tpd_fail(TPD_ERR_IO, "safetensors %s: cannot open: %s", path, tpd_file_strerror(e));
    }
    int file = set->nfiles++;
    struct stat sb;
    uint8_t len8[8];
    if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        return tpd_fail(TPD_ERR_IO, "safetensors %s: not a regular file", path);
    uint64_t size = (uint64_t)sb.st_size, hlen = 0;
    if (size < 8)
        return tpd_fail(TPD_ERR_FORMAT,
                        "safetensors %s: %llu bytes, shorter than the "
                        "8-byte header length",
                        path, (unsigned long long)size);
    TPD_CHECK(tpd_ckpt_pread(f->fd, path, len8, 8, 0));
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)len8[i] << (8 * i);
    if (hlen > size - 8 || hlen > ST_MAX_HEADER)
        return tpd_fail(TPD_ERR_FORMAT,
                        "safetensors %s: header length %llu exceeds the file (%llu bytes) "
                        "or the format's 100 MB",
                        path, (unsigned long long)hlen, (unsigned long long)size);
    char *json = malloc(hlen ? hlen : 1);
    if (!json) return tpd_fail(TPD_ERR_NOMEM, "safetensors: out of memory");
    tpd_status st = tpd_ckpt_pread(f->fd, path, json, hlen, 8);
    f->data_start = 8 + hlen;
    if (st == TPD_OK) st = tpd_st_parse_header(set, file, path, json, hlen, size - 8 - hlen);
    free(json);
    return st;
}

/* The directory part of path ("." when none), into buf. */
static void dir_of(const char *path, char *buf, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, n, ".");
    else
        snprintf(buf, n, "%.*s", (int)(slash - path), path);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The shards of an index file, in the order of first appearance in its weight_map; every
 * tensor the map names must be in the file it names. */
static tpd_status open_index(tpd_st_set *set, const char *index) {
    char *text = NULL, dir[TPD_CONFIG_STR + 64], path[2 * TPD_CONFIG_STR + 128];
    TPD_CHECK(tpd_ckpt_read_file(index, &text, NULL));
    cJSON *j = cJSON_Parse(text);
    free(text);
    tpd_status st = TPD_OK;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(map))
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                      "safetensors %s: not JSON with a \"weight_map\" object", index);
    dir_of(index, dir, sizeof dir);
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') ||
            !ends_with(e->valuestring, ".safetensors"))
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                          "safetensors %s: weight_map[\"%s\"] is not a .safetensors file "
                          "name in the same folder",
                          index, e->string);
        snprintf(path, sizeof path, "%s/%s", dir, e->valuestring);
        int known = 0;
        for (int f = 0; f < set->nfiles && !known; f++)
            known = !strcmp(set->files[f].path, path);
        if (!known) TPD_CHECK_GOTO(add_file(set, path), st, out);
    }
    for (const cJSON *e = map->child; e; e = e->next) {
        const tpd_st_tensor *t = tpd_st_find(set, e->string);
        snprintf(path, sizeof path, "%s/%s", dir, e->valuestring);
        if (!t || strcmp(set->files[t->file].path, path) != 0)
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                          "safetensors %s: weight_map puts tensor '%s' in %s, which does "
                          "not hold it",
                          index, e->string, path);
    }
out:
    cJSON_Delete(j);
    return st;
}

tpd_status tpd_st_open(const char *path, tpd_st_set **set_p) {
    tpd_st_set *set = NULL;
    TPD_CHECK(tpd_st_create(&set));
    char buf[TPD_CONFIG_STR + 64];
    struct stat sb;
    tpd_status st;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        tpd_ckpt_join(buf, sizeof buf, path, "model.safetensors.index.json");
        if (stat(buf, &sb) != 0) tpd_ckpt_join(buf, sizeof buf, path, "model.safetensors");
    } else {
        snprintf(buf, sizeof buf, "%s", path);
    }
    snprintf(set->source, sizeof set->source, "%s", buf);
    st = ends_with(buf, ".json") ? open_index(set, buf) : add_file(set, buf);
    if (st != TPD_OK) {
        tpd_st_close(set);
        return st;
    }
    *set_p = set;
    return TPD_OK;
}

static float widen(const unsigned char *p, tpd_st_dtype dt) {
    switch (dt) {
    case TPD_ST_BF16:
        return tpd_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
    case TPD_ST_F16:
        return tpd_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
    case TPD_ST_F64: {
        double d;
        memcpy(&d, p, 8);
        return (float)d;
    }
    default: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    }
}

tpd_status tpd_st_read_f32(const tpd_st_set *set, const tpd_st_tensor *t, float *dst,
                           size_t numel) {
    const st_file *f = &set->files[t->file];
    unsigned es = g_dtypes[t->dtype].size;
    if ((t->end - t->begin) / es != numel)
        return tpd_fail(TPD_ERR_FORMAT,
                        "safetensors %s: tensor '%s' holds %llu values, %zu "
                        "expected",
                        f->path, t->name, (unsigned long long)((t->end - t->begin) / es), numel);
    if (t->dtype == TPD_ST_F32)
        return tpd_ckpt_pread(f->fd, f->path, dst, numel * 4, f->data_start + t->begin);
    unsigned char *buf = malloc(ST_READ_CHUNK);
    if (!buf) return tpd_fail(TPD_ERR_NOMEM, "safetensors: out of memory");
    tpd_status st = TPD_OK;
    size_t per = ST_READ_CHUNK / es;
    for (size_t i = 0; i < numel && st == TPD_OK; i += per) {
        size_t k = numel - i < per ? numel - i : per;
        st = tpd_ckpt_pread(f->fd, f->path, buf, k * es, f->data_start + t->begin + i * es);
        for (size_t j = 0; j < k && st == TPD_OK; j++)
            dst[i + j] = widen(buf + j * es, t->dtype);
    }
    free(buf);
    return st;
}

/* ---- writing ---- */

static uint64_t out_bytes(const tpd_st_out *t, unsigned es) {
    uint64_t n = es;
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

/* One shard: tensors [a, b) into path. */
static tpd_status write_shard(const char *path, const tpd_st_out *t, int a, int b,
                              tpd_st_dtype dtype, tpd_progress *prog, double *done) {
    unsigned es = dtype == TPD_ST_BF16 ? 2 : 4;
    cJSON *hdr = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(hdr, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t off = 0;
    for (int i = a; i < b; i++) {
        cJSON *e = cJSON_AddObjectToObject(hdr, t[i].name);
        cJSON_AddStringToObject(e, "dtype", tpd_st_dtype_name(dtype));
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += out_bytes(&t[i], es);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    }
    char *json = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    uint16_t *half = malloc(ST_READ_CHUNK);
    tpd_ckpt_writer *w = NULL;
    tpd_status st = TPD_OK;
    char hex[65];
    if (!json || !half) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "safetensors: out of memory");
    /* the header is padded with spaces so that the data starts 8-byte aligned */
    size_t hlen = strlen(json), padded = (hlen + 7) / 8 * 8;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    TPD_CHECK_GOTO(tpd_ckpt_writer_open(path, &w), st, out);
    TPD_CHECK_GOTO(tpd_ckpt_writer_put(w, len8, 8), st, out);
    TPD_CHECK_GOTO(tpd_ckpt_writer_put(w, json, hlen), st, out);
    TPD_CHECK_GOTO(tpd_ckpt_writer_put(w, "        ", padded - hlen), st, out);
    for (int i = a; i < b; i++) {
        size_t numel = out_bytes(&t[i], 1);
        *done += (double)(numel * es);
        tpd_progress_update(prog, *done);
        if (dtype == TPD_ST_F32) {
            TPD_CHECK_GOTO(tpd_ckpt_writer_put(w, t[i].data, numel * 4), st, out);
            continue;
        }
        size_t per = ST_READ_CHUNK / 2;
        for (size_t x = 0; x < numel; x += per) {
            size_t k = numel - x < per ? numel - x : per;
            for (size_t j = 0; j < k; j++)
                half[j] = tpd_bf16_from_f32(t[i].data[x + j]);
            TPD_CHECK_GOTO(tpd_ckpt_writer_put(w, half, k * 2), st, out);
        }
    }
    st = tpd_ckpt_writer_finish(w, hex, NULL);
    w = NULL;
out:
    tpd_ckpt_writer_abort(w);
    free(half);
    free(json);
    return st;
}

tpd_status tpd_st_write(const char *dir, const tpd_st_out *t, int n, tpd_st_dtype dtype,
                        uint64_t max_shard_bytes, int *files_p) {
    if (dtype != TPD_ST_F32 && dtype != TPD_ST_BF16)
        return tpd_fail(TPD_ERR_INVALID, "safetensors %s: only F32 and BF16 are written", dir);
    unsigned es = dtype == TPD_ST_BF16 ? 2 : 4;
    /* shard k holds tensors [first[k], first[k+1]); a tensor larger than the limit gets a
     * shard of its own, as in transformers */
    int *first = malloc((size_t)(n + 1) * sizeof *first);
    if (!first) return tpd_fail(TPD_ERR_NOMEM, "safetensors: out of memory");
    int shards = 0;
    uint64_t fill = 0, total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = out_bytes(&t[i], es);
        if (i == 0 || (max_shard_bytes && fill + b > max_shard_bytes)) {
            first[shards++] = i;
            fill = 0;
        }
        fill += b;
        total += b;
    }
    first[shards] = n;
    tpd_status st = TPD_OK;
    char path[TPD_CONFIG_STR + 64], name[64];
    tpd_progress prog;
    double done = 0;
    tpd_progress_begin(&prog, "export", (double)total, "MB", 1e6);
    if (shards <= 1) {
        tpd_ckpt_join(path, sizeof path, dir, "model.safetensors");
        st = write_shard(path, t, 0, n, dtype, &prog, &done);
    } else {
        cJSON *index = cJSON_CreateObject();
        cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        cJSON *map = cJSON_AddObjectToObject(index, "weight_map");
        for (int k = 0; k < shards && st == TPD_OK; k++) {
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, shards);
            tpd_ckpt_join(path, sizeof path, dir, name);
            st = write_shard(path, t, first[k], first[k + 1], dtype, &prog, &done);
            for (int i = first[k]; i < first[k + 1]; i++)
                cJSON_AddStringToObject(map, t[i].name, name);
        }
        char *text = cJSON_Print(index);
        cJSON_Delete(index);
        if (st == TPD_OK && !text) st = tpd_fail(TPD_ERR_NOMEM, "safetensors: out of memory");
        tpd_ckpt_join(path, sizeof path, dir, "model.safetensors.index.json");
        if (st == TPD_OK) st = tpd_ckpt_write_file(path, text, strlen(text));
        free(text);
    }
    tpd_progress_end(&prog, done);
    free(first);
    if (st == TPD_OK && files_p) *files_p = shards;
    return st;
}
