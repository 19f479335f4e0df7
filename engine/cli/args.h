/* The command line of a subcommand, parsed one way for all of them: one config file (or,
 * for the commands on files, one path), Hydra-style section.key=value overrides (as many
 * as given: no limit, none dropped), and the options the subcommand declares, each a
 * switch, with one value, or with a list of values. Numbers are parsed strictly: the whole
 * string, in range, finite; errors name the option. Every error is logged once here
 * (tpd_log_error), and the subcommand leaves with TPD_EXIT_CONFIG. */
#ifndef TPD_ENGINE_CLI_ARGS_H
#define TPD_ENGINE_CLI_ARGS_H

#include <stdint.h>

#include "base/status.h"
#include "engine/config/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* takes_value of an option followed by one or more values: every argument up to the next
 * option (`--input a.txt b.txt`); each value is an entry of opt_name/opt_value. */
#define TPD_CLI_VALUES 2

typedef struct tpd_cli_opt {
    const char *name; /* "--steps" */
    int takes_value;  /* 0: a switch, 1: one value, TPD_CLI_VALUES */
} tpd_cli_opt;

typedef struct tpd_cli_args {
    const char *config; /* the positional argument (CONFIG.yaml, or the path); NULL when none */
    int n_overrides;
    const char **overrides; /* "section.key=value", in order */
    int n_opts;
    const char **opt_name;  /* each option given, in order: its name in the table */
    const char **opt_value; /* its value; NULL for a switch */
    int help;               /* -h or --help */
} tpd_cli_args;

/* Splits argv[0..argc) (the subcommand's own arguments). opts ends with {NULL, 0}. An
 * unknown option, an option without its value, or a second positional argument prints
 * "tripod: error: CMD: ..." and returns TPD_ERR_INVALID. */
tpd_status tpd_cli_args_parse(const char *cmd, int argc, char **argv, const tpd_cli_opt *opts,
                              tpd_cli_args *a);
/* The same for a command on files (export, generate, data info): no argument is taken for
 * an override, the one positional argument is its path (in `config`). */
tpd_status tpd_cli_args_parse_path(const char *cmd, int argc, char **argv, const tpd_cli_opt *opts,
                                   tpd_cli_args *a);
void tpd_cli_args_free(tpd_cli_args *a);

/* The config the command line names, with its overrides (tpd_config_load, which logs what
 * is wrong with it). A missing CONFIG.yaml is logged as "CMD: missing CONFIG.yaml". */
tpd_status tpd_cli_args_load_config(const char *cmd, const tpd_cli_args *a, tpd_config *cfg_p);

/* Strict numbers: the whole of s, within [lo, hi], finite. On failure prints
 * "tripod: error: CMD: OPT 'S' must be ..." and returns TPD_ERR_INVALID. */
tpd_status tpd_cli_int(const char *cmd, const char *opt, const char *s, long lo, long hi, int *v_p);
tpd_status tpd_cli_double(const char *cmd, const char *opt, const char *s, double lo, double hi,
                          double *v_p);
/* A comma-separated list of min_n to max_n strict integers, each within [lo, hi], into
 * v[0..*n_p) (`--layout 8,8,16`, `--tp 1,2,4`). On failure prints "tripod: error: CMD:
 * OPT 'S' must be ..." and returns TPD_ERR_INVALID. */
tpd_status tpd_cli_int_list(const char *cmd, const char *opt, const char *s, long lo, long hi,
                            int min_n, int max_n, int *v, int *n_p);
/* A non-negative integer that fits 64 bits (seeds). */
tpd_status tpd_cli_u64(const char *cmd, const char *opt, const char *s, uint64_t *v_p);

#ifdef __cplusplus
}
#endif
#endif
