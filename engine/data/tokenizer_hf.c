/* Hugging Face tokenizer.json of a byte-level BPE model, read into the tables of
 * tokenizer.c (the merge and encode core is shared with GPT-2's vocab.json + merges.txt).
 *
 * Read, as `tokenizers` defines them:
 *   model            type BPE: vocab, merges as "a b" strings or ["a", "b"] pairs,
 *                    ignore_merges (Llama 3); dropout, continuing_subword_prefix,
 *                    end_of_word_suffix and byte_fallback must be unset; a vocab
 *                    without some of the 256 byte tokens drops those bytes from the
 *                    text (as `tokenizers` does without unk_token, which must then be
 *                    unset)
 *   added_tokens     matched in the raw text before pre-tokenization (single_word, lstrip
 *                    and rstrip must be false)
 *   normalizer       must be null: a normalizer changes the text (NFC, Lowercase...)
 *   pre_tokenizer    Split (Regex or String pattern; behavior Removed, Isolated,
 *                    MergedWithPrevious, MergedWithNext, Contiguous; invert) steps, then
 *                    ByteLevel (add_prefix_space, use_regex), alone or in a Sequence
 *   post_processor   ByteLevel (offsets only), TemplateProcessing's single template
 *                    (special tokens before and after $A: the BOS), or a Sequence of them
 *   decoder          ByteLevel
 * truncation and padding (options of a batch encode call) are ignored. */
#include "engine/data/tokenizer_internal.h"

#include "base/file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SUPPORTED                                                                                  \
    "supported: byte-level BPE tokenizer.json files: model.type BPE, no normalizer, Split "        \
    "regex and ByteLevel pre-tokenizers, ByteLevel and TemplateProcessing post-processors, "       \
    "a ByteLevel decoder"

#define SENTENCEPIECE                                                                              \
    "SentencePiece is not supported; give the model's Hugging Face tokenizer.json (a "             \
    "byte-level BPE)"

