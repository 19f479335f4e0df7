/* Run configuration: defaults, YAML loading (libyaml document API), overrides and the
 * relations between keys (config_world.c: the checks against a world size, and the
 * derived quantities). Every key is a row of the table in config_schema.c, which
 * also prints configs; this file holds no per-key knowledge except the relations between
 * keys.
 *
 * While a load runs, a loader records where each key's value came from (file line and
 * column, an override, or the default), so that a relation found broken after the whole
 * file and every override are in can still name the line of the offending key. */
#include "engine/config/config.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "base/file.h"
#include "engine/config/config_internal.h"
#include "engine/config/config_loader.h"

/* Longest scalar we quote back in a message; the rest is cut so the line stays a line. */
#define CFG_SHOW "%.80s"
/* A config file is a few KiB; one of megabytes is not a config (a list that long would
 * take seconds and gigabytes to parse before the key's rule refused it). */
#define CFG_MAX_FILE_BYTES (1u << 20)
/* Tokens of one micro-batch (micro_batch_size * seq_length): 2^26, far above real runs. */
#define CFG_MAX_TOKENS (1 << 26)

/* ---- messages ---- */

/* Logs "WHERE: KEY: message" once (tpd_fail). WHERE is file:line:col, <override>, or the
 * file alone for a value that nobody stated. */
tpd_status tpd_cfg_fail(const cfg_loader *ld, const cfg_loc *at, const char *key, const char *fmt,
                        ...) {
    char where[TPD_CONFIG_STR + 32], what[2048];
    if (at && at->origin == CFG_FILE)
        snprintf(where, sizeof where, "%s:%d:%d", ld->path, at->line, at->col);
    else if (at && at->origin == CFG_OVERRIDE)
        snprintf(where, sizeof where, "<override>");
    else
        snprintf(where, sizeof where, "%s", ld->path ? ld->path : "<defaults>");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return tpd_fail(TPD_ERR_INVALID, "%s: %s%s%s", where, key ? key : "", key ? ": " : "", what);
}

/* ---- lookup ---- */

/* Where the value of a key this file names itself came from. A miss is a bug in this
 * file (the tests load every relation's key); it points at the file as a whole. */
const cfg_loc *tpd_cfg_where(const cfg_loader *ld, const char *name) {
    static const cfg_loc nowhere = {CFG_DEFAULT, 0, 0};
    int row = tpd_cfg_find_key(name);
    assert(row >= 0);
    return row >= 0 ? &ld->set[row] : &nowhere;
}

static void *cfg_field(tpd_config *cfg, int row) {
    return (char *)cfg + tpd_cfg_keys[row].offset;
}

static tpd_status cfg_fail_unknown_key(const cfg_loader *ld, const cfg_loc *at, const char *name) {
    const char *s = tpd_cfg_suggest_key(name);
    if (s) return tpd_cfg_fail(ld, at, name, "unknown key (did you mean '%s'?)", s);
    return tpd_cfg_fail(ld, at, name, "unknown key ('tripod config show' lists the keys)");
}

static tpd_status cfg_fail_unknown_section(const cfg_loader *ld, const cfg_loc *at,
                                           const char *name) {
    const char *s = tpd_cfg_suggest_section(name);
    if (s) return tpd_cfg_fail(ld, at, name, "unknown section (did you mean '%s'?)", s);
    return tpd_cfg_fail(ld, at, name,
                        "unknown section (sections are model, parallel, training, optimizer, "
                        "data, logging, checkpoint, comm)");
}

/* ---- scalar parsing ---- */

/* One entry of an int list: an integer >= lo that fits an int. */
static tpd_status cfg_list_entry(const cfg_loader *ld, const tpd_cfg_key *k, const char *s,
                                 const cfg_loc *at, const char *rule, int *v_p) {
    int64_t v;
    int rc = tpd_cfg_parse_int64(s, &v);
    if (rc == 1)
        return tpd_cfg_fail(ld, at, k->name, "'" CFG_SHOW "' is not an integer (expected %s)", s,
                            rule);
    if (rc == 2 || v < INT_MIN || v > INT_MAX)
        return tpd_cfg_fail(ld, at, k->name, "'" CFG_SHOW "' does not fit in 32 bits (expected %s)",
                            s, rule);
    if (!tpd_cfg_in_range(k, (double)v))
        return tpd_cfg_fail(ld, at, k->name, CFG_SHOW " is out of range (expected %s)", s, rule);
    *v_p = (int)v;
    return TPD_OK;
}

/* The only list key is parallel.pipeline_layers, whose count is its own field. */
static void cfg_list_store(tpd_config *cfg, const int *v, int n) {
    cfg->parallel.num_pipeline_layers = n;
    memset(cfg->parallel.pipeline_layers, 0, sizeof cfg->parallel.pipeline_layers);
    memcpy(cfg->parallel.pipeline_layers, v, sizeof(int) * (size_t)n);
}

