/* Cluster profiles (configs/clusters/NAME.yaml) and framework profiles
 * (configs/frameworks/NAME.yaml), parsed with libyaml's document API by one key table: a
 * framework profile holds only the keys marked as the framework's.
 *
 * Values are in the units people quote (TFLOP/s, GiB, GB/s, microseconds) and converted
 * to SI here. Every key is checked: an unknown key, a missing required one or a bad
 * value fails with "FILE:LINE: KEY: ...". */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include "base/file.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <yaml.h>

typedef struct key_spec {
    const char *key;
    int required;
    double lo, hi; /* accepted range of the number as written */
    double scale;  /* to SI */
    size_t offset; /* into tpd_plan_cluster, a double (or int for gpus_per_node) */
    int framework; /* 1: the software's cost, also a framework profile's key */
} key_spec;

#define OFF(f) offsetof(tpd_plan_cluster, f)
/* Whole-number keys stored as int. */
static int is_int_key(size_t off) {
    return off == OFF(gpus_per_node) || off == OFF(calibrated) || off == OFF(calibrated_bf16) ||
           off == OFF(nvlink_domain_gpus) || off == OFF(nics_per_node) ||
           off == OFF(leaf_switch_nodes) || off == OFF(island_nodes) ||
           off == OFF(tp_overlap_available) || off == OFF(global_syncs);
}

static const key_spec k_keys[] = {
    {"gpus_per_node", 1, 1, 1024, 1, OFF(gpus_per_node), 0},
    {"calibrated", 0, 0, 1, 1, OFF(calibrated), 0},
    {"calibrated_bf16", 0, 0, 1, 1, OFF(calibrated_bf16), 0},
    {"cpu_cores", 0, 0, 1e6, 1, OFF(cpu_cores), 0},
    {"calibration_ranks", 0, 0, 1e6, 1, OFF(calibration_ranks), 0},
    {"gemm_backward_ratio", 0, 0.1, 100, 1, OFF(gemm_bwd_ratio), 0},
    {"attention_backward_ratio", 0, 0.1, 100, 1, OFF(attn_bwd_ratio), 0},
    {"p2p_bw_gbs", 0, 1e-6, 1e6, 1e9, OFF(p2p_bw), 0},
    {"p2p_latency_us", 0, 0, 1e6, 1e-6, OFF(p2p_latency), 0},
    {"sync_latency_us", 0, 0, 1e6, 1e-6, OFF(sync_latency), 0},
    {"sync_latency_all_us", 0, 0, 1e6, 1e-6, OFF(sync_latency_all), 0},
    {"peak_tflops", 1, 1e-6, 1e6, 1e12, OFF(peak_flops), 0},
    {"hbm_gib", 1, 1e-3, 1e6, 1073741824.0, OFF(hbm_bytes), 0},
    {"hbm_bw_gbs", 1, 1e-3, 1e6, 1e9, OFF(hbm_bw), 0},
    {"usable_memory_fraction", 0, 0.1, 1.0, 1, OFF(hbm_usable_fraction), 0},
    {"memory_efficiency", 0, 0.01, 1.0, 1, OFF(mem_efficiency), 0},
    {"intra_node_bw_gbs", 1, 1e-3, 1e6, 1e9, OFF(intra_bw), 0},
    {"intra_node_latency_us", 0, 0, 1e6, 1e-6, OFF(intra_latency), 0},
    {"inter_node_bw_gbs", 1, 1e-3, 1e6, 1e9, OFF(inter_bw), 0},
    {"inter_node_latency_us", 0, 0, 1e6, 1e-6, OFF(inter_latency), 0},
    {"collective_efficiency", 0, 0.01, 1.0, 1, OFF(coll_efficiency), 0},
    {"network_collective_efficiency", 0, 0, 1.0, 1, OFF(net_coll_efficiency), 0},
    {"flash_attention_efficiency", 0, 0.01, 1.0, 1, OFF(flash_efficiency), 0},
    {"flash_attention_backward_efficiency", 0, 0, 1.0, 1, OFF(flash_bwd_efficiency), 0},
    {"workspace_mib", 0, 0, 1e6, 1048576.0, OFF(workspace_bytes), 0},
    {"kernel_overhead_us", 0, 0, 1e6, 1e-6, OFF(kernel_overhead_s), 1},
    /* network topology (docs/planner-profiles.md) */
    {"nvlink_domain_gpus", 0, 1, 1048576, 1, OFF(nvlink_domain_gpus), 0},
    {"nics_per_node", 0, 1, 1024, 1, OFF(nics_per_node), 0},
    {"leaf_switch_nodes", 0, 0, 1048576, 1, OFF(leaf_switch_nodes), 0},
    {"fabric_oversubscription", 0, 1, 64, 1, OFF(oversubscription), 0},
    {"island_nodes", 0, 0, 1048576, 1, OFF(island_nodes), 0},
    {"inter_island_gbs", 0, 1e-6, 1e6, 1e9, OFF(inter_island_bw), 0},
    {"inter_island_latency_us", 0, 0, 1e7, 1e-6, OFF(inter_island_latency), 0},
    /* the framework's costs */
    {"tp_overlap_available", 0, 0, 1, 1, OFF(tp_overlap_available), 1},
    {"tp_overlap_share", 0, 0, 1, 1, OFF(tp_overlap_share), 1},
    {"tp_overlap_chunk_us", 0, 0, 1e6, 1e-6, OFF(tp_overlap_chunk_s), 1},
    {"tp_overlap_gemm_slowdown", 0, 0, 1, 1, OFF(tp_overlap_slowdown), 1},
    {"host_launch_us", 0, 0, 1e6, 1e-6, OFF(host_launch_s), 1},
    {"micro_batch_host_us", 0, 0, 1e9, 1e-6, OFF(micro_batch_host_s), 1},
    {"step_host_ms", 0, 0, 1e7, 1e-3, OFF(step_host_s), 1},
    {"optimizer_fixed_ms", 0, 0, 1e7, 1e-3, OFF(optimizer_fixed_s), 1},
    {"straggler_cv", 0, 0, 1, 1, OFF(straggler_cv), 1},
    {"global_syncs", 0, 0, 1000, 1, OFF(global_syncs), 1},
};
#define N_KEYS (sizeof k_keys / sizeof k_keys[0])

