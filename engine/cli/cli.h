/* The subcommands of `tripod`. Each parses its own arguments with engine/cli/args.h, runs,
 * prints its own usage, and returns a process exit code (TPD_EXIT_*); main() only
 * dispatches. argv[0] is the subcommand's name.
 *
 * Errors take one path: the function that finds one logs it once (tpd_log_error or
 * tpd_fail, base/status.h; a library call below has already logged its own), and the
 * subcommand leaves with the exit code of the final status (tpd_status_exit_code, the one
 * map) or TPD_EXIT_CONFIG for a bad command line. Nothing here prints "tripod: error:"
 * itself. */
#ifndef TPD_ENGINE_CLI_CLI_H
#define TPD_ENGINE_CLI_CLI_H

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpd_cli_run_mode {
    TPD_CLI_TRAIN = 0, /* tripod train */
    TPD_CLI_BENCH = 1, /* tripod bench: measured steps, no files */
    TPD_CLI_EVAL = 2,  /* tripod eval: the loss of checkpoint.load */
} tpd_cli_run_mode;

/* tripod train|bench|eval CONFIG.yaml [overrides] [options] (MPI: one rank per process). */
int tpd_cli_run(int argc, char **argv, tpd_cli_run_mode mode);
/* tripod config show CONFIG.yaml [overrides] */
int tpd_cli_config(int argc, char **argv);
/* tripod plan CONFIG.yaml [overrides] [--cluster ..] [--gpus N] [--layout TP,PP,DP] ... */
int tpd_cli_plan(int argc, char **argv);
/* tripod sweep CONFIG.yaml [overrides] --tp .. --pp .. ... (MPI) */
int tpd_cli_sweep(int argc, char **argv);
/* tripod bench --calibrate --out PROFILE.yaml [CONFIG.yaml] [overrides] ... (MPI) */
int tpd_cli_calibrate(int argc, char **argv);
/* tripod verify CONFIG.yaml [overrides] [--ranks N] [--steps K] [--out DIR] (MPI) */
int tpd_cli_verify(int argc, char **argv);
/* tripod data prepare|info ... */
int tpd_cli_data(int argc, char **argv);
/* tripod export|import|inspect ... (single process) */
int tpd_cli_ckpt(int argc, char **argv);
/* tripod generate CHECKPOINT [--prompt TEXT] ... (single process) */
int tpd_cli_generate(int argc, char **argv);
/* tripod report METRICS.jsonl|RUN_DIR [--out DIR] */
int tpd_cli_report(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
