/* Byte-level BPE: the vocabulary and merge ranks in glibc's hash tables (hsearch_r), the
 * pre-token patterns through PCRE2, GPT-2's vocab.json through cJSON. Hugging Face's
 * tokenizer.json is read into the same tables by tokenizer_hf.c. */
#include "engine/data/tokenizer_internal.h"

#include "base/file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const tpd_bpe_gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
#define EOD_SPELLING "<|endoftext|>"

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes keep their code point, the other 68
 * bytes take 256, 257, ... in byte order. */
static void build_alphabet(tpd_bpe *b) {
    int next = 256;
    for (int i = 0; i < BPE_MAX_CP; i++)
        b->byte_of[i] = -1;
    for (int c = 0; c < 256; c++) {
        int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
        int cp = printable ? c : next++;
        b->byte_of[cp] = (int16_t)c;
        if (cp < 0x80) {
            b->alpha[c][0] = (char)cp;
            b->alpha[c][1] = 0;
        } else {
            b->alpha[c][0] = (char)(0xC0 | (cp >> 6));
            b->alpha[c][1] = (char)(0x80 | (cp & 0x3F));
            b->alpha[c][2] = 0;
        }
    }
}

static char *read_text(const char *path) {
    char *text = NULL;
    int err;
    tpd_status st = tpd_file_read_all(path, &text, NULL, &err);
    if (st != TPD_OK)
        tpd_log_error("%s: cannot read: %s", path,
                      st == TPD_ERR_NOMEM ? "out of memory" : tpd_file_strerror(err));
    return text;
}

static int table_find(struct hsearch_data *t, const char *key) {
    ENTRY e = {(char *)key, NULL}, *found = NULL;
    if (!hsearch_r(e, FIND, &found, t) || !found) return -1;
    return (int)(intptr_t)found->data - 1;
}

static int table_add(struct hsearch_data *t, char *key, int value) {
    ENTRY e = {key, (void *)(intptr_t)(value + 1)}, *found = NULL;
    return hsearch_r(e, ENTER, &found, t) && found;
}

tpd_bpe *tpd_bpe_alloc(void) {
    tpd_bpe *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->eod = -1;
    build_alphabet(b);
    return b;
}

tpd_status tpd_bpe_reserve(tpd_bpe *b, const char *path, int nspell, int n) {
    b->nspell = nspell;
    b->spell = calloc((size_t)(nspell > 0 ? nspell : 1), sizeof *b->spell);
    b->raw = calloc((size_t)(nspell > 0 ? nspell : 1), 1);
    if (!b->spell || !b->raw || !hcreate_r((size_t)n * 2 + 1, &b->vocab)) {
        tpd_log_error("%s: out of memory for %d tokens", path, n);
        return TPD_ERR_NOMEM;
    }
    b->have_vocab = 1;
    return TPD_OK;
}

tpd_status tpd_bpe_add_token(tpd_bpe *b, const char *path, const char *s, int id) {
    if (b->spell[id]) {
        tpd_log_error("%s: id %d is given to both '%s' and '%s'", path, id, b->spell[id], s);
        return TPD_ERR_INVALID;
    }
    b->spell[id] = strdup(s);
    if (!b->spell[id] || !table_add(&b->vocab, b->spell[id], id)) {
        tpd_log_error("%s: out of memory", path);
        return TPD_ERR_NOMEM;
    }
    return TPD_OK;
}

int tpd_bpe_find(const tpd_bpe *b, const char *spelling) {
    return table_find((struct hsearch_data *)&b->vocab, spelling);
}

int tpd_bpe_mark_missing_bytes(tpd_bpe *b) {
    b->nmissing = 0;
    for (int c = 0; c < 256; c++) {
        b->byte_missing[c] = tpd_bpe_find(b, b->alpha[c]) < 0;
        b->nmissing += b->byte_missing[c];
    }
    return b->nmissing;
}

