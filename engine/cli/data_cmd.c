/* `tripod data ...`: prepare a byte-level data set from text files, describe a data set
 * on disk, and write one of random tokens (benchmarks). argv[0] is "data". */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rng.h"
#include "engine/cli/args.h"
#include "engine/cli/cli.h"
#include "engine/cli/tokenizer_opts.h"
#include "engine/data/data.h"

static void usage_data(FILE *f) {
    fputs("usage: tripod data <command> [options]\n"
          "\n"
          "commands:\n"
          "  prepare   tokenize text files into a Megatron indexed data set\n"
          "  info      print the format, dtype, token and document counts of a data set\n"
          "  random    write a data set of uniformly random tokens over a vocabulary\n"
          "\n"
          "Run 'tripod data <command> --help' for the options of a command.\n",
          f);
}

/* A data set (either file of the pair) at the output prefix: prepare writes over one only
 * when told (--force); it may be another run's data, or this run's own input. */
static int output_exists(const char *cmd, const char *prefix) {
    for (int k = 0; k < 2; k++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s.%s", prefix, k ? "bin" : "idx");
        if (access(path, F_OK) == 0) {
            tpd_log_error("%s: %s exists; --force replaces the data set", cmd, path);
            return 1;
        }
    }
    return 0;
}

static void usage_prepare(FILE *f) {
    fputs("usage: tripod data prepare --input FILE... --output PREFIX\n"
          "                           [--records file|blank|percent|jsonl] [--json-key K]\n"
          "                           [--vocab-file vocab.json --merge-file merges.txt]\n"
          "                           [--tokenizer-type HuggingFaceTokenizer\n"
          "                            --tokenizer-model tokenizer.json] [--append-eod]\n"
          "                           [--force]\n"
          "\n"
          "Tokenizes text byte by byte (vocab 257: bytes 0..255, end of document 256) and\n"
          "writes a Megatron indexed data set, PREFIX.idx + PREFIX.bin, with uint16 tokens\n"
          "(int32 for vocabularies of 65500 or more). Every document ends with the\n"
          "end-of-document token 256. With --vocab-file and --merge-file (GPT-2's files,\n"
          "as Megatron takes them) it uses GPT-2's byte-level BPE instead, and ends every\n"
          "document with <|endoftext|>.\n"
          "With a Hugging Face tokenizer.json (Megatron's HuggingFaceTokenizer) every\n"
          "document is encoded as Hugging Face's tokenizer(text) does (with its BOS, if its\n"
          "post-processor adds one), and ends with the end-of-document token only with\n"
          "--append-eod (as Megatron's preprocess_data.py).\n"
          "\n"
          "options:\n"
          "  --input FILE...   one or more text files; may be repeated\n"
          "  --output PREFIX   where to write PREFIX.idx and PREFIX.bin (never over an\n"
          "                    existing data set without --force)\n" TPD_CLI_TOK_USAGE
          "  --append-eod      end every document with the tokenizer's end-of-document token\n"
          "                    (tokenizer.json: the eos_token of a tokenizer_config.json\n"
          "                    beside it, else <|end_of_text|>, <|endoftext|>, </s> or <eos>);\n"
          "                    bytes and GPT-2's files always end documents so\n"
          "  --records MODE    how the inputs split into documents:\n"
          "                      file     each input file is one document (the default)\n"
          "                      blank    every blank-line separated record is a document\n"
          "                      percent  every record separated by a line holding only '%'\n"
          "                               is a document (the fortune format)\n"
          "                      jsonl    JSON Lines: every line's object holds a document\n"
          "                               in its string field --json-key (default text),\n"
          "                               as Megatron's preprocess_data.py reads it\n"
          "\n"
          "Records holding only whitespace are skipped, and a record never spans two files.\n",
          f);
}

static void usage_info(FILE *f) {
    fputs("usage: tripod data info PATH [--vocab-size N]\n"
          "\n"
          "PATH is a Megatron prefix (PREFIX.idx + PREFIX.bin) or an llm.c token shard.\n"
          "The whole data set is validated; with --vocab-size every token must also be\n"
          "below N.\n",
          f);
}

