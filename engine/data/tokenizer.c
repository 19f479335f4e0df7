/* GPT-2 byte-level BPE: vocab.json through cJSON, the pre-token pattern through PCRE2, the
 * vocabulary and merge ranks in glibc's hash tables (hsearch_r). */
#include "engine/data/tokenizer.h"

#include "base/file.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's pre-tokenizer (encoder.py), with Unicode letters, numbers and spaces. */
static const char *const kPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
#define EOD_SPELLING "<|endoftext|>"
#define MAX_CP 324 /* byte alphabet code points are < 256 + 68 */

struct tpd_bpe {
    struct hsearch_data vocab;  /* spelling -> id + 1 */
    struct hsearch_data merges; /* "first second" -> rank + 1 */
    int have_vocab, have_merges;
    char **spell; /* (nspell) id -> spelling (UTF-8), NULL where no token has the id */
    int nspell;
    char **merge_keys; /* (nmerges) */
    int nmerges;
    int32_t eod;
    pcre2_code *re;
    char alpha[256][3];      /* byte -> UTF-8 of its code point in GPT-2's byte alphabet */
    int16_t byte_of[MAX_CP]; /* code point -> byte, -1 for none */
};

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes keep their code point, the other 68
 * bytes take 256, 257, ... in byte order. */
static void build_alphabet(tpd_bpe *b) {
    int next = 256;
    for (int i = 0; i < MAX_CP; i++)
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
                      st == TPD_ERR_NOMEM ? "out of memory" : strerror(err));
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
    b->nspell = max_id + 1;
    b->spell = calloc((size_t)(b->nspell > 0 ? b->nspell : 1), sizeof *b->spell);
    if (!b->spell || !hcreate_r((size_t)n * 2 + 1, &b->vocab)) {
        tpd_log_error("%s: out of memory for %d tokens", path, n);
        st = TPD_ERR_NOMEM;
        goto done;
    }
    b->have_vocab = 1;
    cJSON_ArrayForEach(it, root) {
        int id = it->valueint;
        if (b->spell[id]) {
            tpd_log_error("%s: id %d is given to both '%s' and '%s'", path, id, b->spell[id],
                          it->string);
            st = TPD_ERR_INVALID;
            goto done;
        }
        b->spell[id] = strdup(it->string);
        if (!b->spell[id] || !table_add(&b->vocab, b->spell[id], id)) {
            tpd_log_error("%s: out of memory", path);
            st = TPD_ERR_NOMEM;
            goto done;
        }
        if (!strcmp(it->string, EOD_SPELLING)) b->eod = id;
    }
    /* every byte must spell a token, or some text could not be encoded */
    for (int c = 0; c < 256; c++)
        if (table_find(&b->vocab, b->alpha[c]) < 0) {
            tpd_log_error("%s: byte 0x%02x ('%s') has no token (a byte-level BPE vocabulary "
                          "holds all 256 bytes)",
                          path, c, b->alpha[c]);
            st = TPD_ERR_INVALID;
            goto done;
        }
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
    b->merge_keys = calloc((size_t)lines, sizeof *b->merge_keys);
    if (!b->merge_keys || !hcreate_r((size_t)lines * 2 + 1, &b->merges)) {
        tpd_log_error("%s: out of memory for %d merges", path, lines);
        free(text);
        return TPD_ERR_NOMEM;
    }
    b->have_merges = 1;
    char *save = NULL, joined[1024];
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
        if (!sp || sp == line || !sp[1] || strchr(sp + 1, ' ') || len + 1 > sizeof joined) {
            tpd_log_error("%s:%d: '%s' is not a merge (two tokens separated by one space)", path,
                          lineno, line);
            st = TPD_ERR_INVALID;
            goto done;
        }
        *sp = 0;
        snprintf(joined, sizeof joined, "%s%s", line, sp + 1);
        const char *missing = table_find(&b->vocab, line) < 0     ? line
                              : table_find(&b->vocab, sp + 1) < 0 ? sp + 1
                              : table_find(&b->vocab, joined) < 0 ? joined
                                                                  : NULL;
        if (missing) {
            tpd_log_error("%s:%d: merge '%s %s': '%s' is not in the vocabulary", path, lineno, line,
                          sp + 1, missing);
            st = TPD_ERR_INVALID;
            goto done;
        }
        *sp = ' ';
        char *key = strdup(line);
        if (!key) {
            st = TPD_ERR_NOMEM;
            goto done;
        }
        b->merge_keys[b->nmerges] = key;
        if (!table_add(&b->merges, key, b->nmerges)) {
            tpd_log_error("%s: out of memory", path);
            st = TPD_ERR_NOMEM;
            goto done;
        }
        b->nmerges++;
    }
done:
    free(text);
    return st;
}

tpd_status tpd_bpe_load(const char *vocab_json, const char *merges_txt, tpd_bpe **bpe_p) {
    tpd_bpe *b = calloc(1, sizeof *b);
    if (!b) return TPD_ERR_NOMEM;
    tpd_status st = TPD_OK;
    b->eod = -1;
    build_alphabet(b);
    TPD_CHECK_GOTO(load_vocab(b, vocab_json), st, fail);
    TPD_CHECK_GOTO(load_merges(b, merges_txt), st, fail);
    int err;
    PCRE2_SIZE at;
    b->re = pcre2_compile((PCRE2_SPTR)kPattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
    if (!b->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        tpd_log_error("tokenizer: the pre-token pattern does not compile at %zu: %s", (size_t)at,
                      (const char *)msg);
        st = TPD_ERR_INTERNAL;
        goto fail;
    }
    /* JIT when the platform has it (much faster); the interpreter otherwise */
    (void)pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE);
    *bpe_p = b;
    return TPD_OK;
fail:
    tpd_bpe_destroy(b);
    return st;
}

