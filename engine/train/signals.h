/* SIGTERM and SIGINT during a run. The first one sets a flag that the run loop reads at
 * the next iteration boundary, where every rank agrees on it, saves and stops. A second
 * one leaves at once through tpd_fatal(TPD_EXIT_SIGNAL) (base/fatal.h), committed
 * checkpoints untouched. */
#ifndef TPD_ENGINE_TRAIN_SIGNALS_H
#define TPD_ENGINE_TRAIN_SIGNALS_H

#ifdef __cplusplus
extern "C" {
#endif

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
