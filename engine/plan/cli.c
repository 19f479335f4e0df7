/* `tripod plan`: argument parsing and the three outputs (search table, one layout's
 * breakdown, the rank table). */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/mesh.h"

#define MAX_OVERRIDES 64

typedef struct plan_args {
    const char *config;
    const char *overrides[MAX_OVERRIDES];
    int n_overrides;
    const char *cluster;
    int gpus;
    int have_layout, tp, pp, dp;
    int top;
    int json;
    int ranks;
    int dp_overlap;
    int even_stages;
    const char *trace;
} plan_args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: tripod plan CONFIG.yaml [section.key=value ...] [--cluster NAME|FILE]\n"
            "                   [--gpus N] [--layout TP,PP,DP] [--top K] [--json]\n"
            "                   [--trace FILE] [--ranks] [--dp-overlap on|off] [--even-stages]\n"
            "  Without --layout: search every layout for N GPUs and rank the top K (10).\n"
            "  With --layout: the full memory and time breakdown of that layout.\n"
            "  --cluster: configs/clusters/NAME.yaml or a file (default: h200, cpu for\n"
            "             training.device=cpu). --trace: predicted timeline (Perfetto).\n"
            "  --ranks: rank -> (tp, dp, pp) table and every communication group.\n"
            "  --dp-overlap off: DP gradient reduction after backward (Megatron 2021).\n"
            "  Without parallel.pipeline_layers, pipeline stages are split by predicted\n"
            "  time (the ends also embed, or run the head and loss) when that is faster;\n"
            "  --even-stages keeps the layer-count split.\n");
}

static int parse_int(const char *s, int *v_p) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!s[0] || *end || v < 1 || v > 1 << 30) return 0;
    *v_p = (int)v;
    return 1;
}

static int parse_args(int argc, char **argv, plan_args *a) {
    memset(a, 0, sizeof *a);
    a->top = 10;
    a->dp_overlap = 1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(s, "--json") == 0) {
            a->json = 1;
        } else if (strcmp(s, "--ranks") == 0) {
            a->ranks = 1;
        } else if (strcmp(s, "--even-stages") == 0) {
            a->even_stages = 1;
        } else if (strcmp(s, "--cluster") == 0 || strcmp(s, "--gpus") == 0 ||
                   strcmp(s, "--layout") == 0 || strcmp(s, "--top") == 0 ||
                   strcmp(s, "--trace") == 0 || strcmp(s, "--dp-overlap") == 0) {
            if (!val) {
                tpd_log_error("plan: %s needs a value", s);
                return -1;
            }
            i++;
            if (strcmp(s, "--cluster") == 0) {
                a->cluster = val;
            } else if (strcmp(s, "--trace") == 0) {
                a->trace = val;
            } else if (strcmp(s, "--gpus") == 0) {
                if (!parse_int(val, &a->gpus)) {
                    tpd_log_error("plan: --gpus '%s' must be a positive integer", val);
                    return -1;
                }
            } else if (strcmp(s, "--top") == 0) {
                if (!parse_int(val, &a->top)) {
                    tpd_log_error("plan: --top '%s' must be a positive integer", val);
                    return -1;
                }
            } else if (strcmp(s, "--dp-overlap") == 0) {
                if (strcmp(val, "on") != 0 && strcmp(val, "off") != 0) {
                    tpd_log_error("plan: --dp-overlap '%s' must be on or off", val);
                    return -1;
                }
                a->dp_overlap = strcmp(val, "on") == 0;
            } else {
                char extra;
                if (sscanf(val, "%d,%d,%d%c", &a->tp, &a->pp, &a->dp, &extra) != 3 ||
                    a->tp < 1 || a->pp < 1 || a->dp < 1) {
                    tpd_log_error("plan: --layout '%s' must be TP,PP,DP (e.g. 8,8,16)", val);
                    return -1;
                }
                a->have_layout = 1;
            }
        } else if (s[0] == '-' && s[1] == '-') {
            tpd_log_error("plan: unknown option '%s'", s);
            usage(stderr);
            return -1;
        } else if (strchr(s, '=')) {
            if (a->n_overrides == MAX_OVERRIDES) {
                tpd_log_error("plan: more than %d overrides", MAX_OVERRIDES);
                return -1;
            }
            a->overrides[a->n_overrides++] = s;
        } else if (!a->config) {
            a->config = s;
        } else {
            tpd_log_error("plan: unexpected argument '%s' (one config file only)", s);
            return -1;
        }
    }
    if (!a->config) {
        tpd_log_error("plan: missing CONFIG.yaml");
        usage(stderr);
        return -1;
    }
    return 1;
}

