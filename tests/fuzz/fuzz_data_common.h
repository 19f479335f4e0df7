/* What the token-data harnesses do with a data set that opens: read every token, and draw
 * samples of a train split as training would, so an index that validates but lies about
 * the stream shows up as an out-of-bounds read. */
#ifndef TPD_TESTS_FUZZ_DATA_COMMON_H
#define TPD_TESTS_FUZZ_DATA_COMMON_H

#include <stdlib.h>

#include "engine/data/data.h"

/* GPT-2's padded vocabulary: uint16 tokens above it fail the range check, and llm.c's
 * <|endoftext|> (50256) lies inside it. */
#define TPD_FUZZ_VOCAB 50304

static inline void tpd_fuzz_use_dataset(const tpd_dataset *ds) {
    uint64_t n = tpd_dataset_num_tokens(ds);
    int64_t sum = 0;
    for (uint64_t i = 0; i < n; i++)
        sum += tpd_dataset_token(ds, i);
    int32_t buf[64];
    if (tpd_dataset_read(ds, 0, n < 64 ? n : 64, buf) != TPD_OK) abort(); /* in range */
    tpd_dataset_read(ds, n, 1, buf); /* past the end: must fail, not read */
    tpd_sampler s;
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        if (tpd_sampler_init(ds, "8,1,1", TPD_SPLIT_TRAIN, 4, shuffle, 7, &s) != TPD_OK) continue;
        for (uint64_t g = 0; g < 16; g++)
            tpd_sampler_get(&s, g * 977, buf);
        tpd_sampler_free(&s);
    }
    (void)sum;
}

#endif
