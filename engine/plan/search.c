/* The layout search: enumerate TP x CP (and its communication) x PP x DP x micro-batch x
 * virtual stages x recompute x SP x the DP sharding strategy and shard size x EP, reject invalid
 * ones with a reason, prune on memory, then skip the time model when a cheap lower bound (no
 * pipeline bubble) is already slower than the K-th best, and keep the K best by step time.
 *
 * EP (a mixture of experts only) is searched over the divisors of DP that divide the experts,
 * without DP sharding or DiLoCo, which the trainer's EP does not run (tpd_plan_layout_valid
 * rejects those pairs; the search does not try them).
 *
 * CP is searched wherever it is valid (CP dividing the GPUs left by TP, seq_length a multiple
 * of 2 x CP; a2a beside p2p where the heads and K/V heads divide by TP x CP; an even CP at
 * micro-batch 1, which loses nothing, see the micro-batch loop), with no threshold on the
 * sequence: at short sequences it loses on its own terms (the ring's K/V
 * transfers outlast the small attention blocks they hide behind, the all-to-alls are never
 * hidden), and at long ones it wins on memory (1/CP of the activations) and on the
 * pipeline (CP takes ranks from DP, so each pipeline runs CP times the micro-batches). */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include <stdlib.h>
#include <string.h>

/* Groups a rejection under `key`, keeping a few examples. */
static void reject(tpd_plan_search *s, const char *key, const tpd_plan_layout *lay,
                   const char *why) {
    s->rejected++;
    int i = 0;
    while (i < s->n_reasons && strcmp(s->reasons[i].key, key) != 0)
        i++;
    if (i == s->n_reasons) {
        if (s->n_reasons == TPD_PLAN_MAX_REASONS)
            i = TPD_PLAN_MAX_REASONS - 1;
        else
            s->n_reasons++;
        if (s->reasons[i].count == 0)
            snprintf(s->reasons[i].key, sizeof s->reasons[i].key, "%s", key);
    }
    tpd_plan_reject_class *rc = &s->reasons[i];
    rc->count++;
    if (rc->n_examples < TPD_PLAN_MAX_EXAMPLES) {
        char l[128];
        tpd_plan_layout_str(lay, l, sizeof l);
        snprintf(rc->examples[rc->n_examples++], sizeof rc->examples[0], "%s: %s", l, why);
    }
}

/* The key a reason is counted under: its text with every number replaced by N, so
 * "layers 96 not divisible by PP 5" and "... PP 7" count together. */
static void reason_key(const char *why, char *key, size_t len) {
    if (strncmp(why, "OOM", 3) == 0) {
        snprintf(key, len, "out of memory");
        return;
    }
    size_t n = 0;
    for (const char *c = why; *c && n + 1 < len; c++) {
        int digit = *c >= '0' && *c <= '9';
        if (digit && c > why && c[-1] >= '0' && c[-1] <= '9') continue;
        if (*c == '(') break; /* the explanation in parentheses is not part of the key */
        key[n++] = digit ? 'N' : *c;
    }
    while (n > 0 && key[n - 1] == ' ')
        n--;
    key[n] = '\0';
}

/* Inserts r into the best-first list if it is among the K fastest. */
static void keep_top(tpd_plan_search *s, int k, const tpd_plan_result *r) {
    int pos = s->n_top;
    while (pos > 0 && s->top[pos - 1].step_time_s > r->step_time_s)
        pos--;
    if (pos >= k) return;
    int n = s->n_top < k ? s->n_top + 1 : k;
    memmove(&s->top[pos + 1], &s->top[pos], (size_t)(n - 1 - pos) * sizeof *s->top);
    s->top[pos] = *r;
    s->n_top = n;
}

static int divides(long a, long b) {
    return b % a == 0;
}

