/* `tripod export`, `tripod import` and `tripod generate`: single-process commands on
 * checkpoints (no MPI). */
#include <dirent.h>
#include <limits.h>
#include <signal.h>
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
#include "engine/cli/tokenizer_opts.h"
#include "engine/data/data.h"
#include "engine/generate/generate.h"
#include "engine/train/signals.h"

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
            "  tripod generate CHECKPOINT [--prompt TEXT] [--max-new-tokens N]\n"
            "                  [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
            "                  [--stop-at-eod] [--no-kv-cache] [--device cpu|cuda]\n"
            "                  [--vocab-file vocab.json --merge-file merges.txt]\n"
            "                  [--tokenizer-type HuggingFaceTokenizer\n"
            "                   --tokenizer-model tokenizer.json]\n"
            "      --vocab-file/--merge-file: GPT-2 BPE text; --tokenizer-model: a Hugging\n"
            "      Face tokenizer.json (byte-level BPE; the prompt gets its BOS); bytes\n"
            "      without them\n"
            "      --no-kv-cache: a full forward over the last seq_length tokens per token\n"
            "      --device: the backend (default cpu; cuda: GPU 0, in the run's precision)\n"
            "  tripod inspect CHECKPOINT\n"
            "      what it holds (iteration, layout, model, files), every file verified\n"
            "CHECKPOINT is a checkpoint directory or a checkpoint.save directory (its latest).\n");
}

typedef struct opts {
    const char *pos, *format, *output, *layout, *prompt, *dtype, *max_shard, *device;
    tpd_cli_tok tok;
    int max_new, top_k, no_kv_cache, stop_at_eod, force;
    double temperature, top_p;
    uint64_t seed;
} opts;

static int parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->prompt = "";
    o->max_new = 64;
    o->temperature = 1.0;
    o->top_p = 1.0;
    o->seed = 1234;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (a[0] != '-' || !a[1]) {
            if (o->pos) {
                fprintf(stderr, "tripod: error: unexpected argument '%s'\n", a);
                return -1;
            }
            o->pos = a;
            continue;
        }
        if (!strcmp(a, "--no-kv-cache") || !strcmp(a, "--stop-at-eod") || !strcmp(a, "--force")) {
            *(a[2] == 'n' ? &o->no_kv_cache : a[2] == 's' ? &o->stop_at_eod : &o->force) = 1;
            continue;
        }
        int took = tpd_cli_tok_arg(&o->tok, argv[0], argc, argv, &i);
        if (took) {
            if (took < 0) return -1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "tripod: error: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--format"))
            o->format = v;
        else if (!strcmp(a, "--output"))
            o->output = v;
        else if (!strcmp(a, "--layout"))
            o->layout = v;
        else if (!strcmp(a, "--dtype"))
            o->dtype = v;
        else if (!strcmp(a, "--max-shard-size"))
            o->max_shard = v;
        else if (!strcmp(a, "--device"))
            o->device = v;
        else if (!strcmp(a, "--prompt"))
            o->prompt = v;
        else if (!strcmp(a, "--max-new-tokens") || !strcmp(a, "--top-k")) {
            if (tpd_cli_int(argv[0], a, v, 0, 1 << 24, a[2] == 'm' ? &o->max_new : &o->top_k))
                return -1;
        } else if (!strcmp(a, "--temperature") || !strcmp(a, "--top-p")) {
            /* top-p 0 is refused below, with the rule (0, 1] */
            if (tpd_cli_double(argv[0], a, v, 0, a[3] == 'e' ? 1e6 : 1,
                               a[3] == 'e' ? &o->temperature : &o->top_p))
                return -1;
        } else if (!strcmp(a, "--seed")) {
            if (tpd_cli_u64(argv[0], a, v, &o->seed)) return -1;
        } else {
            fprintf(stderr, "tripod: error: unknown option '%s'\n", a);
            return -1;
        }
    }
    if (!o->pos) {
        fprintf(stderr, "tripod: error: %s needs a path\n", argv[0]);
        return -1;
    }
    return 0;
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
 * destination is one file). 0 when allowed; else the message is printed. */
