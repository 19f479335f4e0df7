/* `tripod plan`: argument parsing and the three outputs (search table, one layout's
 * breakdown, the rank table). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cli/args.h"
#include "engine/cli/cli.h"
#include "engine/plan/plan.h"
#include "parallel/mesh.h"

typedef struct plan_args {
    tpd_cli_args cl; /* config, overrides, options */
    const char *cluster;
    const char *framework;
    int gpus;
    int have_layout, tp, pp, dp;
    int cp; /* --layout's fourth value; 0: the config's parallel.context_parallel_size */
    int ep; /* --layout's fifth value; 0: the config's parallel.expert_model_parallel_size */
    int top;
    int json;
    int ranks;
    int dp_overlap;    /* -1: the config's parallel.overlap_grad_reduce */
    int param_overlap; /* -1: the config's parallel.overlap_param_gather */
    int even_stages;
    const char *trace;
} plan_args;

static void usage(FILE *f) {
    fprintf(f, "usage: tripod plan CONFIG.yaml [section.key=value ...] [--cluster NAME|FILE]\n"
               "                   [--framework NAME|FILE] [--gpus N] [--layout "
               "TP,PP,DP[,CP[,EP]]] [--top K] [--json]\n"
               "                   [--trace FILE] [--ranks] [--dp-overlap on|off]\n"
               "                   [--param-gather-overlap on|off] [--even-stages]\n"
               "  Without --layout: search every layout for N GPUs and rank the top K (10).\n"
               "  With --layout: the full memory and time breakdown of that layout (CP: the\n"
               "             context parallel size, else parallel.context_parallel_size; EP: the\n"
               "             expert parallel size of a mixture of experts, dividing DP and the\n"
               "             experts, else parallel.expert_model_parallel_size; EP > 1 drops\n"
               "             the file's DP sharding, which EP does not train with).\n"
               "  A mixture of experts searches EP too. model.moe_imbalance=X (default 1, >= 1):\n"
               "             the busiest EP rank's tokens over the mean; the expert GEMMs and\n"
               "             the all-to-alls' receiving side are priced at X times the mean.\n"
               "  --cluster: configs/clusters/NAME.yaml or a file (default: h200, cpu for\n"
               "             training.device=cpu). --trace: predicted timeline (Perfetto).\n"
               "  --framework: configs/frameworks/NAME.yaml or a file: the training software's\n"
               "             costs (per-kernel gaps, host time per micro-batch and per step,\n"
               "             stragglers, TP overlap) on top of the cluster's (default: tripod,\n"
               "             tripod's own engine; megatron-2021, megatron-2022, megatron-2023,\n"
               "             nemo-mcore-2024, deepspeed-megatron, meta-llama3, pytorch-fsdp: each\n"
               "             set on one published source, docs/planner-profiles.md).\n"
               "  --ranks: rank -> (tp, cp, dp, pp) table and every communication group.\n"
               "  --dp-overlap on|off: DP gradient reduction during the last backward or after\n"
               "             it (default: the config's parallel.overlap_grad_reduce).\n"
               "  --param-gather-overlap on|off: ZeRO-1 all-gathers waited for at the next\n"
               "             forward or at once (default: parallel.overlap_param_gather).\n"
               "  Without parallel.pipeline_layers, pipeline stages are split by predicted\n"
               "  time (the ends also embed, or run the head and loss) when that is faster;\n"
               "  --even-stages keeps the layer-count split.\n");
}

static const tpd_cli_opt k_opts[] = {{"--json", 0},
                                     {"--ranks", 0},
                                     {"--even-stages", 0},
                                     {"--cluster", 1},
                                     {"--framework", 1},
                                     {"--gpus", 1},
                                     {"--layout", 1},
                                     {"--top", 1},
                                     {"--trace", 1},
                                     {"--dp-overlap", 1},
                                     {"--param-gather-overlap", 1},
                                     {NULL, 0}};

