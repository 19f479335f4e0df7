/* The config loader on a YAML file: any bytes load or fail with a message, and a config
 * that loads prints and passes or fails the world checks cleanly. */
#include "engine/config/config.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = tpd_fuzz_path(0, "config.yaml");
    tpd_fuzz_write(path, data, size);
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
