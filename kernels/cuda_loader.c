/* The cuda backend's front door in a build with CUDA: tpd_kern_cuda_* open the module
 * libtripod_cuda.so (kernels/cuda/) on first use and call into it. Loading it pulls in
 * cuBLASLt, whose start-up costs tens of milliseconds and a few hundred MB of memory:
 * `tripod plan`, data tools and cpu runs never pay that.
 *
 * The module is looked for, in order, at $TRIPOD_CUDA_MODULE, next to the running
 * executable, in the build tree it was built in, and on the loader's search path. */
#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODULE_NAME "libtripod_cuda.so"

typedef int (*count_fn)(void);
typedef tpd_status (*create_fn)(const tpd_kern_config *, tpd_kern_backend *);
typedef const char *(*why_fn)(void);
typedef void (*set_rank_fn)(int, int);

static struct {
    pthread_once_t once;
    void *handle;
    count_fn available, device_count;
    create_fn create;
    why_fn why;           /* the CUDA runtime's reason for no device */
    set_rank_fn set_rank; /* the module's own copy of tpd_log_set_rank */
    char error[1024];
    int error_is_real; /* error came from a file that exists but did not load */
} g_mod = {PTHREAD_ONCE_INIT, NULL, NULL, NULL, NULL, NULL, NULL, "", 0};

/* Opens one candidate. The message kept is the loader's for the first candidate that
 * exists (a missing libcudnn.so.9 or libcudart.so.13 behind it), not "no such file" from
 * the candidates tried after it. */
static void *try_open(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        int exists = strchr(path, '/') != NULL && access(path, F_OK) == 0;
        if (!g_mod.error_is_real || g_mod.error[0] == 0) {
            snprintf(g_mod.error, sizeof g_mod.error, "%.1000s", e ? e : "not found");
            g_mod.error_is_real = exists;
        }
    }
    return h;
}

static void load_module(void) {
    void *h = NULL;
    const char *env = getenv("TRIPOD_CUDA_MODULE");
    if (env && env[0]) h = try_open(env);
    if (!h) {
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
            exe[n] = 0;
            char *slash = strrchr(exe, '/');
            if (slash && (size_t)(slash - exe) + sizeof MODULE_NAME + 1 < sizeof exe) {
                strcpy(slash + 1, MODULE_NAME);
                h = try_open(exe);
            }
        }
    }
#ifdef TPD_CUDA_MODULE_DIR
    if (!h) h = try_open(TPD_CUDA_MODULE_DIR "/" MODULE_NAME);
#endif
    if (!h) h = try_open(MODULE_NAME);
    if (!h) {
        /* Said once, where the cuda backend is first asked for: the loader's message names
         * the library that is missing, which "no CUDA device" would hide. */
        tpd_log_warn("cuda backend: cannot load %s: %s", MODULE_NAME, g_mod.error);
        return;
    }
    g_mod.available = (count_fn)dlsym(h, "tpd_kern_cuda_module_available");
    g_mod.device_count = (count_fn)dlsym(h, "tpd_kern_cuda_module_device_count");
    g_mod.create = (create_fn)dlsym(h, "tpd_kern_cuda_module_create");
    if (!g_mod.available || !g_mod.device_count || !g_mod.create) {
        snprintf(g_mod.error, sizeof g_mod.error,
                 "%s lacks the tpd_kern_cuda_module_* entry points", MODULE_NAME);
        tpd_log_warn("cuda backend: %s", g_mod.error);
        dlclose(h);
        return;
    }
    g_mod.why = (why_fn)dlsym(h, "tpd_kern_cuda_module_unavailable_reason");
    g_mod.set_rank = (set_rank_fn)dlsym(h, "tpd_kern_cuda_module_set_log_rank");
    g_mod.handle = h;
}

static int module_ready(void) {
    pthread_once(&g_mod.once, load_module);
    return g_mod.handle != NULL;
}

int tpd_kern_cuda_available(void) {
    return module_ready() ? g_mod.available() : 0;
}

int tpd_kern_cuda_device_count(void) {
    return module_ready() ? g_mod.device_count() : 0;
}

const char *tpd_kern_cuda_unavailable_reason(void) {
    if (!module_ready()) return g_mod.error;
    if (g_mod.available()) return "";
    return g_mod.why ? g_mod.why() : "the CUDA runtime sees no device";
}

tpd_status tpd_kern_cuda_create(const tpd_kern_config *cfg, tpd_kern_backend **backend_p) {
    if (!module_ready()) {
        tpd_log_error("cuda backend: cannot load %s (%s); set TRIPOD_CUDA_MODULE to its path",
                      MODULE_NAME, g_mod.error);
        return TPD_ERR_UNSUPPORTED;
    }
    tpd_kern_backend *b = calloc(1, sizeof *b);
    if (!b) {
        tpd_log_error("cuda backend: out of memory");
        return TPD_ERR_NOMEM;
    }
    if (g_mod.set_rank) {
        int rank, print_info;
        tpd_log_get_rank(&rank, &print_info);
        g_mod.set_rank(rank, print_info);
    }
    tpd_status st = g_mod.create(cfg, b); /* the module fills the handle */
    if (st != TPD_OK) {
        free(b);
        return st;
    }
    *backend_p = b;
    return TPD_OK;
}