static void cluster_defaults(tpd_plan_cluster *c) {
    memset(c, 0, sizeof *c);
    c->backend = TPD_PLAN_BACKEND_CUDA;
    /* 8% of HBM is left for the CUDA context, the allocator's fragmentation and buffers
     * we do not model (NCCL channels beyond workspace_mib). */
    c->hbm_usable_fraction = 0.92;
    c->mem_efficiency = 0.85;
    c->coll_efficiency = 0.8;
    c->flash_efficiency = 0.5;
    c->workspace_bytes = 32.0 * 1048576 + 256.0 * 1048576; /* cuBLASLt + NCCL */
    c->intra_latency = 5e-6;
    c->inter_latency = 10e-6;
    /* A flat curve until a profile (or the calibration step) gives one. */
    c->gemm_curve_len = 1;
    c->gemm_curve_flops[0] = 1e9;
    c->gemm_curve_eff[0] = 0.7;
    c->gemm_bwd_ratio = 2.0; /* two GEMMs of the forward's size */
    c->attn_bwd_ratio = 2.5; /* four products and the softmax gradient vs two + softmax */
    c->p2p_latency = -1.0;
    /* Topology: 0 = the node (nvlink_domain_gpus, nics_per_node), one leaf switch. The
     * framework: fp32 gradients on the wire, the TP overlap available and hiding up to its
     * GEMM (less 2 us a chunk) at a 5% GEMM slowdown; nothing else added. Together: the
     * model as it was before these keys. */
    c->oversubscription = 1.0;
    c->inter_island_latency = -1.0; /* inter_latency */
    c->tp_overlap_available = 1;
    c->tp_overlap_share = 1.0;
    c->tp_overlap_chunk_s = 2e-6;
    c->tp_overlap_slowdown = 0.05;
}

