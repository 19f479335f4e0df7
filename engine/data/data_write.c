/* Writers of token data sets: the Megatron indexed builder (streaming, temp files renamed
 * into place so a failed write leaves nothing behind) and llm.c shards. */
#include "engine/data/data.h"
#include "engine/data/data_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- writers ---- */

static tpd_status write_all(FILE *f, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n) {
        tpd_log_error("%s: write failed: %s", path, strerror(errno));
        return TPD_ERR_IO;
    }
    return TPD_OK;
}

static tpd_status close_file(FILE *f, const char *path) {
    if (fclose(f) != 0) {
        tpd_log_error("%s: write failed at close: %s", path, strerror(errno));
        return TPD_ERR_IO;
    }
    return TPD_OK;
}

static tpd_status rename_into_place(const char *tmp, const char *path) {
    if (rename(tmp, path) != 0) {
        tpd_log_error("%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        return TPD_ERR_IO;
    }
    return TPD_OK;
}

struct tpd_indexed_builder {
    char *bin_path, *idx_path, *bin_tmp, *idx_tmp;
    FILE *bin;
    const dtype_info *dtype;
    int vocab_size;
    int32_t *sizes; /* (num_seq) tokens per sequence */
    uint64_t num_seq, cap_seq;
    uint64_t num_tokens;
    int finished;
};

tpd_status tpd_indexed_builder_create(const char *prefix, int vocab_size,
                                      tpd_indexed_builder **b_p) {
    tpd_status st = TPD_OK;
    if (!prefix || !prefix[0] || vocab_size <= 0) {
        tpd_log_error("indexed writer: need an output prefix and vocab_size > 0 (got %d)",
                      vocab_size);
        return TPD_ERR_INVALID;
    }
    tpd_indexed_builder *b = calloc(1, sizeof *b);
    if (!b) return tpd_fail_nomem("the indexed writer", sizeof *b);
    b->bin_path = tpd_data_path_join(prefix, ".bin");
    b->idx_path = tpd_data_path_join(prefix, ".idx");
    b->bin_tmp = tpd_data_path_join(prefix, ".bin.tmp");
    b->idx_tmp = tpd_data_path_join(prefix, ".idx.tmp");
    if (!b->bin_path || !b->idx_path || !b->bin_tmp || !b->idx_tmp)
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, destroy, "out of memory for the file names of %s", prefix);
    b->dtype = tpd_data_dtype_find(vocab_size < 65500 ? DTYPE_UINT16 : DTYPE_INT32);
    b->vocab_size = vocab_size;
    b->bin = fopen(b->bin_tmp, "wb");
    if (!b->bin)
        TPD_FAIL_GOTO(TPD_ERR_IO, st, destroy, "%s: cannot create: %s", b->bin_tmp,
                      strerror(errno));
    *b_p = b;
    return TPD_OK;
destroy:
    tpd_indexed_builder_destroy(b);
    return st;
}

tpd_status tpd_indexed_builder_add(tpd_indexed_builder *b, const int32_t *tokens, uint64_t n) {
    if (!b->bin || b->finished) {
        tpd_log_error("%s: document added to a finished or failed writer", b->bin_path);
        return TPD_ERR_INVALID;
    }
    if (n > INT32_MAX) {
        tpd_log_error("%s: document %llu has %llu tokens; a sequence holds at most %d", b->bin_path,
                      (unsigned long long)b->num_seq, (unsigned long long)n, INT32_MAX);
        return TPD_ERR_INVALID;
    }
    if (b->num_seq == b->cap_seq) {
        uint64_t cap = b->cap_seq ? 2 * b->cap_seq : 1024;
        int32_t *sizes = realloc(b->sizes, cap * sizeof *sizes);
        if (!sizes) return tpd_fail_nomem("the sequence lengths", cap * sizeof *sizes);
        b->sizes = sizes;
        b->cap_seq = cap;
    }
    /* Convert through a small buffer: the stored dtype is narrower than int32 for most
     * vocabularies. */
    uint8_t buf[4096];
    int size = b->dtype->size;
    uint64_t per = sizeof buf / (uint64_t)size;
    for (uint64_t at = 0; at < n; at += per) {
        uint64_t m = n - at < per ? n - at : per;
        for (uint64_t i = 0; i < m; i++) {
            int32_t v = tokens[at + i];
            if (v < 0 || v >= b->vocab_size) {
                tpd_log_error("%s: document %llu: token %d at index %llu is outside "
                              "[0, vocab_size %d)",
                              b->bin_path, (unsigned long long)b->num_seq, v,
                              (unsigned long long)(at + i), b->vocab_size);
                return TPD_ERR_INVALID;
            }
            if (size == 2) {
                uint16_t u = (uint16_t)v;
                memcpy(buf + 2 * i, &u, 2);
            } else {
                memcpy(buf + 4 * i, &v, 4);
            }
        }
        TPD_CHECK(write_all(b->bin, buf, m * (uint64_t)size, b->bin_tmp));
    }
    b->sizes[b->num_seq++] = (int32_t)n;
    b->num_tokens += n;
    return TPD_OK;
}

