/* Chrome trace event JSON (opens in Perfetto and chrome://tracing), written as a stream.
 *
 * The planner writes its predicted timeline with it and the training engine writes real
 * steps with the same event names ("FWD mb=j chunk=c", "BWD ...", "SEND_ACT", ...), so
 * predicted and measured traces can be opened side by side. Timestamps and durations are
 * microseconds. */
#ifndef TPD_ENGINE_PLAN_TRACE_H
#define TPD_ENGINE_PLAN_TRACE_H

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_trace tpd_trace;

/* Creates `path` and writes the opening of the JSON object. */
tpd_status tpd_trace_open(const char *path, tpd_trace **trace_p);
/* Names a process lane (metadata event "process_name"), e.g. "stage 0" or "rank 3". */
tpd_status tpd_trace_process_name(tpd_trace *t, int pid, const char *name);
/* One complete event ("ph":"X"). `args_json` is NULL or the text of a JSON object, e.g.
 * "{\"mb\":3}", copied verbatim. */
tpd_status tpd_trace_complete(tpd_trace *t, int pid, int tid, const char *name,
                              const char *category, double ts_us, double dur_us,
                              const char *args_json);
/* Writes the closing brackets and closes the file; the status tells whether every
 * write reached the file. Always frees t. */
tpd_status tpd_trace_close(tpd_trace *t);

#ifdef __cplusplus
}
#endif
#endif