/* elementwise_ns: per-element seconds of the cpu kernels, by kernel name. */
typedef struct ew_spec {
    const char *key;
    size_t offset;
} ew_spec;
static const ew_spec k_ew[] = {
    {"add", OFF(ew_add)},
    {"layernorm_fwd", OFF(ew_layernorm_fwd)},
    {"layernorm_bwd", OFF(ew_layernorm_bwd)},
    {"gelu_fwd", OFF(ew_gelu_fwd)},
    {"gelu_bwd", OFF(ew_gelu_bwd)},
    {"xent_fwd", OFF(ew_xent_fwd)},
    {"xent_bwd", OFF(ew_xent_bwd)},
    {"adamw", OFF(ew_adamw)},
    {"sumsq", OFF(ew_sumsq)},
    {"zero", OFF(ew_zero)},
};
#define N_EW (sizeof k_ew / sizeof k_ew[0])

static double curve_at(int n, const double *xs, const double *ys, double flops) {
    if (n <= 0) return 0.7;
    if (flops <= xs[0]) return ys[0];
    if (flops >= xs[n - 1]) return ys[n - 1];
    for (int i = 1; i < n; i++) {
        if (flops <= xs[i]) {
            double x0 = log(xs[i - 1]), x1 = log(xs[i]);
            double w = (log(flops) - x0) / (x1 - x0);
            return ys[i - 1] + w * (ys[i] - ys[i - 1]);
        }
    }
    return ys[n - 1];
}

double tpd_plan_attention_efficiency(const tpd_plan_cluster *c, double flops) {
    if (c->attn_curve_len <= 0) return tpd_plan_gemm_efficiency(c, flops);
    return curve_at(c->attn_curve_len, c->attn_curve_flops, c->attn_curve_eff, flops);
}

double tpd_plan_gemm_efficiency(const tpd_plan_cluster *c, double flops) {
    return curve_at(c->gemm_curve_len, c->gemm_curve_flops, c->gemm_curve_eff, flops);
}

/* stat, not open: opening a FIFO would wait for its writer */
static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* The names of the profiles in configs/DIR/ (here, else under the source tree), sorted,
 * ", "-separated. */
static void profile_names(const char *dir, char *out, size_t outlen) {
    char path[TPD_CONFIG_STR], names[64][64];
    int n = 0;
    out[0] = '\0';
    snprintf(path, sizeof path, "configs/%s", dir);
    DIR *d = opendir(path);
    if (!d) {
        snprintf(path, sizeof path, "%s/configs/%s", tpd_source_dir(), dir);
        d = opendir(path);
    }
    if (!d) return;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < 64;) {
        size_t len = strlen(e->d_name);
        if (len <= 5 || len - 5 >= sizeof names[0] || strcmp(e->d_name + len - 5, ".yaml") != 0)
            continue;
        memcpy(names[n], e->d_name, len - 5);
        names[n][len - 5] = '\0';
        n++;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of names */
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char t[64];
            memcpy(t, names[j], sizeof t);
            memcpy(names[j], names[j - 1], sizeof t);
            memcpy(names[j - 1], t, sizeof t);
        }
    size_t at = 0;
    for (int i = 0; i < n && at < outlen; i++)
        at += (size_t)snprintf(out + at, outlen - at, "%s%s", i ? ", " : "", names[i]);
}

void tpd_plan_framework_names(char *out, size_t outlen) {
    profile_names("frameworks", out, outlen);
}

/* NAME or FILE to a readable path; NAME is configs/DIR/NAME.yaml. `what` names the kind of
 * profile in messages. */
static tpd_status resolve_path(const char *name, const char *dir, const char *what, char *out,
                               size_t outlen) {
    size_t n = strlen(name);
    int looks_like_file =
        strchr(name, '/') != NULL ||
        (n > 5 && (strcmp(name + n - 5, ".yaml") == 0 || strcmp(name + n - 4, ".yml") == 0));
    if (looks_like_file) {
        if (!file_exists(name)) {
            tpd_log_error("%s profile %s: cannot open: %s", what, name, strerror(errno));
            return TPD_ERR_IO;
        }
        snprintf(out, outlen, "%s", name);
        return TPD_OK;
    }
    snprintf(out, outlen, "configs/%s/%s.yaml", dir, name);
    if (file_exists(out)) return TPD_OK;
    snprintf(out, outlen, "%s/configs/%s/%s.yaml", tpd_source_dir(), dir, name);
    if (file_exists(out)) return TPD_OK;
    char known[1024];
    profile_names(dir, known, sizeof known);
    tpd_log_error("%s profile '%s' not found: looked for configs/%s/%s.yaml here and in %s "
                  "(known: %s)",
                  what, name, dir, name, tpd_source_dir(), known[0] ? known : "none");
    return TPD_ERR_IO;
}

