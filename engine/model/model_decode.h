/* Decoding one position at a time with a key/value cache, on the model's own block: each
 * step runs one new token through the layers with the same views and ops as the training
 * forward (model_internal.h), and its attention is one query over the cached keys and values
 * of the positions before it (tpd_kern_attention_decode). So a step's next-token logits are
 * those of the full forward's row at that position, on either backend and for every block
 * the model knows (GPT-2; the Llama block with RoPE at the step's position and
 * grouped-query attention, whose cache holds only the K/V heads).
 *
 * The cache is separate from the model's planned buffers (tpd_model_memory does not count
 * it): (Ls, T, KVl*HS) for K and the same for V in the activation dtype, T = seq_length, plus
 * one position's row of every activation. Allocated through the model's backend at create.
 *
 * Limits: the whole model on one rank (TP = PP = 1, so no sequence parallelism and no
 * virtual stages), positions 0 .. seq_length - 1. The model's hook is not called (nothing to
 * gather on one rank). */
#ifndef TPD_ENGINE_MODEL_DECODE_H
#define TPD_ENGINE_MODEL_DECODE_H

#include <stdint.h>

#include "engine/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_model_decode tpd_model_decode;

/* An empty cache for model m, which must outlive it. */
tpd_status tpd_model_decode_create(tpd_model *m, tpd_model_decode **dec_p);
/* NULL is a no-op. */
void tpd_model_decode_destroy(tpd_model_decode *dec);
/* Forgets every position: the next step starts at position 0. */
void tpd_model_decode_reset(tpd_model_decode *dec);
/* Positions held: the next step's position when appending. */
int tpd_model_decode_len(const tpd_model_decode *dec);

/* Runs `token` at position pos (0 <= pos <= len, pos < seq_length), attending to positions
 * 0 .. pos; the cache then holds positions 0 .. pos (a pos below len drops the positions
 * from pos on). logits, when not NULL, gets the next-token logits: Vp fp32 values in host
 * memory (the padded vocab; entries >= vocab_size are padding). On failure the cache holds
 * positions 0 .. pos - 1. */
tpd_status tpd_model_decode_step(tpd_model_decode *dec, int pos, int32_t token, float *logits);

#ifdef __cplusplus
}
#endif
#endif
