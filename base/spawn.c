/* fork/exec through posix_spawnp: the child gets the argument vector as is. */
#include "base/spawn.h"

#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Waits for pid; the shell's convention for the status: exit code, or 128 + signal. */
static tpd_status wait_child(pid_t pid, const char *name, int *code_p) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            return tpd_fail(TPD_ERR_IO, "%s: wait failed: %s", name, strerror(errno));
    }
    *code_p = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return TPD_OK;
}

static tpd_status start(const char *const argv[], const posix_spawn_file_actions_t *fa,
                        pid_t *pid_p) {
    if (!argv || !argv[0]) return tpd_fail(TPD_ERR_INVALID, "spawn: no program to run");
    /* posix_spawnp takes char *const[]; it does not write to the strings. */
    int e = posix_spawnp(pid_p, argv[0], fa, NULL, (char *const *)argv, environ);
    if (e != 0) return tpd_fail(TPD_ERR_IO, "%s: cannot run: %s", argv[0], strerror(e));
    return TPD_OK;
}

tpd_status tpd_spawn_run(const char *const argv[], int *code_p) {
    pid_t pid;
    TPD_CHECK(start(argv, NULL, &pid));
    return wait_child(pid, argv[0], code_p);
}

tpd_status tpd_spawn_capture(const char *const argv[], int streams, char **out_p, size_t *len_p,
                             int *code_p) {
    int fd[2];
    if (pipe(fd) != 0)
        return tpd_fail(TPD_ERR_IO, "%s: cannot make a pipe: %s",
                        argv && argv[0] ? argv[0] : "spawn", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    if (streams & TPD_SPAWN_STDOUT) posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
    if (streams & TPD_SPAWN_STDERR) posix_spawn_file_actions_adddup2(&fa, fd[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, fd[1]);
    pid_t pid;
    tpd_status st = start(argv, &fa, &pid);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (st != TPD_OK) {
        close(fd[0]);
        return st;
    }
    /* Read to the end before waiting: a child that fills the pipe would block forever. */
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    int nomem = !buf;
    for (;;) {
        char chunk[4096];
        ssize_t n = read(fd[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (nomem) continue; /* keep draining so the child can finish */
        if (len + (size_t)n + 1 > cap) {
            while (len + (size_t)n + 1 > cap)
                cap *= 2;
            char *grown = realloc(buf, cap);
            if (!grown) {
                free(buf);
                buf = NULL;
                nomem = 1;
                continue;
            }
            buf = grown;
        }
        memcpy(buf + len, chunk, (size_t)n);
        len += (size_t)n;
    }
    close(fd[0]);
    int code = 0;
    st = wait_child(pid, argv[0], &code);
    if (st != TPD_OK) {
        free(buf);
        return st;
    }
    if (nomem) return tpd_fail_nomem("the output of a child process", cap);
    buf[len] = '\0';
    *out_p = buf;
    if (len_p) *len_p = len;
    *code_p = code;
    return TPD_OK;
}