/* Names of the end-of-document token when no tokenizer_config.json names one, in order. */
static const char *const kEodNames[] = {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"};

static tpd_status refuse(const char *path, const char *key, const char *value) {
    tpd_log_error("%s: %s %s is not supported (%s)", path, key, value, SUPPORTED);
    return TPD_ERR_UNSUPPORTED;
}

static int is_null(const cJSON *o) {
    return !o || cJSON_IsNull(o);
}

/* o's "type", or "(no type)". */
static const char *type_of(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : "(no type)";
}

/* Refuses key when it is set to something other than null, false, 0 or "". */
static tpd_status must_be_unset(const char *path, const cJSON *o, const char *name,
                                const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (is_null(v) || cJSON_IsFalse(v) || (cJSON_IsString(v) && !v->valuestring[0]) ||
        (cJSON_IsNumber(v) && v->valuedouble == 0))
        return TPD_OK;
    char *s = cJSON_PrintUnformatted(v);
    tpd_status st = refuse(path, key, s ? s : "(set)");
    free(s);
    return st;
}

static int get_bool(const cJSON *o, const char *name, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static int valid_id(const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < (1 << 24) &&
           v->valuedouble == (int)v->valuedouble;
}

static int cmp_added(const void *x, const void *y) {
    const bpe_added *a = x, *b = y;
    return a->len != b->len ? (a->len < b->len ? 1 : -1) : (a->id > b->id) - (a->id < b->id);
}

/* added_tokens: validated and copied (ids not yet in the tables); *max_id_p grows. */
static tpd_status read_added(tpd_bpe *b, const char *path, const cJSON *arr, int *max_id_p) {
    if (is_null(arr)) return TPD_OK;
    if (!cJSON_IsArray(arr)) {
        tpd_log_error("%s: added_tokens must be an array", path);
        return TPD_ERR_FORMAT;
    }
    int n = cJSON_GetArraySize(arr), i = 0;
    b->added = calloc((size_t)(n > 0 ? n : 1), sizeof *b->added);
    if (!b->added)
        return tpd_fail_nomem("added_tokens", (size_t)(n > 0 ? n : 1) * sizeof *b->added);
    const cJSON *t;
    cJSON_ArrayForEach(t, arr) {
        char key[64];
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(t, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(t, "content");
        if (!valid_id(id) || !cJSON_IsString(content) || !content->valuestring[0]) {
            tpd_log_error("%s: added_tokens[%d] needs an integer id in [0, 2^24) and a "
                          "non-empty string content",
                          path, i);
            return TPD_ERR_FORMAT;
        }
        static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
        for (int f = 0; f < 3; f++) {
            snprintf(key, sizeof key, "added_tokens[%d].%s", i, flags[f]);
            TPD_CHECK(must_be_unset(path, t, flags[f], key));
        }
        bpe_added *a = &b->added[b->nadded++];
        a->content = strdup(content->valuestring);
        if (!a->content) return tpd_fail_nomem("an added token", strlen(content->valuestring) + 1);
        a->len = strlen(a->content);
        a->id = id->valueint;
        a->normalized = get_bool(t, "normalized", 1);
        b->added_first[(unsigned char)a->content[0]] = 1;
        if (a->id > *max_id_p) *max_id_p = a->id;
        i++;
    }
    qsort(b->added, (size_t)b->nadded, sizeof *b->added, cmp_added);
    return TPD_OK;
}

static tpd_status read_merges(tpd_bpe *b, const char *path, const cJSON *merges) {
    if (!cJSON_IsArray(merges)) {
        tpd_log_error("%s: model.merges is %s (a BPE model needs its merges: an array of "
                      "\"a b\" strings or [\"a\", \"b\"] pairs)",
                      path, merges ? "not an array" : "missing");
        return TPD_ERR_FORMAT;
    }
    TPD_CHECK(tpd_bpe_reserve_merges(b, path, cJSON_GetArraySize(merges)));
    const cJSON *m;
    int i = 0;
    char where[4096], pair[2048];
    cJSON_ArrayForEach(m, merges) {
        snprintf(where, sizeof where, "%s: model.merges[%d]", path, i++);
        const char *first = NULL, *second = NULL;
        if (cJSON_IsString(m)) { /* "a b": tokens hold no ' ' (spelled Ġ in the alphabet) */
            const char *sp = strchr(m->valuestring, ' ');
            size_t fl = sp ? (size_t)(sp - m->valuestring) : 0;
            if (sp && fl && sp[1] && !strchr(sp + 1, ' ') && fl < sizeof pair) {
                memcpy(pair, m->valuestring, fl);
                pair[fl] = 0;
                first = pair;
                second = sp + 1;
            }
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            first = cJSON_GetArrayItem(m, 0)->valuestring;
            second = cJSON_GetArrayItem(m, 1)->valuestring;
            if (!first[0] || !second[0] || strchr(first, ' ') || strchr(second, ' '))
                first = NULL; /* the merge table keys on "first second" */
        }
        if (!first) {
            char *s = cJSON_PrintUnformatted(m);
            tpd_log_error("%s: %s is not a merge (\"a b\" or [\"a\", \"b\"], byte-level tokens "
                          "without spaces)",
                          where, s ? s : "?");
            free(s);
            return TPD_ERR_FORMAT;
        }
        TPD_CHECK(tpd_bpe_add_merge(b, where, first, second));
    }
    return TPD_OK;
}

/* Bytes without a token in model.vocab (some released small models ship such
 * vocabularies): `tokenizers` loads them, and its BPE without byte_fallback and without
 * unk_token drops those bytes from the text it encodes. So do we, saying so once. With an
 * unk_token it would emit that token instead (fused runs): not supported. */
static tpd_status note_missing_bytes(tpd_bpe *b, const char *path, const cJSON *model) {
    int n = tpd_bpe_mark_missing_bytes(b);
    if (n == 0) return TPD_OK;
    char list[8 * 6 + 8] = "";
    size_t at = 0;
    for (int c = 0, shown = 0; c < 256 && shown < 8; c++)
        if (b->byte_missing[c]) {
            at += (size_t)snprintf(list + at, sizeof list - at, "%s0x%02x", shown ? " " : "", c);
            shown++;
        }
    if (n > 8) snprintf(list + at, sizeof list - at, " ...");
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk) && unk->valuestring[0]) {
        tpd_log_error("%s: model.unk_token \"%s\" with %d of the 256 bytes missing from "
                      "model.vocab (%s) is not supported (%s)",
                      path, unk->valuestring, n, list, SUPPORTED);
        return TPD_ERR_UNSUPPORTED;
    }
    tpd_log_warn("%s: %d of the 256 bytes have no token in model.vocab (%s); as Hugging Face "
                 "tokenizers does, text holding them loses those bytes when encoded",
                 path, n, list);
    return TPD_OK;
}

static tpd_status read_model(tpd_bpe *b, const char *path, const cJSON *model, const cJSON *added) {
    if (!cJSON_IsObject(model)) {
        tpd_log_error("%s: no \"model\" object (a tokenizer.json holds one)", path);
        return TPD_ERR_FORMAT;
    }
    if (strcmp(type_of(model), "BPE")) {
        char v[256];
        snprintf(v, sizeof v, "\"%s\"", type_of(model));
        return refuse(path, "model.type", v);
    }
    TPD_CHECK(must_be_unset(path, model, "dropout", "model.dropout"));
    TPD_CHECK(
        must_be_unset(path, model, "continuing_subword_prefix", "model.continuing_subword_prefix"));
    TPD_CHECK(must_be_unset(path, model, "end_of_word_suffix", "model.end_of_word_suffix"));
    TPD_CHECK(must_be_unset(path, model, "byte_fallback", "model.byte_fallback"));
    b->ignore_merges = get_bool(model, "ignore_merges", 0);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *it;
    if (!cJSON_IsObject(vocab)) {
        tpd_log_error("%s: model.vocab is %s (an object of token -> id)", path,
                      vocab ? "not an object" : "missing");
        return TPD_ERR_FORMAT;
    }
    int max_id = -1;
    TPD_CHECK(read_added(b, path, added, &max_id));
    cJSON_ArrayForEach(it, vocab) {
        if (!valid_id(it)) {
            tpd_log_error("%s: model.vocab '%s': id must be an integer in [0, 2^24)", path,
                          it->string);
            return TPD_ERR_FORMAT;
        }
        if (it->valueint > max_id) max_id = it->valueint;
    }
    TPD_CHECK(tpd_bpe_reserve(b, path, max_id + 1, cJSON_GetArraySize(vocab) + b->nadded));
    cJSON_ArrayForEach(it, vocab) TPD_CHECK(tpd_bpe_add_token(b, path, it->string, it->valueint));
    for (int i = 0; i < b->nadded; i++) {
        const bpe_added *a = &b->added[i];
        if (tpd_bpe_find(b, a->content) != a->id)
            TPD_CHECK(tpd_bpe_add_token(b, path, a->content, a->id));
        b->raw[a->id] = 1;
    }
    TPD_CHECK(note_missing_bytes(b, path, model));
    return read_merges(b, path, cJSON_GetObjectItemCaseSensitive(model, "merges"));
}

/* The steps of one pre-tokenizer (not a Sequence); *byte_level_p is set by ByteLevel. */
static tpd_status read_pre_one(tpd_bpe *b, const char *path, const char *key, const cJSON *p,
                               int *byte_level_p) {
    char where[4096], v[256];
    snprintf(where, sizeof where, "%s: %s", path, key);
    snprintf(v, sizeof v, "\"%s\"", type_of(p));
    if (*byte_level_p) { /* later steps would see the byte alphabet, not the text */
        snprintf(where, sizeof where, "%s.type", key);
        return refuse(path, where, "after ByteLevel");
    }
    if (!strcmp(type_of(p), "ByteLevel")) {
        *byte_level_p = 1;
        if (get_bool(p, "add_prefix_space", 1)) {
            if (b->nsteps == BPE_MAX_STEPS) return refuse(path, key, "with this many steps");
            b->steps[b->nsteps++] = (bpe_step){.prefix_space = 1};
        }
        if (get_bool(p, "use_regex", 1))
            TPD_CHECK(tpd_bpe_add_split(b, where, tpd_bpe_gpt2_pattern, 0, BPE_ISOLATED, 0));
        return TPD_OK;
    }
    if (strcmp(type_of(p), "Split")) {
        snprintf(where, sizeof where, "%s.type", key);
        return refuse(path, where, v);
    }
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
    if (!cJSON_IsString(re) && !cJSON_IsString(lit)) {
        tpd_log_error("%s.pattern: needs {\"Regex\": \"...\"} or {\"String\": \"...\"}", where);
        return TPD_ERR_FORMAT;
    }
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    int k = 0;
    while (k < 5 && !(cJSON_IsString(beh) && !strcmp(beh->valuestring, names[k])))
        k++;
    if (k == 5) {
        tpd_log_error("%s.behavior: must be one of Removed, Isolated, MergedWithPrevious, "
                      "MergedWithNext, Contiguous",
                      where);
        return TPD_ERR_FORMAT;
    }
    return tpd_bpe_add_split(b, where, cJSON_IsString(re) ? re->valuestring : lit->valuestring,
                             !cJSON_IsString(re), (bpe_behavior)k, get_bool(p, "invert", 0));
}

static tpd_status read_pre(tpd_bpe *b, const char *path, const cJSON *pre) {
    int byte_level = 0;
    if (!strcmp(type_of(pre), "Sequence")) {
        const cJSON *p, *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
        int i = 0;
        cJSON_ArrayForEach(p, list) {
            char key[64];
            snprintf(key, sizeof key, "pre_tokenizer.pretokenizers[%d]", i++);
            TPD_CHECK(read_pre_one(b, path, key, p, &byte_level));
        }
    } else if (!is_null(pre)) {
        TPD_CHECK(read_pre_one(b, path, "pre_tokenizer", pre, &byte_level));
    }
    if (!byte_level)
        return refuse(path, "a pre_tokenizer without ByteLevel", "(the BPE would not see bytes)");
    return TPD_OK;
}

/* TemplateProcessing's single template: special tokens before $A go to prefix, after it
 * to suffix. */
static tpd_status read_template(tpd_bpe *b, const char *path, const char *key, const cJSON *t) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(t, "single"), *item;
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(t, "special_tokens");
    int seen_a = 0;
    if (b->nprefix || b->nsuffix) return refuse(path, key, "(a second TemplateProcessing)");
    cJSON_ArrayForEach(item, single) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(item, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(seq ? seq : sp, "id");
        if (!cJSON_IsString(name)) {
            tpd_log_error("%s: %s.single: an item is neither {\"Sequence\": {\"id\": ...}} nor "
                          "{\"SpecialToken\": {\"id\": ...}}",
                          path, key);
            return TPD_ERR_FORMAT;
        }
        if (seq) {
            if (strcmp(name->valuestring, "A") || seen_a)
                return refuse(path, "post_processor single template sequence", name->valuestring);
            seen_a = 1;
            continue;
        }
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(specials, name->valuestring), "ids");
        if (!cJSON_IsArray(ids)) {
            tpd_log_error("%s: %s.special_tokens has no ids for '%s'", path, key,
                          name->valuestring);
            return TPD_ERR_FORMAT;
        }
        const cJSON *id;
        cJSON_ArrayForEach(id, ids) {
            int *n = seen_a ? &b->nsuffix : &b->nprefix;
            if (!valid_id(id) || id->valueint >= b->nspell || *n == BPE_MAX_TEMPLATE) {
                tpd_log_error("%s: %s.special_tokens['%s']: ids must be at most %d of the "
                              "vocabulary's",
                              path, key, name->valuestring, BPE_MAX_TEMPLATE);
                return TPD_ERR_FORMAT;
            }
            (seen_a ? b->suffix : b->prefix)[(*n)++] = id->valueint;
        }
    }
    if (!seen_a) return refuse(path, "post_processor single template", "without $A");
    return TPD_OK;
}