tpd_status tpd_bpe_check_bytes(const tpd_bpe *b, const char *path) {
    /* every byte must spell a token, or some text could not be encoded */
    for (int c = 0; c < 256; c++)
        if (tpd_bpe_find(b, b->alpha[c]) < 0) {
            tpd_log_error("%s: byte 0x%02x ('%s') has no token (a byte-level BPE vocabulary "
                          "holds all 256 bytes)",
                          path, c, b->alpha[c]);
            return TPD_ERR_INVALID;
        }
    return TPD_OK;
}

tpd_status tpd_bpe_reserve_merges(tpd_bpe *b, const char *path, int n) {
    b->merge_keys = calloc((size_t)(n > 0 ? n : 1), sizeof *b->merge_keys);
    if (!b->merge_keys || !hcreate_r((size_t)n * 2 + 1, &b->merges)) {
        tpd_log_error("%s: out of memory for %d merges", path, n);
        return TPD_ERR_NOMEM;
    }
    b->merges_cap = n;
    b->have_merges = 1;
    return TPD_OK;
}

tpd_status tpd_bpe_add_merge(tpd_bpe *b, const char *where, const char *first, const char *second) {
    size_t fl = strlen(first), sl = strlen(second);
    char *key = malloc(fl + sl + 2);
    if (!key || b->nmerges >= b->merges_cap) {
        free(key);
        tpd_log_error("%s: out of memory", where);
        return TPD_ERR_NOMEM;
    }
    memcpy(key, first, fl);
    memcpy(key + fl, second, sl + 1); /* first+second: the merged token */
    const char *missing = tpd_bpe_find(b, first) < 0    ? first
                          : tpd_bpe_find(b, second) < 0 ? second
                          : tpd_bpe_find(b, key) < 0    ? key
                                                        : NULL;
    if (missing) {
        tpd_log_error("%s: merge '%s %s': '%s' is not in the vocabulary", where, first, second,
                      missing);
        free(key);
        return TPD_ERR_INVALID;
    }
    key[fl] = ' ';
    memcpy(key + fl + 1, second, sl + 1);
    b->merge_keys[b->nmerges] = key;
    if (!table_add(&b->merges, key, b->nmerges)) {
        tpd_log_error("%s: out of memory", where);
        return TPD_ERR_NOMEM;
    }
    b->nmerges++;
    return TPD_OK;
}

tpd_status tpd_bpe_add_split(tpd_bpe *b, const char *where, const char *pattern, int literal,
                             bpe_behavior behavior, int invert) {
    if (b->nsteps == BPE_MAX_STEPS) {
        tpd_log_error("%s: more than %d pre-tokenizer steps", where, BPE_MAX_STEPS);
        return TPD_ERR_UNSUPPORTED;
    }
    int err;
    PCRE2_SIZE at;
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        tpd_log_error("%s: the pattern does not compile (PCRE2) at %zu: %s", where, (size_t)at,
                      (const char *)msg);
        return TPD_ERR_FORMAT;
    }
    /* JIT when the platform has it (much faster); the interpreter otherwise */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    b->steps[b->nsteps++] = (bpe_step){.re = re, .behavior = behavior, .invert = invert};
    return TPD_OK;
}

static tpd_status load_vocab(tpd_bpe *b, const char *path) {
    char *text = read_text(path);
    if (!text) return TPD_ERR_IO;
    tpd_status st = TPD_OK;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        tpd_log_error("%s: not a JSON object of token -> id (GPT-2's vocab.json)", path);
        st = TPD_ERR_INVALID;
        goto done;
    }
    int n = cJSON_GetArraySize(root), max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        double v = it->valuedouble;
        if (!cJSON_IsNumber(it) || v < 0 || v >= (1 << 24) || v != (int)v) {
            tpd_log_error("%s: token '%s': id must be an integer in [0, 2^24)", path, it->string);
            st = TPD_ERR_INVALID;
            goto done;
        }
        if ((int)v > max_id) max_id = (int)v;
    }
    TPD_CHECK_GOTO(tpd_bpe_reserve(b, path, max_id + 1, n), st, done);
    cJSON_ArrayForEach(it, root) {
        TPD_CHECK_GOTO(tpd_bpe_add_token(b, path, it->string, it->valueint), st, done);
        if (!strcmp(it->string, EOD_SPELLING)) {
            b->eod = it->valueint;
            b->raw[b->eod] = 1; /* a special token spells itself */
        }
    }
    st = tpd_bpe_check_bytes(b, path);
