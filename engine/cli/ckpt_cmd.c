/* `tripod export`, `tripod import` and `tripod generate`: single-process commands on
 * checkpoints (no MPI). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/interchange.h"
#include "engine/cli/cli.h"
#include "engine/cli/tokenizer_opts.h"
#include "engine/data/data.h"
#include "engine/generate/generate.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage:\n"
            "  tripod export CHECKPOINT --format hf|llmc --output PATH\n"
            "                [--dtype fp32|bf16] [--max-shard-size SIZE]\n"
            "      hf: PATH is a new directory (config.json and safetensors: GPT-2 as\n"
            "      GPT2LMHeadModel, the Llama block as LlamaForCausalLM or Qwen2ForCausalLM);\n"
            "      sharded with model.safetensors.index.json above SIZE (bytes, or with\n"
            "      KB/MB/GB/KiB/MiB/GiB; default 5GB); llmc: a file\n"
            "  tripod import PATH --format hf|llmc --output CHECKPOINT_DIR [--layout TP,PP,DP]\n"
            "      writes a weights-only tripod checkpoint sharded for the layout (default 1,1,1)\n"
            "      hf: GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM (no sliding\n"
            "      window), Qwen2ForCausalLM; prints the model section for a training config\n"
            "  tripod generate CHECKPOINT [--prompt TEXT] [--max-new-tokens N]\n"
            "                  [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
            "                  [--stop-at-eod] [--no-kv-cache]\n"
            "                  [--vocab-file vocab.json --merge-file merges.txt]\n"
            "                  [--tokenizer-type HuggingFaceTokenizer\n"
            "                   --tokenizer-model tokenizer.json]\n"
            "      --vocab-file/--merge-file: GPT-2 BPE text; --tokenizer-model: a Hugging\n"
            "      Face tokenizer.json (byte-level BPE; the prompt gets its BOS); bytes\n"
            "      without them\n"
            "      --no-kv-cache: a full forward over the last seq_length tokens per token\n"
            "  tripod inspect CHECKPOINT\n"
            "      what it holds (iteration, layout, model, files), every file verified\n"
            "CHECKPOINT is a checkpoint directory or a checkpoint.save directory (its latest).\n");
}

typedef struct opts {
    const char *pos, *format, *output, *layout, *prompt, *dtype, *max_shard;
    tpd_cli_tok tok;
    int max_new, top_k, no_kv_cache, stop_at_eod;
    double temperature, top_p;
    unsigned long long seed;
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
        if (!strcmp(a, "--no-kv-cache") || !strcmp(a, "--stop-at-eod")) {
            *(a[2] == 'n' ? &o->no_kv_cache : &o->stop_at_eod) = 1;
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
        else if (!strcmp(a, "--prompt"))
            o->prompt = v;
        else if (!strcmp(a, "--max-new-tokens"))
            o->max_new = atoi(v);
        else if (!strcmp(a, "--temperature"))
            o->temperature = atof(v);
        else if (!strcmp(a, "--top-k"))
            o->top_k = atoi(v);
        else if (!strcmp(a, "--top-p"))
            o->top_p = atof(v);
        else if (!strcmp(a, "--seed"))
            o->seed = strtoull(v, NULL, 10);
        else {
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
    tpd_status st = tpd_ckpt_open_weights(o->pos, &info);
    if (st != TPD_OK) return exit_of(st);
    st = tpd_ckpt_read_weights(&info, w);
    if (st == TPD_OK) {
        st = hf ? tpd_ckpt_export_hf(&info.cfg, w, o->output, &xo)
                : tpd_ckpt_export_llmc(&info.cfg, w, o->output);
        tpd_ckpt_free_weights(w);
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
    if (o->layout &&
        (sscanf(o->layout, "%d,%d,%d", &tp, &pp, &dp) != 3 || tp < 1 || pp < 1 || dp < 1)) {
        fprintf(stderr, "tripod: error: --layout '%s': expected TP,PP,DP (e.g. 2,2,1)\n",
                o->layout);
        return TPD_EXIT_CONFIG;
    }
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
    if (g.max_new_tokens < 0 || g.temperature < 0 || g.top_k < 0 || !(g.top_p > 0) || g.top_p > 1) {
        fprintf(stderr, "tripod: error: --max-new-tokens, --temperature and --top-k must be >= "
                        "0, and --top-p in (0, 1]\n");
        return TPD_EXIT_CONFIG;
    }
    tpd_bpe *bpe = NULL;
    if (tpd_cli_tok_load(&o->tok, "generate", &bpe) != TPD_OK) return TPD_EXIT_CONFIG;
    g.bpe = bpe;
    int32_t *toks = NULL;
    size_t n = 0, len = 0;
    tpd_status st = tpd_generate(o->pos, &g, &toks, &n);
    char *text = NULL;
    if (st == TPD_OK && bpe) {
        st = tpd_bpe_decode(bpe, toks, n, &text, &len);
    } else if (st == TPD_OK) {
        text = malloc(n + 1);
        if (text) len = tpd_bytes_detokenize(toks, n, text, n + 1);
        st = text ? TPD_OK : TPD_ERR_NOMEM;
    }
    if (st == TPD_OK) {
        fputs(o->prompt, stdout);
        fwrite(text, 1, len, stdout);
        fputc('\n', stdout);
    }
    free(text);
    free(toks);
    tpd_bpe_destroy(bpe);
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
