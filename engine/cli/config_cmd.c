/* `tripod config show CONFIG.yaml [overrides]`: the resolved configuration, every key with
 * its value and a comment. */
#include <stdio.h>
#include <string.h>

#include "engine/cli/args.h"
#include "engine/cli/cli.h"
#include "engine/config/config.h"

static const char k_usage[] = "usage: tripod config show CONFIG.yaml [key=value ...]\n";

int tpd_cli_config(int argc, char **argv) {
    static const tpd_cli_opt none[] = {{NULL, 0}};
    if (argc < 2 || strcmp(argv[1], "show") != 0) {
        fputs(k_usage, stderr);
        return argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
                   ? TPD_EXIT_OK
                   : TPD_EXIT_CONFIG;
    }
    tpd_cli_args a;
    if (tpd_cli_args_parse("config show", argc - 2, argv + 2, none, &a) != TPD_OK)
        return TPD_EXIT_CONFIG;
    if (a.help) {
        printf("%s  Prints the resolved configuration: every key, its value and a comment.\n",
               k_usage);
        tpd_cli_args_free(&a);
        return TPD_EXIT_OK;
    }
    tpd_config cfg;
    int rc =
        tpd_cli_args_load_config("config show", &a, &cfg) == TPD_OK ? TPD_EXIT_OK : TPD_EXIT_CONFIG;
    if (rc == TPD_EXIT_OK) tpd_config_print(&cfg, stdout);
    tpd_cli_args_free(&a);
    return rc;
}