static int is_help(const char *a) {
    return !strcmp(a, "--help") || !strcmp(a, "-h");
}

static int parse_records(const char *s, tpd_records *r_p) {
    if (!strcmp(s, "file"))
        *r_p = TPD_RECORDS_FILE;
    else if (!strcmp(s, "blank"))
        *r_p = TPD_RECORDS_BLANK;
    else if (!strcmp(s, "percent"))
        *r_p = TPD_RECORDS_PERCENT;
    else if (!strcmp(s, "jsonl"))
        *r_p = TPD_RECORDS_JSONL;
    else
        return 0;
    return 1;
}

static const tpd_cli_opt k_prepare_opts[] = {
    {"--input", TPD_CLI_VALUES}, {"--output", 1}, {"--json-key", 1}, {"--records", 1},
    {"--append-eod", 0},         {"--force", 0},  TPD_CLI_TOK_OPTS,  {NULL, 0}};

/* argv[0] is "prepare". */
static int cli_prepare(int argc, char **argv) {
    const char *cmd = "data prepare";
    tpd_cli_args a;
    if (tpd_cli_args_parse_path(cmd, argc - 1, argv + 1, k_prepare_opts, &a) != TPD_OK) {
        usage_prepare(stderr);
        return TPD_EXIT_CONFIG;
    }
    int rc = TPD_EXIT_CONFIG;
    /* every --input value is an entry of the parsed options: at most n_opts of them */
    const char **inputs = calloc((size_t)a.n_opts + 1, sizeof *inputs);
    int n_inputs = 0;
    const char *output = NULL;
    tpd_records records = TPD_RECORDS_FILE;
    const char *json_key = NULL;
    tpd_cli_tok tok = {0};
    int append_eod = 0, force = 0;
    tpd_bpe *bpe = NULL;
    if (!inputs) {
        tpd_fail_nomem("the input list", ((size_t)a.n_opts + 1) * sizeof *inputs);
        rc = TPD_EXIT_FAILURE;
        goto free_inputs;
    }
    if (a.help) {
        usage_prepare(stdout);
        rc = TPD_EXIT_OK;
        goto free_inputs;
    }
    if (a.config) {
        tpd_log_error("%s: unknown argument '%s'", cmd, a.config);
        goto usage;
    }
    for (int i = 0; i < a.n_opts; i++) {
        const char *n = a.opt_name[i], *v = a.opt_value[i];
        if (!strcmp(n, "--input")) {
            inputs[n_inputs++] = v;
        } else if (!strcmp(n, "--output")) {
            output = v;
        } else if (!strcmp(n, "--json-key")) {
            json_key = v;
        } else if (!strcmp(n, "--append-eod")) {
            append_eod = 1;
        } else if (!strcmp(n, "--force")) {
            force = 1;
        } else if (!strcmp(n, "--records")) {
            if (!parse_records(v, &records)) {
                tpd_log_error("%s: --records takes file, blank, percent or jsonl (got %s)", cmd, v);
                goto usage;
            }
        } else {
            tpd_cli_tok_opt(&tok, n, v);
        }
    }
    if (n_inputs == 0 || !output) {
        tpd_log_error("%s: --input and --output are required", cmd);
        goto usage;
    }
    tpd_status st = tpd_cli_tok_load(&tok, cmd, &bpe);
    if (st == TPD_ERR_INVALID) goto usage;
    if (st != TPD_OK) goto free_inputs;
    /* bytes and GPT-2's files always end documents with EOD; tokenizer.json as asked */
    int hf = !strcmp(tpd_cli_tok_name(&tok), "tokenizer.json");
    if (!hf) append_eod = 1;
    int32_t eod = bpe ? tpd_bpe_eod(bpe) : TPD_BYTE_EOD;
    if (hf && append_eod && eod < 0) {
        tpd_log_error("%s: --append-eod: %s has no end-of-document token (an eos_token in a "
                      "tokenizer_config.json beside it, or one of <|end_of_text|>, "
                      "<|endoftext|>, </s>, <eos>)",
                      cmd, tok.model);
        goto free_inputs;
    }
    if (!force && output_exists(cmd, output)) goto free_inputs;
    uint64_t docs = 0, tokens = 0;
    tpd_prepare_opts po = TPD_PREPARE_OPTS_INIT;
    po.records = records;
    po.bpe = bpe;
    po.omit_eod = !append_eod;
    if (json_key) po.json_key = json_key;
    if (tpd_data_prepare(inputs, n_inputs, &po, output, &docs, &tokens) != TPD_OK) {
        rc = TPD_EXIT_FAILURE;
        goto free_inputs;
    }
    char eod_note[600] = "";
    if (hf && append_eod)
        snprintf(eod_note, sizeof eod_note, ", each ended by EOD %s (id %d)",
                 tpd_bpe_token(bpe, eod), (int)eod);
    printf("prepared %s.idx + %s.bin: %d input file(s), %llu documents, %llu tokens (%s, "
           "vocab %d%s)\n",
           output, output, n_inputs, (unsigned long long)docs, (unsigned long long)tokens,
           tpd_cli_tok_name(&tok), bpe ? tpd_bpe_vocab_size(bpe) : TPD_BYTE_VOCAB, eod_note);
    rc = TPD_EXIT_OK;
    goto free_inputs;
usage:
    usage_prepare(stderr);
free_inputs:
    tpd_bpe_destroy(bpe);
    free(inputs);
    tpd_cli_args_free(&a);
    return rc;
}

