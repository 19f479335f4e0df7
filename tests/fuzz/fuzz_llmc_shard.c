/* The llm.c token shard reader: input = the shard file. */
#include "fuzz_data_common.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = tpd_fuzz_path(0, "shard.bin");
    tpd_fuzz_write(path, data, size);
    tpd_dataset *ds = NULL;
    if (tpd_dataset_open(path, TPD_FUZZ_VOCAB, &ds) == TPD_OK) {
        tpd_fuzz_use_dataset(ds);
        tpd_dataset_close(ds);
    }
    return 0;
}
