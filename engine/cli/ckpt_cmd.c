/* `tripod export`, `tripod import` and `tripod inspect`: single-process commands on
 * checkpoints (no MPI). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/interchange.h"
#include "engine/cli/args.h"
#include "engine/cli/cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage:\n"
            "  tripod export CHECKPOINT --format hf|llmc --output PATH [--force]\n"
            "                [--dtype fp32|bf16] [--max-shard-size SIZE]\n"
            "      hf: PATH is a directory (config.json and safetensors: GPT-2 as\n"
            "      GPT2LMHeadModel, the Llama block as LlamaForCausalLM or Qwen2ForCausalLM);\n"
            "      sharded with model.safetensors.index.json above SIZE (bytes, or with\n"
            "      KB/MB/GB/KiB/MiB/GiB; default 5GB); llmc: a file\n"
            "      never inside CHECKPOINT; existing files are replaced only with --force\n"
            "  tripod import PATH --format hf|llmc --output CHECKPOINT_DIR [--layout TP,PP,DP]\n"
            "                [--force]\n"
            "      writes a weights-only tripod checkpoint sharded for the layout (default 1,1,1)\n"
            "      hf: GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM (no sliding\n"
            "      window), Qwen2ForCausalLM; prints the model section for a training config\n"
            "      into a directory that holds no checkpoint (--force: even beside some)\n"
            "  tripod inspect CHECKPOINT\n"
            "      what it holds (iteration, layout, model, files), every file verified\n"
            "CHECKPOINT is a checkpoint directory or a checkpoint.save directory (its latest).\n");
}

typedef struct opts {
    const char *pos, *format, *output, *layout, *dtype, *max_shard;
    int force;
} opts;

/* Each command takes only its own options. */
static const tpd_cli_opt k_export_opts[] = {{"--format", 1}, {"--output", 1},
                                            {"--dtype", 1},  {"--max-shard-size", 1},
                                            {"--force", 0},  {NULL, 0}};
static const tpd_cli_opt k_import_opts[] = {
    {"--format", 1}, {"--output", 1}, {"--layout", 1}, {"--force", 0}, {NULL, 0}};
static const tpd_cli_opt k_inspect_opts[] = {{NULL, 0}};

static void take_opts(const tpd_cli_args *a, opts *o) {
    memset(o, 0, sizeof *o);
    o->pos = a->config;
    for (int i = 0; i < a->n_opts; i++) {
        const char *n = a->opt_name[i], *v = a->opt_value[i];
        if (!strcmp(n, "--format"))
            o->format = v;
        else if (!strcmp(n, "--output"))
            o->output = v;
        else if (!strcmp(n, "--layout"))
            o->layout = v;
        else if (!strcmp(n, "--dtype"))
            o->dtype = v;
        else if (!strcmp(n, "--max-shard-size"))
            o->max_shard = v;
        else if (!strcmp(n, "--force"))
            o->force = 1;
    }
}

/* ---- destinations of export and import: what they may write over ---- */

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A checkpoint (manifest.json) or a save directory (latest, iter_NNNNNNN). */
static int holds_checkpoint(const char *dir) {
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    int found = exists(p);
    snprintf(p, sizeof p, "%s/latest", dir);
    found |= exists(p);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && !found && (e = readdir(d));)
        found = !strncmp(e->d_name, "iter_", 5);
    if (d) closedir(d);
    return found;
}

/* realpath of `path`; for a path that does not exist yet, that of its nearest existing
 * ancestor followed by the rest (export creates the missing directories). */
