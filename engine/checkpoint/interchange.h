/* Model interchange: Hugging Face folders and llm.c model files, both ways.
 *
 * Every function works on the global fp32 tensors of engine/model/model_layout.h (llm.c order
 * and shapes, stacked over layers; wte unpadded (V, C)), one malloc'd array per tensor.
 *
 * Hugging Face: a folder with config.json and safetensors (one model.safetensors, or shards
 * named by model.safetensors.index.json; F32, BF16, F16 or F64 tensors).
 *   - GPT2LMHeadModel: "transformer.wte.weight", "transformer.h.{i}.attn.c_attn.weight",
 *     ...; Conv1D weights (c_attn, c_proj, c_fc) are (in, out) there and (out, in) here, so
 *     they are transposed both ways. The head is tied; the attention buffers attn.bias and
 *     attn.masked_bias are skipped; names are accepted with and without "transformer.".
 *   - The Llama block: LlamaForCausalLM (attention_bias = mlp_bias = add_bias_linear),
 *     MistralForCausalLM without a sliding window (read, written as Llama), and
 *     Qwen2ForCausalLM (add_qkv_bias). q/k/v_proj are the [Q; K; V] row blocks of qkvw,
 *     gate/up_proj the [gate; up] blocks of fcw, o_proj and down_proj are attprojw and
 *     fcprojw; RoPE is rotate-half on both sides, so nothing is permuted. rope_scaling,
 *     sliding windows, head_dim != hidden/heads and partial rotary are refused by key.
 *   Every error names the file and the tensor or key.
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

typedef struct tpd_hf_export {
    int bf16;                 /* tensors in bf16 (rounded to nearest even), else fp32 */
    uint64_t max_shard_bytes; /* larger models are sharded with an index; 0: one file */
} tpd_hf_export;
/* transformers' save_pretrained default shard size */
#define TPD_HF_EXPORT_INIT                                                                         \
    { 0, 5000000000ull }

/* out_dir/config.json and the safetensors; written beside out_dir and renamed into place
 * (out_dir must not exist, or be empty). opts NULL: TPD_HF_EXPORT_INIT. */
tpd_status tpd_ckpt_export_hf(const tpd_config *cfg, float *const global[TPD_P_COUNT],
                              const char *out_dir, const tpd_hf_export *opts);
/* One llm.c model file. Fails (naming the key) when the model cannot be expressed there
 * (ffn_hidden_size != 4*hidden_size). */
tpd_status tpd_ckpt_export_llmc(const tpd_config *cfg, float *const global[TPD_P_COUNT],
                                const char *out_path);

/* path: a Hugging Face folder, or a .safetensors / index .json file with config.json
 * beside it. cfg gets defaults plus the model section. */
tpd_status tpd_ckpt_import_hf(const char *path, tpd_config *cfg, float *global[TPD_P_COUNT]);
tpd_status tpd_ckpt_import_llmc(const char *path, tpd_config *cfg, float *global[TPD_P_COUNT]);

#ifdef __cplusplus
}
#endif
#endif
