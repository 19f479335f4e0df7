/* `tripod data prepare`: tokenization of text files into a Megatron indexed data set, and
 * the byte-level detokenizer.
 *
 * By default bytes are the vocabulary (0..255) plus one end-of-document token (256), so
 * the demo needs no tokenizer files and any text, in any encoding, round-trips exactly.
 * With a BPE tokenizer (GPT-2's files or a tokenizer.json) the documents are its ids, as
 * its encode with special tokens gives them (a BOS when its post-processor adds one),
 * each ended by its end-of-document token when asked. */
#include "engine/data/data.h"

#include "base/file.h"
#include "base/progress.h"
#include "engine/data/jsonl.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static tpd_status read_file(const char *path, unsigned char **buf_p, size_t *len_p) {
    int err;
    tpd_status st = tpd_file_read_all(path, (char **)buf_p, len_p, &err);
    if (st == TPD_ERR_NOMEM)
        tpd_log_error("%s: out of memory reading it", path);
    else if (st != TPD_OK)
        tpd_log_error("%s: cannot read: %s", path, tpd_file_strerror(err));
    return st;
}

static int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* line = [p, p+n), its '\n' excluded. */
static int is_blank_line(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return 0;
    return 1;
}

static int is_percent_line(const unsigned char *p, size_t n) {
    return (n == 1 && p[0] == '%') || (n == 2 && p[0] == '%' && p[1] == '\r');
}

/* A record waiting for the BPE encoder, and its ids once encoded. */
typedef struct pending_record {
    const unsigned char *p;
    size_t n;
    int32_t *ids;
    size_t nids, cap;
    tpd_status st;
} pending_record;

typedef struct prepare_state {
    tpd_indexed_builder *builder;
    const tpd_bpe *bpe; /* NULL: bytes */
    int append_eod;
    pending_record *pending; /* BPE: the current file's records, encoded in parallel */
    size_t npending, pending_cap;
    int32_t *scratch; /* (scratch_cap) tokens of the current document */
    size_t scratch_cap;
    uint64_t docs, tokens;
    size_t pending_bytes; /* BPE: bytes of the pending records */
    double done_bytes;    /* input bytes written out, for the progress line */
    tpd_progress progress;
} prepare_state;

static tpd_status flush_bpe(prepare_state *ps);

/* BPE records are encoded in batches of this many input bytes, so a large file shows
 * progress and does not hold all its ids at once; each record is still encoded alone and
 * appended in order, so the output does not depend on it. */
#define PREPARE_BPE_BATCH (8u << 20)

/* Appends one record as a document: its bytes, then EOD. Whitespace-only records carry
 * nothing to learn and are skipped. */
static tpd_status emit_record(prepare_state *ps, const unsigned char *p, size_t n) {
    size_t i = 0;
    while (i < n && is_space(p[i]))
        i++;
    if (i == n) return TPD_OK;
    if (ps->bpe) {
        if (ps->npending == ps->pending_cap) {
            size_t cap = ps->pending_cap ? 2 * ps->pending_cap : 1024;
            pending_record *r = realloc(ps->pending, cap * sizeof *r);
            if (!r) {
                tpd_log_error("out of memory for %zu records", cap);
                return TPD_ERR_NOMEM;
            }
            ps->pending = r;
            ps->pending_cap = cap;
        }
        ps->pending[ps->npending++] = (pending_record){.p = p, .n = n};
        ps->pending_bytes += n;
        return ps->pending_bytes >= PREPARE_BPE_BATCH ? flush_bpe(ps) : TPD_OK;
    }
    size_t eod = ps->append_eod ? 1 : 0;
    if (n + 1 > ps->scratch_cap) {
        int32_t *s = realloc(ps->scratch, (n + 1) * sizeof *s);
        if (!s) {
            tpd_log_error("out of memory for a document of %zu bytes", n);
            return TPD_ERR_NOMEM;
        }
        ps->scratch = s;
        ps->scratch_cap = n + 1;
    }
    for (i = 0; i < n; i++)
        ps->scratch[i] = p[i];
    ps->scratch[n] = TPD_BYTE_EOD;
    TPD_CHECK(tpd_indexed_builder_add(ps->builder, ps->scratch, n + eod));
    ps->docs++;
    ps->tokens += n + eod;
    ps->done_bytes += (double)n;
    tpd_progress_update(&ps->progress, ps->done_bytes);
    return TPD_OK;
}

/* BPE: encodes the pending records on every thread (each record alone, so the ids do not
 * depend on the thread count), then appends them in order, each ended by EOD if asked. */
