/* The tokenizer options of the commands that take text (`tripod data prepare`, `tripod
 * generate`), by Megatron's names: --tokenizer-type GPT2BPETokenizer with --vocab-file
 * vocab.json --merge-file merges.txt, or --tokenizer-type HuggingFaceTokenizer with
 * --tokenizer-model (a tokenizer.json, or the model folder holding it). Without any of
 * them text is bytes. */
#ifndef TPD_ENGINE_CLI_TOKENIZER_OPTS_H
#define TPD_ENGINE_CLI_TOKENIZER_OPTS_H

#include "base/status.h"
#include "engine/data/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_cli_tok {
    const char *type, *model, *vocab_file, *merge_file; /* NULL: not given */
} tpd_cli_tok;

/* Their lines of a usage text (descriptions at column 20). */
#define TPD_CLI_TOK_USAGE                                                                          \
    "  --tokenizer-type T\n"                                                                       \
    "                    GPT2BPETokenizer (with --vocab-file and --merge-file) or\n"               \
    "                    HuggingFaceTokenizer (with --tokenizer-model); bytes without\n"           \
    "  --vocab-file F    GPT-2 BPE vocabulary (vocab.json)\n"                                      \
    "  --merge-file F    GPT-2 BPE merges (merges.txt)\n"                                          \
    "  --tokenizer-model P\n"                                                                      \
    "                    a Hugging Face tokenizer.json of a byte-level BPE (Llama 3,\n"            \
    "                    Qwen2, GPT-2...), or the model folder holding it; SentencePiece\n"        \
    "                    (tokenizer.model) is not supported\n"

/* Their entries of a command's option table (engine/cli/args.h). */
#define TPD_CLI_TOK_OPTS                                                                           \
    {"--tokenizer-type", 1}, {"--tokenizer-model", 1}, {"--vocab-file", 1}, {                      \
        "--merge-file", 1                                                                          \
    }

/* 1 when the parsed option `name` is one of them (its value kept in t), else 0. */
int tpd_cli_tok_opt(tpd_cli_tok *t, const char *name, const char *value);

/* The tokenizer the options name into *bpe_p (NULL: bytes). Options that do not go
 * together, or a type other than those two, print an error and return TPD_ERR_INVALID;
 * otherwise the loader's status. */
tpd_status tpd_cli_tok_load(const tpd_cli_tok *t, const char *cmd, tpd_bpe **bpe_p);

/* What the options name, for messages: "bytes", "GPT-2 BPE" or "tokenizer.json". */
const char *tpd_cli_tok_name(const tpd_cli_tok *t);

#ifdef __cplusplus
}
#endif
#endif
