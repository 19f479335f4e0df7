/* Monotonic wall-clock seconds, for timing steps, phases and watchdog deadlines. */
#ifndef TPD_BASE_CLOCK_H
#define TPD_BASE_CLOCK_H

#include <time.h>

static inline double tpd_clock_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