static int check_dest(const char *cmd, const char *dest, const char *source,
                      const char *const *files, int force) {
    char rd[PATH_MAX], rs[PATH_MAX];
    size_t n = source && realpath(source, rs) ? strlen(rs) : 0;
    if (!real_dest(dest, rd)) {
        fprintf(stderr, "tripod: error: %s: --output %s: its directory does not exist\n", cmd,
                dest);
        return -1;
    }
    if (n && !strncmp(rd, rs, n) && (rd[n] == '/' || rd[n] == 0)) {
        fprintf(stderr,
                "tripod: error: %s: --output %s is inside %s, which it reads: writing there "
                "would break it\n",
                cmd, dest, source);
        return -1;
    }
    if (force) return 0;
    if (files && holds_checkpoint(dest)) {
        fprintf(stderr,
                "tripod: error: %s: --output %s holds a checkpoint (manifest.json, latest or "
                "iter_*) of another run; choose an empty directory (--force to write beside "
                "it)\n",
                cmd, dest);
        return -1;
    }
    for (int i = 0; files ? files[i] != NULL : i == 0; i++) {
        char p[PATH_MAX + 64];
        snprintf(p, sizeof p, "%s%s%s", dest, files ? "/" : "", files ? files[i] : "");
        if (exists(p)) {
            fprintf(stderr, "tripod: error: %s: %s exists; --force replaces it\n", cmd, p);
            return -1;
        }
    }
    return 0;
}

/* Moves what an export wrote under `tmp` into `dest`: a file is renamed, a directory's
 * files one by one (each rename atomic: a reader sees the old file or the new one). */
