/* Byte-level BPE tokenizers: GPT-2's, read from its vocab.json and merges.txt (Megatron's
 * --vocab-file and --merge-file), and Hugging Face's tokenizer.json of a byte-level BPE
 * model (Llama 3, Qwen2, GPT-2 and the like; Megatron's HuggingFaceTokenizer).
 *
 * Text is first cut at the added tokens (tokenizer.json's special tokens, matched in the
 * raw text, leftmost and longest first); those become their ids. The rest is cut into
 * pre-tokens by the pre-tokenizer's regex steps, through PCRE2 with Unicode properties
 * (GPT-2's files: GPT-2's pattern of contractions, letters, numbers, other symbols, each
 * with an optional leading space, and runs of whitespace). Each pre-token's bytes become
 * symbols, one per byte, spelled in GPT-2's printable byte alphabet; the pair of adjacent
 * symbols with the lowest merge rank is merged everywhere in the pre-token until no pair
 * has a rank; the symbols are then looked up in the vocabulary. Every byte string encodes
 * and decodes back to itself: bytes that are not valid UTF-8 are never matched by a
 * pattern, so a run of them becomes a pre-token of its own (Hugging Face takes only valid
 * text, so there is nothing to agree with). */
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
/* Hugging Face tokenizer.json (see tokenizer_hf.c for what is read). Anything it cannot
 * reproduce exactly (another model type, a normalizer, a Metaspace pre-tokenizer, a
 * SentencePiece tokenizer.model) is refused with an error naming the file and the key. */
tpd_status tpd_bpe_load_hf(const char *tokenizer_json, tpd_bpe **bpe_p);
void tpd_bpe_destroy(tpd_bpe *bpe);

/* Largest id + 1. */
int tpd_bpe_vocab_size(const tpd_bpe *bpe);
/* The end-of-document token, or -1 when there is none. GPT-2's files: "<|endoftext|>".
 * tokenizer.json: the eos_token of a tokenizer_config.json beside it (as Megatron's
 * HuggingFaceTokenizer takes it), else the first added token of <|end_of_text|>,
 * <|endoftext|>, </s>, <eos>. */
int32_t tpd_bpe_eod(const tpd_bpe *bpe);
/* The spelling of id (byte-level alphabet; added tokens as written), NULL when none. */
const char *tpd_bpe_token(const tpd_bpe *bpe, int32_t id);

/* Appends the ids of text[0..len) to *ids_p (n_p ids held, cap_p allocated; realloc'd).
 * Its only failure, TPD_ERR_NOMEM, is returned unlogged: encoding runs on many threads at
 * once (a record each), so the caller says it once for them all. */
tpd_status tpd_bpe_encode(const tpd_bpe *bpe, const char *text, size_t len, int32_t **ids_p,
                          size_t *n_p, size_t *cap_p);
/* tpd_bpe_encode; with add_special, the post-processor's tokens around the text too (a
 * TemplateProcessing's BOS), as Hugging Face's encode(text, add_special_tokens=True). */
tpd_status tpd_bpe_encode_ex(const tpd_bpe *bpe, const char *text, size_t len, int add_special,
                             int32_t **ids_p, size_t *n_p, size_t *cap_p);
/* *text_p (malloc'd, NUL-terminated) gets the bytes of ids[0..n), *len_p their count.
 * Special and added tokens decode to their text; ids outside the vocabulary to nothing. */
tpd_status tpd_bpe_decode(const tpd_bpe *bpe, const int32_t *ids, size_t n, char **text_p,
                          size_t *len_p);

#ifdef __cplusplus
}
#endif
#endif
