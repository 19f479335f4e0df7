/* safetensors files (Hugging Face's weight format), single or sharded, read and written.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 * {"__metadata__": {...}, NAME: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
 * and the data; offsets are relative to the data's start, each tensor is row-major and
 * e - b = numel * dtype size. A sharded model is model.safetensors.index.json, whose
 * "weight_map" names the file of every tensor, beside model-0000k-of-0000n.safetensors.
 *
 * Reading is tensor by tensor (pread), so a model never has to fit in memory twice; F32,
 * BF16, F16 and F64 widen or narrow to fp32 (bf16 and fp16 widen exactly). Every error
 * names the file, and the tensor when there is one. */
#ifndef TPD_ENGINE_SAFETENSORS_H
#define TPD_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPD_ST_MAX_DIMS 8

typedef enum tpd_st_dtype {
    TPD_ST_F32 = 0,
    TPD_ST_BF16,
    TPD_ST_F16,
    TPD_ST_F64,
} tpd_st_dtype;

typedef struct tpd_st_tensor {
    char *name;
    tpd_st_dtype dtype;
    int ndim;
    int64_t shape[TPD_ST_MAX_DIMS];
    uint64_t begin, end; /* bytes, relative to the data of its file */
    int file;            /* index into the set's files */
} tpd_st_tensor;

typedef struct tpd_st_set tpd_st_set;

/* Parses one file's header (the JSON text after the 8-byte length) for a file whose data
 * part holds data_bytes bytes. Appends its tensors to *set (file index `file`). Exposed for
 * the tests and the fuzzer; `path` only names the file in errors. */
tpd_status tpd_st_parse_header(tpd_st_set *set, int file, const char *path, const char *json,
                               size_t len, uint64_t data_bytes);

/* path: a directory (model.safetensors.index.json when present, else model.safetensors),
 * a .safetensors file, or an index .json file. */
tpd_status tpd_st_open(const char *path, tpd_st_set **set_p);
/* An empty set, for tpd_st_parse_header alone. */
tpd_status tpd_st_create(tpd_st_set **set_p);
void tpd_st_close(tpd_st_set *set);

int tpd_st_count(const tpd_st_set *set);
const tpd_st_tensor *tpd_st_get(const tpd_st_set *set, int i);
const tpd_st_tensor *tpd_st_find(const tpd_st_set *set, const char *name);
/* What the set was opened from: the index file, or the one .safetensors file. */
const char *tpd_st_source(const tpd_st_set *set);
/* The file a tensor is read from (for error messages). */
const char *tpd_st_file_path(const tpd_st_set *set, int file);
const char *tpd_st_dtype_name(tpd_st_dtype dt);

/* numel of t as fp32 into dst (numel must equal the tensor's). */
tpd_status tpd_st_read_f32(const tpd_st_set *set, const tpd_st_tensor *t, float *dst, size_t numel);

/* One tensor to write: fp32 values, written as `dtype` (F32 or BF16, rounded to nearest
 * even). */
typedef struct tpd_st_out {
    const char *name;
    int ndim;
    int64_t shape[2];
    const float *data;
} tpd_st_out;

/* Writes the tensors, in order, into dir: model.safetensors when they fit in one shard of
 * max_shard_bytes (0: no limit), else model-0000k-of-0000n.safetensors plus
 * model.safetensors.index.json. dir must exist. *files_p gets the shard count. */
tpd_status tpd_st_write(const char *dir, const tpd_st_out *t, int n, tpd_st_dtype dtype,
                        uint64_t max_shard_bytes, int *files_p);

#ifdef __cplusplus
}
#endif
#endif
