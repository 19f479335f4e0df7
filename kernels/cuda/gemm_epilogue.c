/* The epilogue rule of kernels/cuda/gemm_epilogue.h. */
#include "kernels/cuda/gemm_epilogue.h"

#include <stdint.h>

int tpd_gemm_epilogue_askable(const void *bias, const void *aux) {
    uintptr_t a = (uintptr_t)bias | (uintptr_t)aux; /* NULL adds no low bits */
    return a % TPD_GEMM_EPILOGUE_ALIGN == 0;
}

tpd_gemm_outcome tpd_gemm_lt_outcome(int lt_status, int found, int quiet) {
    if (lt_status == TPD_GEMM_LT_SUCCESS && found > 0) return TPD_GEMM_OUTCOME_OK;
    int refused =
        lt_status == TPD_GEMM_LT_NOT_SUPPORTED || (lt_status == TPD_GEMM_LT_SUCCESS && found <= 0);
    return refused && quiet ? TPD_GEMM_OUTCOME_UNSUPPORTED : TPD_GEMM_OUTCOME_ERROR;
}
