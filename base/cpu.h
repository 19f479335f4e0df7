/* Cores this process may run on, and how ranks that share a node divide them. */
#ifndef TPD_BASE_CPU_H
#define TPD_BASE_CPU_H

#include <sched.h>
#include <unistd.h>

/* Cores in this process's affinity mask (all online cores when it cannot be read). */
static inline int tpd_cpu_usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Online cores of the machine, whatever this process is bound to. */
static inline int tpd_cpu_online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Threads per rank when `ranks` processes share this node's cores: at least one each, and
 * no more than the cores this process may run on (a launcher that binds ranks to cores
 * has already given each its share). OpenMP's default (every core in every rank) makes 8
 * ranks on 2 cores run about 12 times slower than one thread each, since idle threads
 * spin. */
static inline int tpd_cpu_threads_per_rank(int ranks) {
    int mine = tpd_cpu_usable_cores(), share = tpd_cpu_online_cores() / (ranks > 1 ? ranks : 1);
    if (share < 1) share = 1;
    return share < mine ? share : mine;
}

#endif