done:
    cJSON_Delete(root);
    return st;
}

static tpd_status load_merges(tpd_bpe *b, const char *path) {
    char *text = read_text(path);
    if (!text) return TPD_ERR_IO;
    tpd_status st = TPD_OK;
    int lines = 1;
    for (const char *p = text; *p; p++)
        lines += *p == '\n';
    TPD_CHECK_GOTO(tpd_bpe_reserve_merges(b, path, lines), st, done);
    char *save = NULL, where[4096];
    int lineno = 0;
    for (char *line = text; line; line = save) {
        char *nl = strchr(line, '\n');
        save = nl ? nl + 1 : NULL;
        if (nl) *nl = 0;
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = 0;
        if (!len || (lineno == 1 && !strncmp(line, "#version", 8))) continue;
        char *sp = strchr(line, ' ');
        if (!sp || sp == line || !sp[1] || strchr(sp + 1, ' ')) {
            tpd_log_error("%s:%d: '%s' is not a merge (two tokens separated by one space)", path,
                          lineno, line);
            st = TPD_ERR_INVALID;
            goto done;
        }
        *sp = 0;
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        TPD_CHECK_GOTO(tpd_bpe_add_merge(b, where, line, sp + 1), st, done);
    }
done:
    free(text);
    return st;
}

tpd_status tpd_bpe_load(const char *vocab_json, const char *merges_txt, tpd_bpe **bpe_p) {
    tpd_bpe *b = tpd_bpe_alloc();
    if (!b) return tpd_fail_nomem("the tokenizer", sizeof *b);
    tpd_status st = TPD_OK;
    TPD_CHECK_GOTO(load_vocab(b, vocab_json), st, fail);
    TPD_CHECK_GOTO(load_merges(b, merges_txt), st, fail);
    TPD_CHECK_GOTO(tpd_bpe_add_split(b, "tokenizer: GPT-2's pattern", tpd_bpe_gpt2_pattern, 0,
                                     BPE_ISOLATED, 0),
                   st, fail);
    *bpe_p = b;
    return TPD_OK;
fail:
    tpd_bpe_destroy(b);
    return st;
}

void tpd_bpe_destroy(tpd_bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->nsteps; i++)
        if (b->steps[i].re) pcre2_code_free(b->steps[i].re);
    if (b->have_merges) hdestroy_r(&b->merges);
    if (b->have_vocab) hdestroy_r(&b->vocab);
    for (int i = 0; i < b->nmerges; i++)
        free(b->merge_keys[i]);
    free(b->merge_keys);
    for (int i = 0; i < b->nspell; i++)
        free(b->spell[i]);
    free(b->spell);
    free(b->raw);
    for (int i = 0; i < b->nadded; i++)
        free(b->added[i].content);
    free(b->added);
    free(b);
}

int tpd_bpe_vocab_size(const tpd_bpe *b) {
    return b->nspell;
}

int32_t tpd_bpe_eod(const tpd_bpe *b) {
    return b->eod;
}

const char *tpd_bpe_token(const tpd_bpe *b, int32_t id) {
    return id >= 0 && id < b->nspell ? b->spell[id] : NULL;
}

/* The encoder's buffers grow as a text needs; a failed growth is returned unlogged
 * (tpd_bpe_encode's caller logs it once). */
