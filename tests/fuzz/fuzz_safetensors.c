/* The safetensors reader of `tripod import --format hf`: the input is model.safetensors
 * (8-byte header length, JSON header, tensor data), read against a fixed config.json of a
 * one-layer GPT-2 (n_embd 8, n_head 2, vocab 11, 4 positions). */
#include "engine/checkpoint/interchange.h"
#include "fuzz_util.h"

static const char k_config[] = "{\"model_type\": \"gpt2\", \"n_head\": 2, \"n_layer\": 1, "
                               "\"n_embd\": 8, \"vocab_size\": 11, \"n_positions\": 4, "
                               "\"n_inner\": null}\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int wrote_config;
    if (!wrote_config) {
        tpd_fuzz_write(tpd_fuzz_path(0, "config.json"), (const uint8_t *)k_config,
                       sizeof k_config - 1);
        wrote_config = 1;
    }
    tpd_fuzz_write(tpd_fuzz_path(1, "model.safetensors"), data, size);
    static tpd_config cfg;
    float *global[TPD_P_COUNT];
    if (tpd_ckpt_import_hf(tpd_fuzz_dir(), &cfg, global) == TPD_OK) tpd_ckpt_free_weights(global);
    return 0;
}