static tpd_status read_post(tpd_bpe *b, const char *path, const cJSON *post) {
    if (is_null(post)) return TPD_OK;
    int seq = !strcmp(type_of(post), "Sequence");
    const cJSON *list = seq ? cJSON_GetObjectItemCaseSensitive(post, "processors") : NULL, *p;
    int i = 0;
    for (p = seq ? (list ? list->child : NULL) : post; p; p = seq ? p->next : NULL, i++) {
        char key[64], v[256];
        snprintf(key, sizeof key, seq ? "post_processor.processors[%d]" : "post_processor", i);
        if (!strcmp(type_of(p), "TemplateProcessing")) {
            TPD_CHECK(read_template(b, path, key, p));
        } else if (strcmp(type_of(p), "ByteLevel")) { /* ByteLevel only trims offsets */
            snprintf(v, sizeof v, "\"%s\"", type_of(p));
            strcat(key, ".type");
            return refuse(path, key, v);
        }
    }
    return TPD_OK;
}

static tpd_status read_decoder(const char *path, const cJSON *dec) {
    int seq = !strcmp(type_of(dec), "Sequence");
    const cJSON *list = seq ? cJSON_GetObjectItemCaseSensitive(dec, "decoders") : NULL, *d;
    if (is_null(dec)) return refuse(path, "decoder", "null (a ByteLevel decoder is needed)");
    for (d = seq ? (list ? list->child : NULL) : dec; d; d = seq ? d->next : NULL) {
        if (strcmp(type_of(d), "ByteLevel")) {
            char v[256];
            snprintf(v, sizeof v, "\"%s\"", type_of(d));
            return refuse(path, "decoder.type", v);
        }
    }
    return TPD_OK;
}