static const tpd_cli_opt k_info_opts[] = {{"--vocab-size", 1}, {NULL, 0}};

/* argv[0] is "info". */
static int cli_info(int argc, char **argv) {
    const char *cmd = "data info";
    tpd_cli_args a;
    int vocab = INT_MAX; /* without --vocab-size only the dtype's own range is checked */
    int rc = TPD_EXIT_CONFIG;
    if (tpd_cli_args_parse_path(cmd, argc - 1, argv + 1, k_info_opts, &a) != TPD_OK) {
        usage_info(stderr);
        return rc;
    }
    if (a.help) {
        usage_info(stdout);
        rc = TPD_EXIT_OK;
        goto free_args;
    }
    for (int i = 0; i < a.n_opts; i++)
        if (tpd_cli_int(cmd, a.opt_name[i], a.opt_value[i], 1, INT_MAX, &vocab) != TPD_OK)
            goto usage;
    if (!a.config) {
        tpd_log_error("%s: PATH is required", cmd);
        goto usage;
    }
    const char *path = a.config;
    tpd_dataset *ds = NULL;
    if (tpd_dataset_open(path, vocab, &ds) != TPD_OK) {
        rc = TPD_EXIT_FAILURE;
        goto free_args;
    }
    printf("path:        %s\n", path);
    printf("format:      %s\n", strcmp(tpd_dataset_format(ds), "megatron") == 0
                                    ? "megatron indexed (PREFIX.idx + PREFIX.bin)"
                                    : "llm.c token shard");
    printf("dtype:       %s\n", tpd_dataset_dtype(ds));
    printf("tokens:      %llu\n", (unsigned long long)tpd_dataset_num_tokens(ds));
    printf("documents:   %llu\n", (unsigned long long)tpd_dataset_num_documents(ds));
    printf("max token:   %d\n", (int)tpd_dataset_max_token(ds));
    tpd_dataset_close(ds);
    rc = TPD_EXIT_OK;
    goto free_args;
usage:
    usage_info(stderr);
free_args:
    tpd_cli_args_free(&a);
    return rc;
}

static const tpd_cli_opt k_random_opts[] = {
    {"--output", 1}, {"--vocab-size", 1}, {"--tokens", 1}, {"--doc-length", 1},
    {"--seed", 1},   {"--force", 0},      {NULL, 0}};

static void usage_random(FILE *f) {
    fputs("usage: tripod data random --output PREFIX --vocab-size V --tokens N\n"
          "                          [--doc-length L] [--seed S] [--force]\n"
          "  Writes PREFIX.idx + PREFIX.bin: N tokens drawn uniformly from [0, V) by the\n"
          "  counter-based generator (the same bytes for the same seed), in documents of L\n"
          "  tokens (default 1024; the last one shorter). For benchmarks whose work depends\n"
          "  on the tokens (the embedding backward sums each distinct token's rows): real\n"
          "  text at a byte-level vocabulary has about 100 distinct tokens.\n",
          f);
}