static void print_ranks(FILE *f, const tpd_mesh *mesh0) {
    int w = mesh0->world_size;
    fprintf(f, "rank table (TP=%d, PP=%d, DP=%d; rank = tp + TP*(dp + DP*pp)):\n",
            mesh0->tp_size, mesh0->pp_size, mesh0->dp_size);
    fprintf(f, "  %6s %4s %4s %4s\n", "rank", "tp", "dp", "pp");
    for (int r = 0; r < w; r++) {
        int tp, dp, pp;
        tpd_mesh_coords_of(mesh0, r, &tp, &dp, &pp);
        fprintf(f, "  %6d %4d %4d %4d\n", r, tp, dp, pp);
    }
    int *members = malloc((size_t)w * sizeof *members);
    char *seen = calloc((size_t)w, 1);
    if (!members || !seen) {
        free(members);
        free(seen);
        return;
    }
    for (int g = 0; g < TPD_MESH_GROUP_COUNT; g++) {
        memset(seen, 0, (size_t)w);
        fprintf(f, "%s groups:", tpd_mesh_group_name((tpd_mesh_group)g));
        for (int r = 0; r < w; r++) {
            if (seen[r]) continue;
            int n = tpd_mesh_group_members(mesh0, (tpd_mesh_group)g, r, members, w);
            if (n <= 0) continue;
            fprintf(f, " [");
            for (int i = 0; i < n && i < w; i++) {
                fprintf(f, "%s%d", i ? "," : "", members[i]);
                seen[members[i]] = 1;
            }
            fprintf(f, "]");
        }
        fprintf(f, "\n");
    }
    free(seen);
    free(members);
}

static int run_ranks(const tpd_plan_layout *lay) {
    tpd_mesh mesh;
    int world = lay->tp * lay->pp * lay->dp;
    if (tpd_mesh_init(world, 0, lay->tp, lay->pp, lay->dp, &mesh) != TPD_OK)
        return TPD_EXIT_CONFIG;
    print_ranks(stdout, &mesh);
    return TPD_EXIT_OK;
}

static int run_one(const tpd_config *cfg, const tpd_plan_cluster *cl, const tpd_plan_options *opt,
                   const tpd_plan_layout *lay, const plan_args *a) {
    tpd_plan_result *r = malloc(sizeof *r);
    if (!r) {
        tpd_log_error("plan: out of memory");
        return TPD_EXIT_FAILURE;
    }
    int rc = TPD_EXIT_OK;
    if (tpd_plan_evaluate(cfg, cl, lay, opt, r) != TPD_OK) {
        rc = TPD_EXIT_FAILURE;
        goto free_result;
    }
    if (a->json) {
        char *js = tpd_plan_json(r, 1);
        if (!js) {
            tpd_log_error("plan: cannot build JSON");
            rc = TPD_EXIT_FAILURE;
            goto free_result;
        }
        printf("%s\n", js);
        free(js);
    } else {
        printf("cluster %s (%s), %d GPUs, %s\n", cl->name, cl->path, opt->gpus,
               cfg->source_path[0] ? cfg->source_path : "(defaults)");
        tpd_plan_print_breakdown(stdout, r);
    }
    if (r->stages == 0) {
        tpd_log_error("plan: layout is invalid: %s", r->reject_reason);
        rc = TPD_EXIT_CONFIG;
        goto free_result;
    }
    if (a->trace) {
        if (tpd_plan_write_trace(r, a->trace) != TPD_OK) rc = TPD_EXIT_FAILURE;
        else if (!a->json) printf("trace: %s (open in https://ui.perfetto.dev)\n", a->trace);
    }
free_result:
    free(r);
    return rc;
}

