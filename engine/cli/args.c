#include "engine/cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const tpd_cli_opt *find(const tpd_cli_opt *opts, const char *name) {
    for (; opts && opts->name; opts++)
        if (!strcmp(opts->name, name)) return opts;
    return NULL;
}

/* An argument that would be taken for an option. */
static int is_option(const char *s) {
    return s[0] == '-' && s[1];
}

static tpd_status parse(const char *cmd, int argc, char **argv, const tpd_cli_opt *opts,
                        int overrides, tpd_cli_args *a) {
    memset(a, 0, sizeof *a);
    size_t n = (size_t)(argc > 0 ? argc : 0) + 1;
    a->overrides = calloc(n, sizeof *a->overrides);
    a->opt_name = calloc(n, sizeof *a->opt_name);
    a->opt_value = calloc(n, sizeof *a->opt_value);
    if (!a->overrides || !a->opt_name || !a->opt_value) {
        tpd_fail_nomem("the command line", 3 * n * sizeof(char *));
        tpd_cli_args_free(a);
        return TPD_ERR_NOMEM;
    }
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            a->help = 1;
        } else if (is_option(s)) {
            const tpd_cli_opt *o = find(opts, s);
            if (!o) {
                tpd_log_error("%s: unknown option '%s' (%s --help lists them)", cmd, s, cmd);
                goto fail;
            }
            if (o->takes_value &&
                (i + 1 >= argc || (o->takes_value == TPD_CLI_VALUES && is_option(argv[i + 1])))) {
                tpd_log_error("%s: %s needs a value", cmd, s);
                goto fail;
            }
            do {
                a->opt_name[a->n_opts] = o->name;
                a->opt_value[a->n_opts++] = o->takes_value ? argv[++i] : NULL;
            } while (o->takes_value == TPD_CLI_VALUES && i + 1 < argc && !is_option(argv[i + 1]));
        } else if (overrides && strchr(s, '=')) {
            a->overrides[a->n_overrides++] = s;
        } else if (!a->config) {
            a->config = s;
        } else {
            tpd_log_error("%s: unexpected argument '%s' (%s)", cmd, s,
                          overrides ? "one config file, then section.key=value overrides and "
                                      "options"
                                    : "one path, then options");
            goto fail;
        }
    }
    return TPD_OK;
fail:
    tpd_cli_args_free(a);
    return TPD_ERR_INVALID;
}

tpd_status tpd_cli_args_parse(const char *cmd, int argc, char **argv, const tpd_cli_opt *opts,
                              tpd_cli_args *a) {
    return parse(cmd, argc, argv, opts, 1, a);
}

tpd_status tpd_cli_args_parse_path(const char *cmd, int argc, char **argv, const tpd_cli_opt *opts,
                                   tpd_cli_args *a) {
    return parse(cmd, argc, argv, opts, 0, a);
}

tpd_status tpd_cli_args_load_config(const char *cmd, const tpd_cli_args *a, tpd_config *cfg_p) {
    if (!a->config) return tpd_fail(TPD_ERR_INVALID, "%s: missing CONFIG.yaml", cmd);
    return tpd_config_load(a->config, a->n_overrides, a->overrides, cfg_p);
}

void tpd_cli_args_free(tpd_cli_args *a) {
    free(a->overrides);
    free(a->opt_name);
    free(a->opt_value);
    memset(a, 0, sizeof *a);
}

/* strto* skip leading blanks; a strict number starts with its sign or a digit. */
static int starts_number(const char *s) {
    return (s[0] >= '0' && s[0] <= '9') || ((s[0] == '-' || s[0] == '+' || s[0] == '.') && s[1]);
}

/* One strict integer in [lo, hi] at s, ending at *end_p (NUL or the list's ','). */
static int strict_long(const char *s, long lo, long hi, char stop, long *v_p, const char **end_p) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!starts_number(s) || (*end && *end != stop) || errno == ERANGE || v < lo || v > hi)
        return 0;
    *v_p = v;
    *end_p = end;
    return 1;
}

tpd_status tpd_cli_int(const char *cmd, const char *opt, const char *s, long lo, long hi,
                       int *v_p) {
    long v;
    const char *end;
    if (!strict_long(s, lo, hi, 0, &v, &end)) {
        tpd_log_error("%s: %s '%s' must be an integer from %ld to %ld", cmd, opt, s, lo, hi);
        return TPD_ERR_INVALID;
    }
    *v_p = (int)v;
    return TPD_OK;
}

tpd_status tpd_cli_int_list(const char *cmd, const char *opt, const char *s, long lo, long hi,
                            int min_n, int max_n, int *v, int *n_p) {
    int n = 0;
    for (const char *p = s;; p++) {
        long x;
        if (n == max_n || !strict_long(p, lo, hi, ',', &x, &p)) break;
        v[n++] = (int)x;
        if (!*p) {
            if (n < min_n) break;
            *n_p = n;
            return TPD_OK;
        }
    }
    char count[32];
    snprintf(count, sizeof count, min_n == max_n ? "%d" : "%d to %d", min_n, max_n);
    tpd_log_error("%s: %s '%s' must be a comma-separated list of %s integers, each from %ld to %ld",
                  cmd, opt, s, count, lo, hi);
    return TPD_ERR_INVALID;
}

tpd_status tpd_cli_double(const char *cmd, const char *opt, const char *s, double lo, double hi,
                          double *v_p) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!starts_number(s) || *end || errno == ERANGE || !isfinite(v) || v < lo || v > hi) {
        tpd_log_error("%s: %s '%s' must be a finite number from %g to %g", cmd, opt, s, lo, hi);
        return TPD_ERR_INVALID;
    }
    *v_p = v;
    return TPD_OK;
}

tpd_status tpd_cli_u64(const char *cmd, const char *opt, const char *s, uint64_t *v_p) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!(s[0] >= '0' && s[0] <= '9') || *end || errno == ERANGE) {
        tpd_log_error("%s: %s '%s' must be an integer from 0 to %llu", cmd, opt, s,
                      (unsigned long long)UINT64_MAX);
        return TPD_ERR_INVALID;
    }
    *v_p = (uint64_t)v;
    return TPD_OK;
}
