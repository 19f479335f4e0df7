/* --tokenizer-type, --tokenizer-model, --vocab-file, --merge-file (see tokenizer_opts.h). */
#include "engine/cli/tokenizer_opts.h"

#include <string.h>

int tpd_cli_tok_opt(tpd_cli_tok *t, const char *name, const char *value) {
    const char **slot = !strcmp(name, "--tokenizer-type")    ? &t->type
                        : !strcmp(name, "--tokenizer-model") ? &t->model
                        : !strcmp(name, "--vocab-file")      ? &t->vocab_file
                        : !strcmp(name, "--merge-file")      ? &t->merge_file
                                                             : NULL;
    if (slot) *slot = value;
    return slot != NULL;
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
            return tpd_fail(TPD_ERR_INVALID,
                            "%s: --vocab-file and --merge-file go together (GPT-2 BPE, "
                            "--tokenizer-type GPT2BPETokenizer), without --tokenizer-model",
                            cmd);
        }
        return tpd_bpe_load(t->vocab_file, t->merge_file, bpe_p);
    }
    if (!strcmp(type, "HuggingFaceTokenizer")) {
        if (!t->model || t->vocab_file || t->merge_file) {
            return tpd_fail(TPD_ERR_INVALID,
                            "%s: --tokenizer-type HuggingFaceTokenizer takes --tokenizer-model "
                            "(a tokenizer.json or its folder), not --vocab-file/--merge-file",
                            cmd);
        }
        return tpd_bpe_load_hf(t->model, bpe_p);
    }
    return tpd_fail(TPD_ERR_INVALID,
                    "%s: --tokenizer-type %s is not supported (supported: GPT2BPETokenizer, "
                    "HuggingFaceTokenizer%s)",
                    cmd, type,
                    strstr(type, "SentencePiece") || !strcmp(type, "Llama2Tokenizer")
                        ? "; SentencePiece is not supported"
                        : "");
}