static void cfg_trim(char **s_p) {
    char *s = *s_p;
    while (*s == ' ' || *s == '\t')
        s++;
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
        s[--len] = '\0';
    *s_p = s;
}

/* A list written as text: "3,5", "[3, 5]", "[]" or a null. */
static tpd_status cfg_set_list_text(cfg_loader *ld, int row, const char *text, int plain,
                                    const cfg_loc *at) {
    const tpd_cfg_key *k = &tpd_cfg_keys[row];
    char rule[160];
    tpd_cfg_rule(k, rule, sizeof rule);
    int v[TPD_CONFIG_MAX_STAGES], n = 0;
    char *buf = strdup(text);
    if (!buf) return tpd_fail_nomem(k->name, strlen(text) + 1);
    tpd_status st = TPD_OK;
    char *s = buf;
    cfg_trim(&s);
    size_t len = strlen(s);
    if (len >= 2 && s[0] == '[' && s[len - 1] == ']') {
        s[len - 1] = '\0';
        s++;
        cfg_trim(&s);
    }
    if (!tpd_cfg_is_null(s, 1) || !plain) {
        for (char *item = s; item;) {
            char *comma = strchr(item, ',');
            if (comma) *comma = '\0';
            cfg_trim(&item);
            if (n == TPD_CONFIG_MAX_STAGES) {
                st = tpd_cfg_fail(ld, at, k->name, "has more than %d entries (expected %s)",
                                  TPD_CONFIG_MAX_STAGES, rule);
                goto free_buf;
            }
            TPD_CHECK_GOTO(cfg_list_entry(ld, k, item, at, rule, &v[n]), st, free_buf);
            n++;
            item = comma ? comma + 1 : NULL;
        }
    }
    cfg_list_store(ld->cfg, v, n);
    ld->set[row] = *at;
free_buf:
    free(buf);
    return st;
}

/* Parses `text` as the value of key `row` and stores it: the one value parser of the file,
 * the overrides and the defaults. `plain` is 0 for a quoted scalar, which is never null. */
static tpd_status cfg_set_scalar(cfg_loader *ld, int row, const char *text, int plain,
                                 const cfg_loc *at) {
    const tpd_cfg_key *k = &tpd_cfg_keys[row];
    void *field = cfg_field(ld->cfg, row);
    char rule[160];
    tpd_cfg_rule(k, rule, sizeof rule);
    if (k->type == TPD_CFG_INTLIST) return cfg_set_list_text(ld, row, text, plain, at);
    if (k->type != TPD_CFG_STRING && tpd_cfg_is_null(text, plain))
        return tpd_cfg_fail(ld, at, k->name, "has no value (expected %s)", rule);

    switch (k->type) {
    case TPD_CFG_INT:
    case TPD_CFG_INT64: {
        int64_t v;
        int rc = tpd_cfg_parse_int64(text, &v);
        int bits = k->type == TPD_CFG_INT ? 32 : 64;
        if (rc == 1)
            return tpd_cfg_fail(ld, at, k->name, "'" CFG_SHOW "' is not an integer (expected %s)",
                                text, rule);
        if (rc == 2 || (k->type == TPD_CFG_INT && (v < INT_MIN || v > INT_MAX)))
            return tpd_cfg_fail(ld, at, k->name,
                                "'" CFG_SHOW "' does not fit in %d bits (expected %s)", text, bits,
                                rule);
        if (!tpd_cfg_in_range(k, (double)v))
            return tpd_cfg_fail(ld, at, k->name, CFG_SHOW " is out of range (expected %s)", text,
                                rule);
        if (k->type == TPD_CFG_INT)
            *(int *)field = (int)v;
        else
            *(int64_t *)field = v;
        break;
    }
    case TPD_CFG_UINT64: {
        uint64_t v;
        int rc = tpd_cfg_parse_uint64(text, &v);
        if (rc == 1)
            return tpd_cfg_fail(ld, at, k->name,
                                "'" CFG_SHOW "' is not a non-negative integer (expected %s)", text,
                                rule);
        if (rc == 2)
            return tpd_cfg_fail(ld, at, k->name,
                                "'" CFG_SHOW "' does not fit in 64 bits (expected %s)", text, rule);
        *(uint64_t *)field = v;
        break;
    }
    case TPD_CFG_DOUBLE: {
        double v;
        if (tpd_cfg_parse_double(text, &v))
            return tpd_cfg_fail(ld, at, k->name, "'" CFG_SHOW "' is not a number (expected %s)",
                                text, rule);
        if (!tpd_cfg_in_range(k, v))
            return tpd_cfg_fail(ld, at, k->name, CFG_SHOW " is out of range (expected %s)", text,
                                rule);
        *(double *)field = v;
        break;
    }
    case TPD_CFG_BOOL: {
        /* YAML 1.2 core booleans only: "yes"/"on" are YAML 1.1 traps. */
        int v;
        if (!strcmp(text, "true") || !strcmp(text, "True") || !strcmp(text, "TRUE"))
            v = 1;
        else if (!strcmp(text, "false") || !strcmp(text, "False") || !strcmp(text, "FALSE"))
            v = 0;
        else
            return tpd_cfg_fail(ld, at, k->name, "'" CFG_SHOW "' is not a boolean (expected %s)",
                                text, rule);
        *(int *)field = v;
        break;
    }
    case TPD_CFG_STRING: {
        const char *s = tpd_cfg_is_null(text, plain) ? "" : text;
        size_t len = strlen(s);
        if (len >= k->size)
            return tpd_cfg_fail(ld, at, k->name,
                                "is %zu characters long (expected a string of at most %zu)", len,
                                k->size - 1);
        memcpy(field, s, len + 1);
        break;
    }
    case TPD_CFG_ENUM: {
        int v = tpd_cfg_enum_index(k->choices, text);
        if (v < 0)
            return tpd_cfg_fail(ld, at, k->name, "'" CFG_SHOW "' is not allowed (expected %s)",
                                text, rule);
        *(int *)field = v;
        break;
    }
    case TPD_CFG_SPLIT:
        if (tpd_cfg_parse_split(text, field, k->size))
            return tpd_cfg_fail(ld, at, k->name,
                                "'" CFG_SHOW "' is not a valid split (expected %s)", text, rule);
        break;
    case TPD_CFG_INTLIST:
        break; /* handled above */
    }
    ld->set[row] = *at;
    return TPD_OK;
}

