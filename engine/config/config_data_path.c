/* data.data_path's grammar: one prefix, or Megatron's weighted blend "W1 PREFIX1 W2 ...".
 * Parsed here so that the config checks can name the file, line and column of a bad
 * spec; engine/data opens what it names. */
#include "engine/config/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tpd_config_data_path_free(tpd_data_path *p) {
    for (int d = 0; d < p->n; d++)
        free(p->prefix[d]);
    memset(p, 0, sizeof *p);
}

static int is_number(const char *s, double *v) {
    char *end = NULL;
    *v = strtod(s, &end);
    return end != s && *end == '\0';
}

int tpd_config_data_path_parse(const char *spec, tpd_data_path *out_p, char *why, size_t len) {
    tpd_data_path src;
    memset(&src, 0, sizeof src);
    /* words of the spec */
    char *copy = strdup(spec ? spec : ""), *save = NULL;
    char *words[2 * TPD_DATA_PATH_MAX + 1];
    int nw = 0, ok = 0;
    if (!copy) {
        snprintf(why, len, "out of memory");
        return 0;
    }
    for (char *w = strtok_r(copy, " \t\n", &save); w && nw <= 2 * TPD_DATA_PATH_MAX;
         w = strtok_r(NULL, " \t\n", &save))
        words[nw++] = w;
    double first;
    if (nw < 2 || !is_number(words[0], &first)) {
        /* one prefix, spaces and all */
        if (nw == 0) {
            snprintf(why, len,
                     "nothing given (a data set prefix, or 'WEIGHT PREFIX WEIGHT "
                     "PREFIX ...')");
            goto done;
        }
        src.n = 1;
        src.weight[0] = 1.0;
        src.prefix[0] = strdup(spec);
    } else {
        if (nw % 2 || nw > 2 * TPD_DATA_PATH_MAX) {
            snprintf(why, len, "'%s' must be pairs of WEIGHT PREFIX (at most %d pairs)", spec,
                     TPD_DATA_PATH_MAX);
            goto done;
        }
        double sum = 0;
        for (int i = 0; i < nw; i += 2) {
            double w;
            if (!is_number(words[i], &w) || !(w > 0) || !isfinite(w)) {
                snprintf(why, len,
                         "weight '%s' of '%s' must be a positive number (pairs of "
                         "WEIGHT PREFIX)",
                         words[i], words[i + 1]);
                goto done;
            }
            src.weight[src.n] = w;
            src.prefix[src.n] = strdup(words[i + 1]);
            sum += w;
            src.n++;
        }
        for (int d = 0; d < src.n; d++)
            src.weight[d] /= sum;
    }
    ok = 1;
    for (int d = 0; d < src.n; d++)
        ok = ok && src.prefix[d];
    if (!ok) snprintf(why, len, "out of memory");
done:
    free(copy);
    if (ok && out_p)
        *out_p = src;
    else
        tpd_config_data_path_free(&src);
    return ok;
}
