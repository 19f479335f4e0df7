/* The override parser: each line of the input is one "section.key=value" override of the
 * defaults, applied in order as `tripod train CONFIG key=value ...` applies them. */
#include "engine/config/config.h"
#include "fuzz_util.h"

#define MAX_OVERRIDES 32

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = tpd_fuzz_str(data, size);
    const char *ov[MAX_OVERRIDES];
    int n = 0;
    for (char *line = text; line && n < MAX_OVERRIDES;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        ov[n++] = line;
        line = nl ? nl + 1 : NULL;
    }
    static tpd_config cfg;
    tpd_log_quiet_begin(); /* the messages are kept, not printed: millions of inputs */
    if (tpd_config_load(NULL, n, ov, &cfg) == TPD_OK) {
        FILE *out = fopen("/dev/null", "w");
        if (out) {
            tpd_config_print(&cfg, out);
            fclose(out);
        }
        tpd_config_check_world(&cfg, 4);
    }
    tpd_log_quiet_end();
    free(text);
    return 0;
}
