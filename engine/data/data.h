/* Token data sets and sampling.
 *
 * Formats read:
 * - Megatron indexed data set: PREFIX.idx ("MMIDIDX\0\0", version 1, dtype code, sequence
 *   and document counts, int32 lengths, int64 byte offsets, int64 document indices) +
 *   PREFIX.bin (raw tokens).
 * - llm.c token shard: 256 int32 header [20240520, 1, ntok, ...] then ntok uint16.
 * The whole token stream is mapped read-only (mmap) and validated at open: a truncated
 * file, a wrong magic or version, or a token >= vocab_size fails with a message that
 * names the file and the byte offset.
 *
 * Sampling (the global batch of README.md's "What each dimension does"): a sample is
 * seq_length+1 consecutive tokens of one split. Sample g of a split is the window starting
 * at token g*seq_length (modulo the number of windows, epoch after epoch); with shuffle the
 * window order within each epoch is a permutation seeded by (seed, epoch). The order
 * depends only on the seed and g, never on the parallel layout. */
#ifndef TPD_ENGINE_DATA_H
#define TPD_ENGINE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/config/config.h"
#include "engine/data/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_dataset tpd_dataset;

/* Errors of this module are logged once by the function that finds them, and their text
 * is the calling thread's tpd_last_error (base/status.h). */

/* `path` is a Megatron prefix (PREFIX.idx exists) or an llm.c shard file. A path ending
 * in ".idx" or ".bin" whose prefix has a PREFIX.idx is taken as that prefix. Every
 * token must lie in [0, vocab_size). */
tpd_status tpd_dataset_open(const char *path, int vocab_size, tpd_dataset **ds_p);
void tpd_dataset_close(tpd_dataset *ds);
uint64_t tpd_dataset_num_tokens(const tpd_dataset *ds);
/* Megatron: document_count - 1 of the index (its document indices start with 0).
 * llm.c shards carry no document index; llm.c's GPT-2 writers open every document with
 * <|endoftext|> (50256), so this counts those tokens, or 1 for a non-empty shard that
 * holds none. */
uint64_t tpd_dataset_num_documents(const tpd_dataset *ds);
/* Token i of the stream (i < num_tokens; not range-checked: the hot path). */
int32_t tpd_dataset_token(const tpd_dataset *ds, uint64_t i);
/* out[n] = tokens [begin, begin + n) of the stream; fails when the range runs past the
 * end. */
tpd_status tpd_dataset_read(const tpd_dataset *ds, uint64_t begin, uint64_t n, int32_t *out);
/* "megatron" or "llm.c". */
const char *tpd_dataset_format(const tpd_dataset *ds);
/* Token dtype name as stored: "uint8", "int8", "int16", "uint16", "int32", "int64". */
const char *tpd_dataset_dtype(const tpd_dataset *ds);
/* Largest token id in the stream (-1 when empty), found by the validation scan. */
int32_t tpd_dataset_max_token(const tpd_dataset *ds);

typedef enum tpd_split { TPD_SPLIT_TRAIN = 0, TPD_SPLIT_VALID = 1, TPD_SPLIT_TEST = 2 } tpd_split;

typedef struct tpd_sampler {
    const tpd_dataset *ds;
    uint64_t begin, end;  /* token range of the split */
    uint64_t num_windows; /* (end - begin - 1) / seq_length */
    int seq_length;
    int shuffle;
    uint64_t seed;
    /* permutation cache for one epoch */
    int64_t perm_epoch;
    uint64_t *perm;
} tpd_sampler;

/* split: "949,50,1" weights; the token stream is cut into three contiguous ranges in
 * proportion. Fails when the chosen split holds fewer than seq_length+1 tokens. */
tpd_status tpd_sampler_init(const tpd_dataset *ds, const char *split, tpd_split which,
                            int seq_length, int shuffle, uint64_t seed, tpd_sampler *s_p);
void tpd_sampler_free(tpd_sampler *s);
/* out[seq_length+1] = tokens of sample g: epoch e = g / num_windows, position
 * p = g % num_windows, window w = p, or perm_e[p] with shuffle, where perm_e is the
 * Fisher-Yates permutation whose swap i (from num_windows-1 down to 1) takes
 * tpd_rng_below(seed, e, i, i + 1); the tokens are [begin + w*seq_length, + seq_length+1).
 * Caches one epoch's permutation in *s, so a sampler serves one thread. */
tpd_status tpd_sampler_get(tpd_sampler *s, uint64_t g, int32_t *out);

/* ---- blending (Megatron's --data-path W1 PREFIX1 W2 PREFIX2 ...) ----
 *
 * data.data_path is one prefix, or weights and prefixes in turn ("0.3 a 0.7 b": the first
 * word a number and an even count; weights need not sum to 1). Sample g of the blend is
 * assigned as Megatron's build_blending_indices does: to the data set d with the largest
 * w_d * max(g, 1) - c_d, where c_d counts the samples given to d before g (ties to the
 * lowest d); it is then sample c_d of d's own sampler (each data set has its own split,
 * epochs and shuffle; data set d > 0 shuffles with its own seed). With one prefix, sample
 * g is sample g of that data set, as without blending. One prefix with * ? or [ (llm.c's
 * "data/fineweb_train_*.bin") takes every match in name order, weighted by its tokens. */
#define TPD_BLEND_MAX TPD_DATA_PATH_MAX

typedef struct tpd_data_source {
    int n;
    double weight[TPD_BLEND_MAX]; /* normalized: they sum to 1 */
    tpd_dataset *ds[TPD_BLEND_MAX];
    char *prefix[TPD_BLEND_MAX];
} tpd_data_source;

