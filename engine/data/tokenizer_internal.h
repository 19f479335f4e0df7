/* Private to engine/data/tokenizer*.c: the byte-level BPE that both loaders fill (GPT-2's
 * vocab.json + merges.txt in tokenizer.c, Hugging Face's tokenizer.json in
 * tokenizer_hf.c), and the helpers they share. */
#ifndef TPD_ENGINE_TOKENIZER_INTERNAL_H
#define TPD_ENGINE_TOKENIZER_INTERNAL_H

#include "engine/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <search.h>

#define BPE_MAX_CP 324 /* byte alphabet code points are < 256 + 68 */
#define BPE_MAX_STEPS 8
#define BPE_MAX_TEMPLATE 8

/* GPT-2's pre-tokenizer (encoder.py), with Unicode letters, numbers and spaces; also what
 * Hugging Face's ByteLevel pre-tokenizer splits by when use_regex is true. */
extern const char *const tpd_bpe_gpt2_pattern;

/* How a Split step keeps the pieces between and at the pattern's matches (Hugging Face's
 * SplitDelimiterBehavior). */
typedef enum bpe_behavior {
    BPE_REMOVED,              /* matches are dropped */
    BPE_ISOLATED,             /* every match and every gap is a piece */
    BPE_MERGED_WITH_PREVIOUS, /* a match joins the piece before it */
    BPE_MERGED_WITH_NEXT,     /* a match joins the piece after it */
    BPE_CONTIGUOUS,           /* adjacent matches are one piece */
} bpe_behavior;

/* One pre-tokenizer step; the pieces of one step are cut further by the next. */
typedef struct bpe_step {
    int prefix_space; /* 1: prepend ' ' to a piece that does not start with one */
    pcre2_code *re;   /* else: split by this pattern */
    bpe_behavior behavior;
    int invert; /* 1: the gaps are the matches */
} bpe_step;

/* A token matched in the text before pre-tokenization (Hugging Face's added tokens). */
typedef struct bpe_added {
    char *content;
    size_t len;
    int32_t id;
    int normalized; /* matched after the phase of the non-normalized ones */
} bpe_added;

struct tpd_bpe {
    struct hsearch_data vocab;  /* spelling -> id + 1 */
    struct hsearch_data merges; /* "first second" -> rank + 1 */
    int have_vocab, have_merges;
    char **spell;       /* (nspell) id -> spelling (UTF-8), NULL where no token has the id */
    unsigned char *raw; /* (nspell) 1: the id decodes to its spelling's bytes (special) */
    int nspell;
    char **merge_keys; /* (nmerges) */
    int nmerges, merges_cap;
    int32_t eod;
    bpe_step steps[BPE_MAX_STEPS];
    int nsteps;
    int ignore_merges; /* 1: a pre-token that is itself in the vocabulary is one token */
    bpe_added *added;  /* (nadded) longest content first */
    int nadded;
    unsigned char added_first[256];   /* 1: some added token starts with this byte */
    int32_t prefix[BPE_MAX_TEMPLATE]; /* post-processor: ids before and after the text */
    int32_t suffix[BPE_MAX_TEMPLATE];
    int nprefix, nsuffix;
    char alpha[256][3];              /* byte -> UTF-8 of its code point in GPT-2's byte alphabet */
    int16_t byte_of[BPE_MAX_CP];     /* code point -> byte, -1 for none */
    unsigned char byte_missing[256]; /* 1: the byte has no token (tokenizer.json only): it
                                        is dropped from the text before merging */
    int nmissing;
};

/* A new tokenizer with GPT-2's byte alphabet and nothing else (eod -1). */
tpd_bpe *tpd_bpe_alloc(void);
/* Sizes the id table for ids < nspell and the vocabulary table for n entries. */
tpd_status tpd_bpe_reserve(tpd_bpe *b, const char *path, int nspell, int n);
/* Gives `id` the spelling s (copied); path names the file in errors. */
tpd_status tpd_bpe_add_token(tpd_bpe *b, const char *path, const char *s, int id);
/* -1 when the spelling has no id. */
int tpd_bpe_find(const tpd_bpe *b, const char *spelling);
/* Fails, naming path, when one of the 256 bytes has no token. */
tpd_status tpd_bpe_check_bytes(const tpd_bpe *b, const char *path);
/* Fills b->byte_missing and b->nmissing from the vocabulary; returns nmissing. */
int tpd_bpe_mark_missing_bytes(tpd_bpe *b);
/* Sizes the merge table for n merges. */
tpd_status tpd_bpe_reserve_merges(tpd_bpe *b, const char *path, int n);
/* Appends the merge of first and second (next rank); where names the merge in errors
 * ("FILE:LINE" or "FILE: model.merges[i]"). */
tpd_status tpd_bpe_add_merge(tpd_bpe *b, const char *where, const char *first, const char *second);
/* Appends a Split step with pattern (a regex, or a literal string); where names it in
 * errors. Hugging Face compiles its regexes with Oniguruma; the patterns of the models
 * in use (\p{L}, \p{N}, \s with U+0085, (?i:...), lookahead) mean the same in PCRE2 with
 * Unicode properties, which the golden sets check. */
tpd_status tpd_bpe_add_split(tpd_bpe *b, const char *where, const char *pattern, int literal,
                             bpe_behavior behavior, int invert);

#endif
