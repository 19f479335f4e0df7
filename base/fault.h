/* Faults planted on purpose, for tests only (never a user option):
 * the environment variable TRIPOD_TEST_FAULT=NAME or NAME:ARG plants one of
 *   drop-layer:S      the model of pipeline stage S (default 1) builds one layer fewer
 *                     (its last chunk's last layer), as a buggy stage split would;
 *   skip-dp-bucket:B  DP gradient bucket B (default 0) is never reduced (at DP > 1 its
 *                     gradients stay each rank's own); under optim_grads and
 *                     optim_grads_params bucket B is hook unit B - 1, whose reduced part
 *                     never reaches the shard;
 *   stale-param-gather:U  under optim_grads_params a staged copy of unit U (default 0)
 *                     outlives the update, so the next forward may read its old weights;
 *   cp-skip-ring-step:I  ring attention's step I (default 1) receives no K/V block: the
 *                     step before's block is folded in twice and one is never seen;
 *   cp-lse-wrong-max  the block attention merges a block's exponentials taken against the
 *                     block's own maximum into a state scaled to the merged maximum;
 *   wrong-shard       a resume loads the checkpoint slice of the next TP rank instead
 *                     of its own (at TP > 1);
 *   stop-rank:R       world rank R (default 1) of `tripod train`/`eval`/`bench` stops
 *                     itself (SIGSTOP) before start-up's config agreement, as a peer
 *                     stuck at start-up would (the others must end on comm.timeout_s).
 * `tripod verify` must report each of the first three as a failed check. */
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
