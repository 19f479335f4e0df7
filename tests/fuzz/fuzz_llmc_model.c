/* The llm.c model file reader of `tripod import --format llmc`: input = the model file (a
 * 256-int32 header, then fp32 tensors). The header's fields are bounded before anything is
 * allocated, so a header claiming a huge model is refused, not allocated. */
#include "engine/checkpoint/interchange.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = tpd_fuzz_path(0, "model.bin");
    tpd_fuzz_write(path, data, size);
    static tpd_config cfg;
    float *global[TPD_P_COUNT];
    if (tpd_ckpt_import_llmc(path, &cfg, global) == TPD_OK) tpd_ckpt_free_weights(global);
    return 0;
}
