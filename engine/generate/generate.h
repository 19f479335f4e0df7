/* Text generation from a checkpoint: byte-level tokens, temperature and top-k sampling.
 *
 * Text is bytes (vocab_size 257 models), or BPE ids when a tokenizer is given (GPT-2's
 * files or a tokenizer.json; the prompt is encoded with its special tokens, a BOS).
 * The checkpoint (saved under any TP/PP/DP layout) is loaded into one single-rank model
 * (TP = PP = DP = 1) with micro-batch 1, on the cpu backend (fp32; the default) or the cuda
 * one (in the checkpoint's training.precision). Tokens are sampled from the last position's
 * logits (the first vocab_size of them: padded columns are never drawn).
 *
 * With the key/value cache (the default) each new token runs one position through the
 * model's layers, attending to the cached keys and values (engine/model/model_decode.h).
 * When the cache holds seq_length
 * positions it restarts from the last seq_length/2 tokens. Without it, each new token
 * runs a full forward over the last seq_length tokens. While the text fits in
 * seq_length, both see the same context. */
#ifndef TPD_ENGINE_GENERATE_H
#define TPD_ENGINE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/config/config.h"
#include "engine/data/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_gen_opts {
    const char *prompt; /* bytes; "" starts from the end-of-document token */
    int max_new_tokens;
    double temperature; /* 0 = greedy (argmax) */
    int top_k;          /* 0 = whole vocabulary */
    uint64_t seed;      /* draw i uses tpd_rng_uniform(seed, stream, i) */
    int num_threads;    /* cpu OpenMP threads, 0 = runtime default */
    int kv_cache;       /* 1: incremental decoding with a key/value cache */
    const tpd_bpe *bpe; /* BPE for the prompt; NULL: bytes */
    double top_p;       /* nucleus: the fewest top tokens holding this probability; 1 = all */
    int stop_at_eod;    /* 1: stop before an end-of-document token (it is not returned) */
    /* Called with each new token as it is drawn (may be NULL): a caller that streams the
     * text writes it here. A non-zero return ends the generation there (a signal, a
     * closed output); the tokens so far are returned. */
    int (*on_token)(void *user, int32_t token);
    void *on_token_user;
    tpd_device device; /* the backend: TPD_DEVICE_CPU or TPD_DEVICE_CUDA (device 0) */
} tpd_gen_opts;

#define TPD_GEN_OPTS_INIT                                                                          \
    { "", 64, 1.0, 0, 1234, 0, 1, NULL, 1.0, 0, NULL, NULL, TPD_DEVICE_CPU }

/* Generates up to max_new_tokens tokens after the prompt; *tokens_p (malloc'd) gets the
 * new tokens only and *n_p their count. */
tpd_status tpd_generate(const char *checkpoint, const tpd_gen_opts *opts, int32_t **tokens_p,
                        size_t *n_p);

/* The next-token logits (vocab_size floats) after tokens[0..n), 1 <= n <= seq_length,
 * from the key/value cache or from one full forward, on the cpu backend. For tests and
 * tools. */
tpd_status tpd_generate_logits(const char *checkpoint, const int32_t *tokens, size_t n,
                               int kv_cache, float *logits);

/* Index drawn from logits[0..n) with uniform u in [0, 1): softmax(logits / temperature)
 * over the top_k largest (0: all), then over the fewest of those whose probability sums to
 * top_p (>= 1: all). temperature 0 is greedy. Pure: exposed for tests. */
int tpd_generate_sample(const float *logits, int n, double temperature, int top_k, double top_p,
                        double u);

#ifdef __cplusplus
}
#endif
#endif
