/* What a run may do to a save directory before its first save: hold it against a second
 * run, refuse one that holds another run's checkpoints, and clear the iter_NNNNNNN.tmp
 * folders of failed saves. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

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

tpd_status tpd_ckpt_lock_save_dir(const char *save_dir, int *fd_p) {
    char path[TPD_CKPT_PATH + 32];
    if (!tpd_ckpt_join(path, sizeof path, save_dir, ".tripod.lock"))
        return tpd_fail(TPD_ERR_INVALID, "checkpoint.save: %s: path too long", save_dir);
    TPD_CHECK(tpd_ckpt_mkdirs(save_dir));
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return tpd_fail(TPD_ERR_IO, "checkpoint.save: cannot open %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        if (err == ENOLCK || err == EOPNOTSUPP || err == EINVAL) {
            tpd_log_warn("checkpoint.save: %s cannot be locked (%s): nothing stops a second "
                         "run from saving there too",
                         save_dir, strerror(err));
            close(fd);
            *fd_p = -1;
            return TPD_OK;
        }
        /* the holder wrote "pid P on host H" after it took the lock */
        char who[128] = "";
        ssize_t n = pread(fd, who, sizeof who - 1, 0);
        who[n > 0 ? n : 0] = '\0';
        who[strcspn(who, "\n")] = '\0';
        close(fd);
        if (err != EWOULDBLOCK)
            return tpd_fail(TPD_ERR_IO, "checkpoint.save: cannot lock %s: %s", path, strerror(err));
        return tpd_fail(TPD_ERR_INVALID,
                        "checkpoint.save: %s is in use by another run (%s holds %s); two runs "
                        "saving into one directory replace each other's checkpoints. Wait "
                        "for it to end or save elsewhere",
                        save_dir, who[0] ? who : "a process", path);
    }
    char host[64] = "?", line[128];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    int len = snprintf(line, sizeof line, "pid %ld on host %s\n", (long)getpid(), host);
    /* only a hint for the message above: a failure to write it leaves the lock valid */
    if (ftruncate(fd, 0) == 0 && pwrite(fd, line, (size_t)len, 0) < 0) line[0] = '\0';
    *fd_p = fd;
    return TPD_OK;
}

void tpd_ckpt_unlock_save_dir(int fd) {
    if (fd >= 0) close(fd); /* closing the last descriptor of the open releases the flock */
}
