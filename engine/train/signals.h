/* SIGTERM and SIGINT during a run. The first one sets a flag that the run loop reads at
 * the next iteration boundary, where every rank agrees on it, saves and stops. Repeats
 * within TPD_SIGNAL_REPEAT_WINDOW_MS of the first are the same request (a launcher that
 * signals a process and then its process group); a signal after that window leaves at
 * once through tpd_fatal(TPD_EXIT_SIGNAL) (base/fatal.h), committed checkpoints
 * untouched. */
#ifndef TPD_ENGINE_TRAIN_SIGNALS_H
#define TPD_ENGINE_TRAIN_SIGNALS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Signals this soon after the first (ms) do not force an exit. */
#define TPD_SIGNAL_REPEAT_WINDOW_MS 2000

/* Installs the handlers. Idempotent. */
void tpd_signals_install(void);
/* 1 once a signal arrived (this process only). */
int tpd_signal_pending(void);
/* Clears the flag (tests). */
void tpd_signal_clear(void);

#ifdef __cplusplus
}
#endif
#endif