static tpd_status push_id(int32_t id, int32_t **ids_p, size_t *n_p, size_t *cap_p) {
    if (*n_p == *cap_p) {
        size_t cap = *cap_p ? 2 * *cap_p : 1024;
        int32_t *ids = realloc(*ids_p, cap * sizeof *ids);
        if (!ids) return TPD_ERR_NOMEM;
        *ids_p = ids;
        *cap_p = cap;
    }
    (*ids_p)[(*n_p)++] = id;
    return TPD_OK;
}

/* Scratch of one pre-token: its spelling and the symbol boundaries in it. */
typedef struct word {
    char *spelled; /* NUL-terminated */
    size_t *bound; /* (m+1) symbol i is spelled[bound[i], bound[i+1]) */
    char *key;     /* a symbol, or "first second", NUL-terminated */
    char *pair;    /* the pair being merged, copied: "first" NUL "second" */
    size_t cap;    /* bytes of the pre-token the buffers hold */
} word;

/* word->key = symbols i and i+1 joined by one space (or symbol i alone when pair is 0). */
static const char *symbol_key(word *w, size_t i, int pair) {
    size_t a = w->bound[i + 1] - w->bound[i];
    memcpy(w->key, w->spelled + w->bound[i], a);
    if (pair) {
        size_t c = w->bound[i + 2] - w->bound[i + 1];
        w->key[a++] = ' ';
        memcpy(w->key + a, w->spelled + w->bound[i + 1], c);
        a += c;
    }
    w->key[a] = 0;
    return w->key;
}

static int same_symbol(const word *w, size_t i, const char *s, size_t len) {
    return w->bound[i + 1] - w->bound[i] == len && !memcmp(w->spelled + w->bound[i], s, len);
}

/* Where the ids go. */
typedef struct id_sink {
    int32_t **ids_p;
    size_t *n_p, *cap_p;
} id_sink;

/* Spells the k bytes p as w's symbols, one a byte (without those that have no token when
 * skip_missing); *m_p gets the symbol count. Returns the spelling's length (bytes). */
static size_t spell_word(const tpd_bpe *b, word *w, const unsigned char *p, size_t k,
                         int skip_missing, size_t *m_p) {
    size_t m = 0, len = 0;
    for (size_t i = 0; i < k; i++) {
        if (skip_missing && b->byte_missing[p[i]]) continue;
        w->bound[m++] = len;
        size_t l = strlen(b->alpha[p[i]]);
        memcpy(w->spelled + len, b->alpha[p[i]], l);
        len += l;
    }
    w->bound[m] = len;
    w->spelled[len] = 0;
    *m_p = m;
    return len;
}

