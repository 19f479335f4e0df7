/* The attention path rule (attention_choice.h). */
#include "kernels/attention_choice.h"

#include <stdio.h>
#include <string.h>

tpd_status tpd_attn_force_parse(const char *value, tpd_attn_force *force_p) {
    tpd_attn_force f;
    if (value == NULL || value[0] == '\0' || strcmp(value, "auto") == 0)
        f = TPD_ATTN_FORCE_NONE;
    else if (strcmp(value, "old") == 0)
        f = TPD_ATTN_FORCE_OLD;
    else if (strcmp(value, "unfused") == 0)
        f = TPD_ATTN_FORCE_UNFUSED;
    else {
        tpd_log_error("TRIPOD_CUDNN_ATTN=%s: must be auto, old or unfused", value);
        return TPD_ERR_INVALID;
    }
    *force_p = f;
    return TPD_OK;
}

int tpd_attn_fused_max_head_size(int sm) {
    return sm / 10 == 9 ? 256 : 128;
}

int tpd_attn_fused_eligible(const tpd_attn_choice_in *in, char *why, size_t n) {
    if (!in->fused_requested) {
        snprintf(why, n, "training.attention is unfused");
        return 0;
    }
    if (in->force == TPD_ATTN_FORCE_UNFUSED) {
        snprintf(why, n, "TRIPOD_CUDNN_ATTN=unfused");
        return 0;
    }
    if (in->dtype != TPD_DTYPE_BF16) {
        snprintf(why, n, "cuDNN flash attention takes bf16 only, the backend computes in %s",
                 tpd_dtype_name(in->dtype));
        return 0;
    }
    if (in->sm < 80) {
        snprintf(why, n, "cuDNN flash attention needs sm_80 or newer, the device is sm_%d", in->sm);
        return 0;
    }
    if (in->cudnn_version < 90000) {
        snprintf(why, n, "cuDNN version %d is older than 9.0", in->cudnn_version);
        return 0;
    }
    int max_hs = tpd_attn_fused_max_head_size(in->sm);
    if (in->HS % 8 != 0 || in->HS > max_hs) {
        snprintf(why, n,
                 "head size %d is outside the cuDNN flash attention backward's range on sm_%d (a "
                 "multiple of 8, at most %d)",
                 in->HS, in->sm, max_hs);
        return 0;
    }
    if (((long long)in->NH * in->HS) % 8 != 0) { /* 16-byte aligned rows for every view */
        snprintf(why, n, "NH*HS = %lld is not a multiple of 8", (long long)in->NH * in->HS);
        return 0;
    }
    return 1;
}

static const char *build_word(tpd_attn_build b) {
    return b == TPD_ATTN_BUILD_OK ? "built" : b == TPD_ATTN_BUILD_FAILED ? "failed" : "not tried";
}

void tpd_attn_choose(const tpd_attn_choice_in *in, tpd_attn_choice *out) {
    char why[256];
    memset(out, 0, sizeof *out);
    out->path = TPD_ATTN_PATH_UNFUSED;
    if (!tpd_attn_fused_eligible(in, why, sizeof why)) {
        /* Asked for fused and not forced away from it: a fallback the user should see. An
         * f32 backend is unfused by design (cuDNN's flash attention is bf16): no warning. */
        out->warn = in->fused_requested && in->force != TPD_ATTN_FORCE_UNFUSED &&
                    in->dtype == TPD_DTYPE_BF16;
        snprintf(out->reason, sizeof out->reason,
                 "attention B=%d T=%d NH=%d HS=%d takes the unfused path: %s", in->B, in->T, in->NH,
                 in->HS, why);
    } else if (in->fwd == TPD_ATTN_BUILD_OK && in->force != TPD_ATTN_FORCE_OLD &&
               in->bwd_new == TPD_ATTN_BUILD_OK) {
        out->path = TPD_ATTN_PATH_FUSED;
        snprintf(out->reason, sizeof out->reason,
                 "attention B=%d T=%d NH=%d HS=%d takes cuDNN (current backward pattern)", in->B,
                 in->T, in->NH, in->HS);
    } else if (in->fwd == TPD_ATTN_BUILD_OK && in->bwd_old == TPD_ATTN_BUILD_OK) {
        out->path = TPD_ATTN_PATH_FUSED_OLD;
        snprintf(out->reason, sizeof out->reason,
                 "attention B=%d T=%d NH=%d HS=%d takes cuDNN with the older backward pattern "
                 "(current pattern %s%s)",
                 in->B, in->T, in->NH, in->HS, build_word(in->bwd_new),
                 in->force == TPD_ATTN_FORCE_OLD ? ", TRIPOD_CUDNN_ATTN=old" : "");
    } else {
        out->warn = 1;
        snprintf(out->reason, sizeof out->reason,
                 "attention B=%d T=%d NH=%d HS=%d takes the unfused path: cuDNN %d.%d on sm_%d "
                 "has no plan for it (forward %s, backward current pattern %s, older pattern %s)",
                 in->B, in->T, in->NH, in->HS, in->cudnn_version / 10000,
                 in->cudnn_version / 100 % 100, in->sm, build_word(in->fwd),
                 build_word(in->bwd_new), build_word(in->bwd_old));
    }
    out->saved_bytes = tpd_attn_saved_bytes(out->path, in->dtype, in->B, in->T, in->NH);
}

size_t tpd_attn_saved_bytes(tpd_attn_path path, tpd_dtype dtype, int B, int T, int NH) {
    size_t rows = (size_t)B * (size_t)NH * (size_t)T;
    if (path == TPD_ATTN_PATH_UNFUSED) return rows * (size_t)T * tpd_dtype_size(dtype);
    return rows * sizeof(float);
}

void tpd_attn_choice_log(const tpd_attn_choice *c) {
    if (c->warn)
        tpd_log_warn("%s", c->reason);
    else
        tpd_log_info("%s", c->reason);
}
