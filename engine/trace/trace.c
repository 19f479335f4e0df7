/* Streaming Chrome trace writer: events are appended as they come, so a real run never
 * holds its trace in memory. */
#include "engine/trace/trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tpd_trace {
    FILE *f;
    char path[512];
    int n_events;
};

tpd_status tpd_trace_open(const char *path, tpd_trace **trace_p) {
    tpd_trace *t = calloc(1, sizeof *t);
    if (!t) {
        tpd_log_error("trace %s: out of memory", path);
        return TPD_ERR_NOMEM;
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    t->f = fopen(path, "w");
    if (!t->f) {
        tpd_log_error("trace %s: cannot create: %s", path, strerror(errno));
        free(t);
        return TPD_ERR_IO;
    }
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", t->f);
    *trace_p = t;
    return TPD_OK;
}

/* Event names are ours (no quotes or control characters expected), but escape anyway so
 * the file always parses. */
static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void separator(tpd_trace *t) {
    if (t->n_events++ > 0) fputs(",\n", t->f);
}

tpd_status tpd_trace_process_name(tpd_trace *t, int pid, const char *name) {
    separator(t);
    fprintf(t->f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"name\":",
            pid);
    put_string(t->f, name);
    fputs("}}", t->f);
    return ferror(t->f) ? TPD_ERR_IO : TPD_OK;
}

tpd_status tpd_trace_complete(tpd_trace *t, int pid, int tid, const char *name,
                              const char *category, double ts_us, double dur_us,
                              const char *args_json) {
    separator(t);
    fputs("{\"name\":", t->f);
    put_string(t->f, name);
    fputs(",\"cat\":", t->f);
    put_string(t->f, category ? category : "tripod");
    fprintf(t->f, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f", pid, tid, ts_us,
            dur_us);
    if (args_json) fprintf(t->f, ",\"args\":%s", args_json);
    fputc('}', t->f);
    if (ferror(t->f)) {
        tpd_log_error("trace %s: write failed", t->path);
        return TPD_ERR_IO;
    }
    return TPD_OK;
}

tpd_status tpd_trace_close(tpd_trace *t) {
    if (!t) return TPD_OK;
    tpd_status st = TPD_OK;
    fputs("\n]}\n", t->f);
    if (ferror(t->f)) st = TPD_ERR_IO;
    if (fclose(t->f) != 0) st = TPD_ERR_IO;
    if (st != TPD_OK) tpd_log_error("trace %s: write failed", t->path);
    free(t);
    return st;
}
