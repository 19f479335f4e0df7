/* GPT-2's tokenizer files: input = vocab.json bytes, separator, merges.txt bytes. A
 * tokenizer that loads encodes and decodes a fixed text (ASCII, UTF-8 and invalid bytes). */
#include "engine/data/tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[2];
    size_t len[2];
    tpd_fuzz_split(data, size, 2, part, len);
    const char *vocab = tpd_fuzz_path(0, "vocab.json"), *merges = tpd_fuzz_path(1, "merges.txt");
    tpd_fuzz_write(vocab, part[0], len[0]);
    tpd_fuzz_write(merges, part[1], len[1]);
    tpd_bpe *bpe = NULL;
    if (tpd_bpe_load(vocab, merges, &bpe) != TPD_OK) return 0;
    static const char text[] = "Hello world, it's 2024!\n\t  caf\xc3\xa9 \xff\xfe<|endoftext|>";
    int32_t *ids = NULL;
    size_t n = 0, cap = 0, back_len = 0;
    char *back = NULL;
    if (tpd_bpe_encode(bpe, text, sizeof text - 1, &ids, &n, &cap) == TPD_OK &&
        tpd_bpe_decode(bpe, ids, n, &back, &back_len) == TPD_OK) {
        free(back);
    }
    /* ids of every kind, the vocabulary's own and outside it */
    const int32_t odd[] = {0,
                           1,
                           -1,
                           255,
                           256,
                           tpd_bpe_vocab_size(bpe) - 1,
                           tpd_bpe_vocab_size(bpe),
                           tpd_bpe_eod(bpe),
                           INT32_MAX,
                           INT32_MIN};
    if (tpd_bpe_decode(bpe, odd, sizeof odd / sizeof odd[0], &back, &back_len) == TPD_OK)
        free(back);
    free(ids);
    tpd_bpe_destroy(bpe);
    return 0;
}