/* ---- the file ---- */

static cfg_loc cfg_mark(const yaml_node_t *node) {
    cfg_loc at = {CFG_FILE, (int)node->start_mark.line + 1, (int)node->start_mark.column + 1};
    return at;
}

static const char *cfg_kind(const yaml_node_t *node) {
    return node->type == YAML_SEQUENCE_NODE ? "a sequence" : "a mapping";
}

static int cfg_node_is_null(const yaml_node_t *node) {
    return node->type == YAML_SCALAR_NODE &&
           tpd_cfg_is_null((const char *)node->data.scalar.value,
                           node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE);
}

static tpd_status cfg_apply_node(cfg_loader *ld, int row, yaml_document_t *doc, yaml_node_t *node) {
    const tpd_cfg_key *k = &tpd_cfg_keys[row];
    cfg_loc at = cfg_mark(node);
    char rule[160];
    tpd_cfg_rule(k, rule, sizeof rule);
    if (node->type == YAML_SCALAR_NODE)
        return cfg_set_scalar(ld, row, (const char *)node->data.scalar.value,
                              node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE, &at);
    if (node->type != YAML_SEQUENCE_NODE || k->type != TPD_CFG_INTLIST)
        return tpd_cfg_fail(ld, &at, k->name, "got %s (expected %s)", cfg_kind(node), rule);

    int v[TPD_CONFIG_MAX_STAGES], n = 0;
    for (yaml_node_item_t *it = node->data.sequence.items.start; it < node->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(doc, *it);
        cfg_loc item_at = cfg_mark(item);
        if (item->type != YAML_SCALAR_NODE)
            return tpd_cfg_fail(ld, &item_at, k->name, "got %s as an entry (expected %s)",
                                cfg_kind(item), rule);
        if (n == TPD_CONFIG_MAX_STAGES)
            return tpd_cfg_fail(ld, &item_at, k->name, "has more than %d entries (expected %s)",
                                TPD_CONFIG_MAX_STAGES, rule);
        TPD_CHECK(
            cfg_list_entry(ld, k, (const char *)item->data.scalar.value, &item_at, rule, &v[n]));
        n++;
    }
    cfg_list_store(ld->cfg, v, n);
    ld->set[row] = at;
    return TPD_OK;
}

static tpd_status cfg_apply_section(cfg_loader *ld, int sec, yaml_document_t *doc,
                                    yaml_node_t *map) {
    const char *sname = tpd_cfg_sections[sec].name;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *knode = yaml_document_get_node(doc, p->key);
        yaml_node_t *vnode = yaml_document_get_node(doc, p->value);
        cfg_loc kat = cfg_mark(knode);
        if (knode->type != YAML_SCALAR_NODE)
            return tpd_cfg_fail(ld, &kat, sname, "got %s as a key (keys are plain names)",
                                cfg_kind(knode));
        char full[160];
        snprintf(full, sizeof full, "%s.%s", sname, (const char *)knode->data.scalar.value);
        int row = tpd_cfg_find_key(full);
        if (row < 0) return cfg_fail_unknown_key(ld, &kat, full);
        if (ld->set[row].origin == CFG_FILE)
            return tpd_cfg_fail(ld, &kat, full, "duplicate key (first set on line %d)",
                                ld->set[row].line);
        TPD_CHECK(cfg_apply_node(ld, row, doc, vnode));
    }
    return TPD_OK;
}