static tpd_status flush_bpe(prepare_state *ps) {
    long n = (long)ps->npending;
    int32_t eod = tpd_bpe_eod(ps->bpe);
#pragma omp parallel for schedule(dynamic, 16)
    for (long i = 0; i < n; i++) {
        pending_record *r = &ps->pending[i];
        r->st = tpd_bpe_encode_ex(ps->bpe, (const char *)r->p, r->n, 1, &r->ids, &r->nids, &r->cap);
        if (!ps->append_eod) continue;
        if (r->st == TPD_OK && r->nids == r->cap) {
            int32_t *ids = realloc(r->ids, (r->nids + 1) * sizeof *ids);
            if (ids)
                r->ids = ids, r->cap = r->nids + 1;
            else
                r->st = TPD_ERR_NOMEM;
        }
        if (r->st == TPD_OK) r->ids[r->nids++] = eod;
    }
    tpd_status st = TPD_OK;
    for (long i = 0; i < n; i++) {
        pending_record *r = &ps->pending[i];
        if (st == TPD_OK) st = r->st;
        if (st == TPD_OK) st = tpd_indexed_builder_add(ps->builder, r->ids, r->nids);
        if (st == TPD_OK) {
            ps->docs++;
            ps->tokens += r->nids;
            ps->done_bytes += (double)r->n;
        }
        free(r->ids);
    }
    ps->npending = 0;
    ps->pending_bytes = 0;
    tpd_progress_update(&ps->progress, ps->done_bytes);
    if (st == TPD_ERR_NOMEM) tpd_log_error("data prepare: out of memory encoding records");
    return st;
}

/* Splits one file's bytes into records. A record is [start, end) of whole lines, each
 * with its '\n'; separator lines belong to no record. */
static tpd_status split_records(prepare_state *ps, const unsigned char *buf, size_t len,
                                tpd_records records) {
    if (records == TPD_RECORDS_FILE) return emit_record(ps, buf, len);
    size_t start = 0, pos = 0;
    while (pos < len) {
        const unsigned char *nl = memchr(buf + pos, '\n', len - pos);
        size_t line_end = nl ? (size_t)(nl - buf) : len; /* the '\n' or the end */
        size_t next = nl ? line_end + 1 : len;
        int sep = records == TPD_RECORDS_BLANK ? is_blank_line(buf + pos, line_end - pos)
                                               : is_percent_line(buf + pos, line_end - pos);
        if (sep) {
            TPD_CHECK(emit_record(ps, buf + start, pos - start));
            start = next;
        }
        pos = next;
    }
    return emit_record(ps, buf + start, len - start);
}

/* Whether a JSON text holds the escape \u0000 (its backslash not itself escaped): cJSON
 * decodes it into a C string, which would end the document there. */
static int has_nul_escape(const unsigned char *s, size_t n) {
    for (size_t i = 0; i + 6 <= n; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && !memcmp(s + i + 2, "0000", 4)) return 1;
        i++; /* the escaped character, maybe a backslash */
    }
    return 0;
}

/* JSON Lines: the documents are the `key` strings of the file's objects, decoded into
 * *arena_p (which the caller frees after the records are written) and emitted in order.
 * Blank lines are skipped; anything else that is not an object with that string is an
 * error naming the file and line. */
static tpd_status jsonl_records(prepare_state *ps, const char *path, const unsigned char *buf,
                                size_t len, const char *key, char **arena_p) {
    tpd_status st = TPD_OK;
    size_t cap = len + 1, used = 0, nrec = 0, rcap = 0;
    char *arena = malloc(cap); /* decoded JSON strings are never longer than their source */
    size_t(*rec)[2] = NULL;    /* offset, length in arena */
    *arena_p = arena;
    if (!arena) {
        tpd_log_error("%s: out of memory", path);
        return TPD_ERR_NOMEM;
    }
    size_t pos = 0, line = 0;
    while (pos < len && st == TPD_OK) {
        const unsigned char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        line++;
        if (!is_blank_line(buf + pos, end - pos)) {
            cJSON *o = NULL; /* a line that is no JSON is logged there, with its column */
            st = tpd_jsonl_parse(path, line, (const char *)buf + pos, end - pos, &o);
            const cJSON *v = st == TPD_OK ? tpd_jsonl_get(o, key) : NULL;
            if (st != TPD_OK) {
            } else if (!cJSON_IsString(v)) {
                tpd_log_error("%s:%zu: %s (JSON Lines: one object per line, with the "
                              "document's text in the string field \"%s\")",
                              path, line,
                              !cJSON_IsObject(o) ? "not a JSON object"
                              : v                ? "the field is not a string"
                                                 : "no such field",
                              key);
                st = TPD_ERR_FORMAT;
            } else if (has_nul_escape(buf + pos, end - pos)) {
                /* never a silently shorter document */
                tpd_log_error("%s:%zu: the line holds a NUL character (\\u0000), which "
                              "would cut the document's text short; remove it",
                              path, line);
                st = TPD_ERR_FORMAT;
            } else {
                size_t n = strlen(v->valuestring);
                if (nrec == rcap) {
                    rcap = rcap ? 2 * rcap : 1024;
                    void *r = realloc(rec, rcap * sizeof *rec);
                    if (!r)
                        st = TPD_ERR_NOMEM;
                    else
                        rec = r;
                }
                if (st == TPD_OK && used + n <= cap) {
                    memcpy(arena + used, v->valuestring, n);
                    rec[nrec][0] = used;
                    rec[nrec][1] = n;
                    nrec++;
                    used += n;
                }
            }
            cJSON_Delete(o);
        }
        pos = nl ? end + 1 : len;
    }
    if (st == TPD_ERR_NOMEM) tpd_log_error("%s: out of memory", path);
    for (size_t i = 0; i < nrec && st == TPD_OK; i++)
        st = emit_record(ps, (const unsigned char *)arena + rec[i][0], rec[i][1]);
    free(rec);
    return st;
}