void tpd_bpe_destroy(tpd_bpe *b) {
    if (!b) return;
    if (b->re) pcre2_code_free(b->re);
    if (b->have_merges) hdestroy_r(&b->merges);
    if (b->have_vocab) hdestroy_r(&b->vocab);
    for (int i = 0; i < b->nmerges; i++)
        free(b->merge_keys[i]);
    free(b->merge_keys);
    for (int i = 0; i < b->nspell; i++)
        free(b->spell[i]);
    free(b->spell);
    free(b);
}

int tpd_bpe_vocab_size(const tpd_bpe *b) {
    return b->nspell;
}

int32_t tpd_bpe_eod(const tpd_bpe *b) {
    return b->eod;
}

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

static tpd_status encode_word(const tpd_bpe *b, word *w, const unsigned char *p, size_t k,
                              int32_t **ids_p, size_t *n_p, size_t *cap_p) {
    if (k > w->cap) {
        /* two spelled bytes per byte; a pair key is at most the whole spelling + 1 */
        char *s = realloc(w->spelled, 2 * k + 1), *key = NULL;
        size_t *bd = NULL;
        if (s) w->spelled = s;
        if (s) key = realloc(w->key, 2 * k + 2);
        if (key) w->key = key;
        if (key) bd = realloc(w->bound, (k + 1) * sizeof *bd);
        if (!bd) return TPD_ERR_NOMEM;
        w->bound = bd;
        w->cap = k;
    }
    size_t m = k, len = 0;
    for (size_t i = 0; i < k; i++) {
        w->bound[i] = len;
        size_t l = strlen(b->alpha[p[i]]);
        memcpy(w->spelled + len, b->alpha[p[i]], l);
        len += l;
    }
    w->bound[k] = len;
    w->spelled[len] = 0;
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
        char first[512], second[512];
        size_t fl = w->bound[at + 1] - w->bound[at], sl = w->bound[at + 2] - w->bound[at + 1];
        if (fl >= sizeof first || sl >= sizeof second) return TPD_ERR_INTERNAL;
        memcpy(first, w->spelled + w->bound[at], fl);
        memcpy(second, w->spelled + w->bound[at + 1], sl);
        size_t out = 0;
        for (size_t i = 0; i < m; out++) {
            w->bound[out] = w->bound[i];
            if (i + 1 < m && same_symbol(w, i, first, fl) && same_symbol(w, i + 1, second, sl))
                i += 2;
            else
                i += 1;
        }
        w->bound[out] = len;
        m = out;
    }
    for (size_t i = 0; i < m; i++) {
        int id = table_find((struct hsearch_data *)&b->vocab, symbol_key(w, i, 0));
        if (id < 0) {
            tpd_log_error("tokenizer: '%s' is merged but not in the vocabulary", w->key);
            return TPD_ERR_INVALID;
        }
        TPD_CHECK(push_id(id, ids_p, n_p, cap_p));
    }
    return TPD_OK;
}

tpd_status tpd_bpe_encode(const tpd_bpe *b, const char *text, size_t len, int32_t **ids_p,
                          size_t *n_p, size_t *cap_p) {
    tpd_status st = TPD_OK;
    const unsigned char *t = (const unsigned char *)text;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(b->re, NULL);
    word w = {0};
    if (!md) return TPD_ERR_NOMEM;
    size_t off = 0;
    while (off < len) {
        int rc = pcre2_match(b->re, (PCRE2_SPTR)t, len, off, 0, md, NULL);
        size_t s = len, e = len;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            s = ov[0];
            e = ov[1] > ov[0] ? ov[1] : ov[0] + 1; /* an empty match takes one byte */
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            tpd_log_error("tokenizer: matching pre-tokens failed (PCRE2 error %d)", rc);
            st = TPD_ERR_INTERNAL;
            break;
        }
        /* bytes no pattern matches (not valid UTF-8) make a pre-token of their own */
        if (s > off)
            TPD_CHECK_GOTO(encode_word(b, &w, t + off, s - off, ids_p, n_p, cap_p), st, done);
        if (e > s) TPD_CHECK_GOTO(encode_word(b, &w, t + s, e - s, ids_p, n_p, cap_p), st, done);
        off = e;
    }
done:
    free(w.spelled);
    free(w.bound);
    free(w.key);
    pcre2_match_data_free(md);
    return st;
}

tpd_status tpd_bpe_decode(const tpd_bpe *b, const int32_t *ids, size_t n, char **text_p,
                          size_t *len_p) {
    size_t cap = 1;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < b->nspell && b->spell[ids[i]]) cap += strlen(b->spell[ids[i]]);
    char *out = malloc(cap);
    if (!out) return TPD_ERR_NOMEM;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= b->nspell || !b->spell[ids[i]]) continue;
        const unsigned char *s = (const unsigned char *)b->spell[ids[i]];
        if (ids[i] == b->eod) { /* a special token spells itself */
            size_t l = strlen((const char *)s);
            memcpy(out + len, s, l);
            len += l;
            continue;
        }
        while (*s) {
            /* one UTF-8 code point; only the byte alphabet's (< MAX_CP) carry a byte */
            int cp = *s++, more = cp >= 0xF0 ? 3 : cp >= 0xE0 ? 2 : cp >= 0xC0 ? 1 : 0;
            if (more) cp &= 0x3F >> more;
            for (; more && (*s & 0xC0) == 0x80; more--)
                cp = (cp << 6) | (*s++ & 0x3F);
            if (cp < MAX_CP && b->byte_of[cp] >= 0) out[len++] = (char)b->byte_of[cp];
        }
    }
    out[len] = 0;
    *text_p = out;
    *len_p = len;
    return TPD_OK;
}