static tpd_status cfg_apply_root(cfg_loader *ld, yaml_document_t *doc, yaml_node_t *root) {
    if (cfg_node_is_null(root)) return TPD_OK; /* an empty file */
    if (root->type != YAML_MAPPING_NODE) {
        cfg_loc at = cfg_mark(root);
        return tpd_cfg_fail(ld, &at, NULL,
                            "the top level must be a mapping of sections (model, parallel, ...)");
    }
    int first_line[TPD_CFG_MAX_SECTIONS] = {0};
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *knode = yaml_document_get_node(doc, p->key);
        yaml_node_t *vnode = yaml_document_get_node(doc, p->value);
        cfg_loc kat = cfg_mark(knode);
        if (knode->type != YAML_SCALAR_NODE)
            return tpd_cfg_fail(ld, &kat, NULL, "got %s as a section name (names are plain)",
                                cfg_kind(knode));
        const char *name = (const char *)knode->data.scalar.value;
        int sec = tpd_cfg_find_section(name);
        if (sec < 0) return cfg_fail_unknown_section(ld, &kat, name);
        if (first_line[sec])
            return tpd_cfg_fail(ld, &kat, name, "duplicate section (first on line %d)",
                                first_line[sec]);
        first_line[sec] = kat.line;
        if (cfg_node_is_null(vnode)) continue; /* "comm:" with nothing under it */
        if (vnode->type != YAML_MAPPING_NODE) {
            cfg_loc vat = cfg_mark(vnode);
            return tpd_cfg_fail(ld, &vat, name, "got %s (a section is a mapping of keys)",
                                vnode->type == YAML_SCALAR_NODE ? "a scalar" : "a sequence");
        }
        TPD_CHECK(cfg_apply_section(ld, sec, doc, vnode));
    }
    return TPD_OK;
}

static tpd_status cfg_fail_syntax(const cfg_loader *ld, const yaml_parser_t *parser) {
    if (parser->error == YAML_MEMORY_ERROR)
        return tpd_fail(TPD_ERR_NOMEM, "%s: out of memory while reading YAML", ld->path);
    const char *problem = parser->problem ? parser->problem : "unreadable YAML";
    if (parser->error == YAML_READER_ERROR)
        return tpd_fail(TPD_ERR_INVALID, "%s: YAML read error: %s at byte %zu", ld->path, problem,
                        parser->problem_offset);
    cfg_loc at = {CFG_FILE, (int)parser->problem_mark.line + 1,
                  (int)parser->problem_mark.column + 1};
    if (parser->context)
        return tpd_cfg_fail(ld, &at, NULL, "YAML syntax error: %s (%s at %d:%d)", problem,
                            parser->context, (int)parser->context_mark.line + 1,
                            (int)parser->context_mark.column + 1);
    return tpd_cfg_fail(ld, &at, NULL, "YAML syntax error: %s", problem);
}

static tpd_status cfg_load_file(cfg_loader *ld) {
    tpd_status st = TPD_OK;
    char why[160];
    tpd_status ok = tpd_file_check_text(ld->path, CFG_MAX_FILE_BYTES, why, sizeof why);
    if (ok != TPD_OK) return tpd_fail(ok, "%s: %s", ld->path, why);
    int err;
    FILE *f = tpd_file_fopen_read(ld->path, &err);
    if (!f) return tpd_fail(TPD_ERR_IO, "%s: cannot read: %s", ld->path, tpd_file_strerror(err));
    TPD_CHECK_GOTO(tpd_config_yaml_depth_check(ld->path, f), st, close_file);
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, close_file, "%s: out of memory while reading YAML",
                      ld->path);
    yaml_parser_set_input_file(&parser, f);
    yaml_document_t doc;
    /* On failure libyaml has already deleted the document. */
    if (!yaml_parser_load(&parser, &doc)) {
        st = cfg_fail_syntax(ld, &parser);
        goto delete_parser;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) TPD_CHECK_GOTO(cfg_apply_root(ld, &doc, root), st, delete_doc);

    /* A second document would be silently ignored; say so instead. */
    yaml_document_t next;
    if (!yaml_parser_load(&parser, &next)) {
        st = cfg_fail_syntax(ld, &parser);
        goto delete_doc;
    }
    yaml_node_t *next_root = yaml_document_get_root_node(&next);
    if (next_root) {
        cfg_loc at = cfg_mark(next_root);
        st = tpd_cfg_fail(ld, &at, NULL, "a second YAML document (a config is one document)");
    }
    yaml_document_delete(&next);
