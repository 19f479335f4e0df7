/* The command line of a subcommand, parsed one way for all of them: one config file,
 * Hydra-style section.key=value overrides (as many as given: no limit, none dropped), and
 * the options the subcommand declares, each with or without a value. Numbers are parsed
 * strictly: the whole string, in range, finite; errors name the option. */
#ifndef TPD_ENGINE_CLI_ARGS_H
#define TPD_ENGINE_CLI_ARGS_H

#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_cli_opt {
    const char *name; /* "--steps" */
    int takes_value;
} tpd_cli_opt;

typedef struct tpd_cli_args {
    const char *config; /* the positional argument; NULL when none */
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
void tpd_cli_args_free(tpd_cli_args *a);

/* Strict numbers: the whole of s, within [lo, hi], finite. On failure prints
 * "tripod: error: CMD: OPT 'S' must be ..." and returns TPD_ERR_INVALID. */
tpd_status tpd_cli_int(const char *cmd, const char *opt, const char *s, long lo, long hi, int *v_p);
tpd_status tpd_cli_double(const char *cmd, const char *opt, const char *s, double lo, double hi,
                          double *v_p);
/* A non-negative integer that fits 64 bits (seeds). */
tpd_status tpd_cli_u64(const char *cmd, const char *opt, const char *s, uint64_t *v_p);

#ifdef __cplusplus
}
#endif
#endif