static int run_search(const tpd_config *cfg, const tpd_plan_cluster *cl,
                      const tpd_plan_options *opt, const plan_args *a) {
    tpd_plan_search s;
    if (tpd_plan_search_run(cfg, cl, opt, &s) != TPD_OK) return TPD_EXIT_FAILURE;
    int rc = TPD_EXIT_OK;
    if (a->json) {
        char *js = tpd_plan_json(s.top, s.n_top);
        if (js) {
            printf("%s\n", js);
            free(js);
        } else {
            rc = TPD_EXIT_FAILURE;
        }
    } else {
        printf("cluster %s (%s), %d GPUs, %s\n", cl->name, cl->path, opt->gpus,
               cfg->source_path[0] ? cfg->source_path : "(defaults)");
        printf("searched %ld layouts: %ld fit in memory, %ld timed, %ld skipped by the lower "
               "bound, %ld rejected\n\n",
               s.evaluated, s.fitting, s.timed, s.pruned, s.rejected);
        if (s.n_top == 0) {
            printf("no layout fits.\n");
        } else {
            tpd_plan_print_table(stdout, s.top, s.n_top);
            int close = 1;
            while (close < s.n_top && s.top[close].step_time_s <= 1.10 * s.top[0].step_time_s)
                close++;
            if (close > 1)
                printf("\nthe top %d layouts are within 10%% of each other, inside the model's "
                       "error: measure them (tripod sweep) before choosing.\n",
                       close);
            printf("\nbest layout:\n");
            tpd_plan_print_breakdown(stdout, &s.top[0]);
        }
        printf("\n");
        tpd_plan_print_rejections(stdout, &s);
    }
    if (a->trace && s.n_top > 0) {
        if (tpd_plan_write_trace(&s.top[0], a->trace) != TPD_OK) rc = TPD_EXIT_FAILURE;
        else if (!a->json) printf("trace of the best layout: %s\n", a->trace);
    }
    if (s.n_top == 0 && rc == TPD_EXIT_OK) rc = TPD_EXIT_FAILURE;
    tpd_plan_search_free(&s);
    return rc;
}

int tpd_plan_cli(int argc, char **argv) {
    plan_args a;
    int pr = parse_args(argc, argv, &a);
    if (pr <= 0) return pr == 0 ? TPD_EXIT_OK : TPD_EXIT_CONFIG;

    tpd_config *cfg = malloc(sizeof *cfg);
    tpd_plan_cluster *cl = malloc(sizeof *cl);
    int rc = TPD_EXIT_OK;
    if (!cfg || !cl) {
        tpd_log_error("plan: out of memory");
        rc = TPD_EXIT_FAILURE;
        goto free_all;
    }
    char err[1024];
    if (tpd_config_load(a.config, a.n_overrides, a.overrides, cfg, err, sizeof err) != TPD_OK) {
        tpd_log_error("%s", err);
        rc = TPD_EXIT_CONFIG;
        goto free_all;
    }
    const char *cluster = a.cluster ? a.cluster
                          : strcmp(cfg->training.device, "cpu") == 0 ? "cpu" : "h200";
    if (tpd_plan_cluster_load(cluster, cl) != TPD_OK) {
        rc = TPD_EXIT_CONFIG;
        goto free_all;
    }
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.top_k = a.top;
    opt.dp_overlap = a.dp_overlap;
    opt.balance_stages = !a.even_stages;
    /* Default world: what the config states (TP*PP*DP, DP 1 when derived). */
    const tpd_config_parallel *par = &cfg->parallel;
    opt.gpus = a.gpus ? a.gpus
                      : par->tensor_model_parallel_size * par->pipeline_model_parallel_size *
                            (par->data_parallel_size > 0 ? par->data_parallel_size : 1);
    tpd_plan_layout lay;
    tpd_plan_layout_from_config(cfg, opt.gpus, &lay);
    if (a.have_layout) {
        lay.tp = a.tp;
        lay.pp = a.pp;
        lay.dp = a.dp;
        lay.sequence_parallel = par->sequence_parallel && lay.tp > 1;
        if (!a.gpus) opt.gpus = a.tp * a.pp * a.dp;
    }
    if (a.ranks) {
        if (!a.have_layout && (long)lay.tp * lay.pp * lay.dp != opt.gpus) {
            tpd_log_error("plan: %d GPUs is not a multiple of TP*PP = %d", opt.gpus,
                          lay.tp * lay.pp);
            rc = TPD_EXIT_CONFIG;
            goto free_all;
        }
        rc = run_ranks(&lay);
    } else if (a.have_layout) {
        rc = run_one(cfg, cl, &opt, &lay, &a);
    } else {
        rc = run_search(cfg, cl, &opt, &a);
    }
free_all:
    free(cl);
    free(cfg);
    return rc;
}