delete_doc:
    yaml_document_delete(&doc);
delete_parser:
    yaml_parser_delete(&parser);
close_file:
    fclose(f);
    return st;
}

/* ---- overrides ---- */

static tpd_status cfg_apply_override(cfg_loader *ld, const char *ov) {
    const cfg_loc at = {CFG_OVERRIDE, 0, 0};
    const char *eq = strchr(ov, '=');
    if (!eq || eq == ov)
        return tpd_cfg_fail(ld, &at, NULL, "'" CFG_SHOW "' is not of the form section.key=value",
                            ov);
    char *buf = strdup(ov);
    if (!buf) return tpd_fail_nomem("an override", strlen(ov) + 1);
    tpd_status st = TPD_OK;
    char *key = buf, *value = buf + (eq - ov) + 1;
    value[-1] = '\0';
    cfg_trim(&key);
    cfg_trim(&value);
    int row = tpd_cfg_find_key(key);
    if (row < 0) {
        st = cfg_fail_unknown_key(ld, &at, key);
        goto free_buf;
    }
    /* The shell usually eats quotes; when they survive, they mean "a string". */
    int plain = 1;
    size_t len = strlen(value);
    if (len >= 2 && (value[0] == '"' || value[0] == '\'') && value[len - 1] == value[0]) {
        value[len - 1] = '\0';
        value++;
        plain = 0;
    }
    st = cfg_set_scalar(ld, row, value, plain, &at);
free_buf:
    free(buf);
    return st;
}

/* ---- relations ---- */

/* Where to point for a relation between two keys: the first one if someone stated it,
 * else the second, else the file as a whole. */
const cfg_loc *tpd_cfg_at(const cfg_loader *ld, const char *a, const char *b) {
    const cfg_loc *la = tpd_cfg_where(ld, a);
    if (la->origin != CFG_DEFAULT || !b) return la;
    return tpd_cfg_where(ld, b);
}

/* The mixture-of-experts keys: what the block needs to be built at all. */
static tpd_status check_moe(cfg_loader *ld, int tp) {
    const tpd_config_model *m = &ld->cfg->model;
    const tpd_config_parallel *p = &ld->cfg->parallel;
    const int E = m->num_moe_experts;
    const char *k = "model.num_moe_experts";
    if (E == 0) {
        k = "parallel.expert_model_parallel_size";
        if (p->expert_model_parallel_size > 1)
            return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.num_moe_experts"), k,
                                "%d splits experts, and the model has none (num_moe_experts 0)",
                                p->expert_model_parallel_size);
        return TPD_OK;
    }
    if (E < 2)
        return tpd_cfg_fail(ld, tpd_cfg_where(ld, k), k,
                            "%d: a mixture needs at least 2 experts (0 for a dense model)", E);
    k = "model.moe_router_topk";
    if (m->moe_router_topk > E)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.num_moe_experts"), k,
                            "%d is more than the %d experts", m->moe_router_topk, E);
    k = "model.moe_ffn_hidden_size";
    int fe = tpd_config_moe_ffn(ld->cfg);
    if (fe % tp)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.tensor_model_parallel_size"), k,
                            "the expert width (%d) must be a multiple of "
                            "tensor_model_parallel_size (%d): each expert's MLP is split like "
                            "the dense one",
                            fe, tp);
    k = "model.moe_shared_expert_intermediate_size";
    if (m->moe_shared_expert_intermediate_size % tp)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.tensor_model_parallel_size"), k,
                            "%d must be a multiple of tensor_model_parallel_size (%d)",
                            m->moe_shared_expert_intermediate_size, tp);
    k = "model.moe_shared_expert_gate";
    if (m->moe_shared_expert_gate && m->moe_shared_expert_intermediate_size == 0)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.moe_shared_expert_intermediate_size"), k,
                            "true needs shared experts (moe_shared_expert_intermediate_size > "
                            "0)");
    k = "model.moe_norm_topk_prob";
    if (m->moe_norm_topk_prob && !m->moe_router_pre_softmax)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.moe_router_pre_softmax"), k,
                            "true renormalizes the top-k of a softmax over all experts "
                            "(moe_router_pre_softmax true); without it the k weights are a "
                            "softmax of their own and already sum to 1");
    k = "parallel.expert_tensor_parallel_size";
    if (p->expert_tensor_parallel_size != 0 && p->expert_tensor_parallel_size != tp)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.tensor_model_parallel_size"), k,
                            "%d: the experts are split over the TP group like the dense MLP "
                            "(expert TP = tensor_model_parallel_size %d, or 0); another expert "
                            "TP is not built",
                            p->expert_tensor_parallel_size, tp);
    k = "parallel.expert_model_parallel_size";
    if (E % p->expert_model_parallel_size)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.num_moe_experts"), k,
                            "%d must divide num_moe_experts (%d): each EP rank holds E / EP "
                            "experts",
                            p->expert_model_parallel_size, E);
    return TPD_OK;
}

