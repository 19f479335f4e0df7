/* Private to engine/data*.c: format constants and helpers shared by the reader
 * (data.c) and the writers (data_write.c). */
#ifndef TPD_ENGINE_DATA_INTERNAL_H
#define TPD_ENGINE_DATA_INTERNAL_H

#include "engine/data/data.h"

enum { DTYPE_UINT16 = 8, DTYPE_INT32 = 4 }; /* Megatron dtype codes */

/* ---- formats ---- */

extern const char k_idx_magic[9];
enum {
    IDX_HEADER_BYTES = 9 + 8 + 1 + 8 + 8, /* magic, version, dtype, two counts */
    LLMC_HEADER_BYTES = 256 * 4,
    LLMC_MAGIC = 20240520,
    LLMC_EOT = 50256, /* GPT-2 <|endoftext|>, which llm.c puts before every document */
};

typedef struct dtype_info {
    int code; /* Megatron's dtype code */
    const char *name;
    int size; /* bytes */
    int is_float;
} dtype_info;

const dtype_info *tpd_data_dtype_find(int code);
/* a + b in a new malloc'ed string, NULL when out of memory */
char *tpd_data_path_join(const char *a, const char *b);

#endif
