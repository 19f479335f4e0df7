/* The backend-independent parts of kernels.h: dtype facts and backend teardown. */
#include "kernels/kernels.h"

#include <string.h>

size_t tpd_dtype_size(tpd_dtype dt) {
    switch (dt) {
    case TPD_DTYPE_F32:
        return 4;
    case TPD_DTYPE_BF16:
        return 2;
    case TPD_DTYPE_I32:
        return 4;
    }
    return 0; /* unknown dtype: a size of 0 makes any buffer computation fail loudly */
}

const char *tpd_dtype_name(tpd_dtype dt) {
    switch (dt) {
    case TPD_DTYPE_F32:
        return "f32";
    case TPD_DTYPE_BF16:
        return "bf16";
    case TPD_DTYPE_I32:
        return "i32";
    }
    return "unknown";
}

void tpd_kern_backend_destroy(tpd_kern_backend *backend) {
    if (backend == NULL) return;
    if (backend->ops != NULL && backend->ops->destroy != NULL) backend->ops->destroy(backend->ctx);
    /* A second destroy of the same struct is then a no-op instead of a double free. */
    memset(backend, 0, sizeof *backend);
}
