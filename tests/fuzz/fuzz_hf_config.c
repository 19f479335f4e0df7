/* The config.json reader of `tripod import --format hf`: input = config.json, in a folder
 * with no safetensors, so the import stops after the config is read and checked (the model
 * it describes is never allocated). */
#include "engine/checkpoint/interchange.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tpd_fuzz_write(tpd_fuzz_path(0, "config.json"), data, size);
    static tpd_config cfg;
    float *global[TPD_P_COUNT];
    if (tpd_ckpt_import_hf(tpd_fuzz_dir(), &cfg, global) == TPD_OK) tpd_ckpt_free_weights(global);
    return 0;
}