/* Returns 1 to run, 0 for --help, -1 on a bad argument. */
static int parse_args(int argc, char **argv, plan_args *a) {
    memset(a, 0, sizeof *a);
    a->top = 10;
    a->dp_overlap = -1;
    a->param_overlap = -1;
    if (tpd_cli_args_parse("plan", argc - 1, argv + 1, k_opts, &a->cl) != TPD_OK) return -1;
    if (a->cl.help) {
        usage(stdout);
        return 0;
    }
    for (int i = 0; i < a->cl.n_opts; i++) {
        const char *s = a->cl.opt_name[i], *val = a->cl.opt_value[i];
        if (strcmp(s, "--json") == 0) {
            a->json = 1;
        } else if (strcmp(s, "--ranks") == 0) {
            a->ranks = 1;
        } else if (strcmp(s, "--even-stages") == 0) {
            a->even_stages = 1;
        } else if (strcmp(s, "--cluster") == 0) {
            a->cluster = val;
        } else if (strcmp(s, "--framework") == 0) {
            a->framework = val;
        } else if (strcmp(s, "--trace") == 0) {
            a->trace = val;
        } else if (strcmp(s, "--gpus") == 0) {
            if (tpd_cli_int("plan", s, val, 1, 1 << 30, &a->gpus) != TPD_OK) return -1;
        } else if (strcmp(s, "--top") == 0) {
            if (tpd_cli_int("plan", s, val, 1, 1 << 30, &a->top) != TPD_OK) return -1;
        } else if (strcmp(s, "--dp-overlap") == 0 || strcmp(s, "--param-gather-overlap") == 0) {
            if (strcmp(val, "on") != 0 && strcmp(val, "off") != 0) {
                tpd_log_error("plan: %s '%s' must be on or off", s, val);
                return -1;
            }
            *(strcmp(s, "--dp-overlap") == 0 ? &a->dp_overlap : &a->param_overlap) =
                strcmp(val, "on") == 0;
        } else if (strcmp(s, "--layout") == 0) {
            /* 2^15 each: TP*PP*DP*CP stays inside 64 bits; the config's bounds come after */
            int v[5], n;
            if (tpd_cli_int_list("plan", s, val, 1, 1 << 15, 3, 5, v, &n) != TPD_OK) return -1;
            a->tp = v[0], a->pp = v[1], a->dp = v[2];
            a->cp = n >= 4 ? v[3] : 0;
            a->ep = n == 5 ? v[4] : 0;
            a->have_layout = 1;
        }
    }
    if (!a->cl.config) {
        tpd_log_error("plan: missing CONFIG.yaml");
        usage(stderr);
        return -1;
    }
    return 1;
}