static tpd_status cfg_check_relations(cfg_loader *ld) {
    const tpd_config *c = ld->cfg;
    const tpd_config_model *m = &c->model;
    const tpd_config_parallel *p = &c->parallel;
    const int tp = p->tensor_model_parallel_size, pp = p->pipeline_model_parallel_size;
    const int vpp = p->virtual_pipeline_model_parallel_size;
    const char *k;

    k = "model.hidden_size";
    if (m->kv_channels == 0 && m->hidden_size % m->num_attention_heads)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.num_attention_heads"), k,
                            "hidden_size (%d) must be a multiple of num_attention_heads (%d) "
                            "(or set model.kv_channels, the head size)",
                            m->hidden_size, m->num_attention_heads);
    k = "model.num_attention_heads";
    if (m->num_attention_heads % tp)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.tensor_model_parallel_size"), k,
                            "num_attention_heads (%d) must be a multiple of "
                            "tensor_model_parallel_size (%d)",
                            m->num_attention_heads, tp);
    TPD_CHECK(tpd_cfg_check_llama(ld));
    k = "model.ffn_hidden_size";
    if (m->ffn_hidden_size % tp)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.tensor_model_parallel_size"), k,
                            "ffn_hidden_size (%d) must be a multiple of "
                            "tensor_model_parallel_size (%d)",
                            m->ffn_hidden_size, tp);
    TPD_CHECK(check_moe(ld, tp));
    const int64_t nvs = (int64_t)pp * vpp; /* virtual stages: model chunks over the pipeline */
    if (nvs > TPD_CONFIG_MAX_STAGES) {
        k = "parallel.virtual_pipeline_model_parallel_size";
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.pipeline_model_parallel_size"), k,
                            "pipeline_model_parallel_size * virtual_pipeline_model_parallel_size "
                            "(%d * %d) must be at most %d",
                            pp, vpp, TPD_CONFIG_MAX_STAGES);
    }
    if (p->num_pipeline_layers > 0) {
        k = "parallel.pipeline_layers";
        if (p->num_pipeline_layers != nvs && vpp > 1)
            return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, NULL), k,
                                "has %d entries but pipeline_model_parallel_size * "
                                "virtual_pipeline_model_parallel_size is %d * %d = %lld (one entry "
                                "per virtual stage, in Megatron's order: chunk 0 of every stage, "
                                "then chunk 1, ...)",
                                p->num_pipeline_layers, pp, vpp, (long long)nvs);
        if (vpp == 1 && p->num_pipeline_layers != pp)
            return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, NULL), k,
                                "has %d entries but pipeline_model_parallel_size is %d (one entry "
                                "per stage)",
                                p->num_pipeline_layers, pp);
        long sum = 0;
        for (int i = 0; i < p->num_pipeline_layers; i++)
            sum += p->pipeline_layers[i];
        if (sum != m->num_layers)
            return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, NULL), k,
                                "entries sum to %ld but num_layers is %d (they must sum to "
                                "num_layers)",
                                sum, m->num_layers);
    } else if (vpp > 1 && m->num_layers % nvs) {
        k = "model.num_layers";
        return tpd_cfg_fail(
            ld, tpd_cfg_at(ld, k, "parallel.virtual_pipeline_model_parallel_size"), k,
            "num_layers (%d) is not divisible by pipeline_model_parallel_size * "
            "virtual_pipeline_model_parallel_size (%d * %d = %lld) (every model "
            "chunk needs the same number of layers, or set parallel.pipeline_layers "
            "per virtual stage)",
            m->num_layers, pp, vpp, (long long)nvs);
    } else if (m->num_layers % pp) {
        k = "model.num_layers";
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.pipeline_model_parallel_size"), k,
                            "num_layers (%d) is not divisible by pipeline_model_parallel_size (%d) "
                            "(Number of layers should be divisible by the pipeline-model-parallel "
                            "size, or set parallel.pipeline_layers)",
                            m->num_layers, pp);
    }
    k = "model.seq_length";
    if (m->seq_length > m->max_position_embeddings)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.max_position_embeddings"), k,
                            "seq_length (%d) must be <= max_position_embeddings (%d)%s",
                            m->seq_length, m->max_position_embeddings,
                            m->position_embedding_type == TPD_POS_ROPE
                                ? " (with rope it bounds the positions the model trains and "
                                  "generates at, as in Megatron)"
                                : "");
    k = "optimizer.lr_wsd_decay_iters";
    if (c->optimizer.lr_decay_style == TPD_LR_DECAY_WSD) {
        int decay = tpd_config_lr_decay_iters(c);
        int wsd = c->optimizer.lr_wsd_decay_iters;
        if (wsd < 1 || wsd > decay - c->optimizer.lr_warmup_iters)
            return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "optimizer.lr_decay_style"), k,
                                "WSD needs 1 <= lr_wsd_decay_iters (%d) <= the iterations after "
                                "warmup (%d)",
                                wsd, decay - c->optimizer.lr_warmup_iters);
    }
    k = "training.recompute_num_layers";
    if (c->training.recompute_num_layers > 0 && c->training.recompute != TPD_RECOMPUTE_FULL)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "training.recompute"), k,
                            "%d needs training.recompute full, not %s (it picks the layers whose "
                            "full recompute is done)",
                            c->training.recompute_num_layers,
                            tpd_config_choice("training.recompute", c->training.recompute));
    k = "data.data_path";
    char why[512];
    if (c->data.data_path[0] &&
        !tpd_config_data_path_parse(c->data.data_path, NULL, why, sizeof why))
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, NULL), k, "%s", why);
    const int cp = p->context_parallel_size;
    if (cp > 1 && m->seq_length % (2 * cp)) {
        k = "parallel.context_parallel_size";
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.seq_length"), k,
                            "%d needs seq_length (%d) to be a multiple of 2 x CP = %d (each "
                            "sequence is cut into 2 x CP equal chunks, rank r holding chunks r and "
                            "2 CP - 1 - r)",
                            cp, m->seq_length, 2 * cp);
    }
    if (cp > 1 && p->sequence_parallel && (m->seq_length / cp) % tp) {
        k = "parallel.sequence_parallel";
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.context_parallel_size"), k,
                            "the %d tokens a CP rank holds (seq_length %d / CP %d) must be a "
                            "multiple of tensor_model_parallel_size (%d)",
                            m->seq_length / cp, m->seq_length, cp, tp);
    }
    if (cp > 1 && p->cp_comm_type == TPD_CP_COMM_A2A &&
        (m->num_attention_heads % (tp * cp) || tpd_config_kv_heads(c) % (tp * cp))) {
        k = "parallel.cp_comm_type";
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.context_parallel_size"), k,
                            "a2a redistributes heads: the attention heads (%d) and K/V groups "
                            "(%d) must be multiples of TP x CP = %d",
                            m->num_attention_heads, tpd_config_kv_heads(c), tp * cp);
    }
    if (p->sequence_parallel && m->seq_length % tp) {
        k = "parallel.sequence_parallel";
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.seq_length"), k,
                            "seq_length (%d) must be a multiple of tensor_model_parallel_size (%d) "
                            "(sequence parallel splits the sequence over the TP ranks)",
                            m->seq_length, tp);
    }
    if (p->tp_comm_overlap && (!p->sequence_parallel || tp < 2)) {
        k = "parallel.tp_comm_overlap";
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.sequence_parallel"), k,
                            "needs sequence_parallel true and tensor_model_parallel_size > 1 (TP "
                            "%d, sequence_parallel %s): it overlaps SP's all-gathers and "
                            "reduce-scatters with the GEMMs",
                            tp, p->sequence_parallel ? "true" : "false");
    }
    TPD_CHECK(tpd_cfg_check_dp(ld));
    k = "training.global_batch_size";
    if (c->training.global_batch_size % c->training.micro_batch_size)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "training.micro_batch_size"), k,
                            "global_batch_size (%d) must be a multiple of micro_batch_size (%d)",
                            c->training.global_batch_size, c->training.micro_batch_size);
    k = "training.micro_batch_size";
    /* B*T rows index every activation (an int): 64-bit product, bounded */
    if ((int64_t)c->training.micro_batch_size * m->seq_length > CFG_MAX_TOKENS)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.seq_length"), k,
                            "micro_batch_size * seq_length (%d * %d) must be at most %d tokens "
                            "per micro-batch",
                            c->training.micro_batch_size, m->seq_length, CFG_MAX_TOKENS);
    k = "optimizer.min_lr";
    if (c->optimizer.min_lr > c->optimizer.lr) {
        char lo[32], hi[32];
        tpd_cfg_fmt_double(c->optimizer.min_lr, lo, sizeof lo);
        tpd_cfg_fmt_double(c->optimizer.lr, hi, sizeof hi);
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "optimizer.lr"), k,
                            "min_lr (%s) must be <= lr (%s)", lo, hi);
    }
    if (vpp > 1) {
        /* As in Megatron, virtual stages select the interleaved schedule */
        k = "parallel.virtual_pipeline_model_parallel_size";
        if (p->pipeline_schedule == TPD_SCHEDULE_ZB_H1)
            return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.pipeline_schedule"), k,
                                "%d needs pipeline_schedule interleaved (or 1f1b, which it makes "
                                "interleaved), not zb-h1 (zb-h1 runs one model chunk per stage)",
                                vpp);
        if (pp < 2)
            return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.pipeline_model_parallel_size"), k,
                                "%d needs pipeline_model_parallel_size > 1 (the model chunks "
                                "interleave across the pipeline's stages)",
                                vpp);
    } else if (p->pipeline_schedule == TPD_SCHEDULE_INTERLEAVED) {
        k = "parallel.pipeline_schedule";
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, NULL), k,
                            "interleaved needs virtual_pipeline_model_parallel_size > 1 (the model "
                            "chunks per stage that it interleaves)");
    }
    if (p->pipeline_schedule == TPD_SCHEDULE_ZB_H1 && c->training.recompute == TPD_RECOMPUTE_FULL) {
        k = "parallel.pipeline_schedule";
        return tpd_cfg_fail(
            ld, tpd_cfg_at(ld, k, "training.recompute"), k,
            "zb-h1 cannot run with training.recompute full: W needs the layer "
            "activations that full recompute drops after B (use selective or none)");
    }
    return TPD_OK;
}