static int real_dest(const char *path, char *out) {
    char head[PATH_MAX];
    if (snprintf(head, sizeof head, "%s", path) >= (int)sizeof head) return 0;
    size_t len = strlen(head);
    for (;;) {
        if (realpath(len ? head : ".", out)) {
            const char *rest = path + len + (path[len] == '/');
            size_t used = strlen(out);
            return !rest[0] ||
                   snprintf(out + used, PATH_MAX - used, "/%s", rest) < (int)(PATH_MAX - used);
        }
        char *slash = strrchr(head, '/');
        if (!slash) {
            len = 0;
            head[0] = 0;
            continue;
        }
        if (slash == head) return 0; /* "/" always resolves: not reached */
        *slash = 0;
        len = (size_t)(slash - head);
    }
}

/* Where export and import may write: never inside `source` (a checkpoint or its save
 * directory, may be NULL), never over another checkpoint, and over existing files only
 * with --force. `files` lists the names a directory destination receives (NULL: the
 * destination is one file). TPD_ERR_INVALID (logged) when refused. */
static tpd_status check_dest(const char *cmd, const char *dest, const char *source,
                             const char *const *files, int force) {
    char rd[PATH_MAX], rs[PATH_MAX];
    size_t n = source && realpath(source, rs) ? strlen(rs) : 0;
    if (!real_dest(dest, rd))
        return tpd_fail(TPD_ERR_INVALID, "%s: --output %s: its directory does not exist", cmd,
                        dest);
    if (n && !strncmp(rd, rs, n) && (rd[n] == '/' || rd[n] == 0))
        return tpd_fail(TPD_ERR_INVALID,
                        "%s: --output %s is inside %s, which it reads: writing there would "
                        "break it",
                        cmd, dest, source);
    if (force) return TPD_OK;
    if (files && holds_checkpoint(dest))
        return tpd_fail(TPD_ERR_INVALID,
                        "%s: --output %s holds a checkpoint (manifest.json, latest or iter_*) "
                        "of another run; choose an empty directory (--force to write beside it)",
                        cmd, dest);
    for (int i = 0; files ? files[i] != NULL : i == 0; i++) {
        char p[PATH_MAX + 64];
        snprintf(p, sizeof p, "%s%s%s", dest, files ? "/" : "", files ? files[i] : "");
        if (exists(p))
            return tpd_fail(TPD_ERR_INVALID, "%s: %s exists; --force replaces it", cmd, p);
    }
    return TPD_OK;
}

/* The files a Hugging Face export writes besides config.json: model.safetensors, or the
 * index and its model-NNNNN-of-NNNNN.safetensors shards. */
static int hf_weight_file(const char *name) {
    size_t n = strlen(name);
    return !strcmp(name, "model.safetensors") || !strcmp(name, "model.safetensors.index.json") ||
           (!strncmp(name, "model-", 6) && strstr(name, "-of-") && n > 12 &&
            !strcmp(name + n - 12, ".safetensors"));
}

/* Removes from `dest` the weight files of an earlier export that the new one (in `tmp`)
 * does not replace: a single file after a sharded export, or its index and shards, would
 * otherwise sit beside the new weights and be read instead of them. */
static tpd_status remove_stale_export(const char *tmp, const char *dest) {
    DIR *d = opendir(dest);
    if (!d) return TPD_OK; /* nothing there yet */
    tpd_status st = TPD_OK;
    for (struct dirent *e; st == TPD_OK && (e = readdir(d));) {
        char mine[PATH_MAX + 256], old[PATH_MAX + 256];
        if (!hf_weight_file(e->d_name) ||
            snprintf(mine, sizeof mine, "%s/%s", tmp, e->d_name) >= (int)sizeof mine ||
            snprintf(old, sizeof old, "%s/%s", dest, e->d_name) >= (int)sizeof old)
            continue;
        if (!exists(mine) && unlink(old) != 0)
            st = tpd_fail(TPD_ERR_IO, "export: cannot remove %s of the earlier export: %s", old,
                          strerror(errno));
    }
    closedir(d);
    return st;
}

/* Moves what an export wrote under `tmp` into `dest`: a file is renamed, a directory's
 * files one by one (each rename atomic: a reader sees the old file or the new one). */
