#include "engine/train/signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "base/fatal.h"
#include "base/status.h"

static volatile sig_atomic_t g_signal;

static void on_signal(int sig) {
    (void)sig;
    if (g_signal) {
        /* second signal: leave now (only async-signal-safe calls here) */
        static const char msg[] = "tripod: second signal: leaving now without saving "
                                  "(committed checkpoints are untouched)\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        tpd_fatal(TPD_EXIT_SIGNAL, "second signal");
    }
    g_signal = 1;
}

void tpd_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
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
