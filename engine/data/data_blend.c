/* Blended data sets: Megatron's weighted --data-path, sample by sample. */
#include "engine/data/data.h"

#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TPD_BLEND_BLOCK 4096 /* samples between snapshots of the assignment counts */

void tpd_data_source_close(tpd_data_source *src) {
    for (int d = 0; d < src->n; d++) {
        tpd_dataset_close(src->ds[d]);
        free(src->prefix[d]);
    }
    memset(src, 0, sizeof *src);
}

/* One prefix with * ? or [ (llm.c's shards, "data/fineweb_train_*.bin"): every match, in
 * name order, weighted by its tokens, as if the shards were one data set. */
static tpd_status expand_glob(tpd_data_source *src) {
    const char *pattern = src->prefix[0];
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc != 0 || g.gl_pathc == 0) {
        tpd_log_error("data.data_path: '%s' matches no file", pattern);
        if (rc == 0) globfree(&g);
        return TPD_ERR_IO;
    }
    if (g.gl_pathc > TPD_BLEND_MAX) {
        tpd_log_error("data.data_path: '%s' matches %zu files, more than %d", pattern,
                      (size_t)g.gl_pathc, TPD_BLEND_MAX);
        globfree(&g);
        return TPD_ERR_INVALID;
    }
    tpd_data_source out;
    memset(&out, 0, sizeof out);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        out.prefix[out.n] = strdup(g.gl_pathv[i]);
        out.weight[out.n++] = 0; /* set from the token counts once opened */
    }
    globfree(&g);
    tpd_data_source_close(src);
    *src = out;
    for (int d = 0; d < src->n; d++)
        if (!src->prefix[d]) return tpd_fail_nomem("a data path", strlen(g.gl_pathv[d]) + 1);
    return TPD_OK;
}

tpd_status tpd_data_source_open(const char *spec, int vocab_size, tpd_data_source *src_p) {
    tpd_data_source src;
    tpd_data_path parsed;
    char why[512];
    if (!tpd_config_data_path_parse(spec, &parsed, why, sizeof why)) {
        tpd_log_error("data.data_path: %s", why);
        return TPD_ERR_INVALID;
    }
    memset(&src, 0, sizeof src);
    src.n = parsed.n;
    for (int d = 0; d < parsed.n; d++) {
        src.weight[d] = parsed.weight[d];
        src.prefix[d] = parsed.prefix[d]; /* ownership moves to src */
    }
    tpd_status st = TPD_OK;
    int globbed = src.n == 1 && strpbrk(src.prefix[0], "*?[") != NULL;
    if (globbed) TPD_CHECK_GOTO(expand_glob(&src), st, fail);
    double total = 0;
    for (int d = 0; d < src.n; d++) {
        TPD_CHECK_GOTO(tpd_dataset_open(src.prefix[d], vocab_size, &src.ds[d]), st, fail);
        total += (double)tpd_dataset_num_tokens(src.ds[d]);
    }
    for (int d = 0; globbed && d < src.n; d++)
        src.weight[d] = total > 0 ? (double)tpd_dataset_num_tokens(src.ds[d]) / total : 1.0 / src.n;
    *src_p = src;
    return TPD_OK;
fail:
    tpd_data_source_close(&src);
    return st;
}

tpd_status tpd_blend_sampler_init(const tpd_data_source *src, const char *split, tpd_split which,
                                  int seq_length, int shuffle, uint64_t seed,
                                  tpd_blend_sampler *b_p) {
    tpd_blend_sampler b;
    memset(&b, 0, sizeof b);
    b.src = src;
    tpd_status st = TPD_OK;
    int d = 0;
    for (; d < src->n; d++) {
        /* data set 0 keeps the run's seed: one prefix samples as it always did */
        uint64_t sd = seed + (uint64_t)d * 0x9E3779B97F4A7C15ull;
        /* in a blend the sampler's message is said once, with the entry it is about */
        if (src->n > 1) tpd_log_quiet_begin();
        st = tpd_sampler_init(src->ds[d], split, which, seq_length, shuffle, sd, &b.s[d]);
        if (src->n > 1) tpd_log_quiet_end();
        if (st != TPD_OK) {
            if (src->n > 1)
                tpd_log_error("data set %s (blend entry %d of %d): %s", src->prefix[d], d + 1,
                              src->n, tpd_last_error());
            goto undo;
        }
    }
    *b_p = b;
    return TPD_OK;
undo:
    while (d-- > 0)
        tpd_sampler_free(&b.s[d]);
    return st;
}

