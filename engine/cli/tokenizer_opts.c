/* --tokenizer-type, --tokenizer-model, --vocab-file, --merge-file (see tokenizer_opts.h). */
#include "engine/cli/tokenizer_opts.h"

#include <stdio.h>
#include <string.h>

int tpd_cli_tok_arg(tpd_cli_tok *t, const char *cmd, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char **slot = !strcmp(a, "--tokenizer-type")    ? &t->type
                        : !strcmp(a, "--tokenizer-model") ? &t->model
                        : !strcmp(a, "--vocab-file")      ? &t->vocab_file
                        : !strcmp(a, "--merge-file")      ? &t->merge_file
                                                          : NULL;
    if (!slot) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "tripod: error: %s: %s needs a value\n", cmd, a);
        return -1;
    }
    *slot = argv[++*i];
    return 1;
}

/* The type the options mean: the one given, else the one their files imply. */
static const char *type_of(const tpd_cli_tok *t) {
    if (t->type) return t->type;
    if (t->model) return "HuggingFaceTokenizer";
    if (t->vocab_file || t->merge_file) return "GPT2BPETokenizer";
    return NULL;
}

const char *tpd_cli_tok_name(const tpd_cli_tok *t) {
    const char *type = type_of(t);
    return !type ? "bytes" : !strcmp(type, "GPT2BPETokenizer") ? "GPT-2 BPE" : "tokenizer.json";
}

tpd_status tpd_cli_tok_load(const tpd_cli_tok *t, const char *cmd, tpd_bpe **bpe_p) {
    const char *type = type_of(t);
    *bpe_p = NULL;
    if (!type) return TPD_OK;
    if (!strcmp(type, "GPT2BPETokenizer")) {
        if (!t->vocab_file || !t->merge_file || t->model) {
            fprintf(stderr,
                    "tripod: error: %s: --vocab-file and --merge-file go together (GPT-2 "
                    "BPE, --tokenizer-type GPT2BPETokenizer), without --tokenizer-model\n",
                    cmd);
            return TPD_ERR_INVALID;
        }
        return tpd_bpe_load(t->vocab_file, t->merge_file, bpe_p);
    }
    if (!strcmp(type, "HuggingFaceTokenizer")) {
        if (!t->model || t->vocab_file || t->merge_file) {
            fprintf(stderr,
                    "tripod: error: %s: --tokenizer-type HuggingFaceTokenizer takes "
                    "--tokenizer-model (a tokenizer.json or its folder), not "
                    "--vocab-file/--merge-file\n",
                    cmd);
            return TPD_ERR_INVALID;
        }
        return tpd_bpe_load_hf(t->model, bpe_p);
    }
    fprintf(stderr,
            "tripod: error: %s: --tokenizer-type %s is not supported (supported: "
            "GPT2BPETokenizer, HuggingFaceTokenizer%s)\n",
            cmd, type,
            strstr(type, "SentencePiece") || !strcmp(type, "Llama2Tokenizer")
                ? "; SentencePiece is not supported"
                : "");
    return TPD_ERR_INVALID;
}