static int parse_number(const char *s, double *v_p) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno != 0 || !isfinite(v)) return 0;
    *v_p = v;
    return 1;
}

/* gemm_efficiency: [[GFLOP, efficiency], ...] with GFLOP strictly increasing. */
static tpd_status parse_curve(yaml_document_t *doc, yaml_node_t *seq, const char *path,
                              const char *key, int *len_p, double *xs, double *ys) {
    int line = (int)seq->start_mark.line + 1;
    if (seq->type != YAML_SEQUENCE_NODE) {
        tpd_log_error("%s:%d: %s: expected a list of [GFLOP, efficiency] pairs", path, line, key);
        return TPD_ERR_INVALID;
    }
    int n = 0;
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top;
         it++) {
        yaml_node_t *pair = yaml_document_get_node(doc, *it);
        int pl = (int)pair->start_mark.line + 1;
        double v[2];
        int ok = pair->type == YAML_SEQUENCE_NODE &&
                 pair->data.sequence.items.top - pair->data.sequence.items.start == 2;
        for (int k = 0; ok && k < 2; k++) {
            yaml_node_t *x = yaml_document_get_node(doc, pair->data.sequence.items.start[k]);
            ok = x->type == YAML_SCALAR_NODE &&
                 parse_number((const char *)x->data.scalar.value, &v[k]);
        }
        if (!ok) {
            tpd_log_error("%s:%d: %s[%d]: expected [GFLOP, efficiency], two numbers", path, pl, key,
                          n);
            return TPD_ERR_INVALID;
        }
        if (n >= TPD_PLAN_MAX_CURVE) {
            tpd_log_error("%s:%d: %s: more than %d points", path, pl, key, TPD_PLAN_MAX_CURVE);
            return TPD_ERR_INVALID;
        }
        if (v[0] <= 0 || v[1] <= 0 || v[1] > 1) {
            tpd_log_error("%s:%d: %s[%d]: [%g, %g]: GFLOP must be > 0 and efficiency in "
                          "(0, 1]",
                          path, pl, key, n, v[0], v[1]);
            return TPD_ERR_INVALID;
        }
        if (n > 0 && v[0] * 1e9 <= xs[n - 1]) {
            tpd_log_error("%s:%d: %s[%d]: GFLOP %g must be larger than the previous point's", path,
                          pl, key, n, v[0]);
            return TPD_ERR_INVALID;
        }
        xs[n] = v[0] * 1e9;
        ys[n] = v[1];
        n++;
    }
    if (n == 0) {
        tpd_log_error("%s:%d: %s: empty list", path, line, key);
        return TPD_ERR_INVALID;
    }
    *len_p = n;
    return TPD_OK;
}

/* elementwise_ns: {add: 0.8, layernorm_fwd: 3.1, ...}, nanoseconds per element. */
static tpd_status parse_elementwise(yaml_document_t *doc, yaml_node_t *map, const char *path,
                                    tpd_plan_cluster *c) {
    if (map->type != YAML_MAPPING_NODE) {
        tpd_log_error("%s:%d: elementwise_ns: expected a mapping of kernel: nanoseconds", path,
                      (int)map->start_mark.line + 1);
        return TPD_ERR_INVALID;
    }
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *kn = yaml_document_get_node(doc, pr->key);
        yaml_node_t *vn = yaml_document_get_node(doc, pr->value);
        int line = (int)kn->start_mark.line + 1;
        const char *key = kn->type == YAML_SCALAR_NODE ? (const char *)kn->data.scalar.value : "";
        size_t i = 0;
        while (i < N_EW && strcmp(k_ew[i].key, key) != 0)
            i++;
        if (i == N_EW) {
            tpd_log_error("%s:%d: elementwise_ns: unknown kernel '%s' (known: add, "
                          "layernorm_fwd, layernorm_bwd, gelu_fwd, gelu_bwd, xent_fwd, "
                          "xent_bwd, adamw, sumsq, zero)",
                          path, line, key);
            return TPD_ERR_INVALID;
        }
        double v;
        if (vn->type != YAML_SCALAR_NODE ||
            !parse_number((const char *)vn->data.scalar.value, &v) || v < 0 || v > 1e6) {
            tpd_log_error("%s:%d: elementwise_ns.%s: expected nanoseconds in [0, 1e6]", path, line,
                          key);
            return TPD_ERR_INVALID;
        }
        *(double *)((char *)c + k_ew[i].offset) = v * 1e-9;
    }
    return TPD_OK;
}