/* Opens every data set of the spec (errors name data.data_path and the rule, or the file). */
tpd_status tpd_data_source_open(const char *spec, int vocab_size, tpd_data_source *src_p);
void tpd_data_source_close(tpd_data_source *src);

typedef struct tpd_blend_sampler {
    const tpd_data_source *src;
    tpd_sampler s[TPD_BLEND_MAX];
    uint64_t at; /* the cursor: count[] holds the assignments of [0, at) */
    uint64_t count[TPD_BLEND_MAX];
    uint64_t *snaps; /* (nsnaps * n) count[] at every TPD_BLEND_BLOCK-th sample */
    uint64_t nsnaps, snaps_cap;
} tpd_blend_sampler;

tpd_status tpd_blend_sampler_init(const tpd_data_source *src, const char *split, tpd_split which,
                                  int seq_length, int shuffle, uint64_t seed,
                                  tpd_blend_sampler *b_p);
void tpd_blend_sampler_free(tpd_blend_sampler *b);
/* *dataset_p and *index_p: where sample g of the blend comes from (either may be NULL). */
void tpd_blend_sampler_locate(tpd_blend_sampler *b, uint64_t g, int *dataset_p, uint64_t *index_p);
/* out[seq_length+1] = tokens of sample g of the blend. */
tpd_status tpd_blend_sampler_get(tpd_blend_sampler *b, uint64_t g, int32_t *out);

/* Writers. Files are written under a temporary name and renamed into place, .bin
 * before .idx, so an existing PREFIX.idx always comes with a complete PREFIX.bin. */
/* Megatron indexed data set from documents; dtype code chosen as Megatron does (uint16
 * when vocab_size < 65500, else int32). doc_offsets has num_docs + 1 entries: document
 * d is tokens[doc_offsets[d], doc_offsets[d+1]). Each document is one sequence, so the
 * index holds sequence_count = num_docs and document_count = num_docs + 1 indices
 * 0, 1, ..., num_docs, as Megatron's builder writes them. */
tpd_status tpd_indexed_write(const char *prefix, const int32_t *tokens, const uint64_t *doc_offsets,
                             uint64_t num_docs, int vocab_size);
tpd_status tpd_llmc_shard_write(const char *path, const uint16_t *tokens, uint64_t ntok);

/* Streaming form of tpd_indexed_write, for corpora larger than memory: documents are
 * appended one at a time to PREFIX.bin; finish writes PREFIX.idx and renames both into
 * place. destroy after a failed or missing finish removes the temporary files. */
typedef struct tpd_indexed_builder tpd_indexed_builder;
tpd_status tpd_indexed_builder_create(const char *prefix, int vocab_size,
                                      tpd_indexed_builder **b_p);
tpd_status tpd_indexed_builder_add(tpd_indexed_builder *b, const int32_t *tokens, uint64_t n);
tpd_status tpd_indexed_builder_finish(tpd_indexed_builder *b);
void tpd_indexed_builder_destroy(tpd_indexed_builder *b);

/* `tripod data prepare`: byte-level tokenization (vocab 257: bytes 0..255, end of
 * document 256), or GPT-2's BPE when opts->bpe is set (its vocabulary; every document ends
 * with its "<|endoftext|>", which it must have). Writes a Megatron indexed data set.
 *
 * Records: one document per input file (FILE), per blank-line separated record (BLANK),
 * per '%'-line separated record (PERCENT, the fortune format), or per line of JSON Lines
 * (JSONL: the string field opts->json_key of each object, as Megatron's
 * preprocess_data.py --json-keys reads it). A text record is the exact bytes of its lines,
 * each with its own '\n'; separator lines are dropped (a blank line holds only spaces,
 * tabs and '\r'; a percent line is "%" or "%\r"). A record never spans two input files.
 * Records holding only whitespace are skipped. *num_tokens_p counts the EOD tokens too.
 * Fails when no document results, and on a JSONL line that is not an object with that
 * string field (naming the file and line). */
typedef enum tpd_records {
    TPD_RECORDS_FILE = 0,
    TPD_RECORDS_BLANK = 1,
    TPD_RECORDS_PERCENT = 2,
    TPD_RECORDS_JSONL = 3,
} tpd_records;

#define TPD_BYTE_VOCAB 257
#define TPD_BYTE_EOD 256

typedef struct tpd_prepare_opts {
    tpd_records records;
    const tpd_bpe *bpe;   /* NULL: bytes; else encoded with its special tokens (a BOS) */
    const char *json_key; /* JSONL: the field holding a document's text */
    int omit_eod;         /* 1: documents do not end with the end-of-document token (Megatron
                           * without --append-eod); 0: they do */
} tpd_prepare_opts;

#define TPD_PREPARE_OPTS_INIT                                                                      \
    { TPD_RECORDS_FILE, NULL, "text", 0 }

tpd_status tpd_data_prepare(const char *const *inputs, int n_inputs, const tpd_prepare_opts *opts,
                            const char *output_prefix, uint64_t *num_docs_p,
                            uint64_t *num_tokens_p);

/* Byte-level detokenization for generation: writes printable text (EOD as "\n").
 * One output byte per token: bytes 0..255 as themselves, except control bytes other
 * than '\n' and '\t' (and 127), which become '?', as does any id outside 0..256 (a
 * padded-vocab logit). Writes at most cap-1 bytes plus a NUL (nothing when cap is 0)
 * and returns the number of bytes written, NUL excluded. */
size_t tpd_bytes_detokenize(const int32_t *tokens, size_t n, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