/* Every 0-means-derived key, filled where it is still 0 (a stated value is kept). The checks
 * come before the first write, so a failure leaves the config as it was. */
static tpd_status cfg_resolve(cfg_loader *ld) {
    tpd_config_model *m = &ld->cfg->model;
    TPD_CHECK(tpd_cfg_check_sharding_stated(ld));
    if (m->ffn_hidden_size == 0) {
        /* 4h is GPT's width; a SwiGLU MLP of the same size is about 8/3 h, and Llama rounds
         * that up its own way: no default would be right. */
        if (m->swiglu)
            return tpd_cfg_fail(ld, tpd_cfg_at(ld, "model.ffn_hidden_size", "model.swiglu"),
                                "model.ffn_hidden_size",
                                "swiglu needs ffn_hidden_size set: 0 means 4*hidden_size (%lld), "
                                "GPT's MLP width, but a SwiGLU MLP has three matrices and Llama's "
                                "width is about 8/3*hidden_size (e.g. 14336 at hidden_size 4096)",
                                4LL * m->hidden_size);
        if (m->hidden_size > INT_MAX / 4)
            return tpd_cfg_fail(ld, tpd_cfg_where(ld, "model.hidden_size"), "model.hidden_size",
                                "%d is too large for the default ffn_hidden_size 4*hidden_size "
                                "(set model.ffn_hidden_size)",
                                m->hidden_size);
        m->ffn_hidden_size = 4 * m->hidden_size;
    }
    if (m->max_position_embeddings == 0) m->max_position_embeddings = m->seq_length;
    tpd_cfg_sharding_rule(&ld->cfg->parallel);
    return TPD_OK;
}

