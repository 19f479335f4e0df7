/* Model interchange: Hugging Face GPT-2 safetensors and llm.c model files, both ways.
 *
 * Every function works on the global fp32 tensors of engine/model/model_layout.h (llm.c order
 * and shapes, stacked over layers; wte unpadded (V, C)), one malloc'd array per tensor.
 *
 * Hugging Face: model.safetensors with GPT2LMHeadModel names ("transformer.wte.weight",
 * "transformer.h.{i}.attn.c_attn.weight", ...). Conv1D weights (c_attn, c_proj, c_fc) are
 * (in, out) there and (out, in) here, so they are transposed both ways. The head is tied:
 * lm_head.weight is neither written nor read; the attention buffers attn.bias and
 * attn.masked_bias are skipped; names are accepted with and without "transformer.".
 * A config.json beside it carries the shape (n_head cannot be read from the tensors).
 *
 * llm.c: a 256-int32 header [20240326, 3, maxT, V, L, NH, C, Vp], then the tensors in
 * order, fp32, wte padded with zero rows to Vp. llm.c's MLP is 4C wide. */
#ifndef TPD_ENGINE_INTERCHANGE_H
#define TPD_ENGINE_INTERCHANGE_H

#include "engine/checkpoint/checkpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPD_LLMC_MODEL_MAGIC 20240326

/* Reads every global tensor of a checkpoint's parameters (global[p] malloc'd). */
tpd_status tpd_ckpt_read_weights(const tpd_ckpt_info *info, float *global[TPD_P_COUNT]);
void tpd_ckpt_free_weights(float *global[TPD_P_COUNT]);

/* out_dir/model.safetensors and out_dir/config.json (out_dir is created). */
tpd_status tpd_ckpt_export_hf(const tpd_config *cfg, float *const global[TPD_P_COUNT],
                              const char *out_dir);
/* One llm.c model file. Fails (naming the key) when the model cannot be expressed there
 * (ffn_hidden_size != 4*hidden_size). */
tpd_status tpd_ckpt_export_llmc(const tpd_config *cfg, float *const global[TPD_P_COUNT],
                                const char *out_path);

/* path: a directory holding model.safetensors and config.json, or a .safetensors file
 * with config.json beside it. cfg gets defaults plus the model section. */
tpd_status tpd_ckpt_import_hf(const char *path, tpd_config *cfg, float *global[TPD_P_COUNT]);
tpd_status tpd_ckpt_import_llmc(const char *path, tpd_config *cfg, float *global[TPD_P_COUNT]);

#ifdef __cplusplus
}
#endif
#endif
