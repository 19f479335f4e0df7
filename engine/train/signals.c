#include "engine/train/signals.h"

#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/fatal.h"
#include "base/status.h"

static volatile sig_atomic_t g_signal;
/* CLOCK_MONOTONIC of the first signal (ms); written only by the handler, which the other
 * signal cannot interrupt (sa_mask) */
static volatile long long g_first_ms;

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* async-signal-safe (POSIX) */
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void say(const char *msg, size_t len) {
    ssize_t w = write(STDERR_FILENO, msg, len);
    (void)w;
}

static void on_signal(int sig) {
    (void)sig;
    long long t = now_ms();
    if (!g_signal) {
        g_first_ms = t;
        g_signal = 1;
        return;
    }
    /* One stop request often arrives several times within milliseconds: GNU timeout
     * signals the child and then its process group, Slurm and mpirun forward to every
     * process. Those repeats are the same request; only a later one means "leave now".
     * Only async-signal-safe calls here. */
    if (t - g_first_ms < TPD_SIGNAL_REPEAT_WINDOW_MS) {
        static const char msg[] = "tripod: signal repeated within 2 s of the first: taken as "
                                  "the same request (saving at the next iteration boundary)\n";
        say(msg, sizeof msg - 1);
        return;
    }
    static const char msg[] = "tripod: second signal: leaving now without saving "
                              "(committed checkpoints are untouched)\n";
    say(msg, sizeof msg - 1);
    tpd_fatal(TPD_EXIT_SIGNAL, "second signal");
}

void tpd_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    /* the handler is not re-entered through the other signal (g_first_ms is 64-bit) */
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGINT);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int tpd_signal_pending(void) {
    return g_signal != 0;
}

void tpd_signal_clear(void) {
    g_signal = 0;
}
