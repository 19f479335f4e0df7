#include "engine/data/jsonl.h"

#include <string.h>

tpd_status tpd_jsonl_parse(const char *path, size_t lineno, const char *line, size_t n,
                           cJSON **o_p) {
    const char *nul = memchr(line, 0, n);
    if (nul)
        return tpd_fail(TPD_ERR_FORMAT,
                        "%s:%zu:%zu: a NUL byte (JSON text has none; a string writes it "
                        "\\u0000)",
                        path, lineno, (size_t)(nul - line) + 1);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(line, n, &end, 0);
    if (!o) /* end: where the parse stopped */
        return tpd_fail(TPD_ERR_FORMAT, "%s:%zu:%zu: not valid JSON (one JSON object a line)", path,
                        lineno, (size_t)((end ? end : line) - line) + 1);
    const char *stop = line + n;
    while (end < stop && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
        end++;
    if (end < stop) {
        cJSON_Delete(o);
        return tpd_fail(TPD_ERR_FORMAT,
                        "%s:%zu:%zu: text after the record (one JSON object a line)", path, lineno,
                        (size_t)(end - line) + 1);
    }
    *o_p = o;
    return TPD_OK;
}

const cJSON *tpd_jsonl_get(const cJSON *o, const char *key) {
    const cJSON *v = NULL, *c;
    if (!cJSON_IsObject(o)) return NULL;
    cJSON_ArrayForEach(c, o) if (c->string && !strcmp(c->string, key)) v = c;
    return v;
}