tpd_status tpd_plan_search_run(const tpd_config *cfg, const tpd_plan_cluster *cl,
                               const tpd_plan_options *opt, tpd_plan_search *search_p) {
    memset(search_p, 0, sizeof *search_p);
    tpd_status st = TPD_OK;
    tpd_plan_search s;
    memset(&s, 0, sizeof s);
    int k = opt->top_k > 0 ? opt->top_k : 10, n = opt->gpus;
    const tpd_config_model *m = &cfg->model;
    long gbs = cfg->training.global_batch_size;
    const int E = m->num_moe_experts, diloco = cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO;
    /* what every layout takes from the config: its schedule when it runs one chunk per
     * stage (1f1b or zb-h1; more chunks run interleaved), and the overlap flags (or the
     * options' when they say) */
    tpd_plan_layout from_cfg;
    tpd_plan_layout_from_config(cfg, n, &from_cfg);
    tpd_schedule one_chunk = cfg->parallel.pipeline_schedule == TPD_SCHEDULE_ZB_H1
                                 ? TPD_SCHEDULE_ZB_H1
                                 : TPD_SCHEDULE_1F1B;
    int ovl_grad = opt->dp_overlap >= 0 ? opt->dp_overlap : from_cfg.overlap_grad_reduce;
    int ovl_param =
        opt->param_gather_overlap >= 0 ? opt->param_gather_overlap : from_cfg.overlap_param_gather;
    s.top = calloc((size_t)k + 1, sizeof *s.top);
    s.best_ep = E > 1 ? calloc(1, sizeof *s.best_ep) : NULL;
    tpd_plan_result *r = malloc(sizeof *r);
    tpd_config *scratch = malloc(sizeof *scratch); /* a layout's config with its split */
    if (!s.top || !r || !scratch || (E > 1 && !s.best_ep))
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_all, "plan: out of memory");
    if (n < 1) TPD_FAIL_GOTO(TPD_ERR_INVALID, st, free_all, "plan: --gpus must be >= 1");

    char why[192], key[sizeof s.reasons[0].key];
    /* (strategy, over all of DP or HSDP) pairs: the cpu backend trains optim at most, and
     * tpd_plan_layout_valid says why the rest are left out */
    const int n_shard = 2 * (TPD_DP_SHARDING_OPTIM_GRADS_PARAMS + 1);
    for (int tp = 1; tp <= cl->gpus_per_node && tp <= n; tp++) {
        if (!divides(tp, cl->gpus_per_node) || !divides(tp, n)) continue;
        tpd_plan_layout base = {tp,
                                1,
                                1,
                                1,
                                1,
                                TPD_RECOMPUTE_NONE,
                                0,
                                0,
                                one_chunk,
                                ovl_grad,
                                ovl_param,
                                0,
                                TPD_DP_SHARDING_NO_SHARD,
                                0,
                                1,
                                TPD_CP_COMM_P2P,
                                1};
        if (m->num_attention_heads % tp != 0 ||
            (m->group_query_attention && m->num_query_groups % tp != 0)) {
            (void)tpd_plan_layout_valid(cfg, cl, &base, 0, why, sizeof why);
            reason_key(why, key, sizeof key);
            reject(&s, key, &base, why);
            continue;
        }
        /* CP 1, then each CP > 1 with p2p and a2a (cm = 2*cp + comm) */
        for (int cm = 2; cm <= 2 * (n / tp) + 1; cm++) {
            int cp = cm / 2;
            tpd_cp_comm comm = cm % 2 ? TPD_CP_COMM_A2A : TPD_CP_COMM_P2P;
            if (!divides((long)tp * cp, n) || (cp == 1 && comm != TPD_CP_COMM_P2P)) continue;
            base.cp = cp;
            base.cp_comm = comm;
            base.pp = 1;
            base.dp = n / (tp * cp);
            if (cp > 1 && E > 0) {
                /* tripod train refuses a mixture with CP (the load-balancing loss is a
                 * micro-batch's, which CP splits): the search does not assume it */
                snprintf(why, sizeof why,
                         "CP %d with a mixture of experts (tripod train refuses MoE with "
                         "context parallelism)",
                         cp);
                reason_key(why, key, sizeof key);
                reject(&s, key, &base, why);
                continue;
            }
            if (cp > 1 && (m->seq_length % (2 * cp) ||
                           (comm == TPD_CP_COMM_A2A && (m->num_attention_heads % (tp * cp) ||
                                                        tpd_config_kv_heads(cfg) % (tp * cp))))) {
                if (!tpd_plan_layout_valid(cfg, cl, &base, n, why, sizeof why)) {
                    reason_key(why, key, sizeof key);
                    reject(&s, key, &base, why);
                }
                continue;
            }
            for (int pp = 1; pp <= n / (tp * cp) && pp <= TPD_CONFIG_MAX_STAGES; pp++) {
                if (!divides((long)tp * cp * pp, n)) continue;
                base.pp = pp;
                base.dp = n / (tp * cp * pp);
                base.micro_batch_size = 1;
                base.virtual_stages = 1;
                if (tpd_config_stage_layers(cfg, pp, 1, 0, 0, NULL) < 0) {
                    snprintf(why, sizeof why, "layers %d fewer than PP %d", m->num_layers, pp);
                    reason_key(why, key, sizeof key);
                    reject(&s, key, &base, why);
                    continue;
                }
                int dp = n / (tp * cp * pp), inner = dp * cp;
                /* an even CP runs at micro-batch 1 only: CP c at 2m sequences a micro-batch
                 * is CP c/2 with twice the DP at m (the same tokens and attention per rank,
                 * micro-batches, weights and DP x CP group), with half the ring's sends */
                int mbs_max = cp > 1 && cp % 2 == 0 ? 1 : (int)(gbs / dp);
                for (int mbs = 1; mbs <= mbs_max; mbs *= 2) {
                    base.micro_batch_size = mbs;
                    base.virtual_stages = 1;
                    base.schedule = one_chunk;
                    if (gbs % ((long)mbs * dp) != 0) {
                        snprintf(why, sizeof why, "global batch %ld not divisible by mbs*dp %d*%d",
                                 gbs, mbs, dp);
                        reason_key(why, key, sizeof key);
                        reject(&s, key, &base, why);
                        continue;
                    }
                    for (int v = 1; v <= (pp > 1 ? 8 : 1); v++) {
                        base.virtual_stages = v;
                        base.schedule = v > 1 ? TPD_SCHEDULE_INTERLEAVED : one_chunk;
                        if (v > 1 && !tpd_plan_layout_valid(cfg, cl, &base, n, why, sizeof why)) {
                            /* the usual v (2, 3, 4) always, larger ones when the layers divide */
                            if (m->num_layers % (pp * v) == 0 || v == 2 || v == 3 || v == 4) {
                                reason_key(why, key, sizeof key);
                                reject(&s, key, &base, why);
                            }
                            continue;
                        }
                        for (int rc = 0; rc <= 2; rc++)
                            for (int sp = 0; sp <= (tp > 1 ? 1 : 0); sp++)
                                for (int z = 0; z < (inner > 1 ? n_shard : 1); z++) {
                                    /* the ring keeps its attention state whole: selective
                                     * recompute is recompute none there, searched once */
                                    if (rc == TPD_RECOMPUTE_SELECTIVE && cp > 1 &&
                                        comm == TPD_CP_COMM_P2P)
                                        continue;
                                    /* SP splits the sequence (a CP rank's share) over TP */
                                    if (sp && (m->seq_length / cp) % tp) continue;
                                    tpd_plan_layout lay = base;
                                    lay.recompute = (tpd_recompute)rc;
                                    lay.sequence_parallel = sp;
                                    /* the strategies, each over all of DP and, where a node's
                                     * GPUs / TP is a smaller divisor, over that (HSDP) */
                                    lay.sharding = (tpd_dp_sharding)(z / 2);
                                    lay.distributed_optimizer =
                                        lay.sharding != TPD_DP_SHARDING_NO_SHARD;
                                    lay.shard_size = 0;
                                    if (z % 2) {
                                        int hs = cl->gpus_per_node / tp,
                                            ranks = tpd_plan_dp_inner(cfg, &lay);
                                        if (lay.sharding == TPD_DP_SHARDING_NO_SHARD || hs < 2 ||
                                            hs >= ranks || ranks % hs)
                                            continue;
                                        lay.shard_size = hs;
                                    }
                                    /* TP overlap only where the config asks for it */
                                    lay.tp_comm_overlap = cfg->parallel.tp_comm_overlap && sp;
                                    for (int ep = 1; ep <= dp; ep++) {
                                        /* EP over the divisors of DP that divide the experts (1 for
                                         * a dense model), under every strategy (HSDP's shard
                                         * groups holding whole EP runs), every step (what the
                                         * trainer's EP runs) */
                                        if (dp % ep || (ep > 1 && (E < 1 || E % ep || diloco ||
                                                                   (lay.shard_size > 0 &&
                                                                    lay.shard_size % ep))))
                                            continue;
                                        lay.ep = ep;
                                        if (!tpd_plan_layout_valid(cfg, cl, &lay, n, why,
                                                                   sizeof why)) {
                                            reason_key(why, key, sizeof key);
                                            reject(&s, key, &lay, why);
                                            continue;
                                        }
                                        memset(r, 0, sizeof *r);
                                        r->layout = lay;
                                        const tpd_config *c;
                                        TPD_CHECK_GOTO(
                                            tpd_plan_memory_split(cfg, cl, opt, r, scratch, &c), st,
                                            free_all);
                                        s.evaluated++;
                                        if (!r->fits) {
                                            reject(&s, "out of memory", &lay, r->reject_reason);
                                            continue;
                                        }
                                        s.fitting++;
                                        /* full recompute of fewer layers, when that fits */
                                        TPD_CHECK_GOTO(
                                            tpd_plan_fit_recompute_layers(cfg, cl, r, scratch), st,
                                            free_all);
                                        c = tpd_plan_result_config(cfg, r, scratch);
                                        if (!opt->evaluate_time) continue;
                                        /* an EP layout is also kept when it is the fastest with
                                         * EP, so it is pruned only when it can be neither */
                                        if (s.n_top == k) {
                                            double lb = tpd_plan_time_lower_bound(c, cl, r, opt);
                                            int ep_bar = ep == 1 || (s.best_ep->stages &&
                                                                     lb >= s.best_ep->step_time_s);
                                            if (lb >= s.top[k - 1].step_time_s && ep_bar) {
                                                s.pruned++;
                                                continue;
                                            }
                                        }
                                        TPD_CHECK_GOTO(
                                            tpd_plan_time_split(cfg, cl, opt, 0, r, scratch), st,
                                            free_all);
                                        s.timed++;
                                        keep_top(&s, k, r);
                                        if (ep > 1 && (!s.best_ep->stages ||
                                                       r->step_time_s < s.best_ep->step_time_s))
                                            *s.best_ep = *r;
                                    }
                                }
                    }
                }
            }
        }
    }
    /* Reports show the bubble and p2p apart: rerun the kept few with both simulations. */
    for (int i = 0; i < s.n_top; i++)
        TPD_CHECK_GOTO(tpd_plan_time_evaluate(tpd_plan_result_config(cfg, &s.top[i], scratch), cl,
                                              opt, 1, &s.top[i]),
                       st, free_all);
    if (s.best_ep && !s.best_ep->stages) { /* no EP layout was timed */
        free(s.best_ep);
        s.best_ep = NULL;
    }
    if (s.best_ep)
        TPD_CHECK_GOTO(tpd_plan_time_evaluate(tpd_plan_result_config(cfg, s.best_ep, scratch), cl,
                                              opt, 1, s.best_ep),
                       st, free_all);
    free(scratch);
    free(r);
    *search_p = s;
    return TPD_OK;
free_all:
    free(scratch);
    free(r);
    free(s.top);
    free(s.best_ep);
    return st;
}

void tpd_plan_search_free(tpd_plan_search *s) {
    if (!s) return;
    free(s->top);
    free(s->best_ep);
    s->top = NULL;
    s->best_ep = NULL;
    s->n_top = 0;
}