/* The end-of-document token: tokenizer_config.json's eos_token beside the file, else the
 * first of kEodNames that is a token. */
static tpd_status choose_eod(tpd_bpe *b, const char *path) {
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) + 1 : 0;
    char *cfg_path = malloc(dl + sizeof "tokenizer_config.json");
    if (!cfg_path) return tpd_fail_nomem("a path", dl + sizeof "tokenizer_config.json");
    memcpy(cfg_path, path, dl);
    strcpy(cfg_path + dl, "tokenizer_config.json");
    char *text = NULL;
    int err;
    tpd_status st = TPD_OK;
    if (tpd_file_read_all(cfg_path, &text, NULL, &err) == TPD_OK) {
        cJSON *cfg = cJSON_Parse(text);
        const cJSON *eos = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token");
        if (cJSON_IsObject(eos)) eos = cJSON_GetObjectItemCaseSensitive(eos, "content");
        if (cJSON_IsString(eos)) {
            b->eod = tpd_bpe_find(b, eos->valuestring);
            if (b->eod < 0) {
                tpd_log_error("%s: eos_token '%s' is not a token of %s", cfg_path, eos->valuestring,
                              path);
                st = TPD_ERR_FORMAT;
            }
        }
        cJSON_Delete(cfg);
        free(text);
    }
    for (size_t i = 0; b->eod < 0 && i < sizeof kEodNames / sizeof *kEodNames; i++)
        b->eod = tpd_bpe_find(b, kEodNames[i]);
    free(cfg_path);
    return st;
}