/* ---- public API ---- */

void tpd_config_defaults(tpd_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg_loader ld = {.path = NULL, .cfg = cfg};
    const cfg_loc at = {CFG_DEFAULT, 0, 0};
    /* The schema's defaults are valid by construction; the tests load them through this
     * same parser and would fail on a bad one. */
    for (int i = 0; i < tpd_cfg_nkeys; i++)
        (void)cfg_set_scalar(&ld, i, tpd_cfg_keys[i].def, 1, &at);
}

tpd_status tpd_config_load(const char *path, int n_overrides, const char *const *overrides,
                           tpd_config *cfg) {
    tpd_config tmp;
    tpd_config_defaults(&tmp);
    cfg_loader ld = {.path = path, .cfg = &tmp}; /* CFG_DEFAULT */

    if (path) TPD_CHECK(cfg_load_file(&ld));
    for (int i = 0; i < n_overrides; i++)
        TPD_CHECK(cfg_apply_override(&ld, overrides[i]));
    if (path) {
        for (int i = 0; i < tpd_cfg_nkeys; i++)
            if (tpd_cfg_keys[i].required && ld.set[i].origin == CFG_DEFAULT)
                return tpd_cfg_fail(&ld, &ld.set[i], tpd_cfg_keys[i].name,
                                    "required key is missing (every config file must set it)");
    }

    TPD_CHECK(cfg_resolve(&ld));
    TPD_CHECK(cfg_check_relations(&ld));

    snprintf(tmp.source_path, sizeof tmp.source_path, "%s", path ? path : "");
    *cfg = tmp;
    return TPD_OK;
}

tpd_status tpd_config_resolve(tpd_config *cfg) {
    /* every key CFG_DEFAULT: a message names the config's file, or "<defaults>" */
    const char *path = cfg->source_path[0] ? cfg->source_path : NULL;
    cfg_loader ld = {.path = path, .cfg = cfg};
    return cfg_resolve(&ld);
}