/* The keys whose values are names: global_sync_algorithm (tree, ring). The gradients' dtype
 * on the wire is the run's (training.accumulate_allreduce_grads_in_fp32), not the cluster's. */
static tpd_status parse_choice(const char *path, int line, const char *val, tpd_plan_cluster *c) {
    if (strcmp(val, "tree") == 0 || strcmp(val, "ring") == 0) {
        c->sync_ring = val[0] == 'r';
        return TPD_OK;
    }
    tpd_log_error("%s:%d: global_sync_algorithm: '%s' must be tree or ring", path, line, val);
    return TPD_ERR_INVALID;
}

/* A framework profile's record of a key it states (once each). */
static void framework_mark(tpd_plan_framework *fw, size_t offset) {
    for (int i = 0; i < fw->n_set; i++)
        if (fw->set_offset[i] == offset) return;
    if (fw->n_set < TPD_PLAN_FRAMEWORK_MAX_KEYS) fw->set_offset[fw->n_set++] = offset;
}

/* The keys a profile may hold, for an unknown key's message. */
static void known_keys(const tpd_plan_framework *fw, char *known, size_t len) {
    size_t at = (size_t)snprintf(known, len, "%s",
                                 fw ? "name, description, kind, calibrated_from, "
                                      "global_sync_algorithm"
                                    : "name, description, backend, global_sync_algorithm, "
                                      "gemm_efficiency, attention_efficiency, elementwise_ns");
    for (size_t j = 0; j < N_KEYS && at < len; j++)
        if (!fw || k_keys[j].framework)
            at += (size_t)snprintf(known + at, len - at, ", %s", k_keys[j].key);
}

/* The root mapping into c; a framework profile (fw not NULL) also records in fw the keys it
 * states and takes its strings, and may hold only framework keys. */
