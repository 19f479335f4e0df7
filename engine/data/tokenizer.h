/* GPT-2's byte-level BPE tokenizer, read from its vocab.json and merges.txt (Megatron's
 * --vocab-file and --merge-file; Hugging Face's files for GPT-2).
 *
 * Text is cut into pre-tokens by GPT-2's pattern (contractions, letters, numbers, other
 * symbols, each with an optional leading space; runs of whitespace), through PCRE2 with
 * Unicode properties. Each pre-token's bytes become symbols, one per byte, spelled in
 * GPT-2's printable byte alphabet; the pair of adjacent symbols with the lowest merge rank
 * is merged everywhere in the pre-token until no pair has a rank; the symbols are then
 * looked up in the vocabulary. Every byte string encodes (bytes that are not valid UTF-8
 * become pre-tokens of their own) and decodes back to itself. */
#ifndef TPD_ENGINE_TOKENIZER_H
#define TPD_ENGINE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_bpe tpd_bpe;

/* Errors name the file, and the line of merges.txt. */
tpd_status tpd_bpe_load(const char *vocab_json, const char *merges_txt, tpd_bpe **bpe_p);
void tpd_bpe_destroy(tpd_bpe *bpe);

/* Largest id + 1. */
int tpd_bpe_vocab_size(const tpd_bpe *bpe);
/* The id of "<|endoftext|>", or -1 when the vocabulary has none. */
int32_t tpd_bpe_eod(const tpd_bpe *bpe);

/* Appends the ids of text[0..len) to *ids_p (n_p ids held, cap_p allocated; realloc'd). */
tpd_status tpd_bpe_encode(const tpd_bpe *bpe, const char *text, size_t len, int32_t **ids_p,
                          size_t *n_p, size_t *cap_p);
/* *text_p (malloc'd, NUL-terminated) gets the bytes of ids[0..n), *len_p their count.
 * Ids outside the vocabulary decode to nothing. */
tpd_status tpd_bpe_decode(const tpd_bpe *bpe, const int32_t *ids, size_t n, char **text_p,
                          size_t *len_p);

#ifdef __cplusplus
}
#endif
#endif