static tpd_status encode_word(const tpd_bpe *b, word *w, const unsigned char *p, size_t k,
                              const id_sink *out) {
    if (k > w->cap) {
        /* two spelled bytes per byte; a pair key is at most the whole spelling + 1 */
        char *s = realloc(w->spelled, 2 * k + 1), *key = NULL, *pair = NULL;
        size_t *bd = NULL;
        if (s) w->spelled = s;
        if (s) key = realloc(w->key, 2 * k + 2);
        if (key) w->key = key;
        if (key) pair = realloc(w->pair, 2 * k + 2);
        if (pair) w->pair = pair;
        if (pair) bd = realloc(w->bound, (k + 1) * sizeof *bd);
        if (!bd) return TPD_ERR_NOMEM;
        w->bound = bd;
        w->cap = k;
    }
    size_t m = 0, len = spell_word(b, w, p, k, 0, &m);
    int whole = b->ignore_merges ? tpd_bpe_find(b, w->spelled) : -1;
    if (whole >= 0) return push_id(whole, out->ids_p, out->n_p, out->cap_p);
    /* `tokenizers` drops a byte without a token before merging (no byte_fallback, no
     * unk_token): its neighbours become adjacent */
    if (b->nmissing) len = spell_word(b, w, p, k, 1, &m);
    /* merge the lowest-ranked adjacent pair everywhere, left to right, until none ranks */
    while (m > 1) {
        int best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            int r = table_find((struct hsearch_data *)&b->merges, symbol_key(w, i, 1));
            if (r >= 0 && (best < 0 || r < best)) {
                best = r;
                at = i;
            }
        }
        if (best < 0) break;
        /* the pair's two symbols, copied: the boundaries move while merging */
        size_t fl = w->bound[at + 1] - w->bound[at], sl = w->bound[at + 2] - w->bound[at + 1];
        char *first = w->pair, *second = w->pair + fl + 1;
        memcpy(first, w->spelled + w->bound[at], fl);
        memcpy(second, w->spelled + w->bound[at + 1], sl);
        size_t o = 0;
        for (size_t i = 0; i < m; o++) {
            w->bound[o] = w->bound[i];
            if (i + 1 < m && same_symbol(w, i, first, fl) && same_symbol(w, i + 1, second, sl))
                i += 2;
            else
                i += 1;
        }
        w->bound[o] = len;
        m = o;
    }
    for (size_t i = 0; i < m; i++) {
        int id = tpd_bpe_find(b, symbol_key(w, i, 0));
        if (id < 0) {
            tpd_log_error("tokenizer: '%s' is merged but not in the vocabulary", w->key);
            return TPD_ERR_INVALID;
        }
        TPD_CHECK(push_id(id, out->ids_p, out->n_p, out->cap_p));
    }
    return TPD_OK;
}

/* One encode call's scratch: per pre-tokenizer step its match data, its segments and the
 * prefixed copy of a piece. */
typedef struct encoder {
    const tpd_bpe *b;
    id_sink out;
    word w;
    pcre2_match_data *md[BPE_MAX_STEPS];
    size_t *seg[BPE_MAX_STEPS]; /* (3 * nseg) start, end, is_match */
    size_t seg_cap[BPE_MAX_STEPS];
    unsigned char *pre[BPE_MAX_STEPS];
    size_t pre_cap[BPE_MAX_STEPS];
} encoder;

static tpd_status push_seg(encoder *e, int step, size_t *nseg, size_t s, size_t end, int match) {
    if (3 * (*nseg + 1) > e->seg_cap[step]) {
        size_t cap = e->seg_cap[step] ? 2 * e->seg_cap[step] : 3 * 64;
        size_t *v = realloc(e->seg[step], cap * sizeof *v);
        if (!v) return TPD_ERR_NOMEM;
        e->seg[step] = v;
        e->seg_cap[step] = cap;
    }
    size_t *v = e->seg[step] + 3 * (*nseg)++;
    v[0] = s;
    v[1] = end;
    v[2] = (size_t)match;
    return TPD_OK;
}

/* Length of the UTF-8 sequence a lead byte starts (1 for a byte that starts none). */
static size_t utf8_step(unsigned char c) {
    return c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 1;
}

/* Hugging Face's find_matches: the gaps and the matches of the pattern in p[0..n), in
 * order. Bytes that are not valid UTF-8 are never matched, so they fall in the gaps. */
static tpd_status find_matches(encoder *e, int step, const unsigned char *p, size_t n,
                               size_t *nseg) {
    const bpe_step *s = &e->b->steps[step];
    size_t prev = 0, from = 0;
    *nseg = 0;
    while (from < n) {
        int rc = pcre2_match(s->re, (PCRE2_SPTR)p, n, from, 0, e->md[step], NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            tpd_log_error("tokenizer: matching pre-tokens failed (PCRE2 error %d)", rc);
            return TPD_ERR_INTERNAL;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md[step]);
        if (ov[0] > prev) TPD_CHECK(push_seg(e, step, nseg, prev, ov[0], s->invert));
        TPD_CHECK(push_seg(e, step, nseg, ov[0], ov[1], !s->invert));
        prev = ov[1];
        from = ov[1] > ov[0] ? ov[1] : ov[0] + utf8_step(p[ov[0]]); /* an empty match moves on */
    }
    if (prev < n) TPD_CHECK(push_seg(e, step, nseg, prev, n, s->invert));
    return TPD_OK;
}

