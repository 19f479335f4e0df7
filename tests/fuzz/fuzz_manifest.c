/* The checkpoint manifest reader: the input is manifest.json, and the harness writes the
 * manifest.sha256 that matches it (a manifest that fails its hash is rejected before any
 * field is read; this reaches the fields). The shard files it may name are absent, so a
 * manifest that parses fails on them, or opens when it lists none; one that opens is read
 * back tensor by tensor. */
#include <openssl/sha.h>

#include "engine/checkpoint/checkpoint.h"
#include "fuzz_util.h"

/* Reads a tensor only when its global size is small: a manifest may claim any shape. */
#define MAX_READ_ELEMENTS (1 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char md[SHA256_DIGEST_LENGTH];
    char hex[2 * SHA256_DIGEST_LENGTH + 2];
    SHA256(data, size, md);
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    hex[2 * SHA256_DIGEST_LENGTH] = '\n';
    hex[2 * SHA256_DIGEST_LENGTH + 1] = '\0';
    tpd_fuzz_write(tpd_fuzz_path(0, "manifest.json"), data, size);
    tpd_fuzz_write(tpd_fuzz_path(1, "manifest.sha256"), (const uint8_t *)hex, strlen(hex));
    static tpd_ckpt_info info;
    if (tpd_ckpt_open(tpd_fuzz_dir(), &info) != TPD_OK) return 0;
    tpd_model_layout g;
    if (tpd_model_layout_init(&info.cfg, 1, 0, 1, 0, &g) == TPD_OK) {
        for (int p = 0; p < TPD_P_COUNT; p++) {
            size_t n = tpd_model_layout_global_numel(&g, (tpd_param)p);
            if (n > MAX_READ_ELEMENTS) continue;
            float *buf = malloc((n ? n : 1) * sizeof *buf);
            if (!buf) abort();
            for (int k = 0; k < TPD_CKPT_KIND_COUNT; k++)
                tpd_ckpt_read_global(&info, (tpd_param)p, (tpd_ckpt_kind)k, buf);
            free(buf);
        }
    }
    tpd_ckpt_close(&info);
    return 0;
}
