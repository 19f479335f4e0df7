/* `tripod generate CHECKPOINT`: sample text from a trained model, streamed to stdout
 * (single process, no MPI). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cli/args.h"
#include "engine/cli/cli.h"
#include "engine/cli/tokenizer_opts.h"
#include "engine/data/data.h"
#include "engine/generate/generate.h"
#include "engine/train/signals.h"

static void usage(FILE *f) {
    fprintf(f, "usage:\n"
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
               "CHECKPOINT is a checkpoint directory or a checkpoint.save directory (its "
               "latest).\n");
}

static const tpd_cli_opt k_opts[] = {{"--prompt", 1},
                                     {"--max-new-tokens", 1},
                                     {"--temperature", 1},
                                     {"--top-k", 1},
                                     {"--top-p", 1},
                                     {"--seed", 1},
                                     {"--stop-at-eod", 0},
                                     {"--no-kv-cache", 0},
                                     {"--device", 1},
                                     TPD_CLI_TOK_OPTS,
                                     {NULL, 0}};

/* The options into g (from TPD_GEN_OPTS_INIT) and tok. */
static tpd_status parse_opts(const char *cmd, const tpd_cli_args *a, tpd_gen_opts *g,
                             tpd_cli_tok *tok) {
    for (int i = 0; i < a->n_opts; i++) {
        const char *n = a->opt_name[i], *v = a->opt_value[i];
        if (!strcmp(n, "--prompt"))
            g->prompt = v;
        else if (!strcmp(n, "--max-new-tokens"))
            TPD_CHECK(tpd_cli_int(cmd, n, v, 0, 1 << 24, &g->max_new_tokens));
        else if (!strcmp(n, "--top-k"))
            TPD_CHECK(tpd_cli_int(cmd, n, v, 0, 1 << 24, &g->top_k));
        else if (!strcmp(n, "--temperature"))
            TPD_CHECK(tpd_cli_double(cmd, n, v, 0, 1e6, &g->temperature));
        else if (!strcmp(n, "--top-p")) /* 0 is refused below, with the rule (0, 1] */
            TPD_CHECK(tpd_cli_double(cmd, n, v, 0, 1, &g->top_p));
        else if (!strcmp(n, "--seed"))
            TPD_CHECK(tpd_cli_u64(cmd, n, v, &g->seed));
        else if (!strcmp(n, "--stop-at-eod"))
            g->stop_at_eod = 1;
        else if (!strcmp(n, "--no-kv-cache"))
            g->kv_cache = 0;
        else if (!strcmp(n, "--device")) {
            int device = tpd_config_choice_value("training.device", v);
            if (device < 0)
                return tpd_fail(TPD_ERR_INVALID, "%s: --device '%s': expected cpu or cuda", cmd, v);
            g->device = (tpd_device)device;
        } else
            tpd_cli_tok_opt(tok, n, v);
    }
    if (!(g->top_p > 0)) return tpd_fail(TPD_ERR_INVALID, "%s: --top-p must be in (0, 1]", cmd);
    return TPD_OK;
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

static int cmd_generate(const char *checkpoint, tpd_gen_opts *g, const tpd_cli_tok *tok) {
    tpd_bpe *bpe = NULL;
    if (tpd_cli_tok_load(tok, "generate", &bpe) != TPD_OK) return TPD_EXIT_CONFIG;
    g->bpe = bpe;
    gen_stream stream = {bpe, 0};
    g->on_token = gen_on_token;
    g->on_token_user = &stream;
    /* SIGTERM/SIGINT end the generation after the current token; a closed pipe is a
     * failed write, not a silent death */
    tpd_signals_install();
    signal(SIGPIPE, SIG_IGN);
    int32_t *toks = NULL;
    size_t n = 0;
    fputs(g->prompt, stdout);
    fflush(stdout);
    tpd_status st = tpd_generate(checkpoint, g, &toks, &n);
    if (!stream.failed) {
        fputc('\n', stdout);
        if (fflush(stdout) != 0) stream.failed = 1;
    }
    free(toks);
    tpd_bpe_destroy(bpe);
    if (st == TPD_OK && stream.failed) {
        tpd_log_error("generate: cannot write the output (closed?) after %zu tokens", n);
        return TPD_EXIT_FAILURE;
    }
    if (st == TPD_OK && tpd_signal_pending()) {
        tpd_log_warn("generate: stopped by a signal after %zu tokens (all written)", n);
        return TPD_EXIT_SIGNAL;
    }
    return tpd_status_exit_code(st);
}

int tpd_cli_generate(int argc, char **argv) {
    const char *cmd = argv[0];
    tpd_cli_args a;
    if (tpd_cli_args_parse_path(cmd, argc - 1, argv + 1, k_opts, &a) != TPD_OK) {
        usage(stderr);
        return TPD_EXIT_CONFIG;
    }
    tpd_gen_opts g = TPD_GEN_OPTS_INIT;
    tpd_cli_tok tok = {0};
    int rc = TPD_EXIT_CONFIG;
    if (a.help) {
        usage(stdout);
        rc = TPD_EXIT_OK;
    } else if (!a.config) {
        tpd_log_error("%s needs a path", cmd);
        usage(stderr);
    } else if (parse_opts(cmd, &a, &g, &tok) == TPD_OK) {
        rc = cmd_generate(a.config, &g, &tok);
    }
    tpd_cli_args_free(&a);
    return rc;
}
