/* Hugging Face's tokenizer.json: input = the file's bytes. A tokenizer that loads encodes
 * a fixed text (ASCII, UTF-8, invalid bytes, special tokens) with and without its BOS, and
 * decodes the ids back, plus ids outside the vocabulary. */
#include "engine/data/tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = tpd_fuzz_path(0, "tokenizer.json");
    tpd_fuzz_write(path, data, size);
    tpd_bpe *bpe = NULL;
    if (tpd_bpe_load_hf(path, &bpe) != TPD_OK) return 0;
    static const char text[] = "Hello world, it's 2024!\n\t  caf\xc3\xa9 \xff\xfe"
                               "<|begin_of_text|>x<|end_of_text|>\xf0\x9f\x98\x80";
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0, cap = 0, back_len = 0;
        char *back = NULL;
        if (tpd_bpe_encode_ex(bpe, text, sizeof text - 1, special, &ids, &n, &cap) == TPD_OK &&
            tpd_bpe_decode(bpe, ids, n, &back, &back_len) == TPD_OK)
            free(back);
        free(ids);
    }
    const int32_t odd[] = {
        0,         -1,       tpd_bpe_vocab_size(bpe) - 1, tpd_bpe_vocab_size(bpe), tpd_bpe_eod(bpe),
        INT32_MAX, INT32_MIN};
    char *back = NULL;
    size_t back_len = 0;
    if (tpd_bpe_decode(bpe, odd, sizeof odd / sizeof odd[0], &back, &back_len) == TPD_OK)
        free(back);
    tpd_bpe_destroy(bpe);
    return 0;
}
