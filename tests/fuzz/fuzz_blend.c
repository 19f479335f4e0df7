/* The blend spec (data.data_path): the input is the spec. It is parsed, and, when it names
 * nothing outside the scratch folder (no '/'), opened there and sampled: the folder holds
 * two Megatron data sets "a" and "b" and two llm.c shards "s1.bin" and "s2.bin" (so
 * "s*.bin" expands). The harness works inside that folder only during a call: libFuzzer
 * writes its corpus relative to the folder it was started in. */
#include "fuzz_data_common.h"
#include "fuzz_util.h"

static void make_data_sets(void) {
    static int made;
    if (made) return;
    made = 1;
    int32_t tok[40];
    uint16_t tok16[40];
    for (int i = 0; i < 40; i++) {
        tok[i] = i % 7;
        tok16[i] = (uint16_t)(i % 5);
    }
    const uint64_t offs_a[3] = {0, 10, 40}, offs_b[2] = {0, 25};
    if (tpd_indexed_write("a", tok, offs_a, 2, 100) != TPD_OK ||
        tpd_indexed_write("b", tok, offs_b, 1, 100) != TPD_OK ||
        tpd_llmc_shard_write("s1.bin", tok16, 30) != TPD_OK ||
        tpd_llmc_shard_write("s2.bin", tok16, 12) != TPD_OK)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char home[4096];
    if (!home[0] && !getcwd(home, sizeof home)) abort();
    if (chdir(tpd_fuzz_dir()) != 0) abort();
    make_data_sets();
    char *spec = tpd_fuzz_str(data, size);
    tpd_data_path parsed;
    char why[512];
    if (tpd_config_data_path_parse(spec, &parsed, why, sizeof why)) {
        double sum = 0;
        for (int d = 0; d < parsed.n; d++)
            sum += parsed.weight[d];
        (void)sum;
        tpd_config_data_path_free(&parsed);
    }
    tpd_data_source src;
    if (!strchr(spec, '/') && tpd_data_source_open(spec, 100, &src) == TPD_OK) {
        tpd_blend_sampler b;
        int32_t out[5];
        if (tpd_blend_sampler_init(&src, "8,1,1", TPD_SPLIT_TRAIN, 4, 1, 3, &b) == TPD_OK) {
            for (uint64_t g = 0; g < 64; g += 7)
                tpd_blend_sampler_get(&b, g, out);
            tpd_blend_sampler_free(&b);
        }
        tpd_data_source_close(&src);
    }
    free(spec);
    if (chdir(home) != 0) abort();
    return 0;
}