static tpd_status parse_root(yaml_document_t *doc, const char *path, tpd_plan_cluster *c,
                             tpd_plan_framework *fw) {
    const char *what = fw ? "framework" : "cluster";
    yaml_node_t *root = yaml_document_get_root_node(doc);
    if (!root || root->type != YAML_MAPPING_NODE) {
        tpd_log_error("%s: a %s profile must be a mapping of keys", path, what);
        return TPD_ERR_FORMAT;
    }
    int seen[N_KEYS] = {0};
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *kn = yaml_document_get_node(doc, pr->key);
        yaml_node_t *vn = yaml_document_get_node(doc, pr->value);
        int line = (int)kn->start_mark.line + 1;
        if (kn->type != YAML_SCALAR_NODE) {
            tpd_log_error("%s:%d: keys must be plain names", path, line);
            return TPD_ERR_FORMAT;
        }
        const char *key = (const char *)kn->data.scalar.value;
        if (fw &&
            (strcmp(key, "gemm_efficiency") == 0 || strcmp(key, "attention_efficiency") == 0 ||
             strcmp(key, "elementwise_ns") == 0 || strcmp(key, "backend") == 0)) {
            char known[2048];
            known_keys(fw, known, sizeof known);
            tpd_log_error("%s:%d: %s: a cluster's key, not a framework's (known: %s)", path, line,
                          key, known);
            return TPD_ERR_INVALID;
        }
        if (strcmp(key, "gemm_efficiency") == 0) {
            TPD_CHECK(parse_curve(doc, vn, path, key, &c->gemm_curve_len, c->gemm_curve_flops,
                                  c->gemm_curve_eff));
            continue;
        }
        if (strcmp(key, "attention_efficiency") == 0) {
            TPD_CHECK(parse_curve(doc, vn, path, key, &c->attn_curve_len, c->attn_curve_flops,
                                  c->attn_curve_eff));
            continue;
        }
        if (strcmp(key, "elementwise_ns") == 0) {
            TPD_CHECK(parse_elementwise(doc, vn, path, c));
            continue;
        }
        if (vn->type != YAML_SCALAR_NODE) {
            tpd_log_error("%s:%d: %s: expected a single value", path, line, key);
            return TPD_ERR_INVALID;
        }
        const char *val = (const char *)vn->data.scalar.value;
        if (strcmp(key, "name") == 0 || strcmp(key, "description") == 0) {
            if (key[0] == 'n') snprintf(c->name, sizeof c->name, "%s", val);
            if (fw && key[0] == 'n') snprintf(fw->name, sizeof fw->name, "%s", val);
            if (fw && key[0] == 'd') snprintf(fw->description, sizeof fw->description, "%s", val);
            continue;
        }
        if (fw && strcmp(key, "kind") == 0) {
            snprintf(fw->kind, sizeof fw->kind, "%s", val);
            continue;
        }
        if (fw && strcmp(key, "calibrated_from") == 0) {
            snprintf(fw->calibrated_from, sizeof fw->calibrated_from, "%s", val);
            continue;
        }
        if (strcmp(key, "global_sync_algorithm") == 0) {
            TPD_CHECK(parse_choice(path, line, val, c));
            if (fw) framework_mark(fw, OFF(sync_ring));
            continue;
        }
        if (strcmp(key, "backend") == 0) {
            if (strcmp(val, "cuda") == 0) {
                c->backend = TPD_PLAN_BACKEND_CUDA;
            } else if (strcmp(val, "cpu") == 0) {
                c->backend = TPD_PLAN_BACKEND_CPU;
            } else {
                tpd_log_error("%s:%d: backend: '%s' must be cuda or cpu", path, line, val);
                return TPD_ERR_INVALID;
            }
            continue;
        }
        size_t i = 0;
        while (i < N_KEYS && strcmp(k_keys[i].key, key) != 0)
            i++;
        if (i == N_KEYS || (fw && !k_keys[i].framework)) {
            char known[2048];
            known_keys(fw, known, sizeof known);
            tpd_log_error("%s:%d: %s key '%s' (known: %s)", path, line,
                          i == N_KEYS ? "unknown" : "a cluster's, not a framework's", key, known);
            return TPD_ERR_INVALID;
        }
        double v;
        if (!parse_number(val, &v)) {
            tpd_log_error("%s:%d: %s: '%s' is not a number", path, line, key, val);
            return TPD_ERR_INVALID;
        }
        if (v < k_keys[i].lo || v > k_keys[i].hi) {
            tpd_log_error("%s:%d: %s: %g is outside [%g, %g]", path, line, key, v, k_keys[i].lo,
                          k_keys[i].hi);
            return TPD_ERR_INVALID;
        }
        char *field = (char *)c + k_keys[i].offset;
        if (is_int_key(k_keys[i].offset)) {
            if (v != floor(v)) {
                tpd_log_error("%s:%d: %s: %g must be a whole number", path, line, key, v);
                return TPD_ERR_INVALID;
            }
            *(int *)field = (int)v;
        } else {
            *(double *)field = v * k_keys[i].scale;
        }
        seen[i] = line;
        if (fw) framework_mark(fw, k_keys[i].offset);
    }
    if (fw) return TPD_OK;
    for (size_t i = 0; i < N_KEYS; i++) {
        if (k_keys[i].required && !seen[i]) {
            tpd_log_error("%s: missing required key '%s'", path, k_keys[i].key);
            return TPD_ERR_INVALID;
        }
    }
    /* an NVLink domain is whole nodes (NVL72: 18 trays of 4) or splits a node evenly */
    int d = c->nvlink_domain_gpus, g = c->gpus_per_node;
    if (d > 0 && d % g != 0 && g % d != 0) {
        size_t i = 0;
        while (k_keys[i].offset != OFF(nvlink_domain_gpus))
            i++;
        tpd_log_error("%s:%d: nvlink_domain_gpus: %d must be a multiple or a divisor of "
                      "gpus_per_node (%d)",
                      path, seen[i], d, g);
        return TPD_ERR_INVALID;
    }
    /* islands need the link between them */
    if (c->island_nodes > 0 && c->inter_island_bw <= 0.0) {
        size_t i = 0;
        while (k_keys[i].offset != OFF(island_nodes))
            i++;
        tpd_log_error("%s:%d: island_nodes: %d needs inter_island_gbs (the per-GPU bandwidth "
                      "between islands, > 0)",
                      path, seen[i], c->island_nodes);
        return TPD_ERR_INVALID;
    }
    return TPD_OK;
}