static tpd_status commit_export(const char *tmp, const char *dest, int dir) {
    if (!dir) return rename(tmp, dest) == 0 ? TPD_OK : TPD_ERR_IO;
    int e = 0;
    if (tpd_file_mkdirs(dest, &e) != TPD_OK) return TPD_ERR_IO;
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

static int exit_of(tpd_status st) {
    return st == TPD_OK ? TPD_EXIT_OK : st == TPD_ERR_INVALID ? TPD_EXIT_CONFIG : TPD_EXIT_FAILURE;
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
        fprintf(stderr, "tripod: error: export needs --format hf|llmc and --output PATH\n");
        return TPD_EXIT_CONFIG;
    }
    tpd_hf_export xo = TPD_HF_EXPORT_INIT;
    if (o->dtype && strcmp(o->dtype, "fp32") && strcmp(o->dtype, "bf16")) {
        fprintf(stderr, "tripod: error: --dtype '%s': expected fp32 or bf16\n", o->dtype);
        return TPD_EXIT_CONFIG;
    }
    xo.bf16 = o->dtype && !strcmp(o->dtype, "bf16");
    if (o->max_shard && !(xo.max_shard_bytes = parse_size(o->max_shard))) {
        fprintf(stderr,
                "tripod: error: --max-shard-size '%s': expected a positive size such as "
                "5GB, 500MiB or 1000000\n",
                o->max_shard);
        return TPD_EXIT_CONFIG;
    }
    if (llmc && (o->dtype || o->max_shard)) {
        fprintf(stderr, "tripod: error: --dtype and --max-shard-size apply to --format hf\n");
        return TPD_EXIT_CONFIG;
    }
    tpd_ckpt_info info;
    float *w[TPD_P_COUNT];
    static const char *const hf_files[] = {"model.safetensors", "config.json", NULL};
    if (check_dest("export", o->output, o->pos, hf ? hf_files : NULL, o->force))
        return TPD_EXIT_CONFIG;
    tpd_status st = tpd_ckpt_open_weights(o->pos, &info);
    if (st != TPD_OK) return exit_of(st);
    if (check_dest("export", o->output, info.dir, hf ? hf_files : NULL, o->force)) {
        tpd_ckpt_close(&info);
        return TPD_EXIT_CONFIG;
    }
    char tmp[PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", o->output);
    st = tpd_ckpt_read_weights(&info, w);
    if (st == TPD_OK) {
        st = hf ? tpd_ckpt_export_hf(&info.cfg, w, tmp, &xo)
                : tpd_ckpt_export_llmc(&info.cfg, w, tmp);
        tpd_ckpt_free_weights(w);
        if (st == TPD_OK && commit_export(tmp, o->output, hf) != TPD_OK) {
            fprintf(stderr, "tripod: error: export: cannot move %s into place as %s\n", tmp,
                    o->output);
            st = TPD_ERR_IO;
        }
    }
    if (st == TPD_OK)
        printf("exported %s (iteration %d, %d layers, hidden %d) to %s%s\n", info.dir,
               info.iteration, info.cfg.model.num_layers, info.cfg.model.hidden_size, o->output,
               hf ? " (config.json and safetensors)" : " (llm.c model file)");
    tpd_ckpt_close(&info);
    return exit_of(st);
}

/* The model section a training config needs to load the import (checkpoint.load with
 * checkpoint.finetune), as YAML. */
static void print_model_section(const tpd_config *cfg) {
    const tpd_config_model *m = &cfg->model;
    int rope = m->position_embedding_type == TPD_POS_ROPE;
    printf("model section for a training config (set seq_length to the length you train at):\n"
           "model:\n  num_layers: %d\n  hidden_size: %d\n  num_attention_heads: %d\n"
           "  ffn_hidden_size: %d\n  vocab_size: %d\n  max_position_embeddings: %d\n",
           m->num_layers, m->hidden_size, m->num_attention_heads, m->ffn_hidden_size, m->vocab_size,
           m->max_position_embeddings);
    if (m->normalization == TPD_NORM_LAYERNORM && !rope) return; /* GPT-2: the defaults */
    printf("  normalization: RMSNorm\n  norm_epsilon: %.17g\n  position_embedding_type: rope\n"
           "  rotary_base: %.17g\n  swiglu: true\n  group_query_attention: %s\n"
           "  num_query_groups: %d\n  untie_embeddings_and_output_weights: %s\n"
           "  add_bias_linear: %s\n  add_qkv_bias: %s\n",
           m->norm_epsilon, m->rotary_base, m->group_query_attention ? "true" : "false",
           tpd_config_kv_heads(cfg), m->untie_embeddings_and_output_weights ? "true" : "false",
           m->add_bias_linear ? "true" : "false", m->add_qkv_bias ? "true" : "false");
    if (m->rope_scaling)
        printf("  rope_scaling: true\n  rope_scaling_factor: %.17g\n"
               "  rope_scaling_low_freq_factor: %.17g\n  rope_scaling_high_freq_factor: %.17g\n"
               "  rope_scaling_original_max_position_embeddings: %d\n",
               m->rope_scaling_factor, m->rope_scaling_low_freq_factor,
               m->rope_scaling_high_freq_factor, m->rope_scaling_original_max_position_embeddings);
}

static int cmd_import(const opts *o) {
    int hf = o->format && !strcmp(o->format, "hf"), llmc = o->format && !strcmp(o->format, "llmc");
    int tp = 1, pp = 1, dp = 1;
    if ((!hf && !llmc) || !o->output) {
        fprintf(stderr, "tripod: error: import needs --format hf|llmc and --output DIR\n");
        return TPD_EXIT_CONFIG;
    }
    char extra;
    if (o->layout && (sscanf(o->layout, "%d,%d,%d%c", &tp, &pp, &dp, &extra) != 3 || tp < 1 ||
                      pp < 1 || dp < 1 || tp > 4096 || pp > 256 || dp > (1 << 20))) {
        fprintf(stderr,
                "tripod: error: --layout '%s': expected TP,PP,DP (e.g. 2,2,1; TP <= 4096, PP "
                "<= 256, DP <= 1048576)\n",
                o->layout);
        return TPD_EXIT_CONFIG;
    }
    static const char *const ckpt_files[] = {"manifest.json", NULL};
    if (check_dest("import", o->output, NULL, ckpt_files, o->force)) return TPD_EXIT_CONFIG;
    tpd_config cfg;
    float *w[TPD_P_COUNT];
    tpd_status st =
        hf ? tpd_ckpt_import_hf(o->pos, &cfg, w) : tpd_ckpt_import_llmc(o->pos, &cfg, w);
    if (st != TPD_OK) return exit_of(st);
    const tpd_config_model *m = &cfg.model;
    if (m->num_attention_heads % tp || tpd_config_kv_heads(&cfg) % tp || m->num_layers % pp) {
        fprintf(stderr,
                "tripod: error: --layout %d,%d,%d: %d heads, %d K/V heads and %d layers must "
                "divide by TP and PP\n",
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
    return exit_of(st);
}

/* generate streams its text: each token is written and flushed as it is drawn, so a
 * reader (a pipe, a file) has everything made so far, also after a SIGTERM. */
typedef struct gen_stream {
    const tpd_bpe *bpe;
    int failed; /* the output closed (EPIPE, a full disk) */
} gen_stream;

static int gen_on_token(void *user, int32_t tok) {
    gen_stream *s = user;
    char byte[8], *text = byte;
    size_t len = 0;
    if (s->bpe) {
        if (tpd_bpe_decode(s->bpe, &tok, 1, &text, &len) != TPD_OK) return s->failed = 1;
    } else {
        len = tpd_bytes_detokenize(&tok, 1, byte, sizeof byte);
    }
    if (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0) s->failed = 1;
    if (text != byte) free(text);
    return s->failed || tpd_signal_pending();
}

static int cmd_generate(const opts *o) {
    tpd_gen_opts g = TPD_GEN_OPTS_INIT;
    g.prompt = o->prompt;
    g.max_new_tokens = o->max_new;
    g.temperature = o->temperature;
    g.top_k = o->top_k;
    g.seed = o->seed;
    g.kv_cache = !o->no_kv_cache;
    g.top_p = o->top_p;
    g.stop_at_eod = o->stop_at_eod;
    if (!(g.top_p > 0)) {
        fprintf(stderr, "tripod: error: generate: --top-p must be in (0, 1]\n");
        return TPD_EXIT_CONFIG;
    }
    int device = o->device ? tpd_config_choice_value("training.device", o->device) : 0;
    if (device < 0) {
        fprintf(stderr, "tripod: error: generate: --device '%s': expected cpu or cuda\n",
                o->device);
        return TPD_EXIT_CONFIG;
    }
    g.device = (tpd_device)device;
    tpd_bpe *bpe = NULL;
    if (tpd_cli_tok_load(&o->tok, "generate", &bpe) != TPD_OK) return TPD_EXIT_CONFIG;
    g.bpe = bpe;
    gen_stream stream = {bpe, 0};
    g.on_token = gen_on_token;
    g.on_token_user = &stream;
    /* SIGTERM/SIGINT end the generation after the current token; a closed pipe is a
     * failed write, not a silent death */
    tpd_signals_install();
    signal(SIGPIPE, SIG_IGN);
    int32_t *toks = NULL;
    size_t n = 0;
    fputs(o->prompt, stdout);
    fflush(stdout);
    tpd_status st = tpd_generate(o->pos, &g, &toks, &n);
    if (!stream.failed) {
        fputc('\n', stdout);
        if (fflush(stdout) != 0) stream.failed = 1;
    }
    free(toks);
    tpd_bpe_destroy(bpe);
    if (st == TPD_OK && stream.failed) {
        fprintf(stderr,
                "tripod: error: generate: cannot write the output (closed?) after %zu "
                "tokens\n",
                n);
        return TPD_EXIT_FAILURE;
    }
    if (st == TPD_OK && tpd_signal_pending()) {
        fprintf(stderr, "tripod: generate: stopped by a signal after %zu tokens (all written)\n",
                n);
        return TPD_EXIT_SIGNAL;
    }
    return exit_of(st);
}

/* `tripod inspect CHECKPOINT`: what a checkpoint holds, after verifying every file. */
static int cmd_inspect(const opts *o) {
    tpd_ckpt_info info;
    tpd_status st = tpd_ckpt_open(o->pos, &info);
    if (st != TPD_OK) return exit_of(st);
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
           m->num_layers, m->hidden_size, m->num_attention_heads,
           m->ffn_hidden_size ? m->ffn_hidden_size : 4 * m->hidden_size, m->vocab_size,
           m->max_position_embeddings);
    printf("  %d files, %.1f MiB, every SHA-256 verified\n", info.nfiles,
           (double)bytes / 1048576.0);
    tpd_ckpt_close(&info);
    return TPD_EXIT_OK;
}

int tpd_cli_ckpt(int argc, char **argv) {
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0) {
        if (rc < 0) usage(stderr);
        return rc < 0 ? TPD_EXIT_CONFIG : TPD_EXIT_OK;
    }
    if (!strcmp(argv[0], "export")) return cmd_export(&o);
    if (!strcmp(argv[0], "import")) return cmd_import(&o);
    if (!strcmp(argv[0], "generate")) return cmd_generate(&o);
    if (!strcmp(argv[0], "inspect")) return cmd_inspect(&o);
    usage(stderr);
    return TPD_EXIT_CONFIG;
}
