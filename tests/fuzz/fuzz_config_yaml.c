/* The config loader on a YAML file: any bytes load or fail with a message, and a config
 * that loads prints and passes or fails the world checks cleanly.
 *
 * An input whose first byte is 0x01 is a unit of nesting instead ("[", "{a: ", "- "): the
 * file is that unit repeated to DEEP_BYTES, so the fuzzer explores deep nesting without
 * having to grow its inputs to a megabyte. libyaml's scanner costs O(depth) a token,
 * and such a file must still fail fast (the per-input -timeout: 10 s). */
#include "engine/config/config.h"
#include "fuzz_util.h"

#define DEEP_BYTES (512u << 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = tpd_fuzz_path(0, "config.yaml");
    if (size >= 2 && data[0] == 0x01) {
        static uint8_t deep[DEEP_BYTES];
        for (size_t i = 0; i < DEEP_BYTES; i++)
            deep[i] = data[1 + i % (size - 1)];
        tpd_fuzz_write(path, deep, DEEP_BYTES);
    } else {
        tpd_fuzz_write(path, data, size);
    }
    static tpd_config cfg;
    tpd_log_quiet_begin(); /* the messages are kept, not printed: millions of inputs */
    if (tpd_config_load(path, 0, NULL, &cfg) == TPD_OK) {
        FILE *out = fopen("/dev/null", "w");
        if (out) {
            tpd_config_print(&cfg, out);
            fclose(out);
        }
        for (int world = 1; world <= 8; world *= 2)
            tpd_config_check_world(&cfg, world);
    }
    tpd_log_quiet_end();
    return 0;
}
