/* One line of a JSON Lines file (data prepare's documents, a run's metrics) read whole:
 * exactly one JSON value, blanks around it. A raw NUL byte (JSON text has none; a string
 * writes it \u0000) or anything after the value is an error at its line:column, never a
 * record cut short or a second record dropped. A key given twice takes its last value,
 * as Python's json.loads does. */
#ifndef TPD_ENGINE_DATA_JSONL_H
#define TPD_ENGINE_DATA_JSONL_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* [line, line + n), its '\n' excluded or not, as one JSON value in *o_p (cJSON_Delete it).
 * Else logs "PATH:LINENO:COL: why (one JSON object a line)" and returns TPD_ERR_FORMAT
 * (TPD_ERR_NOMEM when cJSON ran out of memory cannot be told apart: it says not JSON). */
tpd_status tpd_jsonl_parse(const char *path, size_t lineno, const char *line, size_t n,
                           cJSON **o_p);

/* The member `key` of object o (the last when given twice), or NULL. */
const cJSON *tpd_jsonl_get(const cJSON *o, const char *key);

#ifdef __cplusplus
}
#endif
#endif