/* argv[0] is "random". */
static int cli_random(int argc, char **argv) {
    const char *cmd = "data random";
    tpd_cli_args a;
    if (tpd_cli_args_parse_path(cmd, argc - 1, argv + 1, k_random_opts, &a) != TPD_OK) {
        usage_random(stderr);
        return TPD_EXIT_CONFIG;
    }
    int rc = TPD_EXIT_CONFIG, vocab = 0, doc = 1024, force = 0;
    uint64_t tokens = 0, seed = 1234;
    const char *output = NULL;
    if (a.help) {
        usage_random(stdout);
        rc = TPD_EXIT_OK;
        goto out;
    }
    if (a.config) {
        tpd_log_error("%s: unknown argument '%s'", cmd, a.config);
        goto usage;
    }
    for (int i = 0; i < a.n_opts; i++) {
        const char *n = a.opt_name[i], *v = a.opt_value[i];
        tpd_status st = TPD_OK;
        if (!strcmp(n, "--output"))
            output = v;
        else if (!strcmp(n, "--force"))
            force = 1;
        else if (!strcmp(n, "--vocab-size"))
            st = tpd_cli_int(cmd, n, v, 1, 1 << 24, &vocab);
        else if (!strcmp(n, "--doc-length"))
            st = tpd_cli_int(cmd, n, v, 1, 1 << 24, &doc);
        else if (!strcmp(n, "--tokens"))
            st = tpd_cli_u64(cmd, n, v, &tokens);
        else if (!strcmp(n, "--seed"))
            st = tpd_cli_u64(cmd, n, v, &seed);
        if (st != TPD_OK) goto usage;
    }
    if (!output || vocab < 1 || tokens < 1) {
        tpd_log_error("%s: --output, --vocab-size and --tokens (at least 1) are required", cmd);
        goto usage;
    }
    if (!force && output_exists(cmd, output)) goto out;
    tpd_indexed_builder *b = NULL;
    int32_t *buf = malloc((size_t)doc * sizeof *buf);
    tpd_status st = buf ? tpd_indexed_builder_create(output, vocab, &b)
                        : tpd_fail_nomem("a document", (size_t)doc * sizeof *buf);
    for (uint64_t t = 0; st == TPD_OK && t < tokens; t += (uint64_t)doc) {
        uint64_t n = tokens - t < (uint64_t)doc ? tokens - t : (uint64_t)doc;
        for (uint64_t i = 0; i < n; i++)
            buf[i] = (int32_t)tpd_rng_below(seed, 77, t + i, (uint64_t)vocab);
        st = tpd_indexed_builder_add(b, buf, n);
    }
    if (st == TPD_OK) st = tpd_indexed_builder_finish(b);
    tpd_indexed_builder_destroy(b);
    free(buf);
    if (st != TPD_OK) {
        rc = TPD_EXIT_FAILURE;
        goto out;
    }
    printf("wrote %s.idx + %s.bin: %llu uniformly random tokens over [0, %d) in documents of "
           "%d (seed %llu)\n",
           output, output, (unsigned long long)tokens, vocab, doc, (unsigned long long)seed);
    rc = TPD_EXIT_OK;
    goto out;
usage:
    usage_random(stderr);
out:
    tpd_cli_args_free(&a);
    return rc;
}

int tpd_cli_data(int argc, char **argv) {
    if (argc < 2) {
        usage_data(stderr);
        return TPD_EXIT_CONFIG;
    }
    const char *cmd = argv[1];
    if (is_help(cmd)) {
        usage_data(stdout);
        return TPD_EXIT_OK;
    }
    if (!strcmp(cmd, "prepare")) return cli_prepare(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cli_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "random")) return cli_random(argc - 1, argv + 1);
    tpd_log_error("data: unknown command '%s' (expected prepare, info or random)", cmd);
    usage_data(stderr);
    return TPD_EXIT_CONFIG;
}