void tpd_blend_sampler_free(tpd_blend_sampler *b) {
    for (int d = 0; b->src && d < b->src->n; d++)
        tpd_sampler_free(&b->s[d]);
    free(b->snaps);
    memset(b, 0, sizeof *b);
}

/* Megatron's choice for sample i given the counts of [0, i). */
static int pick(const tpd_data_source *src, uint64_t i, const uint64_t *count) {
    double x = i > 1 ? (double)i : 1.0, best_err = 0;
    int best = 0;
    for (int d = 0; d < src->n; d++) {
        double err = src->weight[d] * x - (double)count[d];
        if (d == 0 || err > best_err) {
            best = d;
            best_err = err;
        }
    }
    return best;
}

/* Moves the cursor to sample g: from a snapshot when g is behind it or far ahead. */
static void seek(tpd_blend_sampler *b, uint64_t g) {
    const tpd_data_source *src = b->src;
    int n = src->n;
    if (g < b->at || g - b->at > TPD_BLEND_BLOCK) {
        uint64_t want = g / TPD_BLEND_BLOCK + 1; /* snapshots 0..g/BLOCK */
        if (b->nsnaps < want) {
            if (b->snaps_cap < want) {
                uint64_t cap = b->snaps_cap ? b->snaps_cap : 64;
                while (cap < want)
                    cap *= 2;
                uint64_t *s = realloc(b->snaps, cap * (size_t)n * sizeof *s);
                if (!s) goto step; /* no room: walk from where the cursor is */
                b->snaps = s;
                b->snaps_cap = cap;
            }
            if (b->nsnaps == 0) {
                memset(b->snaps, 0, (size_t)n * sizeof *b->snaps);
                b->nsnaps = 1;
            }
            for (; b->nsnaps < want; b->nsnaps++) {
                uint64_t *cnt = b->snaps + b->nsnaps * n;
                memcpy(cnt, cnt - n, (size_t)n * sizeof *cnt);
                uint64_t i0 = (b->nsnaps - 1) * TPD_BLEND_BLOCK;
                for (uint64_t i = i0; i < i0 + TPD_BLEND_BLOCK; i++)
                    cnt[pick(src, i, cnt)]++;
            }
        }
        uint64_t k = g / TPD_BLEND_BLOCK;
        b->at = k * TPD_BLEND_BLOCK;
        memcpy(b->count, b->snaps + k * n, (size_t)n * sizeof *b->count);
    }
step:
    if (g < b->at) { /* only after a failed allocation: start over */
        b->at = 0;
        memset(b->count, 0, sizeof b->count);
    }
    for (; b->at < g; b->at++)
        b->count[pick(src, b->at, b->count)]++;
}

void tpd_blend_sampler_locate(tpd_blend_sampler *b, uint64_t g, int *dataset_p, uint64_t *index_p) {
    int d = 0;
    uint64_t idx = g;
    if (b->src->n > 1) {
        seek(b, g);
        d = pick(b->src, g, b->count);
        idx = b->count[d];
    }
    if (dataset_p) *dataset_p = d;
    if (index_p) *index_p = idx;
}

tpd_status tpd_blend_sampler_get(tpd_blend_sampler *b, uint64_t g, int32_t *out) {
    int d;
    uint64_t idx;
    tpd_blend_sampler_locate(b, g, &d, &idx);
    return tpd_sampler_get(&b->s[d], idx, out);
}
