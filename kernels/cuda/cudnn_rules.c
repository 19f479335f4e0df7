/* The cuDNN version rules of kernels/cuda/cudnn_rules.h. */
#include "kernels/cuda/cudnn_rules.h"

#include <stdio.h>
#include <string.h>

void tpd_cudnn_sdpa_rules_of(int version, int s_kv, tpd_cudnn_sdpa_rules *rules_p) {
    tpd_cudnn_sdpa_rules r;
    memset(&r, 0, sizeof r);
    r.bwd_refused = version == 91000 || version == 91001; /* 9.10.0, 9.10.1 */
    r.padding_mask = version < TPD_CUDNN_PADDING_FIXED_VERSION && s_kv % 128 != 0;
    *rules_p = r;
}

int tpd_cudnn_sdpa_rules_describe(const tpd_cudnn_sdpa_rules *r, int version, int s_kv, char *buf,
                                  size_t n) {
    int count = 0;
    size_t used = 0;
    if (n > 0) buf[0] = '\0';
    int major = version / 10000, minor = version / 100 % 100, patch = version % 100;
    if (r->bwd_refused) {
        if (used < n)
            used += (size_t)snprintf(buf + used, n - used,
                                     "cuDNN %d.%d.%d: the SDPA backward is refused on 9.10.0 and "
                                     "9.10.1 (as cudnn-frontend does), so attention runs unfused",
                                     major, minor, patch);
        count++;
    }
    if (r->padding_mask) {
        if (used < n)
            used +=
                (size_t)snprintf(buf + used, n - used,
                                 "%scuDNN %d.%d.%d <= 9.15 and s_kv = %d not a multiple of 128: "
                                 "the backward carries a padding mask with seq_len = %d (as "
                                 "cudnn-frontend does; without it the backward can give NaN)",
                                 count ? "; " : "", major, minor, patch, s_kv, s_kv);
        count++;
    }
    return count;
}
