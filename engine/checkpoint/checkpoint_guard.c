/* What a run may do to a save directory before its first save: refuse one that holds
 * another run's checkpoints, and clear the iter_NNNNNNN.tmp folders of failed saves. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint/checkpoint_internal.h"

/* realpath of the directory that holds the existing directory `dir`. */
static int parent_real(const char *dir, char *out) {
    if (!realpath(dir, out)) return 0;
    char *slash = strrchr(out, '/');
    if (slash == out)
        out[1] = '\0'; /* a checkpoint directly under / */
    else if (slash)
        *slash = '\0';
    return 1;
}

static int same_dir(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && strcmp(ra, rb) == 0;
}

tpd_status tpd_ckpt_check_save_dir(const tpd_config *cfg, const char *loaded_dir, int continues) {
    const char *save = cfg->checkpoint.save;
    if (!save[0] || cfg->checkpoint.overwrite) return TPD_OK;
    char(*have)[TPD_CKPT_PATH] = malloc(1024 * sizeof *have);
    if (!have) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    int n = tpd_ckpt_list_older(save, "", have, 1024); /* newest first */
    int loaded = loaded_dir && loaded_dir[0];
    char real_save[PATH_MAX], real_parent[PATH_MAX];
    /* A run that continues a checkpoint of this directory owns its checkpoints (a rewind
     * to an older one, or a fallback past a corrupt one, replaces the newer ones). */
    int owns = loaded && continues && realpath(save, real_save) &&
               parent_real(loaded_dir, real_parent) && strcmp(real_save, real_parent) == 0;
    /* A weights-only start (an import, checkpoint.finetune) owns only what it loaded. */
    int only_loaded = loaded && n == 1 && same_dir(have[0], loaded_dir);
    tpd_status st = TPD_OK;
    if (n > 0 && !owns && !only_loaded)
        st =
            tpd_fail(TPD_ERR_INVALID,
                     "checkpoint.save: %s holds %d checkpoint%s of another run (newest "
                     "%s) that this run did not %s; its saves would replace them. "
                     "Resume that run with checkpoint.load=auto, save elsewhere, remove "
                     "them, or set checkpoint.overwrite=true",
                     save, n, n > 1 ? "s" : "", strrchr(have[0], '/') + 1,
                     loaded ? "continue (it loaded weights only, or from elsewhere)" : "load from");
    free(have);
    return st;
}

int tpd_ckpt_prune_tmp(const char *save_dir) {
    DIR *d = opendir(save_dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    char path[TPD_CKPT_PATH + 32];
    while ((e = readdir(d))) {
        /* iter_NNNNNNN.tmp: a save that never committed (killed, or the disk full) */
        size_t len = strlen(e->d_name);
        if (len != 16 || strncmp(e->d_name, "iter_", 5) != 0 || strcmp(e->d_name + 12, ".tmp"))
            continue;
        if (!tpd_ckpt_join(path, sizeof path, save_dir, e->d_name) || !tpd_ckpt_is_dir(path))
            continue;
        if (tpd_ckpt_remove_dir(path) == TPD_OK) {
            tpd_log_warn("checkpoint: removed %s, left by a save that did not complete", path);
            removed++;
        }
    }
    closedir(d);
    return removed;
}