static tpd_status commit_export(const char *tmp, const char *dest, int dir) {
    if (!dir) return rename(tmp, dest) == 0 ? TPD_OK : TPD_ERR_IO;
    int e = 0;
    if (tpd_file_mkdirs(dest, &e) != TPD_OK) return TPD_ERR_IO;
    TPD_CHECK(remove_stale_export(tmp, dest));
    DIR *d = opendir(tmp);
    tpd_status st = d ? TPD_OK : TPD_ERR_IO;
    for (struct dirent *e; d && st == TPD_OK && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char from[PATH_MAX + 256], to[PATH_MAX + 256];
        if (snprintf(from, sizeof from, "%s/%s", tmp, e->d_name) >= (int)sizeof from ||
            snprintf(to, sizeof to, "%s/%s", dest, e->d_name) >= (int)sizeof to ||
            rename(from, to) != 0)
            st = TPD_ERR_IO;
    }
    if (d) closedir(d);
    if (st == TPD_OK) rmdir(tmp);
    return st;
}

/* Removes an export's private temporary folder and what is left in it (the llm.c file,
 * or the Hugging Face folder's files), so a failed export leaves nothing behind. */
static void remove_export_tmp(const char *tmp) {
    char p[PATH_MAX + 256];
    snprintf(p, sizeof p, "%s/out", tmp);
    DIR *d = opendir(p);
    for (struct dirent *e; d && (e = readdir(d));) {
        char f[2 * PATH_MAX + 256];
        if (e->d_name[0] == '.') continue;
        if (snprintf(f, sizeof f, "%s/%s", p, e->d_name) < (int)sizeof f) unlink(f);
    }
    if (d) closedir(d);
    if (rmdir(p) != 0) unlink(p);
    rmdir(tmp);
}

/* An export never lands among a checkpoint's own files: the nearest existing folder above
 * the output must not be a checkpoint or a save folder (SAVE/latest, SAVE/iter_N/...),
 * --force or not. */
static tpd_status check_not_in_checkpoint(const char *dest) {
    char rd[PATH_MAX];
    if (!real_dest(dest, rd)) return TPD_OK; /* check_dest reports it */
    for (char *slash; (slash = strrchr(rd, '/')) != NULL;) {
        if (slash == rd)
            slash[1] = 0;
        else
            *slash = 0;
        struct stat sb;
        if (stat(rd, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (holds_checkpoint(rd))
            return tpd_fail(TPD_ERR_INVALID,
                            "export: --output %s is inside %s, which holds a checkpoint "
                            "(manifest.json, latest or iter_*): the export would land among "
                            "its files; choose a folder outside it",
                            dest, rd);
        break;
    }
    return TPD_OK;
}

/* "5GB", "500MiB", "1000000": bytes; 0 when malformed. */
static uint64_t parse_size(const char *s) {
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1e3},
                 {"MB", 1e6},
                 {"GB", 1e9},
                 {"TB", 1e12},
                 {"KiB", 1024.0},
                 {"MiB", 1048576.0},
                 {"GiB", 1073741824.0},
                 {"TiB", 1099511627776.0}};
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || !(v > 0)) return 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].suffix)) {
            double b = v * units[i].mult;
            return b >= 1 && b < 1.8e19 ? (uint64_t)b : 0;
        }
    return 0;
}

