/* The nesting cap of every YAML file tripod reads (configs and cluster profiles):
 * tpd_config_yaml_depth_check in config.h. */
#include <stdio.h>
#include <yaml.h>

#include "engine/config/config.h"

/* libyaml's scanner walks every open flow level for each token, so 1 MiB of '[' would
 * take minutes in yaml_parser_load. One event pass first refuses deeper nesting at its
 * first node past the cap, long before the cost grows; syntax errors are left to the
 * load, which words them. */
tpd_status tpd_config_yaml_depth_check(const char *path, FILE *f) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return tpd_fail(TPD_ERR_NOMEM, "%s: out of memory while reading YAML", path);
    yaml_parser_set_input_file(&parser, f);
    tpd_status st = TPD_OK;
    yaml_event_t ev;
    for (int depth = 0, done = 0; !done && yaml_parser_parse(&parser, &ev);) {
        int opens = ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT;
        depth += opens - (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT);
        done = ev.type == YAML_STREAM_END_EVENT;
        if (opens && depth > TPD_CONFIG_YAML_MAX_DEPTH) {
            st = tpd_fail(TPD_ERR_INVALID,
                          "%s:%d:%d: YAML nested deeper than %d lists or mappings; a config "
                          "or a cluster profile needs a few levels",
                          path, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
                          TPD_CONFIG_YAML_MAX_DEPTH);
            done = 1;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    rewind(f);
    return st;
}