tpd_status tpd_indexed_builder_finish(tpd_indexed_builder *b) {
    tpd_status st = TPD_OK;
    if (!b->bin || b->finished) {
        tpd_log_error("%s: writer already finished or failed", b->idx_path);
        return TPD_ERR_INVALID;
    }
    FILE *bin = b->bin;
    b->bin = NULL;
    TPD_CHECK(close_file(bin, b->bin_tmp));
    FILE *f = fopen(b->idx_tmp, "wb");
    if (!f) {
        tpd_log_error("%s: cannot create: %s", b->idx_tmp, strerror(errno));
        return TPD_ERR_IO;
    }
    uint8_t hdr[IDX_HEADER_BYTES];
    uint64_t version = 1, nseq = b->num_seq, ndoc = b->num_seq + 1;
    memcpy(hdr, k_idx_magic, 9);
    memcpy(hdr + 9, &version, 8);
    hdr[17] = (uint8_t)b->dtype->code;
    memcpy(hdr + 18, &nseq, 8);
    memcpy(hdr + 26, &ndoc, 8);
    TPD_CHECK_GOTO(write_all(f, hdr, sizeof hdr, b->idx_tmp), st, close_idx);
    TPD_CHECK_GOTO(write_all(f, b->sizes, nseq * sizeof(int32_t), b->idx_tmp), st, close_idx);
    int64_t ptr = 0;
    for (uint64_t i = 0; i < nseq; i++) {
        TPD_CHECK_GOTO(write_all(f, &ptr, 8, b->idx_tmp), st, close_idx);
        ptr += (int64_t)b->sizes[i] * b->dtype->size;
    }
    /* One sequence per document: the document indices are 0, 1, ..., num_seq. */
    for (int64_t d = 0; d <= (int64_t)nseq; d++)
        TPD_CHECK_GOTO(write_all(f, &d, 8, b->idx_tmp), st, close_idx);
close_idx:
    TPD_CHECK_KEEP(close_file(f, b->idx_tmp), st);
    if (st != TPD_OK) return st;
    /* The pair commits as: old .idx gone, new .bin in place, new .idx in place. A failure
     * at any step leaves either the old pair or a .bin without its .idx (which no reader
     * takes for a data set), never a new .bin beside an old .idx. */
    if (unlink(b->idx_path) != 0 && errno != ENOENT) {
        tpd_log_error("%s: cannot replace it: %s (the old data set is unchanged)", b->idx_path,
                      strerror(errno));
        return TPD_ERR_IO;
    }
    TPD_CHECK(rename_into_place(b->bin_tmp, b->bin_path));
    if (rename_into_place(b->idx_tmp, b->idx_path) != TPD_OK) {
        unlink(b->bin_path); /* its index is lost: the .bin alone is no data set */
        return TPD_ERR_IO;
    }
    b->finished = 1;
    return TPD_OK;
}

void tpd_indexed_builder_destroy(tpd_indexed_builder *b) {
    if (!b) return;
    if (b->bin) fclose(b->bin);
    if (!b->finished) {
        /* Leave no half-written files; the previous data set, if any, stays intact. */
        if (b->bin_tmp) unlink(b->bin_tmp);
        if (b->idx_tmp) unlink(b->idx_tmp);
    }
    free(b->sizes);
    free(b->bin_path);
    free(b->idx_path);
    free(b->bin_tmp);
    free(b->idx_tmp);
    free(b);
}

tpd_status tpd_indexed_write(const char *prefix, const int32_t *tokens, const uint64_t *doc_offsets,
                             uint64_t num_docs, int vocab_size) {
    tpd_status st = TPD_OK;
    tpd_indexed_builder *b = NULL;
    if (num_docs && (!tokens || !doc_offsets)) {
        tpd_log_error("tpd_indexed_write: tokens and doc_offsets are required");
        return TPD_ERR_INVALID;
    }
    TPD_CHECK(tpd_indexed_builder_create(prefix, vocab_size, &b));
    for (uint64_t d = 0; d < num_docs; d++) {
        if (doc_offsets[d + 1] < doc_offsets[d])
            TPD_FAIL_GOTO(TPD_ERR_INVALID, st, destroy,
                          "tpd_indexed_write: doc_offsets[%llu] = %llu is below the "
                          "previous offset %llu",
                          (unsigned long long)(d + 1), (unsigned long long)doc_offsets[d + 1],
                          (unsigned long long)doc_offsets[d]);
        TPD_CHECK_GOTO(tpd_indexed_builder_add(b, tokens + doc_offsets[d],
                                               doc_offsets[d + 1] - doc_offsets[d]),
                       st, destroy);
    }
    TPD_CHECK_GOTO(tpd_indexed_builder_finish(b), st, destroy);
destroy:
    tpd_indexed_builder_destroy(b);
    return st;
}

tpd_status tpd_llmc_shard_write(const char *path, const uint16_t *tokens, uint64_t ntok) {
    tpd_status st = TPD_OK;
    if (!path || !path[0] || ntok > INT32_MAX || (ntok && !tokens)) {
        tpd_log_error("tpd_llmc_shard_write: need a path and at most %d tokens (got %llu)",
                      INT32_MAX, (unsigned long long)ntok);
        return TPD_ERR_INVALID;
    }
    char *tmp = tpd_data_path_join(path, ".tmp");
    if (!tmp) return tpd_fail_nomem("a path", strlen(path) + sizeof ".tmp");
    FILE *f = fopen(tmp, "wb");
    if (!f) TPD_FAIL_GOTO(TPD_ERR_IO, st, free_tmp, "%s: cannot create: %s", tmp, strerror(errno));
    int32_t hdr[256] = {LLMC_MAGIC, 1, (int32_t)ntok};
    TPD_CHECK_GOTO(write_all(f, hdr, sizeof hdr, tmp), st, close_shard);
    TPD_CHECK_GOTO(write_all(f, tokens, ntok * sizeof(uint16_t), tmp), st, close_shard);
close_shard:
    TPD_CHECK_KEEP(close_file(f, tmp), st);
    if (st == TPD_OK) st = rename_into_place(tmp, path);
    if (st != TPD_OK) unlink(tmp);
free_tmp:
    free(tmp);
    return st;
}