static int cmd_export(const opts *o) {
    int hf = o->format && !strcmp(o->format, "hf"), llmc = o->format && !strcmp(o->format, "llmc");
    if ((!hf && !llmc) || !o->output) {
        tpd_log_error("export needs --format hf|llmc and --output PATH");
        return TPD_EXIT_CONFIG;
    }
    tpd_hf_export xo = TPD_HF_EXPORT_INIT;
    if (o->dtype && strcmp(o->dtype, "fp32") && strcmp(o->dtype, "bf16")) {
        tpd_log_error("--dtype '%s': expected fp32 or bf16", o->dtype);
        return TPD_EXIT_CONFIG;
    }
    xo.bf16 = o->dtype && !strcmp(o->dtype, "bf16");
    if (o->max_shard && !(xo.max_shard_bytes = parse_size(o->max_shard))) {
        tpd_log_error("--max-shard-size '%s': expected a positive size such as 5GB, 500MiB "
                      "or 1000000",
                      o->max_shard);
        return TPD_EXIT_CONFIG;
    }
    if (llmc && (o->dtype || o->max_shard)) {
        tpd_log_error("--dtype and --max-shard-size apply to --format hf");
        return TPD_EXIT_CONFIG;
    }
    tpd_ckpt_info info;
    float *w[TPD_P_COUNT];
    static const char *const hf_files[] = {"model.safetensors", "config.json", NULL};
    tpd_status st = check_dest("export", o->output, o->pos, hf ? hf_files : NULL, o->force);
    if (st == TPD_OK) st = check_not_in_checkpoint(o->output);
    if (st != TPD_OK) return tpd_status_exit_code(st);
    st = tpd_ckpt_open_weights(o->pos, &info);
    if (st != TPD_OK) return tpd_status_exit_code(st);
    st = check_dest("export", o->output, info.dir, hf ? hf_files : NULL, o->force);
    if (st != TPD_OK) {
        tpd_ckpt_close(&info);
        return tpd_status_exit_code(st);
    }
    /* written in a folder of its own beside the output (a unique name: never a user's
     * file) and moved into place when complete */
    char tmp[PATH_MAX + 16], out[PATH_MAX + 32];
    int err = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", o->output);
    if (tpd_file_mkdirs_parent(o->output, &err) != TPD_OK || !mkdtemp(tmp)) {
        st = tpd_fail(TPD_ERR_IO, "export: cannot create a temporary folder beside %s: %s",
                      o->output, strerror(err ? err : errno));
        tpd_ckpt_close(&info);
        return tpd_status_exit_code(st);
    }
    snprintf(out, sizeof out, "%s/out", tmp);
    st = tpd_ckpt_read_weights(&info, w);
    if (st == TPD_OK) {
        st = hf ? tpd_ckpt_export_hf(&info.cfg, w, out, &xo)
                : tpd_ckpt_export_llmc(&info.cfg, w, out);
        tpd_ckpt_free_weights(w);
        if (st == TPD_OK && commit_export(out, o->output, hf) != TPD_OK)
            st = tpd_fail(TPD_ERR_IO, "export: cannot move %s into place as %s", out, o->output);
    }
    remove_export_tmp(tmp);
    if (st == TPD_OK)
        printf("exported %s (iteration %d, %d layers, hidden %d) to %s%s\n", info.dir,
               info.iteration, info.cfg.model.num_layers, info.cfg.model.hidden_size, o->output,
               hf ? " (config.json and safetensors)" : " (llm.c model file)");
    tpd_ckpt_close(&info);
    return tpd_status_exit_code(st);
}

/* The model section a training config needs to load the import (checkpoint.load with
 * checkpoint.finetune), as YAML. */