/* Reads the profile at c->path into c (and fw, for a framework profile). */
static tpd_status load_profile(tpd_plan_cluster *c, tpd_plan_framework *fw) {
    tpd_status st = TPD_OK;
    const char *what = fw ? "framework" : "cluster";
    char why[160];
    tpd_status ok = tpd_file_check_text(c->path, 1u << 20, why, sizeof why);
    if (ok != TPD_OK) {
        tpd_log_error("%s profile %s: %s", what, c->path, why);
        return ok;
    }
    int err;
    FILE *f = tpd_file_fopen_read(c->path, &err);
    if (!f) {
        tpd_log_error("%s profile %s: cannot open: %s", what, c->path, tpd_file_strerror(err));
        return TPD_ERR_IO;
    }
    TPD_CHECK_GOTO(tpd_config_yaml_depth_check(c->path, f), st, close_file);
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser))
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, close_file, "%s profile %s: yaml init failed", what,
                      c->path);
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc))
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, free_parser, "%s:%zu:%zu: YAML error: %s", c->path,
                      parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                      parser.problem ? parser.problem : "unknown");
    TPD_CHECK_GOTO(parse_root(&doc, c->path, c, fw), st, free_doc);
    if (c->name[0] == '\0') {
        /* Default name: the file's base name without .yaml. */
        const char *b = strrchr(c->path, '/');
        const char *base = b ? b + 1 : c->path;
        size_t n = strlen(base);
        if (n >= sizeof c->name) n = sizeof c->name - 1;
        memcpy(c->name, base, n);
        c->name[n] = '\0';
        char *dot = strrchr(c->name, '.');
        if (dot) *dot = '\0';
    }
free_doc:
    yaml_document_delete(&doc);
free_parser:
    yaml_parser_delete(&parser);
close_file:
    fclose(f);
    return st;
}

tpd_status tpd_plan_cluster_load(const char *name_or_path, tpd_plan_cluster *cluster_p) {
    tpd_plan_cluster c;
    cluster_defaults(&c);
    TPD_CHECK(resolve_path(name_or_path, "clusters", "cluster", c.path, sizeof c.path));
    TPD_CHECK(load_profile(&c, NULL));
    *cluster_p = c;
    return TPD_OK;
}

tpd_status tpd_plan_framework_load(const char *name_or_path, tpd_plan_framework *fw_p) {
    tpd_plan_framework *fw = malloc(sizeof *fw);
    if (!fw) return tpd_fail_nomem("a framework profile", sizeof *fw);
    memset(fw, 0, sizeof *fw);
    cluster_defaults(&fw->values);
    tpd_status st = resolve_path(name_or_path, "frameworks", "framework", fw->values.path,
                                 sizeof fw->values.path);
    if (st == TPD_OK) st = load_profile(&fw->values, fw);
    if (st == TPD_OK) {
        snprintf(fw->name, sizeof fw->name, "%s", fw->values.name);
        snprintf(fw->path, sizeof fw->path, "%s", fw->values.path);
        *fw_p = *fw;
    }
    free(fw);
    return st;
}

void tpd_plan_framework_apply(const tpd_plan_framework *fw, tpd_plan_cluster *cl) {
    for (int i = 0; i < fw->n_set; i++) {
        size_t off = fw->set_offset[i];
        if (is_int_key(off) || off == OFF(sync_ring))
            memcpy((char *)cl + off, (const char *)&fw->values + off, sizeof(int));
        else
            memcpy((char *)cl + off, (const char *)&fw->values + off, sizeof(double));
    }
    snprintf(cl->framework, sizeof cl->framework, "%s", fw->name);
}