static void print_ranks(FILE *f, const tpd_mesh *mesh0) {
    int w = mesh0->world_size, cp = mesh0->cp_size;
    if (cp > 1) {
        /* the mesh's DP coordinate is DP x CP: cp = dp % CP, the data-parallel index dp / CP */
        fprintf(f,
                "rank table (TP=%d, CP=%d, PP=%d, DP=%d; rank = tp + TP*(cp + CP*(dp + "
                "DP*pp))):\n",
                mesh0->tp_size, cp, mesh0->pp_size, mesh0->data_dp_size);
        fprintf(f, "  %6s %4s %4s %4s %4s\n", "rank", "tp", "cp", "dp", "pp");
    } else {
        fprintf(f, "rank table (TP=%d, PP=%d, DP=%d; rank = tp + TP*(dp + DP*pp)):\n",
                mesh0->tp_size, mesh0->pp_size, mesh0->dp_size);
        fprintf(f, "  %6s %4s %4s %4s\n", "rank", "tp", "dp", "pp");
    }
    for (int r = 0; r < w; r++) {
        int tp, dp, pp;
        tpd_mesh_coords_of(mesh0, r, &tp, &dp, &pp);
        if (cp > 1)
            fprintf(f, "  %6d %4d %4d %4d %4d\n", r, tp, dp % cp, dp / cp, pp);
        else
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
        /* DiLoCo's and HSDP's groups only where they exist */
        if ((g == TPD_MESH_GROUP_DP_OUTER && mesh0->replicas == 1) ||
            (g == TPD_MESH_GROUP_CP && mesh0->cp_size == 1) ||
            ((g == TPD_MESH_GROUP_EP || g == TPD_MESH_GROUP_EDP) && mesh0->ep_size == 1) ||
            (g == TPD_MESH_GROUP_EDP_SHARD && !tpd_mesh_has_edp_shard(mesh0)) ||
            ((g == TPD_MESH_GROUP_DP_SHARD || g == TPD_MESH_GROUP_DP_REPLICATE) &&
             mesh0->shard_size == mesh0->dp_inner_size))
            continue;
        memset(seen, 0, (size_t)w);
        /* under CP the gradients' group is DP x CP */
        fprintf(f, "%s groups%s:", tpd_mesh_group_name((tpd_mesh_group)g),
                g == TPD_MESH_GROUP_DP && cp > 1 ? " (DP x CP)" : "");
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
    int cp = lay->cp > 1 ? lay->cp : 1, inner = lay->dp * cp;
    int world = lay->tp * lay->pp * inner;
    /* the mesh's DP coordinate is DP x CP, split by tpd_mesh_set_cp */
    if (tpd_mesh_init(world, 0, lay->tp, lay->pp, inner, &mesh) != TPD_OK ||
        tpd_mesh_set_cp(&mesh, cp) != TPD_OK)
        return TPD_EXIT_CONFIG;
    /* HSDP's shard groups, as train splits them */
    if (lay->sharding >= TPD_DP_SHARDING_OPTIM_GRADS && lay->shard_size > 0 &&
        lay->shard_size < inner && inner % lay->shard_size == 0 &&
        tpd_mesh_set_shard_size(&mesh, lay->shard_size) != TPD_OK)
        return TPD_EXIT_CONFIG;
    /* EP's groups, cut from DP as train cuts them */
    if (lay->ep > 1 && tpd_mesh_set_ep(&mesh, lay->ep) != TPD_OK) return TPD_EXIT_CONFIG;
    print_ranks(stdout, &mesh);
    return TPD_EXIT_OK;
}

static int run_one(const tpd_config *cfg, const tpd_plan_cluster *cl, const tpd_plan_options *opt,
                   const tpd_plan_layout *lay, const plan_args *a) {
    tpd_plan_result *r = malloc(sizeof *r);
    if (!r) return tpd_status_exit_code(tpd_fail_nomem("the plan", sizeof *r));
    int rc = TPD_EXIT_OK;
    if (tpd_plan_evaluate(cfg, cl, lay, opt, r) != TPD_OK) {
        rc = TPD_EXIT_FAILURE;
        goto free_result;
    }
    if (a->json) {
        char *js = tpd_plan_json(cfg, r, 1);
        if (!js) {
            tpd_log_error("plan: cannot build JSON");
            rc = TPD_EXIT_FAILURE;
            goto free_result;
        }
        printf("%s\n", js);
        free(js);
    } else {
        printf("cluster %s (%s), framework %s, %d GPUs, %s\n", cl->name, cl->path,
               cl->framework[0] ? cl->framework : "none", opt->gpus,
               cfg->source_path[0] ? cfg->source_path : "(defaults)");
        tpd_plan_print_breakdown(stdout, r);
        tpd_plan_print_overrides(stdout, cfg, r);
    }
    if (r->stages == 0) {
        tpd_log_error("plan: layout is invalid: %s", r->reject_reason);
        rc = TPD_EXIT_CONFIG;
        goto free_result;
    }
    if (a->trace) {
        if (tpd_plan_write_trace(r, a->trace) != TPD_OK)
            rc = TPD_EXIT_FAILURE;
        else if (!a->json)
            printf("trace: %s (open in https://ui.perfetto.dev)\n", a->trace);
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
        char *js = tpd_plan_json(cfg, s.top, s.n_top);
        if (js) {
            printf("%s\n", js);
            free(js);
        } else {
            rc = TPD_EXIT_FAILURE;
        }
    } else {
        printf("cluster %s (%s), framework %s, %d GPUs, %s\n", cl->name, cl->path,
               cl->framework[0] ? cl->framework : "none", opt->gpus,
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
            tpd_plan_print_overrides(stdout, cfg, &s.top[0]);
            /* a mixture of experts whose best runs EP 1: the fastest with EP beside it */
            if (s.best_ep && s.top[0].layout.ep <= 1) {
                printf("\nbest layout with expert parallelism (EP > 1), %.1f%% slower than the "
                       "best:\n",
                       100.0 * (s.best_ep->step_time_s / s.top[0].step_time_s - 1.0));
                tpd_plan_print_breakdown(stdout, s.best_ep);
            }
        }
        printf("\n");
        tpd_plan_print_rejections(stdout, &s);
    }
    if (a->trace && s.n_top > 0) {
        if (tpd_plan_write_trace(&s.top[0], a->trace) != TPD_OK)
            rc = TPD_EXIT_FAILURE;
        else if (!a->json)
            printf("trace of the best layout: %s\n", a->trace);
    }
    if (s.n_top == 0 && rc == TPD_EXIT_OK) rc = TPD_EXIT_FAILURE;
    tpd_plan_search_free(&s);
    return rc;
}

/* --layout wins over the file: its TP, PP and DP go in as overrides after the user's, and
 * the config is validated with them (a file's PP that does not divide an overridden
 * num_layers is no error when --layout replaces that PP). The file's virtual stages and
 * parallel.pipeline_layers are dropped where they no longer fit the new PP, and its
 * parallel.tp_comm_overlap at TP 1. When the file (with
 * the user's overrides, or alone when those no longer validate without the layout) says
 * another TP/PP/DP, note gets one line saying which was used; "" otherwise. */
static tpd_status load_config(const plan_args *a, tpd_config *cfg, char *note, size_t notelen) {
    const tpd_cli_args *cl = &a->cl;
    note[0] = '\0';
    if (!a->have_layout) return tpd_config_load(cl->config, cl->n_overrides, cl->overrides, cfg);
    enum { MAX_EXTRA = 12 };
    tpd_config *was = malloc(sizeof *was);
    const char **ov = malloc((size_t)(cl->n_overrides + MAX_EXTRA) * sizeof *ov);
    if (!was || !ov) {
        free(was);
        free(ov);
        return tpd_fail_nomem("plan's configs",
                              sizeof *was + (size_t)(cl->n_overrides + MAX_EXTRA) * sizeof *ov);
    }
    /* what the file says, where it still loads: only for the note */
    tpd_log_quiet_begin();
    int with_overrides = tpd_config_load(cl->config, cl->n_overrides, cl->overrides, was) == TPD_OK;
    int known = with_overrides || tpd_config_load(cl->config, 0, NULL, was) == TPD_OK;
    tpd_log_quiet_end();
    char extra[MAX_EXTRA][80], dropped[192] = "";
    int n = 0;
    snprintf(extra[n++], sizeof extra[0], "parallel.tensor_model_parallel_size=%d", a->tp);
    snprintf(extra[n++], sizeof extra[0], "parallel.pipeline_model_parallel_size=%d", a->pp);
    snprintf(extra[n++], sizeof extra[0], "parallel.data_parallel_size=%d", a->dp);
    if (a->cp > 0)
        snprintf(extra[n++], sizeof extra[0], "parallel.context_parallel_size=%d", a->cp);
    if (a->ep > 0)
        snprintf(extra[n++], sizeof extra[0], "parallel.expert_model_parallel_size=%d", a->ep);
    if (known) {
        const tpd_config_parallel *p = &was->parallel;
        int v = p->virtual_pipeline_model_parallel_size;
        if (v > 1 && (a->pp < 2 || (was->model.num_layers % (a->pp * v) != 0 &&
                                    p->num_pipeline_layers != a->pp * v))) {
            snprintf(extra[n++], sizeof extra[0],
                     "parallel.virtual_pipeline_model_parallel_size=1");
            if (p->pipeline_schedule == TPD_SCHEDULE_INTERLEAVED)
                snprintf(extra[n++], sizeof extra[0], "parallel.pipeline_schedule=1f1b");
            snprintf(dropped, sizeof dropped, "; its %d virtual stages are dropped", v);
            v = 1;
        }
        if (p->num_pipeline_layers > 0 && p->num_pipeline_layers != a->pp * v) {
            snprintf(extra[n++], sizeof extra[0], "parallel.pipeline_layers=[]");
            size_t used = strlen(dropped);
            snprintf(dropped + used, sizeof dropped - used,
                     "; its pipeline_layers (%d entries) are dropped", p->num_pipeline_layers);
        }
        if (p->tp_comm_overlap && a->tp < 2) { /* it overlaps TP collectives: none at TP 1 */
            snprintf(extra[n++], sizeof extra[0], "parallel.tp_comm_overlap=false");
            size_t used = strlen(dropped);
            snprintf(dropped + used, sizeof dropped - used,
                     "; its tp_comm_overlap is dropped (TP=1 has no TP communication)");
        }
        /* a hybrid shard group holds whole EP runs: a file's shard groups that do not are
         * dropped under --layout's EP > 1 */
        if (a->ep > 1 && p->data_parallel_shard_size > 0 && p->data_parallel_shard_size % a->ep) {
            snprintf(extra[n++], sizeof extra[0], "parallel.data_parallel_shard_size=0");
            size_t used = strlen(dropped);
            snprintf(dropped + used, sizeof dropped - used,
                     "; its hybrid shard groups of %d are dropped (EP=%d needs groups of whole EP "
                     "runs)",
                     p->data_parallel_shard_size, a->ep);
        }
        int dp_was = p->data_parallel_size, cp_was = tpd_config_cp(was);
        int ep_was = p->expert_model_parallel_size > 1 ? p->expert_model_parallel_size : 1;
        if (p->tensor_model_parallel_size != a->tp || p->pipeline_model_parallel_size != a->pp ||
            (dp_was > 0 && dp_was != a->dp) || (a->cp > 0 && a->cp != cp_was) ||
            (a->ep > 0 && a->ep != ep_was)) {
            char dps[24] = "", cps[48] = "", cpw[48] = "";
            if (dp_was > 0) snprintf(dps, sizeof dps, " DP=%d", dp_was);
            if (a->cp > 1 || cp_was > 1) {
                snprintf(cps, sizeof cps, " CP=%d", a->cp > 0 ? a->cp : cp_was);
                snprintf(cpw, sizeof cpw, " CP=%d", cp_was);
            }
            if (a->ep > 1 || ep_was > 1) {
                size_t c = strlen(cps), w = strlen(cpw);
                snprintf(cps + c, sizeof cps - c, " EP=%d", a->ep > 0 ? a->ep : ep_was);
                snprintf(cpw + w, sizeof cpw - w, " EP=%d", ep_was);
            }
            snprintf(
                note, notelen, "layout: TP=%d PP=%d DP=%d%s from --layout (%s TP=%d PP=%d%s%s%s)",
                a->tp, a->pp, a->dp, cps,
                with_overrides && cl->n_overrides > 0 ? "the file and its overrides say"
                                                      : "the file says",
                p->tensor_model_parallel_size, p->pipeline_model_parallel_size, dps, cpw, dropped);
        }
    }
    for (int i = 0; i < cl->n_overrides; i++)
        ov[i] = cl->overrides[i];
    for (int i = 0; i < n; i++)
        ov[cl->n_overrides + i] = extra[i];
    /* on failure say where the sizes came from: the loader's message names only the keys */
    tpd_log_quiet_begin();
    tpd_status st = tpd_config_load(cl->config, cl->n_overrides + n, ov, cfg);
    tpd_log_quiet_end();
    if (st != TPD_OK && a->ep > 0)
        tpd_log_error("plan: with --layout %d,%d,%d,%d,%d: %s", a->tp, a->pp, a->dp, a->cp, a->ep,
                      tpd_last_error());
    else if (st != TPD_OK && a->cp > 0)
        tpd_log_error("plan: with --layout %d,%d,%d,%d: %s", a->tp, a->pp, a->dp, a->cp,
                      tpd_last_error());
    else if (st != TPD_OK)
        tpd_log_error("plan: with --layout %d,%d,%d: %s", a->tp, a->pp, a->dp, tpd_last_error());
    free(ov);
    free(was);
    return st;
}

int tpd_cli_plan(int argc, char **argv) {
    plan_args a;
    int pr = parse_args(argc, argv, &a);
    if (pr <= 0) {
        tpd_cli_args_free(&a.cl);
        return pr == 0 ? TPD_EXIT_OK : TPD_EXIT_CONFIG;
    }

    tpd_config *cfg = malloc(sizeof *cfg);
    tpd_plan_cluster *cl = malloc(sizeof *cl);
    int rc = TPD_EXIT_OK;
    if (!cfg || !cl) {
        rc = tpd_status_exit_code(
            tpd_fail_nomem("the config and the cluster", sizeof *cfg + sizeof *cl));
        goto free_all;
    }
    char note[256];
    if (load_config(&a, cfg, note, sizeof note) != TPD_OK) {
        rc = TPD_EXIT_CONFIG;
        goto free_all;
    }
    /* JSON on stdout stays JSON: the note goes to stderr there */
    if (note[0]) fprintf(a.json ? stderr : stdout, "%s\n", note);
    const char *cluster = a.cluster                                ? a.cluster
                          : cfg->training.device == TPD_DEVICE_CPU ? "cpu"
                                                                   : "h200";
    if (tpd_plan_cluster_load(cluster, cl) != TPD_OK) {
        rc = TPD_EXIT_CONFIG;
        goto free_all;
    }
    /* the software's costs on top of the hardware's: tripod's own engine unless told */
    if (cl->backend == TPD_PLAN_BACKEND_CUDA || a.framework) {
        tpd_plan_framework *fw = malloc(sizeof *fw);
        if (!fw) {
            rc = tpd_status_exit_code(tpd_fail_nomem("the framework profile", sizeof *fw));
            goto free_all;
        }
        tpd_status fst = tpd_plan_framework_load(a.framework ? a.framework : "tripod", fw);
        if (fst == TPD_OK) tpd_plan_framework_apply(fw, cl);
        free(fw);
        if (fst != TPD_OK) {
            rc = TPD_EXIT_CONFIG;
            goto free_all;
        }
    }
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.top_k = a.top;
    opt.dp_overlap = a.dp_overlap;
    opt.param_gather_overlap = a.param_overlap;
    opt.balance_stages = !a.even_stages;
    /* Default world: what the config states (TP*CP*PP*DP, DP 1 when derived). */
    const tpd_config_parallel *par = &cfg->parallel;
    opt.gpus = a.gpus ? a.gpus
                      : par->tensor_model_parallel_size * par->pipeline_model_parallel_size *
                            tpd_config_cp(cfg) *
                            (par->data_parallel_size > 0 ? par->data_parallel_size : 1);
    tpd_plan_layout lay;
    tpd_plan_layout_from_config(cfg, opt.gpus, &lay);
    if (a.have_layout) {
        lay.tp = a.tp;
        lay.pp = a.pp;
        lay.dp = a.dp;
        lay.sequence_parallel = par->sequence_parallel && lay.tp > 1;
        if (!a.gpus) opt.gpus = a.tp * a.pp * a.dp * (lay.cp > 1 ? lay.cp : 1);
    }
    if (a.ranks) {
        long world = (long)lay.tp * lay.pp * lay.dp * (lay.cp > 1 ? lay.cp : 1);
        if (!a.have_layout && world != opt.gpus && lay.cp > 1) {
            tpd_log_error("plan: %d GPUs is not a multiple of TP*CP*PP = %d", opt.gpus,
                          lay.tp * lay.cp * lay.pp);
            rc = TPD_EXIT_CONFIG;
            goto free_all;
        }
        if (!a.have_layout && world != opt.gpus) {
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
    tpd_cli_args_free(&a.cl);
    return rc;
}