tpd_status tpd_data_prepare(const char *const *inputs, int n_inputs, const tpd_prepare_opts *opts,
                            const char *output_prefix, uint64_t *num_docs_p,
                            uint64_t *num_tokens_p) {
    tpd_status st = TPD_OK;
    tpd_prepare_opts dflt = TPD_PREPARE_OPTS_INIT;
    if (!opts) opts = &dflt;
    tpd_records records = opts->records;
    const tpd_bpe *bpe = opts->bpe;
    if (!inputs || n_inputs <= 0 || !output_prefix || !output_prefix[0]) {
        tpd_log_error("data prepare: need at least one input file and an output prefix");
        return TPD_ERR_INVALID;
    }
    if (records != TPD_RECORDS_FILE && records != TPD_RECORDS_BLANK &&
        records != TPD_RECORDS_PERCENT && records != TPD_RECORDS_JSONL) {
        tpd_log_error("data prepare: unknown records mode %d", (int)records);
        return TPD_ERR_INVALID;
    }
    if (bpe && !opts->omit_eod && tpd_bpe_eod(bpe) < 0) {
        tpd_log_error("data prepare: the tokenizer has no end-of-document token to end "
                      "documents with (GPT-2's files: <|endoftext|>)");
        return TPD_ERR_INVALID;
    }
    prepare_state ps = {0};
    ps.bpe = bpe;
    ps.append_eod = !opts->omit_eod;
    TPD_CHECK(tpd_indexed_builder_create(
        output_prefix, bpe ? tpd_bpe_vocab_size(bpe) : TPD_BYTE_VOCAB, &ps.builder));
    /* One file in memory at a time; documents stream to PREFIX.bin. */
    double total = 0, files_done = 0;
    for (int i = 0; i < n_inputs; i++) {
        struct stat sb;
        if (stat(inputs[i], &sb) == 0) total += (double)sb.st_size;
    }
    tpd_progress_begin(&ps.progress, "data prepare", total, "MB", 1e6);
    for (int i = 0; i < n_inputs; i++) {
        unsigned char *buf = NULL;
        size_t len = 0;
        char *arena = NULL;
        TPD_CHECK_GOTO(read_file(inputs[i], &buf, &len), st, destroy_builder);
        st = records == TPD_RECORDS_JSONL
                 ? jsonl_records(&ps, inputs[i], buf, len,
                                 opts->json_key && opts->json_key[0] ? opts->json_key : "text",
                                 &arena)
                 : split_records(&ps, buf, len, records);
        if (ps.bpe && st == TPD_OK) st = flush_bpe(&ps);
        ps.npending = 0; /* records point into buf or arena */
        ps.pending_bytes = 0;
        free(arena);
        free(buf);
        if (st != TPD_OK) goto destroy_builder;
        files_done += (double)len;
        ps.done_bytes = files_done; /* separators and JSON syntax count as done too */
        tpd_progress_update(&ps.progress, ps.done_bytes);
    }
    tpd_progress_end(&ps.progress, ps.done_bytes);
    if (ps.docs == 0) {
        tpd_log_error("data prepare: the %d input file(s) hold no non-empty record; "
                      "nothing to write to %s",
                      n_inputs, output_prefix);
        st = TPD_ERR_INVALID;
        goto destroy_builder;
    }
    TPD_CHECK_GOTO(tpd_indexed_builder_finish(ps.builder), st, destroy_builder);
    if (num_docs_p) *num_docs_p = ps.docs;
    if (num_tokens_p) *num_tokens_p = ps.tokens;
destroy_builder:
    if (st != TPD_OK) tpd_progress_end(&ps.progress, ps.done_bytes); /* end the line */
    tpd_indexed_builder_destroy(ps.builder);
    free(ps.scratch);
    free(ps.pending);
    return st;
}

size_t tpd_bytes_detokenize(const int32_t *tokens, size_t n, char *out, size_t cap) {
    if (cap == 0) return 0;
    size_t m = n < cap - 1 ? n : cap - 1;
    for (size_t i = 0; i < m; i++) {
        int32_t t = tokens[i];
        char c;
        if (t == TPD_BYTE_EOD || t == '\n')
            c = '\n';
        else if (t == '\t')
            c = '\t';
        else if (t < 32 || t == 127 || t > 255)
            c = '?'; /* controls and padded ids */
        else
            c = (char)(unsigned char)t;
        out[i] = c;
    }
    out[m] = '\0';
    return m;
}
