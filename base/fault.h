/* Faults planted on purpose, for the tests of `tripod verify` only (never a user option):
 * the environment variable TRIPOD_TEST_FAULT=NAME or NAME:ARG plants one of
 *   drop-layer:S      the model of pipeline stage S (default 1) builds one layer fewer
 *                     (its last chunk's last layer), as a buggy stage split would;
 *   skip-dp-bucket:B  DP gradient bucket B (default 0) is never reduced (at DP > 1 its
 *                     gradients stay each rank's own);
 *   wrong-shard       a resume loads the checkpoint slice of the next TP rank instead
 *                     of its own (at TP > 1).
 * `tripod verify` must report each of them as a failed check. */
#ifndef TPD_BASE_FAULT_H
#define TPD_BASE_FAULT_H

#ifdef __cplusplus
extern "C" {
#endif

#define TPD_FAULT_ENV "TRIPOD_TEST_FAULT"

/* 1 when fault `name` is planted (*arg_p: its argument, or `dflt` without one); else 0. */
int tpd_fault(const char *name, int dflt, int *arg_p);

#ifdef __cplusplus
}
#endif
#endif