static tpd_status load_json(tpd_bpe *b, const char *path, const char *text, size_t len) {
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t'))
        i++;
    if (i == len || text[i] != '{' || memchr(text, 0, len)) {
        tpd_log_error("%s: not a tokenizer.json (a JSON object); a SentencePiece model "
                      "(tokenizer.model)? " SENTENCEPIECE,
                      path);
        return TPD_ERR_UNSUPPORTED;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        tpd_log_error("%s: not valid JSON (at byte %zu)", path,
                      at && at >= text && at <= text + len ? (size_t)(at - text) : (size_t)0);
        return TPD_ERR_FORMAT;
    }
    tpd_status st = TPD_OK;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!is_null(norm) && !(!strcmp(type_of(norm), "Sequence") &&
                            !cJSON_GetArraySize(cJSON_GetObjectItem(norm, "normalizers")))) {
        char v[256];
        snprintf(v, sizeof v, "\"%s\" (it changes the text)", type_of(norm));
        st = refuse(path, "normalizer.type", v);
    }
    if (st == TPD_OK)
        st = read_model(b, path, cJSON_GetObjectItemCaseSensitive(root, "model"),
                        cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    if (st == TPD_OK)
        st = read_pre(b, path, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
    if (st == TPD_OK)
        st = read_post(b, path, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    if (st == TPD_OK) st = read_decoder(path, cJSON_GetObjectItemCaseSensitive(root, "decoder"));
    if (st == TPD_OK) st = choose_eod(b, path);
    cJSON_Delete(root);
    return st;
}

tpd_status tpd_bpe_load_hf(const char *path, tpd_bpe **bpe_p) {
    struct stat sb;
    size_t pl = strlen(path);
    char *file = malloc(pl + sizeof "/tokenizer.model");
    if (!file) return tpd_fail_nomem("a path", pl + sizeof "/tokenizer.model");
    strcpy(file, path);
    /* a model folder: its tokenizer.json (or, refused below, its tokenizer.model) */
    if (!stat(path, &sb) && S_ISDIR(sb.st_mode)) {
        strcpy(file + pl, "/tokenizer.json");
        if (stat(file, &sb)) strcpy(file + pl, "/tokenizer.model");
        if (stat(file, &sb)) strcpy(file + pl, "/tokenizer.json"); /* the read names it */
    }
    pl = strlen(file);
    if (pl >= 6 && !strcmp(file + pl - 6, ".model")) {
        tpd_log_error("%s: a SentencePiece model: " SENTENCEPIECE, file);
        free(file);
        return TPD_ERR_UNSUPPORTED;
    }
    char *text = NULL;
    size_t len = 0;
    int err;
    tpd_status st = tpd_file_read_all(file, &text, &len, &err);
    if (st != TPD_OK) {
        tpd_log_error("%s: cannot read: %s", file,
                      st == TPD_ERR_NOMEM ? "out of memory" : tpd_file_strerror(err));
        free(file);
        return st;
    }
    tpd_bpe *b = tpd_bpe_alloc();
    st = b ? load_json(b, file, text, len) : tpd_fail_nomem("the tokenizer", sizeof *b);
    free(text);
    free(file);
    if (st != TPD_OK) {
        tpd_bpe_destroy(b);
        return st;
    }
    *bpe_p = b;
    return TPD_OK;
}
