/* The Megatron indexed data set reader: input = PREFIX.idx bytes, separator, PREFIX.bin
 * bytes. */
#include "fuzz_data_common.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[2];
    size_t len[2];
    tpd_fuzz_split(data, size, 2, part, len);
    tpd_fuzz_write(tpd_fuzz_path(0, "ds.idx"), part[0], len[0]);
    tpd_fuzz_write(tpd_fuzz_path(1, "ds.bin"), part[1], len[1]);
    tpd_dataset *ds = NULL;
    if (tpd_dataset_open(tpd_fuzz_path(2, "ds"), TPD_FUZZ_VOCAB, &ds) == TPD_OK) {
        tpd_fuzz_use_dataset(ds);
        tpd_dataset_close(ds);
    }
    return 0;
}