static tpd_status pretokenize(encoder *e, int step, const unsigned char *p, size_t n);

/* One Split step: the segments joined into pieces by the step's behavior (Hugging Face's
 * SplitDelimiterBehavior folds), each piece cut further by the next step. */
static tpd_status split_step(encoder *e, int step, const unsigned char *p, size_t n) {
    size_t nseg = 0, lo = 0, hi = 0;
    TPD_CHECK(find_matches(e, step, p, n, &nseg));
    size_t *v = e->seg[step];
    int prev = 0;
    switch (e->b->steps[step].behavior) {
    case BPE_ISOLATED:
        hi = nseg;
        break;
    case BPE_REMOVED:
        for (size_t i = 0; i < nseg; i++)
            if (!v[3 * i + 2]) memmove(v + 3 * hi++, v + 3 * i, 3 * sizeof *v);
        break;
    case BPE_MERGED_WITH_PREVIOUS:
    case BPE_CONTIGUOUS:
        for (size_t i = 0; i < nseg; i++) {
            int match = (int)v[3 * i + 2];
            int join =
                e->b->steps[step].behavior == BPE_CONTIGUOUS ? match == prev : match && !prev;
            if (join && hi)
                v[3 * (hi - 1) + 1] = v[3 * i + 1];
            else
                memmove(v + 3 * hi++, v + 3 * i, 3 * sizeof *v);
            prev = match;
        }
        break;
    case BPE_MERGED_WITH_NEXT: /* the same fold from the right; pieces end up in [lo, nseg) */
        lo = hi = nseg;
        for (size_t i = nseg; i-- > 0;) {
            int match = (int)v[3 * i + 2];
            if (match && !prev && lo < nseg)
                v[3 * lo] = v[3 * i];
            else
                memmove(v + 3 * --lo, v + 3 * i, 3 * sizeof *v);
            prev = match;
        }
        break;
    }
    for (size_t i = lo; i < hi; i++) {
        /* the deeper steps use their own scratch, so v stays valid */
        size_t s = e->seg[step][3 * i], end = e->seg[step][3 * i + 1];
        if (end > s) TPD_CHECK(pretokenize(e, step + 1, p + s, end - s));
    }
    return TPD_OK;
}

/* Pre-tokenizer steps from `step` on, then BPE on each resulting pre-token. */
static tpd_status pretokenize(encoder *e, int step, const unsigned char *p, size_t n) {
    if (n == 0) return TPD_OK;
    if (step == e->b->nsteps) return encode_word(e->b, &e->w, p, n, &e->out);
    if (!e->b->steps[step].prefix_space) return split_step(e, step, p, n);
    if (p[0] == ' ') return pretokenize(e, step + 1, p, n);
    if (n + 1 > e->pre_cap[step]) {
        unsigned char *q = realloc(e->pre[step], n + 1);
        if (!q) return TPD_ERR_NOMEM;
        e->pre[step] = q;
        e->pre_cap[step] = n + 1;
    }
    e->pre[step][0] = ' ';
    memcpy(e->pre[step] + 1, p, n);
    return pretokenize(e, step + 1, e->pre[step], n + 1);
}

/* Added tokens cut the text first, leftmost and longest first: the non-normalized ones
 * (phase 0), then in what is left the normalized ones (phase 1), as Hugging Face's
 * AddedVocabulary does. */
