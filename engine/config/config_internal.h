/* Private to engine/config/: the key table of the run
 * configuration and the per-type helpers that read, check and print a value.
 *
 * Every key is one row of tpd_cfg_keys; the loader, the checks and the printer know
 * nothing per key except the relations between keys (config.c). */
#ifndef TPD_ENGINE_CONFIG_INTERNAL_H
#define TPD_ENGINE_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/config/config.h"

typedef enum tpd_cfg_type {
    TPD_CFG_INT,     /* int */
    TPD_CFG_INT64,   /* int64_t */
    TPD_CFG_UINT64,  /* uint64_t */
    TPD_CFG_DOUBLE,  /* double */
    TPD_CFG_BOOL,    /* int, 0 or 1 */
    TPD_CFG_STRING,  /* char[size] */
    TPD_CFG_ENUM,    /* an enum (int-sized): the index of the value in `choices` */
    TPD_CFG_INTLIST, /* parallel.pipeline_layers: num_pipeline_layers + the int array */
    TPD_CFG_SPLIT,   /* char[size] holding "a,b,c" */
} tpd_cfg_type;

/* Which bounds apply to a number (or to each entry of a list). */
typedef enum tpd_cfg_range {
    TPD_CFG_ANY,
    TPD_CFG_GE,     /* x >= lo */
    TPD_CFG_GT,     /* x > lo */
    TPD_CFG_CLOSED, /* lo <= x <= hi */
    TPD_CFG_HALF,   /* lo <= x < hi */
} tpd_cfg_range;

typedef struct tpd_cfg_section {
    const char *name;
    const char *desc;
} tpd_cfg_section;

typedef struct tpd_cfg_key {
    const char *name; /* "section.key" */
    tpd_cfg_type type;
    size_t offset; /* into tpd_config */
    size_t size;   /* bytes of the field (string buffers include the NUL) */
    /* Default, written as in the file. It goes through the same value parser as the file
     * and the overrides, so a default can never hold a value the file could not. */
    const char *def;
    tpd_cfg_range range;
    double lo, hi;
    const char *const *choices; /* enum: the names, NULL-terminated, in the enum's order */
    int required;               /* a config file must state it */
    const char *desc;           /* one line, printed as a comment by `config show` */
} tpd_cfg_key;

/* In the order `tripod config show` prints them; keys are grouped by section. */
extern const tpd_cfg_section tpd_cfg_sections[];
extern const int tpd_cfg_nsections;
extern const tpd_cfg_key tpd_cfg_keys[];
extern const int tpd_cfg_nkeys;

/* Upper bounds of the counts, for per-key and per-section arrays; config_schema.c asserts
 * them. */
#define TPD_CFG_MAX_KEYS 128
#define TPD_CFG_MAX_SECTIONS 16

/* Lookup: index of a row or a section, -1 when unknown. */
int tpd_cfg_find_key(const char *name);
int tpd_cfg_find_section(const char *name);
/* "num_layers" of "model.num_layers". */
const char *tpd_cfg_bare(const char *name);
/* A known name near `name` (a typo, or the bare key in another section), or NULL. */
const char *tpd_cfg_suggest_key(const char *name);
/* For an unknown top-level name: a key with that bare name, else a near section. */
const char *tpd_cfg_suggest_section(const char *name);

/* What a row accepts, for messages: "an integer >= 1", "one of cosine, linear, constant". */
void tpd_cfg_rule(const tpd_cfg_key *k, char *buf, size_t n);
int tpd_cfg_in_range(const tpd_cfg_key *k, double x);

/* Scalar parsers. 0: ok; 1: not of the type; 2 (integers): does not fit in 64 bits. */
int tpd_cfg_is_null(const char *s, int plain);
int tpd_cfg_parse_int64(const char *s, int64_t *v_p);
int tpd_cfg_parse_uint64(const char *s, uint64_t *v_p);
int tpd_cfg_parse_double(const char *s, double *v_p);
int tpd_cfg_parse_split(const char *s, char *out, size_t n);
/* Index of s among an enum key's choices; -1 when it is none of them. */
int tpd_cfg_enum_index(const char *const *choices, const char *s);

/* The one rule that makes the two names of ZeRO-1 agree (config_dp.c): use_distributed_optimizer
 * under no_shard makes the strategy optim; a strategy that shards sets
 * use_distributed_optimizer. tpd_config_resolve and tpd_config_relayout apply it. */
void tpd_cfg_sharding_rule(tpd_config_parallel *p);

/* Shortest decimal form that reads back as the same double. */
void tpd_cfg_fmt_double(double x, char *buf, size_t n);

#endif