static void print_model_section(const tpd_config *cfg) {
    const tpd_config_model *m = &cfg->model;
    int rope = m->position_embedding_type == TPD_POS_ROPE;
    char eps[32], base[32], f[3][32];
    tpd_ckpt_format_value(m->norm_epsilon, eps, sizeof eps);
    tpd_ckpt_format_value(m->rotary_base, base, sizeof base);
    tpd_ckpt_format_value(m->rope_scaling_factor, f[0], sizeof f[0]);
    tpd_ckpt_format_value(m->rope_scaling_low_freq_factor, f[1], sizeof f[1]);
    tpd_ckpt_format_value(m->rope_scaling_high_freq_factor, f[2], sizeof f[2]);
    printf("model section for a training config (set seq_length to the length you train at):\n"
           "model:\n  num_layers: %d\n  hidden_size: %d\n  num_attention_heads: %d\n"
           "  ffn_hidden_size: %d\n  vocab_size: %d\n  max_position_embeddings: %d\n"
           "  norm_epsilon: %s\n",
           m->num_layers, m->hidden_size, m->num_attention_heads, m->ffn_hidden_size, m->vocab_size,
           m->max_position_embeddings, eps);
    if (m->normalization == TPD_NORM_LAYERNORM && !rope) return; /* GPT-2: the defaults */
    printf("  normalization: RMSNorm\n  position_embedding_type: rope\n"
           "  rotary_base: %s\n  swiglu: true\n  group_query_attention: %s\n"
           "  num_query_groups: %d\n  untie_embeddings_and_output_weights: %s\n"
           "  add_bias_linear: %s\n  add_qkv_bias: %s\n",
           base, m->group_query_attention ? "true" : "false", tpd_config_kv_heads(cfg),
           m->untie_embeddings_and_output_weights ? "true" : "false",
           m->add_bias_linear ? "true" : "false", m->add_qkv_bias ? "true" : "false");
    if (m->qk_layernorm) printf("  qk_layernorm: true\n");
    if (m->kv_channels) printf("  kv_channels: %d\n", m->kv_channels);
    if (m->num_moe_experts > 0) {
        char aux[32];
        tpd_ckpt_format_value(m->moe_aux_loss_coeff, aux, sizeof aux);
        printf("  num_moe_experts: %d\n  moe_router_topk: %d\n  moe_ffn_hidden_size: %d\n"
               "  moe_shared_expert_intermediate_size: %d\n  moe_shared_expert_gate: %s\n"
               "  moe_router_pre_softmax: %s\n  moe_norm_topk_prob: %s\n"
               "  moe_aux_loss_coeff: %s\n",
               m->num_moe_experts, m->moe_router_topk, tpd_config_moe_ffn(cfg),
               m->moe_shared_expert_intermediate_size, m->moe_shared_expert_gate ? "true" : "false",
               m->moe_router_pre_softmax ? "true" : "false",
               m->moe_norm_topk_prob ? "true" : "false", aux);
    }
    if (m->rope_scaling)
        printf("  rope_scaling: true\n  rope_scaling_factor: %s\n"
               "  rope_scaling_low_freq_factor: %s\n  rope_scaling_high_freq_factor: %s\n"
               "  rope_scaling_original_max_position_embeddings: %d\n",
               f[0], f[1], f[2], m->rope_scaling_original_max_position_embeddings);
}

static int cmd_import(const opts *o) {
    int hf = o->format && !strcmp(o->format, "hf"), llmc = o->format && !strcmp(o->format, "llmc");
    int tp = 1, pp = 1, dp = 1;
    if ((!hf && !llmc) || !o->output) {
        tpd_log_error("import needs --format hf|llmc and --output DIR");
        return TPD_EXIT_CONFIG;
    }
    int v[3] = {1, 1, 1}, n;
    if (o->layout && tpd_cli_int_list("import", "--layout", o->layout, 1, 1 << 20, 3, 3, v, &n))
        return TPD_EXIT_CONFIG;
    tp = v[0], pp = v[1], dp = v[2];
    if (tp > 4096 || pp > 256) {
        tpd_log_error("--layout '%s': expected TP,PP,DP (e.g. 2,2,1; TP <= 4096, PP <= 256, "
                      "DP <= 1048576)",
                      o->layout);
        return TPD_EXIT_CONFIG;
    }
    static const char *const ckpt_files[] = {"manifest.json", NULL};
    tpd_status st = check_dest("import", o->output, NULL, ckpt_files, o->force);
    if (st != TPD_OK) return tpd_status_exit_code(st);
    tpd_config cfg;
    float *w[TPD_P_COUNT];
    st = hf ? tpd_ckpt_import_hf(o->pos, &cfg, w) : tpd_ckpt_import_llmc(o->pos, &cfg, w);
    if (st != TPD_OK) return tpd_status_exit_code(st);
    const tpd_config_model *m = &cfg.model;
    if (m->num_attention_heads % tp || tpd_config_kv_heads(&cfg) % tp || m->num_layers % pp) {
        tpd_log_error("--layout %d,%d,%d: %d heads, %d K/V heads and %d layers must divide by "
                      "TP and PP",
                      tp, pp, dp, m->num_attention_heads, tpd_config_kv_heads(&cfg), m->num_layers);
        tpd_ckpt_free_weights(w);
        return TPD_EXIT_CONFIG;
    }
    st = tpd_ckpt_write_weights(&cfg, tp, pp, dp, w, o->output);
    tpd_ckpt_free_weights(w);
    if (st == TPD_OK)
        printf("imported %s: %d layers, hidden %d, heads %d, vocab %d, positions %d -> %s "
               "(weights only, layout TP %d PP %d DP %d)\n",
               o->pos, m->num_layers, m->hidden_size, m->num_attention_heads, m->vocab_size,
               m->max_position_embeddings, o->output, tp, pp, dp);
    if (st == TPD_OK) print_model_section(&cfg);
    return tpd_status_exit_code(st);
}

