/* Stand-ins for the cuda backend in a build without a CUDA compiler, so callers can ask
 * for it and get a clean TPD_ERR_UNSUPPORTED instead of a link error. */
#include "kernels/kernels.h"

tpd_status tpd_kern_cuda_create(const tpd_kern_config *cfg, tpd_kern_backend **backend_p) {
    (void)cfg;
    (void)backend_p;
    tpd_log_error("this build of tripod has no cuda backend (it was configured without a CUDA "
                  "compiler or with TRIPOD_CUDA=OFF); use the cpu backend or rebuild with "
                  "CUDA");
    return TPD_ERR_UNSUPPORTED;
}

int tpd_kern_cuda_available(void) {
    return 0;
}

int tpd_kern_cuda_device_count(void) {
    return 0;
}

const char *tpd_kern_cuda_unavailable_reason(void) {
    return "this build of tripod has no cuda backend";
}