static tpd_status split_added(encoder *e, int phase, const unsigned char *p, size_t n) {
    const tpd_bpe *b = e->b;
    size_t prev = 0;
    for (size_t i = 0; b->nadded && i < n; i++) {
        if (!b->added_first[p[i]]) continue;
        const bpe_added *a = b->added;
        for (; a < b->added + b->nadded; a++)
            if (a->normalized == phase && a->len <= n - i && !memcmp(p + i, a->content, a->len))
                break;
        if (a == b->added + b->nadded) continue;
        TPD_CHECK(phase ? pretokenize(e, 0, p + prev, i - prev)
                        : split_added(e, 1, p + prev, i - prev));
        TPD_CHECK(push_id(a->id, e->out.ids_p, e->out.n_p, e->out.cap_p));
        prev = i + a->len;
        i = prev - 1;
    }
    return phase ? pretokenize(e, 0, p + prev, n - prev) : split_added(e, 1, p + prev, n - prev);
}

tpd_status tpd_bpe_encode_ex(const tpd_bpe *b, const char *text, size_t len, int add_special,
                             int32_t **ids_p, size_t *n_p, size_t *cap_p) {
    tpd_status st = TPD_OK;
    encoder e = {.b = b, .out = {ids_p, n_p, cap_p}};
    for (int i = 0; i < b->nsteps && st == TPD_OK; i++)
        if (b->steps[i].re &&
            !(e.md[i] = pcre2_match_data_create_from_pattern(b->steps[i].re, NULL)))
            st = TPD_ERR_NOMEM; /* unlogged: see tokenizer.h */
    if (st != TPD_OK) goto done;
    for (int i = 0; add_special && i < b->nprefix; i++)
        TPD_CHECK_GOTO(push_id(b->prefix[i], ids_p, n_p, cap_p), st, done);
    TPD_CHECK_GOTO(split_added(&e, 0, (const unsigned char *)text, len), st, done);
    for (int i = 0; add_special && i < b->nsuffix; i++)
        TPD_CHECK_GOTO(push_id(b->suffix[i], ids_p, n_p, cap_p), st, done);
done:
    free(e.w.spelled);
    free(e.w.bound);
    free(e.w.key);
    free(e.w.pair);
    for (int i = 0; i < b->nsteps; i++) {
        pcre2_match_data_free(e.md[i]);
        free(e.seg[i]);
        free(e.pre[i]);
    }
    return st;
}

tpd_status tpd_bpe_encode(const tpd_bpe *b, const char *text, size_t len, int32_t **ids_p,
                          size_t *n_p, size_t *cap_p) {
    return tpd_bpe_encode_ex(b, text, len, 0, ids_p, n_p, cap_p);
}

tpd_status tpd_bpe_decode(const tpd_bpe *b, const int32_t *ids, size_t n, char **text_p,
                          size_t *len_p) {
    size_t cap = 1;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < b->nspell && b->spell[ids[i]]) cap += strlen(b->spell[ids[i]]);
    char *out = malloc(cap);
    if (!out) return tpd_fail_nomem("the decoded text", cap);
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= b->nspell || !b->spell[ids[i]]) continue;
        const unsigned char *s = (const unsigned char *)b->spell[ids[i]];
        if (b->raw[ids[i]]) { /* a special token spells itself */
            size_t l = strlen((const char *)s);
            memcpy(out + len, s, l);
            len += l;
            continue;
        }
        while (*s) {
            /* one UTF-8 code point; only the byte alphabet's (< BPE_MAX_CP) carry a byte */
            int cp = *s++, more = cp >= 0xF0 ? 3 : cp >= 0xE0 ? 2 : cp >= 0xC0 ? 1 : 0;
            if (more) cp &= 0x3F >> more;
            for (; more && (*s & 0xC0) == 0x80; more--)
                cp = (cp << 6) | (*s++ & 0x3F);
            if (cp < BPE_MAX_CP && b->byte_of[cp] >= 0) out[len++] = (char)b->byte_of[cp];
        }
    }
    out[len] = 0;
    *text_p = out;
    *len_p = len;
    return TPD_OK;
}