/* `tripod inspect CHECKPOINT`: what a checkpoint holds, after verifying every file. */
static int cmd_inspect(const opts *o) {
    tpd_ckpt_info info;
    tpd_status st = tpd_ckpt_open(o->pos, &info);
    if (st != TPD_OK) return tpd_status_exit_code(st);
    const tpd_config_model *m = &info.cfg.model;
    uint64_t bytes = info.file_bytes;
    printf("checkpoint %s\n", info.dir);
    printf("  iteration %d, consumed samples %llu, skipped iterations %d%s\n", info.iteration,
           (unsigned long long)info.consumed_samples, info.skipped_iterations,
           info.weights_only ? " (weights only: imported)" : "");
    printf("  written by TP %d x PP %d x DP %d, ZeRO-1 %s; holds %s%s%s\n", info.tp, info.pp,
           info.dp, info.zero ? "on" : "off", "parameters",
           info.has_kind[TPD_CKPT_EXP_AVG] ? ", AdamW state" : "",
           info.has_kind[TPD_CKPT_MASTER] ? ", fp32 master weights" : "");
    printf("  model: %d layers, hidden %d, %d heads, ffn %d, vocab %d, positions %d\n",
           m->num_layers, m->hidden_size, m->num_attention_heads, m->ffn_hidden_size, m->vocab_size,
           m->max_position_embeddings);
    printf("  %d files, %.1f MiB, every SHA-256 verified\n", info.nfiles,
           (double)bytes / 1048576.0);
    tpd_ckpt_close(&info);
    return TPD_EXIT_OK;
}

int tpd_cli_ckpt(int argc, char **argv) {
    const char *cmd = argv[0];
    const tpd_cli_opt *table = !strcmp(cmd, "export")   ? k_export_opts
                               : !strcmp(cmd, "import") ? k_import_opts
                                                        : k_inspect_opts;
    tpd_cli_args a;
    if (tpd_cli_args_parse_path(cmd, argc - 1, argv + 1, table, &a) != TPD_OK) {
        usage(stderr);
        return TPD_EXIT_CONFIG;
    }
    opts o;
    take_opts(&a, &o);
    int help = a.help;
    tpd_cli_args_free(&a); /* o points into argv, not into a */
    if (help) {
        usage(stdout);
        return TPD_EXIT_OK;
    }
    if (!o.pos) {
        tpd_log_error("%s needs a path", cmd);
        usage(stderr);
        return TPD_EXIT_CONFIG;
    }
    if (!strcmp(cmd, "export")) return cmd_export(&o);
    if (!strcmp(cmd, "import")) return cmd_import(&o);
    return cmd_inspect(&o);
}
